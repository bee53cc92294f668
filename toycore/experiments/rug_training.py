"""Chapter 5's trained models: the authors' recipe, batched into shards.

Every (p, nd, seed) model is an instance of ``UntiedAutoencoder``, smaller hidden sizes of a
shard zero-padded to the largest, each with its own data stream and its own stopping rule
(``train_until_converged``). Adam with the authors' settings: lr 3e-3/√ns, eps 1e-7, batch 1024.
Losses are measured afterwards on fresh data. Each shard (``shard_plan``) is one
``train_group``, cached on its own and run through ``toycore.shards``: in this process, or spread
over a Dask cluster. A shard may keep where each of its runs stopped (``training_states``), and
``train_on`` trains such a model on, as if its run had not stopped.

The training lives apart from the chapter's analyses (``persian_rug``) so that the cache keys
of trained models cover only the code that trains them: an edit to an analysis retrains nothing.
"""

from dataclasses import dataclass

import numpy as np
import torch

from .. import devices, shards
from ..cache import cached
from ..checks import check_choice, check_range, check_seeds, check_size
from ..data import SparseUniform, prefetch_for
from ..devices import to_host
from ..models import OUTPUTS, UntiedAutoencoder
from ..train import AdamMoments, train_until_converged

BATCH = 1024
EVAL_SAMPLES = 16_384


def learning_rate(features):
    """The authors' Adam learning rate, 3e-3 / √ns."""
    return 3e-3 / features**0.5


def hidden_size(features, ratio):
    """nd for a ratio, as the authors' code rounds it: max(1, int(ns · ratio))."""
    ratio = check_range("the ratio nd/ns", ratio, 0, 1, low_open=True)
    return max(1, int(features * ratio))


