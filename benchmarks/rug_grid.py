"""Benchmark: a (p, nd/ns) grid of chapter 5's models, batched against one model at a time.

    make benchmark     (or: .venv/bin/python benchmarks/rug_grid.py --help)

Both sides train the same grid (one model per (p, ratio) cell) for the same number of Adam
steps with the authors' settings (batch 1024, lr 3e-3/√ns, eps 1e-7), in the same process,
alternating twice. The baseline is the plain loop of the authors' code: two ``nn.Linear``
layers, ``F.mse_loss``, ``torch.optim.Adam``, one model after the other. Ours is
``toycore.experiments.persian_rug.train_models``: ``train_until_converged`` on
``UntiedAutoencoder``, one batch per hidden size, each holding every p. Prints the time per model-step, the ratio, and models per
hour at the steps a model of this size needs to converge (``--steps-to-converge``, measured in
the chapter's runs). Only ratios from one run are comparable.
"""
import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

from toycore.data import SparseUniform
from toycore.experiments.persian_rug import BATCH, hidden_size, learning_rate, train_models


class PlainModel(nn.Module):
    def __init__(self, features, hidden):
        super().__init__()
        self.encode = nn.Linear(features, hidden, bias=False)
        self.decode = nn.Linear(hidden, features)

    def forward(self, x):
        return torch.relu(self.decode(self.encode(x)))


def plain_loop(features, cells, steps):
    for k, (p, ratio) in enumerate(cells):
        torch.manual_seed(k)
        model = PlainModel(features, hidden_size(features, ratio))
        optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate(features), eps=1e-7)
        data = SparseUniform([k], features, 1 - p)
        for _ in range(steps):
            x = data.sample(BATCH)[0]
            loss = F.mse_loss(model(x), x)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def batched(features, cells, steps):
    train_models(features, [p for p, _ in cells], [hidden_size(features, r) for _, r in cells],
                 list(range(len(cells))), steps=steps, desc=None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--features", type=int, default=512, help="ns (default 512)")
    parser.add_argument("--steps", type=int, default=100, help="Adam steps per model timed")
    parser.add_argument("--steps-to-converge", type=int, default=7000,
                        help="steps a model needs, for models per hour (default: the chapter's "
                             "ns=512 runs took 6,900-7,400)")
    args = parser.parse_args()
    densities, ratios = (0.01, 0.05, 0.2), (0.1, 0.25, 0.5)
    cells = [(p, r) for p in densities for r in ratios]
    print(f"ns = {args.features}, {len(cells)} models (p in {densities}, nd/ns in {ratios}), "
          f"{args.steps} Adam steps each, batch {BATCH}, {torch.get_num_threads()} threads")
    times = {"plain loop": [], "batched grid": []}
    for _ in range(2):
        for name, run in (("plain loop", plain_loop), ("batched grid", batched)):
            start = time.perf_counter()
            run(args.features, cells, args.steps)
            times[name].append(time.perf_counter() - start)
    base = min(times["plain loop"])
    for name, values in times.items():
        per_model_step = min(values) / (len(cells) * args.steps)
        per_hour = 3600 / (per_model_step * args.steps_to_converge)
        print(f"{name:>13}: {1e3 * per_model_step:6.2f} ms per model-step, "
              f"{per_hour:6.1f} models/hour, speed-up {base / min(values):.2f}")


if __name__ == "__main__":
    main()
