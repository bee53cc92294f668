"""Chapter 4: noise laws, the noisy tied model's closed form, appendix C by Monte Carlo, and the
direction of the fourth-norm drift."""

import itertools

import numpy as np
import pytest
import torch

from toycore.experiments import hidden_noise as ex
from toycore.models import TiedBasisAutoencoder, tied_basis_reference_loss
from toycore.noise import EXCESS_KURTOSIS, STANDARD_MOMENTS, HiddenNoise, standard_noise
from toycore.theory import hidden_noise as th
from toycore.train import train


@pytest.mark.parametrize("kind", sorted(EXCESS_KURTOSIS))
def test_noise_laws_have_unit_variance_and_their_kurtosis(kind):
    z = standard_noise(kind, (1_000_000,), torch.Generator().manual_seed(3), torch.float64)
    assert torch.isfinite(z).all()
    assert abs(z.mean()) < 5e-3
    assert z.var().item() == pytest.approx(1, abs=1e-2)
    fourth, sixth = STANDARD_MOMENTS[kind]
    assert (z**4).mean().item() - 3 == pytest.approx(EXCESS_KURTOSIS[kind], abs=0.1)
    assert (z**6).mean().item() == pytest.approx(sixth, rel=0.1)


def test_noise_streams_are_per_instance_and_scaled():
    noise = HiddenNoise([5, 5, 6], 4, ["bipolar", "bipolar", "gaussian"], [0.1, 0.3, 0.2], chunk=3)
    draws = torch.stack([noise.next() for _ in range(7)])  # crosses two chunk boundaries
    assert draws.shape == (7, 3, 4)
    assert torch.allclose(draws[:, 0].abs(), torch.tensor(0.1))
    assert torch.allclose(draws[:, 1] / 3, draws[:, 0])  # same seed: same signs, σ scales
    alone = HiddenNoise([6], 4, "gaussian", 0.2, chunk=3)
    assert torch.allclose(torch.stack([alone.next() for _ in range(7)])[:, 0], draws[:, 2])


def test_bad_noise_input_is_refused_before_any_work():
    with pytest.raises(ValueError, match="noise must be one of"):
        TiedBasisAutoencoder(8, 16, [0], noise="cauchy", sigma=0.1)
    with pytest.raises(ValueError, match="noise must be one of"):
        standard_noise("poisson", (3,))
    with pytest.raises(ValueError, match="sigma must be"):
        TiedBasisAutoencoder(8, 16, [0, 1], noise="bipolar", sigma=[0.1])
    with pytest.raises(ValueError, match="sigma must be"):
        TiedBasisAutoencoder(8, 16, [0], noise="bipolar", sigma=-0.1)
    with pytest.raises(ValueError, match="needs a noise law"):
        TiedBasisAutoencoder(8, 16, [0], sigma=0.1)
    with pytest.raises(ValueError, match="noise must be one of"):
        ex.kurtosis_check(8, ["bipolar", "student"], 0.05, [0.01], 1000)
    with pytest.raises(ValueError, match="laws for 2 instances"):
        TiedBasisAutoencoder(8, 16, [0, 1], noise=["bipolar"], sigma=0.1)


def test_noisy_closed_form_matches_autograd_through_the_network():
    model = TiedBasisAutoencoder(
        6,
        10,
        [1, 2, 3],
        l1=[0.0, 1e-2, 0.0],
        noise=["bipolar", "gaussian", "laplace"],
        sigma=[0.4, 0.6, 0.5],
        dtype=torch.float64,
    )
    loss = model.loss_and_grad()
    xi = model.noise._drawn[0]
    W = model.W.detach().clone().requires_grad_()
    reference = tied_basis_reference_loss(W, model.l1, xi)
    reference.sum().backward()
    assert torch.allclose(loss, reference, atol=1e-12)
    assert torch.allclose(model.W.grad, W.grad, atol=1e-12)


def test_monte_carlo_finds_the_kurtosis_term_and_our_next_order():
    check = ex.kurtosis_check(8, ["bipolar", "gaussian", "laplace"], 0.05, [0.002, 0.02], 200_000)
    z = (check.measured - check.ours) / check.error
    assert np.abs(z).max() < 4
    bipolar, gaussian, laplace = check.measured
    assert (bipolar < 0).all() and (laplace > 0).all()
    assert np.abs(gaussian / check.error[1]).max() < 4
    # at small η the text's leading term alone is within a few percent
    assert check.measured[0, 0] / check.text[0, 0] == pytest.approx(1, abs=0.05)


def test_sparsity_term_vanishes_for_gaussian_noise_at_both_orders():
    for order in (2, 3):
        assert th.sparsity_term(1.0, "gaussian", 0.1, 0.02, hidden=16, order=order) == 0
    with pytest.raises(ValueError, match="order"):
        th.sparsity_term(1.0, "bipolar", 0.1, 0.02, order=3)


