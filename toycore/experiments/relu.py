"""Chapter 2 experiments: the ReLU output model against its sparsity-pattern expansion.

A *sweep* trains one instance per (sparsity, seed) in a single batched run on the book's device
and brings the final weights to the host in float64 for the analyses, which are exact formulas
or Monte Carlo estimates with standard errors (small, on the host). Only ``train_sweep`` and
``packing_comparison`` take long; they are ``@cached``.
"""

from dataclasses import dataclass

import numpy as np
import torch

from ..cache import cached
from ..checks import check_range, check_size
from ..data import SparseUniform, prefetch_for, sparse_moments
from ..models import ToyModel, toy_sample_loss
from ..profiles import select
from ..seeding import generator
from ..sizes import RELU
from ..theory import relu as th
from ..train import train

DTYPE = torch.float64
REPRESENTED = 0.5  # a feature counts as represented when |W_i| > 0.5, as in Elhage et al.


def sizes(profile=None):
    """This chapter's sizes in ``profile`` (default: ``$TOYCORE_PROFILE``, else ``cpu``), from
    ``toycore.sizes.RELU``, as nested attributes."""
    return select(profile, **RELU)


def importance_profile(features, decay):
    """I_i = decay^i, i = 0..n-1 (decay 1: uniform importance)."""
    check_size("features", features)
    check_range("decay", decay, 0, 1, low_open=True)
    return decay ** torch.arange(features, dtype=DTYPE)


@dataclass(frozen=True)
class Sweep:
    """One model per (sparsity, seed), trained together: their settings and final parameters."""

    features: int  # n
    hidden: int  # m
    output: str  # "relu" or "linear"
    decay: float  # importance I_i = decay^i
    sparsities: np.ndarray  # (sparsities,)
    seeds: np.ndarray  # (seeds,)
    W: torch.Tensor  # (sparsities, seeds, hidden, features) float64
    b: torch.Tensor  # (sparsities, seeds, features) float64
    importance: torch.Tensor  # (sparsities, seeds, features) float64


@cached
def train_sweep(
    features, hidden, sparsities, seeds, *, decay, steps, lr, batch=1024, output="relu"
):
    """Train one model per (sparsity, seed), all at once, with AdamW as Elhage et al. did.

    Returns a ``Sweep`` with W (sparsities, seeds, hidden, features), b and importance
    (sparsities, seeds, features) in float64.
    """
    check_size("batch", batch)
    sparsities, seeds = [float(s) for s in sparsities], [int(s) for s in seeds]
    importance = importance_profile(features, decay)
    instance_sparsity = np.repeat(sparsities, len(seeds)).tolist()
    instance_seeds = seeds * len(sparsities)
    model = ToyModel(features, hidden, instance_seeds, importance=importance.float(), output=output)
    data = SparseUniform(
        instance_seeds,
        features,
        instance_sparsity,
        prefetch=prefetch_for(len(instance_seeds), batch, features),
    )
    train(
        model,
        lambda step: data.sample(batch),
        steps=steps,
        lr=lr,
        optimizer="adamw",
        record_at=[steps],
        desc=f"{output} n={features} m={hidden}, {len(instance_seeds)} models",
    )
    grid = (len(sparsities), len(seeds))
    return Sweep(
        features=features,
        hidden=hidden,
        output=output,
        decay=decay,
        sparsities=np.array(sparsities),
        seeds=np.array(seeds),
        W=model.W.detach().to(DTYPE).cpu().reshape(*grid, hidden, features),
        b=model.b.detach().to(DTYPE).cpu().reshape(*grid, features),
        importance=importance.expand(*grid, features).clone(),
    )


def _flat(sweep):
    """W, b, importance and sparsity with (sparsities, seeds) flattened into one instances axis."""
    n, m = sweep.features, sweep.hidden
    S = torch.as_tensor(np.repeat(sweep.sparsities, len(sweep.seeds)), dtype=DTYPE)
    return (sweep.W.reshape(-1, m, n), sweep.b.reshape(-1, n), sweep.importance.reshape(-1, n), S)


def _grid(sweep, values):
    """Undo ``_flat`` on a per-instance result: (instances, ...) -> (sparsities, seeds, ...)."""
    return np.asarray(values).reshape(
        len(sweep.sparsities), len(sweep.seeds), *np.shape(values)[1:]
    )


