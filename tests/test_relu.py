"""Chapter 2: the toy model, the sparsity-pattern expansion and its closed-form terms."""

import itertools
import math

import numpy as np
import pytest
import torch

from toycore.data import SparseUniform, sparse_moments
from toycore.experiments import relu as ex
from toycore.models import ToyModel, toy_sample_loss
from toycore.theory import relu as th

DTYPE = torch.float64


def random_model(features=4, hidden=2, instances=3, seed=0):
    """Random float64 W, b (some biases positive) and importance."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(instances, hidden, features, generator=g, dtype=DTYPE)
    b = torch.randn(instances, features, generator=g, dtype=DTYPE) * 0.5
    importance = torch.rand(instances, features, generator=g, dtype=DTYPE) + 0.5
    return W, b, importance


# --- the model -------------------------------------------------------------------------------


def test_model_shapes_init_and_loss_definition():
    model = ToyModel(5, 2, seeds=[0, 1, 2], importance=0.9 ** torch.arange(5.0))
    assert model.W.shape == (3, 2, 5) and model.b.shape == (3, 5)
    assert model.importance.shape == (3, 5) and torch.all(model.b == 0)
    x = SparseUniform([0, 1, 2], 5, 0.5).sample(64)
    y = torch.relu(torch.einsum("ihf,ihg,ibg->ibf", model.W, model.W, x) + model.b[:, None])
    expected = (model.importance[:, None] * (x - y) ** 2).sum(-1).mean(-1)
    torch.testing.assert_close(model.loss(x), expected)
    linear = ToyModel(5, 2, seeds=[0], output="linear")
    torch.testing.assert_close(
        linear(x[:1]), torch.einsum("ihf,ihg,ibg->ibf", linear.W, linear.W, x[:1])
    )


def test_model_gradients_match_finite_differences():
    W, b, importance = random_model()
    x = SparseUniform([0, 1, 2], 4, 0.3, dtype=DTYPE, device="cpu").sample(8)  # as W, b
    for output in ("relu", "linear"):
        assert torch.autograd.gradcheck(
            lambda W, b: toy_sample_loss(W, b, importance, x, output).mean(-1),
            (W.clone().requires_grad_(), b.clone().requires_grad_()),
        )


def test_each_instance_gets_the_gradient_it_would_get_alone():
    seeds, importance = [3, 7], torch.tensor([[1.0, 0.5, 0.2], [1.0, 1.0, 1.0]])
    together = ToyModel(3, 2, seeds, importance=importance)
    x = SparseUniform(seeds, 3, [0.2, 0.8]).sample(32)
    together.loss(x).sum().backward()
    for i, seed in enumerate(seeds):
        alone = ToyModel(3, 2, [seed], importance=importance[i])
        alone.loss(x[i : i + 1]).sum().backward()
        torch.testing.assert_close(together.W.grad[i], alone.W.grad[0])
        torch.testing.assert_close(together.b.grad[i], alone.b.grad[0])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(output="tanh"), "output must be one of relu, linear"),
        (dict(importance=[1.0, 2.0]), "importance must have shape"),
        (dict(importance=[1.0, -1.0, 1.0]), "finite and > 0"),
        (dict(hidden=0), "hidden must be an integer"),
    ],
)
def test_model_rejects_bad_parameters(kwargs, message):
    arguments = dict(features=3, hidden=2, seeds=[0]) | kwargs
    with pytest.raises(ValueError, match=message):
        ToyModel(**arguments)


def test_importance_decay_must_be_in_unit_interval():
    with pytest.raises(ValueError, match=r"decay must be finite and in \(0, 1\]"):
        ex.importance_profile(4, 0.0)


# --- the expansion ---------------------------------------------------------------------------


def test_pattern_weights_times_counts_are_the_binomial_distribution():
    for n, S in [(3, 0.2), (7, 0.9)]:
        probabilities = th.pattern_weights(n, S) * th.pattern_counts(n)
        assert probabilities.sum().item() == pytest.approx(1, abs=1e-14)
        assert probabilities[2].item() == pytest.approx(
            math.comb(n, 2) * (1 - S) ** 2 * S ** (n - 2)
        )


def test_expansion_is_exact_for_the_linear_model():
    """Σ_k (1-S)^k S^(n-k) L_k, each L_k integrated exactly (the integrand is quadratic, so
    2-point Gauss-Legendre per active coordinate is exact), equals the exact linear loss."""
    n, S = 3, 0.35
    W, b, importance = random_model(features=n)
    nodes, weights = np.polynomial.legendre.leggauss(2)
    nodes, weights = (nodes + 1) / 2, weights / 2  # on [0, 1]
    L = torch.zeros(W.shape[0], n + 1, dtype=DTYPE)
    for pattern in itertools.product([0, 1], repeat=n):
        active = [i for i in range(n) if pattern[i]]
        for point in itertools.product(range(2), repeat=len(active)):
            x = torch.zeros(1, 1, n, dtype=DTYPE)
            weight = 1.0
            for i, p in zip(active, point):
                x[..., i], weight = nodes[p], weight * weights[p]
            L[:, len(active)] += (
                weight
                * toy_sample_loss(W, b, importance, x.expand(W.shape[0], 1, n), "linear")[:, 0]
            )
    expansion = (th.pattern_weights(n, S) * L).sum(-1)
    torch.testing.assert_close(expansion, th.linear_loss(W, b, importance, S), rtol=1e-12, atol=0)


def test_linear_loss_matches_monte_carlo():
    W, b, importance = random_model(features=5, hidden=2)
    S = torch.tensor([0.0, 0.5, 0.9], dtype=DTYPE)
    x = SparseUniform([0, 1, 2], 5, S.tolist(), dtype=DTYPE, device="cpu").sample(200_000)
    losses = toy_sample_loss(W, b, importance, x, "linear")
    error = losses.std(-1) / losses.shape[-1] ** 0.5
    assert torch.all((losses.mean(-1) - th.linear_loss(W, b, importance, S)).abs() < 4 * error)


def test_linear_expansion_is_the_loss_up_to_moments_and_cross_terms():
    W, _, importance = random_model(features=5, hidden=2, instances=3)
    S = torch.tensor([0.0, 0.6, 0.95], dtype=DTYPE)
    gram = W.transpose(-1, -2) @ W
    norms = torch.diagonal(gram, dim1=-2, dim2=-1)
    off = ~torch.eye(5, dtype=torch.bool)
    text = (importance * (1 - norms) ** 2).sum(-1) + (importance[:, None, :] * gram**2 * off).sum(
        (-1, -2)
    )
    expansion, cross = th.linear_terms(W, importance)
    torch.testing.assert_close(expansion, text, rtol=1e-12, atol=0)
    zero = torch.zeros_like(importance)
    torch.testing.assert_close(
        th.linear_loss_by_expansion(W, importance, S),
        th.linear_loss(W, zero, importance, S),
        rtol=1e-12,
        atol=0,
    )
    best = th.best_linear_bias(W, S)
    at_best = th.linear_loss(W, best, importance, S)
    torch.testing.assert_close(
        th.linear_loss_by_expansion(W, importance, S, best_bias=True), at_best, rtol=1e-12, atol=0
    )
    torch.testing.assert_close(
        at_best,
        S.new_tensor([1 / 3 - 1 / 4, 0.4 / 3 - 0.04, 0.05 / 3 - 0.05**2 / 4]) * expansion,
        rtol=1e-12,
        atol=0,
    )
    for nudge in (-1e-3, 1e-3):  # the best bias is a minimum
        assert torch.all(th.linear_loss(W, best + nudge, importance, S) > at_best)
    assert torch.all(cross.abs() > 1e-3)  # nonzero-mean features: b = 0 is not Var × expansion


def test_linear_expansion_identities_agree_with_monte_carlo():
    result = ex.linear_expansion(5, 2, [0.0, 0.9], 4, 20_000, decay=0.9)
    assert result.direct.shape == (2, 4)
    assert np.all(np.abs(result.direct - result.identity) < 4 * result.direct_error)
    assert np.all(np.abs(result.best_direct - result.best_identity) < 4 * result.best_direct_error)
    np.testing.assert_allclose(result.identity, result.moments, rtol=1e-12)
    np.testing.assert_allclose(result.best_identity, result.best_moments, rtol=1e-12)


def small_sweep():
    W, b, importance = random_model(features=4, hidden=2, instances=2, seed=1)
    grid = (2, 1)
    return ex.Sweep(
        features=4,
        hidden=2,
        output="relu",
        decay=float("nan"),  # the importance below is random, not decay^i
        sparsities=np.array([0.3, 0.9]),
        seeds=np.array([0]),
        W=W.reshape(*grid, 2, 4),
        b=b.reshape(*grid, 4),
        importance=importance.reshape(*grid, 4),
    )


def test_pattern_expansion_adds_up_to_the_direct_estimate():
    result = ex.pattern_expansion(small_sweep(), samples=20_000)
    z = (result.expansion - result.direct) / np.hypot(result.expansion_error, result.direct_error)
    assert np.all(np.abs(z) < 4)
    np.testing.assert_allclose(result.L0, result.L0_exact, rtol=0, atol=1e-15)
    assert np.all(np.abs(result.L1 - result.L1_exact) < 4 * result.L1_error)
    assert result.terms.shape == (2, 1, 5)


def test_zero_input_loss_is_the_positive_bias_penalty_exactly():
    W, b, importance = random_model()
    assert torch.any(b > 0) and torch.any(b < 0)
    zero = torch.zeros(W.shape[0], 1, W.shape[-1], dtype=DTYPE)
    assert torch.equal(
        toy_sample_loss(W, b, importance, zero)[:, 0], (importance * torch.relu(b) ** 2).sum(-1)
    )
    assert torch.equal(th.zero_input_loss(b, importance), (importance * torch.relu(b) ** 2).sum(-1))


def test_one_sparse_integrals_match_quadrature():
    W, b, importance = random_model(features=5, hidden=3)
    benefit, interference = th.one_sparse_terms(W, b, importance)
    t = torch.linspace(0, 1, 100_001, dtype=DTYPE)
    gram = W.transpose(-1, -2) @ W
    for inst, i in [(0, 1), (2, 4)]:
        y = torch.relu(gram[inst, i][:, None] * t + b[inst][:, None])  # every output j vs x_i = t
        own = importance[inst, i] * torch.trapezoid((t - y[i]) ** 2, t)
        others = importance[inst][:, None] * torch.trapezoid(y**2, t)[:, None]
        assert benefit[inst, i].item() == pytest.approx(own.item(), abs=1e-8)
        for j in range(5):
            expected = 0.0 if j == i else others[j, 0].item()
            assert interference[inst, i, j].item() == pytest.approx(expected, abs=1e-8)


def test_relu_square_integral_edge_cases():
    a = torch.tensor([0.0, 0.0, 2.0, -2.0, 1.0], dtype=DTYPE)
    c = torch.tensor([0.5, -0.5, -1.0, 1.0, -2.0], dtype=DTYPE)
    # c^2 on [0,1]; nothing; ∫_{1/2}^1 (2x-1)^2 = 1/6; ∫_0^{1/2} (1-2x)^2 = 1/6; never positive
    torch.testing.assert_close(
        th.relu_square_integral(a, c), torch.tensor([0.25, 0, 1 / 6, 1 / 6, 0], dtype=DTYPE)
    )


def test_negative_interference_and_negative_bias_are_free_at_one():
    # two antipodal features and one at 80 degrees from the first, with a negative bias
    angle = math.radians(80)
    W = torch.tensor([[[1.0, -1.0, math.cos(angle)], [0.0, 0.0, math.sin(angle)]]], dtype=DTYPE)
    b = torch.tensor([[0.0, 0.0, -0.2]], dtype=DTYPE)
    ones = torch.ones(1, 3, dtype=DTYPE)
    _, paid = th.one_sparse_at_one(W, b, ones)
    _, linear = th.one_sparse_at_one(W, b, ones, relu=False, bias=False)
    assert paid[0, 0, 1] == 0 and linear[0, 0, 1] == 1  # antipodal: free with the ReLU
    assert paid[0, 0, 2] == 0  # cos 80° = 0.17 < 0.2: the bias frees it
    assert paid[0, 2, 0] == pytest.approx(math.cos(angle) ** 2)  # b_0 = 0 frees nothing


# --- linear vs ReLU, shapes, packing ---------------------------------------------------------


def test_trained_linear_model_never_exceeds_m_features_and_reaches_the_optimum():
    sweep = ex.train_sweep.__wrapped__(
        6, 2, [0.0, 0.9, 0.97], [0, 1], decay=0.8, steps=1500, lr=1e-2, output="linear"
    )
    assert ex.represented_count(sweep.W).max() <= 2
    assert np.abs(ex.linear_gap(sweep)).max() < 0.01
    relu = ex.train_sweep.__wrapped__(6, 2, [0.97], [0, 1], decay=0.8, steps=1500, lr=1e-2)
    assert ex.represented_count(relu.W).min() > 2


def unit(degrees):
    return [math.cos(math.radians(degrees)), math.sin(math.radians(degrees))]


@pytest.mark.parametrize(
    "angles, shape",
    [
        ([10, 100], "orthogonal pair"),
        ([0, 90, 180, 270], "antipodal pairs"),
        ([5, 77, 149, 221, 293], "pentagon"),
        ([0, 60, 120], "other"),
        ([0, 90, 180, 260], "other"),
    ],
)
def test_planar_shape_names_hand_built_configurations(angles, shape):
    w = torch.tensor([unit(a) for a in angles], dtype=DTYPE).T
    w = torch.cat([w, 0.1 * torch.ones(2, 1, dtype=DTYPE)], dim=1)  # one unrepresented feature
    assert ex.planar_shape(w) == shape


def test_planar_shape_needs_two_dimensions():
    with pytest.raises(ValueError, match="hidden = 2"):
        ex.planar_shape(torch.ones(3, 4))


def test_packing_energy_of_the_pentagon_and_its_minimisation():
    pentagon = torch.tensor([unit(72 * k) for k in range(5)], dtype=DTYPE)
    assert th.packing_energy(pentagon).item() == pytest.approx(10 * math.cos(math.radians(72)) ** 2)
    square = torch.tensor([unit(0), unit(180), unit(90), unit(270)], dtype=DTYPE)
    assert th.packing_energy(square).item() < 1e-30  # all overlaps <= 0: no energy
    energies, best = th.minimize_packing_energy(5, 2, restarts=8, steps=1500)
    assert energies[0].item() == pytest.approx(10 * math.cos(math.radians(72)) ** 2, rel=1e-6)
    assert best.shape == (5, 2)


@pytest.mark.parametrize("n, S", [(3, 0.5), (5, 0.9), (12, 0.997)])
def test_two_or_more_active_sums_the_patterns_beyond_l0_and_l1(n, S):
    by_pattern = sum((1 - S) ** k * S ** (n - k) * math.comb(n, k) for k in range(2, n + 1))
    assert float(th.two_or_more_active(n, S)) == pytest.approx(by_pattern, rel=1e-9)


# --- feature benefit --------------------------------------------------------------------------


def test_relu_never_makes_the_benefit_lost_worse_and_helps_below_zero():
    # |W_i|^2 + b_i = 0.5, 0 and -0.3: the ReLU changes only the last
    W = torch.tensor([[[1.0, 0.5, 0.0]]], dtype=DTYPE)
    b = torch.tensor([[-0.5, -0.25, -0.3]], dtype=DTYPE)
    ones = torch.ones(1, 3, dtype=DTYPE)
    with_relu, _ = th.one_sparse_at_one(W, b, ones)
    without, _ = th.one_sparse_at_one(W, b, ones, relu=False)
    torch.testing.assert_close(with_relu, torch.tensor([[0.25, 1.0, 1.0]], dtype=DTYPE))
    torch.testing.assert_close(without, torch.tensor([[0.25, 1.0, 1.69]], dtype=DTYPE))
    result = ex.benefit_without_relu(small_sweep(), random=6)
    assert result.at_one.shape == result.integrated.shape == (2 + 6, 4)
    assert result.at_one.max() <= 0 and result.integrated.max() <= 1e-15
    assert 0 < result.helped < 1 and result.at_one.min() < 0


def test_linear_one_sparse_terms_match_quadrature():
    W, b, importance = random_model()
    benefit, interference = th.one_sparse_terms(W, b, importance, relu=False)
    x = torch.linspace(0, 1, 20001, dtype=DTYPE)
    gram = W.transpose(-1, -2) @ W
    norms = torch.diagonal(gram, dim1=-2, dim2=-1)
    residual = x - (norms[..., None] * x + b[..., None])
    expected = importance * torch.trapezoid(residual**2, x)
    torch.testing.assert_close(benefit, expected, rtol=1e-7, atol=0)
    pre = gram[..., None] * x + b[:, None, :, None]
    expected = importance[:, None, :] * torch.trapezoid(pre**2, x)
    off = ~torch.eye(4, dtype=torch.bool)
    torch.testing.assert_close(interference[:, off], expected[:, off], rtol=1e-7, atol=0)


def test_relu_against_linear_is_zero_where_no_output_is_clipped():
    sweep = small_sweep()
    W = torch.zeros_like(sweep.W)
    fields = dict(sweep.__dict__, W=W, b=sweep.b.abs())  # outputs ReLU(b) = b > 0
    relu = ex.Sweep(**fields)
    linear = ex.Sweep(**(fields | dict(output="linear")))
    gap, error = ex.relu_against_linear(relu, linear, samples=1000)
    np.testing.assert_allclose(gap, 0, atol=1e-15)
    assert gap.shape == error.shape == (2, 1)
    negative = ex.Sweep(**(fields | dict(b=-sweep.b.abs())))  # the ReLU clips b < 0 to 0
    gap, _ = ex.relu_against_linear(
        negative, ex.Sweep(**(fields | dict(b=-sweep.b.abs(), output="linear"))), 1000
    )
    assert np.all(gap < 0)
    with pytest.raises(ValueError, match="ReLU sweep and then a linear sweep"):
        ex.relu_against_linear(linear, relu, 10)


def test_unrepresented_bias_picks_the_left_out_features():
    sweep = small_sweep()
    W = sweep.W.clone()
    W[0, 0, :, 1] = 0.05  # |W_1| = 0.07 < 0.1 in the first model only
    result = ex.unrepresented_bias(ex.Sweep(**(sweep.__dict__ | dict(W=W))), batch=100)
    assert result.bias.tolist() == [sweep.b[0, 0, 1].item()]
    np.testing.assert_allclose(result.mean, [(1 - 0.3) / 2])
    np.testing.assert_allclose(result.noise, [((0.7 / 3 - 0.7**2 / 4) / 100) ** 0.5])
    np.testing.assert_allclose(result.sparsity, [0.3])


def test_figure_shapes_reads_the_figure_sparsities():
    sweep = ex.Sweep(
        **(
            small_sweep().__dict__
            | dict(sparsities=np.array([0.0, 0.8, 0.9]), seeds=np.array([0, 1]))
        )
    )
    shapes = [
        ["orthogonal pair", "other"],
        ["other", "antipodal pairs"],
        ["pentagon", "pentagon"],
    ]
    loss = np.array([[1.0, 2.0], [1.0, 2.0], [2.0, 1.0]])
    found = ex.figure_shapes(sweep, shapes, loss)
    assert found == {
        0.0: ("orthogonal pair", 0.5, shapes[0]),
        0.8: ("other", 0.5, shapes[1]),
        0.9: ("pentagon", 1.0, shapes[2]),
    }
    with pytest.raises(ValueError, match="no sparsity 0.0"):
        ex.figure_shapes(small_sweep(), shapes, loss)


# --- L_1 at x_i = 1: the text's formula, the model, the Thomson reduction -------------------


def _dot(W, inst, i, j):
    """W_i · W_j written out over the hidden dimension, in Python floats."""
    return sum(W[inst, h, i].item() * W[inst, h, j].item() for h in range(W.shape[1]))


def _text_at_one(W, b, importance, relu=True, bias=True):
    """The text's Σ_i I_i (1 - ReLU(|W_i|^2 + b_i))^2 and Σ_{i≠j} I_j ReLU(W_j·W_i + b_j)^2 per
    instance, by hand; relu=False / bias=False drop the ReLU / the bias (the linear case)."""
    act = (lambda v: max(v, 0.0)) if relu else (lambda v: v)
    instances, _, n = W.shape
    benefit, interference = [], []
    for inst in range(instances):
        B = [b[inst, i].item() if bias else 0.0 for i in range(n)]
        I = [importance[inst, i].item() for i in range(n)]
        benefit.append(sum(I[i] * (1 - act(_dot(W, inst, i, i) + B[i])) ** 2 for i in range(n)))
        interference.append(
            sum(
                I[j] * act(_dot(W, inst, j, i) + B[j]) ** 2
                for i in range(n)
                for j in range(n)
                if i != j
            )
        )
    return torch.tensor(benefit, dtype=DTYPE), torch.tensor(interference, dtype=DTYPE)


def _one_hot_inputs(instances, n):
    """x = e_i for i = 0..n-1 as a batch: (instances, n, n)."""
    return torch.eye(n, dtype=DTYPE).expand(instances, n, n)


def test_thomson_reduction_benefit_is_constant_and_interference_is_the_packing_energy():
    """Uniform importance, k features with |W_i| = 1 (random directions), the rest W_i = 0,
    b = 0: the benefit term at x_i = 1 is the constant n - k (each left-out feature pays
    I_i (1 - 0)^2 = 1, each represented one (1 - 1)^2 = 0), and the interference term is
    Σ_{i≠j} ReLU(W_i·W_j)^2 over the represented features. packing_energy sums the same
    ordered pairs i ≠ j (both orders, no factor 1/2), so it matches with factor 1."""
    n, m, instances = 7, 3, 2
    represented = [0, 2, 3, 5, 6]  # k = 5 > m: some positive overlaps are forced
    k = len(represented)
    ones = torch.ones(instances, n, dtype=DTYPE)
    zero_bias = torch.zeros(instances, n, dtype=DTYPE)
    benefits, energies = [], []
    for seed in (11, 12):  # two independent sets of directions (each with two instances)
        g = torch.Generator().manual_seed(seed)
        units = torch.randn(instances, k, m, generator=g, dtype=DTYPE)
        units = units / units.norm(dim=-1, keepdim=True)
        W = torch.zeros(instances, m, n, dtype=DTYPE)
        W[:, :, represented] = units.transpose(-1, -2)
        benefit, interference = th.one_sparse_at_one(W, zero_bias, ones)
        # (a) the benefit term is n - k whatever the directions
        torch.testing.assert_close(
            benefit.sum(-1), torch.full((instances,), float(n - k), dtype=DTYPE), rtol=1e-10, atol=0
        )
        # (b) the interference term is the Thomson-type energy of the represented directions
        thomson = torch.tensor(
            [
                sum(
                    max(sum(u[p, h].item() * u[q, h].item() for h in range(m)), 0.0) ** 2
                    for p in range(k)
                    for q in range(k)
                    if p != q
                )
                for u in units
            ],
            dtype=DTYPE,
        )
        assert torch.all(thomson > 1e-3)  # the energy is not trivially zero
        torch.testing.assert_close(interference.sum((-1, -2)), thomson, rtol=1e-10, atol=0)
        torch.testing.assert_close(th.packing_energy(units), thomson, rtol=1e-10, atol=0)
        # and the model itself, on x = e_i summed over i, pays exactly n - k + energy
        losses = toy_sample_loss(W, zero_bias, ones, _one_hot_inputs(instances, n)).sum(-1)
        torch.testing.assert_close(losses, (n - k) + thomson, rtol=1e-10, atol=0)
        benefits.append(benefit.sum(-1))
        energies.append(thomson)
    assert torch.equal(benefits[0], benefits[1])  # constant across direction sets, bit for bit
    assert torch.all((energies[0] - energies[1]).abs() > 1e-3)  # while the energy moves


def test_loss_on_one_hot_inputs_is_the_text_formula_at_one():
    """Σ_i loss(e_i) of the ReLU model = Σ_i I_i (1 - ReLU(|W_i|^2 + b_i))^2
    + Σ_{i≠j} I_j ReLU(W_j·W_i + b_j)^2 (by hand) = one_sparse_at_one's benefit + interference;
    and per active feature i, loss(e_i) = benefit_i + Σ_j interference[i, j]."""
    n = 5
    W, b, importance = random_model(features=n, hidden=2, instances=3, seed=4)
    x = _one_hot_inputs(W.shape[0], n)
    pre = x @ (W.transpose(-1, -2) @ W) + b[:, None, :]
    assert torch.any(pre < 0) and torch.any(pre > 0)  # the ReLU clips some outputs, not all
    losses = toy_sample_loss(W, b, importance, x)  # (instances, i)
    hand_benefit, hand_interference = _text_at_one(W, b, importance)
    torch.testing.assert_close(losses.sum(-1), hand_benefit + hand_interference, rtol=1e-10, atol=0)
    benefit, interference = th.one_sparse_at_one(W, b, importance)
    torch.testing.assert_close(benefit.sum(-1), hand_benefit, rtol=1e-10, atol=0)
    torch.testing.assert_close(interference.sum((-1, -2)), hand_interference, rtol=1e-10, atol=0)
    torch.testing.assert_close(losses, benefit + interference.sum(-1), rtol=1e-10, atol=0)


def test_linear_terms_at_one_are_the_text_linear_expansion():
    """Without ReLU and bias, x_i = 1 gives the linear case: interference
    Σ_{i≠j} I_j (W_j·W_i)^2 and benefit Σ_i I_i (1 - |W_i|^2)^2 (by hand), equal to
    one_sparse_at_one(relu=False, bias=False), to linear_terms' expansion and to the linear
    model's Σ_i loss(e_i) at b = 0."""
    n = 5
    W, b, importance = random_model(features=n, hidden=2, instances=3, seed=5)
    hand_benefit, hand_interference = _text_at_one(W, b, importance, relu=False, bias=False)
    benefit, interference = th.one_sparse_at_one(W, b, importance, relu=False, bias=False)
    torch.testing.assert_close(interference.sum((-1, -2)), hand_interference, rtol=1e-10, atol=0)
    torch.testing.assert_close(benefit.sum(-1), hand_benefit, rtol=1e-10, atol=0)
    expansion, _ = th.linear_terms(W, importance)
    torch.testing.assert_close(expansion, hand_benefit + hand_interference, rtol=1e-10, atol=0)
    zero = torch.zeros_like(b)
    losses = toy_sample_loss(W, zero, importance, _one_hot_inputs(W.shape[0], n), "linear")
    torch.testing.assert_close(losses.sum(-1), hand_benefit + hand_interference, rtol=1e-10, atol=0)
    # with the bias but no ReLU: I_j (W_j·W_i + b_j)^2, the linear model with b
    hand_benefit, hand_interference = _text_at_one(W, b, importance, relu=False)
    benefit, interference = th.one_sparse_at_one(W, b, importance, relu=False)
    torch.testing.assert_close(
        benefit.sum(-1) + interference.sum((-1, -2)),
        hand_benefit + hand_interference,
        rtol=1e-10,
        atol=0,
    )
    losses = toy_sample_loss(W, b, importance, _one_hot_inputs(W.shape[0], n), "linear")
    torch.testing.assert_close(losses.sum(-1), hand_benefit + hand_interference, rtol=1e-10, atol=0)


