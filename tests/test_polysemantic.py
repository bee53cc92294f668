import dataclasses

import numpy as np
import pytest
import torch

from toycore import devices, words
from toycore.experiments import polysemantic as ex
from toycore.models import TiedBasisAutoencoder, gram, tied_basis_reference_loss
from toycore.theory import polysemantic as th
from toycore.train import train


@pytest.mark.parametrize("features, hidden", [(6, 10), (300, 320)])  # 300 uses the blocked Gram
def test_closed_form_loss_and_gradient_match_autograd(features, hidden):
    l1 = torch.tensor([0.0, 1e-3, 0.05], dtype=torch.float64, device=devices.current())
    model = TiedBasisAutoencoder(features, hidden, [1, 2, 3], l1, dtype=torch.float64)
    loss = model.loss_and_grad()
    W = model.W.detach().clone().requires_grad_(True)
    reference = tied_basis_reference_loss(W, l1)
    reference.sum().backward()
    torch.testing.assert_close(loss, reference.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model.W.grad, W.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(model.loss(), loss)


def test_blocked_gram_is_the_full_product():
    W = torch.randn(2, 257, 40, dtype=torch.float64)
    torch.testing.assert_close(gram(W), W @ W.transpose(-1, -2), rtol=0, atol=1e-12)


def test_tied_model_trains_with_the_shared_loop_and_refuses_bad_sizes():
    model = TiedBasisAutoencoder(8, 16, [0, 1], 1e-3)
    history = train(model, None, steps=300, lr=1e-2, optimizer="adam", record_at=[0, 300])
    assert history.loss.shape == (2, 2)
    assert (history.loss[-1] < 0.3 * history.loss[0]).all()
    with pytest.raises(ValueError, match="hidden must be >= features"):
        TiedBasisAutoencoder(8, 4, [0], 1e-3)
    with pytest.raises(ValueError, match="l1"):
        TiedBasisAutoencoder(8, 8, [0, 1], [1e-3])
    with pytest.raises(ValueError, match="l1"):
        TiedBasisAutoencoder(8, 8, [0], -1.0)


def test_exact_solutions():
    assert th.reconstruction_loss(th.monosemantic(6, 9)) == 0
    opposite = th.paired(6, 9, sign=-1)
    assert th.reconstruction_loss(opposite) == 0
    assert th.count_polysemantic(opposite) == 3
    assert th.reconstruction_loss(th.paired(6, 9, sign=1)) == 6  # 2 per same-sign pair
    with pytest.raises(ValueError, match="even"):
        th.paired(5, 9)
    with pytest.raises(ValueError, match="hidden must be >= features"):
        th.monosemantic(5, 4)


def test_polysemantic_counter_on_hand_built_matrices():
    W = torch.zeros(5, 4)
    W[0, 0], W[1, 0] = 1.0, -0.9  # neuron 0: two features in [0.8, 1.2]
    W[2, 1], W[3, 1] = 1.0, 0.5  # neuron 1: the second weight is too small
    W[4, 2], W[0, 2] = 1.25, 1.0  # neuron 2: 1.25 is too large
    W[1, 3], W[2, 3], W[3, 3] = 0.8, 1.2, -1.0  # neuron 3: three features, both ends included
    assert th.polysemantic_neurons(W).tolist() == [True, False, False, True]
    assert th.count_polysemantic(torch.stack([W, torch.eye(5, 4)])).tolist() == [2, 0]
    assert th.crowded_neurons(W).tolist() == [False, False, False, True]
    assert not th.crowded_neurons(th.paired(6, 9, sign=-1)).any()  # zero loss: at most two


def test_fast_sparsification_equals_plain_euler():
    initial = ex.initial_encoding(400, seed=3)
    plain = ex.euler_sparsification(initial, 2e-3, 0.5, 3000)
    fast = ex.simulate_sparsification(initial, 2e-3, 0.5, 3000)
    np.testing.assert_allclose(fast.l1_norm, plain.sum(1), rtol=1e-10)
    np.testing.assert_allclose(fast.norm, (plain**2).sum(1), rtol=1e-10)
    assert np.array_equal(fast.nonzero, (plain > 0).sum(1))
    assert fast.nonzero[-1] == 1 and fast.nonzero[0] == 400


def test_the_simulated_relative_variance_lies_between_appendix_b_s_bounds():
    """Figure 7's orange curve within its red ones, on runs short enough for a test, and a
    start whose bounds were swapped for another seed's is caught outside them."""
    from types import SimpleNamespace

    runs = [
        ex.simulate_sparsification(ex.initial_encoding(400, s), 2e-3, 0.5, 3000) for s in (0, 1)
    ]
    assert np.all(ex.share_inside_bounds(SimpleNamespace(runs=runs)) == 1.0)
    swapped = SimpleNamespace(runs=[dataclasses.replace(runs[0], initial=runs[1].initial)])
    assert ex.share_inside_bounds(swapped)[0] < 1.0


@pytest.mark.parametrize("hidden, l1", [(2_000, 1e-3), (20_000, 1e-4)])
def test_sparsification_goes_through_the_three_phases(hidden, l1):
    run = ex.simulate_sparsification(ex.initial_encoding(hidden, 0), l1, 0.5, int(8 / l1))
    law, _ = th.sparsification_law(run.time, hidden, l1)
    start = run.time <= 0.1 / (l1 * hidden**0.5)
    # phase 1: ‖w‖₁ still of order √m
    assert np.all(np.abs(np.log(run.l1_norm[start] / law[start])) < np.log(1.5))
    # phase 2 (Appendix B's form, which holds at small m too): 1/‖w‖₁ = 1/√m + Θ(λ t)
    middle = run.time <= 0.3 / l1
    fit = np.polyfit(run.time[middle], 1 / run.l1_norm[middle], 1)
    residual = 1 / run.l1_norm[middle] - np.polyval(fit, run.time[middle])
    assert 0.5 < fit[0] / l1 < 2
    assert np.abs(residual).max() < 0.1 * (1 / run.l1_norm[middle]).max()
    # phase 3: one weight of size about 1, reached at t = Θ(1/λ)
    assert run.nonzero[-1] == 1 and abs(run.l1_norm[-1] - 1) < 10 * l1
    assert 0.3 < l1 * run.time[np.argmax(run.nonzero == 1)] < 3


def test_the_law_at_several_sizes_measures_each_seed_s_own_run(monkeypatch):
    hiddens, l1, dt = [400, 1600], 1e-3, 0.5
    sizes = ex.law_at_sizes.uncached(hiddens, l1, range(3), dt=dt)
    # by hand, for the larger m (its own seeds 3, 4, 5): r = |w|_1 (1/√m + λt) on each seed's
    # run, up to t = 1/λ
    assert ex.size_seeds(range(3), 1) == [3, 4, 5]
    runs = [
        ex.simulate_sparsification(ex.initial_encoding(1600, s), l1, dt, int(1 / (l1 * dt)))
        for s in (3, 4, 5)
    ]
    t = runs[0].time
    r = np.array([run.l1_norm * (1600**-0.5 + l1 * t) for run in runs])
    start, late = np.searchsorted(t, [1 / (l1 * 40), 0.1 / l1])
    assert sizes.start_spread[-1] == pytest.approx(np.log(r[:, start]).std(ddof=1))
    assert sizes.late_spread[-1] == pytest.approx(np.log(r[:, late]).std(ddof=1))
    assert sizes.late_survivors[-1] == np.mean([run.nonzero[late] for run in runs])
    assert sizes.start_share[-1] == np.mean([run.nonzero[start] for run in runs]) / 1600
    whole = (t >= 1 / (l1 * 40)) & (t <= 1 / l1)
    assert sizes.extreme[-1] == pytest.approx(np.maximum(r, 1 / r)[:, whole].max())
    assert sizes.seeds == 3
    # two spreads of one normal law, 8 samples each: F(0.975; 7, 7) = 4.99
    assert np.exp(2 * ex.spread_ratio_tolerance(8)) == pytest.approx(4.99, abs=0.01)
    # bad input is refused before any simulation runs
    monkeypatch.setattr(ex, "simulate_sparsification", None)
    for bad, message in (
        (dict(seeds=[0]), "at least 2 seeds and 2 sizes"),
        (dict(hiddens=[400]), "at least 2 seeds and 2 sizes"),
        (dict(hiddens=[50, 400]), "hidden must be an integer >= 100"),
        (dict(dt=0.0), "dt must be"),
    ):
        given = dict(hiddens=hiddens, l1=l1, seeds=range(3), dt=dt) | bad
        with pytest.raises(ValueError, match=message):
            ex.law_at_sizes.uncached(**given)


def test_shares_in_words_give_one_share_where_they_round_alike():
    assert words.share_range([0.4695, 0.4702]) == "47%"
    assert words.share_range([0.45, 0.494]) == "45% to 49%"


def test_relative_variance_bounds_and_percentiles():
    w = np.array([4.0, 3.0, 2.0, 1.0])
    lower, upper = th.relative_variance_bounds(w)
    # m' = 2: values (4, 3); variance 0.25; shifted by w3 = 2 -> mean 1.5, by w2 = 3 -> mean 0.5
    assert lower[1] == pytest.approx(0.25 / 1.5**2) and upper[1] == pytest.approx(0.25 / 0.5**2)
    assert th.relative_variance(w) == pytest.approx(1.25 / 2.5**2)
    ideal = th.regular_percentiles(10_001, 1.0)
    assert ideal[5000] == pytest.approx(0.6744897, rel=1e-4)  # median of |N(0, 1)|
    assert np.all(np.diff(ideal) < 0)


def test_threshold_marks_growing_weights_without_interference():
    # one encoding (n = 1, so no interference): d|W_k|/dt has the sign of |W_k| - θ
    model = TiedBasisAutoencoder(1, 50, [4], 0.02, init_std=0.1, dtype=torch.float64)
    model.loss_and_grad()
    W = model.W.detach()
    theta = th.threshold(W.square().sum(-1), 0.02)
    growing = -(model.W.grad * W.sign()) > 0
    assert torch.equal(growing, W.abs() > theta[..., None])


def test_the_gradient_is_the_texts_three_forces_and_collisions_act_as_it_says():
    # §2: -∇_{W_i} L = 4[(1 - |W_i|²) W_i - Σ_{j≠i} ReLU(W_i·W_j) W_j] - λ sign(W_i) (the 4 is
    # this loss's constant, summed over both orders of each pair). §2.1: when W_i and W_j share
    # one nonzero coordinate k, the interference acts on W_ik alone, with -W_ik W_jk² (and
    # -W_ik² W_jk on W_jk) for the same sign, and not at all for opposite signs.
    l1 = 1e-3
    for sign, shrinks in ((1, True), (-1, False)):
        W = torch.zeros(1, 2, 5, dtype=torch.float64)
        W[0, 0, :3] = torch.tensor([0.7, -0.3, 0.5])  # feature i = 0 on neurons 0..2
        W[0, 1, 2:] = torch.tensor([sign * 0.6, 0.4, 0.1])  # feature j = 1 shares k = 2 only
        W.requires_grad_(True)
        tied_basis_reference_loss(W, l1).sum().backward()
        w = W.detach()[0]
        benefit = (1 - w.square().sum(-1, keepdim=True)) * w
        interference = torch.relu(w @ w.T).fill_diagonal_(0) @ w
        forces = 4 * (benefit - interference) - l1 * w.sign()
        torch.testing.assert_close(-W.grad[0], forces, rtol=1e-12, atol=1e-12)
        k, (i, j) = 2, (0, 1)
        on_i = -4 * w[i, k] * w[j, k] ** 2 if shrinks else torch.tensor(0.0, dtype=w.dtype)
        on_j = -4 * w[i, k] ** 2 * w[j, k] if shrinks else torch.tensor(0.0, dtype=w.dtype)
        torch.testing.assert_close(-4 * interference[i, k], on_i, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(-4 * interference[j, k], on_j, rtol=1e-12, atol=1e-12)
        # of each encoding's own nonzero coordinates, only k feels the interference
        touched = (interference != 0) & (w != 0)
        assert touched.nonzero()[:, 1].tolist() == ([k, k] if shrinks else [])
        assert (on_i * w[i, k] < 0) == shrinks and (on_j * w[j, k] < 0) == shrinks


def test_forced_collisions_share_the_largest_coordinate():
    initial = ex.initial_weights(6, 20, [0, 1, 2])
    benign, malign, k = ex.forced_collisions(initial, lead=1.5)
    rows = torch.arange(3)
    for start, sign in ((benign, -1), (malign, 1)):
        assert torch.equal(start[:, 0].abs().argmax(-1), k)
        assert torch.equal(start[:, 1].abs().argmax(-1), k)
        assert torch.all(start[rows, 0, k].sign() * start[rows, 1, k].sign() == sign)
        assert torch.equal(start[:, 2:], initial[:, 2:])
    assert torch.allclose(benign[rows, 0, k], 1.5 * initial[rows, 0, k])


def test_forced_collisions_alone_leave_the_two_rows_sharing_only_k():
    initial = ex.initial_weights(2, 20, [0, 1, 2])
    benign, malign, k = ex.forced_collisions(initial, lead=1.5, alone=True)
    together, _, _ = ex.forced_collisions(initial, lead=1.5)
    rows = torch.arange(3)
    for start, sign in ((benign, -1), (malign, 1)):
        assert torch.all(start[rows, 0, k].sign() * start[rows, 1, k].sign() == sign)
        both = (start[:, 0] != 0) & (start[:, 1] != 0)  # (seeds, m)
        assert torch.equal(both.nonzero()[:, 1], k)  # one shared coordinate per seed: k
        assert torch.equal(start[:, 0].abs().argmax(-1), k)
        assert torch.equal(start[:, 1].abs().argmax(-1), k)
    # besides k, each row is the one that shares every coordinate, on its own half
    odd = torch.arange(20) % 2 == 1
    kept = together.clone()
    kept[:, 0, odd] = 0
    kept[:, 1, ~odd] = 0
    kept[rows, :, k] = together[rows, :, k]
    assert torch.equal(benign, kept)
    kept[rows, 1, k] = -kept[rows, 1, k]  # the malign start: the other sign at k
    assert torch.equal(malign, kept)


def test_start_ratios_and_closer_to_a_tie_a_one_sided_rank_test_empty_groups_no_evidence():
    ratios = np.array([0.99, 0.98, 0.97, 0.6, 0.5, 0.7, 0.65, 0.55])
    ties = np.array([True, True, True, False, False, False, False, False])
    assert ex.closer_to_a_tie(ratios, ties, ~ties) < 0.05
    assert ex.closer_to_a_tie(ratios, ~ties, ties) > 0.95  # one-sided
    assert ex.closer_to_a_tie(ratios, np.zeros(8, bool), ties) == 1.0
    assert ex.closer_to_a_tie(ratios, ties, np.zeros(8, bool)) == 1.0
    with pytest.raises(ValueError, match="boolean mask"):
        ex.closer_to_a_tie(ratios, [0, 1, 2], ties)  # positions, not a mask
    with pytest.raises(ValueError, match="boolean mask"):
        ex.closer_to_a_tie(ratios, ties[:4], ties)
    start = torch.tensor([[0.5, 0.7], [0.7, 0.7], [-0.2, -0.8]])
    runs = ex.Collisions(time=np.array([0.0]), shared={"malign": start[None]})
    np.testing.assert_allclose(ex.start_ratios(runs), [5 / 7, 1.0, 0.25])


def test_split_neurons_keeps_the_gram_matrix():
    W = th.paired(4, 6, sign=-1)[None].clone()
    starts, features, source, columns = ex.split_neurons(W, noise=0.0, seed=0)
    assert starts.shape == (2, 4, 7) and source.tolist() == [0, 0]
    assert features.tolist() == [[0, 1], [2, 3]] and columns.tolist() == [0, 1]
    for start in starts:
        torch.testing.assert_close(start @ start.T, W[0] @ W[0].T)
    with pytest.raises(ValueError, match="no polysemantic neuron"):
        ex.split_neurons(th.monosemantic(4, 6)[None], noise=0.01, seed=0)


def test_split_neurons_draws_at_most_per_model_of_each_models_neurons():
    W = torch.stack([th.paired(6, 8, sign=-1), th.paired(4, 8, sign=-1)[[0, 1, 2, 3, 0, 1]]])
    every, _, source, _ = ex.split_neurons(W, noise=0.01, seed=0)
    assert source.tolist() == [0, 0, 0, 1, 1]  # 3 and 2 polysemantic neurons
    starts, features, source, _ = ex.split_neurons(W, noise=0.01, seed=0, per_model=2)
    assert source.tolist() == [0, 0, 1, 1]
    for start, pair in zip(starts, features):  # each a split of a neuron the two features shared
        assert torch.equal(start[pair[0], -1].abs() > 0.5, start[pair[1], -1].abs() > 0.5)
    again = ex.split_neurons(W, noise=0.01, seed=0, per_model=2)[0]
    assert torch.equal(starts, again)  # the draw is seeded
    # model 1 keeps both its neurons: its runs do not depend on model 0's draw
    torch.testing.assert_close(starts[2:], every[3:])


def test_winner_statistics_on_a_known_case():
    initial = torch.tensor([[[0.9, 0.1, 0.0], [-0.8, 0.2, 0.0], [0.0, 0.3, 0.1]]])
    final = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]])
    stats = ex.winner_statistics(initial, final)
    assert stats.rank_counts.tolist() == [2, 1, 0]  # features 0 and 2 won their largest
    assert stats.largest_collide == pytest.approx(1 / 3)  # pair (0, 1) shares coordinate 0 ...
    assert stats.opposite_given_collide == 1.0  # ... with opposite signs
    assert stats.winners_collide == pytest.approx(1 / 3)  # pair (1, 2) ends on neuron 1
    pooled = ex.pooled_collisions([stats, stats], seeds=1)
    assert (pooled.observed, pooled.expected) == pytest.approx((2, 2))  # 3 pairs / m = 3, twice
    assert pooled.opposite == 1.0 and pooled.winners.tolist() == pytest.approx([2, 2])


