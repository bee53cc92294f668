"""Linear autoencoders: sparse-data moments, Baldi–Hornik critical points, gradient flows.

Conventions (seed "Notes on the mathematics of toy autoencoding problems", §1–2):
Σ is the *mean* second moment (1/T) Σ_t x_t x_tᵀ rather than the text's sum, so losses are per
sample; every statement of the text holds with this scaling. Indices are 0-based here
(the text's λ_1 is ``eigenvalues[0]``). Matrices may carry leading batch dimensions.
Shapes: A (features, hidden), B (hidden, features), W (hidden, features).
"""

from itertools import combinations

import numpy as np
import torch
from scipy.integrate import solve_ivp
from scipy.optimize import least_squares

from ..checks import check_size
from ..data import sparse_moments

# --- sparse data -------------------------------------------------------------------------------


def population_second_moment(features, sparsity, dtype=torch.float64):
    """E x xᵀ: (1-S)/3 on the diagonal, (1-S)^2/4 off it."""
    check_size("features", features)
    m = sparse_moments(sparsity)
    eye = torch.eye(features, dtype=dtype)
    return (
        m["cross"] * torch.ones(features, features, dtype=dtype) + (m["square"] - m["cross"]) * eye
    )


def population_spectrum(features, sparsity):
    """The two distinct eigenvalues of E x xᵀ: the top one (eigenvector 1/sqrt(D)) and the
    (features - 1)-fold degenerate rest."""
    check_size("features", features)
    m = sparse_moments(sparsity)
    bulk = m["square"] - m["cross"]
    return {"top": bulk + features * m["cross"], "bulk": bulk}


def second_moment(x):
    """Sample second moment (1/T) Σ_t x_t x_tᵀ of x:
    (..., T, features) -> (..., features, features)."""
    return x.transpose(-1, -2) @ x / x.shape[-2]


def eigh_descending(sigma):
    """Eigenvalues in decreasing order and the matching orthonormal eigenvectors (as columns)."""
    values, vectors = torch.linalg.eigh(sigma)
    return values.flip(-1), vectors.flip(-1)


# --- loss, gradients and critical points --------------------------------------------------------


def linear_loss(A, B, sigma):
    """E ||x - ABx||^2 = tr((I - AB) Σ (I - AB)ᵀ), exact given Σ."""
    residual = torch.eye(sigma.shape[-1], dtype=sigma.dtype, device=sigma.device) - A @ B
    return torch.einsum("...ij,...jk,...ik->...", residual, sigma, residual)


def linear_gradients(A, B, sigma):
    """(∂L/∂A, ∂L/∂B) = (-2(Σ - ABΣ)Bᵀ, -2Aᵀ(Σ - ABΣ)), equation (19)."""
    residual = sigma - A @ B @ sigma
    return -2 * residual @ B.transpose(-1, -2), -2 * A.transpose(-1, -2) @ residual


def check_index_set(index_set, features):
    index_set = tuple(sorted(index_set))
    if len(set(index_set)) != len(index_set) or not all(0 <= i < features for i in index_set):
        raise ValueError(
            f"index_set must hold distinct indices in [0, {features}); got {index_set}"
        )
    return index_set


def critical_point(eigenvectors, index_set, C=None):
    """A = U_I C, B = C^{-1} U_Iᵀ for eigenvector columns I and any invertible C (d x d)."""
    index_set = check_index_set(index_set, eigenvectors.shape[-1])
    U_I = eigenvectors[:, list(index_set)]
    if C is None:
        C = torch.eye(len(index_set), dtype=eigenvectors.dtype, device=eigenvectors.device)
    return U_I @ C, torch.linalg.solve(C, U_I.T)


def critical_loss(eigenvalues, index_set):
    """L at the critical point with index set I: the sum of the eigenvalues left out."""
    index_set = check_index_set(index_set, eigenvalues.shape[-1])
    keep = torch.zeros(eigenvalues.shape[-1], dtype=torch.bool, device=eigenvalues.device)
    keep[list(index_set)] = True
    return eigenvalues[..., ~keep].sum(-1)


def index_sets(features, hidden):
    """All C(features, hidden) index sets, the global minimum (0, ..., hidden-1) first."""
    features = check_size("features", features)
    hidden = check_size("hidden", hidden, maximum=features)
    return list(combinations(range(features), hidden))


def inversions(index_set, features):
    """Pairs (j in I, k not in I) with k < j, i.e. λ_k > λ_j: the escape directions of Prop. 3."""
    index_set = check_index_set(index_set, check_size("features", features))
    return [(j, k) for j in index_set for k in range(features) if k not in index_set and k < j]


def hessian_eigenvalues(A, B, sigma):
    """Eigenvalues of the Hessian of ``linear_loss`` in the flattened weights (A, B), ascending."""
    shapes = (A.shape, B.shape)

    def loss(flat):
        a, b = flat[: A.numel()].reshape(shapes[0]), flat[A.numel() :].reshape(shapes[1])
        return linear_loss(a, b, sigma)

    flat = torch.cat([A.reshape(-1), B.reshape(-1)]).detach()
    return torch.linalg.eigvalsh(torch.autograd.functional.hessian(loss, flat))


def solve_critical_point(sigma, A, B):
    """A zero of the gradient (19) near (A, B), with no knowledge of Σ's eigenvectors:
    Levenberg-Marquardt on the gradient as a residual, in float64. Returns (A, B) as found;
    the caller checks the gradient, since a zero is not guaranteed."""
    sigma = sigma.double()

    def unpack(flat):
        flat = torch.from_numpy(flat)
        return flat[: A.numel()].reshape(A.shape), flat[A.numel() :].reshape(B.shape)

    def gradient(flat):
        return torch.cat([g.reshape(-1) for g in linear_gradients(*unpack(flat), sigma)]).numpy()

    start = torch.cat([A.double().reshape(-1), B.double().reshape(-1)]).numpy()
    found = least_squares(
        gradient, start, method="lm", xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=2000
    )
    return tuple(part.clone() for part in unpack(found.x))


