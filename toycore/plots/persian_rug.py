"""Chapter 5 figures. Each function takes computed results and returns a Figure."""

import re

import numpy as np
from matplotlib import colormaps

from ..theory import persian_rug as th
from . import figure, label_log_axis

STATISTICS = {  # name: (figure number, colour-bar label)
    "diagonal": (4, "variance of diag W"),
    "bias": (5, "variance of b"),
    "row_variance": (6, "variance over rows of Var ν_i"),
    "lyapunov": (7, "worst-row Lyapunov ratio Λ"),
}


def _matrix(ax, M, limit=None, title=""):
    limit = limit or np.abs(M).max()
    image = ax.imshow(M, cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="nearest")
    ax.set(title=title, xticks=[], yticks=[])
    ax.grid(False)
    return image


def rug(R, title="Figure 1: a Persian rug"):
    """The rug matrix R = W_out W_in."""
    fig, ax = figure(width=4.6, height=4.2)
    image = _matrix(ax, R, title=f"{title} (ns = {R.shape[0]})")
    fig.colorbar(image, ax=ax, shrink=0.8)
    return fig


def loss_curves(grids, rug_ratios, rug_losses, finite_rug=None):
    """Figure 2: loss against nd/ns, one panel per p: trained models of every grid size (the
    largest as mean ± sd over the seeds the stopping rule stopped, the smaller ones as means,
    lighter), the Persian rug (large-ns theory; crosses: a finite rug measured on data) and the
    exact optimal linear model. ``grids``: the grids of one (p, nd/ns) plan, smallest first."""

    def stopped(grid, k):  # the losses at the k-th p of the models the rule stopped, else NaN
        return np.where(grid.converged[k], grid.loss[k], np.nan)

    largest = grids[-1]
    fig, axes = figure(len(largest.densities), width=3.0, height=2.9)
    shades = np.linspace(0.45, 0.75, len(grids) - 1)  # Blues: lighter for smaller ns
    for k, (ax, p) in enumerate(zip(np.atleast_1d(axes), largest.densities)):
        for grid, shade in zip(grids[:-1], shades):
            ax.plot(
                grid.hidden / grid.features,
                np.nanmean(stopped(grid, k), -1),
                "o",
                ms=3.5,
                mfc="none",
                color=colormaps["Blues"](shade),
                label=f"trained, ns = {grid.features}",
            )
        loss = stopped(largest, k)
        ax.errorbar(
            largest.hidden / largest.features,
            np.nanmean(loss, -1),
            yerr=np.nanstd(loss, -1),
            fmt="o",
            ms=4,
            color="C0",
            label=f"trained, ns = {largest.features}",
        )
        ax.plot(rug_ratios, rug_losses[k], color="C3", label="Persian rug (ns → ∞)")
        if finite_rug is not None:
            ax.plot(
                finite_rug.ratios,
                finite_rug.loss[k],
                "x",
                color="C3",
                ms=6,
                label=f"Persian rug, ns = {finite_rug.features}",
            )
        ax.plot(
            rug_ratios,
            th.linear_loss(p, np.asarray(rug_ratios)),
            "--",
            color="0.4",
            label="optimal linear",
        )
        ax.set(title=f"p = {p:g}", xlabel="nd / ns", ylim=(0, None), xlim=(0, 1))
    np.atleast_1d(axes)[0].set_ylabel("loss per feature")
    np.atleast_1d(axes)[0].legend(loc="upper right", fontsize=7)
    fig.suptitle("Figure 2: loss against the compression ratio", fontsize=10)
    return fig


def weight_block(W, b, size=30, title=""):
    """Figure 3: the first size x size block of W and the same entries of b."""
    fig, (ax, bx) = figure(2, width=3.6, height=3.6, gridspec_kw={"width_ratios": [size, 3]})
    limit = np.abs(W[:size, :size]).max()
    image = _matrix(ax, W[:size, :size], limit, "W = W_out W_in (first 30 x 30)")
    _matrix(bx, b[:size, None], limit, "b")
    fig.colorbar(image, ax=[ax, bx], shrink=0.8)
    fig.suptitle(title, fontsize=10)
    return fig


