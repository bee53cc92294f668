"""Benchmark: one training step of chapter 3's tied model, closed form against plain autograd.

    make benchmark     (or: .venv/bin/python benchmarks/tied_step.py --help)

Both sides train the same model (tied W, the n basis vectors as the batch, l1 penalty) with
AdamW at the authors' settings, from the same weights, in the same process. The baseline is the
plain implementation: einsums through the network, autograd, ``torch.optim.AdamW``. Ours is
``TiedBasisAutoencoder.loss_and_grad`` (two products and no autograd) with the fused AdamW that
``toycore.train`` uses. A second baseline gives the autograd step the fused AdamW too, to show
how much of the gain is the optimiser. Prints median step times and their ratios; timings vary
with the machine, so only ratios from one run are comparable. ``--device cuda`` times the same
on a GPU (the clock is read after the GPU has finished the steps).
"""

import argparse
import statistics
import time

import torch

from toycore import devices
from toycore.models import TiedBasisAutoencoder, tied_basis_reference_loss
from toycore.train import make_optimizer


def finish(device):
    """Wait until the device has done all queued work, so that the clock measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def closed_form_step(model, optimizer):
    def step():
        optimizer.zero_grad(set_to_none=True)
        model.loss_and_grad()
        optimizer.step()

    return step


def autograd_step(W, l1, optimizer):
    def step():
        optimizer.zero_grad(set_to_none=True)
        tied_basis_reference_loss(W, l1).sum().backward()
        optimizer.step()

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=16)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default=None, help="auto (default), cpu, cuda or cuda:k")
    args = parser.parse_args()

    device = devices.use(args.device)
    l1 = 1e-3
    model = TiedBasisAutoencoder(args.features, args.hidden, range(args.instances), l1)
    plain_W = torch.nn.Parameter(model.W.detach().clone())
    fused_W = torch.nn.Parameter(model.W.detach().clone())
    contenders = {
        "autograd + plain AdamW (baseline)": autograd_step(
            plain_W, model.l1, torch.optim.AdamW([plain_W], lr=1e-3)
        ),
        "autograd + fused AdamW": autograd_step(
            fused_W, model.l1, make_optimizer("adamw", [fused_W], 1e-3)
        ),
        "closed form + fused AdamW (ours)": closed_form_step(
            model, make_optimizer("adamw", model.parameters(), 1e-3)
        ),
    }
    times = {name: [] for name in contenders}
    for step in contenders.values():
        step()  # warm up
    for _ in range(args.rounds):  # interleaved, so that machine noise hits everyone alike
        for name, step in contenders.items():
            finish(device)
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            finish(device)
            times[name].append((time.perf_counter() - start) / args.steps)

    print(
        f"instances={args.instances} n={args.features} m={args.hidden} on "
        f"{devices.describe(device)}, {torch.get_num_threads()} threads, "
        f"median of {args.rounds} rounds x {args.steps} steps"
    )
    baseline = statistics.median(times["autograd + plain AdamW (baseline)"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:36s} {1e3 * median:8.1f} ms/step   speed-up x{baseline / median:.2f}")
    with torch.no_grad():
        ours, theirs = model.loss(), tied_basis_reference_loss(plain_W, model.l1)
    print(
        f"  after {1 + args.rounds * args.steps} steps from the same start, the losses differ by "
        f"{((ours - theirs).abs() / theirs).max().item():.1e} (relative, float32)"
    )


if __name__ == "__main__":
    main()