def represented(W):
    """Which features have |W_i| > 0.5: W (..., hidden, features) -> bool (..., features)."""
    return torch.as_tensor(W).norm(dim=-2) > REPRESENTED


def represented_count(W):
    """How many features have |W_i| > 0.5: W (..., hidden, features) -> (...)."""
    return represented(W).sum(-1)


def _evaluation_losses(sweep, samples, seed, chunks=1):
    """Per-sample losses of every model on fresh data, ``chunks`` times ``samples`` inputs drawn
    a chunk at a time: yields (instances, samples) per chunk. All models with the same sparsity
    see the same inputs, so their losses compare without sampling noise."""
    W, b, importance, S = _flat(sweep)
    data = SparseUniform(
        [seed] * len(S), sweep.features, S.tolist(), device="cpu", dtype=DTYPE, purpose="evaluation"
    )
    for _ in range(chunks):
        yield toy_sample_loss(W, b, importance, data.sample(samples), sweep.output)


def evaluation_loss(sweep, samples, seed=0):
    """Each model's loss on ``samples`` fresh inputs: (sparsities, seeds)."""
    (losses,) = _evaluation_losses(sweep, samples, seed)
    return _grid(sweep, losses.mean(-1))


# --- 1. the sparsity-pattern expansion --------------------------------------------------------


def _patterns(features, active, samples, g):
    """``samples`` inputs with exactly ``active`` features on, chosen uniformly: (samples, n)."""
    order = torch.rand(samples, features, generator=g, dtype=DTYPE).argsort(-1)
    mask = order < active  # the features ranked below ``active`` in a random order
    return torch.rand(samples, features, generator=g, dtype=DTYPE) * mask


# The direct estimate of L in the expansion's check draws this many times its samples per k. At
# sparse S the few inputs with two or more active features carry most of its variance, and a
# plain mean over them is far from normal unless they are many.
DIRECT_DRAWS = 16


@dataclass(frozen=True)
class PatternExpansion:
    """Each model's loss expanded over sparsity patterns, next to L and the exact L_0 and L_1."""

    terms: np.ndarray  # (sparsities, seeds, features + 1) (1-S)^k S^(n-k) L_k for k = 0..n
    expansion: np.ndarray  # (sparsities, seeds) the sum of the terms
    expansion_error: np.ndarray  # (sparsities, seeds) its standard error
    direct: np.ndarray  # (sparsities, seeds) L estimated directly
    direct_error: np.ndarray  # (sparsities, seeds) its standard error
    L0_exact: np.ndarray  # (sparsities, seeds) L_0, exact
    L0: np.ndarray  # (sparsities, seeds) L_0, Monte Carlo
    L1_exact: np.ndarray  # (sparsities, seeds) L_1, exact
    L1: np.ndarray  # (sparsities, seeds) L_1, Monte Carlo
    L1_error: np.ndarray  # (sparsities, seeds) its standard error
    sparsities: np.ndarray  # (sparsities,)