def symmetry_heatmaps(grids, statistic):
    """Figures 4-7: one symmetry statistic over (p, nd/ns), one panel per ns, shared colours."""
    number, label = STATISTICS[statistic]
    values = [grid.statistics[statistic].mean(-1) for grid in grids]
    positive = np.concatenate([v.ravel() for v in values])
    low, high = np.log10(positive[positive > 0].min()), np.log10(positive.max())
    fig, axes = figure(len(grids), width=3.0, height=2.8)
    for ax, grid, value in zip(np.atleast_1d(axes), grids, values):
        # p across, nd/ns up, as the authors' heatmaps: value is (p, nd/ns), so transposed
        image = ax.imshow(
            np.log10(value).T, origin="lower", aspect="auto", vmin=low, vmax=high, cmap="viridis"
        )
        ax.set(
            title=f"ns = {grid.features}",
            xlabel="p",
            ylabel="nd / ns",
            xticks=range(len(grid.densities)),
            yticks=range(len(grid.ratios)),
            xticklabels=[f"{p:g}" for p in grid.densities],
            yticklabels=[f"{r:g}" for r in grid.ratios],
        )
        ax.grid(False)
    fig.colorbar(image, ax=axes, shrink=0.8, label=f"log₁₀ {label}")
    fig.suptitle(f"Figure {number}: {label}, shrinking as ns grows", fontsize=10)
    return fig


def bound_check(points, title):
    """The variance bound (eq. 6): the measured mean interference variance of unit-diagonal W
    over the bound, for trained models and rugs, against nd/ns."""
    fig, ax = figure(width=5.0, height=3.3)
    for label, (ratios, values), marker in zip(points, points.values(), "osx^"):
        ax.plot(ratios, values, marker, ms=5, label=label, alpha=0.8)
    ax.axhline(1, color="k", lw=0.8, label="the bound")
    ax.set(yscale="log", xlabel="nd / ns", ylabel="mean Var ν_i / bound", title=title)
    ax.legend()
    return fig


def scaling(densities, ratio, losses, bounds, ratios, density, losses_r, bounds_r):
    """Loss scaling at high sparsity: the rug's loss and appendix D's bound against p (fixed r)
    and against r (fixed p), with p²/r guide lines."""
    fig, (ax, bx) = figure(2, width=3.8, height=3.1)
    ax.loglog(densities, losses, "o-", color="C3", label="Persian rug")
    ax.loglog(densities, bounds, "s--", color="C2", label="any elementwise decoder ≥")
    ax.loglog(densities, densities**2 / ratio, ":", color="k", label="p²/r")
    ax.set(xlabel="p", ylabel="loss per feature", title=f"r = {ratio:g}")
    bx.loglog(ratios, losses_r, "o-", color="C3")
    bx.loglog(ratios, bounds_r, "s--", color="C2")
    bx.loglog(ratios, density**2 / ratios, ":", color="k")
    bx.set(xlabel="r = nd / ns", title=f"p = {density:g}")
    ax.legend()
    fig.suptitle("Loss scaling at high sparsity (section 4.3, appendix D)", fontsize=10)
    return fig


def _outside_regime(ax, sizes, density):
    """Shade the sizes below the text's regime (``th.regime_size``) and label the x axis."""
    first = th.regime_size(density)
    low, high = min(sizes) / 1.4, max(sizes) * 1.4
    if first > low:
        ax.axvspan(
            low, min(first, high), color="0.93", lw=0, zorder=0, label="outside the text's regime"
        )
    ax.set(xscale="log", xlim=(low, high), xlabel="ns")
    label_log_axis(ax, sizes)