def test_bad_ode_input_is_refused():
    with pytest.raises(ValueError, match="positive"):
        ex.simulate_sparsification([0.1, -0.2], 1e-3, 0.5, 10)
    with pytest.raises(ValueError, match="dt"):
        ex.simulate_sparsification([0.1, 0.2], 1e-3, 2.0, 10)
    with pytest.raises(ValueError, match="l1"):
        ex.simulate_sparsification([0.1, 0.2], 0.0, 0.5, 10)


def test_untied_loss_is_the_tied_one_when_the_decoder_is_the_encoder():
    model = ex.UntiedBasisAutoencoder(5, 7, [0, 1], l1=0.03, device="cpu")
    W = model.E.detach().clone()
    with torch.no_grad():
        model.D.copy_(W)
    torch.testing.assert_close(model.loss(), tied_basis_reference_loss(W, 0.03))
    assert ex.untied_distance(W, W).tolist() == [0.0, 0.0]


def test_rotated_inputs_follow_the_basis_path_under_gradient_descent_only():
    descent = ex.rotation_run.__wrapped__(6, 12, [0, 1], 0.01, steps=200, lr=0.05, optimizer="sgd")
    assert descent.distance.max() < 1e-12 and descent.loss_gap.max() < 1e-12
    adam = ex.rotation_run.__wrapped__(6, 12, [0, 1], 0.01, steps=200, lr=0.01, optimizer="adam")
    assert adam.distance.min() > 1e-3
    Q = ex.random_rotation(6, seed=0)
    torch.testing.assert_close(Q @ Q.T, torch.eye(6, dtype=torch.float64))


