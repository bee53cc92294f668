"""Chapter 4: sparsity from noise in the hidden layer (Lecomte et al., section 3 and appendix C).

Encodings are the rows W_i of W (..., features, hidden). The fourth norm Σ_k W_ik⁴ measures
how sparse a unit encoding is: 1/m when spread evenly over m coordinates, 1 on one coordinate.
"""

import numpy as np

from ..checks import check_range, check_size
from ..noise import EXCESS_KURTOSIS, STANDARD_MOMENTS, check_noise


def fourth_norms(W):
    """Σ_k W_ik⁴ for every encoding: (..., features)."""
    return (W**4).sum(-1)


def squared_norms(W):
    """|W_i|² for every encoding: (..., features)."""
    return (W**2).sum(-1)


def initial_fourth_norm(hidden):
    """E Σ_k W_ik⁴ = 3/m for W_ik ~ N(0, 1/m), the init: the text's reference line."""
    return 3 / check_size("hidden", hidden)


def random_unit_fourth_norm(hidden):
    """E Σ_k u_k⁴ = 3/(m+2) for u uniform on the unit sphere; 3/m is its large-m limit."""
    return 3 / (check_size("hidden", hidden) + 2)


def sparsity_term(fourth_norm, kind, sigma, lr, hidden=None, order=2):
    """The part of the expected loss on e_i one SGD step later that depends on W_i's shape and
    not only on |W_i|₂ = 1, for an encoding with no interference.

    order 2, the text's appendix C: 16 η² σ⁴ |W_i|₄⁴ (μ₄/σ⁴ - 3).
    order 3, our extension of the same expansion to η³ (needs ``hidden`` = m):
        16 η² σ⁴ |W_i|₄⁴ [κ - 2η (12κ + σ² ((m - 1)κ + μ₆/σ⁶ - 6 μ₄/σ⁴ + 3))],
    with κ the excess kurtosis; it vanishes for Gaussian noise, as rotational symmetry demands.
    """
    kind = check_noise(kind)
    check_range("fourth_norm", fourth_norm, 0)
    check_range("sigma", sigma, 0)
    check_range("lr", lr, 0, low_open=True)
    kurtosis = EXCESS_KURTOSIS[kind]
    leading = 16 * lr**2 * sigma**4 * np.asarray(fourth_norm)
    if order == 2:
        return leading * kurtosis
    if order != 3 or hidden is None:
        raise ValueError(
            f"order must be 2, or 3 with hidden given; got order={order!r}, hidden={hidden!r}"
        )
    check_size("hidden", hidden)
    fourth, sixth = STANDARD_MOMENTS[kind]
    shape = (hidden - 1) * kurtosis + sixth - 6 * fourth + 3
    return leading * (kurtosis - 2 * lr * (12 * kurtosis + sigma**2 * shape))


def l1_collapse():
    """The l1 strength above which even a perfectly sparse encoding shrinks to 0: the feature
    benefit -∂(1 - w²)²/∂w = 4w(1 - w²) peaks at w = 1/√3 at 8/(3√3) ≈ 1.54."""
    return 8 / (3 * 3**0.5)


def noisy_squared_norm(sigma):
    """The |W_i|² that minimises E(|W_i|² - 1 + W_i·ξ)² = (|W_i|² - 1)² + σ²|W_i|², the loss on
    e_i when the ReLU stays on and nothing interferes: 1 - σ²/2 (0 beyond σ = √2)."""
    return np.maximum(1 - np.asarray(check_range("sigma", sigma, 0)) ** 2 / 2, 0.0)


# --- appendix C's intermediate identities, for an encoding W_i with no interference ----------


def one_input_gradient(encoding, xi):
    """Appendix C's gradient of the loss on e_i with respect to W_i while the ReLU stays on:
    2 (W_i·ξ)(2 W_i + ξ). encoding: (hidden,); xi: (..., hidden) -> (..., hidden)."""
    projection = (xi * encoding).sum(-1, keepdims=True)  # W_i·ξ, (..., 1)
    return 2 * projection * (2 * encoding + xi)


def noise_moments(kind, sigma):
    """The variance σ² and the fourth central moment μ₄ of law ``kind`` at strength σ."""
    check_range("sigma", sigma, 0)
    return sigma**2, STANDARD_MOMENTS[check_noise(kind)][0] * sigma**4


def projection_norm_moment(kind, sigma, hidden, squared_norm=1.0):
    """Appendix C: E[(W_i·ξ)² |ξ|²] = |W_i|² (μ₄ + (m - 1) σ⁴), whatever W_i's direction."""
    variance, mu4 = noise_moments(kind, sigma)
    return squared_norm * (mu4 + (check_size("hidden", hidden) - 1) * variance**2)


def projection_fourth_moment(kind, sigma, encoding, pair_factor=3):
    """Appendix C: E[(W_i·ξ)⁴] = 3σ⁴|W_i|₂⁴ + |W_i|₄⁴ (μ₄ - 3σ⁴). With ``pair_factor`` = 6, the
    text's first line, whose factor 6 belongs to unordered pairs but multiplies a sum over
    ordered ones: (pair_factor - 3) σ⁴ (|W_i|₂⁴ - |W_i|₄⁴) more."""
    variance, mu4 = noise_moments(kind, sigma)
    encoding = np.asarray(encoding)
    l2, l4 = (encoding**2).sum() ** 2, (encoding**4).sum()
    return (
        3 * variance**2 * l2
        + l4 * (mu4 - 3 * variance**2)
        + (pair_factor - 3) * variance**2 * (l2 - l4)
    )


def stepped_squared_norm(kind, sigma, lr, hidden):
    """Appendix C: E|W_i'|² after one SGD step W_i' = W_i - 2η (W_i·ξ)(2W_i + ξ) from a unit
    encoding, exact in η: 1 - 4η(1 - 4η)σ² + 4η² (μ₄ + (m - 1)σ⁴) (the text's "±" is "+")."""
    variance, _ = noise_moments(kind, sigma)
    check_range("lr", lr, 0, low_open=True)
    return (
        1
        - 4 * lr * (1 - 4 * lr) * variance
        + 4 * lr**2 * projection_norm_moment(kind, sigma, hidden)
    )