def beyond(head, texts_largest, tolerance):
    """Past the texts' sizes (ours): each seed's trained loss over the rug's large-ns loss against
    ns (dots, their mean a line), the texts' largest size marked, the regime's start shaded."""
    fig, ax = figure(width=5.6, height=3.4)
    ax.axhspan(
        1 - tolerance, 1 + tolerance, color="C3", alpha=0.15, lw=0, label=f"±{tolerance:.0%}"
    )
    ax.axhline(1, color="C3", lw=1)
    seeds = head.trained.shape[-1]
    ratios = head.trained / head.rug
    ax.plot(np.repeat(head.sizes, seeds), ratios.ravel(), "o", color="C0", ms=4, alpha=0.5)
    ax.plot(head.sizes, np.nanmean(ratios, -1), "-", color="C0", label="trained / rug (ns → ∞)")
    ax.axvline(texts_largest, color="0.4", ls=":", lw=1, label="the texts' largest ns")
    outside = head.sizes[~head.inside]
    if outside.size:
        ax.axvspan(
            head.sizes.min() / 1.2,
            outside.max() * 1.2,
            color="0.9",
            zorder=0,
            label="below the text's regime",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ns (features)")
    ax.set_ylabel("trained loss / rug's loss")
    ax.set_title(f"Past the texts' sizes (ours): p = {head.density:g}, nd/ns = {head.ratio:g}")
    ax.legend(fontsize=8)
    return fig


def headline(head, tolerance, recorded=()):
    """The text's central claim against ns: each seed's trained loss over the rug's large-ns loss
    (dots, their mean a line), the same over an actual rug of that ns with a and b fitted on
    data (dashed), that rug over the large-ns loss (crosses, the range over its row choices),
    and ±tolerance; ``recorded``: paper-record rows of sizes this build did not train (hollow)."""
    fig, ax = figure(width=5.6, height=3.6)
    ax.axhspan(
        1 - tolerance,
        1 + tolerance,
        color="C3",
        alpha=0.15,
        lw=0,
        zorder=1,
        label=f"±{tolerance:.0%}",
    )
    ax.axhline(1, color="C3", lw=1)
    sizes, seeds = head.sizes, head.trained.shape[-1]
    trained = head.trained / head.rug
    fitted = head.fitted.mean(-1)
    ax.plot(np.repeat(sizes, seeds), trained.ravel(), "o", color="C0", ms=4, alpha=0.5)
    ax.plot(sizes, np.nanmean(trained, -1), "-", color="C0", label="trained / rug (ns → ∞)")
    ax.plot(
        sizes,
        np.nanmean(head.trained, -1) / fitted,
        "--",
        color="C1",
        label="trained / rug of that ns, a and b fitted",
    )
    ax.errorbar(
        sizes,
        fitted / head.rug,
        yerr=[(fitted - head.fitted.min(-1)) / head.rug, (head.fitted.max(-1) - fitted) / head.rug],
        fmt="x",
        color="C3",
        ms=6,
        capsize=2,
        label="rug of that ns / rug (ns → ∞)",
    )
    extra = {}  # the recorded sizes this build did not train, by row: headline.<kind>ns<size>
    for row in recorded:
        found = re.fullmatch(r"headline\.(|fitted_|rug_)ns(\d+)", row["id"])
        if found is None:  # a row of the whole sweep, such as headline.trend
            continue
        kind, size = found.groups()
        if int(size) not in sizes:
            extra.setdefault(kind, []).append((int(size), row["measured"]))
    for kind, style, color, label in (
        ("", "o", "C0", "trained / rug (ns → ∞)"),
        ("fitted_", "o", "C1", "trained / fitted rug"),
        ("rug_", "x", "C3", "rug of that ns / rug (ns → ∞)"),
    ):
        if kind in extra:
            x, y = zip(*sorted(extra[kind]))
            ax.plot(x, y, style, mfc="none", color=color, ms=7, label=f"{label}, the texts' sizes")
    shown = sorted({*sizes, *(x for points in extra.values() for x, _ in points)})
    _outside_regime(ax, shown, head.density)
    ax.set(ylabel="loss ratio", title=f"p = {head.density:g}, nd/ns = {head.ratio:g}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def gap_explanation(head):
    """What lets trained models below the rug: their measured loss and the loss that Gaussian
    interference with their outputs' own a, b and σ would give, each over the rug's large-ns
    loss, mean over seeds; with the fitted rug of each size."""
    fig, ax = figure(width=5.6, height=3.4)
    ax.axhline(1, color="C3", lw=1, label="rug (ns → ∞)")
    ax.plot(head.sizes, np.nanmean(head.trained, -1) / head.rug, "o-", color="C0", label="trained")
    ax.plot(
        head.sizes,
        np.nanmean(head.gaussian, -1) / head.rug,
        "s--",
        color="C2",
        label="trained's own a, b, σ with Gaussian interference",
    )
    ax.plot(
        head.sizes, head.fitted.mean(-1) / head.rug, "x", color="C3", ms=6, label="rug of that ns"
    )
    _outside_regime(ax, list(head.sizes), head.density)
    ax.set(
        ylabel="loss / rug's large-ns loss", title=f"p = {head.density:g}, nd/ns = {head.ratio:g}"
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def loss_parts(sizes, parts, makeup, density, rug_value):
    """What the gap is made of. Left: the off and on parts of the loss, (1-p) L_off and p L_on,
    and of p L_on the part where the ReLU cuts an active feature, p L_cut, mean over seeds and
    outputs, against ns, with the rug's. Right: each output's loss against its diagonal W_ii
    for the largest ns, one seed, with the rug's per-feature loss."""
    fig, (ax, bx) = figure(2, width=3.9, height=3.2)
    ax.plot(sizes, makeup.off, "o-", color="C0", label="trained: (1-p) L_off")
    ax.plot(sizes, makeup.on, "s-", color="C1", label="trained: p L_on")
    ax.plot(sizes, makeup.cut, "^-", color="C2", label="trained: p L_cut")
    ax.axhline(makeup.rug_off, color="C0", ls=":", label="rug: (1-p) L_off")
    ax.axhline(makeup.rug_on, color="C1", ls=":", label="rug: p L_on")
    ax.axhline(makeup.rug_cut, color="C2", ls=":", label="rug: p L_cut")
    ax.set(xscale="log", yscale="log", xlabel="ns", ylabel="loss per feature")
    label_log_axis(ax, sizes)
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    last = parts[-1]
    per_feature = (1 - density) * last.off[0] + density * last.on[0]
    bx.plot(last.diagonal[0], per_feature, ".", ms=3, color="C0", alpha=0.7)
    bx.axhline(rug_value, color="C3", label="Persian rug (ns → ∞)")
    bx.set(
        yscale="log",
        xlabel="diagonal W_ii",
        ylabel="loss of output i",
        title=f"ns = {sizes[-1]}, each output",
    )
    bx.legend(fontsize=7)
    fig.suptitle(f"Where the trained loss goes (p = {density:g})", fontsize=10)
    return fig


def drop_curves(densities, ratios, losses, starts):
    """Figure 2's shape from the rug's large-ns loss: the loss as a fraction of Var x against
    nd/ns, one curve per p, each p marked on its curve's axis (the text: the drop starts near
    nd/ns ≈ p) and where the rug falls 10% below the linear model."""
    fig, ax = figure(width=5.2, height=3.4)
    for k, (p, loss, start) in enumerate(zip(densities, losses, starts)):
        ax.plot(ratios, loss / th.feature_variance(p), color=f"C{k}", label=f"p = {p:g}")
        ax.axvline(p, color=f"C{k}", lw=0.8, ls=":")
        if start is not None:
            ax.plot(
                [start],
                [np.interp(start, ratios, loss) / th.feature_variance(p)],
                "v",
                ms=7,
                color=f"C{k}",
            )
    ax.plot(ratios, 1 - ratios, "--", color="0.4", label="optimal linear")
    ax.set(
        xscale="log",
        xlabel="nd / ns",
        ylabel="loss / Var x",
        ylim=(0, 1.05),
        title="the rug's loss (ns → ∞); dotted: nd/ns = p; ▼: 10% below linear",
    )
    ax.legend(fontsize=8)
    return fig


def explorer_frame(W, b, curve, density, ratio, rug_value, nu, nu_mean, nu_sd):
    """One (p, r) of the precomputed explorer: the trained W, its training loss against the rug
    and linear levels, and the interference of output 0 against the predicted Gaussian."""
    fig, (ax, bx, cx) = figure(3, width=3.2, height=2.9)
    _matrix(ax, W[:30, :30], title="W, first 30 x 30")
    steps = np.arange(1, np.isfinite(curve).sum() + 1)
    bx.plot(steps, curve[: len(steps)], lw=0.6, color="C0", label="training loss")
    bx.axhline(rug_value, color="C3", label="Persian rug")
    bx.axhline(th.linear_loss(density, ratio), color="0.4", ls="--", label="linear")
    bx.set(yscale="log", xlabel="Adam step", title="loss")
    bx.legend(fontsize=7)
    cx.hist(nu, bins=60, density=True, color="C0", alpha=0.6, label="ν₀ measured")
    grid = np.linspace(nu.min(), nu.max(), 200)
    cx.plot(
        grid,
        np.exp(-((grid - nu_mean) ** 2) / (2 * nu_sd**2)) / (nu_sd * np.sqrt(2 * np.pi)),
        color="C3",
        label="Gaussian",
    )
    cx.set(xlabel="ν₀", title="interference of output 0")
    cx.legend(fontsize=7)
    fig.suptitle(f"p = {density:g}, nd/ns = {ratio:g}", fontsize=10)
    return fig