def test_initial_interference_and_benefit_match_their_expectations():
    forces = ex.initial_forces(16, [64, 256], range(64), std_scale=0.9)
    # mean of Σ_j ReLU(W_i·W_j)² is (n - 1) s⁴ / (2m); the benefit s²(1 - s²) up to O(1/m)
    expected = 15 * 0.9**4 / (2 * forces.hiddens)
    np.testing.assert_allclose(forces.interference, expected, rtol=0.1)
    np.testing.assert_allclose(forces.benefit, 0.81 * 0.19, atol=0.03)
    assert ex.log_slope(forces.hiddens, forces.interference) == pytest.approx(-1, abs=0.1)


def test_the_interference_force_lies_mostly_across_its_encoding():
    # along W_i its terms add up, across it like a random walk: 1/(1 + 2m/(n-1)) along
    forces = ex.initial_forces(16, [16, 64], range(64), std_scale=0.9)
    np.testing.assert_allclose(forces.along, ex.along_prediction(16, forces.hiddens), rtol=0.1)
    assert forces.along.max() < 0.5  # never 'primarily' along W_i, from m = n on
    assert ex.along_prediction(16, [16]) == pytest.approx([1 / (1 + 32 / 15)])


def test_predicted_overlap_rate_on_a_hand_built_pair():
    W = torch.tensor([[[1.0, 0.0], [0.6, 0.8]]], dtype=torch.float64)  # W_0·W_1 = 0.6 > 0
    assert ex.predicted_overlap_rate(W).tolist() == pytest.approx([4 * (1 + 1)])
    W[0, 1] = torch.tensor([-0.6, 0.3])  # no positive pair left but one: weights cancel
    W = torch.cat([W, torch.tensor([[[0.5, 0.0]]], dtype=torch.float64)], dim=1)
    assert ex.predicted_overlap_rate(W).tolist() == pytest.approx([4 * (1 + 0.25)])