def projection_index_set(eigenvectors, P):
    """The eigenvectors u_i that P keeps (u_iᵀ P u_i > 1/2): the I of P = U_I U_Iᵀ, if it is one."""
    kept = torch.einsum("ji,jk,ki->i", eigenvectors, P, eigenvectors)
    return tuple(int(i) for i in torch.nonzero(kept > 0.5).flatten())


def saddle_escape(eigenvectors, index_set, j, k, eps, C=None):
    """The perturbed point of Prop. 3: u_j -> (u_j + eps u_k) / sqrt(1 + eps^2) inside U_I."""
    index_set = check_index_set(index_set, eigenvectors.shape[-1])
    if j not in index_set or k in index_set:
        raise ValueError(f"need j in I and k outside I; got j={j}, k={k}, I={index_set}")
    U = eigenvectors.clone()
    U[:, j] = (eigenvectors[:, j] + eps * eigenvectors[:, k]) / (1 + eps**2) ** 0.5
    return critical_point(U, index_set, C)


def escape_drop(eigenvalues, j, k, eps):
    """The loss decrease the text derives for ``saddle_escape``: eps^2/(1+eps^2) (λ_k - λ_j)."""
    return eps**2 / (1 + eps**2) * (eigenvalues[k] - eigenvalues[j])


def top_projection(eigenvectors, hidden):
    """The orthogonal projection onto the top-``hidden`` eigenvectors: the minimiser's AB."""
    U = eigenvectors[:, :hidden]
    return U @ U.T


# --- gradient flows ------------------------------------------------------------------------------


def untied_flow(A, B, sigma):
    """Equations (20)-(21): dA/dt = (Σ - ABΣ)Bᵀ, dB/dt = Aᵀ(Σ - ABΣ), i.e. -∇L/2."""
    residual = sigma - A @ B @ sigma
    return residual @ B.T, A.T @ residual


def tied_flow(W, sigma):
    """Equation (22): dW/dt = W(Σ - WᵀWΣ), the encoder half of the untied flow with A = Wᵀ."""
    return W @ (sigma - W.T @ W @ sigma)


def rotated_tied_flow(W_bar, eigenvalues):
    """Equation (23): dW̄/dt = W̄(I - W̄ᵀW̄)Λ, which is (22) for W̄ = W U."""
    eye = torch.eye(W_bar.shape[-1], dtype=W_bar.dtype, device=W_bar.device)
    return W_bar @ (eye - W_bar.T @ W_bar) * eigenvalues


def tied_gradient_flow(W, sigma):
    """-∇L/2 for the tied loss E||x - WᵀWx||^2: both halves of the untied flow with A = Wᵀ.

    (22) keeps only W(Σ - WᵀWΣ); the decoder half adds W(Σ - ΣWᵀW). They agree when WᵀW
    commutes with Σ, e.g. when Σ = I.
    """
    return tied_flow(W, sigma) + W @ (sigma - sigma @ W.T @ W)


def energy(W):
    """E = ¼||I - WᵀW||_F^2 = ¼Σ_i(1 - |w_i|^2)^2 + ¼Σ_{i≠j}<w_i, w_j>^2 over the columns w_i of W.

    (22) with Σ = I is exactly gradient descent on this E. The text's (28) writes ½ in front of
    the interference sum over ordered pairs i ≠ j; that equals this E only when the sum is read
    over unordered pairs.
    """
    gram = W.transpose(-1, -2) @ W
    eye = torch.eye(gram.shape[-1], dtype=W.dtype, device=W.device)
    return 0.25 * (eye - gram).pow(2).sum((-1, -2))


def energy_as_printed(W):
    """(28) read literally: ¼Σ_i(1 - |w_i|^2)^2 + ½Σ_{i≠j}<w_i, w_j>^2 over ordered pairs."""
    gram = W.transpose(-1, -2) @ W
    diagonal = torch.diagonal(gram, dim1=-2, dim2=-1)
    off_diagonal = gram - torch.diag_embed(diagonal)
    return 0.25 * (1 - diagonal).pow(2).sum(-1) + 0.5 * off_diagonal.pow(2).sum((-1, -2))


def integrate(flow, state, times, rtol=1e-10, atol=1e-12):
    """Integrate d(state)/dt = flow(*state) and return the states at ``times``.

    state: a tuple of float64 tensors; returns a tuple of tensors with a leading time dimension.
    """
    shapes = [s.shape for s in state]
    sizes = [s.numel() for s in state]

    def unpack(y):
        parts = torch.split(torch.from_numpy(y), sizes)
        return [p.reshape(shape) for p, shape in zip(parts, shapes)]

    def rhs(_, y):
        derivatives = flow(*unpack(y))
        if torch.is_tensor(derivatives):
            derivatives = (derivatives,)
        return torch.cat([d.reshape(-1) for d in derivatives]).numpy()

    y0 = torch.cat([s.reshape(-1) for s in state]).to(torch.float64).numpy()
    times = np.asarray(times, dtype=float)
    solution = solve_ivp(
        rhs, (times[0], times[-1]), y0, t_eval=times, method="DOP853", rtol=rtol, atol=atol
    )
    if not solution.success:
        raise RuntimeError(f"ODE integration failed: {solution.message}")
    ys = torch.from_numpy(solution.y.T.copy())
    return tuple(torch.stack(parts) for parts in zip(*(unpack(y.numpy()) for y in ys)))
