"""Models with a leading instances dimension, so seeds and hyperparameter grids train as one batch.

Every model maps x of shape (instances, batch, features) to the same shape and has
``loss(x) -> (instances,)``: the mean over the batch of the squared error summed over features.
Summing that vector and calling backward gives each instance exactly the gradient it would get
if trained alone.
"""
import torch
from torch import nn

from .data import check_size
from .seeding import check_seeds, generator


def _normal(seeds, shapes, std, dtype):
    """N(0, std^2) tensors of the given shapes, drawn in order from each seed's init stream.

    Returns one stacked tensor per shape: (instances, *shape).
    """
    per_seed = []
    for seed in seeds:
        g = generator(seed, "init")
        per_seed.append([torch.randn(shape, generator=g, dtype=dtype) * std for shape in shapes])
    return [torch.stack(draws) for draws in zip(*per_seed)]


def _check_init_std(init_std):
    if not init_std > 0:
        raise ValueError(f"init_std must be > 0; got {init_std!r}")
    return float(init_std)


def reconstruction_loss(x, x_hat):
    """Mean over the batch of ||x - x_hat||^2: (instances,)."""
    return (x - x_hat).pow(2).sum(-1).mean(-1)


class LinearAutoencoder(nn.Module):
    """x -> A B x with untied A (features x hidden) and B (hidden x features), no biases.

    A: (instances, features, hidden) decodes; B: (instances, hidden, features) encodes.
    """

    def __init__(self, features, hidden, seeds, init_std=None, dtype=torch.float32):
        super().__init__()
        self.seeds = check_seeds(seeds)
        self.features, self.hidden = check_size("features", features), check_size("hidden", hidden)
        if hidden > features:
            raise ValueError(f"hidden must be <= features ({features}); got {hidden}")
        std = _check_init_std(init_std if init_std is not None else features**-0.5)
        A, B = _normal(self.seeds, [(features, hidden), (hidden, features)], std, dtype)
        self.A, self.B = nn.Parameter(A), nn.Parameter(B)

    def product(self):
        """The end-to-end matrix A B: (instances, features, features)."""
        return self.A @ self.B

    def forward(self, x):
        hidden = torch.einsum("ihf,ibf->ibh", self.B, x)
        return torch.einsum("ifh,ibh->ibf", self.A, hidden)

    def loss(self, x):
        return reconstruction_loss(x, self(x))


class TiedLinear(nn.Module):
    """x -> W^T W x with one W: (instances, hidden, features), i.e. A = W^T and B = W."""

    def __init__(self, features, hidden, seeds, init_std=None, dtype=torch.float32):
        super().__init__()
        self.seeds = check_seeds(seeds)
        self.features, self.hidden = check_size("features", features), check_size("hidden", hidden)
        if hidden > features:
            raise ValueError(f"hidden must be <= features ({features}); got {hidden}")
        std = _check_init_std(init_std if init_std is not None else features**-0.5)
        (W,) = _normal(self.seeds, [(hidden, features)], std, dtype)
        self.W = nn.Parameter(W)

    def product(self):
        """The end-to-end matrix W^T W: (instances, features, features)."""
        return self.W.transpose(-1, -2) @ self.W

    def forward(self, x):
        hidden = torch.einsum("ihf,ibf->ibh", self.W, x)
        return torch.einsum("ihf,ibh->ibf", self.W, hidden)

    def loss(self, x):
        return reconstruction_loss(x, self(x))
