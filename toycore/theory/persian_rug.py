"""Chapter 5: the Persian rug (Cowsik, Dolev and Infanger).

Notation of the text: ns sparse features, nd dense (hidden) dimensions, ratio r = nd/ns, each
feature on with probability p and then uniform on [0, 1]. W = W_out W_in is (ns, ns); output i
is ReLU(a (x_i + ν_i) + b) where a is the diagonal and ν_i = a⁻¹ Σ_{j≠i} W_ij x_j the interference.
All losses here are per feature (the mean over features, as the authors' code trains).
"""

import numpy as np
import torch
from scipy import integrate, optimize
from scipy.special import ndtr

from ..checks import check_range, check_size
from ..data import sparse_moments
from ..seeding import generator

# Gauss-Legendre nodes on [0, 1] for integrals over u: the integrands bend on the scale σ, and
# σ >= 0.009 over the text's range (p >= 0.001, r <= 0.8), far above the 5e-4 node spacing.
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(2000)
U_NODES, U_WEIGHTS = (_NODES + 1) / 2, _WEIGHTS / 2


def check_density(p):
    """p, each feature's chance of being on: a number or an array in (0, 1]."""
    return check_range("p", p, 0, 1, low_open=True)


def check_ratio(ratio):
    """nd/ns: a number or an array in (0, 1]."""
    return check_range("the ratio nd/ns", ratio, 0, 1, low_open=True)


def check_sigma(sigma):
    """σ, the interference's standard deviation: > 0 (the Gaussian needs a width)."""
    return check_range("sigma", sigma, 0, low_open=True)


def feature_variance(p):
    """Var x_i = p/3 - p²/4."""
    return sparse_moments(1 - check_density(p))["variance"]


# --- the construction (section 4.2.2) -------------------------------------------------------


def hadamard(n, rows=None):
    """The Sylvester Hadamard matrix H_ij = (-1)^popcount(i AND j), n a power of 2; with
    ``rows``, only those rows (len(rows), n)."""
    check_size("n", n)
    if n & (n - 1):
        raise ValueError(f"a Sylvester Hadamard matrix needs n a power of 2; got {n}")
    columns = np.arange(n)
    rows = columns if rows is None else np.asarray(rows)
    parity = np.bitwise_count(np.bitwise_and.outer(rows, columns)) & 1
    return 1 - 2 * parity.astype(float)


def persian_rug(features, hidden, seed=0):
    """The Persian rug weights: W_in = H[S] (nd, ns) for a random set S of nd rows of the
    Hadamard matrix, W_out = W_inᵀ / nd, so R = W_out W_in = nd⁻¹ Σ_{k∈S} H_ik H_kj.
    Returns (W_in, W_out, S)."""
    check_size("features", features)
    check_size("hidden", hidden, maximum=features)
    g = generator(seed, "rug")
    rows = np.sort(torch.randperm(features, generator=g)[:hidden].numpy())
    W_in = hadamard(features, rows)
    return W_in, W_in.T / hidden, rows


def rug_deviations(R, hidden):
    """How far R (ns, ns) is from what section 4.2.2 says of the rug W_out W_in: the largest
    |R_ii - 1|, |R_ij - R_ji|, |Q² - Q| for Q = (nd/ns) R, and |R_ij - R_0,(i XOR j)|; and R's
    rank, which should be nd = ``hidden``."""
    i, j = np.indices(R.shape)
    Q = R * hidden / R.shape[-1]
    return {
        "diagonal": np.abs(np.diag(R) - 1).max(),
        "symmetry": np.abs(R - R.T).max(),
        "projector": np.abs(Q @ Q - Q).max(),
        "xor": np.abs(R - R[0, np.bitwise_xor(i, j)]).max(),
        "rank": int(np.linalg.matrix_rank(R)),
    }


# --- the bound (section 4.2.1, appendix C) ---------------------------------------------------


