"""Synthetic data sets, batched over instances: shapes are (instances, batch, features)."""

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from . import devices
from .checks import check_probability, check_range, check_seeds, check_size
from .seeding import generator


def sparse_moments(sparsity):
    """Moments of one feature x_i = c_i u_i, c ~ Bernoulli(1-S), u ~ U[0,1]: E x_i, E x_i^2,
    E x_i^4, Var x_i, and E x_i x_j for i != j (features are independent). Works on arrays."""
    density = 1 - check_range("sparsity", sparsity, 0, 1)
    return {
        "mean": density / 2,
        "square": density / 3,
        "fourth": density / 5,
        "variance": density / 3 - density**2 / 4,
        "cross": density**2 / 4,
    }


class SparseUniform:
    """x_i = c_i u_i with c_i ~ Bernoulli(1 - S) and u_i ~ U[0, 1], independently per feature.

    One stream per instance (from its seed), so an instance's data does not depend on which other
    instances share the batch. ``sparsity`` is one S for all instances or one per instance.
    ``purpose`` names the stream: evaluation data must not replay the training batches.
    ``prefetch``: batches drawn per instance at a time, so that a training loop makes one
    generator call per instance every ``prefetch`` steps instead of every step (each instance
    still gets its own stream's batches in order; on the CPU the numbers do not depend on it).
    Tensors live on ``device`` (default: ``toycore.devices.current()``).
    """

    def __init__(
        self,
        seeds,
        features,
        sparsity,
        device=None,
        dtype=torch.float32,
        purpose="data",
        prefetch=1,
    ):
        self.seeds = check_seeds(seeds)
        self.features = check_size("features", features)
        sparsity = check_probability("sparsity", sparsity)
        if sparsity.dim() == 1 and len(sparsity) != len(self.seeds):
            raise ValueError(f"sparsity has {len(sparsity)} values for {len(self.seeds)} instances")
        self.prefetch = check_size("prefetch", prefetch)
        self.device = devices.current() if device is None else torch.device(device)
        self.density = (1 - sparsity).expand(len(self.seeds)).to(device=self.device, dtype=dtype)
        # the same as floats (exactly the dtype's values), for threshold_ without a device sync
        self.density_values = self.density.tolist()
        self.dtype = dtype
        self.generators = [generator(seed, purpose, self.device) for seed in self.seeds]
        self._stock = [None] * len(self.seeds)  # per instance: (prefetch, batch, features)
        self._left = [0] * len(self.seeds)  # batches of its stock an instance has not had

    def sample(self, batch, instances=None) -> Float[Tensor, "instances batch features"]:
        """A fresh batch, shape (instances, batch, features); ``instances``: the indices of the
        instances to draw for (default all), the others' streams stay where they are."""
        check_size("batch", batch)
        chosen = range(len(self.seeds)) if instances is None else [int(i) for i in instances]
        for i in chosen:
            stock = self._stock[i]
            if not self._left[i] or stock.shape[1] != batch:  # (a new batch size: a new stock)
                # one uniform r per entry: r < density marks it active, and given that, r / density
                # is again U[0, 1]; half the random numbers of drawing c and u separately
                r = torch.rand(
                    (self.prefetch, batch, self.features),
                    generator=self.generators[i],
                    device=self.device,
                    dtype=self.dtype,
                )
                if self.density_values[i] == 0:  # S = 1: all zeros (r / 0 would be NaN)
                    self._stock[i] = r.zero_()
                else:  # bit for bit torch.where(r < density, r / density, 0), in place:
                    # threshold_ replaces what is <= its bound, so it acts on -r and writes -0.0,
                    # which negates back to 0.0; on a CPU 3 to 13 times faster than masked_fill_
                    # with a boolean mask of r >= d
                    F.threshold_(r.neg_(), -self.density_values[i], -0.0).neg_()
                    self._stock[i] = r.div_(self.density[i])
                self._left[i] = self.prefetch
        batches = [self._stock[i][self.prefetch - self._left[i]] for i in chosen]
        for i in chosen:
            self._left[i] -= 1
        # Later draws never change a batch handed out: each refill makes a new stock. One
        # instance's batch is a view of it; several are stacked (a copy) into one tensor.
        return batches[0].unsqueeze(0) if len(batches) == 1 else torch.stack(batches)

    def state(self):
        """Where each instance's stream stands, on the host: its generator's state and the
        batches of its stock not yet handed out ((left, batch, features), or None), for
        ``restore``."""
        return [
            (
                generator.get_state().numpy(),
                self._stock[i][self.prefetch - self._left[i] :].cpu().numpy()
                if self._left[i]
                else None,
            )
            for i, generator in enumerate(self.generators)
        ]

    def restore(self, state):
        """Put each instance's stream where ``state()`` of a stream with the same seeds,
        purpose, features, sparsity and prefetch found it: the batches that stream would have
        handed out next come next here."""
        if len(state) != len(self.seeds):
            raise ValueError(f"a state of {len(state)} streams for {len(self.seeds)} instances")
        for i, (generator_state, left) in enumerate(state):
            if left is not None and (len(left) > self.prefetch or left.shape[-1] != self.features):
                raise ValueError(
                    f"stream {i}'s state holds {len(left)} batches of {left.shape[-1]} "
                    f"features; this stream prefetches {self.prefetch} of {self.features}"
                )
        for i, (generator_state, left) in enumerate(state):
            self.generators[i].set_state(torch.as_tensor(generator_state))
            if left is None:
                self._stock[i], self._left[i] = None, 0
            else:  # the stock's last batches, where ``sample`` reads them
                stock = torch.empty(
                    (self.prefetch, *left.shape[1:]), device=self.device, dtype=self.dtype
                )
                stock[self.prefetch - len(left) :] = torch.as_tensor(left)
                self._stock[i], self._left[i] = stock, len(left)


def prefetch_for(instances, batch, features, device=None):
    """A ``prefetch`` for SparseUniform that keeps the stock of all instances within a budget of
    numbers: many steps per generator call for small models, one for large ones, whose step
    costs far more than the call. On a GPU the budget is 2^24 (64 MB of float32); on a CPU 2^21:
    a larger stock falls out of the caches, and a single ns = 2048 model drew its batches 1.8
    times slower with 8 batches in stock than with one."""
    device = devices.current() if device is None else torch.device(device)
    budget = 2**24 if device.type == "cuda" else 2**21
    return max(1, budget // (instances * batch * features))


def basis_vectors(
    instances, features, device=None, dtype=torch.float32
) -> Float[Tensor, "instances features features"]:
    """The data set of all one-hot vectors e_1..e_n for each instance:
    (instances, features, features)."""
    check_size("instances", instances)
    check_size("features", features)
    eye = torch.eye(features, device=devices.current() if device is None else device, dtype=dtype)
    return eye.expand(instances, features, features).clone()
