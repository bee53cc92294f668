"""One training loop for every model in the book.

``train(model, data, steps=..., lr=...)`` runs full-batch training when ``data`` is a tensor
(instances, batch, features) and minibatch training when it is a callable ``data(step)`` that
returns a fresh batch; ``data=None`` is for a model whose loss already knows its whole data set.
A model with ``loss_and_grad()`` supplies its own (closed-form) gradient; any other model's
``loss`` is differentiated by autograd. It records each instance's loss at chosen steps, and any
metric ``fn(model) -> (instances, ...)`` at the same steps.
"""

from dataclasses import dataclass, field

import numpy as np
import torch
from jaxtyping import Float, Int

from .checks import check_choice, check_range, check_size
from .progress import progress_bar

OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


@dataclass
class History:
    """What a run recorded; step k's values are those of the weights before the (k+1)-th update."""

    steps: Int[np.ndarray, " records"]  # (the leading space keeps pyflakes from reading a name)
    loss: Float[np.ndarray, "records instances"]
    metrics: dict = field(default_factory=dict)  # name -> (records, instances, ...)


def record_steps(steps, records):
    """About ``records`` steps spaced evenly in log-time from 0 to ``steps`` (always both ends).

    Log spacing shows plateaus and fast early drops equally well.
    """
    check_size("records", records, minimum=2)
    grid = np.unique(np.round(np.geomspace(1, steps + 1, records)).astype(int) - 1)
    return np.unique(np.concatenate([[0], grid, [steps]]))


def make_optimizer(name, params, lr, **options):
    check_choice("optimizer", name, tuple(OPTIMIZERS))
    check_range("lr", lr, 0, low_open=True)
    params = list(params)
    try:
        return OPTIMIZERS[name](params, lr=lr, fused=True, **options)
    except (RuntimeError, TypeError):  # no fused kernel for this device or dtype
        return OPTIMIZERS[name](params, lr=lr, **options)


def diverged(model, instance, step, last_finite, settings):
    """The error for a run whose loss was found not finite at ``step``."""
    described = ", ".join(f"{name}={value!r}" for name, value in settings.items())
    since = "" if step == 0 else f" (finite at step {last_finite})"
    return FloatingPointError(
        f"training diverged: instance {instance} (seed {model.seeds[instance]}) has a loss that "
        f"is not finite at step {step}{since}; {type(model).__name__}, {described}. A smaller "
        f"lr or init_std may train"
    )


def train(
    model,
    data,
    *,
    steps,
    lr,
    optimizer="sgd",
    record_at=None,
    metrics=None,
    desc="training",
    **optimizer_options,
):
    """Train ``model`` in place and return its History.

    record_at: the steps (0..steps) at which loss and metrics are recorded; default
    ``record_steps(steps, 200)``. Every instance is an independent run: the summed loss gives
    each instance its own gradient, and every optimizer here is elementwise. A run whose loss
    becomes NaN or infinite stops the training with a FloatingPointError naming it and the step.
    """
    check_size("steps", steps, minimum=0)
    optim = make_optimizer(optimizer, model.parameters(), lr, **optimizer_options)
    metrics = metrics or {}
    record_at = record_steps(steps, 200) if record_at is None else np.unique(np.asarray(record_at))
    if record_at.size and (record_at[0] < 0 or record_at[-1] > steps):
        raise ValueError(f"record_at must lie in [0, {steps}]")
    closed_form = hasattr(model, "loss_and_grad")
    # Records go into buffers made at the first record: a small tensor kept at every step would
    # pin the allocator's heap between the step's temporaries, which then are never given back
    # (recording each of chapter 1's 13,000 steps grew the process by 1.2 GB).
    recorded = {}  # "loss" and each metric -> (records, ...) on the CPU
    next_record = 0
    last_finite = 0  # the last step checked at which every loss was finite
    bar = progress_bar(steps, desc)
    for step in range(steps + 1):
        inputs = () if data is None else (data if torch.is_tensor(data) else data(step),)
        optim.zero_grad(set_to_none=True)
        loss = model.loss_and_grad(*inputs) if closed_form else model.loss(*inputs)
        if next_record < len(record_at) and record_at[next_record] == step:
            with torch.no_grad():
                values = {"loss": loss, **{name: fn(model) for name, fn in metrics.items()}}
                for name, value in values.items():
                    if name not in recorded:
                        recorded[name] = torch.empty(
                            (len(record_at), *value.shape), dtype=value.dtype
                        )
                    recorded[name][next_record] = value.detach()  # a copy, never a view
            checked = recorded["loss"][next_record]
            next_record += 1
        elif step == steps:
            checked = loss.detach().cpu()
        else:
            checked = None
        # A non-finite loss makes the next weights non-finite, and they stay so: checking the
        # losses the host reads anyway finds every diverged run, at no cost per step.
        if checked is not None:
            bad = torch.nonzero(~torch.isfinite(checked)).flatten().tolist()
            if bad:
                bar.close()
                settings = dict(lr=lr, optimizer=optimizer, steps=steps, **optimizer_options)
                raise diverged(model, bad[0], step, last_finite, settings)
            last_finite = step
        if step == steps:
            break
        if not closed_form:
            loss.sum().backward()
        optim.step()
        bar.update(1)
    bar.close()
    return History(
        steps=record_at,
        loss=recorded["loss"].numpy(),
        metrics={name: recorded[name].numpy() for name in metrics},
    )