def test_bipolar_noise_sparsifies_and_gaussian_does_not_over_seeds():
    seeds, hidden = list(range(6)), 12
    fourth = {}
    for kind in ("bipolar", "gaussian"):  # the same seeds: the same initial W
        model = TiedBasisAutoencoder(6, hidden, seeds, noise=kind, sigma=0.15)
        train(model, None, steps=16000, lr=0.02, record_at=[16000])
        fourth[kind] = th.fourth_norms(model.W.detach()).mean(-1)
    assert (fourth["bipolar"] - fourth["gaussian"] > 0.3).all()
    # Gaussian noise leaves the encodings as spread as random unit vectors
    assert fourth["gaussian"].mean().item() == pytest.approx(
        th.random_unit_fourth_norm(hidden), abs=0.03
    )


def test_compromising_encoding_is_found_on_a_hand_built_matrix():
    W = np.zeros((4, 6))
    for i, j in enumerate((0, 1, 2)):
        W[i, j] = 1.0 if i != 1 else -1.0
    W[3, :3] = [-0.45, 0.45, -0.45]
    W[3, 5] = 0.3
    found = ex.compromising_encodings(W)
    assert len(found) == 1 and found[0].encoding == 3 and found[0].columns == [0, 1, 2]
    assert found[0].spread == pytest.approx(1.0)
    # it also holds 0.3 in neuron 5, which nobody owns: significant, but not a shared neuron
    assert found[0].significant == [0, 1, 2, 5]
    W[3, 1] = -0.45  # same sign as its owner: no longer the compromise the text describes
    assert ex.compromising_encodings(W) == []


def test_opposing_weights_count_the_others_in_each_owned_neuron():
    W = np.zeros((3, 4))
    W[0, 0], W[1, 1] = 1.0, -1.0  # encoding 0 owns neuron 0, encoding 1 owns neuron 1
    W[1, 0], W[2, 0] = -0.05, -0.005  # against owner 0: one by at least 0.01, one too small
    W[0, 1], W[2, 1] = 0.02, -0.3  # against owner 1 (negative): 0.02 opposes, -0.3 does not
    assert ex.opposing_weights(W) == (0.5, 4)
    assert ex.opposing_weights(W, small=0.001) == (0.75, 4)


def test_theory_reference_values():
    assert th.initial_fourth_norm(16) == 3 / 16
    assert th.random_unit_fourth_norm(16) == 3 / 18
    W = torch.randn(200_000, 16, dtype=torch.float64)
    W /= W.norm(dim=-1, keepdim=True)
    assert th.fourth_norms(W).mean().item() == pytest.approx(3 / 18, rel=0.01)
    assert th.l1_collapse() == pytest.approx(8 / (3 * 3**0.5))
    assert th.noisy_squared_norm(0.5) == pytest.approx(0.875)


def test_the_sparsifying_range_brackets_the_rise_from_a_random_vector_to_the_peak():
    values = np.array([0.01, 0.02, 0.05, 0.1, 0.2])
    final = np.array([0.17, 0.18, 0.3, 0.8, 0.85])  # mean ‖W_i‖₄⁴ at the last record
    fourth = np.broadcast_to(final[None, :, None, None], (3, 5, 2, 4))  # records, values, ...
    side = ex.StrengthSide(values, np.arange(3), fourth, np.ones_like(fourth), None)
    # the rise is 0.85 - 0.17: 0.18 is under 10% of it, 0.8 is over 90%
    assert ex.sparsifying_range(side, 0.17) == (0.02, 0.1)
    # no value under 10%: the smallest
    assert ex.sparsifying_range(side, 0.0)[0] == 0.01


def _side_with_final(final):
    """A strength side whose final mean ‖W_i‖₄⁴ at its values is ``final``."""
    final = np.asarray(final, dtype=float)
    fourth = np.broadcast_to(final[None, :, None, None], (3, len(final), 2, 4))
    values = np.geomspace(0.01, 1, len(final))
    return ex.StrengthSide(values, np.arange(3), fourth, np.ones_like(fourth), None)


def test_the_rise_after_the_peak_is_zero_when_the_side_only_falls_past_it():
    side = _side_with_final([0.17, 0.6, 0.8, 0.79, 0.7, 0.1])
    np.testing.assert_allclose(ex.final_means(side, side.fourth), [0.17, 0.6, 0.8, 0.79, 0.7, 0.1])
    assert ex.rise_after_peak(side) == 0.0
    # a second bump past the peak is the rise: 0.7 -> 0.75
    assert ex.rise_after_peak(_side_with_final([0.17, 0.8, 0.7, 0.75, 0.1])) == pytest.approx(0.05)
    # a peak at the largest value leaves nothing past it
    assert ex.rise_after_peak(_side_with_final([0.1, 0.2, 0.3])) == 0.0