# --- the bias of an unrepresented feature; L_0 and L_1 as S -> 1 -----------------------------


def test_unrepresented_feature_bias_is_best_at_the_mean_and_a_closed_relu_pays_its_square():
    """With W_i = 0 the output y_i = ReLU(b_i) is a constant, so feature i's own loss term is
    I_i E[(x_i - ReLU(b_i))^2] = I_i (Var x_i + (E x_i - ReLU(b_i))^2), with E x_i = (1-S)/2 and
    E x_i^2 = (1-S)/3 by hand from the data law: least at b_i = E x_i, and every b_i <= 0 (a
    closed ReLU) pays exactly I_i (E x_i)^2 = I_i (1-S)^2/4 more. Checked on the model's own
    loss exactly (x_i integrated: a mass S at 0 and 2-point Gauss-Legendre on [0, 1], exact for
    the quadratic, the other features fixed at random) and by Monte Carlo within 4 s.e."""
    n, i = 5, 2
    W, b, importance = random_model(features=n, hidden=2, instances=3, seed=7)
    W[:, :, i] = 0  # feature i unrepresented; the others arbitrary
    S = torch.tensor([0.0, 0.6, 0.95], dtype=DTYPE)
    mean, square = (1 - S) / 2, (1 - S) / 3
    variance = square - mean**2
    I_i = importance[:, i]
    own = torch.zeros_like(importance)
    own[:, i] = I_i  # toy_sample_loss with this importance is feature i's term alone
    rest = importance.clone()
    rest[:, i] = 0

    def with_bias(value):  # b with b_i replaced, per instance
        changed = b.clone()
        changed[:, i] = value
        return changed

    def closed_form(value):
        return I_i * (variance + (mean - torch.relu(torch.as_tensor(value, dtype=DTYPE))) ** 2)

    # exact: feature i's term of the total loss, x_i integrated out, for random other features
    nodes, weights = np.polynomial.legendre.leggauss(2)
    context = SparseUniform([0, 1, 2], n, S.tolist(), dtype=DTYPE, device="cpu").sample(16)
    context[..., i] = 0.0

    def exact(value):
        bias = with_bias(value)
        total = S[:, None] * toy_sample_loss(W, bias, importance, context)
        for node, weight in zip((nodes + 1) / 2, weights / 2):
            x = context.clone()
            x[..., i] = node
            total += (1 - S[:, None]) * weight * toy_sample_loss(W, bias, importance, x)
        return total - toy_sample_loss(W, bias, rest, context)  # (instances, contexts)

    biases = [-2.0, -0.3, 0.0, 0.1, 0.7, mean]
    for value in biases:
        expected = closed_form(value)[:, None].expand(3, 16)
        torch.testing.assert_close(exact(value), expected, rtol=1e-12, atol=1e-15)
    # the minimum over a grid of b_i (step 0.005) is the grid point nearest E x_i
    grid = torch.linspace(-0.5, 1.0, 301, dtype=DTYPE)
    on_grid = torch.stack([exact(value)[:, 0] for value in grid])  # (grid, instances)
    nearest = (grid[:, None] - mean).abs().argmin(0)
    assert torch.equal(on_grid.argmin(0), nearest)
    # a closed ReLU: the same loss for every b_i <= 0, I_i (1-S)^2/4 above the optimum
    at_best = exact(mean)
    for value in (-2.0, -0.3, 0.0):
        assert torch.equal(exact(value), exact(-1.0))
        torch.testing.assert_close(
            exact(value) - at_best,
            (I_i * (1 - S) ** 2 / 4)[:, None].expand(3, 16),
            rtol=1e-12,
            atol=1e-15,
        )
    # Monte Carlo on the data law: the isolated term, and (common random numbers) the total
    # loss's rise from b_i = E x_i to b_i = -0.3
    x = SparseUniform([3, 4, 5], n, S.tolist(), dtype=DTYPE, device="cpu").sample(200_000)
    for value in biases:
        terms = toy_sample_loss(W, with_bias(value), own, x)
        error = terms.std(-1) / terms.shape[-1] ** 0.5
        assert torch.all((terms.mean(-1) - closed_form(value)).abs() < 4 * error)
    rise = toy_sample_loss(W, with_bias(-0.3), importance, x) - toy_sample_loss(
        W, with_bias(mean), importance, x
    )
    error = rise.std(-1) / rise.shape[-1] ** 0.5
    assert torch.all(error > 0)  # at S = 0.95 too the rise is not a constant
    assert torch.all((rise.mean(-1) - I_i * (1 - S) ** 2 / 4).abs() < 4 * error)


