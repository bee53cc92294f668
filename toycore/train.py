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

from .data import check_size
from .progress import progress_bar

OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


@dataclass
class History:
    """What a run recorded; step k's values are those of the weights before the (k+1)-th update."""
    steps: np.ndarray                       # (records,)
    loss: np.ndarray                        # (records, instances)
    metrics: dict = field(default_factory=dict)  # name -> (records, instances, ...)


def record_steps(steps, records):
    """About ``records`` steps spaced evenly in log-time from 0 to ``steps`` (always both ends).

    Log spacing shows plateaus and fast early drops equally well.
    """
    check_size("records", records, minimum=2)
    grid = np.unique(np.round(np.geomspace(1, steps + 1, records)).astype(int) - 1)
    return np.unique(np.concatenate([[0], grid, [steps]]))


def make_optimizer(name, params, lr, **options):
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got {name!r}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0; got {lr!r}")
    params = list(params)
    try:
        return OPTIMIZERS[name](params, lr=lr, fused=True, **options)
    except (RuntimeError, TypeError):  # no fused kernel for this device or dtype
        return OPTIMIZERS[name](params, lr=lr, **options)


def train(model, data, *, steps, lr, optimizer="sgd", record_at=None, metrics=None,
          desc="training", **optimizer_options):
    """Train ``model`` in place and return its History.

    record_at: the steps (0..steps) at which loss and metrics are recorded; default
    ``record_steps(steps, 200)``. Every instance is an independent run: the summed loss gives
    each instance its own gradient, and every optimizer here is elementwise.
    """
    check_size("steps", steps, minimum=0)
    optim = make_optimizer(optimizer, model.parameters(), lr, **optimizer_options)
    metrics = metrics or {}
    record_at = record_steps(steps, 200) if record_at is None else np.unique(np.asarray(record_at))
    if record_at.size and (record_at[0] < 0 or record_at[-1] > steps):
        raise ValueError(f"record_at must lie in [0, {steps}]")
    closed_form = hasattr(model, "loss_and_grad")
    recorded_loss, recorded_metrics = [], {name: [] for name in metrics}
    next_record = 0
    bar = progress_bar(steps, desc)
    for step in range(steps + 1):
        inputs = () if data is None else (data if torch.is_tensor(data) else data(step),)
        optim.zero_grad(set_to_none=True)
        loss = model.loss_and_grad(*inputs) if closed_form else model.loss(*inputs)
        if next_record < len(record_at) and record_at[next_record] == step:
            recorded_loss.append(loss.detach().cpu())
            with torch.no_grad():
                for name, fn in metrics.items():
                    # clone: on the CPU, detach().cpu() of a parameter is a view that later steps overwrite
                    recorded_metrics[name].append(fn(model).detach().cpu().clone())
            next_record += 1
        if step == steps:
            break
        if not closed_form:
            loss.sum().backward()
        optim.step()
        bar.update(1)
    bar.close()
    return History(
        steps=record_at,
        loss=torch.stack(recorded_loss).numpy(),
        metrics={name: torch.stack(values).numpy() for name, values in recorded_metrics.items()},
    )
