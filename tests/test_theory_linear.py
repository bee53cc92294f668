import itertools

import numpy as np
import pytest
import torch

from toycore.experiments import linear as ex
from toycore.theory import linear as th


@pytest.fixture(autouse=True)
def float64():
    """The identities here hold to ~1e-15; keep the default dtype change inside this module."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _sparse_samples(seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(200, 5, generator=g) < 0.4) * torch.rand(200, 5, generator=g)


def _sample_loss(x, A, B):
    """mean_t ‖x_t - AB x_t‖² over the samples x (rows), written out: no Σ involved."""
    return (x - x @ (A @ B).T).pow(2).sum(1).mean()


@pytest.fixture
def samples():
    """The samples behind ``sigma``, for losses evaluated directly as mean ||x - ABx||²."""
    return _sparse_samples(0)


@pytest.fixture
def sigma():
    """A sample-like Σ with distinct eigenvalues."""
    return th.second_moment(_sparse_samples(0))


def test_the_moments_standard_errors_are_their_spread_over_seeds():
    """The exact standard error of each moment (entries averaged, pairs as a U-statistic) is
    the spread of one seed's value over 300 seeds, divided by the root of the seeds' count."""
    seeds = list(range(300))
    found = ex.moments(6, 0.6, 64, seeds)
    for name, moment in found.items():
        predicted = moment.standard_error * np.sqrt(len(seeds))  # one seed's standard deviation
        # the spread of 300 values is known to about 4% (more for a skewed indicator)
        assert moment.spread == pytest.approx(predicted, rel=0.15), name
        assert abs(moment.measured - moment.exact) < 5 * moment.standard_error, name


def test_population_second_moment_spectrum():
    D, S = 7, 0.8
    values = torch.linalg.eigvalsh(th.population_second_moment(D, S))
    spectrum = th.population_spectrum(D, S)
    assert values[-1].item() == pytest.approx(spectrum["top"])
    assert spectrum["top"] == pytest.approx((1 - S) / 3 + (D - 1) * (1 - S) ** 2 / 4)
    torch.testing.assert_close(values[:-1], torch.full((D - 1,), spectrum["bulk"]))


def test_linear_loss_is_the_mean_reconstruction_error():
    g = torch.Generator().manual_seed(1)
    x, A, B = (
        torch.rand(30, 4, generator=g),
        torch.randn(4, 2, generator=g),
        torch.randn(2, 4, generator=g),
    )
    direct = (x - x @ (A @ B).T).pow(2).sum(1).mean()
    torch.testing.assert_close(th.linear_loss(A, B, th.second_moment(x)), direct)


def test_closed_form_gradients_match_autograd(sigma):
    g = torch.Generator().manual_seed(2)
    A = torch.randn(5, 2, generator=g, requires_grad=True)
    B = torch.randn(2, 5, generator=g, requires_grad=True)
    th.linear_loss(A, B, sigma).backward()
    grad_A, grad_B = th.linear_gradients(A.detach(), B.detach(), sigma)
    torch.testing.assert_close(A.grad, grad_A)
    torch.testing.assert_close(B.grad, grad_B)


def test_every_critical_point(sigma):
    eigenvalues, U = th.eigh_descending(sigma)
    sets = th.index_sets(5, 2)
    assert len(sets) == 10 and sets[0] == (0, 1)
    C = torch.tensor([[2.0, 1.0], [0.5, 1.5]])
    for index_set in sets:
        A, B = th.critical_point(U, index_set, C)
        grad_A, grad_B = th.linear_gradients(A, B, sigma)
        assert grad_A.abs().max() < 1e-14 and grad_B.abs().max() < 1e-14
        assert th.linear_loss(A, B, sigma).item() == pytest.approx(
            th.critical_loss(eigenvalues, index_set).item(), abs=1e-14
        )
        hessian = th.hessian_eigenvalues(A, B, sigma)
        negative = int((hessian < -1e-10).sum())
        assert negative == len(th.inversions(index_set, 5))
        assert (negative == 0) == (index_set == (0, 1))


def test_global_minimum_is_the_top_projection(samples):
    # Σ, its spectrum and the loss all from the samples by hand; toycore only supplies U_I U_Iᵀ
    x = samples
    sigma = x.T @ x / x.shape[0]
    values, vectors = torch.linalg.eigh(sigma)
    eigenvalues, U = values.flip(0), vectors.flip(1)
    minimum = (torch.trace(sigma) - eigenvalues[:2].sum()).item()

    def trace_loss(A, B):
        P = A @ B
        return (
            torch.trace(sigma) - 2 * torch.trace(P @ sigma) + torch.trace(P @ sigma @ P.T)
        ).item()

    U_I = U[:, :2]
    assert _sample_loss(x, U_I, U_I.T).item() == pytest.approx(minimum, abs=1e-12)
    assert th.critical_loss(eigenvalues, (0, 1)).item() == pytest.approx(minimum, abs=1e-12)
    assert th.linear_loss(*th.critical_point(U, (0, 1)), sigma).item() == pytest.approx(
        minimum, abs=1e-12
    )
    P = th.top_projection(U, 2)
    torch.testing.assert_close(P @ P, P, rtol=0, atol=1e-14)
    torch.testing.assert_close(P, P.T, rtol=0, atol=1e-14)
    torch.testing.assert_close(
        P @ U, torch.cat([U[:, :2], torch.zeros(5, 3)], 1), rtol=0, atol=1e-14
    )
    # Eckart–Young: no (A, B) does better, whether far away or just next to the minimiser
    g = torch.Generator().manual_seed(8)
    gaps = []
    for trial in range(200):
        scale = 10 ** (4 * torch.rand(1, generator=g).item() - 3)
        noise_A, noise_B = torch.randn(5, 2, generator=g), torch.randn(2, 5, generator=g)
        if trial % 2:
            C = torch.randn(2, 2, generator=g) + 2 * torch.eye(2)
            A, B = U_I @ C + scale * noise_A, torch.linalg.solve(C, U_I.T) + scale * noise_B
        else:
            A, B = scale * noise_A, scale * noise_B
        loss = trace_loss(A, B)
        assert loss == pytest.approx(_sample_loss(x, A, B).item(), rel=1e-10, abs=1e-12)
        gaps.append(loss - minimum)
    assert min(gaps) >= -1e-12
    assert min(gaps) < 1e-4  # the bound is approached, not vacuous


@pytest.mark.parametrize("eps", [1e-3, 0.1, 1.0, 30.0])
def test_saddle_escape_drop_is_exact(sigma, eps):
    eigenvalues, U = th.eigh_descending(sigma)
    before = th.linear_loss(*th.critical_point(U, (0, 3)), sigma)
    after = th.linear_loss(*th.saddle_escape(U, (0, 3), 3, 1, eps), sigma)
    assert (before - after).item() == pytest.approx(
        th.escape_drop(eigenvalues, 3, 1, eps).item(), rel=1e-8
    )


@pytest.mark.parametrize("hidden", [2, 3])
def test_saddle_escape_with_a_general_C_follows_equations_13_to_18(samples, hidden):
    # toycore's escape_drops (and the test above) use C = I; (13)-(18) hold for any invertible C
    x = samples
    sigma = x.T @ x / x.shape[0]
    values, vectors = torch.linalg.eigh(sigma)
    eigenvalues, U = values.flip(0), vectors.flip(1)
    C = torch.randn(hidden, hidden, generator=torch.Generator().manual_seed(9))
    # genuinely non-orthogonal, and conditioned well enough that cond(C)·1e-16 stays below 1e-12
    assert 2 < torch.linalg.cond(C) < 1e3

    checked = 0
    for I in itertools.combinations(range(5), hidden):
        pairs = [(j, k) for j in I for k in range(5) if k not in I and k < j]
        assert pairs == th.inversions(I, 5)
        U_I = U[:, list(I)]
        base = _sample_loss(x, U_I @ C, torch.linalg.inv(C) @ U_I.T).item()
        for (j, k), eps in itertools.product(pairs, [0.1, 1.0, 7.0]):
            U_tilde = U_I.clone()
            U_tilde[:, I.index(j)] = (U[:, j] + eps * U[:, k]) / (1 + eps**2) ** 0.5
            A = U_tilde @ C  # (13)
            B = torch.linalg.inv(C) @ U_tilde.T  # (14)
            optimal_B = torch.linalg.solve(A.T @ A, A.T)
            P_A = A @ optimal_B
            tol = dict(rtol=0, atol=1e-12)  # projections and losses are O(1)
            scaled = dict(
                rtol=0, atol=1e-12 * C.abs().max().item() * torch.linalg.inv(C).abs().max().item()
            )
            torch.testing.assert_close(B, optimal_B, **scaled)  # B carries C⁻¹, A carries C
            torch.testing.assert_close(A @ B, P_A, **tol)
            torch.testing.assert_close(A @ B, U_tilde @ U_tilde.T, **tol)
            A_th, B_th = th.saddle_escape(U, I, j, k, eps, C)
            torch.testing.assert_close(A_th, A, **scaled)
            torch.testing.assert_close(B_th, B, **scaled)
            M = U.T @ A
            P = M @ torch.linalg.solve(M.T @ M, M.T)
            pattern = torch.zeros(5)  # (18)
            pattern[[i for i in I if i != j]] = 1
            pattern[j], pattern[k] = 1 / (1 + eps**2), eps**2 / (1 + eps**2)
            torch.testing.assert_close(torch.diagonal(P), pattern, **tol)
            loss = _sample_loss(x, A, B).item()
            assert loss == pytest.approx(_sample_loss(x, A, optimal_B).item(), abs=1e-12)
            assert loss == pytest.approx(  # (17)
                (torch.trace(sigma) - torch.trace(P @ torch.diag(eigenvalues))).item(), abs=1e-12
            )
            drop = eps**2 / (1 + eps**2) * (eigenvalues[k] - eigenvalues[j]).item()
            assert base - loss == pytest.approx(drop, abs=1e-12)
            assert drop > 0
            assert th.escape_drop(eigenvalues, j, k, eps).item() == pytest.approx(drop, abs=1e-15)
            assert th.linear_loss(A_th, B_th, sigma).item() == pytest.approx(loss, abs=1e-12)
            checked += 1
    assert checked == 3 * sum(len(th.inversions(I, 5)) for I in th.index_sets(5, hidden)) > 0


def test_bad_index_sets_are_rejected(sigma):
    _, U = th.eigh_descending(sigma)
    with pytest.raises(ValueError, match="index_set"):
        th.critical_point(U, (0, 5))
    with pytest.raises(ValueError, match="index_set"):
        th.critical_point(U, (1, 1))
    with pytest.raises(ValueError, match="j in I and k outside I"):
        th.saddle_escape(U, (0, 1), 2, 3, 0.1)


def test_untied_flow_is_minus_half_the_gradient(sigma):
    g = torch.Generator().manual_seed(3)
    A, B = torch.randn(5, 2, generator=g), torch.randn(2, 5, generator=g)
    dA, dB = th.untied_flow(A, B, sigma)
    grad_A, grad_B = th.linear_gradients(A, B, sigma)
    torch.testing.assert_close(dA, -grad_A / 2)
    torch.testing.assert_close(dB, -grad_B / 2)


def test_tied_gradient_flow_is_minus_half_the_tied_gradient(sigma):
    W = torch.randn(2, 5, generator=torch.Generator().manual_seed(4), requires_grad=True)
    th.linear_loss(W.T, W, sigma).backward()
    torch.testing.assert_close(th.tied_gradient_flow(W.detach(), sigma), -W.grad / 2)
    # (22) alone is not: it misses the decoder half unless WᵀW commutes with Σ
    assert (th.tied_flow(W.detach(), sigma) + W.grad / 2).norm() > 1e-3


def test_orthonormal_rows_are_fixed_points_of_the_tied_flow(sigma):
    Q, _ = torch.linalg.qr(torch.randn(5, 2, generator=torch.Generator().manual_seed(5)))
    W = Q.T
    assert th.tied_flow(W, sigma).abs().max() < 1e-15
    assert th.tied_gradient_flow(W, sigma).abs().max() > 1e-4


def test_rotated_flow_is_the_tied_flow_in_the_eigenbasis(sigma):
    eigenvalues, U = th.eigh_descending(sigma)
    W = torch.randn(2, 5, generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(th.tied_flow(W, sigma) @ U, th.rotated_tied_flow(W @ U, eigenvalues))


def test_energy_gradient_is_the_identity_flow():
    W = torch.randn(3, 6, generator=torch.Generator().manual_seed(7), requires_grad=True)
    (gradient,) = torch.autograd.grad(th.energy(W), W)
    torch.testing.assert_close(-gradient, th.tied_flow(W.detach(), torch.eye(6)))
    columns = W.detach().T
    by_hand = 0.25 * sum((1 - c @ c) ** 2 for c in columns) + 0.5 * sum(
        (a @ b) ** 2 for a, b in itertools.combinations(columns, 2)
    )
    torch.testing.assert_close(th.energy(W.detach()), by_hand)


def _energy_by_hand(W, ordered=False):
    """¼Σ_i(1 - |w_i|²)² + ½Σ⟨w_i, w_j⟩² over the columns, the second sum over unordered pairs
    i < j, or over ordered pairs i ≠ j (twice as much) as (28) can be read literally."""
    columns = W.T
    pairs = itertools.permutations if ordered else itertools.combinations
    return 0.25 * sum((1 - c @ c) ** 2 for c in columns) + 0.5 * sum(
        (a @ b) ** 2 for a, b in pairs(columns, 2)
    )


def test_rotated_flow_in_components_is_eigenvalue_weighted_descent_on_the_energy():
    g = torch.Generator().manual_seed(10)
    d, D = 2, 5
    tol = dict(rtol=1e-12, atol=1e-12)
    for _ in range(5):
        W = torch.randn(d, D, generator=g) * 10 ** (torch.rand(1, generator=g).item() - 0.5)
        lam = torch.rand(D, generator=g) * 3 + 0.1  # positive and (almost surely) distinct
        flow = th.rotated_tied_flow(W, lam)
        eq24 = torch.zeros(d, D)
        for i, j in itertools.product(range(d), range(D)):
            eq24[i, j] = sum(
                W[i, k]
                * (float(k == l) - sum(W[m, k] * W[m, l] for m in range(d)))
                * float(l == j)
                * lam[j]
                for k in range(D)
                for l in range(D)
            )
        w = W.T  # w[j] is the column w̄_j
        eq27 = torch.stack(
            [lam[j] * w[j] - sum((w[k] @ w[j]) * lam[j] * w[k] for k in range(D)) for j in range(D)]
        )
        eq28 = torch.stack(
            [
                (1 - w[j] @ w[j]) * lam[j] * w[j]
                - sum((w[k] @ w[j]) * lam[j] * w[k] for k in range(D) if k != j)
                for j in range(D)
            ]
        )
        torch.testing.assert_close(eq24, flow, **tol)
        torch.testing.assert_close(eq27.T, flow, **tol)
        torch.testing.assert_close(eq28.T, flow, **tol)
        W_grad = W.clone().requires_grad_()
        (gradient,) = torch.autograd.grad(_energy_by_hand(W_grad), W_grad)
        torch.testing.assert_close(flow, -gradient * lam, **tol)  # column j: -λ_j ∂E/∂w̄_j
        rate = (gradient * flow).sum()  # dE/dt = -Σ_j λ_j |∂E/∂w̄_j|²
        assert rate.item() == pytest.approx(-(lam * gradient.pow(2).sum(0)).sum().item(), rel=1e-12)
        assert rate < 0
    # and along an integrated trajectory E never rises
    lam = torch.tensor([2.0, 1.3, 0.7, 0.4, 0.1])
    (W_t,) = th.integrate(lambda W: th.rotated_tied_flow(W, lam), (W,), np.linspace(0, 10, 41))
    energies = torch.stack([_energy_by_hand(W) for W in W_t])
    assert (energies.diff() <= 1e-9).all()


def test_the_weighted_flow_is_a_gradient_only_for_equal_eigenvalues():
    g = torch.Generator().manual_seed(11)
    W = torch.randn(2, 5, generator=g)
    W_grad = W.clone().requires_grad_()
    (gradient,) = torch.autograd.grad(_energy_by_hand(W_grad), W_grad)
    # equal eigenvalues: the flow is exactly -∇(λE), E with the unordered-pair sum
    lam = 0.7
    flow = th.rotated_tied_flow(W, torch.full((5,), lam))
    torch.testing.assert_close(flow, -lam * gradient, rtol=1e-12, atol=1e-12)
    # (28) read over ordered pairs doubles the interference term and is not the flow's energy
    (ordered_gradient,) = torch.autograd.grad(_energy_by_hand(W_grad, ordered=True), W_grad)
    assert (flow + lam * ordered_gradient).norm() > 1e-3
    # nor even a Lyapunov function: d=1, D=2, w_1 = w_2 = a with a² = 0.4, by hand
    # dE_ordered/dt = 2a²(3a² - 1)(1 - 2a²) = 0.032 > 0 for λ = 1
    a = torch.full((1, 2), 0.4**0.5, requires_grad=True)
    (ordered_gradient,) = torch.autograd.grad(_energy_by_hand(a, ordered=True), a)
    rate = (ordered_gradient * th.rotated_tied_flow(a.detach(), torch.ones(2))).sum()
    assert rate.item() == pytest.approx(0.032, abs=1e-15)

    # distinct eigenvalues: the Jacobian of the flow is not symmetric, so the flow is -∇ of no
    # function at all, whichever λ-weighting of (28) one picks
    def jacobian(lam):
        J = torch.autograd.functional.jacobian(lambda V: th.rotated_tied_flow(V, lam), W)
        return J.reshape(10, 10)

    J = jacobian(torch.full((5,), lam))
    torch.testing.assert_close(J, J.T, rtol=0, atol=1e-13)
    J = jacobian(torch.tensor([2.0, 1.3, 0.7, 0.4, 0.1]))
    assert (J - J.T).abs().max() > 1e-2
    # in particular not of the per-index reading ¼Σλ_i(1-|w_i|²)² + ½Σ_{i<j}(λ_i+λ_j)/2⟨w_i,w_j⟩²
    lam = torch.tensor([2.0, 1.3, 0.7, 0.4, 0.1])
    columns = W_grad.T
    weighted = 0.25 * sum(lam[i] * (1 - c @ c) ** 2 for i, c in enumerate(columns)) + 0.5 * sum(
        (lam[i] + lam[j]) / 2 * (columns[i] @ columns[j]) ** 2
        for i, j in itertools.combinations(range(5), 2)
    )
    (weighted_gradient,) = torch.autograd.grad(weighted, W_grad)
    assert (th.rotated_tied_flow(W, lam) + weighted_gradient).norm() > 1e-3


def test_integrate_matches_a_closed_form():
    times = np.linspace(0, 2, 5)
    (y,) = th.integrate(lambda y: -y, (torch.ones(3),), times)
    torch.testing.assert_close(y[:, 0], torch.exp(-torch.tensor(times)), rtol=1e-9, atol=1e-11)


def test_a_critical_point_found_from_a_random_start_has_the_form_of_proposition_1(sigma):
    eigenvalues, eigenvectors = th.eigh_descending(sigma)
    g = torch.Generator().manual_seed(3)
    A, B = th.solve_critical_point(
        sigma, torch.randn(5, 2, generator=g), torch.randn(2, 5, generator=g)
    )
    grad_A, grad_B = th.linear_gradients(A, B, sigma)
    assert max(grad_A.abs().max(), grad_B.abs().max()) < 1e-12
    index_set = th.projection_index_set(eigenvectors, A @ B)
    U_I = eigenvectors[:, list(index_set)]
    assert len(index_set) == 2
    torch.testing.assert_close(A @ B, U_I @ U_I.T)
    assert th.linear_loss(A, B, sigma).item() == pytest.approx(
        th.critical_loss(eigenvalues, index_set).item(), abs=1e-12
    )


def test_a_search_that_ends_with_A_rank_deficient_finds_a_smaller_projection():
    # Proposition 1's proof assumes A of full rank; 4 of these 24 searches end at rank 1
    found = ex.critical_points_found.__wrapped__(4, 2, 0.5, 2000, 0, 24)
    deficient = [p for p in found if p.gradient_norm < 1e-10 and p.rank < 2]
    assert deficient
    for point in deficient:
        assert len(point.index_set) == point.rank
        assert point.projection_error < 1e-8 and abs(point.loss - point.predicted) < 1e-12
        assert point.negative > 0 and point.form_error == float("inf")
    full = [p for p in found if p.gradient_norm < 1e-10 and p.rank == 2]
    assert full and all(p.projection_error <= p.form_error < 1e-8 for p in full)


def test_the_index_set_of_a_projection_is_the_eigenvectors_it_keeps(sigma):
    _, eigenvectors = th.eigh_descending(sigma)
    A, B = th.critical_point(eigenvectors, (1, 3))
    assert th.projection_index_set(eigenvectors, A @ B) == (1, 3)
    assert th.projection_index_set(eigenvectors, torch.zeros(5, 5)) == ()


# --- §2.2 with tied weights A = Bᵀ = Wᵀ: where (22) stops and where the tied loss is critical ---
# The tied loss E‖x - WᵀWx‖² is written by hand from the samples behind ``sigma`` and
# differentiated by autograd; every quantity is O(1) and built from a few hundred float64 terms,
# so "vanishes" and "equals" mean within 1e-13 (hundreds of ulps), fixed before any run.


def _tied_loss_and_gradient(x, W):
    """mean_t ‖x_t - WᵀW x_t‖², and its gradient in W by autograd, both from the samples x."""
    W = W.detach().clone().requires_grad_()
    loss = _sample_loss(x, W.T, W)  # A = Wᵀ, B = W
    (gradient,) = torch.autograd.grad(loss, W)
    return loss.item(), gradient


def _orthogonal_d(d, seed):
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(seed)))
    return Q


def test_the_tied_minimum_U_top_T_is_a_fixed_point_of_22_and_a_critical_point_of_the_tied_loss(
    samples,
):
    x = samples
    sigma = x.T @ x / x.shape[0]
    eigenvalues, U = th.eigh_descending(sigma)
    assert (eigenvalues[:-1] - eigenvalues[1:]).min() > 1e-3  # distinct: the top set is unique
    d = 2
    minimum = (torch.trace(sigma) - eigenvalues[:d].sum()).item()
    C = _orthogonal_d(d, 12)
    torch.testing.assert_close(C @ C.T, torch.eye(d), rtol=0, atol=1e-15)
    for W in (U[:, :d].T, C @ U[:, :d].T):
        torch.testing.assert_close(W @ W.T, torch.eye(d), rtol=0, atol=1e-14)
        # (a) the right side of (22), toycore's and by hand
        assert th.tied_flow(W, sigma).abs().max() < 1e-13
        assert (W @ (sigma - W.T @ W @ sigma)).abs().max() < 1e-13
        # (b) the tied loss's own gradient, by autograd of the loss written from the samples
        loss, gradient = _tied_loss_and_gradient(x, W)
        assert gradient.abs().max() < 1e-13
        assert th.tied_gradient_flow(W, sigma).abs().max() < 1e-13
        # (c) its value is trΣ - (λ_1 + ... + λ_d), the untied minimum of Corollary 2
        assert loss == pytest.approx(minimum, abs=1e-13)
        assert th.linear_loss(W.T, W, sigma).item() == pytest.approx(minimum, abs=1e-13)
    # not vacuous: a generic W (not orthonormal) moves under (22) and has a gradient
    W = torch.randn(d, 5, generator=torch.Generator().manual_seed(13))
    assert th.tied_flow(W, sigma).abs().max() > 1e-3
    assert _tied_loss_and_gradient(x, W)[1].abs().max() > 1e-3


def test_every_eigen_subspace_is_a_fixed_point_of_22_with_loss_above_the_minimum_by_the_gap(
    samples,
):
    x = samples
    sigma = x.T @ x / x.shape[0]
    eigenvalues, U = th.eigh_descending(sigma)
    for d in (1, 2, 3):
        top = eigenvalues[:d].sum().item()
        minimum = _tied_loss_and_gradient(x, U[:, :d].T)[0]
        C = _orthogonal_d(d, 20 + d)
        others = [J for J in itertools.combinations(range(5), d) if J != tuple(range(d))]
        assert len(others) == len(th.index_sets(5, d)) - 1
        for J in others:
            for W in (U[:, list(J)].T, C @ U[:, list(J)].T):
                # (d) (22) stops here too, and so does the tied loss's gradient: WᵀW = U_J U_Jᵀ
                # commutes with Σ, so the decoder half W(Σ - ΣWᵀW) that (22) drops is 0 as well
                assert (W @ (sigma - W.T @ W @ sigma)).abs().max() < 1e-13
                assert th.tied_flow(W, sigma).abs().max() < 1e-13
                loss, gradient = _tied_loss_and_gradient(x, W)
                assert gradient.abs().max() < 1e-13
                # ... but the loss is higher, by exactly Σ_{i ≤ d} λ_i - Σ_{j ∈ J} λ_j > 0
                gap = top - eigenvalues[list(J)].sum().item()
                assert gap > 1e-4
                assert loss - minimum == pytest.approx(gap, abs=1e-13)
                assert loss == pytest.approx(th.critical_loss(eigenvalues, J).item(), abs=1e-13)


def test_any_orthonormal_rows_stop_22_whatever_the_row_space_but_the_tied_loss_moves_on(samples):
    """(e) WWᵀ = I gives W(Σ - WᵀWΣ) = WΣ - (WWᵀ)WΣ = 0 for any Σ: the chapter's "every W with
    orthonormal rows is a fixed point of (22), whatever its row space" is literally true. The tied
    loss's gradient -2[W(Σ - WᵀWΣ) + W(Σ - ΣWᵀW)] then reduces to its decoder half, which
    vanishes only when the row space is Σ-invariant (WᵀW commutes with Σ)."""
    x = samples
    sigma = x.T @ x / x.shape[0]
    eigenvalues, U = th.eigh_descending(sigma)
    g = torch.Generator().manual_seed(14)
    for d in (1, 2, 3, 4):
        Q, _ = torch.linalg.qr(torch.randn(5, d, generator=g))
        W = Q.T
        torch.testing.assert_close(W @ W.T, torch.eye(d), rtol=0, atol=1e-14)
        assert (W @ sigma - (W @ W.T) @ W @ sigma).abs().max() < 1e-13
        assert (W @ (sigma - W.T @ W @ sigma)).abs().max() < 1e-13
        # a generic row space is not Σ-invariant, and there the tied loss is not critical
        P = W.T @ W
        commutator = (P @ sigma - sigma @ P).abs().max()
        assert commutator > 1e-3
        _, gradient = _tied_loss_and_gradient(x, W)
        torch.testing.assert_close(gradient, -2 * W @ (sigma - sigma @ P), rtol=0, atol=1e-13)
        torch.testing.assert_close(
            th.tied_gradient_flow(W, sigma), -gradient / 2, rtol=0, atol=1e-13
        )
        assert gradient.abs().max() > 1e-3
    # a continuum of fixed points: rows cos θ u_1 + sin θ u_3 and u_2 (the text's numbering) are
    # orthonormal for every θ; the loss slides from the minimum (θ = 0) to the saddle of {2, 3}
    # (θ = π/2) as trΣ - λ_2 - cos²θ λ_1 - sin²θ λ_3, critical only at the two ends
    for theta in np.linspace(0, np.pi / 2, 7):
        c, s = np.cos(theta), np.sin(theta)
        W = torch.stack([c * U[:, 0] + s * U[:, 2], U[:, 1]])
        assert th.tied_flow(W, sigma).abs().max() < 1e-13
        loss, gradient = _tied_loss_and_gradient(x, W)
        expected = torch.trace(sigma) - eigenvalues[1] - c**2 * eigenvalues[0]
        assert loss == pytest.approx((expected - s**2 * eigenvalues[2]).item(), abs=1e-13)
        if 0 < theta < np.pi / 2 - 1e-9:
            assert gradient.abs().max() > 1e-4
        else:
            assert gradient.abs().max() < 1e-13
