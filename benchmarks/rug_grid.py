"""Benchmark: a (p, nd/ns) grid of chapter 5's models, batched against one model at a time.

    make benchmark     (or: .venv/bin/python benchmarks/rug_grid.py --help)

Both sides train the same grid (one model per (p, ratio) cell) for the same number of Adam
steps with the authors' settings (batch 1024, lr 3e-3/√ns, eps 1e-7), in the same process, on
the same device, alternating twice, and then measure each model's loss on 16,384 fresh
samples, as the chapter does. The baseline is the plain loop of the authors' code: two
``nn.Linear`` layers, ``F.mse_loss``, ``torch.optim.Adam``, one model after the other. Ours is
what the chapter runs, without its cache: ``train_group`` (``train_until_converged`` on
``UntiedAutoencoder``) on each shard of ``shard_plan``. Prints the time per model-step, the
ratio, and models per hour at the steps a model of this size needs to converge
(``--steps-to-converge``, measured in the chapter's runs). Only ratios from one run are
comparable. On a GPU (``--device cuda``) the clock is read after the GPU has finished; try
``--features 512 2048`` and the paper profile's grid (``--densities 0.001 0.01 0.05 0.1 0.2
0.4 0.6 --ratios 0.02 0.05 0.1 0.2 0.3 0.4 0.6 0.8``).

It also counts the operations one training step issues (each a kernel launch on a GPU, where a
small model's step costs launches, not arithmetic): the step as ``train_until_converged`` takes
it (Adam on every parameter at once, ``torch._foreach_*``) against the same update written one
parameter at a time, as it was before.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

from toycore import devices
from toycore.data import SparseUniform
from toycore.experiments.rug_training import (
    BATCH,
    EVAL_SAMPLES,
    hidden_size,
    learning_rate,
    shard_plan,
    train_group,
)
from toycore.train import adam_update


class PlainModel(nn.Module):
    def __init__(self, features, hidden):
        super().__init__()
        self.encode = nn.Linear(features, hidden, bias=False)
        self.decode = nn.Linear(hidden, features)

    def forward(self, x):
        return torch.relu(self.decode(self.encode(x)))


def plain_loop(features, cells, steps, device):
    for k, (p, ratio) in enumerate(cells):
        torch.manual_seed(k)
        model = PlainModel(features, hidden_size(features, ratio)).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate(features), eps=1e-7)
        data = SparseUniform([k], features, 1 - p, device=device)
        for _ in range(steps):
            x = data.sample(BATCH)[0]
            loss = F.mse_loss(model(x), x)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        evaluation = SparseUniform([k], features, 1 - p, device=device, purpose="evaluation")
        with torch.no_grad():
            for _ in range(EVAL_SAMPLES // BATCH):
                x = evaluation.sample(BATCH)[0]
                F.mse_loss(model(x), x)


def batched(features, cells, steps, device):  # train_group builds on devices.use's device
    hiddens = [hidden_size(features, r) for _, r in cells]
    for group in shard_plan(features, hiddens):
        densities = [cells[k][0] for k in group]
        train_group.uncached(features, densities, hiddens[group[0]], group, steps=steps)


def _adam_one_at_a_time(params, grads, firsts, seconds, step_size, taken, betas, eps):
    """``toycore.train.adam_update`` as it was, one parameter at a time (for the count)."""
    correction1, correction2 = 1 - betas[0] ** taken, 1 - betas[1] ** taken
    step = step_size / correction1
    for param, grad, first, second in zip(params, grads, firsts, seconds):
        first.lerp_(grad, 1 - betas[0])
        second.mul_(betas[1]).addcmul_(grad, grad, value=1 - betas[1])
        denominator = (second.sqrt() / correction2**0.5).add_(eps)
        param.addcdiv_(step.view(-1, *[1] * (grad.dim() - 1)) * first, denominator, value=-1)


def operations_per_step(features, hidden, instances, update):
    """The top-level torch operations of one training step (forward, gradients, ``update``),
    counted with torch's profiler: on a GPU, about one kernel launch each."""
    from toycore.models import UntiedAutoencoder

    model = UntiedAutoencoder(features, hidden, list(range(instances)))
    params = [p.detach() for p in model.parameters()]
    firsts, seconds = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    data = SparseUniform(model.seeds, features, 0.95)
    x = data.sample(BATCH)
    step_size = torch.full((instances,), learning_rate(features), device=params[0].device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as profile:
        _, grads = model.loss_and_grads(x, *params)
        update(params, list(grads), firsts, seconds, step_size, 1, (0.9, 0.999), 1e-7)
    return sum(1 for e in profile.events() if e.cpu_parent is None and e.name.startswith("aten::"))


def timed(run, device, *args):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    run(*args, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--features", type=int, nargs="+", default=[512], help="ns (default 512)")
    parser.add_argument("--densities", type=float, nargs="+", default=[0.01, 0.05, 0.2])
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.1, 0.25, 0.5])
    parser.add_argument("--steps", type=int, default=100, help="Adam steps per model timed")
    parser.add_argument(
        "--steps-to-converge",
        type=int,
        default=7000,
        help="steps a model needs, for models per hour (default: the chapter's "
        "ns=512 runs took 6,900-7,400)",
    )
    parser.add_argument("--device", default=None, help="auto (default), cpu, cuda or cuda:k")
    args = parser.parse_args()
    device = devices.use(args.device)
    cells = [(p, r) for p in args.densities for r in args.ratios]
    print(
        f"{len(cells)} models (p in {args.densities}, nd/ns in {args.ratios}), {args.steps} "
        f"Adam steps each, batch {BATCH}, on {devices.describe(device)}, "
        f"{torch.get_num_threads()} threads"
    )
    # 8 models at the first ns, nd = ns / 8 (64 at ns = 512: within any ns given)
    counts = {
        name: operations_per_step(args.features[0], hidden_size(args.features[0], 0.125), 8, update)
        for name, update in (
            ("one parameter at a time", _adam_one_at_a_time),
            ("every parameter at once", adam_update),
        )
    }
    print(
        "operations per training step (forward, gradients, Adam): "
        + ", ".join(f"{name} {count}" for name, count in counts.items())
    )
    for features in args.features:
        batched(features, cells, 2, device)  # warm up: kernels, allocator
        times = {"plain loop": [], "batched grid": []}
        for _ in range(2):
            for name, run in (("plain loop", plain_loop), ("batched grid", batched)):
                times[name].append(timed(run, device, features, cells, args.steps))
        base = min(times["plain loop"])
        print(f"ns = {features}:")
        for name, values in times.items():
            per_model_step = min(values) / (len(cells) * args.steps)
            per_hour = 3600 / (per_model_step * args.steps_to_converge)
            print(
                f"  {name:>13}: {1e3 * per_model_step:7.3f} ms per model-step, "
                f"{per_hour:8.1f} models/hour, speed-up {base / min(values):.2f}"
            )


if __name__ == "__main__":
    main()
