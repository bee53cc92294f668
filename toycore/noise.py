"""Noise added to the hidden layer: symmetric laws scaled to standard deviation σ.

What matters for the text's analysis (appendix C) is a law's excess kurtosis μ₄/σ⁴ − 3: negative
pushes encodings towards sparsity, zero (Gaussian) keeps the hidden space rotationally symmetric.
"""

import torch
from jaxtyping import Float
from torch import Tensor

from . import devices
from .checks import check_choice, check_per_instance, check_seeds, check_size
from .seeding import generator

#: the standardised fourth and sixth moments E ξ⁴/σ⁴ and E ξ⁶/σ⁶ of each law
STANDARD_MOMENTS = {
    "bipolar": (1.0, 1.0),
    "gaussian": (3.0, 15.0),
    "uniform": (9 / 5, 27 / 7),
    "laplace": (6.0, 90.0),
}
#: the excess kurtosis μ₄/σ⁴ − 3 of each law
EXCESS_KURTOSIS = {kind: fourth - 3 for kind, (fourth, _) in STANDARD_MOMENTS.items()}


def check_noise(kind):
    return check_choice("noise", kind, tuple(EXCESS_KURTOSIS))


def standard_noise(kind, shape, generator=None, dtype=torch.float32):
    """Draws of one law with mean 0 and variance 1, on the generator's device."""
    check_noise(kind)
    device = generator.device if generator is not None else None
    if kind == "gaussian":
        return torch.randn(shape, generator=generator, dtype=dtype, device=device)
    r = torch.rand(shape, generator=generator, dtype=dtype, device=device)  # in [0, 1)
    if kind == "uniform":
        return (2 * r - 1) * 3**0.5
    sign = torch.where(r < 0.5, -1.0, 1.0).to(dtype)
    if kind == "bipolar":
        return sign
    # Laplace: a random sign times Exp(1) = -log(1 - u), u in [0, 1) so never infinite;
    # Exp(1) has second moment 2
    u = torch.rand(shape, generator=generator, dtype=dtype, device=device)
    return sign * -torch.log1p(-u) / 2**0.5


class HiddenNoise:
    """A fresh noise vector ξ for every instance at every step: ``next() -> (instances, hidden)``.

    Each instance has its own stream (its seed, purpose "noise") and may have its own law and σ,
    so noise laws, σs and seeds train side by side. Draws come in chunks of ``chunk`` steps
    per instance: one generator call per instance per chunk, not per step. The generators and
    the draws live on ``device`` (default ``toycore.devices.current()``).
    """

    def __init__(self, seeds, hidden, kind, sigma, dtype=torch.float32, chunk=1024, device=None):
        self.seeds = check_seeds(seeds)
        self.hidden = check_size("hidden", hidden)
        kinds = [kind] * len(self.seeds) if isinstance(kind, str) else list(kind)
        if len(kinds) != len(self.seeds):
            raise ValueError(f"noise has {len(kinds)} laws for {len(self.seeds)} instances")
        self.kinds = [check_noise(k) for k in kinds]
        device = devices.current() if device is None else torch.device(device)
        self.sigma = check_per_instance("sigma", sigma, len(self.seeds), dtype).to(device)
        self.dtype, self.chunk = dtype, check_size("chunk", chunk)
        self.generators = [generator(seed, "noise", device) for seed in self.seeds]
        self._drawn, self._next = None, 0

    def next(self) -> Float[Tensor, "instances hidden"]:
        if self._drawn is None or self._next == self.chunk:
            draws = [
                standard_noise(k, (self.chunk, self.hidden), g, self.dtype)
                for k, g in zip(self.kinds, self.generators)
            ]
            # (chunk, instances, hidden), each instance's draws scaled by its σ
            self._drawn = torch.stack(draws, dim=1) * self.sigma[:, None]
            self._next = 0
        self._next += 1
        return self._drawn[self._next - 1]
