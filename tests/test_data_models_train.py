import numpy as np
import pytest
import torch

from toycore.data import SparseUniform, basis_vectors, sparse_moments
from toycore.models import LinearAutoencoder, TiedLinear
from toycore.seeding import generator
from toycore.theory import linear as th
from toycore.train import record_steps, train


def test_sparse_uniform_moments_match_formulas():
    S = 0.7
    x = SparseUniform(range(4), features=6, sparsity=S, dtype=torch.float64).sample(50_000)
    assert x.shape == (4, 50_000, 6)
    assert ((x >= 0) & (x <= 1)).all()
    exact = sparse_moments(S)
    assert abs(x.mean() - exact["mean"]) < 5 * np.sqrt(exact["square"] / x.numel())
    assert abs((x == 0).double().mean() - S) < 0.005
    assert abs(x.pow(2).mean() - exact["square"]) < 0.002
    products = x.transpose(-1, -2) @ x / x.shape[1]
    assert abs(products[:, 0, 1].mean() - exact["cross"]) < 0.002


def test_sparse_uniform_instance_streams_are_independent_of_the_batch():
    together = SparseUniform([3, 7], 5, [0.5, 0.9]).sample(100)
    alone = SparseUniform([7], 5, 0.9).sample(100)
    assert torch.equal(together[1], alone[0])
    again = SparseUniform([3, 7], 5, [0.5, 0.9]).sample(100)
    assert torch.equal(together, again)


def test_sparse_uniform_is_its_definition_bit_for_bit():
    # x = r / d where r < d, else 0, from one uniform r per entry of the instance's own stream;
    # the sampler computes it in place another way, which must not change a single bit
    densities = [0.001, 0.045, 0.5, 0.999]
    data = SparseUniform(range(4), 300, [1 - d for d in densities], prefetch=2)
    for _ in range(3):  # across a refill of the stock
        x = data.sample(256)
    streams = [generator(seed, "data", x.device) for seed in range(4)]
    for i, d in enumerate(densities):
        stocks = [torch.rand((2, 256, 300), generator=streams[i], device=x.device) for _ in "ab"]
        r = stocks[1][0]  # the third batch: the second stock's first
        # on the data's device: CUDA divides by a CPU scalar as a product with its reciprocal,
        # which can differ from the division in the last bit
        density = torch.tensor(d, dtype=torch.float32, device=x.device)
        expected = torch.where(r < density, r / density, 0)
        assert torch.equal(x[i], expected)
        assert not torch.signbit(x[i]).any()


def test_per_instance_sparsity():
    x = SparseUniform([0, 1], 50, [0.0, 1.0]).sample(200)
    assert (x[0] > 0).all() and (x[1] == 0).all()


def test_basis_vectors():
    x = basis_vectors(3, 4)
    assert x.shape == (3, 4, 4) and torch.equal(x[2], torch.eye(4, device=x.device))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(seeds=[], features=4, sparsity=0.5), "seeds"),
        (dict(seeds=[0], features=0, sparsity=0.5), "features"),
        (dict(seeds=[0], features=4, sparsity=1.5), "sparsity"),
        (dict(seeds=[0, 1], features=4, sparsity=[0.1, 0.2, 0.3]), "sparsity has 3 values"),
        (dict(seeds=[-1], features=4, sparsity=0.5), "seeds"),
    ],
)
def test_sparse_uniform_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SparseUniform(**kwargs)


def test_model_shapes_and_products():
    model = LinearAutoencoder(6, 2, seeds=[0, 1, 2], dtype=torch.float64)
    assert model.A.shape == (3, 6, 2) and model.B.shape == (3, 2, 6)
    x = torch.rand(3, 10, 6, dtype=torch.float64, device=model.A.device)
    expected = torch.einsum("ifg,ibg->ibf", model.product(), x)
    torch.testing.assert_close(model(x), expected)
    tied = TiedLinear(6, 2, seeds=[0, 1], dtype=torch.float64)
    assert tied.W.shape == (2, 2, 6)
    torch.testing.assert_close(tied.product(), tied.W.transpose(-1, -2) @ tied.W)


def test_models_reject_bad_sizes():
    with pytest.raises(ValueError, match=r"hidden must be an integer in \[1, "):
        LinearAutoencoder(3, 4, seeds=[0])
    with pytest.raises(ValueError, match="hidden"):
        TiedLinear(3, 0, seeds=[0])
    with pytest.raises(ValueError, match="init_std"):
        TiedLinear(3, 2, seeds=[0], init_std=-1.0)


