"""The checks every public function runs on its arguments before it does any work.

Each raises a ValueError that names the parameter, the range it must lie in and the value it
got, and returns the value in the form its caller computes with.
"""

import math
import numbers

import numpy as np
import torch


def check_size(name, value, minimum=1, maximum=None):
    """An integer (Python's or NumPy's) in [minimum, maximum], returned as an int."""
    integral = isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    if not integral or value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be an integer {bound}; got {value!r}")
    return int(value)


def check_seeds(seeds):
    """The seeds as a tuple of ints, one per instance."""
    seeds = tuple(seeds)
    if not seeds:
        raise ValueError("seeds must name at least one instance")
    return tuple(check_size("seeds", seed, minimum=0) for seed in seeds)


def _interval(low, high, low_open, high_open):
    if high == math.inf:
        return f"{'>' if low_open else '>='} {low:g}"
    if low == -math.inf:
        return f"{'<' if high_open else '<='} {high:g}"
    return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def check_range(name, value, low=-math.inf, high=math.inf, *, low_open=False, high_open=False):
    """A finite real number, or an array of them, between ``low`` and ``high`` (each end
    included unless ``*_open``); returned unchanged."""
    if torch.is_tensor(value):
        array = value.detach().cpu().numpy()
    else:
        try:
            array = np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            array = None
    inside = (
        array is not None
        and array.size > 0
        and bool(np.all(np.isfinite(array)))
        and bool(np.all(array > low if low_open else array >= low))
        and bool(np.all(array < high if high_open else array <= high))
    )
    if not inside:
        raise ValueError(
            f"{name} must be finite and {_interval(low, high, low_open, high_open)}; got {value!r}"
        )
    return value


def check_probability(name, values):
    """A number or a sequence of numbers in [0, 1], as a float64 tensor (0-d or 1-d)."""
    tensor = torch.as_tensor(values, dtype=torch.float64)
    if tensor.dim() > 1 or not torch.all((tensor >= 0) & (tensor <= 1)):
        raise ValueError(f"{name} must be a number or a list of numbers in [0, 1]; got {values!r}")
    return tensor


def check_per_instance(name, value, instances, dtype=torch.float32):
    """A setting per instance as (instances,): one number >= 0 for all, or one per instance."""
    tensor = torch.as_tensor(value, dtype=dtype)
    if tensor.dim() == 0:
        tensor = tensor.expand(instances)
    if tensor.shape != (instances,) or not torch.all(torch.isfinite(tensor) & (tensor >= 0)):
        raise ValueError(f"{name} must be a number >= 0 or {instances} such numbers; got {value!r}")
    return tensor.clone()


def check_choice(name, value, choices):
    """One of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")
    return value