def test_l0_and_l1_dominate_a_fixed_model_as_sparsity_goes_to_one():
    """One fixed model (n = 6, m = 2), L_0 and L_1 exact, L_k (k >= 2) estimated once, summed
    over the C(n, k) patterns. With w_k = (1-S)^k S^(n-k) (toycore's pattern_weights) and
    r = (1-S)/S, w_k / w_1 = r^(k-1), so the share of the k >= 2 terms in L is at most
    Σ_{k>=2} w_k L_k / (w_1 L_1) <= M r / (1 - r), M = max_{k>=2} L_k / L_1 (for S > 1/2). And it
    falls as S rises: Σ_{k>=2} r^k L_k / (L_0 + r L_1) rises with r, term by term."""
    n = 6
    W, b, importance = random_model(features=n, hidden=2, instances=1, seed=8)
    assert torch.any(b > 0)  # L_0 > 0
    L = torch.zeros(n + 1, dtype=DTYPE)
    L[0] = th.zero_input_loss(b, importance)[0]
    benefit, interference = th.one_sparse_terms(W, b, importance)
    L[1] = benefit.sum() + interference.sum()
    g = torch.Generator().manual_seed(0)
    for k in range(2, n + 1):
        for pattern in itertools.combinations(range(n), k):
            x = torch.zeros(1, 4000, n, dtype=DTYPE)
            x[0][:, list(pattern)] = torch.rand(4000, k, generator=g, dtype=DTYPE)
            L[k] += toy_sample_loss(W, b, importance, x).mean()
    assert torch.all(L > 0)
    sparsities = [0.9, 0.99, 0.999, 0.9999]
    weights = th.pattern_weights(n, torch.tensor(sparsities, dtype=DTYPE))  # (4, n + 1)
    terms = weights * L
    share = terms[:, :2].sum(-1) / terms.sum(-1)
    # (a) the share of L_0 + L_1 rises towards 1, within the bound from the weights
    assert torch.all(share.diff() > 0) and torch.all(share < 1)
    M = (L[2:] / L[1]).max().item()
    for S, s in zip(sparsities, share.tolist()):
        r = (1 - S) / S
        assert 1 - s <= sum(r ** (k - 1) * (L[k] / L[1]).item() for k in range(2, n + 1))
        assert 1 - s <= M * r / (1 - r)
    # (b) relative to L_1, the k = 2 term is ((1-S)/S) L_2 / L_1 exactly: it vanishes like 1 - S
    for row, S in enumerate(sparsities):
        ratio = (terms[row, 2] / terms[row, 1]).item()
        assert ratio == pytest.approx((1 - S) / S * (L[2] / L[1]).item(), rel=1e-12, abs=0)