def test_overlap_decay_reads_the_rates_and_the_crossing_on_hand_built_records():
    time = np.array([0.0, 0.25, 0.5, 1.0])
    # two seeds, each halving per record until the third, where the mean first goes below zero
    overlap = np.array([[0.4, 0.2], [0.2, 0.1], [0.1, 0.05], [-0.1, 0.02]])
    flow = ex.GradientFlow(8, 8, np.arange(2), 0.01, time, np.zeros((2, 8, 8)), overlap, overlap)
    decay = ex.overlap_decay(flow)
    assert decay.first_time == 0.25
    np.testing.assert_allclose(decay.first_rate, [4 * np.log(2)] * 2)
    np.testing.assert_allclose(decay.half_rate, [4 * np.log(2)] * 2)
    assert (decay.cross_time, decay.cross_last) == (1.0, pytest.approx(0.075))
    # a run whose mean overlap never reaches zero has no crossing, not the first record's time
    flow = dataclasses.replace(flow, overlap=np.abs(overlap))
    decay = ex.overlap_decay(flow)
    assert np.isnan(decay.cross_time) and np.isnan(decay.cross_last)


def test_overlap_rate_starts_near_the_pair_prediction():
    run = ex.overlap_rate.__wrapped__(16, 64, [0, 1], 0.01, lr=1e-3, steps=30)
    np.testing.assert_allclose(run.measured, run.predicted, rtol=0.25)
    assert run.time == pytest.approx(0.03)


def test_persistence_reads_the_law_and_refuses_a_short_sweep():
    W = [th.paired(4, m, sign=-1)[None].repeat(3, 1, 1).numpy() for m in (4, 16)]
    sweep = ex.PolysemanticSweep(
        features=4,
        hiddens=np.array([4, 16]),
        seeds=np.arange(3),
        l1=1e-3,
        W=W,
        counts=np.array([[2, 2, 2], [2, 0, 2]]),
        paths=[],  # persistence reads no winners
    )
    result = ex.persistence(sweep)
    assert result.expected.tolist() == pytest.approx([6 / 8, 6 / 32])
    assert result.share.tolist() == pytest.approx([1, 2 / 3])
    assert result.represented.tolist() == [1.0, 1.0]
    assert result.observed_last == 4 and result.expected_last == pytest.approx(3 * 6 / 32)
    short = ex.PolysemanticSweep(4, np.array([4, 8]), np.arange(3), 1e-3, W, sweep.counts, [])
    with pytest.raises(ValueError, match="n²"):
        ex.persistence(short)