def variance_bound(p, ratio):
    """The text's eq. 6: the mean interference variance of any W of rank nd with unit diagonal
    is at least (4p - 3p²)/12 (ns/nd - 1)."""
    p, ratio = check_density(p), check_ratio(ratio)
    return (4 * p - 3 * p**2) / 12 * (1 / ratio - 1)


# --- where the text's analysis applies ---------------------------------------------------------

# The text's analysis replaces each output's interference, a sum over the other ns - 1 features,
# by a Gaussian. We call a size inside its regime when that sum, with equal weights, has an excess
# kurtosis of at most 0.05 in size: a Gaussian's is 0, and a sum whose fourth moment is more than
# 5% off a Gaussian's is not yet "a sum of many small terms".
REGIME_KURTOSIS = 0.05


def interference_kurtosis(p, features):
    """The excess kurtosis of Σ_{j≠i} x_j over the ns - 1 other features (independent, equal
    weights): κ(x) / (ns - 1), with κ(x) = μ₄ / σ⁴ - 3 the excess kurtosis of one feature
    x = c u (central moments in closed form). About 9 / (5 p ns) at small p."""
    p = check_density(p)
    features = np.asarray(features)
    if np.any(features < 2):
        raise ValueError(f"features must be at least 2 (an output needs others); got {features}")
    fourth = p / 5 - p**2 / 2 + p**3 / 2 - 3 * p**4 / 16  # E (x - p/2)^4
    return (fourth / feature_variance(p) ** 2 - 3) / (features - 1)


def in_regime(p, features):
    """Whether (p, ns) lies in the text's regime (see REGIME_KURTOSIS): elementwise."""
    return np.abs(interference_kurtosis(p, features)) <= REGIME_KURTOSIS


def regime_size(p):
    """The smallest ns in the text's regime at density p."""
    one = abs(interference_kurtosis(p, 2))  # one feature's excess kurtosis
    return max(2, int(np.ceil(one / REGIME_KURTOSIS)) + 1)


def interference_variances(W, p):
    """Var ν_i for every row of W (..., ns, ns) scaled to unit diagonal:
    Var x · Σ_{j≠i} (W_ij / W_ii)²."""
    check_density(p)
    diagonal = np.diagonal(W, axis1=-2, axis2=-1)
    normalised = W / diagonal[..., :, None]
    off = (normalised**2).sum(-1) - 1
    return feature_variance(p) * off


def interference_means(W, p):
    """E ν_i = Σ_{j≠i} W_ij E x_j for every row of W (..., ns, ns), E x_j = p/2: the push that
    output i receives from the other features on average, which adds to its bias."""
    check_density(p)
    off = W.sum(-1) - np.diagonal(W, axis1=-2, axis2=-1)
    return off * p / 2


# --- statistics of a trained W (figures 4 to 7) ----------------------------------------------


# Rows of W that ``_off_diagonal_powers`` takes at a time: a few MB in float64, so that each
# block's temporaries stay in cache instead of four fresh arrays the size of a whole grid (the
# grids' 168 models at ns = 2048 are 700 million entries; allocating those took most of the time).
ROWS_AT_A_TIME = 256


def _off_diagonal_powers(W):
    """Σ_{j≠i} W_ij² and Σ_{j≠i} |W_ij|³ of every row i of W (..., ns, ns), in float64: (..., ns)
    each."""
    features = W.shape[-1]
    rows = W.reshape(-1, features)  # (models · ns, ns); row k's diagonal is column k mod ns
    squares, cubes = np.empty(len(rows)), np.empty(len(rows))
    for start in range(0, len(rows), ROWS_AT_A_TIME):
        block = rows[start : start + ROWS_AT_A_TIME].astype(float)
        taken = np.arange(start, start + len(block))
        block[taken - start, taken % features] = 0  # the interference terms j ≠ i
        terms = block * block
        squares[taken] = terms.sum(-1)
        cubes[taken] = np.vecdot(np.abs(block), terms)  # |W_ij| · W_ij²: no float power
    return squares.reshape(W.shape[:-1]), cubes.reshape(W.shape[:-1])


