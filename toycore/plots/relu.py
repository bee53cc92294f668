"""Chapter 2 figures. Each function takes an experiment's result and returns a Figure."""

import numpy as np
from matplotlib import colormaps

from . import figure


def _inverse_density(sparsities):
    return 1 / (1 - np.asarray(sparsities))


def _arrows(ax, w, importance, title):
    """Each feature's embedding W_i as an arrow in the plane, coloured by importance."""
    colors = colormaps["viridis"](np.linspace(0, 0.9, w.shape[1]))
    for i in np.argsort(importance)[::-1]:
        ax.plot([0, w[0, i]], [0, w[1, i]], color=colors[i], lw=2)
        ax.plot(w[0, i], w[1, i], "o", color=colors[i], ms=5)
    ax.set(xlim=(-1.3, 1.3), ylim=(-1.3, 1.3), aspect="equal", xticks=[], yticks=[], title=title)


def _gram_and_bias(ax, w, b):
    """Wᵀ W with b as an extra column, on one symmetric colour scale."""
    n = w.shape[1]
    matrix = np.concatenate([w.T @ w, np.full((n, 1), np.nan), b[:, None]], axis=1)
    image = ax.imshow(matrix, vmin=-1, vmax=1, cmap="RdBu_r")
    ax.set(
        xticks=[*range(n), n + 1],
        xticklabels=[*range(1, n + 1), "b"],
        yticks=range(n),
        yticklabels=range(1, n + 1),
    )
    ax.grid(False)
    return image


def feature_picture(w, b, importance, title=""):
    """One model: its features in the hidden plane (hidden = 2; otherwise the norms |W_i|), and
    Wᵀ W with the bias."""
    w, b, importance = (np.asarray(a) for a in (w, b, importance))
    fig, (left, right) = figure(2, width=3.2, height=3.0)
    if w.shape[0] == 2:
        _arrows(left, w, importance, title or "W_i in the hidden plane")
    else:
        left.bar(range(1, w.shape[1] + 1), np.linalg.norm(w, axis=0))
        left.axhline(0.5, color="k", ls="--", lw=1)
        left.set(xlabel="feature i", ylabel=r"$|W_i|$", title=title)
    image = _gram_and_bias(right, w, b)
    right.set_title(r"$W^\top W$ and $b$")
    fig.colorbar(image, ax=right, shrink=0.8)
    return fig