def test_the_law_fit_reads_the_constant_at_each_m_alike_and_pooled():
    # counts (hiddens, seeds) written out by hand for n = 8, m = 4, 16, 64 (n²/m = 16, 4, 1)
    counts = np.array([[4, 4], [2, 0], [1, 1]])
    sweep = ex.PolysemanticSweep(8, np.array([4, 16, 64]), np.arange(2), 1e-3, [], counts, [])
    fit = ex.law_fit(sweep)
    # each m alone: mean count / (n²/m)
    assert fit.per_m.tolist() == pytest.approx([4 / 16, 1 / 4, 1 / 1])
    # each seed: count / x averaged over m, each m alike (x = n²/m = 16, 4, 1)
    seed_0, seed_1 = (4 / 16 + 2 / 4 + 1 / 1) / 3, (4 / 16 + 0 / 4 + 1 / 1) / 3
    assert fit.per_seed.tolist() == pytest.approx([seed_0, seed_1])
    assert fit.constant == pytest.approx((seed_0 + seed_1) / 2)
    exact = dataclasses.replace(sweep, counts=np.array([[4, 4], [1, 1]]), hiddens=np.array([4, 16]))
    exact_fit = ex.law_fit(exact)  # counts exactly n²/(4m): every reading gives 1/4
    assert exact_fit.per_m.tolist() == pytest.approx([0.25, 0.25])
    assert exact_fit.constant == pytest.approx(0.25) and exact_fit.slope == pytest.approx(-1)


def test_phases_compare_the_slope_with_the_law_and_check_the_balance():
    result = ex.sparsification_runs.__wrapped__(20_000, 1e-4, [0], dt=0.5, steps=50_000)
    phases = ex.sparsification_phases(result)
    # over [1/(λ√m), 1/λ] the law bends from slope -1/2 to -1: its fit lies between
    assert -1 < phases.law_slope[0] < -0.5
    assert phases.quasi_static[0] < 0.1  # 1 - |w|² ≈ λ|w|_1/|w|² once the fast phase is over
    assert 1 <= phases.proxy[0] <= phases.proxy[1]


def test_the_untied_model_on_the_basis_skips_the_identity_product_bit_for_bit():
    """On the basis the activations are E itself; the same model handed the identity as its
    inputs computes them as a product. Loss and gradients agree exactly, with the l1 term."""
    basis = ex.UntiedBasisAutoencoder(12, 20, [0, 1, 2], 0.01)
    product = ex.UntiedBasisAutoencoder(12, 20, [0, 1, 2], 0.01, inputs=torch.eye(12))
    assert basis.basis and not product.basis
    results = []
    for model in (basis, product):
        loss = model.loss()
        results.append([loss, *torch.autograd.grad(loss.sum(), [model.E, model.D])])
    for ours, reference in zip(*results):
        assert torch.equal(ours, reference)


def test_the_coupling_of_a_split_s_two_races_is_zero_when_they_are_independent():
    # leads on k (column 0) or on the copy (the last column), for the two features
    starts = torch.zeros(4, 2, 3)
    starts[:, :, 0] = torch.tensor([[0.8, 0.8], [0.6, 0.6], [0.8, 0.6], [0.6, 0.8]])
    starts[:, :, -1] = 1.4 - starts[:, :, 0]
    features, columns = torch.tensor([[0, 1]] * 4), torch.zeros(4, dtype=torch.long)
    assert ex.shared_leads(starts, features, columns).tolist() == [True, True, False, False]
    # independent races in which each lead holds with probability q: both rates add to 1
    rng = np.random.default_rng(0)
    q, count = 0.8, 40_000
    shared = rng.random(count) < 0.5
    kept = rng.random((count, 2)) < q
    separated = np.where(shared, kept[:, 0] != kept[:, 1], kept[:, 0] == kept[:, 1])
    found = ex.split_coupling(separated, shared)
    assert abs(found.excess) < 3 * found.se and found.together == pytest.approx(
        2 * q * (1 - q), abs=0.01
    )
    # a copy ahead in both races that loses one of them more often: coupled towards separation
    separated = np.where(shared, separated | (rng.random(count) < 0.3), separated)
    coupled = ex.split_coupling(separated, shared)
    assert coupled.excess > 10 * coupled.se
    with pytest.raises(ValueError, match="same and on different copies"):
        ex.split_coupling(separated[:3], np.ones(3, dtype=bool))


def test_where_the_benefit_outweighs_the_interference_in_words():
    hiddens = [64, 128, 256, 512]
    words = ex.dominance_words(hiddens, 64, [0.32, 0.16, 0.08, 0.04], [0.13, 0.14, 0.15, 0.15])
    assert words == "from m = 4n on; at m = n the interference, 0.320, is above the benefit, 0.130"
    assert ex.dominance_words(hiddens, 64, [0.1] * 4, [0.2] * 4).startswith("at every m")
    assert ex.dominance_words(hiddens, 64, [0.3] * 4, [0.2] * 4).startswith("at no m")
    # not from some m on: each m where it does
    mixed = ex.dominance_words(hiddens, 64, [0.3, 0.1, 0.3, 0.1], [0.2] * 4)
    assert mixed.startswith("at m = 2n, 8n;")


def test_the_two_starts_bounds_differ_only_where_the_starts_do():
    """Figure 7's red and pink curves: Appendix B's bounds from a seed's start against those
    from the regular-percentile start. A seed whose start is the percentiles' has no gap."""
    from types import SimpleNamespace

    ideal = SimpleNamespace(initial=th.regular_percentiles(1000, 0.03))
    same = SimpleNamespace(hidden=1000, ideal=ideal, runs=[ideal])
    survivors, gap = ex.percentile_gap(same, points=20)
    assert survivors[0] == 2 and survivors[-1] == 1000 and gap.shape == (1, len(survivors))
    assert np.all(gap == 0)
    drawn = SimpleNamespace(initial=np.abs(np.random.default_rng(0).normal(0, 0.03, 1000)))
    survivors, gap = ex.percentile_gap(SimpleNamespace(hidden=1000, ideal=ideal, runs=[drawn]))
    assert np.all(gap > 0)
    assert ex.percentile_gap_words(survivors, gap).startswith("grows as m' shrinks: ")


def test_a_course_is_read_step_by_step():
    from toycore.words import course

    assert course([1, 2, 3]) == 1 and course([3, 2, 1]) == -1 and course([1, 3, 2]) == 0
    assert course([1, 1]) == 0 and course([1]) is None and course({4: 1, 5: 2}.values()) == 1