def symmetry_statistics(W, b, p):
    """The four measures of statistical permutation symmetry for W (..., ns, ns), b (..., ns):
    the variance of the diagonal (fig. 4), of the bias (fig. 5), over rows of the off-diagonal
    interference variance Var x Σ_{j≠i} W_ij² (fig. 6), and the worst row's Lyapunov ratio
    Λ = max_i Σ_{j≠i} |W_ij|³ / (Σ_{j≠i} W_ij²)^{3/2} (eq. 3, fig. 7)."""
    check_density(p)
    W = np.asarray(W)
    diagonal = np.diagonal(W, axis1=-2, axis2=-1)
    squares, cubes = _off_diagonal_powers(W)  # (..., ns) each
    lyapunov = cubes / squares**1.5
    return {
        "diagonal": diagonal.var(-1),
        "bias": b.var(-1),
        "row_variance": (feature_variance(p) * squares).var(-1),
        "lyapunov": lyapunov.max(-1),
    }


def row_interference_spread(W):
    """Figure 6's caption, "all noise variables have identical variances", read on each model:
    the standard deviation over rows of Var ν_i ∝ Σ_{j≠i} W_ij², over its mean (the factor
    Var x and the diagonal's a⁻² cancel). W: (models, ns, ns) -> (models,)."""
    squares, _ = _off_diagonal_powers(np.asarray(W))  # (models, ns)
    return squares.std(-1) / squares.mean(-1)


# --- the macroscopic loss (section 4.1) ------------------------------------------------------


def relu_moments(mean, sd):
    """E ReLU(Z) and E ReLU(Z)² for Z ~ N(mean, sd²), sd > 0, elementwise."""
    t = mean / sd
    cdf, pdf = ndtr(t), np.exp(-(t**2) / 2) / np.sqrt(2 * np.pi)
    return mean * cdf + sd * pdf, (mean**2 + sd**2) * cdf + mean * sd * pdf


def macroscopic_loss(a, b, sigma, p):
    """L(a, b, σ) = (1-p) E ReLU(aν + b)² + p E (u - ReLU(a(u + ν) + b))², ν ~ N(0, σ²), u ~ U[0,1]:
    Gaussian moments in closed form, the u integral by 2000-point Gauss-Legendre quadrature."""
    if check_range("a", a) == 0:
        raise ValueError("a must be nonzero: at a = 0 the output ignores its input")
    check_range("b", b)
    check_sigma(sigma)
    check_density(p)
    return _macroscopic_loss(a, b, sigma, p)


def _macroscopic_loss(a, b, sigma, p):
    off, on = _macroscopic_parts(a, b, sigma)
    return (1 - p) * off + p * on


def macroscopic_parts(a, b, sigma):
    """The two parts of section 4.1's loss, L = (1-p) L_off + p L_on: (L_off, L_on) with
    L_off = E ReLU(aν + b)² (the feature is off) and L_on = E (u - ReLU(a(u + ν) + b))² (on)."""
    if check_range("a", a) == 0:
        raise ValueError("a must be nonzero: at a = 0 the output ignores its input")
    check_range("b", b)
    check_sigma(sigma)
    return _macroscopic_parts(a, b, sigma)


def _macroscopic_parts(a, b, sigma):
    """Elementwise over arrays a, b, σ (broadcast), the u integral along a last axis."""
    # the loss depends on a only through a·σ and a·u, and the text takes a > 0
    a, b = np.abs(np.asarray(a, float)), np.asarray(b, float)
    spread = a * np.asarray(sigma, float)
    _, off = relu_moments(b, spread)
    first, second = relu_moments(a[..., None] * U_NODES + b[..., None], spread[..., None])
    on = (U_NODES**2 - 2 * U_NODES * first + second) @ U_WEIGHTS
    return off, on


