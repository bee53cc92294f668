"""Chapter 2 theory: the ReLU output model's loss, sparsity pattern by sparsity pattern.

For x_i = c_i u_i with c_i ~ Bernoulli(1 - S) and u_i ~ U[0, 1], conditioning on the set A of
active features gives the text's expansion

    L = Σ_k (1 - S)^k S^(n-k) L_k,   L_k = Σ_{|A| = k} ∫_{[0,1]^A} loss(x) dx,

so L_k sums over the C(n, k) patterns with k active features. L_0 and L_1 have closed forms:
L_0 = Σ_i I_i ReLU(b_i)^2 and L_1 is a sum of one-dimensional integrals of piecewise
quadratics, computed here exactly. Shapes: W (instances, hidden, features), b and importance
(instances, features).
"""

import math

import torch

from ..checks import check_probability, check_range, check_size
from ..data import sparse_moments
from ..seeding import generator


def pattern_weights(features, sparsity):
    """(1 - S)^k S^(n-k) for k = 0..n: the probability of one given pattern with k active features.

    sparsity: a number or (instances,); returns (instances, n + 1) or (n + 1,).
    """
    features = check_size("features", features)
    S = check_probability("sparsity", sparsity)[..., None]
    k = torch.arange(features + 1, dtype=torch.float64)
    return (1 - S) ** k * S ** (features - k)


def pattern_counts(features):
    """C(n, k) for k = 0..n: how many patterns have k active features."""
    features = check_size("features", features)
    return torch.tensor([math.comb(features, k) for k in range(features + 1)], dtype=torch.float64)


def two_or_more_active(features, sparsity):
    """The probability that two or more of the n features are active, 1 - S^n - n (1-S) S^(n-1):
    the patterns beyond L_0 and L_1."""
    at_most_one = (pattern_counts(features)[:2] * pattern_weights(features, sparsity)[..., :2]).sum(
        -1
    )
    return 1 - at_most_one


def zero_input_loss(b, importance):
    """L_0, the loss on x = 0: Σ_i I_i ReLU(b_i)^2, a penalty on positive biases. (instances,)"""
    return (importance * torch.relu(b).square()).sum(-1)


def _active_interval(a, c):
    """The part [lo, hi] of [0, 1] where a x + c > 0 (lo = hi where there is none)."""
    safe_a = torch.where(a == 0, torch.ones_like(a), a)
    root = (-c / safe_a).clamp(0, 1)
    lo = torch.where(a > 0, root, torch.zeros_like(a))
    hi = torch.where(a < 0, root, torch.ones_like(a))
    # a = 0: active on all of [0, 1] if c > 0, nowhere otherwise
    hi = torch.where((a == 0) & (c <= 0), lo, hi)
    return lo, hi


def relu_square_integral(a, c):
    """∫_0^1 ReLU(a x + c)^2 dx, elementwise and exact."""
    lo, hi = _active_interval(a, c)
    return a.square() * (hi**3 - lo**3) / 3 + a * c * (hi**2 - lo**2) + c.square() * (hi - lo)


def relu_moment_integral(a, c):
    """∫_0^1 x ReLU(a x + c) dx, elementwise and exact."""
    lo, hi = _active_interval(a, c)
    return a * (hi**3 - lo**3) / 3 + c * (hi**2 - lo**2) / 2


def linear_square_integral(a, c):
    """∫_0^1 (a x + c)^2 dx: ``relu_square_integral`` without the ReLU."""
    return a.square() / 3 + a * c + c.square()


def linear_moment_integral(a, c):
    """∫_0^1 x (a x + c) dx: ``relu_moment_integral`` without the ReLU."""
    return a / 3 + c / 2


def one_sparse_terms(W, b, importance, relu=True):
    """The two parts of L_1, each integrated over the active feature's value x_i ∈ [0, 1].

    benefit (instances, features): I_i ∫ (x_i - ReLU(|W_i|^2 x_i + b_i))^2, the loss on the
    feature itself; interference (instances, i, j): I_j ∫ ReLU(W_j·W_i x_i + b_j)^2 for j ≠ i
    (zero on the diagonal), what feature i's activity costs output j. L_1 = benefit.sum() +
    interference.sum(). relu=False: the same terms for a linear output with the same W and b.
    """
    square, moment = (
        (relu_square_integral, relu_moment_integral)
        if relu
        else (linear_square_integral, linear_moment_integral)
    )
    gram = W.transpose(-1, -2) @ W
    norms = torch.diagonal(gram, dim1=-2, dim2=-1)
    benefit = importance * (1 / 3 - 2 * moment(norms, b) + square(norms, b))
    interference = importance[:, None, :] * square(gram, b[:, None, :])
    return benefit, _off_diagonal(interference)


def one_sparse_at_one(W, b, importance, relu=True, bias=True):
    """L_1's integrand at x_i = 1: benefit I_i (1 - ReLU(|W_i|^2 + b_i))^2 and interference
    I_j ReLU(W_j·W_i + b_j)^2, shaped as in ``one_sparse_terms``.

    relu=False or bias=False give what the same W would pay without the ReLU (linear output) or
    without the bias: the comparisons behind "ReLU never makes things worse" and "negative
    interference is free".
    """
    gram = W.transpose(-1, -2) @ W
    norms = torch.diagonal(gram, dim1=-2, dim2=-1)
    activation = torch.relu if relu else (lambda pre: pre)
    benefit = importance * (1 - activation(norms + (b if bias else 0))).square()
    pre = gram + (b[:, None, :] if bias else 0)
    interference = importance[:, None, :] * activation(pre).square()
    return benefit, _off_diagonal(interference)