def pattern_expansion(sweep, samples, seed=0):
    """Estimate every L_k of every model and compare Σ_k (1-S)^k S^(n-k) L_k with L itself.

    L_k = C(n, k) E[loss | k given features active], by Monte Carlo with ``samples`` inputs per k
    (the same inputs for every model); L_0 and L_1 also exactly. L is estimated directly from
    ``DIRECT_DRAWS`` x ``samples`` draws of the data. That estimate's standard error is
    sqrt(Var(loss) / draws), with E[loss^2] = Σ_k (1-S)^k S^(n-k) C(n, k) E[loss^2 | k] from the
    patterns' samples: measured on the direct draws themselves it rests, at sparse S, on the
    few draws with two or more active features, and is as noisy as they are (it put one model
    of 56, at paper size, 5.6 standard errors off at one Monte Carlo seed in five).
    Returns per model (sparsities, seeds, ...) arrays: the weighted terms (1-S)^k S^(n-k) L_k
    (..., n+1), the expansion's sum and the direct estimate with standard errors, and the exact
    L_0 and L_1 next to their estimates.
    """
    check_size("samples", samples, minimum=2)
    W, b, importance, S = _flat(sweep)
    n, instances = sweep.features, len(S)
    g = generator(seed, "patterns")
    # per model and k: C(n, k) E[loss | k active], its standard error, and C(n, k) E[loss^2 | k]
    estimate, error, second = (torch.zeros(instances, n + 1, dtype=DTYPE) for _ in range(3))
    counts = th.pattern_counts(n)
    for k in range(n + 1):
        x = _patterns(n, k, samples, g).expand(instances, samples, n)
        losses = toy_sample_loss(W, b, importance, x, sweep.output)
        estimate[:, k] = losses.mean(-1) * counts[k]
        error[:, k] = losses.std(-1) * counts[k] / samples**0.5
        second[:, k] = losses.square().mean(-1) * counts[k]
    weights = th.pattern_weights(n, S)
    expansion = (weights * estimate).sum(-1)
    draws = _evaluation_losses(sweep, samples, seed + 1, DIRECT_DRAWS)
    direct = sum(losses.sum(-1) for losses in draws) / (DIRECT_DRAWS * samples)
    variance = ((weights * second).sum(-1) - expansion.square()).clamp(min=0)
    direct_error = (variance / (DIRECT_DRAWS * samples)).sqrt()
    benefit, interference = th.one_sparse_terms(W, b, importance)
    return PatternExpansion(
        terms=_grid(sweep, weights * estimate),
        expansion=_grid(sweep, expansion),
        expansion_error=_grid(sweep, (weights * error).square().sum(-1).sqrt()),
        direct=_grid(sweep, direct),
        direct_error=_grid(sweep, direct_error),
        L0_exact=_grid(sweep, th.zero_input_loss(b, importance)),
        L0=_grid(sweep, estimate[:, 0]),
        L1_exact=_grid(sweep, benefit.sum(-1) + interference.sum((-1, -2))),
        L1=_grid(sweep, estimate[:, 1]),
        L1_error=_grid(sweep, error[:, 1]),
        sparsities=sweep.sparsities,
    )


# --- 2. feature benefit and interference ------------------------------------------------------


@dataclass(frozen=True)
class InterferenceSplit:
    """Each model's L_1 at x_i = 1 as benefit lost and interference, and its pairs of features."""

    benefit: np.ndarray  # (sparsities, seeds) feature benefit lost, summed over features
    paid: np.ndarray  # (sparsities, seeds) interference with ReLU and bias, as the model pays it
    without_bias: np.ndarray  # (sparsities, seeds) interference with ReLU, bias removed
    linear: np.ndarray  # (sparsities, seeds) interference with neither
    negative_pairs: np.ndarray  # (sparsities, seeds) of the pairs, those with W_i·W_j < 0
    positive_pairs: np.ndarray  # (sparsities, seeds) of the pairs, those with W_i·W_j > 0
    freed_pairs: np.ndarray  # (sparsities, seeds) of those, the ones with W_i·W_j + b_j <= 0
    pairs: np.ndarray  # (sparsities, seeds) ordered pairs i ≠ j of represented features
    sparsities: np.ndarray  # (sparsities,)


def interference_split(sweep):
    """L_1 at x_i = 1, split into feature benefit and interference, for every model.

    Interference is priced three ways for the same W: as the model pays it (ReLU and bias), with
    the ReLU but no bias, and with neither (what a linear output would pay). Also counts, among
    pairs of represented features with W_i·W_j > 0, those a negative bias makes free
    (W_i·W_j + b_j <= 0). Arrays are (sparsities, seeds).
    """
    W, b, importance, _ = _flat(sweep)
    benefit, paid = th.one_sparse_at_one(W, b, importance)
    _, without_bias = th.one_sparse_at_one(W, b, importance, bias=False)
    _, linear = th.one_sparse_at_one(W, b, importance, relu=False, bias=False)
    gram = W.transpose(-1, -2) @ W
    on = represented(W)
    pairs = on[:, :, None] & on[:, None, :] & ~torch.eye(sweep.features, dtype=torch.bool)
    positive = pairs & (gram > 0)
    freed = positive & (gram + b[:, None, :] <= 0)
    return InterferenceSplit(
        benefit=_grid(sweep, benefit.sum(-1)),
        paid=_grid(sweep, paid.sum((-1, -2))),
        without_bias=_grid(sweep, without_bias.sum((-1, -2))),
        linear=_grid(sweep, linear.sum((-1, -2))),
        negative_pairs=_grid(sweep, (pairs & (gram < 0)).sum((-1, -2))),
        positive_pairs=_grid(sweep, positive.sum((-1, -2))),
        freed_pairs=_grid(sweep, freed.sum((-1, -2))),
        pairs=_grid(sweep, pairs.sum((-1, -2))),
        sparsities=sweep.sparsities,
    )


