"""Chapter 3 theory: incidental polysemanticity from l1 regularisation (Lecomte et al.).

The model is tied, y = ReLU(W Wᵀ x), trained on the n basis vectors; W is (..., features,
hidden) and row W_i encodes feature i. Its loss is a function of G = W Wᵀ and |W|_1 (see
``toycore.models.TiedBasisAutoencoder``). This module holds the text's exact solutions, its
sparsification law, the collision count n²/(4m) and the Appendix B bounds; the simulations that
check them live in ``toycore.experiments.polysemantic``.
"""

import math

import numpy as np
import torch
from scipy import special

from ..checks import check_range, check_size
from ..models import tied_basis_reconstruction

POLYSEMANTIC_RANGE = (0.8, 1.2)  # |W_ik| in this range: neuron k represents feature i


def _check_shape(features, hidden, even=False):
    check_size("features", features)
    check_size("hidden", hidden)
    if hidden < features:
        raise ValueError(f"hidden must be >= features ({features}); got {hidden}")
    if even and features % 2:
        raise ValueError(f"features must be even to pair them up; got {features}")


def monosemantic(features, hidden):
    """W_i = f_i: neuron i represents feature i alone. (features, hidden)."""
    _check_shape(features, hidden)
    return torch.eye(features, hidden, dtype=torch.float64)


def paired(features, hidden, sign=-1):
    """W_{2i-1} = f_i and W_{2i} = sign f_i: two features per neuron. sign -1 is the text's
    polysemantic solution (opposite signs); sign +1 the same-sign pair. (features, hidden)."""
    _check_shape(features, hidden, even=True)
    if sign not in (-1, 1):
        raise ValueError(f"sign must be -1 or +1; got {sign!r}")
    W = torch.zeros(features, hidden, dtype=torch.float64)
    pairs = torch.arange(features // 2)
    W[2 * pairs, pairs] = 1.0
    W[2 * pairs + 1, pairs] = float(sign)
    return W


def reconstruction_loss(W):
    """Σ_i (1 - |W_i|²)² + Σ_{i≠j} ReLU(W_i·W_j)², the loss without its l1 term: (...)."""
    W = torch.as_tensor(W)
    return tied_basis_reconstruction(W @ W.transpose(-1, -2))


def representing(W, bounds=POLYSEMANTIC_RANGE):
    """Which neurons represent which features: |W_ik| in [0.8, 1.2].
    bool (..., features, hidden)."""
    magnitude = torch.as_tensor(W).abs()
    return (magnitude >= bounds[0]) & (magnitude <= bounds[1])


def polysemantic_neurons(W, bounds=POLYSEMANTIC_RANGE):
    """Neurons representing two or more features (the authors' criterion): bool (..., hidden)."""
    return representing(W, bounds).sum(-2) >= 2


def crowded_neurons(W, bounds=POLYSEMANTIC_RANGE):
    """Neurons representing three or more features, which no zero-loss solution has: two of
    three weights on one neuron share a sign, so their features interfere. bool (..., hidden)."""
    return representing(W, bounds).sum(-2) >= 3


def count_polysemantic(W, bounds=POLYSEMANTIC_RANGE):
    """How many polysemantic neurons each W has: (...)."""
    return polysemantic_neurons(W, bounds).sum(-1)


def expected_polysemantic(features, hidden):
    """The text's estimate C(n, 2) / (2m) ~ n² / (4m) of the number of polysemantic neurons,
    from the chance 1/(2m) that two features' largest coordinates collide with opposite signs."""
    _check_shape(features, hidden)
    return math.comb(features, 2) / (2 * hidden)


def sparsification_law(t, hidden, l1):
    """The three-phase law with the constants set to 1, as in the text's Figure 2:
    |w|_1 = max(1 / (1/√m + λt), 1) and m' = |w|_1². Returns (l1_norm, nonzero) like t."""
    check_range("t", t, 0)
    check_size("hidden", hidden)
    check_range("l1", l1, 0)
    l1_norm = np.maximum(1 / (hidden**-0.5 + l1 * np.asarray(t, dtype=float)), 1.0)
    return l1_norm, l1_norm**2


def threshold(squared_norm, l1, gradient_constant=4.0):
    """θ_i = λ / (c (1 - |W_i|²)) from |W_i|²: coordinates above it grow, below it shrink,
    ignoring interference. c = 4 for the loss as written (∂L/∂W = 4(...) + λ sign W); the text
    drops the 4, which is c = 1, as does its one-encoding ODE. inf where |W_i| >= 1."""
    check_range("l1", l1, 0)
    check_range("gradient_constant", gradient_constant, 0, low_open=True)
    slack = 1 - torch.as_tensor(squared_norm)
    return torch.where(slack > 0, l1 / (gradient_constant * slack), torch.inf)


def relative_variance(values, axis=-1):
    """Var[X] / E[X]² over ``axis``: the quantity Appendix B needs to stay Θ(1)."""
    values = np.asarray(values, dtype=float)
    return values.var(axis=axis) / values.mean(axis=axis) ** 2


def relative_variance_bounds(initial):
    """Appendix B's bounds on the relative variance of the survivors, for every m'.

    With the weights sorted in decreasing order, the survivors at any time are the m' largest
    initial weights moved by one affine map; their relative variance lies between that of
    w_1..w_m' shifted down by w_(m'+1) (lower) and by w_m' (upper). ``initial``: (m,) positive
    weights. Returns (lower, upper), each (m,), indexed by m' - 1; lower[m-1] uses a shift of 0.
    """
    w = np.sort(np.asarray(initial, dtype=float))[::-1]
    count = np.arange(1, len(w) + 1)
    mean = np.cumsum(w) / count
    variance = np.maximum(np.cumsum(w**2) / count - mean**2, 0.0)
    next_weight = np.append(w[1:], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lower = variance / (mean - next_weight) ** 2
        upper = variance / (mean - w) ** 2
    return lower, upper


def regular_percentiles(hidden, std):
    """The idealised initialisation of Figure 7: the m quantiles of |N(0, std²)| at the
    regular percentiles (k - 1/2)/m, in decreasing order."""
    check_size("hidden", hidden)
    check_range("std", std, 0, low_open=True)
    levels = 1 - (np.arange(hidden) + 0.5) / hidden
    return std * np.sqrt(2) * special.erfinv(levels)