def test_orders_of_magnitude_read_as_powers_of_ten():
    from toycore.plots import power_of_ten

    assert power_of_ten(1.28e8) == "10⁸" and power_of_ten(3e-5) == "10⁻⁵"


def test_appendix_c_identities_are_exact_for_bipolar_noise_by_enumeration():
    hidden, sigma, lr = 4, 0.3, 0.2
    signs = np.array(
        list(itertools.product((-1.0, 1.0), repeat=hidden))
    )  # every ξ/σ, equally likely
    xi = sigma * signs
    encoding = np.array([0.7, -0.5, 0.4, 0.3])
    encoding /= np.linalg.norm(encoding)
    projection, norm = xi @ encoding, (xi**2).sum(-1)
    stepped = encoding - lr * th.one_input_gradient(encoding, xi)
    assert (stepped**2).sum(-1).mean() == pytest.approx(
        th.stepped_squared_norm("bipolar", sigma, lr, hidden), rel=1e-12
    )
    assert (projection**2 * norm).mean() == pytest.approx(
        th.projection_norm_moment("bipolar", sigma, hidden), rel=1e-12
    )
    fourth = (projection**4).mean()
    assert fourth == pytest.approx(
        th.projection_fourth_moment("bipolar", sigma, encoding), rel=1e-12
    )
    # the text's first line, factor 6 on ordered pairs, is too large by 3σ⁴(|W|₂⁴ - |W|₄⁴)
    text = th.projection_fourth_moment("bipolar", sigma, encoding, pair_factor=6)
    assert text - fourth == pytest.approx(3 * sigma**4 * (1 - (encoding**4).sum()), rel=1e-9)


def test_monte_carlo_identities_agree_with_the_formulas_and_autograd():
    ids = ex.appendix_c_identities(8, ["bipolar", "uniform", "laplace"], 0.1, 0.25, 20_000)
    assert ids.gradient.max() < 1e-12
    for z in (ids.stepped_z, ids.cross_z, ids.fourth_z):
        assert np.abs(z).max() < 5
    # the factor 6 is rejected wherever the encoding has pairs (not on e_1)
    assert np.abs(ids.fourth_text_z[:, 1:]).min() > 10


def test_the_gradient_identity_is_checked_only_where_the_relu_passes():
    # Laplace noise at σ = 0.3 pushes 1 + W·ξ below 0 in about 1% of draws on e_1, where the
    # output is clipped and the gradient is 0, not 2(W·ξ)(2W + ξ)
    ids = ex.appendix_c_identities(8, ["laplace", "bipolar"], 0.3, 0.25, 20_000)
    assert 0.002 < ids.closed[0, 0] < 0.05 and ids.closed[1].max() == 0
    assert ids.gradient.max() < 1e-12


def test_the_kurtosis_term_grows_as_sigma_to_the_fourth():
    power = ex.sigma_power(8, "bipolar", [0.05, 0.1], 0.001, 50_000)
    assert power.exponent_error < 0.05
    assert abs(power.exponent - 4) < 5 * power.exponent_error


def test_rate_exponents_read_the_local_power_where_the_push_is_weakest():
    steps = np.arange(0, 100_001, 10)

    # steps to reach 1 = scale / value^k: the curve is step / time, one seed, one feature
    def side(values, k, scale):
        times = scale * np.asarray(values) ** -k
        fourth = (steps[:, None] / times[None, :])[..., None, None]  # (records, values, 1, 1)
        return ex.StrengthSide(np.asarray(values), steps, fourth, np.ones_like(fourth), None)

    sweep = ex.StrengthSweep(
        steps,
        np.arange(1),
        16,
        0.02,
        side([0.01, 0.1, 1.0], 1, 1e4),
        side([0.05, 0.1, 0.2, 0.5], 4, 1.0),
    )
    rate = ex.rate_exponents(sweep, 1.0)
    assert np.isnan(rate.l1_steps[0])  # 1e6 steps: beyond the run
    assert rate.l1_exponent == pytest.approx(1, abs=0.01)
    assert rate.l1_seed_exponents == pytest.approx([1], abs=0.01)  # the one seed
    # crossings at steps 1e5 and 1e4 on a grid of 10 steps: known to 1e-4 and 1e-3 relative
    assert rate.l1_resolution == pytest.approx((1e-4 + 1e-3) / np.log(10), rel=0.01)
    assert np.isnan(rate.sigma_steps[0])  # 1.6e5 steps
    assert rate.sigma_exponent == pytest.approx(4, abs=0.05)
    with pytest.raises(ValueError, match="two values"):
        ex.local_exponent([0.1, 0.2], [np.nan, 5.0])