def test_with_equal_importances_a_linear_optimum_can_represent_more_than_m_features():
    """The count reading of 'never worthwhile to represent more features than dimensions' needs
    distinct importances: with equal ones every rank-m projection Wᵀ W = Q Qᵀ (Q: n × m, with
    orthonormal columns) is optimal, with the best bias, and one that lies between the axes gives
    more than m columns a norm above 0.5 while its rank stays m."""
    n, m, sparsity = 5, 2, 0.9
    equal = torch.ones(1, n, dtype=DTYPE)
    # the plane spanned by (1, 1, 1, 0, 0) and (0, 0, 1, 1, 1), orthonormalised
    Q, _ = torch.linalg.qr(torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1]], dtype=DTYPE).T)
    W = Q.T[None]  # (1, m, n): Wᵀ W = Q Qᵀ, a projection of rank m
    residual = torch.eye(n, dtype=DTYPE) - W[0].T @ W[0]
    best_bias = (residual.sum(-1) * sparse_moments(sparsity)["mean"])[None]
    loss = th.linear_loss(W, best_bias, equal, sparsity)
    optimum = th.linear_optimum(equal, m, sparsity)
    torch.testing.assert_close(loss, optimum, rtol=1e-12, atol=0)
    assert int(ex.represented_count(W)) > m  # more than m columns with |W_i| > 0.5
    assert torch.linalg.matrix_rank(W[0]) == m
    # with distinct importances the same W is no longer optimal: only the top-m axes are
    distinct = 0.8 ** torch.arange(n, dtype=DTYPE)[None]
    assert th.linear_loss(W, best_bias, distinct, sparsity) > th.linear_optimum(
        distinct, m, sparsity
    ) * (1 + 1e-3)
