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


OUTPUTS = ("relu", "linear")


def check_importance(importance, instances, features, dtype=torch.float32):
    """Per-feature importance as (instances, features): None means all ones; one row (features,)
    is shared by every instance. Every value must be finite and > 0."""
    if importance is None:
        return torch.ones(instances, features, dtype=dtype)
    tensor = torch.as_tensor(importance, dtype=dtype)
    if tensor.dim() == 1:
        tensor = tensor.expand(instances, -1)
    if tensor.shape != (instances, features):
        raise ValueError(f"importance must have shape ({features},) or ({instances}, {features}); "
                         f"got {tuple(tensor.shape)}")
    if not torch.all(torch.isfinite(tensor) & (tensor > 0)):
        raise ValueError("importance values must be finite and > 0")
    return tensor.clone()


class ToyModel(nn.Module):
    """The toy model of superposition: x -> out(Wᵀ W x + b), out = ReLU (default) or identity.

    W: (instances, hidden, features), column W_i embeds feature i; b: (instances, features).
    The loss weights feature i's squared error by its importance I_i: (instances, features).
    Init as in Elhage et al.: Xavier-normal W, zero b.
    """

    def __init__(self, features, hidden, seeds, importance=None, output="relu", init_std=None,
                 dtype=torch.float32):
        super().__init__()
        self.seeds = check_seeds(seeds)
        self.features, self.hidden = check_size("features", features), check_size("hidden", hidden)
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {', '.join(OUTPUTS)}; got {output!r}")
        self.output = output
        self.register_buffer("importance", check_importance(importance, len(self.seeds), features,
                                                            dtype))
        std = _check_init_std(init_std if init_std is not None else (2 / (features + hidden)) ** 0.5)
        (W,) = _normal(self.seeds, [(hidden, features)], std, dtype)
        self.W = nn.Parameter(W)
        self.b = nn.Parameter(torch.zeros(len(self.seeds), features, dtype=dtype))

    def forward(self, x):
        return toy_output(self.W, self.b, x, self.output)

    def loss(self, x):
        """Mean over the batch of Σ_i I_i (x_i - y_i)^2: (instances,)."""
        return toy_sample_loss(self.W, self.b, self.importance, x, self.output).mean(-1)


def toy_output(W, b, x, output="relu"):
    """out(x Wᵀ W + b) for W (instances, hidden, features), b (instances, features) and
    x (instances, batch, features)."""
    # one matmul with Wᵀ W: for these small sizes it beats going through the hidden layer
    pre = torch.baddbmm(b[:, None, :], x, W.transpose(-1, -2) @ W)
    return torch.relu(pre) if output == "relu" else pre


def toy_sample_loss(W, b, importance, x, output="relu"):
    """Σ_i I_i (x_i - y_i)^2 for each sample: (instances, batch)."""
    return (importance[:, None, :] * (x - toy_output(W, b, x, output)).square()).sum(-1)