def test_figure_3_at_the_authors_sixteen_sizes_labels_only_the_doublings():
    from types import SimpleNamespace

    from toycore.plots import polysemantic as plots

    def figure_3(ms):
        counts = np.random.default_rng(0).poisson(64**2 / (4 * ms[:, None]), (len(ms), 4))
        sweep = SimpleNamespace(features=64, hiddens=ms, l1=1e-3, counts=counts)
        fit = SimpleNamespace(constant=0.25, interval=(0.2, 0.3))
        ax = plots.polysemantic_law(sweep, fit).axes[0]
        seeds_x = ax.collections[0].get_offsets()[:, 0].reshape(len(ms), -1)
        return [t.get_text() for t in ax.get_xticklabels()], seeds_x, ax.get_ylim()[0]

    labels, seeds_x, bottom = figure_3(np.arange(64, 1025, 64))
    assert labels == ["64", "128", "", "256", "", "", "", "512"] + [""] * 7 + ["1024"]
    # each size's seeds stay nearer their own size than the next one's
    assert np.all(seeds_x.max(1)[:-1] < seeds_x.min(1)[1:])
    labels, _, bottom = figure_3(np.array([64, 128, 256, 512, 1024]))
    assert labels == ["64", "128", "256", "512", "1024"] and bottom == 0


def test_sizes_in_words_name_an_even_step_and_list_the_rest():
    from toycore.words import size_list

    assert size_list(range(256, 4097, 256)) == "256 to 4096 in steps of 256"
    assert size_list([64, 128, 256, 512, 1024]) == "64, 128, 256, 512, 1024"
    assert size_list([64, 128]) == "64, 128"


def test_malign_keepers_names_whether_the_larger_start_kept_the_neuron():
    # three seeds' malign runs, start then end: feature 1 starts larger and keeps it; feature
    # 0 starts larger but feature 1 keeps it; both decay (no keeper, left out)
    start = torch.tensor([[0.5, 0.7], [0.7, 0.5], [0.6, 0.6]])
    end = torch.tensor([[0.0, 1.0], [0.0, 0.9], [0.1, 0.0]])
    benign = torch.zeros(2, 3, 2)
    runs = ex.Collisions(
        time=np.array([0.0, 1.0]),
        shared={"benign": benign, "malign": torch.stack([start, end])},
    )
    assert ex.malign_keepers(runs).tolist() == [True, False]


def test_half_dead_interpolates_in_log_lambda_and_says_never_and_already():
    bound = ex.L1Bound(
        features=4,
        hiddens=np.array([16, 64, 256]),
        multiples=np.array([1.0, 2.0, 4.0, 8.0, 16.0]),
        dead=np.array([[0, 0, 0.25, 0.75, 1], [0.6, 1, 1, 1, 1], [0, 0, 0, 0, 0.4]], dtype=float),
    )
    half = bound.half_dead()
    assert half[0] == pytest.approx(4 * np.sqrt(2))  # halfway from 0.25 to 0.75, in log λ√m
    assert half[1] == 1.0 and half[2] == np.inf
    # a falling curve, negated: the size at which a loss falls to 1.5, and one that never does
    assert ex.crossing([64, 128, 256], [-3.0, -2.0, -1.0], -1.5) == pytest.approx(
        np.sqrt(128 * 256)
    )
    assert ex.crossing([64, 128], [-3.0, -2.0], -1.0) == np.inf


def test_l1_far_above_the_bound_kills_every_encoding_and_at_it_none():
    # n = 4, m = 16: the largest of 16 initial weights is about 1.8/√m, and a weight turns to
    # growth only if 4(1 - ‖W_i‖²)|W_ik| > λ, so λ√m = 1 leaves every encoding alive and 64 kills
    bound = ex.l1_bound(4, [16], range(3), multiples=[1.0, 64.0])
    assert bound.dead.tolist() == [[0.0, 1.0]]


@pytest.mark.parametrize(
    "multiples, message",
    [([2.0, 1.0], "increase"), ([0.0, 1.0], "positive"), ([], "positive")],
)
def test_l1_bound_refuses_a_bad_grid_before_training(multiples, message):
    with pytest.raises(ValueError, match=message):
        ex.l1_bound(4, [16], range(3), multiples=multiples)


def _paths(winner, positive, hidden):
    """A WinnerPaths from (records, seeds, n) winners and signs, for the landing analysis."""
    winner, positive = np.asarray(winner), np.asarray(positive, dtype=bool)
    records, seeds, n = winner.shape
    return ex.WinnerPaths(
        features=n,
        hidden=hidden,
        seeds=np.arange(seeds),
        steps=np.arange(records) * 100,
        winner=winner,
        positive=positive,
    )


def test_landings_on_a_known_case():
    # one model, five features, five neurons, three records
    winner = [
        [[0, 1, 2, 2, 3]],  # the start
        [[0, 1, 4, 2, 3]],  # 2 moves to neuron 4, which no winner holds
        [[0, 0, 4, 1, 3]],  # 1 (negative) moves beside 0; 3 onto neuron 1, which 1 just left
    ]
    positive = [[[True, False, True, True, False]]] * 3
    landing = ex.landings(_paths(winner, positive, hidden=5))
    assert landing.moved == pytest.approx(3 / 5)
    # each landing is seen from the record before, the feature itself left out: 3 lands on
    # neuron 1, which then held 1, of the other sign, so it lands beside
    assert landing.observed.tolist() == [[1, 2, 0, 0]]  # one seed: EMPTY, BESIDE, SAME, BOTH
    # per mover, the kinds of the other four neurons then (the one it left is not counted),
    # seen with its final sign: 2 sees [S, B, -, B, E], 1 sees [B, -, B, S, B] and 3 sees
    # [S, B, -, B, S]
    assert landing.expected[0].tolist() == pytest.approx([1 / 4, 7 / 4, 4 / 4, 0])
    preference = (2 / (7 / 4)) / (1 / (1 / 4))
    assert landing.preference == pytest.approx(preference)
    assert landing.preference_se == pytest.approx(np.sqrt(1 / 2 + 1 / 1))
    # 2 landings beside, of 3 on empty or beside neurons, which are 7/4 in 8/4 of them
    assert landing.predicted == pytest.approx(2 / (3 * 7 / 8))
    # only pair (0, 1) shares its final neuron: 1 of 10 pairs, x 2m
    assert (landing.pairs.tolist(), landing.rate) == ([1], pytest.approx(1 / 10 * 2 * 5))