@dataclass
class AdamMoments:
    """Adam's moments of every parameter, by name, each (instances, ...) like the parameter:
    with the weights and the steps taken, what a run needs to go on where it stopped."""

    first: dict
    second: dict


@dataclass
class ConvergedRun:
    """What ``train_until_converged`` did, per instance."""

    steps: np.ndarray  # (instances,) steps each instance took, those before ``start`` included
    converged: np.ndarray  # (instances,) whether its stopping rule fired (else it hit the cap)
    loss: list  # per instance, its training loss at every step it took in this run
    moments: AdamMoments  # each instance's moments where it stopped


def stopped(losses, window):
    """The Persian rug paper's rule: stop once the mean loss of the last ``window`` steps is no
    lower than the mean of the ``window`` steps before them."""
    if len(losses) < 2 * window:
        return False
    return np.mean(losses[-window:]) >= np.mean(losses[-2 * window : -window])


def adam_update(params, grads, firsts, seconds, lr, taken, betas, eps):
    """torch.optim.Adam's update of ``params`` in place, with each instance's own learning rate
    ``lr`` (instances,), at step ``taken`` (from 1); ``firsts`` and ``seconds`` are the moments,
    updated in place. Each operation acts on every parameter at once (one kernel launch for all
    of them on a GPU, where a small model's step is otherwise launches, not arithmetic)."""
    correction1, correction2 = 1 - betas[0] ** taken, 1 - betas[1] ** taken
    step_size = lr / correction1
    sizes = [step_size.view(-1, *[1] * (p.dim() - 1)) for p in params]  # per instance
    torch._foreach_lerp_(firsts, grads, 1 - betas[0])
    torch._foreach_mul_(seconds, betas[1])
    torch._foreach_addcmul_(seconds, grads, grads, value=1 - betas[1])
    denominators = torch._foreach_sqrt(seconds)
    torch._foreach_div_(denominators, correction2**0.5)
    torch._foreach_add_(denominators, eps)
    torch._foreach_addcdiv_(params, torch._foreach_mul(firsts, sizes), denominators, value=-1)


