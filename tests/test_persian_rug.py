"""Chapter 5: the Hadamard construction, the bound, the macroscopic loss, the exact linear
baseline, and batched grid training."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.linalg
import torch
from scipy import integrate, special, stats

from toycore import devices
from toycore.claims import Ledger
from toycore.data import SparseUniform
from toycore.experiments import persian_rug as ex
from toycore.experiments import rug_training as rt
from toycore.models import UntiedAutoencoder
from toycore.theory import persian_rug as th
from toycore.train import stopped, train_until_converged


def test_hadamard_is_sylvesters_and_orthogonal():
    for n in (1, 2, 8, 64):
        H = th.hadamard(n)
        assert np.array_equal(H, scipy.linalg.hadamard(n))
        assert np.allclose(H @ H.T, n * np.eye(n))
    with pytest.raises(ValueError, match="power of 2"):
        th.hadamard(12)


@pytest.mark.parametrize("features, hidden, seed", [(256, 40, 0), (64, 16, 3), (32, 31, 1)])
def test_the_rug_has_unit_diagonal_is_a_symmetric_projector_and_depends_on_i_xor_j(
    features, hidden, seed
):
    W_in, W_out, rows = th.persian_rug(features, hidden, seed)
    R = W_out @ W_in
    assert len(set(rows)) == hidden and W_in.shape == (hidden, features)
    deviations = th.rug_deviations(R, hidden)
    assert deviations.pop("rank") == hidden
    assert all(value < 1e-12 for value in deviations.values()), deviations
    # the measure sees each property fail: one entry changed breaks symmetry, the projector
    # and the XOR structure; scaling breaks the diagonal
    broken = R.copy()
    broken[0, 1] += 0.1
    bad = th.rug_deviations(broken, hidden)
    assert min(bad["symmetry"], bad["projector"], bad["xor"]) > 1e-3
    assert th.rug_deviations(2 * R, hidden)["diagonal"] == pytest.approx(1)


def test_the_rug_saturates_the_bound_and_random_low_rank_matrices_respect_it():
    p = 0.05
    for features, hidden in [(64, 16), (128, 40), (256, 100)]:
        W_in, W_out, _ = th.persian_rug(features, hidden, seed=2)
        ratio = hidden / features
        assert ex.bound_ratios(W_out @ W_in, p, ratio) == pytest.approx(1, abs=1e-12)
        for seed in range(5):
            W = ex.random_low_rank(features, hidden, seed)
            assert ex.bound_ratios(W, p, ratio) > 1


def test_the_bound_helpers_give_one_ratio_per_model_rug_and_matrix():
    rug_ratios, rug_values = ex.rug_bound_ratios(64, (8, 16, 40), density=0.05)
    assert rug_ratios == [8 / 64, 16 / 64, 40 / 64]
    assert np.allclose(rug_values, 1, atol=1e-12)
    random = ex.random_bound_ratios(64, (8, 16), seeds=range(3), density=0.05)
    assert random.shape == (6,) and (random > 1).all()
    assert random[4] == ex.bound_ratios(ex.random_low_rank(64, 16, 1), 0.05, 16 / 64)


def test_figure_2_levels_and_the_beats_linear_cells():
    features, densities, ratios = 16, np.array([0.05, 0.5]), np.array([0.25, 0.5])
    rng = np.random.default_rng(0)
    W = rng.normal(size=(2, 2, 3, features, features))
    grid = ex.Grid(
        features=features,
        densities=densities,
        ratios=ratios,
        hidden=np.array([4, 8]),
        seeds=np.arange(3),
        loss=rng.uniform(size=(2, 2, 3)),
        loss_se=np.zeros((2, 2, 3)),
        steps=np.ones((2, 2, 3), int),
        converged=np.ones((2, 2, 3), bool),
        W=W,
        b=np.zeros((2, 2, 3, features)),
        curves=np.zeros((2, 2, 3, 1)),
        statistics={},
    )
    levels = ex.figure2_levels(grid)
    assert np.array_equal(levels.trained, grid.loss.mean(-1))
    assert levels.linear[1, 0] == pytest.approx((1 - 0.25) * (0.5 / 3 - 0.25 / 4))
    assert levels.rug[0, 1] == th.rug_loss(0.05, 0.5)[0]
    # at p <= 0.05 and nd/ns >= 0.5: the one cell (0, 1), each seed's model beaten or not
    loss = np.repeat(levels.linear[..., None], 3, -1)
    loss[0, 1] += [-1e-6, 1e-6, -1e-6]
    grid = dataclasses.replace(grid, loss=loss)
    assert ex.beats_linear(grid, levels, 0.05, 0.5).tolist() == [True, False, True]
    assert ex.beats_linear(grid, levels, 0.5, 0.25).size == 12


def test_a_finite_rug_approaches_the_large_ns_loss_where_many_features_are_active():
    rugs = ex.finite_rugs(256, [0.02, 0.3], [0.25, 0.5])
    assert rugs.ratios.tolist() == [0.25, 0.5] and rugs.active.tolist() == [256 * 0.02, 256 * 0.3]
    assert np.allclose(rugs.gap, np.abs(rugs.loss / rugs.predicted - 1))
    # ~77 active features: Gaussian interference; ~5: not yet (Figure 2's crosses)
    assert rugs.gap[1].max() < 0.05 < rugs.gap[0].max()


def test_the_on_and_off_terms_of_section_4_3_agree_with_monte_carlo_and_their_bounds():
    rng = np.random.default_rng(1)
    u = rng.uniform(size=2_000_000)
    for mu, sigma in [(0.1, 0.07), (0.3, 0.2), (0.02, 0.5)]:
        nu = rng.normal(-mu, sigma, size=u.size)
        cut = u + nu < 0
        E_r, E_nu = th.on_term_parts(mu, sigma)
        assert E_r == pytest.approx(np.mean(np.where(cut, u**2, 0)), rel=0.02)
        assert E_nu == pytest.approx(np.mean(np.where(cut, 0, nu**2)), rel=0.02)
        assert E_r + E_nu == pytest.approx(th.macroscopic_parts(1.0, -mu, sigma)[1], rel=1e-9)
        assert th.off_term(mu, sigma) == pytest.approx(np.mean(np.maximum(nu, 0) ** 2), rel=0.02)
        assert th.off_term(mu, sigma) < th.off_term_bound(mu, sigma)
        E_r_bound, E_nu_bound = th.on_term_bounds(mu, sigma)
        assert E_r < E_r_bound and E_nu < E_nu_bound
    with pytest.raises(ValueError, match="mu"):
        th.on_term_bounds(0.6, 0.1)  # appendix B assumes 2|μ| <= 1


def test_the_closed_form_scales_of_eq_8_and_eq_16_are_the_numerical_minima():
    from scipy import optimize

    for p, sigma, b in [(0.05, 0.3, -0.2), (0.3, 0.5, 0.1), (0.01, 0.1, -0.3)]:
        best = optimize.minimize_scalar(
            lambda a: th.macroscopic_loss(a, a * b, sigma, p), bounds=(1e-3, 10), method="bounded"
        )
        assert th.optimal_scale(b, sigma, p) == pytest.approx(best.x, rel=1e-5)
        a, loss = th.small_ratio_optimum(b, sigma, p)
        best = optimize.minimize_scalar(
            lambda a: th.small_ratio_limit_loss(a, b, sigma, p), bounds=(-10, 10), method="bounded"
        )
        assert a == pytest.approx(best.x, rel=1e-5) and loss == pytest.approx(best.fun, rel=1e-9)
    # the macroscopic loss is its two parts, weighted by how often a feature is off and on
    off, on = th.macroscopic_parts(1.2, -0.1, 0.2)
    assert th.macroscopic_loss(1.2, -0.1, 0.2, 0.05) == pytest.approx(0.95 * off + 0.05 * on)


def test_the_drop_and_the_scale_1_29_are_found_where_the_rug_curve_says():
    p = 0.01
    start = th.drop_ratio(p, 0.9)
    assert th.rug_loss(p, start)[0] / th.linear_loss(p, start) == pytest.approx(0.9, abs=1e-4)
    assert th.drop_ratio(p, 0.5) > start
    ratios = th.ratios_with_scale(0.045, 1.29)
    assert len(ratios) == 2
    for r in ratios:
        assert th.rug_loss(0.045, r)[1] == pytest.approx(1.29, abs=1e-4)
    with pytest.raises(ValueError, match="stays above"):
        th.drop_ratio(0.5, 0.01)


def test_loss_parts_split_a_models_loss_by_whether_each_feature_is_on():
    features, p = 16, 0.2
    rng = np.random.default_rng(0)
    W = rng.normal(scale=0.3, size=(2, features, features)) + np.eye(features)
    b = np.full((2, features), -0.1)
    parts = ex.loss_parts.uncached(W, b, p, samples=4096)
    # brute force on the same samples
    data = SparseUniform(
        [0, 0], features, 1 - p, device="cpu", dtype=torch.float64, purpose="parts"
    )
    x = torch.cat([data.sample(ex.BATCH) for _ in range(4)], 1).numpy()
    y = np.maximum(x @ W.transpose(0, 2, 1) + b[:, None], 0)
    squared, on = (x - y) ** 2, x > 0
    assert np.allclose(parts.on, (squared * on).sum(1) / on.sum(1))
    assert np.allclose(parts.off, (squared * ~on).sum(1) / (~on).sum(1))
    cut = on & (y == 0)  # the ReLU cut an active feature: the loss is x²
    assert cut.any() and np.allclose(parts.cut, (x**2 * cut).sum(1) / on.sum(1))
    assert np.allclose(parts.diagonal, np.diagonal(W, axis1=1, axis2=2))
    decisions = (1 - p) * parts.off.mean(-1) + p * parts.cut.mean(-1)
    assert np.allclose(
        ex.values_over_decisions(parts, p), p * (parts.on - parts.cut).mean(-1) / decisions
    )
    makeup = ex.gap_makeup([parts], p, 0.25, weak_below=1.0)
    weak = parts.diagonal < 1.0
    loss = (1 - p) * parts.off + p * parts.on
    assert makeup.weak[0] == pytest.approx(weak.mean())
    assert makeup.weak_loss[0] == pytest.approx(loss[weak].sum() / loss.sum())
    assert makeup.off[0] == pytest.approx((1 - p) * parts.off.mean())
    assert makeup.cut[0] == pytest.approx(p * parts.cut.mean())


def test_interference_means_are_the_mean_push_from_the_other_features():
    features, p = 12, 0.3
    rng = np.random.default_rng(1)
    W = rng.normal(size=(2, features, features))
    x = rng.random((400_000, features)) * (rng.random((400_000, features)) < p)
    for model in range(2):
        off = W[model] - np.diag(np.diagonal(W[model]))
        nu = x @ off.T  # (samples, ns): ν_i = Σ_{j≠i} W_ij x_j
        se = nu.std(0) / np.sqrt(len(x))
        assert np.all(np.abs(th.interference_means(W, p)[model] - nu.mean(0)) < 4 * se)


def test_the_cut_part_of_the_on_term_agrees_with_monte_carlo_and_appendix_b():
    rng = np.random.default_rng(0)
    u, noise = rng.random(2_000_000), rng.normal(size=2_000_000)
    for a, b, sigma in [(1.29, -0.45, 0.21), (0.8, 0.1, 0.5), (1.0, -0.2, 0.05)]:
        sampled = u**2 * (a * (u + sigma * noise) + b < 0)
        se = sampled.std() / np.sqrt(u.size)
        assert abs(th.macroscopic_cut(a, b, sigma) - sampled.mean()) < 4 * se
        if b <= 0:  # appendix B's E_r, its mean -|μ| at b/a
            assert th.macroscopic_cut(a, b, sigma) == pytest.approx(
                th.on_term_parts(b / a, sigma)[0], rel=1e-12
            )
    with pytest.raises(ValueError, match="a"):
        th.macroscopic_cut(0.0, -0.1, 0.2)
    # the rug's two kinds of error add up to its loss
    decisions, values = th.rug_error_kinds(0.045, 0.25)
    assert decisions + values == pytest.approx(th.rug_loss(0.045, 0.25)[0], rel=1e-9)
    off, on, cut = th.rug_parts(0.045, 0.25)
    assert 0 < cut < on and decisions == pytest.approx(0.955 * off + 0.045 * cut, rel=1e-12)


def test_macroscopic_loss_agrees_with_monte_carlo():
    rng = np.random.default_rng(0)
    n = 2_000_000
    for p, a, b, sigma in [
        (0.05, 1.2, -0.15, 0.1),
        (0.3, 0.8, 0.05, 0.4),
        (0.01, 1.0, -0.05, 0.02),
    ]:
        x = np.where(rng.random(n) < p, rng.random(n), 0.0)
        nu = rng.normal(0, sigma, n)
        samples = (x - np.maximum(a * (x + nu) + b, 0)) ** 2
        standard_error = samples.std() / np.sqrt(n)
        assert abs(samples.mean() - th.macroscopic_loss(a, b, sigma, p)) < 4 * standard_error


def test_bayes_decoder_loss_agrees_with_monte_carlo_and_tends_to_sigma_squared():
    rng = np.random.default_rng(1)
    sigma, n = 0.2, 400_000
    u = rng.random(n)
    y = u + rng.normal(0, sigma, n)
    # E[u|y] by quadrature on a grid of y, then the Monte Carlo mean squared error of that decoder
    grid = np.linspace(y.min(), y.max(), 4001)
    nodes = th.U_NODES[None, :]
    weights = np.exp(-((grid[:, None] - nodes) ** 2) / (2 * sigma**2)) * th.U_WEIGHTS
    posterior_mean = (weights * nodes).sum(1) / weights.sum(1)
    errors = (u - np.interp(y, grid, posterior_mean)) ** 2
    assert abs(errors.mean() - th.bayes_on_loss(sigma)) < 4 * errors.std() / np.sqrt(n)
    assert th.bayes_on_loss(1e-3) / 1e-6 == pytest.approx(1, abs=0.01)


def test_small_ratio_limit_is_the_variance_and_the_rug_sits_between_the_bound_and_linear():
    for p in (0.01, 0.05, 0.2):
        assert th.rug_loss(p, 1e-4)[0] == pytest.approx(th.small_ratio_loss(p), rel=1e-3)
        for ratio in (0.1, 0.3, 0.6):
            rug = th.rug_loss(p, ratio)[0]
            assert th.elementwise_lower_bound(p, ratio) < rug < th.linear_loss(p, ratio)


def test_exact_linear_baseline_matches_a_trained_linear_model(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCORE_CACHE", str(tmp_path))  # computed afresh, not served
    features, p = 32, 0.1
    losses, converged = ex.linear_runs(features, p, [0.25, 0.5], [0, 1])
    assert converged.all()
    for ratio, loss in zip([0.25, 0.5], losses):
        assert loss == pytest.approx(th.linear_loss(p, ratio), rel=0.03)


def test_grid_training_equals_separate_training_for_the_same_seeds():
    features, densities, hiddens, seeds = 24, [0.1, 0.3, 0.2], [6, 3, 6], [5, 6, 7]
    model = UntiedAutoencoder(features, hiddens, seeds, dtype=torch.float64)
    data = SparseUniform(seeds, features, [1 - p for p in densities], dtype=torch.float64)
    grid = train_until_converged(
        model, data, lr=0.01, batch=64, window=10, check_every=5, max_steps=400, desc=None
    )
    assert len(set(grid.steps)) > 1  # the instances stopped at different steps
    for k in range(len(seeds)):
        alone = UntiedAutoencoder(features, [hiddens[k]], [seeds[k]], dtype=torch.float64)
        data = SparseUniform([seeds[k]], features, 1 - densities[k], dtype=torch.float64)
        run = train_until_converged(
            alone, data, lr=0.01, batch=64, window=10, check_every=5, max_steps=400, desc=None
        )
        assert run.steps[0] == grid.steps[k]
        assert np.allclose(run.loss[0], grid.loss[k], rtol=1e-10)
        h = hiddens[k]
        assert torch.allclose(alone.W_in[0], model.W_in[k, :h], atol=1e-12)
        assert torch.allclose(alone.W_out[0], model.W_out[k, :, :h], atol=1e-12)
        assert torch.all(model.W_in[k, h:] == 0) and torch.all(model.W_out[k, :, h:] == 0)


def test_a_shards_models_are_bit_for_bit_the_same_however_many_share_its_batch(monkeypatch):
    # shard_plan sizes a CPU's shards for speed alone: that must change no number (a GPU's
    # shard is every model of one hidden size, whatever their number)
    monkeypatch.setattr(devices, "_current", torch.device("cpu"))
    densities, seeds = [0.01, 0.05, 0.2, 0.5], [3, 4, 5, 6]
    together = rt.train_group.uncached(32, densities, 8, seeds, steps=90)
    for pair in ([0, 1], [2, 3]):
        apart = rt.train_group.uncached(
            32, [densities[k] for k in pair], 8, [seeds[k] for k in pair], steps=90
        )
        for name in ("W", "b", "loss", "loss_se"):
            assert np.array_equal(getattr(apart, name), getattr(together, name)[pair])
        assert all(np.array_equal(together.curves[k], c) for k, c in zip(pair, apart.curves))


def test_a_model_trained_on_from_its_state_is_the_run_that_never_stopped():
    # a model stopped at 65 steps (within a stock of prefetched batches), then trained on to
    # 140, against its uninterrupted run, at a sparse and a dense p
    for p, seed in [(0.05, 1), (0.3, 2)]:
        first = rt.train_group.uncached(48, [p], 12, [seed], steps=65, keep_state=True)
        assert first.states[0]["data"][1] is not None  # batches left in stock
        uninterrupted = rt.train_group.uncached(48, [p], 12, [seed], steps=140)
        on = rt.train_on.uncached(first.states[0], steps=140)
        for name in ("W", "b", "loss", "loss_se", "steps"):
            assert np.array_equal(getattr(on, name), getattr(uninterrupted, name))
        whole = np.concatenate([first.curves[0], on.curves[0]])
        assert np.array_equal(whole, uninterrupted.curves[0])
    with pytest.raises(ValueError, match="steps must be an integer >= 66"):
        rt.train_on.uncached(first.states[0], steps=65)


def test_the_update_is_torch_adams_and_the_stopping_rule_is_the_texts():
    model = UntiedAutoencoder(16, 4, [3], dtype=torch.float64)
    reference = UntiedAutoencoder(16, 4, [3], dtype=torch.float64)
    train_until_converged(
        model,
        SparseUniform([3], 16, 0.8, dtype=torch.float64),
        lr=0.02,
        batch=32,
        steps=30,
        desc=None,
    )
    optimizer = torch.optim.Adam(reference.parameters(), lr=0.02, eps=1e-7)
    data = SparseUniform([3], 16, 0.8, dtype=torch.float64)
    for _ in range(30):
        optimizer.zero_grad()
        reference.loss(data.sample(32)).sum().backward()
        optimizer.step()
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(mine, theirs, atol=1e-12)
    assert not stopped([3.0, 2.0, 1.0, 0.5], 2) and stopped([3.0, 2.0, 2.0, 3.0], 2)
    assert not stopped([1.0, 1.0, 1.0], 2)  # fewer than two windows


def test_bad_input_is_refused_before_any_work():
    with pytest.raises(ValueError, match=r"hidden must be an integer in \[1, "):
        UntiedAutoencoder(8, 9, [0])
    with pytest.raises(ValueError, match="hidden must be one size or 2 sizes"):
        UntiedAutoencoder(8, [2, 3, 4], [0, 1])
    with pytest.raises(ValueError, match="output must be one of"):
        UntiedAutoencoder(8, 2, [0], output="tanh")
    model = UntiedAutoencoder(8, 2, [0])
    data = SparseUniform([0], 8, 0.9)
    with pytest.raises(ValueError, match="lr must be finite and > 0"):
        train_until_converged(model, data, lr=0.0, batch=8, desc=None)
    with pytest.raises(ValueError, match="max_steps must be an integer >= 400"):
        train_until_converged(model, data, lr=0.1, batch=8, max_steps=100, desc=None)
    with pytest.raises(ValueError, match="start goes on with a run for fixed steps"):
        train_until_converged(model, data, lr=0.1, batch=8, start=({}, 10), desc=None)
    with pytest.raises(ValueError, match="a state of 2 streams for 1 instances"):
        data.restore(SparseUniform([0, 1], 8, 0.9).state())
    with pytest.raises(ValueError, match="holds 1 batches of 8 features; this stream prefetches"):
        stocked = SparseUniform([0], 8, 0.9, prefetch=2)
        stocked.sample(4)
        SparseUniform([0], 8, 0.9, prefetch=2).restore(stocked.state())  # fine
        SparseUniform([0], 9, 0.9).restore(stocked.state())
    with pytest.raises(ValueError, match=r"the ratio nd/ns must be finite and in \(0, 1\]"):
        th.rug_loss(0.1, 1.5)
    with pytest.raises(ValueError, match=r"p must be finite and in \(0, 1\]"):
        th.rug_loss(0.0, 0.5)
    with pytest.raises(ValueError, match=r"hidden must be an integer in \[1, "):
        th.persian_rug(16, 17)


def test_symmetry_statistics_and_crossing_on_hand_built_inputs():
    W = np.array([[2.0, 1.0, -1.0], [0.0, 2.0, 0.5], [1.0, 1.0, 1.0]])
    b = np.array([-0.1, -0.2, -0.3])
    stats = th.symmetry_statistics(W, b, 0.1)
    assert stats["diagonal"] == pytest.approx(np.var([2, 2, 1]))
    assert stats["bias"] == pytest.approx(np.var(b))
    assert stats["row_variance"] == pytest.approx(
        np.var(th.feature_variance(0.1) * np.array([2, 0.25, 2]))
    )
    assert stats["lyapunov"] == pytest.approx(1.0)  # row 2: one off-diagonal entry is all of it
    # a batch of float32 models (as the grids hold them), each against the definitions
    rng = np.random.default_rng(0)
    Ws, bs = rng.normal(size=(2, 3, 6, 6)).astype(np.float32), rng.normal(size=(2, 3, 6))
    batched = th.symmetry_statistics(Ws, bs, 0.2)
    for index in np.ndindex(2, 3):
        off = Ws[index].astype(float) * (1 - np.eye(6))
        cubes, squares = (np.abs(off) ** 3).sum(1), (off**2).sum(1)
        assert batched["lyapunov"][index] == pytest.approx((cubes / squares**1.5).max(), rel=1e-12)
        assert batched["row_variance"][index] == pytest.approx(
            np.var(th.feature_variance(0.2) * squares), rel=1e-12
        )


@pytest.mark.parametrize("output", ["relu", "linear"])
def test_the_written_out_gradients_are_autograds(output):
    # padded instances (hidden sizes 3 and 5) and a ReLU that closes on part of the batch
    model = UntiedAutoencoder(12, [3, 5], [0, 1], output=output, dtype=torch.float64)
    x = SparseUniform([0, 1], 12, 0.6, dtype=torch.float64).sample(40)
    weights = {name: param.detach().clone() for name, param in model.named_parameters()}
    loss, grads = model.loss_and_grads(x, **weights)
    expected = model.loss(x)
    expected.sum().backward()
    assert torch.allclose(loss, expected.detach(), rtol=1e-12)
    for grad, (name, param) in zip(grads, model.named_parameters()):
        assert torch.allclose(grad, param.grad, atol=1e-14), name
    assert torch.all(grads[0][0, 3:] == 0) and torch.all(grads[1][0, :, 3:] == 0)


def test_the_regime_is_where_the_interference_kurtosis_is_small():
    # the closed form against a sample of the sum of ns - 1 features
    p, features = 0.2, 16
    x = SparseUniform([0], features - 1, 1 - p, dtype=torch.float64).sample(400_000)[0].sum(1)
    centred = x - x.mean()
    sample = (centred**4).mean() / (centred**2).mean() ** 2 - 3  # a noisy estimate
    assert th.interference_kurtosis(p, features) == pytest.approx(sample.item(), rel=0.15)
    assert th.interference_kurtosis(0.01, 1000) == pytest.approx(9 / (5 * 0.01 * 1000), rel=0.05)
    first = th.regime_size(0.045)
    assert th.in_regime(0.045, first) and not th.in_regime(0.045, first - 1)
    assert th.in_regime(0.045, np.array([128, 1024])).tolist() == [False, True]
    with pytest.raises(ValueError, match="features must be at least 2"):
        th.interference_kurtosis(0.1, 1)
    # an explanation row reads the sizes inside the regime, else the largest one alone
    assert ex.sizes_read([first - 1, first, 2 * first], 0.045) == [first, 2 * first]
    assert ex.sizes_read([first - 2, 8, first - 1], 0.045) == [first - 1]


def test_a_fitted_rug_loses_no_more_than_the_large_ns_a_and_b(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCORE_CACHE", str(tmp_path))
    fitted = ex.fitted_rug(512, 0.1, 0.5, samples=4096)
    # the fit draws its samples on the CPU on every device: measure the formula's a and b on
    # those same samples (a GPU's stream would give others)
    monkeypatch.setattr(devices, "_current", torch.device("cpu"))
    ((with_formula, formula),) = ex.rug_model_losses(512, [0.1], 0.5, samples=4096)
    # fitted on other samples than it is measured on: no higher than the formula's a and b give
    assert fitted.loss <= with_formula + 3 * fitted.loss_se
    # p·ns = 51 active features, inside the regime: close to the large-ns loss
    assert th.in_regime(0.1, 512) and fitted.loss == pytest.approx(formula, rel=0.05)
    assert fitted.loss_se < 0.01 * fitted.loss and fitted.a > 0


def test_the_decay_exponent_of_a_statistic_and_the_capped_models_left_out():
    sizes, seeds = [32, 64, 128], 2
    grids = []
    for n in sizes:  # a statistic falling exactly as ns^-1, with one capped model per grid
        converged = np.ones((1, 1, seeds), bool)
        converged[0, 0, 1] = False
        value = np.full((1, 1, seeds), 1.0 / n)
        value[0, 0, 1] = 1e6  # the capped model: left out, or the fit would be off
        grids.append(
            SimpleNamespace(features=n, converged=converged, statistics={"diagonal": value})
        )
    slope, error = ex.decay_exponent(grids, "diagonal")
    assert slope == pytest.approx(-1) and error == pytest.approx(0, abs=1e-9)
    masked = ex.stopped_by_rule(grids[0], np.ones((1, 1, seeds, 3)))
    assert np.isnan(masked[0, 0, 1]).all() and (masked[0, 0, 0] == 1).all()


def test_the_headline_in_words_reads_each_sizes_rows():
    rows = [
        dict(id="headline.ns64", measured=1.21, outside_regime="p·ns = 3"),
        dict(id="headline.fitted_ns64", measured=1.1, outside_regime="p·ns = 3"),
        dict(id="headline.ns1024", measured=0.98, outside_regime=""),
    ]
    assert ex.headline_sentences(rows) == (
        "ns = 64: 1.21 and 1.10 (outside the regime); ns = 1024: 0.98"
    )
    assert ex.headline_sentences([]) == "nothing recorded"
    inside = [
        dict(id="headline.ns1024", measured=0.81, outside_regime="", passed=False),
        dict(id="headline.fitted_ns1024", measured=0.83, outside_regime="", passed=False),
        dict(id="headline.rug_ns1024", measured=1.01, outside_regime="", passed=True),
    ]
    assert ex.headline_verdict(inside + rows[:1]) == (
        "inside the text's regime (ns = 1024) trained models lose 0.81 to 0.83 times what the "
        "rugs lose: the claim does not reproduce there"
    )
    assert ex.headline_verdict(rows[:1]) == "no size lies inside the text's regime"


def test_the_gaussian_prediction_of_many_models_at_once_is_each_ones_own():
    rng = np.random.default_rng(0)
    W = rng.normal(0, 0.05, (3, 32, 32))
    W[:, range(32), range(32)] = rng.uniform(0.5, 1.4, (3, 32))
    b = rng.normal(-0.1, 0.05, (3, 32))
    densities = np.array([0.045, 0.1, 0.3])
    together = ex.row_macroscopic_loss(W, b, densities)
    for k in range(3):  # output by output, with the text's formula and its checks
        diagonal = np.diag(W[k])
        off = W[k] - np.diag(diagonal)
        sigma = np.sqrt(th.feature_variance(densities[k]) * (off**2).sum(1)) / diagonal
        bias = b[k] + densities[k] / 2 * off.sum(1)
        alone = np.mean(
            [th.macroscopic_loss(a, c, s, densities[k]) for a, c, s in zip(diagonal, bias, sigma)]
        )
        assert together[k] == pytest.approx(alone, rel=1e-12)


def test_the_interference_shape_of_gaussian_like_and_skewed_interference():
    """Many small weights of both signs make ν nearly Gaussian: little skew, and the ReLU passes
    what a Gaussian predicts; weights of one sign on few active features skew it."""
    rng = np.random.default_rng(1)
    n = 256
    mixed = np.eye(n) + rng.normal(0, 0.02, (n, n)) * (1 - np.eye(n))
    one_sign = np.eye(n) - np.abs(rng.normal(0, 0.02, (n, n))) * (1 - np.eye(n))
    b = np.full((1, n), -0.02)
    near = ex.interference_shape.uncached(mixed[None], b, 0.3, samples=8192)
    skewed = ex.interference_shape.uncached(one_sign[None], b, 0.02, samples=8192)
    assert np.abs(near.skewness).mean() < 0.2 < np.abs(skewed.skewness).mean()
    assert near.off.mean() / near.gaussian_off.mean() == pytest.approx(1, abs=0.1)
    assert skewed.samples == 8192 and near.off.shape == (1, n)


def test_the_trend_past_the_texts_sizes_joins_two_sweeps_and_reads_its_slope():
    def point(trained, converged=(True, True)):
        return SimpleNamespace(
            W=None,
            b=None,
            loss=np.array(trained),
            converged=np.array(converged),
            steps=np.array([100, 200]),
        )

    rug = th.rug_loss(0.045, 0.25)[0]
    texts = ex.ratio_headline({1024: point([0.80 * rug, 0.82 * rug])}, 0.045, 0.25)
    beyond = ex.ratio_headline(
        {4096: point([0.90 * rug, 0.91 * rug]), 8192: point([0.95 * rug, 0.94 * rug])},
        0.045,
        0.25,
    )
    both = ex.joined(texts, beyond)
    assert both.sizes.tolist() == [1024, 4096, 8192] and both.inside.all()
    slope, error, last = ex.closing_trend(both)
    assert slope > 0 and error > 0 and last == pytest.approx(0.945)  # closing toward 1
    assert np.isnan(ex.closing_trend(texts)[0])  # one size: no trend
    row = dict(id="beyond.trend", measured=slope / error, expected=2.0, outside_regime="")
    assert ex.trend_words([row], "beyond.trend").startswith("closes toward 1")
    assert ex.trend_words([], "beyond.trend") == "was not recorded"
    # the sentence section 11 glues from a record: each size's ratio, the slope, the verdict
    row["note"] = (
        "trained / rug: ns = 1024: 0.810, ns = 4096: 0.905; slope +0.05 ± 0.01 per doubling"
    )
    assert ex.beyond_words([row]) == (
        "trained / rug 0.810 at ns = 1024, 0.905 at ns = 4096; the trend (slope +0.05 ± 0.01 per "
        f"doubling) closes toward 1, by {slope / error:.1f} standard errors of its slope."
    )
    assert ex.beyond_words([]) == "not recorded yet."


def test_where_ratios_lie_against_one_in_words():
    assert ex.sides_words({64: 1.164, 128: 0.95, 256: 0.84}) == (
        "below it at ns = 128, 256 (0.84 to 0.95 times it) and above it at ns = 64 (1.16 times it)"
    )
    assert ex.sides_words({512: 1.2}) == "above it at ns = 512 (1.20 times it)"
    assert ex.sides_words({512: float("nan")}) == "nowhere: every model hit the cap"


def test_the_prose_reads_directions_off_the_numbers_not_off_our_expectations():
    # each direction is computed, so a build or a record that turns it turns the words
    assert ex.course_words({128: 0.3, 256: 0.5}) == "grows with ns"
    assert ex.course_words({128: 0.5, 256: 0.3, 512: 0.4}) == "does not move one way with ns"
    parts = ex.loss_parts_words({256: 0.36, 512: 0.5}, {256: 1.2, 512: 1.1}, {256: 2.0, 512: 1.5})
    assert parts.startswith("the off part lies below the rug's at every size (0.36 of it at ns")
    assert "the on part lies above the rug's at every size" in parts and "shrinks with" in parts
    assert parts.endswith(
        "cuts to zero lies above the rug's at every size (2.00 of it at ns = "
        "256, 1.50 at 512) and shrinks with ns."
    )
    mixed = ex.loss_parts_words({256: 0.9, 512: 1.1}, {256: 1.0, 512: 1.0}, {256: 1.0, 512: 1.0})
    assert "at some sizes and above it at others" in mixed and "not move one way" in mixed
    assert ex.approach_words({128: 1.3, 256: 0.9}) == "comes toward the rug's loss as ns grows"
    assert ex.approach_words({128: 1.1, 256: 0.7}) == "moves away from the rug's loss as ns grows"
    assert ex.approach_words({128: 1.1, 256: float("nan")}).startswith("cannot be followed")
    assert ex.values_words(3.8, 5.1).endswith("as section 5.2.1 says.")
    assert ex.values_words(0.8, 5.1).endswith("does not hold for both.")
    below = ex.values_words(0.8, 5.1, outside="p·ns = 23, below the regime")
    assert below.endswith("outside the text's regime: p·ns = 23, below the regime).")
    assert ex.values_words(float("nan"), 5.1).startswith("No trained model")
    held, failed = {"passed": True, "outside_regime": ""}, {"passed": False, "outside_regime": ""}
    assert "fits the trained models of the first" in ex.other_ratio_words(held, held)
    assert "fits neither" in ex.other_ratio_words(failed, held)
    assert "does not rule out the second" in ex.other_ratio_words(held, failed)
    assert "does not rule out the second" in ex.other_ratio_words(failed, failed)
    outside = dict(held, outside_regime="ns = 256: the sweep stops short of the text's 512")
    assert "test nothing" in ex.other_ratio_words(outside, outside)
    falls = ex.density_course_words({0.01: (0.2, 0.25), 0.05: (0.1, 0.05)}, 32, 128)
    assert falls == (
        "from ns = 32 to 128 the median over each p's cells falls at p = 0.05 and not at p = 0.01"
    )
    assert ex.density_course_words({0.05: (0.1, 0.05)}, 32, 128).endswith("at every p")
    assert ex.density_course_words({0.05: (0.1, 0.2)}, 32, 128).endswith("at no p")
    nan = float("nan")
    unread = ex.density_course_words({0.01: (nan, 0.2), 0.05: (0.1, 0.05)}, 32, 128)
    assert unread.endswith("at every p where it can be read (at p = 0.01 every model hit the cap)")
    assert ex.course_words({128: 0.3}) == "cannot be followed over ns: one size only"


def test_what_the_text_reads_off_the_smallest_panels_in_words():
    from types import SimpleNamespace

    diagonal = np.array([[[4.0, 4.2], [1.0, 1.1]], [[2.0, 2.0], [0.5, 0.4]]])  # (P, R, S)
    grid = SimpleNamespace(
        features=32,
        densities=np.array([0.01, 0.3]),
        ratios=np.array([0.1, 0.8]),
        converged=np.ones((2, 2, 2), dtype=bool),
        statistics=dict(diagonal=diagonal, bias=2 * diagonal, lyapunov=1 / diagonal),
    )
    said = ex.figure_readings(grid)
    assert said["diagonal"] == (
        "at ns = 32 the diagonal's variance is largest at p = 0.01, nd/ns = 0.1 (4.1), the "
        "smallest p and nd/ns together"
    )
    assert said["coupling"].endswith("a rank correlation of 1.00")
    assert said["lyapunov"].endswith("0.60 at p = 0.01, 1.38 at p = 0.3")
    grid.statistics["diagonal"] = diagonal[::-1, ::-1].copy()  # the corner now the smallest
    assert ex.figure_readings(grid)["diagonal"].endswith(
        "together it is 0.45, the 4th largest of the grid's 4 cells"
    )
    grid.converged[0, 0] = False  # a cell whose every model hit the cap
    said = ex.figure_readings(grid)
    assert said["diagonal"].endswith("together every model hit the cap")
    assert said["coupling"].endswith("rank correlation of -1.00")  # the bias kept its order
    grid.converged[:] = False
    assert ex.figure_readings(grid)["lyapunov"] == "at ns = 32 every model hit the cap"
    assert [ex._ordinal(k) for k in (1, 2, 3, 4, 11, 12, 21)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "21st",
    ]


def test_the_stopping_rules_tests_at_the_texts_sizes_in_words():
    early = dict(id="fig2.early_stop", passed=True, measured=-5.6, note="ns = 2048; x")
    assert ex.early_stop_words(early) == (
        "At the texts' sizes (ns = 2048; x; fixed steps lower the loss by at least 5.6 standard "
        "errors) the rule stops early too."
    )
    assert "do not beat the rule" in ex.early_stop_words({**early, "passed": False})
    assert ex.early_stop_words(None).endswith("not recorded yet.")
    gain = dict(id="horizon.gain", passed=False, note="drops: ns = 2048: +9.6%")
    gain = {**gain, "measured": 0.096, "expected": 0.05}
    assert "loses up to 9.6% less when trained on to it, beyond the headline's tolerance of 5%" in (
        ex.horizon_caveat([gain])
    )
    assert ex.horizon_caveat([{**gain, "passed": True}]) == "" == ex.horizon_caveat([])


def test_section_11s_redraw_of_the_texts_sizes_in_words():
    trend = dict(id="beyond.trend", note="trained / rug: ns = 1024: 0.839, ns = 4096: 0.985; s")
    rows = [trend, dict(id="headline.ns1024", measured=0.811)]
    devices = {"beyond.trend": "a GPU", "headline.ns1024": "a CPU"}
    assert ex.redraw_words(rows, devices) == (
        "Section 11's record trained the texts' sizes again (on a GPU; section 3's on a CPU, "
        "whose random streams differ): where both records hold a size, its ratios differ from "
        "section 3's by up to 0.028 (at ns = 1024): other draws of the same recipe."
    )
    assert "in a run of its own" in ex.redraw_words(rows, dict.fromkeys(devices, "a GPU"))
    assert ex.redraw_words(rows[:1], devices) == "" and ex.redraw_words([], {}) == ""


def test_figure_2_and_figures_4_to_7_in_words_from_a_ledger_or_a_record():
    ledger = Ledger("05_persian_rug", "paper")
    ledger.close_to(
        "fig2.trained_rug",
        "trained / rug",
        "s",
        expected=0,
        measured=0.488,
        tolerance=0.05,
        known_failure="fig2.gaussian",
        why="not Gaussian",
        note="ns = 2048; worst: p = 0.05, nd/ns = 0.60",
    )
    words = ex.figure2_words(ledger.rows, "none")
    assert words.startswith("it does not reproduce: trained / rug lies as far as 49% from 1")
    assert "(worst: p = 0.05, nd/ns = 0.60)" in words
    assert words.endswith("fig2.gaussian was not run")  # its explanation not in these rows
    ledger.at_least("fig2.gaussian", "prediction", "s", measured=0.99, bound=1)
    assert ex.figure2_words(ledger.rows, "none").endswith("fig2.gaussian, which tests why, fails")
    ledger.rows[-1].update(measured=1.0004, passed=True)
    assert ex.figure2_words(ledger.rows, "none").endswith("which tests why, holds")
    ledger.rows[0].update(measured=0.03, passed=True)
    assert ex.figure2_words(ledger.rows, "none").startswith(
        "it reproduces: trained / rug lies within"
    )
    assert ex.figure2_words([], "not yet recorded") == "not yet recorded"

    for name, figure, slope, error in [("diagonal", 4, -1.6, 0.1), ("bias", 5, 0.1, 0.02)]:
        ledger.at_most(
            f"sym.{name}",
            f"Figure {figure}: falls",
            "s",
            measured=slope,
            bound=-2 * error,
            spread=error,
        )
    fits = [row for row in ledger.rows if row["id"].startswith("sym.")]
    assert ex.symmetry_words(fits) == (
        "exponents -1.60 ± 0.10 (Figure 4), +0.10 ± 0.02 (Figure 5): the fall of Figure 5 does "
        "not hold by this test"
    )
    assert ex.symmetry_words(fits[:1]).endswith(": every fall holds")
    fits[1]["outside_regime"] = "a small grid"
    assert ex.symmetry_words(fits).endswith(
        "+0.10 ± 0.02 (Figure 5; outside the text's regime): every fall tested holds"
    )
    assert ex.symmetry_words([]) == "not recorded yet"


def test_the_stopping_rule_test_trains_early_runs_on_from_where_they_stopped(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCORE_CACHE", str(tmp_path))  # computed afresh, not served
    seeds = [0, 1, 2]
    sweep = ex.size_sweep([32], 0.1, 0.25, seeds)
    steps = sweep[32].steps
    assert sweep[32].converged.all() and len(set(steps)) == 3  # one stops before the median
    horizon = ex.horizon_runs(sweep, 0.1, 0.25)
    median = int(np.median(steps))
    assert horizon.horizon.tolist() == [median]
    early = steps < median
    assert horizon.early[0].tolist() == early.tolist()
    # the others keep their own loss; the early one is trained on, so its loss is a new one:
    # bit for bit that of its run had the rule not stopped it
    assert np.array_equal(horizon.at_horizon[0][~early], sweep[32].loss[~early])
    (k,) = np.nonzero(early)[0]
    uninterrupted = rt.train_group.uncached(32, [0.1], 8, [seeds[k]], steps=median)
    assert horizon.at_horizon[0][k] == uninterrupted.loss[0] != sweep[32].loss[k]
    assert np.array_equal(horizon.at_stop[0], sweep[32].loss)
    # the headline's verdict per size: within 5% of 1 or not, capped models left out
    rug = horizon.rug
    trained = np.array([[1.04 * rug, 1.05 * rug], [1.2 * rug, np.nan], [np.nan, np.nan]])
    with np.errstate(invalid="ignore"):
        assert ex.headline_holds(trained, rug).tolist() == [True, False, False]


def test_figure3s_models_trained_on_are_their_uninterrupted_runs_and_bad_input_is_refused(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TOYCORE_CACHE", str(tmp_path))  # computed afresh, not served
    point = ex.size_sweep([32], 0.1, 0.25, [0, 1])[32]
    assert point.converged.all() and point.steps[0] != point.steps[1]  # an index mix-up shows
    W, b = ex.trained_longer(point, 1.5)
    assert W.shape == (2, 32, 32) and b.shape == (2, 32)
    for k, seed in enumerate([0, 1]):
        steps = int(np.ceil(1.5 * point.steps[k]))
        uninterrupted = rt.train_group.uncached(32, [0.1], 8, [seed], steps=steps)
        assert np.array_equal(W[k], uninterrupted.W[0]) and np.array_equal(b[k], uninterrupted.b[0])
        assert not np.array_equal(b[k], point.b[k])
    with pytest.raises(ValueError, match="factor must exceed 1"):
        ex.trained_longer(point, 1)
    capped = SimpleNamespace(converged=np.array([False]), states=[None], steps=np.array([9]))
    with pytest.raises(ValueError, match="none to train on"):
        ex.trained_longer(capped, 2)


def test_a_value_outside_a_span_is_positive_on_an_end_zero_inside_negative():
    assert ex.distance_outside(-0.18, -0.16, -0.19) == pytest.approx(-0.01)
    assert ex.distance_outside(-0.18, -0.19, -0.16) == pytest.approx(-0.01)  # either order
    assert ex.distance_outside(-0.18, -0.16, -0.17) == pytest.approx(0.01)
    assert ex.distance_outside(-0.18, -0.18, -0.15) == 0
    with pytest.raises(ValueError, match="no NaN"):
        ex.distance_outside(-0.18, -0.16, np.nan)


def test_the_headline_figure_adds_the_records_sizes_and_passes_over_its_trend_row():
    from toycore.plots import persian_rug as plots

    rug = th.rug_loss(0.045, 0.25)[0]
    point = SimpleNamespace(
        W=None, b=None, loss=np.array([0.8 * rug]), converged=np.array([True]), steps=np.array([9])
    )
    head = ex.ratio_headline({1024: point}, 0.045, 0.25)
    recorded = [
        dict(id="headline.ns2048", measured=0.886),
        dict(id="headline.fitted_ns2048", measured=0.876),
        dict(id="headline.trend", measured=2.1),  # a row of the whole sweep, no size
    ]
    fig = plots.headline(head, ex.HEADLINE_TOLERANCE, recorded)
    hollow = {line.get_label(): line.get_xydata().tolist() for line in fig.axes[0].lines}
    assert hollow["trained / rug (ns → ∞), the texts' sizes"] == [[2048, 0.886]]
    assert hollow["trained / fitted rug, the texts' sizes"] == [[2048, 0.876]]


def test_the_stopping_rule_tests_words_follow_its_rows():
    def rows(gain, passed, moved, drops="ns=8: +1%"):
        return [
            {
                "id": "horizon.gain",
                "measured": gain,
                "expected": 0.05,
                "passed": passed,
                "note": f"drops: {drops}",
            },
            {"id": "horizon.headline", "measured": moved, "passed": moved == 0},
        ]

    held = ex.horizon_words(rows(0.01, True, 0))
    assert "lowered their loss by ns=8: +1%;" in held and "1.0%, is within the bound of 5%" in held
    assert held.endswith("0 headline verdicts move.")
    failed = ex.horizon_words(rows(0.056, False, 1))
    assert "5.6%, is beyond" in failed and failed.endswith("1 headline verdict moves.")
    none = ex.horizon_words(rows(0.0, True, 0, drops=""))
    assert (
        none == "no model of the sweep stopped before its size's median steps, and 0 "
        "headline verdicts move."
    )
    assert ex.horizon_words([]) == "was not recorded."


def test_a_loss_still_falling_where_its_run_stopped_is_told_from_a_flat_one():
    rng = np.random.default_rng(0)
    steps = ex.FALL_STEPS
    noise = rng.normal(0, 0.01, (2, steps + 500))  # per-step batch noise, 1% of the loss
    falling = 1 - 2e-5 * np.arange(steps + 500) + noise[0]  # 4% over the last steps
    flat = 1 + noise[1]
    ended = np.concatenate([flat[:-300], np.full(300, np.nan)])  # a run 300 steps shorter
    falls = ex.fall_at_stop(np.stack([falling, flat, ended]))
    assert falls[0] > 3 and abs(falls[1]) < 3 and abs(falls[2]) < 3
    # the slope is read over the run's own last steps: NaN padding changes nothing
    assert falls[2] == ex.fall_at_stop(flat[:-300])[0]
    with pytest.raises(ValueError, match="no last"):
        ex.fall_at_stop(falling[: steps - 1])


def test_the_stopping_rules_explanation_in_words_follows_its_row():
    row = dict(id="horizon.falling", passed=True, measured=23.4, note="ns = 2048: 23 to 29 s.e.")
    held = ex.falling_words([row])
    assert f"over the run's last {ex.FALL_STEPS:,} steps, by at least 23 standard" in held
    assert "(ns = 2048: 23 to 29 s.e.): each of these runs was still learning" in held
    failed = ex.falling_words([{**row, "passed": False, "measured": 1.2}])
    assert "by at least 1 standard" in failed and "not every run was still learning" in failed
    assert ex.falling_words([]) == "the test was not recorded yet."
    below = ex.falling_words([{**row, "outside_regime": "no size lies inside the regime"}])
    assert below.endswith(
        "still learning where the rule ended it (outside the text's regime: not counted)."
    )


def test_the_cells_where_features_can_be_represented_are_chosen_by_value_in_every_grid():
    # the cpu grid's sparsest p and smallest nd/ns are its first row and column; the texts' grid
    # goes sparser and smaller, and the same values are left out there too
    cpu = SimpleNamespace(densities=np.array([0.01, 0.05, 0.2]), ratios=np.array([0.05, 0.1]))
    texts = SimpleNamespace(
        densities=np.array([0.001, 0.01, 0.05]), ratios=np.array([0.02, 0.05, 0.1])
    )
    assert ex.represented_cells(cpu).tolist() == [[False, False], [False, True], [False, True]]
    assert ex.represented_cells(texts).tolist() == [
        [False, False, False],
        [False, False, False],
        [False, False, True],
    ]


def test_the_text_s_largest_size_is_read_in_words_and_its_rows_spread_is_scale_free():
    rows = [
        dict(id="largest.headline", measured=0.93, passed=False, note="ns = 8192, p = 0.045"),
        dict(id="largest.identical", measured=0.031, passed=True, note="ns = 8192, p = 0.045"),
    ]
    words = ex.largest_words(rows)
    assert words.startswith("at ns = 8192, trained / rug 0.930, which does not lie within")
    assert words.endswith("3.1% of their mean, within the 5% we read as identical.")
    assert ex.largest_words(rows[:1]) == "not recorded yet."
    away = [dict(row, outside_regime="this build trains ns = 384") for row in rows]
    assert ex.largest_words(away).endswith("identical (outside the text's regime: not counted).")
    W = np.random.default_rng(0).normal(size=(2, 6, 6))
    spread = th.row_interference_spread(W)
    np.testing.assert_allclose(th.row_interference_spread(3 * W), spread)
    W_in, W_out, _ = th.persian_rug(64, 16, seed=0)  # every row's Σ_{j≠i} R_ij² alike
    assert th.row_interference_spread((W_out @ W_in)[None])[0] < 1e-6


# --- eq. 6, appendix C, the tight-frame note of section 4.2.1 and appendix D, by hand ----------


def _harmonic_frame(features, frequencies):
    """Orthonormal real columns (ns, nd): the constant for frequency 0, and √(2/ns) cos and sin
    of 2πkj/ns for each other k (0 < k < ns/2): a harmonic frame, no Hadamard matrix in it."""
    j = np.arange(features)
    columns = []
    for k in frequencies:
        if k == 0:
            columns.append(np.full(features, 1 / np.sqrt(features)))
        else:
            columns.append(np.sqrt(2 / features) * np.cos(2 * np.pi * k * j / features))
            columns.append(np.sqrt(2 / features) * np.sin(2 * np.pi * k * j / features))
    return np.stack(columns, axis=1)


def _mean_off_diagonal_variance(W, p):
    """The left side of eq. 19 by hand: (4p - 3p²)/12 · (1/ns) Σ_i Σ_{j≠i} |W_ij|²."""
    off = np.abs(W) ** 2
    return (4 * p - 3 * p**2) / 12 * (off.sum() - np.trace(off)) / W.shape[0]


def test_eq_6_is_saturated_by_harmonic_frames_and_exceeded_by_uneven_spectra():
    p, features = 0.05, 60  # 60 is no power of 2: these are not Hadamard rugs
    # real cos/sin frequencies {0, 3, 7, 11, 20, 26}: nd = 11, (ns/nd) P has unit diagonal
    F = _harmonic_frame(features, (0, 3, 7, 11, 20, 26))
    hidden = F.shape[1]
    assert hidden == 11 and np.allclose(F.T @ F, np.eye(hidden), atol=1e-13)
    W = features / hidden * F @ F.T
    assert np.abs(np.diag(W) - 1).max() < 1e-13
    assert np.linalg.matrix_rank(W) == hidden
    bound = (4 * p - 3 * p**2) / 12 * (features / hidden - 1)  # eq. 6 by hand
    assert th.variance_bound(p, hidden / features) == pytest.approx(bound, rel=1e-15)
    assert _mean_off_diagonal_variance(W, p) == pytest.approx(bound, rel=1e-12)
    assert ex.bound_ratios(W, p, hidden / features) == pytest.approx(1, abs=1e-12)
    # complex DFT frequencies: W = (ns/nd) F_S F_S† is Hermitian, not real, and saturates too
    S = [0, 1, 5, 9, 17, 30, 44, 51]
    dft = np.exp(2j * np.pi * np.outer(np.arange(features), S) / features) / np.sqrt(features)
    W = features / len(S) * dft @ dft.conj().T
    assert np.abs(np.diag(W) - 1).max() < 1e-13
    saturated = (4 * p - 3 * p**2) / 12 * (features / len(S) - 1)
    assert _mean_off_diagonal_variance(W, p) == pytest.approx(saturated, rel=1e-12)
    # symmetric, unit diagonal, rank nd, unequal eigenvalues: the Gram matrix of ns random unit
    # vectors in R^nd. Σλ² - (Σλ)²/nd = nd·Var(λ), so the excess over eq. 6 is known exactly
    rng = np.random.default_rng(0)
    for hidden in (5, 11, 30):
        V = rng.normal(size=(features, hidden)) * rng.uniform(0.2, 3, size=hidden)
        V /= np.linalg.norm(V, axis=1, keepdims=True)
        W = V @ V.T
        eigenvalues = np.linalg.eigvalsh(V.T @ V)  # W's nonzero eigenvalues
        assert np.linalg.matrix_rank(W) == hidden and eigenvalues.sum() == pytest.approx(features)
        excess = (4 * p - 3 * p**2) / 12 * hidden * eigenvalues.var() / features
        bound = th.variance_bound(p, hidden / features)
        assert _mean_off_diagonal_variance(W, p) - bound == pytest.approx(excess, rel=1e-9)
        assert excess > 0.05 * bound  # strictly above, by a margin
        assert ex.bound_ratios(W, p, hidden / features) > 1.05
    # equal nonzero eigenvalues but rank below nd: strictly above the rank-nd bound
    F = _harmonic_frame(features, (0, 3, 7))  # rank 5
    W = features / 5 * F @ F.T
    assert ex.bound_ratios(W, p, 11 / features) == pytest.approx((60 / 5 - 1) / (60 / 11 - 1))


def test_eq_20s_chain_holds_link_by_link_and_normal_matrices_close_only_the_first_link():
    rng = np.random.default_rng(1)
    features = 48
    for hidden, seed in [(4, 0), (12, 1), (30, 2)]:
        A, B = rng.normal(size=(features, hidden)), rng.normal(size=(hidden, features))
        d = np.einsum("ik,ki->i", A, B)
        W = A @ B / d[:, None]  # unit diagonal, rank nd, not symmetric
        assert np.abs(np.diag(W) - 1).max() < 1e-12 and np.linalg.matrix_rank(W) == hidden
        eigenvalues = np.linalg.eigvals(B @ (A / d[:, None]))  # W's nd nonzero eigenvalues
        assert eigenvalues.sum() == pytest.approx(features, rel=1e-10)  # eq. 18
        U = scipy.linalg.schur(W.astype(complex), output="complex")[0]
        frobenius = np.trace(W @ W.T)
        assert (np.abs(U) ** 2).sum() == pytest.approx(frobenius, rel=1e-10)
        squares = (np.abs(eigenvalues) ** 2).sum()
        assert frobenius > squares * (1 + 1e-3)  # Schur: not normal, strictly
        assert squares > features**2 / hidden * (1 + 1e-3)  # Cauchy–Schwarz: λ unequal
    # a real circulant matrix is normal: Schur's link is an equality. With unit diagonal and
    # complex (conjugate-paired) eigenvalues it is not symmetric, and Cauchy–Schwarz stays strict
    features, pairs = 40, (3, 8, 13)
    spectrum = np.zeros(features, complex)
    spectrum[0] = features / 7
    for k, phase in zip(pairs, (0.4, -1.1, 2.0)):
        spectrum[k] = features / 7 * np.exp(1j * phase)
        spectrum[-k] = spectrum[k].conjugate()
    spectrum *= features / spectrum.sum().real  # Σλ = ns, so the diagonal is 1
    first_row = np.fft.ifft(spectrum).real
    W = scipy.linalg.circulant(first_row)
    assert np.abs(np.diag(W) - 1).max() < 1e-12 and np.linalg.matrix_rank(W) == 7
    assert np.abs(W - W.T).max() > 0.1 and np.allclose(W @ W.T, W.T @ W, atol=1e-12)
    squares = (np.abs(spectrum) ** 2).sum()
    assert np.trace(W @ W.T) == pytest.approx(squares, rel=1e-12)
    assert squares > features**2 / 7 * (1 + 1e-2)
    assert ex.bound_ratios(W, 0.05, 7 / features) > 1.01


@pytest.mark.parametrize("features, hidden", [(256, 40), (64, 16)])
def test_the_rug_is_a_tight_frame_and_ns_over_nd_times_a_projector_not_a_projector(
    features, hidden
):
    W_in, W_out, rows = th.persian_rug(features, hidden, seed=0)
    R = W_out @ W_in
    # section 4.2.1: Tr(W)² = ns² = nd Tr(W W†)
    assert np.trace(R) ** 2 == pytest.approx(features**2, rel=1e-13)
    assert hidden * np.trace(R @ R.T) == pytest.approx(features**2, rel=1e-12)
    # the "square root" √R = H_Sᵀ/√nd (ns, nd): √R √Rᵀ = R and its rows form a tight frame,
    # √Rᵀ √R = (ns/nd) I
    root = th.hadamard(features, rows).T / np.sqrt(hidden)
    assert np.abs(root @ root.T - R).max() < 1e-13
    assert np.abs(root.T @ root - features / hidden * np.eye(hidden)).max() < 1e-12
    # section 4.2.2 calls R "a projector"; it is ns/nd times one: R² = (ns/nd) R, R² ≠ R
    assert np.abs(R @ R - features / hidden * R).max() < 1e-12
    assert np.abs(R @ R - R).max() == pytest.approx(features / hidden - 1, rel=1e-12)
    assert (
        sorted(np.round(np.linalg.eigvalsh(R), 9))
        == [0.0] * (features - hidden) + [round(features / hidden, 9)] * hidden
    )
    # and the printed H_ij = parity(bin(i) ⊕ bin(j)), as ±1, is s_i s_j (rank 1), not Hadamard
    i = np.arange(features)
    printed = 1 - 2 * (np.bitwise_count(np.bitwise_xor.outer(i, i)) & 1).astype(float)
    assert np.linalg.matrix_rank(printed) == 1
    assert np.linalg.matrix_rank(th.hadamard(features)) == features


# appendix D: P[|u - y| <= σ] for the untruncated normal, and the constant C of Var(u | y) >= Cσ²
ONE_SIGMA = special.erf(2**-0.5)
APPENDIX_D_C = ONE_SIGMA - np.sqrt(2 / np.pi) * np.exp(-0.5)


def _truncated(y, sigma):
    """u | y for u ~ U[0,1], y = u + ν, ν ~ N(0, σ²): N(y, σ²) truncated to [0, 1] (eq. 26).
    (Z(y), Var[u|y]) by hand from the standard truncated-normal moments."""
    lo, hi = -y / sigma, (1 - y) / sigma
    mass = special.ndtr(hi) - special.ndtr(lo)
    phi_lo, phi_hi = np.exp(-(lo**2) / 2), np.exp(-(hi**2) / 2)
    shift = (phi_lo - phi_hi) / np.sqrt(2 * np.pi) / mass
    spread = (lo * phi_lo - hi * phi_hi) / np.sqrt(2 * np.pi) / mass
    return np.sqrt(2 * np.pi) * sigma * mass, sigma**2 * (1 + spread - shift**2)


def _within_one_sigma(y, sigma):
    """P[R = 1] = P[|u - y| <= σ | y]."""
    lo, hi = np.maximum(y - sigma, 0), np.minimum(y + sigma, 1)
    inside = np.maximum(special.ndtr((hi - y) / sigma) - special.ndtr((lo - y) / sigma), 0)
    return inside / (special.ndtr((1 - y) / sigma) - special.ndtr(-y / sigma))


def test_appendix_d_normaliser_one_sigma_mass_and_conditional_variance():
    sigmas = np.geomspace(1e-3, 0.2499, 40)[:, None]
    ys = sigmas + (1 - 2 * sigmas) * np.linspace(0, 1, 201)  # y ∈ [σ, 1 - σ]
    Z, variance = _truncated(ys, sigmas)
    # the hand formulas against quadrature and scipy's truncated normal
    for sigma, y in [(0.2, 0.3), (0.05, 0.05), (0.01, 0.7)]:
        direct = integrate.quad(lambda x: np.exp(-((x - y) ** 2) / (2 * sigma**2)), 0, 1)[0]
        assert _truncated(y, sigma)[0] == pytest.approx(direct, rel=1e-10)
        law = stats.truncnorm(-y / sigma, (1 - y) / sigma, loc=y, scale=sigma)
        assert _truncated(y, sigma)[1] == pytest.approx(law.var(), rel=1e-9)
        assert _within_one_sigma(y, sigma) == pytest.approx(
            law.cdf(y + sigma) - law.cdf(y - sigma), rel=1e-12
        )
    # Z(y) < √(2πσ²), for every y: Z/√(2πσ²) is a Gaussian's mass on [0, 1], at most 1 (it
    # rounds to 1 in float64 for small σ and y inside), and for σ = 1/4 strictly below
    everywhere = np.linspace(-1, 2, 301)
    mass = special.ndtr((1 - everywhere) / sigmas) - special.ndtr(-everywhere / sigmas)
    assert (mass <= 1).all() and (mass[-1] < 1 - 1e-6).all()
    # P[R = 1] >= erf(2^-1/2) on y ∈ [σ, 1 - σ], reached where the truncation is far ...
    one_sigma = ONE_SIGMA
    within = _within_one_sigma(ys, sigmas)
    # ((y ± σ) - y)/σ loses about eps·y/σ <= 2.2e-16 · 1000 to rounding: allow 1e-12
    assert within.min() >= one_sigma - 1e-12
    assert _within_one_sigma(0.5, 0.01) == pytest.approx(one_sigma, abs=1e-12)
    # ... and failing outside that range, so the condition is needed
    assert _within_one_sigma(-0.5 * 0.1, 0.1) < one_sigma - 0.1
    # eq. 28 and the constant it gives: Var[u | R = 1] is N(0, σ²) cut to ±σ, so
    # C = erf(2^-1/2) (1 - 2φ(1)/erf(2^-1/2)) = erf(2^-1/2) - √(2/π) e^-1/2 ≈ 0.1988
    inner = sigmas**2 * (1 - 2 * np.exp(-0.5) / np.sqrt(2 * np.pi) / one_sigma)
    assert (variance >= within * inner * (1 - 1e-12)).all()
    C = APPENDIX_D_C
    assert C == pytest.approx(0.19875, abs=1e-5)
    ratio = variance / sigmas**2
    assert ratio.min() >= C
    # the true constant is larger and does not fall to 0 as σ -> 0: the worst y is the edge
    # y = σ, and there Var/σ² tends to the variance of N(0, 1) cut below at -1, about 0.630
    edge = stats.truncnorm(-1, np.inf).var()
    assert ratio.min() > 0.6 and ratio.min(axis=1)[0] == pytest.approx(edge, rel=1e-6)
    # and the worst case over y only rises as σ falls (0.616 at σ = 1/4, 0.630 in the limit)
    assert (np.diff(ratio.min(axis=1)) <= 1e-12).all() and ratio.min() > 0.61
    # "a trivial scaling argument shows that the variance is proportional to σ²": only up to a
    # bounded factor that depends on y/σ, not proportional (Var/σ² spans [0.63, 1])
    assert ratio.max() - ratio.min() > 0.3


def test_appendix_d_last_steps_and_the_direction_of_its_first_line():
    # eq. 30: P[y ∈ [σ, 1 - σ]] falls as σ grows to 1/4, so it is least at σ = 1/4
    def inside(sigma):
        u = th.U_NODES
        cdf = special.ndtr((1 - sigma - u) / sigma) - special.ndtr((sigma - u) / sigma)
        return th.U_WEIGHTS @ cdf

    sigmas = np.linspace(0.005, 0.25, 50)
    probabilities = np.array([inside(s) for s in sigmas])
    assert (np.diff(probabilities) < 0).all() and probabilities[-1] > 0.3
    C = APPENDIX_D_C
    for sigma in (0.01, 0.05, 0.25):
        assert th.bayes_on_loss(sigma) >= C * sigma**2 * probabilities[-1]
    # the first line prints "L ≤ p L_on"; with L = (1 - p) L_off + p L_on and L_off >= 0 it is
    # L >= p L_on, strictly whenever the off term leaks. Monte Carlo of L for ReLU(a(x+ν)+b)
    # against p L_on by quadrature, 4 standard errors
    rng = np.random.default_rng(3)
    a, b, sigma, p, n = 1.0, 0.0, 0.3, 0.05, 400_000
    x = np.where(rng.random(n) < p, rng.random(n), 0.0)
    samples = (x - np.maximum(a * (x + rng.normal(0, sigma, n)) + b, 0)) ** 2
    standard_error = samples.std() / np.sqrt(n)
    off, on = th.macroscopic_parts(a, b, sigma)
    assert off == pytest.approx(sigma**2 / 2, rel=1e-12)  # E ReLU(ν)² by hand
    assert samples.mean() - p * on > 4 * standard_error + 0.04
    # and the chain the appendix wants, L >= p L_on >= p E Var(u|y)
    assert p * on >= p * th.bayes_on_loss(sigma)


def test_eq_12_needs_a_constant_of_at_least_root_2_for_eq_13():
    # with the threshold μ = c σ √log(1/p), eq. 11 bounds the off term by σ²/2 · p^(c²/2); the
    # exact term is smaller only by a power of log(1/p) (Mills' ratio), so at c = 1 it outgrows
    # eq. 13's σ² p log(1/p) as p -> 0, while from c = √2 on it stays below σ² p / 2
    sigma, densities = 0.1, np.geomspace(1e-2, 1e-8, 7)

    def off_term(c, p):
        return th.macroscopic_parts(1.0, -c * sigma * np.sqrt(np.log(1 / p)), sigma)[0]

    eq13 = sigma**2 * densities * np.log(1 / densities)
    at_one = np.array([off_term(1.0, p) for p in densities]) / eq13
    assert (np.diff(at_one) > 0).all()  # the ratio to eq. 13 grows as p falls
    at_root_two = np.array([off_term(np.sqrt(2), p) for p in densities])
    assert (at_root_two < sigma**2 * densities / 2).all()
    assert (np.diff(at_root_two / eq13) < 0).all()  # and its ratio to eq. 13 falls
