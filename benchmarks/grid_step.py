"""Benchmark: where one training step of chapter 5's grid goes, part by part.

    .venv/bin/python benchmarks/grid_step.py --features 512 2048 --models 21 [--device cuda]

One shard as the chapter trains it on a GPU (``train_group``: every model of one hidden size,
here ``--models`` of them at nd/ns = ``--ratio``, p = ``--density``), its step taken apart:
drawing the batch (``SparseUniform.sample``), the forward pass and gradients
(``UntiedAutoencoder.loss_and_grads``: five batched products, the loss's reduction and the
elementwise passes), and Adam (``adam_update``). Each part is timed alone over ``--steps``
steps, the clock read after the device has finished, then the whole step; milliseconds per step
and per model-step, and the rate of the products' arithmetic (2·batch·ns·nd per product and
model). The shares say what a faster step must cut. Then two other ways, timed beside what it
does: the loss as a batched matrix-vector product (the step's way until it became a
reduction), with each way's error against float64, and batches drawn eight at a time; and the
profiler's operations that took the most device (or CPU) time over a few whole steps.
``TOYCORE_MATMUL=tf32`` runs the products on a GPU's tensor cores.
"""

import argparse
import time

import torch

from toycore import devices
from toycore.data import SparseUniform, prefetch_for
from toycore.experiments.rug_training import BATCH, hidden_size, learning_rate
from toycore.models import UntiedAutoencoder
from toycore.train import adam_update


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device, steps, work):
    """Seconds per call of ``work`` over ``steps`` calls, the device finished at both ends."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        work()
    synchronize(device)
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--features", type=int, nargs="+", default=[512], help="ns (default 512)")
    parser.add_argument("--models", type=int, default=21, help="models in the shard")
    parser.add_argument("--ratio", type=float, default=0.3, help="nd/ns (default 0.3)")
    parser.add_argument("--density", type=float, default=0.05, help="p (default 0.05)")
    parser.add_argument("--steps", type=int, default=30, help="steps timed per part")
    parser.add_argument("--device", default=None, help="auto (default), cpu, cuda or cuda:k")
    args = parser.parse_args()
    device = devices.use(args.device)
    print(
        f"{args.models} models, nd/ns = {args.ratio}, p = {args.density}, batch {BATCH}, on "
        f"{devices.describe(device)}, products in {devices.matmul_precision()}"
    )
    for features in args.features:
        hidden = hidden_size(features, args.ratio)
        model = UntiedAutoencoder(features, hidden, list(range(args.models)))
        data = SparseUniform(
            model.seeds,
            features,
            1 - args.density,
            prefetch=prefetch_for(args.models, BATCH, features),
        )
        names = [name for name, _ in model.named_parameters()]
        live = {name: param.detach() for name, param in model.named_parameters()}
        params = [live[name] for name in names]
        firsts = [torch.zeros_like(p) for p in params]
        seconds = [torch.zeros_like(p) for p in params]
        lr = torch.full((args.models,), learning_rate(features), device=device)
        running = list(range(args.models))
        x = data.sample(BATCH, running)
        taken = [0]

        def draw():
            data.sample(BATCH, running)

        def gradients():
            model.loss_and_grads(x, **live)

        _, grads = model.loss_and_grads(x, **live)

        def adam():
            taken[0] += 1
            adam_update(params, list(grads), firsts, seconds, lr, taken[0], (0.9, 0.999), 1e-7)

        def step():
            batch = data.sample(BATCH, running)
            _, fresh = model.loss_and_grads(batch, **live)
            taken[0] += 1
            adam_update(params, list(fresh), firsts, seconds, lr, taken[0], (0.9, 0.999), 1e-7)

        for part in (draw, gradients, adam, step):  # warm up: kernels, allocator, cuBLAS
            timed(device, 3, part)
        parts = {
            name: timed(device, args.steps, part)
            for name, part in (
                ("batch", draw),
                ("loss and gradients", gradients),
                ("Adam", adam),
                ("whole step", step),
            )
        }
        flops = 5 * 2 * args.models * BATCH * features * hidden  # five products
        print(f"ns = {features}, nd = {hidden}:")
        for name, seconds_per_step in parts.items():
            share = seconds_per_step / parts["whole step"]
            print(
                f"  {name:>18}: {1e3 * seconds_per_step:8.3f} ms per step, "
                f"{1e3 * seconds_per_step / args.models:7.3f} per model-step, {share:4.0%}"
            )
        print(
            f"  products: {flops / parts['loss and gradients'] / 1e12:.1f} TFLOP/s within the "
            f"loss and gradients, {flops / parts['whole step'] / 1e12:.1f} over the whole step"
        )
        alternatives(device, args, model, live, x, features, parts)
        activity = (
            torch.profiler.ProfilerActivity.CUDA
            if device.type == "cuda"
            else torch.profiler.ProfilerActivity.CPU
        )
        with torch.profiler.profile(activities=[activity]) as profile:
            for _ in range(5):
                step()
            synchronize(device)
        key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(profile.key_averages().table(sort_by=key, row_limit=10, max_name_column_width=48))


def alternatives(device, args, model, live, x, features, parts):
    """Two other ways of the step, timed beside what it does, in the same run: the loss as the
    batched matrix-vector product it was before it became a reduction, and the batches drawn
    eight at a time per generator call instead of as the stock budget allows (either changes
    the numbers, and every record of chapter 5 with them)."""
    with torch.no_grad():
        output = torch.baddbmm(
            live["b"].unsqueeze(-2), torch.bmm(x, live["W_in"].mT), live["W_out"].mT
        ).clamp_min_(0)
        flat = (output - x).flatten(1)  # (models, batch·features), the errors
    product = timed(device, args.steps, lambda: torch.bmm(flat.unsqueeze(1), flat.unsqueeze(2)))
    reduced = timed(device, args.steps, lambda: torch.linalg.vecdot(flat, flat))
    exact = torch.linalg.vecdot(flat.double(), flat.double())  # the float64 reference

    def error(loss):  # the largest relative error against it
        return ((loss.double() - exact).abs() / exact).max().item()

    print(
        f"  the loss as a reduction: {1e3 * reduced:.3f} ms against {1e3 * product:.3f} as a "
        f"product ({product / reduced:.2f}x); largest relative error against float64 "
        f"{error(torch.linalg.vecdot(flat, flat)):.1e} against "
        f"{error(torch.bmm(flat.unsqueeze(1), flat.unsqueeze(2)).flatten()):.1e}"
    )
    stocked = SparseUniform(model.seeds, features, 1 - args.density, prefetch=8)
    running = list(range(args.models))
    eight = timed(device, 8 * max(1, args.steps // 8), lambda: stocked.sample(BATCH, running))
    print(
        f"  batches drawn 8 at a time: {1e3 * eight:.3f} ms per step against "
        f"{1e3 * parts['batch']:.3f} as the stock budget draws them "
        f"({parts['batch'] / eight:.2f}x)"
    )


if __name__ == "__main__":
    main()