def macroscopic_cut(a, b, sigma):
    """The part of L_on where the ReLU cuts the active feature to zero, E u² 1(a(u + ν) + b < 0),
    ν ~ N(0, σ²), u ~ U[0,1] (appendix B's E_r, at any a > 0 and b): Φ in closed form, the u
    integral by quadrature."""
    check_range("a", a, 0, low_open=True)
    check_range("b", b)
    check_sigma(sigma)
    return float(U_WEIGHTS @ (U_NODES**2 * ndtr(-(U_NODES + b / a) / sigma)))


def rug_error_kinds(p, ratio):
    """Section 5.2.1's two kinds of error, for the rug (ns -> ∞) at its optimal a and b: the
    loss of the ReLU's wrong decisions, (1-p) L_off + p L_cut (noise passed where the feature
    is off; an active feature cut to zero, appendix B's E_r), and the loss on the values it
    passes, p (L_on - L_cut) (appendix B's E_ν): (decisions, values)."""
    off, on, cut = rug_parts(p, ratio)
    return float((1 - p) * off + p * cut), float(p * (on - cut))


def rug_parts(p, ratio):
    """The rug's (ns -> ∞) L_off, L_on and the part of L_on where the ReLU cuts an active
    feature, L_cut, at its optimal a and b."""
    _, a, b = rug_loss(p, ratio)
    sigma = np.sqrt(variance_bound(p, ratio))
    off, on = _macroscopic_parts(a, b, sigma)
    return float(off), float(on), macroscopic_cut(a, b, sigma)


def output_losses(a, b, sigma, p, chunk=256):
    """``macroscopic_loss`` of many outputs at once, elementwise over arrays a (nonzero), b,
    σ (> 0) and p of one shape, a chunk of outputs at a time (each integral holds 2000 nodes).
    For trained models' own statistics, which the caller has checked."""
    # 256 outputs keep each (chunk, nodes) temporary in cache: 6.7x faster than 4096 on one
    # core (6144 outputs, bitwise the same results)
    a, b, sigma, p = (np.asarray(v, float).ravel() for v in np.broadcast_arrays(a, b, sigma, p))
    out = np.empty_like(a)
    for start in range(0, a.size, chunk):
        part = slice(start, start + chunk)
        out[part] = _macroscopic_loss(a[part], b[part], sigma[part], p[part])
    return out


def optimal_macroscopic(p, sigma):
    """min over a, b of L(a, b, σ): (loss, a, b). Nelder-Mead from a few starts."""
    check_density(p)
    check_sigma(sigma)
    best = None
    for a0, b0 in [(1.0, -2 * sigma), (1.0, 0.0), (0.5, -sigma), (1.5, -3 * sigma)]:
        result = optimize.minimize(
            lambda ab: _macroscopic_loss(ab[0], ab[1], sigma, p),
            [a0, b0],
            method="Nelder-Mead",
            options={"xatol": 1e-9, "fatol": 1e-14, "maxiter": 4000},
        )
        if best is None or result.fun < best.fun:
            best = result
    return float(best.fun), abs(float(best.x[0])), float(best.x[1])


def rug_loss(p, ratio):
    """The Persian rug's loss in the large-ns limit: the macroscopic loss at the bound's σ,
    optimised over a and b: (loss, a, b)."""
    p, ratio = check_density(p), check_ratio(ratio)
    return optimal_macroscopic(p, np.sqrt(variance_bound(p, ratio)))


def rug_losses(p, ratios):
    """``rug_loss`` at each ratio: (losses, a, b), each (ratios,)."""
    return np.array([rug_loss(p, r) for r in ratios]).T


def optimal_losses(p, sigmas):
    """min over a, b of the macroscopic loss at each σ: (sigmas,)."""
    return np.array([optimal_macroscopic(p, sigma)[0] for sigma in sigmas])


