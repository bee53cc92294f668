"""Seeds: one integer per instance, expanded into independent streams by purpose.

A model's initial weights and its data must not come from the same stream, so each use names
its purpose ("init", "data", ...) and gets its own generator derived from (seed, purpose).
"""

import zlib

import torch


def generator(seed, purpose, device="cpu"):
    """A torch generator for one instance and one purpose, the same on every run."""
    mixed = (seed * 1_000_003 + zlib.crc32(purpose.encode())) % (2**63 - 1)
    return torch.Generator(device=device).manual_seed(mixed)
