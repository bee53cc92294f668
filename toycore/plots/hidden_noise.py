"""Chapter 4 figures. Each function takes an experiment's result and returns a Figure."""

import numpy as np
from matplotlib.ticker import NullFormatter

from ..experiments.hidden_noise import normalised_fourth
from ..noise import EXCESS_KURTOSIS
from ..theory import hidden_noise as th
from . import figure

LAW_STYLE = {"bipolar": "-", "gaussian": "--", "uniform": "-.", "laplace": ":"}


def _references(ax, hidden):
    ax.axhline(th.initial_fourth_norm(hidden), color="k", lw=0.8, ls="--", label="3/m")
    ax.axhline(
        th.random_unit_fourth_norm(hidden),
        color="0.5",
        lw=0.8,
        ls=":",
        label="3/(m+2): random unit vector",
    )


def _band(ax, steps, values, **style):
    """Mean over seeds (axis 1 after averaging encodings) with a ±1 sd band."""
    per_seed = values.mean(-1)
    mean, sd = per_seed.mean(-1), per_seed.std(-1)
    (line,) = ax.plot(steps, mean, **style)
    ax.fill_between(steps, mean - sd, mean + sd, color=line.get_color(), alpha=0.15, lw=0)


def _step_axis(ax, last):
    """Steps on a log axis above 1, as the authors' plots of Figure 4 draw them, step 0 kept."""
    ax.set_xscale("symlog", linthresh=1)
    ax.set(xlim=(0, last), xlabel="SGD step (log above 1)")


def _fourth_limits(values):
    """A fourth-norm axis from 0 to 1, or higher where an encoding's ‖W_i‖₂ > 1 takes it there."""
    return (0, max(1.05, 1.05 * float(np.nanmax(values))))


def fourth_norm_curves(runs, kinds=("bipolar", "gaussian")):
    """Figure 4: the mean fourth norm over training, one panel per law, one colour per σ."""
    fig, axes = figure(len(kinds), width=3.9, height=3.1, sharey=True)
    for ax, kind in zip(np.atleast_1d(axes), kinds):
        k = runs.kinds.index(kind)
        for j, sigma in enumerate(runs.sigmas):
            _band(ax, runs.steps, runs.fourth[:, k, j], color=f"C{j}", label=f"σ = {sigma:g}")
        _references(ax, runs.hidden)
        ax.set(
            title=f"{kind} noise",
            ylabel="mean ‖W_i‖₄⁴",
            ylim=_fourth_limits(runs.fourth.mean(-1)),
        )
        _step_axis(ax, runs.steps[-1])
    np.atleast_1d(axes)[0].legend(loc="upper left")
    fig.suptitle(
        f"Figure 4: sparsification under hidden noise (n = {runs.fourth.shape[-1]}, "
        f"m = {runs.hidden}, {len(runs.seeds)} seeds, band ±1 sd)",
        fontsize=10,
    )
    return fig


def laws(runs):
    """Beyond the text: all four laws at each σ (left), and the final mean fourth norm against
    the law's excess kurtosis (right)."""
    fig, (left, right) = figure(2, width=3.9, height=3.1)
    j = len(runs.sigmas) - 1
    for k, kind in enumerate(runs.kinds):
        _band(left, runs.steps, runs.fourth[:, k, j], color=f"C{k}", ls=LAW_STYLE[kind], label=kind)
    _references(left, runs.hidden)
    left.set(
        title=f"σ = {runs.sigmas[j]:g}",
        ylabel="mean ‖W_i‖₄⁴",
        ylim=_fourth_limits(runs.fourth[:, :, j].mean(-1)),
    )
    _step_axis(left, runs.steps[-1])
    left.legend(loc="upper left")
    kurtosis = [EXCESS_KURTOSIS[k] for k in runs.kinds]
    final = runs.fourth[-1].mean(-1)  # (laws, σs, seeds)
    for j, sigma in enumerate(runs.sigmas):
        right.errorbar(
            kurtosis,
            final[:, j].mean(-1),
            final[:, j].std(-1),
            marker="o",
            capsize=3,
            label=f"σ = {sigma:g}",
        )
    right.axhline(th.random_unit_fourth_norm(runs.hidden), color="0.5", lw=0.8, ls=":")
    right.set_xticks(kurtosis, [f"{kind} {x:g}" for kind, x in zip(runs.kinds, kurtosis)])
    right.tick_params(axis="x", labelrotation=30, labelsize=8)
    right.set(
        xlabel="law and its excess kurtosis μ₄/σ⁴ − 3",
        ylabel=f"mean ‖W_i‖₄⁴ at step {runs.steps[-1]}",
        ylim=(0, 1.05),
    )
    right.legend()
    return fig