def test_past_the_noise_grid_the_authors_sgd_diverges_and_the_words_say_how_soon():
    first = ex.steps_to_diverge(8, 16, ex.DIVERGING_SIGMA, range(3), steps=100, lr=0.02)
    assert (first >= 0).all() and first.max() < 100  # every seed, within a hundred steps
    assert (ex.steps_to_diverge(8, 16, 0.1, range(3), steps=100, lr=0.02) == -1).all()
    assert ex.diverging_words(np.array([3, 39]), 200) == (
        "training diverged in every seed within 39 steps"
    )
    assert ex.diverging_words(np.array([-1, -1]), 200) == (
        "training stayed finite in every seed for 200 steps"
    )
    assert ex.diverging_words(np.array([3, -1]), 200) == (
        "training diverged in 1 of 2 seeds within 200 steps"
    )


def test_the_late_wander_is_the_spread_over_a_run_s_last_half_and_its_words_follow_it():
    steps = np.array([0, 10, 50, 60, 80, 100])
    fourth = np.zeros((len(steps), 2, 3))  # (records, seeds, encodings)
    fourth[:, 0, 0] = [5.0, -5.0, 0.3, 0.1, 0.3, 0.1]  # the first half is not read
    assert ex.late_wander(steps, fourth) == 0.0  # 5 of 6 encodings do not move
    late = [0.1, 0.3, 0.2, 0.2]  # steps 50 to 100: every encoding wanders alike
    fourth[2:] = np.array(late)[:, None, None]
    assert ex.late_wander(steps, fourth) == pytest.approx(np.std(late))
    assert ex.wander_words([0.1, 0.2], [0.01, 0.03]) == (
        "grows with σ (0.010 at σ = 0.1, 0.030 at σ = 0.2)"
    )
    assert ex.wander_words([0.1, 0.2], [0.03, 0.01]).startswith("does not grow with σ")


# --- section 3.1: the hidden layer's rotational symmetry, and what bipolar noise keeps of it ----
# W is (features, hidden) here, encodings as rows, so a rotation R of the hidden space acts on the
# right: W -> W R. The loss sees W only through P = W Wᵀ + (W ξ) 1ᵀ, so W R Rᵀ Wᵀ = W Wᵀ and
# W R ξ = W (R ξ): loss(W R, ξ) = loss(W, R ξ). Losses here are O(1) sums of a few dozen float64
# terms, so "equal" means within 1e-12 (a thousand ulps of margin), decided before any run.


class _FixedNoise:
    """Stands in for ``HiddenNoise``: ``next()`` returns the given ξ, (instances, hidden), so the
    model's own ``loss_and_grad`` (what training calls) runs on chosen noise."""

    def __init__(self, xi):
        self.xi = xi

    def next(self):
        return self.xi


def _step_losses(Ws, xi=None):
    """The training step's loss (``loss_and_grad``) and gradient for each W in Ws
    (instances, features, hidden) with noise ξ (instances, hidden) or none; float64, CPU."""
    instances, features, hidden = Ws.shape
    model = TiedBasisAutoencoder(
        features, hidden, range(instances), dtype=torch.float64, device="cpu"
    )
    model.W.data.copy_(Ws)
    if xi is not None:
        model.noise = _FixedNoise(xi)
    loss = model.loss_and_grad()
    return loss, model.W.grad.clone()


def _orthogonal(hidden, seed):
    """A random rotation of the hidden space: Q of the QR of a Gaussian matrix."""
    g = torch.Generator().manual_seed(seed)
    R, _ = torch.linalg.qr(torch.randn(hidden, hidden, generator=g, dtype=torch.float64))
    return R