def test_a_feature_that_leaves_and_comes_back_lands_but_has_not_moved():
    winner = [[[0, 1, 2]], [[3, 1, 2]], [[0, 1, 1]]]  # 0 leaves and comes back; 2 joins 1
    landing = ex.landings(_paths(winner, [[[True, False, True]]] * 3, hidden=4))
    assert landing.moved == pytest.approx(1 / 3)  # only 2 ends away from where it started
    assert landing.observed.tolist() == [[1, 1, 0, 0]]  # 0 onto an empty neuron, 2 beside 1
    assert landing.expected[0].tolist() == pytest.approx([2 / 3, 2 / 3, 2 / 3, 0])
    assert landing.preference == pytest.approx(1.0) and landing.predicted == pytest.approx(1.0)


def test_landings_refuse_too_few_to_compare():
    winner = [[[0, 1]], [[2, 1]]]  # one landing, on an empty neuron
    with pytest.raises(ValueError, match="too few landings"):
        ex.landings(_paths(winner, [[[True, False]]] * 2, hidden=3))


def test_independent_landings_show_no_preference_and_the_count():
    # winners drawn afresh and independently at every record: where a feature lands cannot
    # depend on where the others sit, so rho is 1 and the landings predict the final rate
    generator = np.random.default_rng(0)
    records, seeds, n, m = 6, 200, 16, 32
    winner = generator.integers(0, m, (records, seeds, n))
    positive = generator.random((records, seeds, n)) < 0.5
    landing = ex.landings(_paths(winner, positive, hidden=m))
    assert landing.observed[:, ex.BESIDE].sum() > 300  # enough for the check to mean something
    assert abs(np.log(landing.preference)) < 3 * landing.preference_se
    assert abs(landing.predicted - 1) < 3 * landing.jackknife("predicted")
    # same-sign coincidences stay here, so all pairs coincide at 2 x 1/(2m)
    assert abs(landing.rate - 2) < 3 * landing.jackknife("rate")


def test_the_jackknife_of_the_landing_gap():
    generator = np.random.default_rng(1)
    runs = [
        ex.landings(
            _paths(generator.integers(0, m, (5, 12, 10)), generator.random((5, 12, 10)) < 0.5, m)
        )
        for m in (20, 40)
    ]
    gap, se = ex.landing_gap(runs)
    assert gap == pytest.approx(np.mean([r.rate - r.predicted for r in runs]))
    # by hand: the gap with each seed left out, and the jackknife's spread of them
    left = [
        np.mean(
            [
                r.subset(np.arange(12) != k).rate - r.subset(np.arange(12) != k).predicted
                for r in runs
            ]
        )
        for k in range(12)
    ]
    assert se == pytest.approx(np.sqrt(11 / 12 * np.sum((np.array(left) - np.mean(left)) ** 2)))
    with pytest.raises(ValueError, match="as many seeds"):
        ex.landing_gap([runs[0], runs[1].subset(np.arange(6))])


def test_the_sweep_records_its_trained_winners_and_refuses_bad_input():
    steps = 150
    sweep = ex.polysemantic_sweep(6, [6, 12], [0, 1], ex.FIGURE3_L1, steps=steps, lr=ex.FIGURE3_LR)
    for hidden, W, paths in zip([6, 12], sweep.W, sweep.paths):
        assert paths.hidden == hidden and paths.seeds.tolist() == [0, 1]
        assert paths.winner.shape == paths.positive.shape == (ex.WINNER_RECORDS + 1, 2, 6)
        assert paths.steps[0] == 0 and paths.steps[-1] == steps
        largest = torch.as_tensor(W).abs().argmax(-1)  # the last record is the final W's
        assert np.array_equal(paths.winner[-1], largest.numpy())
        sign = torch.as_tensor(W).gather(-1, largest[..., None])[..., 0] > 0
        assert np.array_equal(paths.positive[-1], sign.numpy())
    one = ex.winner_paths(6, 12, [0, 1], steps=steps)  # one m of the same sweep
    assert np.array_equal(one.winner, sweep.paths[1].winner)
    short = ex.winner_paths(6, 12, [0], steps=6)  # fewer steps than records: every step
    assert short.steps.tolist() == list(range(7)) and short.winner.shape == (7, 1, 6)
    for bad, match in [
        (dict(features=8, hidden=4), "hidden"),
        (dict(steps=0), "steps"),
        (dict(seeds=[]), "seeds"),
    ]:
        given = dict(features=6, hidden=12, seeds=[0], steps=steps) | bad
        with pytest.raises(ValueError, match=match):
            ex.winner_paths(**given)


def test_untied_start_scale_and_the_decay_over_a_run():
    usual = ex.UntiedBasisAutoencoder(12, 40, [0, 1], 0.01)
    small = ex.UntiedBasisAutoencoder(12, 40, [0, 1], 0.01, init_scale=ex.SMALL_START)
    torch.testing.assert_close(small.E, ex.SMALL_START * usual.E)  # the same draw, scaled
    torch.testing.assert_close(small.D, ex.SMALL_START * usual.D)
    with pytest.raises(ValueError, match="init_scale"):
        ex.UntiedBasisAutoencoder(12, 40, [0], 0.01, init_scale=0.0)
    decay = ex.decay_over_run(1e-3, 7500)
    # AdamW's decoupled decay alone multiplies a weight by 1 - lr x decay at every step
    assert (1 - 1e-3 * decay) ** 7500 == pytest.approx(np.exp(-ex.DECAY_OVER_RUN), rel=0.01)
    with pytest.raises(ValueError, match="lr"):
        ex.decay_over_run(0.0, 7500)


def test_an_euler_step_changes_the_l1_norm_by_appendix_b_s_rate():
    # On the survivors the step is w -> w + dt((1 - |w|²) w - λ), affine, so summing it gives
    # |w(t+dt)|_1 - |w(t)|_1 = dt[(1 - |w|²)|w|_1 - λ m'] exactly, Appendix B's first line times
    # -dt; a coordinate the step takes to or below 0 is set to 0, adding back minus its value
    m, l1, dt = 200, 1e-3, 0.5
    path = ex.euler_sparsification(ex.initial_encoding(m, 0), l1, dt, int(2 / (l1 * dt)))
    eps = np.finfo(float).eps
    for now, after in zip(path[:-1], path[1:]):
        alive = now > 0
        norm, l1_norm, survivors = now @ now, now.sum(), alive.sum()
        moved = now[alive] + dt * ((1 - norm) * now[alive] - l1)
        clipped = moved[moved <= 0].sum()
        change = after.sum() - l1_norm
        rate = dt * ((1 - norm) * l1_norm - l1 * survivors)
        # two sums of m terms and a few products: within 4 m eps |w|_1
        assert abs(change - (rate - clipped)) <= 4 * m * eps * l1_norm
    assert (path[-1] > 0).sum() == 1 and (path[0] > 0).sum() == m  # steps with and without drops