def classic_grid(sweep, seed_index, shapes):
    """Overview of one seed across sparsity, as in Elhage et al.'s intro figure: for each S the
    features in the plane, with Wᵀ W and b below; at most four sparsities per band."""
    count = len(sweep.sparsities)
    columns = min(count, 4)
    bands = -(-count // columns)
    fig, axes = figure(columns, 2 * bands, width=1.9, height=1.9, squeeze=False)
    for ax in axes.ravel():
        ax.set_axis_off()
    for c, S in enumerate(sweep.sparsities):
        band, column = divmod(c, columns)
        top, bottom = axes[2 * band, column], axes[2 * band + 1, column]
        top.set_axis_on()
        bottom.set_axis_on()
        w, b = sweep.W[c, seed_index].numpy(), sweep.b[c, seed_index].numpy()
        _arrows(
            top,
            w,
            sweep.importance[c, seed_index].numpy(),
            f"1−S = {1 - S:.2g}\n{shapes[c][seed_index]}",
        )
        image = _gram_and_bias(bottom, w, b)
        bottom.tick_params(labelsize=6)
    fig.colorbar(image, ax=axes[:, -1], shrink=0.5, label=r"$W_i\cdot W_j$ and $b_i$")
    return fig


def expansion(result):
    """Left: the expansion Σ_k (1-S)^k S^(n-k) L_k against L estimated directly, per model.
    Right: the share of L from k = 0, k = 1 and k ≥ 2 active features, against 1/(1-S)."""
    fig, (left, right) = figure(2, width=4.4)
    for c, S in enumerate(result.sparsities):
        left.errorbar(
            result.direct[c],
            result.expansion[c],
            xerr=2 * result.direct_error[c],
            yerr=2 * result.expansion_error[c],
            fmt="o",
            ms=3,
            label=f"1−S = {1 - S:.2g}",
        )
    low, high = result.direct.min() * 0.8, result.direct.max() * 1.2
    left.plot([low, high], [low, high], "k--", lw=1)
    left.set(
        xscale="log",
        yscale="log",
        xlabel="L, direct Monte Carlo",
        ylabel=r"$\sum_k (1-S)^k S^{n-k} L_k$",
        title="the expansion adds up to L (±2 s.e.)",
    )
    left.legend(ncol=2)
    shares = result.terms / result.expansion[..., None]
    parts = [shares[..., 0], shares[..., 1], shares[..., 2:].sum(-1)]
    x = _inverse_density(result.sparsities)
    right.stackplot(
        x, *(p.mean(1) for p in parts), labels=[r"$L_0$", r"$L_1$", r"$L_{k\geq2}$"], alpha=0.8
    )
    right.set(
        xscale="log",
        ylim=(0, 1),
        xlabel="1/(1 − S)",
        ylabel="share of the loss",
        title="as S → 1, L_0 and L_1 take over",
    )
    right.legend(loc="upper left")
    return fig


def interference(split, hidden):
    """L_1 at x_i = 1 against 1/(1-S): feature benefit lost, and interference priced three ways."""
    fig, ax = figure(width=8.5, height=3.6)
    x = _inverse_density(split.sparsities)
    for values, label, style in [
        (split.linear, "interference, linear readout of the same W", "C3:"),
        (split.without_bias, "interference with ReLU, bias removed", "C1--"),
        (split.paid, "interference the model pays (ReLU and bias)", "C1-"),
        (
            split.benefit,
            r"feature benefit lost, $\sum_i I_i(1-\mathrm{ReLU}(|W_i|^2+b_i))^2$",
            "C0-",
        ),
    ]:
        ax.errorbar(x, values.mean(1), yerr=values.std(1), fmt=style, marker="o", ms=3, label=label)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="1/(1 − S)",
        ylabel="summed over features",
        title=f"the 1-sparse loss at $x_i = 1$ (m = {hidden}): interference made cheap",
    )
    # long handles: the prose tells the curves apart by their dots, dashes and solid line
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1), handlelength=5)
    return fig


def represented(sweep, counts):
    """Features with |W_i| > 0.5 against 1/(1-S), mean and range over seeds, for each
    {label: counts (sparsities, seeds)} of models shaped like ``sweep``."""
    fig, ax = figure(width=5, height=3.4)
    x = _inverse_density(sweep.sparsities)
    for label, count in counts.items():
        ax.plot(x, count.mean(1), "o-", label=label)
        ax.fill_between(x, count.min(1), count.max(1), alpha=0.2)
    ax.axhline(sweep.hidden, color="k", ls="--", lw=1, label=f"m = {sweep.hidden} dimensions")
    ax.axhline(sweep.features, color="k", ls=":", lw=1, label=f"n = {sweep.features} features")
    ax.set(
        xscale="log",
        xlabel="1/(1 − S)",
        ylabel=r"features with $|W_i| > 0.5$",
        title="only the ReLU model puts more features than dimensions",
    )
    ax.legend()
    return fig


def packing(rows):
    """Learned packing energy over the best of many direct minimisations, one column per (n, m)."""
    fig, ax = figure(width=5, height=3.2)
    for i, row in enumerate(rows):
        ratio = row.ratio.ravel()
        ax.plot(i + np.linspace(-0.1, 0.1, ratio.size), ratio, "o", alpha=0.6, color="C0")
    ax.axhline(1, color="k", ls="--", lw=1)
    ax.set(
        xticks=range(len(rows)),
        xticklabels=[f"n={r.n}, m={r.m}" for r in rows],
        ylabel="learned energy / best of restarts",
        title=r"$\sum_{i\neq j}\mathrm{ReLU}(u_i\cdot u_j)^2$ of the learned directions",
    )
    return fig
