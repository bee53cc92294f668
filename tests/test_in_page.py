"""The in-page widgets' JavaScript (toycore/inpage.js) against toycore itself, in Chromium.

The page's trainer must be the chapter's model: from the same initial weights on the same
batches it must follow ``ToyModel`` trained by torch's AdamW step for step. The page's rug must be
``persian_rug``'s, rows included, for the same seed. The page's data must be sparse uniform, and
its randomness seeded.
"""

import base64

import numpy as np
import pytest
import torch

from toycore import widgets
from toycore.data import SparseUniform
from toycore.models import ToyModel
from toycore.theory import persian_rug as rug
from toycore.train import make_optimizer


@pytest.fixture(scope="module")
def page(browser):
    """A blank page with inpage.js loaded, throwing nothing."""
    context = browser.new_context()
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.set_content("<html><body></body></html>")
    page.add_script_tag(content=widgets.IN_PAGE_SCRIPT.read_text())
    yield page
    assert errors == [], f"inpage.js threw: {errors}"
    context.close()


def test_the_module_is_small():
    assert widgets.IN_PAGE_SCRIPT.stat().st_size < 100_000


# Feeds the page's ReluTrainer the given start and batches (float32 bytes, base64), one step each.
TRAIN_JS = """([n, m, importance, W, b, lr, batches, batch]) => {
  const bytes = Uint8Array.from(atob(batches), c => c.charCodeAt(0));
  const data = new Float32Array(bytes.buffer);
  const trainer = new toycoreInPage.ReluTrainer(
    {features: n, hidden: m, importance, W, b, lr});
  const losses = [];
  for (let s = 0; s < data.length / (batch * n); s++) {
    losses.push(trainer.step(Float64Array.from(data.subarray(s * batch * n, (s + 1) * batch * n))));
  }
  return {losses, W: Array.from(trainer.W), b: Array.from(trainer.b)};
}"""


@pytest.mark.parametrize("n, m, S, decay", [(5, 2, 0.9, 0.9), (20, 5, 0.7, 0.7)])
def test_page_trainer_follows_toymodel_step_for_step(page, n, m, S, decay):
    steps, batch, lr = 200, 1024, 1e-2  # lr: the ci recipe's, the largest, so the most sensitive
    importance = decay ** torch.arange(n, dtype=torch.float32)
    model = ToyModel(n, m, [3], importance=importance)
    W0, b0 = model.W.detach()[0].clone(), torch.rand(n, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.b[0] = b0 - 0.5  # a bias of both signs, so that some outputs start closed
    data = SparseUniform([3], n, S)
    batches = torch.stack([data.sample(batch)[0] for _ in range(steps)])  # (steps, batch, n)
    page_run = page.evaluate(
        TRAIN_JS,
        [
            n,
            m,
            importance.tolist(),
            W0.flatten().tolist(),
            model.b.detach()[0].tolist(),
            lr,
            base64.b64encode(batches.numpy().astype(np.float32).tobytes()).decode(),
            batch,
        ],
    )
    optimizer = make_optimizer("adamw", model.parameters(), lr)
    losses = []
    for x in batches:
        loss = model.loss(x[None]).sum()
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    relative = np.abs(np.array(page_run["losses"]) / np.array(losses) - 1)
    assert relative.max() < 1e-4, (
        f"losses differ by up to {relative.max():.2g} (step {relative.argmax()})"
    )
    W_page = np.array(page_run["W"]).reshape(m, n)
    assert np.abs(W_page - model.W.detach()[0].numpy()).max() < 1e-3
    assert np.abs(np.array(page_run["b"]) - model.b.detach()[0].numpy()).max() < 1e-3
    assert losses[-1] < 0.8 * losses[0], "200 steps should train: the comparison would be empty"


@pytest.mark.parametrize("features, ratio, seed", [(64, 0.16, 0), (128, 0.3, 7), (512, 0.05, 20)])
def test_page_rug_is_toycores(page, features, ratio, seed):
    hidden = max(1, int(features * ratio))
    W_in, _, rows = rug.persian_rug(features, hidden, seed)
    built = page.evaluate(
        "([ns, nd, seed]) => { const r = toycoreInPage.persianRug(ns, nd, seed);"
        "  return {rows: r.rows, Win: Array.from(r.Win), R: Array.from(r.R),"
        "          properties: toycoreInPage.rugProperties(r.R, ns)}; }",
        [features, hidden, seed],
    )
    assert built["rows"] == rows.tolist()
    assert np.array_equal(np.array(built["Win"]).reshape(hidden, features), W_in)
    R = W_in.T @ W_in / hidden
    assert np.abs(np.array(built["R"]).reshape(features, features) - R).max() < 1e-12
    off = R[~np.eye(features, dtype=bool)]
    assert built["properties"]["distinct"] == len(np.unique(np.round(off, 12)))
    assert built["properties"]["rowSumMean"] == pytest.approx((off**2).sum() / features)


def test_page_data_is_sparse_uniform_and_seeded(page):
    S, draws = 0.8, 200_000
    sample = page.evaluate(
        "([S, draws]) => { const { generator, sparseBatch } = toycoreInPage;"
        "  const one = sparseBatch(generator(4, 'data'), draws, 1, S);"
        "  const two = sparseBatch(generator(4, 'data'), 4, 1, S);"
        "  return {x: Array.from(one), again: Array.from(two)}; }",
        [S, draws],
    )
    x = np.array(sample["x"])
    assert sample["again"] == sample["x"][:4], "the same seed must give the same data"
    active = x > 0
    density = 1 - S
    assert abs(active.mean() - density) < 5 * np.sqrt(density * S / draws)
    values = x[active]
    assert abs(values.mean() - 0.5) < 5 * np.sqrt(1 / 12 / values.size)
    assert values.max() < 1  # U(0, 1): active values are positive by construction above
    quarter = (values < 0.25).mean()  # uniform, not merely centred: a quarter below 0.25
    assert abs(quarter - 0.25) < 5 * np.sqrt(0.25 * 0.75 / values.size)