def train_until_converged(
    model,
    data,
    *,
    lr,
    batch,
    window=200,
    check_every=30,
    max_steps=45_000,
    steps=None,
    betas=(0.9, 0.999),
    eps=1e-7,
    start=None,
    desc="training",
):
    """Adam on every instance until its own stopping rule fires (``steps=N``: exactly N steps).

    ``data.sample(batch, instances)`` draws fresh batches for the instances still training; lr
    is one value or one per instance. The rule is checked every ``check_every`` steps (the
    authors checked once per 30,000-sample epoch, about 30 batches of 1024). Instances that
    stopped leave the batch, so the others no longer pay for them: the live parameters and
    Adam's moments are gathered for the running instances and written back when one stops.
    The update is torch.optim.Adam's, elementwise, so each instance trains exactly as alone.

    ``start=(moments, taken)`` goes on with a run that stopped after ``taken`` steps (every
    instance's the same) to ``steps`` in all, from its ``AdamMoments`` and the model's weights
    as it left them, ``data`` standing where its stream stood: bit for bit the run that had not
    stopped.
    """
    names = [name for name, _ in model.named_parameters()]
    storage = {name: param.detach() for name, param in model.named_parameters()}
    device = storage[names[0]].device
    instances = len(model.seeds)
    check_range("lr", lr, 0, low_open=True)
    given_lr = np.broadcast_to(np.asarray(lr, dtype=float), (instances,))  # for error messages
    lr = torch.as_tensor(lr, dtype=storage[names[0]].dtype).expand(instances).clone().to(device)
    check_size("batch", batch)
    check_size("check_every", check_every)
    if steps is not None:
        check_size("steps", steps)
    else:
        check_size("window", window)
        check_size("max_steps", max_steps, minimum=2 * window)
    cap = steps if steps is not None else max_steps
    if start is None:
        first_moment = {name: torch.zeros_like(t) for name, t in storage.items()}
        second_moment = {name: torch.zeros_like(t) for name, t in storage.items()}
        started = 0
    else:  # the rule would see only this run's losses, so a run goes on for fixed steps
        if steps is None:
            raise ValueError("start goes on with a run for fixed steps: pass steps=")
        moments, started = start
        first_moment, second_moment = (
            {name: torch.as_tensor(given[name]).to(t).clone() for name, t in storage.items()}
            for given in (moments.first, moments.second)
        )
        check_size("the steps taken before start", started, minimum=1, maximum=cap - 1)
    history = [[] for _ in range(instances)]
    converged = np.zeros(instances, dtype=bool)
    running = list(range(instances))
    taken = started
    bar = progress_bar(cap - started, desc)
    while running:
        index = torch.tensor(running, device=device)
        live = {name: storage[name][index] for name in names}
        m1 = {name: first_moment[name][index] for name in names}
        m2 = {name: second_moment[name][index] for name in names}
        running_lr = lr[index]
        # the same tensors as lists, in the order of ``names``, for the foreach operations
        params, firsts, seconds = ([d[name] for name in names] for d in (live, m1, m2))
        finished, pending = [], []  # pending: this stretch's losses, (running,) each, on the device
        while not finished:
            x = data.sample(batch, running)  # (running, batch, features)
            loss, grads = model.loss_and_grads(x, **live)  # loss: (running,)
            taken += 1
            adam_update(params, list(grads), firsts, seconds, running_lr, taken, betas, eps)
            pending.append(loss.detach())
            bar.update(1)
            if taken == cap or taken % check_every == 0:
                # the losses reach the host once per check, not every step: on a GPU a per-step
                # transfer would make the host wait for each step before queueing the next
                for k, values in zip(running, torch.stack(pending, 1).tolist()):
                    if not np.all(np.isfinite(values)):
                        bar.close()
                        step = started + len(history[k]) + int(np.argmin(np.isfinite(values)))
                        settings = dict(lr=float(given_lr[k]), batch=batch, betas=betas, eps=eps)
                        raise diverged(model, k, step, step - 1, settings)
                    history[k].extend(values)
                pending = []
                if taken == cap:
                    finished = list(running)
                elif steps is None:
                    finished = [k for k in running if stopped(history[k], window)]
                    converged[finished] = True
        for name in names:
            storage[name][index] = live[name]
            first_moment[name][index] = m1[name]
            second_moment[name][index] = m2[name]
        running = [k for k in running if k not in finished]
    bar.close()
    return ConvergedRun(
        steps=np.array([started + len(h) for h in history]),
        converged=converged,
        loss=[np.array(h) for h in history],
        moments=AdamMoments(first_moment, second_moment),
    )