def strength(sweep):
    """Figure 5: final fourth norms against λ (l1, no noise) and σ (bipolar noise), with the
    squared norms |W_i|² and the normalised fourth norm ‖W_i‖₄⁴/‖W_i‖₂⁴ that tell why they drop."""
    fig, axes = figure(2, 2, width=3.9, height=2.8, sharex="col")
    for col, (side, label) in enumerate(
        ((sweep.l1, "l1 strength λ"), (sweep.noise, "bipolar noise σ"))
    ):
        fourth, squared = side.fourth[-1], side.squared[-1]  # (values, seeds, features)
        normalised = normalised_fourth(side)[-1]
        top, bottom = axes[0, col], axes[1, col]
        for ax, values, name in (
            (top, fourth, "‖W_i‖₄⁴"),
            (top, normalised, "‖W_i‖₄⁴ / ‖W_i‖₂⁴"),
            (bottom, squared, "‖W_i‖₂²"),
        ):
            per_seed = values.mean(-1)
            ax.errorbar(
                side.values,
                per_seed.mean(-1),
                per_seed.std(-1),
                marker="o",
                ms=4,
                capsize=2,
                label=name,
            )
        top.axhline(th.initial_fourth_norm(sweep.hidden), color="k", lw=0.8, ls="--", label="3/m")
        top.set(xscale="log", ylabel=f"at step {sweep.steps[-1]}", ylim=(0, 1.05))
        bottom.set(xscale="log", xlabel=label, ylabel="mean ‖W_i‖₂²", ylim=(0, 1.1))
        bottom.xaxis.set_minor_formatter(NullFormatter())  # only decades: minor labels collide
        top.legend(fontsize=7)
    axes[1, 0].axvline(th.l1_collapse(), color="C3", lw=0.8, ls=":", label="8/(3√3): collapse")
    sigma = np.geomspace(sweep.noise.values.min(), sweep.noise.values.max(), 100)
    axes[1, 1].plot(
        sigma, th.noisy_squared_norm(sigma), "C3:", lw=1, label="1 − σ²/2, no interference"
    )
    for ax in axes[1]:
        ax.legend(fontsize=7)
    fig.suptitle(
        f"Figure 5: final fourth norms under l1 and under bipolar noise "
        f"({len(sweep.seeds)} seeds, SGD lr {sweep.lr:g})",
        fontsize=10,
    )
    return fig


def single_instance(run, index, compromising):
    """Figure 6: each encoding's fourth norm over time and the final W of one instance.

    compromising: the indices of the encodings found compromising (drawn thicker)."""
    fig, (left, right) = figure(2, width=4.2, height=3.3)
    fourth = run.fourth[:, index]
    for i in range(fourth.shape[-1]):
        left.plot(
            run.steps,
            fourth[:, i],
            lw=2.5 if i in compromising else 1,
            label=f"W_{i + 1}" + (" (compromising)" if i in compromising else ""),
        )
    left.axhline(0.2, color="0.5", lw=0.8, ls=":")
    left.set(
        ylabel="‖W_i‖₄⁴",
        ylim=_fourth_limits(fourth),
        title=f"σ = {run.sigmas[index]:g}, bipolar, seed {run.seed}",
    )
    _step_axis(left, run.steps[-1])
    left.legend(fontsize=7, ncol=2)
    W = run.W[index]
    image = right.imshow(W, vmin=-1, vmax=1)
    right.set(
        xlabel="neuron k",
        ylabel="encoding i",
        xticks=range(0, W.shape[1], 4),
        yticks=range(len(W)),
        yticklabels=[str(i + 1) for i in range(len(W))],
        title=f"final W, step {run.steps[-1]}",
    )
    right.grid(False)
    fig.colorbar(image, ax=right, shrink=0.8)
    fig.suptitle("Figure 6: one instance under bipolar noise", fontsize=10)
    return fig


def sigma_law(sigmas, times, exponent, constant, target_sigma, target_steps):
    """Steps to sparsify against σ, the fitted power law, and what it predicts at the text's
    Figure 6 setting."""
    fig, ax = figure(1, width=4.6, height=3.2)
    ax.loglog(sigmas, times, "o", label="measured")
    grid = np.geomspace(target_sigma, max(sigmas), 100)
    ax.loglog(grid, constant * grid**exponent, "C0--", lw=1, label=f"fit: σ^{exponent:.1f}")
    ax.loglog(
        grid, times[0] * (grid / sigmas[0]) ** -4, "k:", lw=1, label="σ⁻⁴ through the smallest σ"
    )
    ax.plot([target_sigma], [target_steps], "C3*", ms=12, label="text: 1M steps at σ = 0.01")
    ax.set(xlabel="bipolar noise σ", ylabel="SGD steps until mean ‖W_i‖₄⁴ ≥ level")
    ax.legend()
    return fig