@dataclass(frozen=True)
class LinearExpansion:
    """The linear model's loss for random W, exactly and by Monte Carlo, next to the text's
    expansion and the exact identities built on it (b = 0 and the best bias)."""

    sparsities: np.ndarray  # (sparsities,)
    expansion: np.ndarray  # (sparsities, draws) Σ_i I_i (1-|W_i|^2)^2 + Σ_{i≠j} I_j (W_j·W_i)^2
    cross: np.ndarray  # (sparsities, draws) the cross terms Σ_j I_j Σ_{i≠k} R_ji R_jk
    identity: np.ndarray  # (sparsities, draws) b = 0: E[x^2] expansion + E[x]^2 cross
    moments: np.ndarray  # (sparsities, draws) b = 0: th.linear_loss, from mean and variance
    direct: np.ndarray  # (sparsities, draws) b = 0: Monte Carlo loss
    direct_error: np.ndarray  # (sparsities, draws) its standard error
    best_identity: np.ndarray  # (sparsities, draws) best bias: Var(x) expansion
    best_moments: np.ndarray  # (sparsities, draws) best bias: th.linear_loss
    best_direct: np.ndarray  # (sparsities, draws) best bias: Monte Carlo loss
    best_direct_error: np.ndarray  # (sparsities, draws) its standard error


def linear_expansion(features, hidden, sparsities, draws, samples, *, decay, seed=0):
    """Check the text's expansion of the linear model's loss on ``draws`` random W (columns of
    norm about 0.5 to 1.5) at every sparsity: the exact identities of
    ``th.linear_loss_by_expansion`` against the loss from the data's moments and a direct Monte
    Carlo estimate (``samples`` inputs, the same for every W at one sparsity).
    Arrays are (sparsities, draws).
    """
    check_size("draws", draws)
    check_size("samples", samples, minimum=2)
    g = generator(seed, "random linear models")
    scale = torch.linspace(0.5, 1.5, draws, dtype=DTYPE)[:, None, None] / hidden**0.5
    W = torch.randn(draws, hidden, features, generator=g, dtype=DTYPE) * scale
    importance = importance_profile(features, decay).expand(draws, features)
    zero = torch.zeros_like(importance)
    expansion, cross = th.linear_terms(W, importance)
    rows = []
    for S in sparsities:  # one sparsity at a time: the inputs are (draws, samples, features)
        x = SparseUniform([seed], features, S, device="cpu", dtype=DTYPE, purpose="evaluation")
        x = x.sample(samples).expand(draws, samples, features)
        best = th.best_linear_bias(W, S)
        direct = toy_sample_loss(W, zero, importance, x, "linear")
        best_direct = toy_sample_loss(W, best, importance, x, "linear")
        rows.append(
            dict(
                expansion=expansion,
                cross=cross,
                identity=th.linear_loss_by_expansion(W, importance, S),
                moments=th.linear_loss(W, zero, importance, S),
                direct=direct.mean(-1),
                direct_error=direct.std(-1) / samples**0.5,
                best_identity=th.linear_loss_by_expansion(W, importance, S, best_bias=True),
                best_moments=th.linear_loss(W, best, importance, S),
                best_direct=best_direct.mean(-1),
                best_direct_error=best_direct.std(-1) / samples**0.5,
            )
        )
    return LinearExpansion(
        sparsities=np.asarray(sparsities),
        **{name: torch.stack([row[name] for row in rows]).numpy() for name in rows[0]},
    )


@dataclass(frozen=True)
class BenefitWithoutRelu:
    """Feature benefit lost, with the ReLU minus without it, for the same W and b."""

    at_one: np.ndarray  # (models, features) I_i [(1 - ReLU(z))^2 - (1 - z)^2], z = |W_i|^2 + b_i
    integrated: np.ndarray  # (models, features) the same, integrated over x_i ∈ [0, 1]
    helped: float  # share of features where the ReLU strictly lowers the loss at x_i = 1