def test_appendix_b_s_variance_form_holds_exactly_on_the_balance_condition_only():
    # λm' - (1 - |w|²)|w|_1 = λ m'² Var[X]/|w|² (X: a survivor, population variance) needs
    # 1 - |w|² = λ|w|_1/|w|²; by hand, in general
    #   λm' - g|w|_1 = λ m'² Var[X]/|w|² - (|w|_1/|w|²) B,  B = g|w|² - λ|w|_1 = ½ d|w|²/dt
    rng = np.random.default_rng(0)
    l1 = 1e-3
    for size in (1, 2, 7, 200, 1000):
        for w in (np.abs(rng.normal(size=size)), rng.exponential(size=size), rng.random(size) + 1):
            m, l1_norm, norm, var = len(w), w.sum(), w @ w, w.var()
            balanced = l1 * l1_norm / norm
            text = l1 * m**2 * var / norm
            assert l1 * m - balanced * l1_norm == pytest.approx(text, rel=1e-12, abs=1e-15 * l1 * m)
            g = rng.normal()
            B = g * norm - l1 * l1_norm
            assert l1 * m - g * l1_norm == pytest.approx(
                text - l1_norm / norm * B, rel=1e-12, abs=1e-12 * (l1 * m + abs(g) * l1_norm)
            )
    # along a run the gap is -(|w|_1/|w|²) B. On B = 0, dB/dt = λ² m'² Var[X]/|w|² >= 0, so once
    # |w|² grows it keeps growing and the text's rate overestimates the true one (seed 0 starts
    # above the balance, |w(0)|² > 1, where the sign is the other way)
    m, dt = 200, 0.5
    path = ex.euler_sparsification(ex.initial_encoding(m, 0), l1, dt, int(2 / (l1 * dt)))
    survivors = (path > 0).sum(1)
    several = survivors >= 2
    l1_norm, norm = path.sum(1)[several], (path**2).sum(1)[several]
    var = np.array([w[w > 0].var() for w in path[several]])
    B = (1 - norm) * norm - l1 * l1_norm
    true_rate = l1 * survivors[several] - (1 - norm) * l1_norm
    text_rate = l1 * survivors[several] ** 2 * var / norm
    first = np.argmax(B > 0)
    assert B[0] < 0 and true_rate[0] > text_rate[0]
    assert np.all(B[first:] > 0) and np.all(true_rate[first:] < text_rate[first:])


def test_the_survivor_count_is_the_l1_proxy_times_one_plus_the_relative_variance():
    # by hand: E[X] = |w|_1/m', E[X²] = |w|²/m', so 1 + Var/E² = m'|w|²/|w|_1², that is
    # m' = (1 + Var[X]/E[X]²) |w|_1²/|w|²; the text's m' ≈ |w|_1² drops both factors
    rng = np.random.default_rng(1)
    for size in (1, 2, 7, 200, 1000):
        for w in (np.abs(rng.normal(size=size)), rng.exponential(size=size), rng.random(size) + 1):
            rv = w.var() / w.mean() ** 2
            assert (1 + rv) * w.sum() ** 2 / (w @ w) == pytest.approx(size, rel=1e-12)
            assert th.relative_variance(w) == pytest.approx(rv, rel=1e-12, abs=1e-15)
    # along a fast run (prefix sums of a w_k(0) + b, which cancel: float precision to 1e-9)
    run = ex.simulate_sparsification(ex.initial_encoding(200, 0), 1e-3, 0.5, 4000)
    identity = (1 + ex.survivors_relative_variance(run)) * run.l1_norm**2 / run.norm
    np.testing.assert_allclose(identity, run.nonzero, rtol=1e-9)
    assert run.nonzero[0] == 200 and run.nonzero[-1] == 1


def test_appendix_b_s_gamma_follows_its_ode_along_a_run():
    # γ(t) = (1 - W_k(t)/W_1(t)) / (1 - W_k(0)/W_1(0)) with W_1 the largest weight, here from the
    # second largest; the text's dγ/dt = (λ/W_1) γ. On Euler, W_1 -> c W_1 - dt λ and
    # W_1 - W_k -> c (W_1 - W_k), c = 1 + dt(1 - |w|²), so the forward difference is
    # (λ/W_1) γ / (c - dt λ/W_1): within 2 dt (|1 - |w|²| + λ/W_1) of the ODE's side
    m, l1, dt = 200, 1e-3, 0.05
    initial = ex.initial_encoding(m, 0)
    steps = int(2 / (l1 * dt))
    path = ex.euler_sparsification(initial, l1, dt, steps)
    first, second = np.argsort(initial)[::-1][:2]
    w1, w2 = path[:, first], path[:, second]
    gamma = (1 - w2 / w1) / (1 - w2[0] / w1[0])
    n = np.flatnonzero(w2[1:] > 0)  # both alive at steps n and n + 1
    difference = (gamma[n + 1] - gamma[n]) / dt
    ode = l1 / w1[n] * gamma[n]
    norm = (path[n] ** 2).sum(1)
    assert np.all(np.abs(difference / ode - 1) <= 2 * dt * (np.abs(1 - norm) + l1 / w1[n]))
    assert gamma[n[-1]] > 5  # γ has grown far from 1 before W_2 dies
    # the same γ is the fast run's a(t) W_1(0)/W_1(t), as w_k = W_1 (1 - γ) + γ W_1/W_1(0) w_k(0)
    run = ex.simulate_sparsification(initial, l1, dt, steps)
    top = run.scale * run.initial[0] + run.shift
    np.testing.assert_allclose((run.scale * run.initial[0] / top)[n], gamma[n], rtol=1e-9)
    np.testing.assert_allclose(run.shift[n], (w1 * (1 - gamma))[n], rtol=1e-9)