def ratios_with_scale(p, scale, ratios=np.linspace(0.05, 0.95, 91)):
    """The nd/ns at which the rug's optimal diagonal a equals ``scale``: each sign change of
    a - scale on the grid ``ratios``, refined by root-finding. A list, possibly empty."""
    check_density(p)
    scales = rug_losses(p, ratios)[1] - scale
    return [
        float(optimize.brentq(lambda r: rug_loss(p, r)[1] - scale, lo, hi, xtol=1e-6))
        for lo, hi, a, b in zip(ratios, ratios[1:], scales, scales[1:])
        if a * b < 0
    ]


def drop_ratio(p, fraction):
    """The nd/ns at which the rug's large-ns loss has fallen to ``fraction`` of the optimal
    linear model's (Figure 2's drop), by root-finding in log nd/ns on [1e-6, 0.9]."""
    check_density(p)
    check_range("fraction", fraction, 0, 1, low_open=True, high_open=True)

    def excess(log_ratio):
        ratio = np.exp(log_ratio)
        return rug_loss(p, ratio)[0] / linear_loss(p, ratio) - fraction

    if excess(np.log(0.9)) > 0:
        raise ValueError(f"at p = {p} the rug's loss stays above {fraction} of the linear one")
    return float(np.exp(optimize.brentq(excess, np.log(1e-6), np.log(0.9), xtol=1e-6)))


def linear_loss(p, ratio):
    """The best linear model with a bias: data covariance Var x · I is isotropic, so any rank-nd
    projector is optimal and leaves (1 - nd/ns) of the variance."""
    return (1 - check_ratio(ratio)) * feature_variance(p)


def authors_linear_loss(p, features, hidden):
    """The authors' code's baseline, (ns - nd - 1) p / (3 ns): no bias and E x² = p/3."""
    check_density(p)
    check_size("features", features)
    check_size("hidden", hidden, maximum=features)
    return (features - hidden - 1) * p / (3 * features)


def optimal_scale(b, sigma, p):
    """Appendix A, eq. 16 (eq. 9 with the bias absorbed into ν's mean): with the bias written
    a·b, the loss E (x - a ReLU(x + ν + b))² is least at
    a_opt = E[x ReLU(x + ν + b)] / E[ReLU(x + ν + b)²], x = c u, ν ~ N(0, σ²)."""
    check_range("b", b)
    check_sigma(sigma)
    check_density(p)
    _, off_second = relu_moments(np.asarray(b, float), sigma)
    first, second = relu_moments(U_NODES + b, sigma)
    numerator = p * U_WEIGHTS @ (U_NODES * first)
    return numerator / ((1 - p) * off_second + p * U_WEIGHTS @ second)


# --- loss scaling (section 4.3, appendices B and D) ------------------------------------------


def small_ratio_limit_loss(a, b, sigma, p):
    """Section 4.3.1's loss once the interference drowns the signal (r -> 0):
    (1-p) a² E ReLU(ν + b)² + p E (u - a ReLU(ν + b))², ν ~ N(0, σ²), u ~ U[0, 1]."""
    check_sigma(sigma)
    check_density(p)
    first, second = relu_moments(np.asarray(b, float), sigma)
    return (1 - p) * a**2 * second + p * (1 / 3 - a * first + a**2 * second)


def small_ratio_optimum(b, sigma, p):
    """Eq. 8 and the line after it, as printed: a_opt = p E[u ReLU(ν + b)] / E[ReLU(ν + b)²]
    and the loss there, p E u² - p² (E u)² (E ReLU(ν + b))² / E ReLU(ν + b)²: (a_opt, loss)."""
    check_sigma(sigma)
    check_density(p)
    first, second = relu_moments(np.asarray(b, float), sigma)
    return p * first / 2 / second, p / 3 - p**2 * first**2 / 4 / second


def off_term(mu, sigma):
    """The off term at a = 1 with the mean absorbed, E ReLU(ν)², ν ~ N(-|μ|, σ²) (eq. 10)."""
    check_sigma(sigma)
    return relu_moments(-np.abs(check_range("mu", mu)), sigma)[1]