def test_model_loss_gradient_matches_closed_form():
    """Autograd through the model equals (19) with the sample Σ, per instance."""
    x = SparseUniform([0, 1], 5, 0.6, dtype=torch.float64).sample(40)
    model = LinearAutoencoder(5, 2, seeds=[0, 1], dtype=torch.float64)
    model.loss(x).sum().backward()
    for i in range(2):
        grad_A, grad_B = th.linear_gradients(
            model.A[i].detach(), model.B[i].detach(), th.second_moment(x[i])
        )
        torch.testing.assert_close(model.A.grad[i], grad_A)
        torch.testing.assert_close(model.B.grad[i], grad_B)
        torch.testing.assert_close(
            model.loss(x)[i], th.linear_loss(model.A[i], model.B[i], th.second_moment(x[i]))
        )


def test_batched_training_equals_separate_training():
    x = SparseUniform([4, 5], 5, 0.5, dtype=torch.float64).sample(32)
    together = LinearAutoencoder(5, 2, seeds=[4, 5], dtype=torch.float64)
    train(together, x, steps=50, lr=0.1, optimizer="adam")
    alone = LinearAutoencoder(5, 2, seeds=[5], dtype=torch.float64)
    train(alone, x[1:], steps=50, lr=0.1, optimizer="adam")
    torch.testing.assert_close(together.A[1], alone.A[0])


def test_gradient_descent_reaches_the_pca_minimum():
    x = SparseUniform([0], 5, 0.5, dtype=torch.float64).sample(100)
    model = LinearAutoencoder(5, 2, seeds=[0], init_std=0.1, dtype=torch.float64)
    history = train(model, x, steps=3000, lr=1.0)
    eigenvalues, eigenvectors = th.eigh_descending(th.second_moment(x[0]))
    assert history.loss[-1, 0] == pytest.approx(
        float(th.critical_loss(eigenvalues, (0, 1))), rel=1e-9
    )
    torch.testing.assert_close(model.product()[0].detach(), th.top_projection(eigenvectors, 2))


def test_history_records_loss_and_metric_snapshots():
    x = SparseUniform([0, 1], 4, 0.5).sample(16)
    model = TiedLinear(4, 2, seeds=[0, 1])
    W0 = model.W.detach().clone()
    history = train(model, x, steps=10, lr=0.1, record_at=[0, 5, 10], metrics={"W": lambda m: m.W})
    assert history.steps.tolist() == [0, 5, 10]
    assert history.loss.shape == (3, 2) and history.metrics["W"].shape == (3, 2, 2, 4)
    # a snapshot, not a view
    np.testing.assert_array_equal(history.metrics["W"][0], W0.cpu().numpy())
    np.testing.assert_array_equal(history.metrics["W"][-1], model.W.detach().cpu().numpy())
    assert not np.array_equal(history.metrics["W"][0], history.metrics["W"][-1])


def test_minibatch_training_calls_the_data_function_per_step():
    data = SparseUniform([0], 4, 0.5)
    calls = []

    def batch(step):
        calls.append(step)
        return data.sample(8)

    train(TiedLinear(4, 2, seeds=[0]), batch, steps=5, lr=0.1)
    assert calls == [0, 1, 2, 3, 4, 5]


def test_record_steps_are_log_spaced_and_include_the_ends():
    steps = record_steps(1000, 20)
    assert steps[0] == 0 and steps[-1] == 1000 and np.all(np.diff(steps) > 0)
    assert np.diff(steps)[-1] > np.diff(steps)[0]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(optimizer="rmsprop"), "optimizer must be one of"),
        (dict(lr=0.0), "lr must be finite and > 0"),
        (dict(steps=-1), "steps must be"),
        (dict(record_at=[0, 11]), "record_at"),
    ],
)
def test_train_rejects_bad_input_before_training(kwargs, message):
    model = TiedLinear(4, 2, seeds=[0])
    before = model.W.detach().clone()
    options = dict(steps=10, lr=0.1) | kwargs
    with pytest.raises(ValueError, match=message):
        train(model, SparseUniform([0], 4, 0.5).sample(8), **options)
    assert torch.equal(model.W.detach(), before)


@pytest.mark.skipif(
    __import__("platform").libc_ver()[0] != "glibc", reason="the allocator's options are glibc's"
)
def test_a_training_step_reuses_its_freed_memory_without_page_faults():
    """Chapter 3's tied step at n = 64, m = 1024, 16 models, in a fresh process: its
    temporaries are 4 MB (1,024 pages) each. With glibc's defaults most processes fault in
    fresh pages every step, some never (``benchmarks/allocator.py`` shows both)."""
    import json
    import runpy
    import subprocess
    import sys
    from pathlib import Path

    benchmark = Path(__file__).parents[1] / "benchmarks" / "allocator.py"
    command = [sys.executable, str(benchmark), "--one-run", "--warmup=20", "--steps=50"]
    out = subprocess.run(command, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    bound = runpy.run_path(str(benchmark))["REUSED_BOUND"]  # no temporary came back fresh
    assert json.loads(out.stdout)["faults"] < bound, out.stdout