def kurtosis_check(check):
    """Appendix C: the sparse-minus-dense next-step loss in units of 16η²σ⁴(1 − 1/m), against η,
    with the text's leading term (κ) and our next order."""
    fig, ax = figure(1, width=5.2, height=3.4)
    unit = 16 * check.lrs**2 * check.sigma**4 * (1 - 1 / check.hidden)
    for k, kind in enumerate(check.kinds):
        color = f"C{k}"
        ax.errorbar(
            check.lrs,
            check.measured[k] / unit,
            2 * check.error[k] / unit,
            fmt="o",
            color=color,
            capsize=3,
            label=f"{kind}: Monte Carlo (±2 se)",
        )
        ax.plot(check.lrs, check.text[k] / unit, color=color, ls="--", lw=1)
        ax.plot(check.lrs, check.ours[k] / unit, color=color, ls=":", lw=1)
    ax.plot([], [], "k--", lw=1, label="text: 16η²σ⁴‖W‖₄⁴κ")
    ax.plot([], [], "k:", lw=1, label="with our η³ term")
    ax.set(
        xscale="log",
        xlabel="learning rate η",
        ylabel="(L_sparse − L_dense) / 16η²σ⁴(1 − 1/m)",
        title=f"one step from e₁ vs (1,…,1)/√m, m = {check.hidden}, σ = {check.sigma:g}",
    )
    ax.legend(fontsize=7, ncol=2)
    return fig


def sorted_rows(W):
    """W with each neuron's largest-magnitude owner first, so shared neurons line up."""
    W = np.asarray(W)
    order = np.lexsort((-np.abs(W).max(0), np.abs(W).argmax(0)))
    return W[:, order]


def l1_against_noise(result, seed_index, counts_label):
    """Section 4: the same initial W trained under l1 and under bipolar noise (one seed), and
    the polysemantic neuron counts over all seeds."""
    fig, axes = figure(3, width=3.3, height=3.0)
    for ax, name in zip(axes, ("l1", "noise")):
        ax.imshow(sorted_rows(result.W[name][seed_index]), vmin=-1, vmax=1)
        title = f"λ = {result.l1:g}" if name == "l1" else f"bipolar σ = {result.sigma:g}"
        ax.set(
            title=f"{title}, seed {result.seeds[seed_index]}",
            xlabel="neuron (sorted)",
            ylabel="feature i",
        )
        ax.grid(False)
    top = max(c.max() for c in result.counts.values()) + 1
    bins = np.arange(top + 1) - 0.5
    for k, name in enumerate(("l1", "noise")):
        axes[2].hist(result.counts[name], bins=bins, alpha=0.6, color=f"C{k}", label=name)
    axes[2].set(xlabel=counts_label, ylabel="seeds")
    axes[2].legend()
    return fig


def explorer_frame(runs, kind, sigma):
    """One frame of the precomputed explorer: the fourth-norm curves for (law, σ) and seed 0's W."""
    k, j = runs.kinds.index(kind), list(runs.sigmas).index(sigma)
    fig, (left, right) = figure(2, width=3.6, height=2.8)
    for s in range(len(runs.seeds)):
        left.plot(runs.steps, runs.fourth[:, k, j, s].mean(-1), color="C0", alpha=0.6)
    _references(left, runs.hidden)
    left.set(
        xlabel="SGD step", ylabel="mean ‖W_i‖₄⁴", ylim=(0, 1.05), title=f"{kind}, σ = {sigma:g}"
    )
    right.imshow(sorted_rows(runs.W[k, j, 0]), vmin=-1, vmax=1)
    right.set(title="final W, seed 0", xlabel="neuron (sorted)", ylabel="feature i")
    right.grid(False)
    return fig


def live_frame(steps, fourth, W, kind, sigma):
    """The live explorer: every encoding's fourth norm over time and the final W."""
    fig, (left, right) = figure(2, width=3.6, height=2.8)
    left.plot(steps, fourth)
    left.set(xlabel="SGD step", ylabel="‖W_i‖₄⁴", ylim=(0, 1.05), title=f"{kind}, σ = {sigma:g}")
    right.imshow(sorted_rows(W), vmin=-1, vmax=1)
    right.set(title="final W", xlabel="neuron (sorted)", ylabel="feature i")
    right.grid(False)
    return fig