def off_term_bound(mu, sigma):
    """Eq. 11: the off term is below σ²/2 · exp(-μ²/(2σ²))."""
    check_sigma(sigma)
    return sigma**2 / 2 * np.exp(-(check_range("mu", mu) ** 2) / (2 * sigma**2))


def on_term_parts(mu, sigma):
    """Appendix B's split of the on term at a = 1, ν ~ N(-|μ|, σ²): (E_r, E_ν). Where
    u + ν < 0 the ReLU cuts the signal and the loss is u² (E_r); elsewhere the noise passes
    and the loss is ν² (E_ν). Truncated-normal moments in closed form, u by quadrature."""
    check_sigma(sigma)
    mean = -abs(check_range("mu", mu))
    cut = (-U_NODES - mean) / sigma  # ν < -u  <=>  the standardised ν < cut
    pdf = np.exp(-(cut**2) / 2) / np.sqrt(2 * np.pi)
    E_r = U_WEIGHTS @ (U_NODES**2 * ndtr(cut))
    # E[ν² 1(ν > c)] = (m² + σ²)(1 - Φ) + σ (c + m) φ at c = -u
    E_nu = U_WEIGHTS @ ((mean**2 + sigma**2) * ndtr(-cut) + sigma * (mean - U_NODES) * pdf)
    return float(E_r), float(E_nu)


def on_term_bounds(mu, sigma):
    """Appendix B's bounds on the two parts, before the O(·): (E_r bound, E_ν bound) with
    E_r < ∫_0^{2|μ|} u² du + (1 - 2|μ|) P(ν < -2|μ|) = (2|μ|)³/3 + (1 - 2|μ|) Φ(-|μ|/σ)
    (for 2|μ| <= 1) and E_ν < σ² + μ², the whole Gaussian's second moment."""
    check_sigma(sigma)
    mu = abs(check_range("mu", mu, 0, 0.5))
    return (2 * mu) ** 3 / 3 + (1 - 2 * mu) * ndtr(-mu / sigma), sigma**2 + mu**2


def text_small_ratio_bound(p):
    """Section 4.3.1's bound on the r -> 0 loss as printed: p/3 - p²/9."""
    p = check_density(p)
    return p / 3 - p**2 / 9


def small_ratio_loss(p):
    """The r -> 0 loss: the interference drowns the signal, the best output is the constant
    E x, and the loss is Var x = p/3 - p²/4 (below the printed p/3 - p²/9)."""
    return feature_variance(p)


def bayes_on_loss(sigma):
    """E_y Var(u | y), y = u + ν, u ~ U[0,1], ν ~ N(0, σ²): the on-loss of the best possible
    elementwise decoder f(y) = E[u | y] (appendix D), by adaptive quadrature over y."""
    check_sigma(sigma)

    def conditional_variance_times_density(y):
        lo, hi = -y / sigma, (1 - y) / sigma
        mass = ndtr(hi) - ndtr(lo)
        if mass < 1e-300:
            return 0.0
        phi_lo, phi_hi = np.exp(-(lo**2) / 2), np.exp(-(hi**2) / 2)
        shift = (phi_lo - phi_hi) / np.sqrt(2 * np.pi) / mass
        spread = (lo * phi_lo - hi * phi_hi) / np.sqrt(2 * np.pi) / mass
        return sigma**2 * (1 + spread - shift**2) * mass

    value, _ = integrate.quad(
        conditional_variance_times_density,
        -8 * sigma,
        1 + 8 * sigma,
        points=[0.0, 1.0],
        limit=400,
        epsabs=1e-14,
    )
    return value


def elementwise_lower_bound(p, ratio):
    """Appendix D under the text's assumptions: any elementwise decoder of Gaussian interference
    at the bound's σ loses at least p · E Var(u | y)."""
    return p * bayes_on_loss(np.sqrt(variance_bound(p, ratio)))


def log_log_slope(x, y):
    """The least-squares slope of log y against log x."""
    check_range("x", x, 0, low_open=True)
    check_range("y", y, 0, low_open=True)
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])
