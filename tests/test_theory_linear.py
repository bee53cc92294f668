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


@pytest.fixture
def sigma():
    """A sample-like Σ with distinct eigenvalues."""
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(200, 5, generator=g) < 0.4) * torch.rand(200, 5, generator=g)
    return th.second_moment(x)


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


def test_global_minimum_is_the_top_projection(sigma):
    eigenvalues, U = th.eigh_descending(sigma)
    A, B = th.critical_point(U, (0, 1))
    torch.testing.assert_close(A @ B, th.top_projection(U, 2))
    assert th.critical_loss(eigenvalues, (0, 1)) == pytest.approx(
        (torch.trace(sigma) - eigenvalues[:2].sum()).item()
    )


@pytest.mark.parametrize("eps", [1e-3, 0.1, 1.0, 30.0])
def test_saddle_escape_drop_is_exact(sigma, eps):
    eigenvalues, U = th.eigh_descending(sigma)
    before = th.linear_loss(*th.critical_point(U, (0, 3)), sigma)
    after = th.linear_loss(*th.saddle_escape(U, (0, 3), 3, 1, eps), sigma)
    assert (before - after).item() == pytest.approx(
        th.escape_drop(eigenvalues, 3, 1, eps).item(), rel=1e-8
    )


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