@torch.no_grad()
def evaluation_loss(model, densities, samples=EVAL_SAMPLES):
    """Each instance's loss on fresh data (its own 'evaluation' stream), and the standard error
    of that mean, from the spread of its batches' losses: two arrays (instances,)."""
    data = SparseUniform(
        model.seeds,
        model.features,
        [1 - p for p in densities],
        device=model.b.device,
        purpose="evaluation",
    )
    # (batches, instances): each batch's mean loss
    chunks = to_host(torch.stack([model.loss(data.sample(BATCH)) for _ in range(samples // BATCH)]))
    chunks = chunks.astype(float)
    return chunks.mean(0), chunks.std(0, ddof=1) / np.sqrt(len(chunks))


def _padded(curves):
    """Per-instance loss curves of different lengths as one array, NaN after each run ends."""
    out = np.full((len(curves), max(len(c) for c in curves)), np.nan, dtype=np.float32)
    for k, curve in enumerate(curves):
        out[k, : len(curve)] = curve
    return out


@dataclass(frozen=True)
class Models:
    """A job's trained models, in the order its instances were given."""

    W: np.ndarray  # (instances, features, features) W = W_out W_in
    b: np.ndarray  # (instances, features)
    loss: np.ndarray  # (instances,) on fresh data
    loss_se: np.ndarray  # (instances,) the standard error of that loss
    steps: np.ndarray  # (instances,) steps trained
    converged: np.ndarray  # (instances,) stopped by the rule, not the cap
    curves: np.ndarray  # (instances, longest run) training loss, NaN after a run stopped
    states: list  # (instances,) each one's state where it stopped (``training_states``) or None


@dataclass(frozen=True)
class Shard(Models):
    """One shard's trained models, on the host, their loss curves not yet padded."""

    curves: list  # instances arrays (steps,) of training loss, each as long as its run


def training_states(model, run, data, densities, output):
    """Each instance where its run stopped, on the host, as plain values (a cached function's
    argument): ns, p, seed, output, its weights W_in (hidden, features), W_out and b, Adam's
    moments by parameter name ("first", "second"), the steps taken, its data stream's state
    (``SparseUniform.state``) and the stream's prefetch: what ``train_on`` needs to go on."""
    streams = data.state()
    return [
        dict(
            features=model.features,
            density=float(p),
            seed=seed,
            output=output,
            **{name: to_host(getattr(model, name)[k]) for name in ("W_in", "W_out", "b")},
            first={name: to_host(moment[k]) for name, moment in run.moments.first.items()},
            second={name: to_host(moment[k]) for name, moment in run.moments.second.items()},
            steps=int(run.steps[k]),
            data=streams[k],
            prefetch=data.prefetch,
        )
        for k, (p, seed) in enumerate(zip(densities, model.seeds))
    ]


def _run(model, densities, max_steps, steps, start=None, data_state=None, prefetch=None):
    """Train ``model`` (each instance at its density p) with the authors' recipe; evaluate it."""
    features, instances = model.features, len(model.seeds)
    data = SparseUniform(
        model.seeds,
        features,
        [1 - p for p in densities],
        prefetch=prefetch or prefetch_for(instances, BATCH, features),
    )
    if data_state is not None:
        data.restore(data_state)
    run = train_until_converged(
        model,
        data,
        lr=learning_rate(features),
        batch=BATCH,
        max_steps=max_steps,
        steps=steps,
        start=start,
        desc=f"{instances} models at ns={features}, nd={max(model.hidden_sizes)}",
    )
    loss, loss_se = evaluation_loss(model, densities)
    return run, data, loss, loss_se


@cached
def train_group(
    features,
    densities,
    hidden,
    seeds,
    *,
    output="relu",
    max_steps=45_000,
    steps=None,
    keep_state=False,
):
    """One shard: a model per (p, seed) pair, all with ``hidden`` dense dimensions, trained as
    one batch to each one's stopping rule (or for exactly ``steps`` steps); ``keep_state``:
    where each one stopped too (``training_states``: weights, Adam's moments and the data
    stream, a few times the weights' size).

    Returns a ``Shard``, on the host."""
    model = UntiedAutoencoder(features, hidden, seeds, output=output)
    run, data, loss, loss_se = _run(model, densities, max_steps, steps)
    states = (
        training_states(model, run, data, densities, output) if keep_state else [None] * len(seeds)
    )
    return Shard(
        W=to_host(model.product()),
        b=to_host(model.b),
        loss=loss,
        loss_se=loss_se,
        steps=run.steps,
        converged=run.converged,
        curves=run.loss,
        states=states,
    )


@cached
def train_on(state, *, steps):
    """The model of a state from ``training_states`` trained on to exactly ``steps`` steps in
    all: bit for bit the model its run would have given, had it not stopped (the same data, the
    same Adam).

    Returns a ``Shard`` of that one model, its curve only the steps after the state's."""
    check_size("steps", steps, minimum=state["steps"] + 1)
    model = UntiedAutoencoder(
        state["features"], len(state["W_in"]), [state["seed"]], output=state["output"]
    )
    with torch.no_grad():
        for name in ("W_in", "W_out", "b"):
            getattr(model, name).copy_(torch.as_tensor(state[name]).unsqueeze(0))
    moments = AdamMoments(
        *(
            {name: moment[None] for name, moment in state[which].items()}
            for which in ("first", "second")
        )
    )
    run, _, loss, loss_se = _run(
        model,
        [state["density"]],
        None,
        steps,
        start=(moments, state["steps"]),
        data_state=[state["data"]],
        prefetch=state["prefetch"],
    )
    return Shard(
        W=to_host(model.product()),
        b=to_host(model.b),
        loss=loss,
        loss_se=loss_se,
        steps=run.steps,
        converged=run.converged,
        curves=run.loss,
        states=[None],
    )


def shard_plan(features, hiddens):
    """The models of one ns (their hidden sizes ``hiddens``) as shards, each a list of indices
    into ``hiddens``: one shard per hidden size (padding every model to the widest would make a
    grid over nd/ns = 0.05..0.8 do twice the work). On a GPU a shard holds every model of its
    hidden size, since batching is what makes a GPU fast; on a CPU at most as many as keep a
    step's activations (models x batch x ns) within 2^18 numbers (1 MB, a core's L2 cache):
    three ns = 512 models in one batch trained 1.3 times slower than one after the other, and
    two processes side by side trained ns = 128 models 4-9% faster two at a time than eight.
    How many share a batch changes no weight, nor on one thread any loss."""
    on_gpu = devices.current().type == "cuda"
    size = len(hiddens) if on_gpu else max(1, 2**18 // (BATCH * features))
    plan = []
    for hidden in sorted(set(hiddens)):
        group = [k for k, h in enumerate(hiddens) if h == hidden]
        plan += [group[start : start + size] for start in range(0, len(group), size)]
    return plan


def train_models(
    jobs, *, output="relu", max_steps=45_000, steps=None, keep_state=False, desc="training"
):
    """Train one model per (p, nd, seed) triple of every job, in the shards of ``shard_plan``
    (each a ``train_group``), all shards dispatched together so that a cluster runs them side
    by side. ``jobs``: a list of (ns, densities, hiddens, seeds), one entry per model;
    ``keep_state``: where each model stopped too (``training_states``).

    Returns ``Models`` per job, in the order given."""
    # the shards' own checks would run only once training has started: check here first
    check_choice("output", output, OUTPUTS)
    check_size("max_steps", max_steps) if steps is None else check_size("steps", steps)
    plans, calls = [], []
    for features, densities, hiddens, seeds in jobs:
        check_size("features", features)
        seeds, densities, hiddens = list(check_seeds(seeds)), list(densities), list(hiddens)
        for p in densities:
            check_range("p", p, 0, 1, low_open=True)
        for hidden in hiddens:
            check_size("hidden", hidden, maximum=features)
        groups = shard_plan(features, hiddens)
        plans.append((features, len(seeds), groups))
        calls += [
            (
                (
                    features,
                    [densities[k] for k in group],
                    hiddens[group[0]],
                    [seeds[k] for k in group],
                ),
                dict(output=output, max_steps=max_steps, steps=steps, keep_state=keep_state),
            )
            for group in groups
        ]
    runs = iter(shards.run(train_group, calls, desc))
    results = []
    for features, count, groups in plans:
        W = np.zeros((count, features, features), np.float32)
        b = np.zeros((count, features), np.float32)
        loss, loss_se = np.zeros(count), np.zeros(count)
        steps, converged = np.zeros(count, int), np.zeros(count, bool)
        curves, states = [None] * count, [None] * count
        for group in groups:
            run = next(runs)
            W[group], b[group], loss[group], loss_se[group] = run.W, run.b, run.loss, run.loss_se
            steps[group], converged[group] = run.steps, run.converged
            for k, curve, state in zip(group, run.curves, run.states):
                curves[k], states[k] = curve, state
        results.append(Models(W, b, loss, loss_se, steps, converged, _padded(curves), states))
    return results