def benefit_without_relu(sweep, random, seed=0):
    """The feature-benefit part of L_1 with the ReLU minus the same part for a linear output with
    the same W and b (never positive if the ReLU never makes feature benefit worse), for every
    model of ``sweep`` and ``random`` random models of the same size (``random_models``)."""
    W, b, importance, _ = _flat(sweep)
    drawn = random_models(sweep.features, sweep.hidden, random, seed)
    W, b, importance = (torch.cat(pair) for pair in zip((W, b, importance), drawn))
    at_one = [th.one_sparse_at_one(W, b, importance, relu=relu)[0] for relu in (True, False)]
    integrated = [th.one_sparse_terms(W, b, importance, relu=relu)[0] for relu in (True, False)]
    return BenefitWithoutRelu(
        at_one=(at_one[0] - at_one[1]).numpy(),
        integrated=(integrated[0] - integrated[1]).numpy(),
        helped=float((at_one[0] < at_one[1]).double().mean()),
    )


def random_models(features, hidden, models, seed=0):
    """Random W (models, hidden, features), columns of norm about 0 to 1.5, and biases b
    (models, features) ~ N(0, 0.5^2) of both signs, with importance 1, in float64."""
    g = generator(seed, "random relu models")
    scale = torch.linspace(0, 1.5, models, dtype=DTYPE)[:, None, None] / hidden**0.5
    W = torch.randn(models, hidden, features, generator=g, dtype=DTYPE) * scale
    b = torch.randn(models, features, generator=g, dtype=DTYPE) * 0.5
    return W, b, torch.ones(models, features, dtype=DTYPE)


def relu_against_linear(relu, linear, samples, seed=0):
    """Each trained ReLU model's loss relative to the trained linear model of the same sparsity
    and seed, L_ReLU / L_linear - 1, both on the same fresh inputs, and the standard error of
    that paired estimate: two (sparsities, seeds) arrays."""
    if relu.output != "relu" or linear.output != "linear":
        raise ValueError("relu_against_linear needs a ReLU sweep and then a linear sweep")
    ((ours,), (theirs,)) = (_evaluation_losses(sweep, samples, seed) for sweep in (relu, linear))
    gap = ours.mean(-1) / theirs.mean(-1) - 1
    error = (ours - theirs).std(-1) / samples**0.5 / theirs.mean(-1)
    return _grid(relu, gap), _grid(relu, error)


UNREPRESENTED = 0.1  # W_i ≈ 0: |W_i| below a tenth of a represented feature's norm, ours


@dataclass(frozen=True)
class UnrepresentedBias:
    """The bias of every feature a trained model leaves out (|W_i| < 0.1), with E[x_i]."""

    bias: np.ndarray  # (found,) b_i
    mean: np.ndarray  # (found,) E[x_i] = (1 - S) / 2 at the model's sparsity
    noise: np.ndarray  # (found,) sqrt(Var(x_i) / batch), the noise of one batch's mean of x_i
    sparsity: np.ndarray  # (found,) the model's S


def unrepresented_bias(sweep, batch=1024):
    """The biases of the features with |W_i| < ``UNREPRESENTED`` in every model of ``sweep``,
    next to E[x_i] and the noise of a training batch's mean of x_i, as flat (found,) arrays."""
    W, b, _, S = _flat(sweep)
    left_out = torch.as_tensor(W).norm(dim=-2) < UNREPRESENTED
    S = S[:, None].expand_as(b)[left_out]
    moments = sparse_moments(S)
    return UnrepresentedBias(
        bias=b[left_out].numpy(),
        mean=moments["mean"].numpy(),
        noise=(moments["variance"] / batch).sqrt().numpy(),
        sparsity=S.numpy(),
    )


# --- 3. linear against ReLU output ------------------------------------------------------------


def linear_gap(sweep):
    """The linear sweep's exact loss against the optimum Var(x) Σ_{i>m} I_i: relative gaps
    (sparsities, seeds)."""
    if sweep.output != "linear":
        raise ValueError(f"linear_gap needs a sweep of linear models; got output={sweep.output!r}")
    W, b, importance, S = _flat(sweep)
    measured = th.linear_loss(W, b, importance, S)
    optimum = th.linear_optimum(importance, sweep.hidden, S)
    return _grid(sweep, measured / optimum - 1)