def _encodings(features, hidden, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(features, hidden, generator=g, dtype=torch.float64) * hidden**-0.5


def test_noiseless_loss_is_invariant_under_rotations_of_the_hidden_layer():
    features, hidden = 5, 7
    W, R = _encodings(features, hidden, 11), _orthogonal(hidden, 12)
    assert torch.allclose(R @ R.T, torch.eye(hidden, dtype=torch.float64), atol=1e-14)
    # a non-orthogonal invertible map: stretch by 1/2 .. 2 along a rotated frame
    A = _orthogonal(hidden, 13) @ torch.diag(torch.linspace(0.5, 2, hidden, dtype=torch.float64))
    assert torch.linalg.matrix_rank(A) == hidden
    Ws = torch.stack([W, W @ R, W @ A])
    model = TiedBasisAutoencoder(features, hidden, range(3), dtype=torch.float64, device="cpu")
    model.W.data.copy_(Ws)
    plain = model.loss()  # the noiseless loss on the whole data set
    step, grad = _step_losses(Ws)  # what a training step computes
    assert torch.allclose(step, plain, rtol=0, atol=1e-12)
    assert torch.allclose(tied_basis_reference_loss(Ws, 0.0), plain, rtol=0, atol=1e-12)
    assert plain[1].item() == pytest.approx(plain[0].item(), rel=1e-12, abs=1e-12)
    # not vacuous: a map that is not a rotation changes the Gram matrix, and the loss
    assert abs(plain[2] - plain[0]).item() > 1e-3 * plain[0].item()
    # and the gradient rotates with W: ∇L(W R) = ∇L(W) R
    assert torch.allclose(grad[1], grad[0] @ R, rtol=0, atol=1e-12)


def test_a_rotation_of_the_hidden_layer_moves_into_the_noise_draw_by_draw():
    features, hidden, draws, sigma = 4, 6, 32, 0.4
    W, R = _encodings(features, hidden, 21), _orthogonal(hidden, 22)
    g = torch.Generator().manual_seed(23)
    for kind in ("gaussian", "bipolar"):
        xi = sigma * standard_noise(kind, (draws, hidden), g, torch.float64)  # rows: draws
        at_W = W.expand(draws, -1, -1)
        # the stand-in noise reaches the step as HiddenNoise's would: the plain forward pass
        # (hidden = x W + ξ, y = ReLU(hidden Wᵀ)) agrees draw by draw
        loss, _ = _step_losses(at_W @ R, xi)
        assert torch.allclose(loss, tied_basis_reference_loss(at_W @ R, 0.0, xi), atol=1e-12)
        # loss(W R, ξ) = loss(W, R ξ); for row vectors R ξ is ξ Rᵀ
        moved, _ = _step_losses(at_W, xi @ R.T)
        assert torch.allclose(loss, moved, rtol=0, atol=1e-12)
        # not vacuous: the noise matters, and with ξ left unrotated the losses differ
        unmoved, _ = _step_losses(at_W, xi)
        assert (loss - unmoved).abs().max() > 1e-3
        assert (loss - _step_losses(at_W)[0]).abs().max() > 1e-3


def _bipolar_expected_loss(W, sigma):
    """E L(W, ξ) over bipolar ξ ∈ {±σ}^m exactly: the mean over all 2^m equally likely signs,
    each draw one instance of the model's training step. Also returns the per-draw losses and
    whether the ReLU clipped any output in any draw."""
    features, hidden = W.shape
    signs = torch.tensor(list(itertools.product((-1.0, 1.0), repeat=hidden)), dtype=W.dtype)
    xi = sigma * signs
    losses, _ = _step_losses(W.expand(len(xi), -1, -1), xi)
    P = W @ W.T + (xi @ W.T)[:, :, None]  # (draws, features, features): P_ji = G_ji + (W ξ)_j
    return losses.mean(), losses, bool((P < 0).any())


def test_bipolar_noise_breaks_the_rotation_symmetry_but_keeps_signed_permutations():
    features, hidden, sigma = 3, 4, 0.3
    W, R = _encodings(features, hidden, 31), _orthogonal(hidden, 32)
    expected, losses, clipped = _bipolar_expected_loss(W, sigma)
    rotated, _, _ = _bipolar_expected_loss(W @ R, sigma)
    assert clipped  # without clipping the expectation would not tell them apart (next test)
    assert abs(rotated - expected).item() > 1e-6 * expected.item()
    # a signed permutation maps the 2^m sign patterns onto themselves: same draws, reordered
    S = torch.eye(hidden, dtype=torch.float64)[[2, 0, 3, 1]] * torch.tensor([1.0, -1, -1, 1])
    permuted, permuted_losses, _ = _bipolar_expected_loss(W @ S, sigma)
    assert permuted.item() == pytest.approx(expected.item(), rel=1e-12)
    assert torch.allclose(permuted_losses.sort().values, losses.sort().values, atol=1e-12)
    assert not torch.allclose(permuted_losses, losses, atol=1e-3)  # reordered, not identical


def test_without_clipping_the_expected_bipolar_loss_is_rotation_symmetric():
    """While the ReLU never clips, one step's loss is quadratic in ξ, so its expectation sees only
    E ξ ξᵀ = σ² I, the same for bipolar and Gaussian noise: at a fixed W bipolar noise breaks
    the rotation symmetry only through clipping. Its push towards sparsity (appendix C) comes
    through an SGD step: see the lone-encoding test below."""
    hidden, sigma = 4, 0.1
    # unit encodings with positive overlaps of at least 0.3 and |W_j|₁ ≤ √m |W_j|₂ = 2, so
    # G_ij + (W ξ)_j ≥ 0.3 - 2σ > 0 for every sign pattern, here and after any rotation
    base = torch.tensor([[1.0, 0.5, 0.0, 0.0], [0.5, 1.0, 0.2, 0.0], [0.4, 0.0, 1.0, 0.3]])
    W = (base / base.norm(dim=-1, keepdim=True)).to(torch.float64)
    R = _orthogonal(hidden, 42)
    expected, _, clipped = _bipolar_expected_loss(W, sigma)
    rotated, _, clipped_rotated = _bipolar_expected_loss(W @ R, sigma)
    assert not clipped and not clipped_rotated
    assert rotated.item() == pytest.approx(expected.item(), rel=1e-12)


def test_gaussian_invariance_argument_step_common_random_numbers_coincide_draw_by_draw():
    """Not a statistical test: the step of the argument E L(W R) = E L(W) under Gaussian noise
    that is exact at every draw. With common random numbers ξ_k, the Monte Carlo estimate of
    E L(W R) from draws ξ_k equals, draw by draw, that of E L(W) from draws R ξ_k; and R ξ_k are
    N(0, σ² I) draws too, since R σ² I Rᵀ = σ² I (R orthogonal). For bipolar noise the first step
    holds but the second fails: R ξ_k is not a ±σ vector."""
    features, hidden, draws, sigma = 3, 4, 64, 0.3
    W, R = _encodings(features, hidden, 51), _orthogonal(hidden, 52)
    g = torch.Generator().manual_seed(53)
    xi = sigma * standard_noise("gaussian", (draws, hidden), g, torch.float64)
    at_W = W.expand(draws, -1, -1)
    estimate_rotated, _ = _step_losses(at_W @ R, xi)
    estimate, _ = _step_losses(at_W, xi @ R.T)
    assert torch.allclose(estimate_rotated, estimate, rtol=0, atol=1e-12)
    assert estimate_rotated.mean().item() == pytest.approx(estimate.mean().item(), abs=1e-12)
    covariance = R @ (sigma**2 * torch.eye(hidden, dtype=torch.float64)) @ R.T
    assert torch.allclose(covariance, sigma**2 * torch.eye(hidden, dtype=torch.float64), atol=1e-14)
    bipolar = sigma * standard_noise("bipolar", (draws, hidden), g, torch.float64)
    assert ((bipolar @ R.T).abs() - sigma).abs().max() > 1e-3


def test_one_bipolar_step_favours_the_sparser_rotation_of_a_lone_encoding_as_appendix_c_says():
    """Appendix C's setting, one feature (no interference) with |W|₂ = 1: exactly over all pairs
    of bipolar draws, the loss one step later is lower for a sparser rotation of the same
    encoding, by the sparsity term's difference (our order-3 expansion, to within 25%: the η⁴
    terms at η = 0.01 are a few percent)."""
    hidden, sigma, lr = 4, 0.1, 0.01
    signs = torch.tensor(list(itertools.product((-1.0, 1.0), repeat=hidden)), dtype=torch.float64)
    xi = sigma * signs  # |W|₁ ≤ 2 keeps 1 + W·ξ > 0: the ReLU never clips

    def after_a_step(W):
        _, grads = _step_losses(W.expand(len(xi), -1, -1), xi)
        stepped = (W - lr * grads).repeat_interleave(len(xi), 0)
        return _step_losses(stepped, xi.repeat(len(xi), 1))[0].mean().item()

    sparse = torch.tensor([[0.9, 0.3, 0.2, 0.1]], dtype=torch.float64)
    sparse /= sparse.norm()
    # the Householder reflection taking it to (1, 1, 1, 1)/2, an orthogonal map of the hidden space
    v = sparse - 0.5
    H = torch.eye(hidden, dtype=torch.float64) - 2 * v.T @ v / (v**2).sum()
    spread = sparse @ H
    assert torch.allclose(H @ H.T, torch.eye(hidden, dtype=torch.float64), atol=1e-14)
    fourth = [th.fourth_norms(W).item() for W in (sparse, spread)]
    assert fourth[0] - fourth[1] > 0.1
    exact = after_a_step(sparse) - after_a_step(spread)
    assert exact < 0
    term = [th.sparsity_term(f, "bipolar", sigma, lr, hidden=hidden, order=3) for f in fourth]
    assert exact == pytest.approx(term[0] - term[1], rel=0.25)


# --- appendix C's gradient with the two copies of W told apart, and the fresh noise's term ------
# Three unit encodings at 120° in a random plane of R⁴: W_i·W_j = -1/2 and |W_j|₁ ≤ 2, so for
# σ = 0.1 the cross outputs W_j·(W_i + ξ) ≤ -1/2 + |W_j|₁ max_k |ξ_k| stay below 0 (no
# interference) and the diagonal 1 + W_i·ξ above 0 for every bipolar ξ: the appendix's
# assumptions, asserted draw by draw (also for the few Gaussian draws, which could in principle
# break them). Quantities are O(1) float64 sums of a few terms: equal means within 1e-13.


def _appendix_c_encodings(seed=61):
    """(3, 4): unit rows with pairwise dot products -1/2, in a random plane (no zero entries)."""
    angles = torch.tensor([0.0, 2 * np.pi / 3, 4 * np.pi / 3], dtype=torch.float64)
    plane = torch.stack([angles.cos(), angles.sin(), torch.zeros(3), torch.zeros(3)], 1)
    return plane @ _orthogonal(4, seed).to(torch.float64)


def _appendix_c_draws(sigma, seed=62):
    """Every bipolar ξ ∈ {±σ}⁴, then eight Gaussian draws: (24, 4)."""
    signs = torch.tensor(list(itertools.product((-1.0, 1.0), repeat=4)), dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    return torch.cat([sigma * signs, sigma * torch.randn(8, 4, generator=g, dtype=torch.float64)])


def _untied_input_loss(W_e, W_d, i, xi):
    """The loss on input e_i with the encoder and decoder copies told apart, written by hand:
    h = (W^e)ᵀ e_i + ξ = W^e_i + ξ, y = ReLU(W^d h), L = ‖y - e_i‖²."""
    h = W_e[i] + xi
    y = torch.relu(W_d @ h)
    return (y - torch.eye(W_e.shape[0], dtype=W_e.dtype)[i]).square().sum()


def test_appendix_c_decoder_and_encoder_gradients_separately_and_their_sum_is_the_models():
    W, sigma = _appendix_c_encodings(), 0.1
    features = W.shape[0]
    torch.testing.assert_close(
        W.norm(dim=1), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-15
    )
    torch.testing.assert_close(
        W @ W.T, 1.5 * torch.eye(3, dtype=torch.float64) - 0.5, rtol=0, atol=1e-15
    )
    assert (W != 0).all()
    tol = dict(rtol=0, atol=1e-13)
    draws = _appendix_c_draws(sigma)
    step_loss, step_grad = _step_losses(W.expand(len(draws), -1, -1), draws)
    for xi, loss, grad in zip(draws, step_loss, step_grad):
        P = W @ W.T + (W @ xi)[:, None]  # P_ji: output j on input e_i
        assert (P.diagonal() > 0.5).all()  # the ReLU passes on the input's own output
        off = P - torch.diag(P.diagonal())
        assert (off < -0.1).sum() == features * (features - 1)  # ... and on no other
        total_d = torch.zeros_like(W)
        total_e = torch.zeros_like(W)
        total_loss = 0.0
        for i in range(features):
            W_e = W.clone().requires_grad_()
            W_d = W.clone().requires_grad_()
            L = _untied_input_loss(W_e, W_d, i, xi)
            grad_e, grad_d = torch.autograd.grad(L, (W_e, W_d))
            projection = W[i] @ xi  # W_i·ξ = ε_i, the error on output i
            assert L.item() == pytest.approx(projection.item() ** 2, abs=1e-15)
            others = [j for j in range(features) if j != i]
            # ∂L/∂W^d_i = 2(W_i·ξ)(W_i + ξ); no other decoder row moves
            torch.testing.assert_close(grad_d[i], 2 * projection * (W[i] + xi), **tol)
            assert grad_d[others].abs().max() < 1e-15
            # ∂L/∂W^e_i = 2(W_i·ξ) W_i; no other encoder row moves
            torch.testing.assert_close(grad_e[i], 2 * projection * W[i], **tol)
            assert grad_e[others].abs().max() < 1e-15
            # together 2(W_i·ξ)(2W_i + ξ), toycore's one_input_gradient
            torch.testing.assert_close(
                grad_d[i] + grad_e[i], th.one_input_gradient(W[i], xi), **tol
            )
            # not vacuous: both halves are there
            assert grad_e[i].norm() > 1e-3 * sigma and (grad_d[i] - grad_e[i]).norm() > 1e-3 * sigma
            total_d += grad_d
            total_e += grad_e
            total_loss += L.item()
        # the training step sums the n inputs with the two copies tied: its gradient is the sum
        # of the decoder and encoder gradients, row i being input i's alone
        assert loss.item() == pytest.approx(total_loss, abs=1e-13)
        torch.testing.assert_close(grad, total_d + total_e, **tol)
        torch.testing.assert_close(grad, th.one_input_gradient(W, xi), **tol)


def test_appendix_c_gradients_need_unit_encodings_the_error_is_the_general_factor():
    """Off ‖W_i‖ = 1 the error on output i is ε_i = ‖W_i‖² - 1 + W_i·ξ, not W_i·ξ: the split
    2ε_i(W_i + ξ) + 2ε_i W_i holds, the appendix's 2(W_i·ξ)(2W_i + ξ) does not."""
    W, sigma = 1.1 * _appendix_c_encodings(), 0.1
    draws = _appendix_c_draws(sigma)
    _, step_grad = _step_losses(W.expand(len(draws), -1, -1), draws)
    for xi, grad in zip(draws, step_grad):
        for i in range(3):
            W_e = W.clone().requires_grad_()
            W_d = W.clone().requires_grad_()
            grad_e, grad_d = torch.autograd.grad(_untied_input_loss(W_e, W_d, i, xi), (W_e, W_d))
            error = W[i] @ W[i] - 1 + W[i] @ xi
            torch.testing.assert_close(grad_d[i], 2 * error * (W[i] + xi), rtol=0, atol=1e-13)
            torch.testing.assert_close(grad_e[i], 2 * error * W[i], rtol=0, atol=1e-13)
            torch.testing.assert_close(grad[i], grad_d[i] + grad_e[i], rtol=0, atol=1e-13)
            assert (grad[i] - th.one_input_gradient(W[i], xi)).norm() > 0.1


def test_the_fresh_noise_term_is_sigma_squared_times_the_stepped_norm_exactly():
    """E_ξ′[(W′·ξ′)²] = W′ᵀ E[ξ′ξ′ᵀ] W′ = σ²‖W′‖² for W′ = W_i - 2η(W_i·ξ)(2W_i + ξ), any W′:
    exactly by enumerating bipolar ξ′ ∈ {±σ}⁴, and for Gaussian ξ′ by a 3-point Gauss–Hermite
    rule per coordinate, exact for the degree-2 polynomial (the 2-point rule is ±1 with weights
    ½: bipolar enumeration itself). Through the model, the expected next-step loss on the data set
    splits as the text says: Σ_i (‖W′_i‖² - 1)² + σ²‖W′_i‖², the cross term averaging to 0."""
    W, sigma, lr = _appendix_c_encodings(), 0.1, 0.05
    draws = _appendix_c_draws(sigma)
    _, grads = _step_losses(W.expand(len(draws), -1, -1), draws)
    stepped = W - lr * grads  # (draws, 3, 4): one SGD step per old ξ
    for xi, W_next in zip(draws, stepped):
        torch.testing.assert_close(
            W_next, W - 2 * lr * (W @ xi)[:, None] * (2 * W + xi), rtol=0, atol=1e-14
        )
    norms = stepped.square().sum(-1)  # ‖W′_i‖², (draws, 3)
    assert (norms - 1).abs().max() > 1e-3  # the step does change the norms

    bipolar = sigma * torch.tensor(
        list(itertools.product((-1.0, 1.0), repeat=4)), dtype=torch.float64
    )
    nodes, weights = np.polynomial.hermite_e.hermegauss(3)  # ∫ f(z) e^{-z²/2} dz
    weights = weights / weights.sum()  # against N(0, 1): 2/3 at 0, 1/6 at ±√3
    grid = torch.tensor(list(itertools.product(nodes, repeat=4)), dtype=torch.float64)
    gaussian = sigma * grid
    gaussian_w = torch.tensor(
        [np.prod(p) for p in itertools.product(weights, repeat=4)], dtype=torch.float64
    )
    assert gaussian_w.sum().item() == pytest.approx(1, abs=1e-15)
    identity = sigma**2 * torch.eye(4, dtype=torch.float64)
    # the covariance both laws share, E ξ′ξ′ᵀ = σ² I, which is all the identity uses
    torch.testing.assert_close(bipolar.T @ bipolar / len(bipolar), identity, rtol=0, atol=1e-15)
    torch.testing.assert_close(
        gaussian.T @ (gaussian_w[:, None] * gaussian), identity, rtol=0, atol=1e-15
    )
    # and the Gaussian rule is exact for the fourth moment too, unlike bipolar: 3σ⁴ against σ⁴
    assert (gaussian_w * gaussian[:, 0] ** 4).sum().item() == pytest.approx(3 * sigma**4, rel=1e-12)
    assert (bipolar[:, 0] ** 4).mean().item() == pytest.approx(sigma**4, rel=1e-12)

    projections = stepped @ bipolar.T  # (draws, 3, 16): W′_i·ξ′
    torch.testing.assert_close(projections.square().mean(-1), sigma**2 * norms, rtol=1e-12, atol=0)
    projections = stepped @ gaussian.T
    torch.testing.assert_close(
        (projections.square() * gaussian_w).sum(-1), sigma**2 * norms, rtol=1e-12, atol=0
    )
    # through the model's own step, over every fresh bipolar ξ′ (the ReLUs as assumed throughout)
    for W_next, norm in zip(stepped, norms):
        P = W_next @ W_next.T + (bipolar @ W_next.T)[:, :, None]  # (16, 3, 3)
        assert (P.diagonal(dim1=-2, dim2=-1) > 0).all()
        assert (P - torch.diag_embed(P.diagonal(dim1=-2, dim2=-1)) < 0).sum() == 16 * 6
        losses, _ = _step_losses(W_next.expand(len(bipolar), -1, -1), bipolar)
        split = ((norm - 1) ** 2 + sigma**2 * norm).sum()
        assert losses.mean().item() == pytest.approx(split.item(), rel=1e-12)