def _off_diagonal(pairs):
    eye = torch.eye(pairs.shape[-1], dtype=torch.bool, device=pairs.device)
    return pairs.masked_fill(eye, 0.0)


def linear_optimum(importance, hidden, sparsity):
    """The lowest loss of the linear model x -> Wᵀ W x + b with m = ``hidden``.

    Features are independent with equal variance, so the importance-weighted covariance is
    diagonal: the best rank-m symmetric Wᵀ W projects onto the m most important features, the
    bias supplies the others' means, and the loss is Var(x_i) times the importance left out.
    """
    importance = torch.as_tensor(
        check_range("importance", importance, 0, low_open=True), dtype=torch.float64
    )
    check_size("hidden", hidden, maximum=importance.shape[-1])
    left_out = torch.sort(importance, descending=True)[0]
    return sparse_moments(sparsity)["variance"] * left_out[..., hidden:].sum(-1)


def linear_terms(W, importance):
    """The text's expansion of the linear model x -> Wᵀ W x, and the terms its "~" leaves out.

    With R = 1 - Wᵀ W, output j's error is Σ_i R_ji x_i. Its square holds the squares
    R_ji^2 x_i^2, which sum to the text's Σ_i I_i (1 - |W_i|^2)^2 + Σ_{i≠j} I_j (W_j·W_i)^2
    = Σ_j I_j Σ_i R_ji^2, and the cross terms R_ji R_jk x_i x_k (i ≠ k), which sum to
    Σ_j I_j ((Σ_i R_ji)^2 - Σ_i R_ji^2). Returns (expansion, cross), each (instances,).
    """
    residual_map = torch.eye(W.shape[-1], dtype=W.dtype, device=W.device) - W.transpose(-1, -2) @ W
    squares = residual_map.square().sum(-1)
    expansion = (importance * squares).sum(-1)
    cross = (importance * (residual_map.sum(-1).square() - squares)).sum(-1)
    return expansion, cross


def best_linear_bias(W, sparsity):
    """The bias that minimises the linear model's loss for this W: b_j = E[x_i] Σ_i R_ji with
    R = 1 - Wᵀ W, which cancels the error's mean. (instances, features)"""
    moments = sparse_moments(torch.as_tensor(sparsity, dtype=W.dtype, device=W.device)[..., None])
    residual_map = torch.eye(W.shape[-1], dtype=W.dtype, device=W.device) - W.transpose(-1, -2) @ W
    return moments["mean"] * residual_map.sum(-1)


def linear_loss_by_expansion(W, importance, sparsity, best_bias=False):
    """The linear model's exact loss written with the text's expansion: (instances,).

    The features are independent, so E[x_i x_k] = E[x_i^2] for i = k and E[x_i]^2 otherwise:
    with b = 0, L = E[x_i^2] × expansion + E[x_i]^2 × cross terms. With the best bias the
    error has mean zero and L = Var(x_i) × expansion: only then is L proportional to the
    expansion, and only for features with mean zero does b = 0 give that too.
    """
    moments = sparse_moments(torch.as_tensor(sparsity, dtype=W.dtype, device=W.device))
    expansion, cross = linear_terms(W, importance)
    if best_bias:
        return moments["variance"] * expansion
    return moments["square"] * expansion + moments["mean"] ** 2 * cross


def linear_loss(W, b, importance, sparsity):
    """The exact loss of the linear model x -> Wᵀ W x + b on the sparse data: (instances,).

    The residual r = (1 - Wᵀ W) x - b has mean ((1 - Wᵀ W) 1) E x_i - b and, the features being
    independent, variance Var(x_i) Σ_k (1 - Wᵀ W)_ik^2; L = Σ_i I_i (Var r_i + (E r_i)^2).
    """
    moments = sparse_moments(torch.as_tensor(sparsity, dtype=W.dtype, device=W.device)[..., None])
    residual_map = torch.eye(W.shape[-1], dtype=W.dtype, device=W.device) - W.transpose(-1, -2) @ W
    mean = residual_map.sum(-1) * moments["mean"] - b
    variance = moments["variance"] * residual_map.square().sum(-1)
    return (importance * (variance + mean.square())).sum(-1)


def packing_energy(directions):
    """Σ_{i≠j} ReLU(u_i · u_j)^2 for the unit vectors u_i = directions[..., i, :] / |...|.

    With uniform importance, unit norms and b = 0 this is L_1's interference term at x_i = 1:
    points on the sphere S^(m-1) with a Thomson-like energy that ignores negative overlaps.
    directions: (..., count, hidden); returns (...).
    """
    units = directions / directions.norm(dim=-1, keepdim=True)
    gram = units @ units.transpose(-1, -2)
    return _off_diagonal(torch.relu(gram).square()).sum((-1, -2))


def minimize_packing_energy(count, hidden, restarts, steps=2000, lr=0.05, seed=0):
    """Minimise ``packing_energy`` over ``count`` points on S^(hidden-1) from ``restarts`` random
    starts at once (Adam on unnormalised vectors, whose energy depends only on directions).

    Returns the final energies, sorted (restarts,), and the best configuration (count, hidden).
    """
    g = generator(seed, "packing")
    points = torch.randn(restarts, count, hidden, generator=g, dtype=torch.float64)
    points.requires_grad_(True)
    optim = torch.optim.Adam([points], lr=lr)
    for _ in range(steps):
        optim.zero_grad()
        packing_energy(points).sum().backward()
        optim.step()
        with torch.no_grad():  # keep the points on the sphere so the step size stays meaningful
            points /= points.norm(dim=-1, keepdim=True)
    with torch.no_grad():
        energies = packing_energy(points)
    order = torch.argsort(energies)
    return energies[order], points.detach()[order[0]]