PLANAR_SHAPES = ("orthogonal pair", "antipodal pairs", "pentagon", "other")


def planar_shape(w, tolerance=5.0):
    """Name the arrangement of one model's represented features in the plane (hidden = 2):
    "orthogonal pair", "antipodal pairs" (four at 90°), "pentagon" (five at 72°) or "other".

    w: (2, features). Gaps between neighbouring directions must be within ``tolerance`` degrees.
    """
    w = torch.as_tensor(w)
    if w.shape[0] != 2:
        raise ValueError(f"planar_shape needs hidden = 2; got {w.shape[0]}")
    on = represented(w)
    angles = torch.sort(torch.rad2deg(torch.atan2(w[1, on], w[0, on])))[0]
    if len(angles) < 2:
        return "other"
    gaps = torch.diff(torch.cat([angles, angles[:1] + 360]))
    regular = lambda gap: bool(torch.all((gaps - gap).abs() <= tolerance))  # noqa: E731
    if len(angles) == 2 and abs(float(gaps.min()) - 90) <= tolerance:
        return "orthogonal pair"
    if len(angles) == 4 and regular(90):
        return "antipodal pairs"
    if len(angles) == 5 and regular(72):
        return "pentagon"
    return "other"


# The panels of Elhage et al.'s introductory figure (n = 5, m = 2): sparsity S -> arrangement
FIGURE_SHAPES = {0.0: "orthogonal pair", 0.8: "antipodal pairs", 0.9: "pentagon"}


def figure_shapes(sweep, shapes, loss):
    """At each sparsity of ``FIGURE_SHAPES``: the shape of the lowest-loss model among the seeds,
    the share of seeds whose model has the figure's shape, and every seed's shape. ``shapes``:
    names from ``planar_shape``, (sparsities, seeds) nested lists; loss: (sparsities, seeds).
    Returns {S: (best shape, share, shapes)}; raises ValueError if the sweep lacks one of the S."""
    found = {}
    for S, shape in FIGURE_SHAPES.items():
        index = np.flatnonzero(np.isclose(sweep.sparsities, S))
        if not len(index):
            raise ValueError(f"the sweep has no sparsity {S}; its sparsities: {sweep.sparsities}")
        row = shapes[index[0]]
        found[S] = (row[int(np.argmin(loss[index[0]]))], row.count(shape) / len(row), row)
    return found


# --- 4. the Thomson analogy -------------------------------------------------------------------


def learned_packing(sweep):
    """The packing energy Σ_{i≠j} ReLU(u_i·u_j)^2 of each model's represented directions u_i =
    W_i/|W_i|, and how many there are: two (sparsities, seeds) arrays."""
    W, _, _, _ = _flat(sweep)
    energies, counts = [], []
    for w in W:
        on = represented(w)
        energies.append(float(th.packing_energy(w[:, on].T)))
        counts.append(int(on.sum()))
    return _grid(sweep, energies), _grid(sweep, counts)


@dataclass(frozen=True)
class PackingComparison:
    """Each model's learned packing energy against the best found for as many directions."""

    n: int  # features
    m: int  # hidden
    learned: np.ndarray  # (sparsities, seeds) energy of the learned directions
    counts: np.ndarray  # (sparsities, seeds) represented features
    best: np.ndarray  # (sparsities, seeds) best energy over the restarts, for that count
    ratio: np.ndarray  # (sparsities, seeds) learned / best


def packing_comparison(sweep, restarts, steps):
    """Each model's learned packing energy against the best found by direct minimisation for the
    same number of represented features, as (sparsities, seeds) arrays."""
    learned, counts = learned_packing(sweep)
    best = {k: packing_minimum(int(k), sweep.hidden, restarts, steps) for k in np.unique(counts)}
    best_for_model = np.vectorize(best.get)(counts)
    return PackingComparison(
        n=sweep.features,
        m=sweep.hidden,
        learned=learned,
        counts=counts,
        best=best_for_model,
        ratio=learned / best_for_model,
    )


@cached
def packing_minimum(count, hidden, restarts, steps):
    """The best packing energy of ``count`` points on S^(hidden-1) over ``restarts`` random
    starts."""
    energies, _ = th.minimize_packing_energy(count, hidden, restarts, steps)
    return float(energies[0])
