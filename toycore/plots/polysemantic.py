"""Chapter 3 figures. Each function takes an experiment's result and returns a Figure."""

import numpy as np

from ..experiments.polysemantic import DEAD_NORM, survivors_relative_variance
from ..theory import polysemantic as th
from ..train import record_steps
from . import figure, label_log_axis


def _log_index(run, count):
    """About ``count`` step indices of a simulation, log-spaced, without step 0 (t = 0)."""
    return record_steps(len(run.time) - 1, count)[1:]


def solutions(named, losses):
    """The exact solutions side by side: {title: W (n, m)}, with {title: reconstruction loss}."""
    fig, axes = figure(len(named), width=2.4, height=2.6)
    for ax, (title, W) in zip(axes, named.items()):
        ax.imshow(np.asarray(W), vmin=-1, vmax=1)
        ax.set(
            title=f"{title}\nloss {losses[title]:.3g}",
            xlabel="neuron k",
            ylabel="feature i",
            xticks=[],
            yticks=[],
        )
        ax.grid(False)
    return fig


def _phases(ax, hidden, l1):
    for t, label in ((1 / (l1 * hidden**0.5), "1/(λ√m)"), (1 / l1, "1/λ")):
        ax.axvline(t, color="0.6", lw=0.8, ls=":")
        ax.annotate(
            label,
            (t, 1),
            xycoords=("data", "axes fraction"),
            va="top",
            ha="right",
            rotation=90,
            fontsize=8,
            color="0.4",
        )


def sparsification(result):
    """Figure 2: |w|_1 and m' against training time, every seed, with the three-phase law."""
    fig, axes = figure(2, width=3.9, height=3.1)
    t_end = result.runs[0].time[-1]
    t = np.geomspace(result.runs[0].dt, t_end, 400)
    law = th.sparsification_law(t, result.hidden, result.l1)
    for ax, name, label, theory in zip(axes, ("l1_norm", "nonzero"), ("‖w‖₁", "m′"), law):
        for i, run in enumerate(result.runs):
            index = _log_index(run, 600)
            ax.loglog(
                run.time[index],
                getattr(run, name)[index],
                color="C0",
                alpha=0.7,
                label="simulation" if i == 0 else None,
            )
        ax.loglog(t, theory, "k--", lw=1, label="theory, constants 1")
        _phases(ax, result.hidden, result.l1)
        ax.set(xlabel="training time t", ylabel=label)
    axes[0].legend()
    fig.suptitle(
        f"Figure 2: one encoding without interference, m = {result.hidden:.0e}, "
        f"λ = {result.l1:.0e}",
        fontsize=10,
    )
    return fig


def threshold(run, flow):
    """θ in the simulation (left) and in the trained model, interference included (right)."""
    fig, (left, right) = figure(2, width=3.9, height=3.1)
    index = _log_index(run, 600)
    k = run.nonzero[index]
    largest = run.scale[index] * run.initial[0] + run.shift[index]
    median = run.scale[index] * run.initial[(k - 1) // 2] + run.shift[index]
    theta = th.threshold(run.norm[index], run.l1, gradient_constant=1)
    time = run.time[index]
    left.loglog(time, largest, label="largest weight")
    left.loglog(time, median, label="median surviving weight")
    left.loglog(time, theta, "k--", lw=1, label="θ = λ / (1 − ‖w‖²)")
    left.set(xlabel="training time t", ylabel="weight", title="simulation, no interference")
    left.legend()
    right.semilogx(flow.time[1:], flow.agreement[1:], color="C2", alpha=0.4, lw=1)
    right.semilogx(flow.time[1:], flow.agreement[1:].mean(1), color="C2", lw=2, label="mean")
    right.set(
        xlabel="training time t (lr × steps)",
        ylim=(0, 1.02),
        ylabel="fraction moving as θ says",
        title=f"model, n={flow.features}, m={flow.hidden}, λ={flow.l1}",
    )
    right.legend()
    return fig


def relative_variance(result):
    """Figure 7: the survivors' relative variance over time between Appendix B's bounds, for the
    first seed's start (red) and the regular-percentile start (pink, dashed)."""
    fig, ax = figure(width=5.2, height=3.4)
    run = result.runs[0]
    index = _log_index(run, 800)
    k = run.nonzero[index]
    alive = k > 1
    time = run.time[index][alive]
    ax.semilogx(
        time, survivors_relative_variance(run)[index][alive], color="C1", lw=2, label="simulation"
    )
    for start, style, color, name in (
        (run.initial, "-", "C3", "bounds from W_i(0)"),
        (result.ideal.initial, "--", "hotpink", "bounds from regular percentiles"),
    ):
        lower, upper = th.relative_variance_bounds(start)
        ax.semilogx(time, lower[k[alive] - 1], style, color=color, lw=1, label=name)
        ax.semilogx(time, upper[k[alive] - 1], style, color=color, lw=1)
    ax.set(
        xlabel="training time t",
        ylabel="Var[X] / E[X]²",
        ylim=(0, 1.5),
        title="Figure 7: relative variance of the surviving weights",
    )
    ax.legend()
    return fig


def overlap_decay(flow):
    """Positive inner products early in training, on a log scale: a straight line is exponential."""
    fig, ax = figure(width=4.6, height=3.2)
    early = flow.time <= 2
    ax.semilogy(flow.time[early], flow.overlap[early], color="C0", alpha=0.3, lw=1)
    ax.semilogy(
        flow.time[early], flow.overlap[early].mean(1), color="C0", lw=2, label="mean over seeds"
    )
    ax.set(
        xlabel="training time t (lr × steps)",
        ylabel="mean W_i·W_j over pairs positive at t=0",
        title=f"n={flow.features}, m={flow.hidden}, λ={flow.l1}",
    )
    ax.legend()
    return fig


def l1_bound(bound):
    """The share of encodings the ℓ1 term kills against λ√m, one curve per m, with the text's
    bound λ = 1/√m."""
    fig, ax = figure(width=5.0, height=3.4)
    for hidden, dead in zip(bound.hiddens, bound.dead):
        ax.semilogx(bound.multiples, dead, "o-", label=f"m = {hidden}")
    ax.axvline(1.0, color="k", ls=":", lw=1, label="the text's bound λ = 1/√m")
    ax.set(
        xlabel="λ√m",
        ylabel=f"share of dead encodings (‖W_i‖ < {DEAD_NORM})",
        ylim=(-0.03, 1.03),
        title=f"gradient descent from N(0, 1/m), n = {bound.features}",
    )
    low, high = np.log2(bound.multiples[[0, -1]])
    label_log_axis(ax, [2**k for k in range(int(np.ceil(low)), int(np.floor(high)) + 1)])
    ax.legend(fontsize=8)
    return fig


def initial_forces(named):
    """The interference and the feature benefit along W_i at initialisation against m, for
    each start: {std_scale: initial_forces result}."""
    fig, ax = figure(width=5.0, height=3.4)
    for (scale, forces), color in zip(named.items(), ("C0", "C1")):
        m = forces.hiddens
        ax.loglog(m, forces.interference, "o-", color=color, label=f"interference, s = {scale}")
        ax.loglog(m, forces.benefit_size, "s--", color=color, label=f"|benefit|, s = {scale}")
    n = forces.features
    ax.loglog(m, (n - 1) / (2 * m), "k:", lw=1, label="(n-1)/(2m), its mean at s = 1")
    ax.set(
        xlabel="hidden neurons m",
        ylabel="force along W_i at t = 0",
        title=f"start N(0, s²/m), n = {n}",
    )
    label_log_axis(ax, m)
    ax.legend(fontsize=7)
    return fig


def collisions(runs):
    """Both features' weights on their shared neuron over time, benign and malign, every seed."""
    fig, axes = figure(2, width=3.9, height=3.1, sharey=True)
    for ax, kind in zip(axes, ("benign", "malign")):
        shared = runs.shared[kind] * np.sign(runs.shared[kind][:1, :, :1])  # feature 0 positive
        for s in range(shared.shape[1]):
            ax.plot(
                runs.time,
                shared[:, s, 0],
                color="C0",
                alpha=0.5,
                lw=1,
                label="feature 0" if s == 0 else None,
            )
            ax.plot(
                runs.time,
                shared[:, s, 1],
                color="C3",
                alpha=0.5,
                lw=1,
                label="feature 1" if s == 0 else None,
            )
        ax.set(
            xscale="symlog",
            xlabel="training time t (lr × steps)",
            title=f"{kind}: {'opposite' if kind == 'benign' else 'same'} signs",
        )
    axes[0].set(ylabel="weight on the shared neuron k")
    axes[0].legend()
    return fig


def polysemantic_law(sweep, fit):
    """Figure 3: polysemantic neurons against m, every seed, the mean, n²/(4m) and the fit."""
    fig, ax = figure(width=5.0, height=3.6)
    m = sweep.hiddens
    # the seeds spread sideways, less than a third of the way to the next size
    spread = min(0.08, np.diff(np.log(m)).min() / 3) if len(m) > 1 else 0.08
    jitter = np.exp(np.linspace(-spread, spread, sweep.counts.shape[1]))
    ax.scatter(
        (m[:, None] * jitter).flatten(),
        sweep.counts.flatten(),
        s=8,
        color="C0",
        alpha=0.4,
        label=f"{sweep.counts.shape[1]} seeds",
    )
    ax.errorbar(
        m,
        sweep.counts.mean(1),
        yerr=sweep.counts.std(1, ddof=1),
        fmt="o-",
        color="C0",
        capsize=3,
        label="mean ± sd",
    )
    grid = np.geomspace(m[0], m[-1], 50)
    n = sweep.features
    ax.plot(grid, n**2 / (4 * grid), "k--", lw=1, label="n²/(4m)")
    low, high = fit.interval
    ax.plot(
        grid,
        fit.constant * n**2 / grid,
        color="C1",
        lw=1,
        label=f"{fit.constant:.3f} n²/m (count·m/n², mean over m)  [{low:.3f}, {high:.3f}]",
    )
    ax.set(
        xscale="log",
        yscale="symlog",
        xlabel="hidden neurons m",
        ylabel="polysemantic neurons",
        title=f"Figure 3: n = {n}, λ = {sweep.l1}",
        ylim=(0, None),  # counts: an error bar reaching below 0 opened a negative axis
    )
    label_log_axis(ax, m)
    ax.legend()
    return fig


def persistence(sweep, result):
    """Section 5's 'until m ≈ n²': the mean count per model against m from n to n², with the law
    C(n, 2)/(2m), and the share of models with at least one polysemantic neuron."""
    fig, (left, right) = figure(2, width=3.9, height=3.1)
    m, n = sweep.hiddens, sweep.features
    left.errorbar(
        m,
        sweep.counts.mean(1),
        yerr=sweep.counts.std(1, ddof=1) / np.sqrt(sweep.counts.shape[1]),
        fmt="o-",
        capsize=3,
        label=f"mean ± s.e., {sweep.counts.shape[1]} seeds",
    )
    left.plot(m, result.expected, "k--", lw=1, label="C(n,2)/(2m)")
    left.set(xscale="log", yscale="log", xlabel="hidden neurons m", ylabel="polysemantic neurons")
    right.plot(m, result.share, "o-", label="models with one or more")
    right.plot(m, result.represented, "s--", label="features represented")
    right.set(xscale="log", ylim=(0, 1.05), xlabel="hidden neurons m", ylabel="share")
    for ax in (left, right):
        ax.axvline(n**2, color="0.6", ls=":", lw=1)
        label_log_axis(ax, m)
        ax.legend(fontsize=8)
    fig.suptitle(f"Section 5: n = {n}, m from n to n² = {n**2}", fontsize=10)
    return fig


def untied(named):
    """Appendix A: how far the untied decoder ends from the encoder, per run and seed.
    ``named``: {(optimizer, m): untied_run result}."""
    fig, ax = figure(width=4.8, height=3.0)
    labels = [f"{optimizer}, m = {m}" for optimizer, m in named]
    for i, run in enumerate(named.values()):
        ax.scatter(np.full(len(run.distance), i), run.distance, color="C0", s=14)
        ax.scatter([i], [run.start.mean()], color="0.5", marker="x")
    ax.axhline(0.1, color="k", ls="--", lw=1, label="10%")
    ax.set(
        yscale="log",
        ylabel="‖D - E‖_F / ‖E‖_F at the end",
        xticks=range(len(labels)),
        title="untied encoder E and decoder D (x: at the start)",
    )
    ax.set_xticklabels(labels, fontsize=8)
    ax.legend()
    return fig


def winner_ranks(named):
    """Footnote 6: where the winning coordinate ranked at initialisation, per optimiser/size.
    ``named``: {label: winner_statistics result}."""
    fig, ax = figure(width=5.0, height=3.2)
    width = 0.8 / len(named)
    for i, (label, stats) in enumerate(named.items()):
        share = stats.rank_counts[:8] / stats.rank_counts.sum()
        ax.bar(np.arange(1, 9) + (i - (len(named) - 1) / 2) * width, share, width, label=label)
    ax.set(
        xlabel="rank of the winning coordinate at initialisation (1 = largest)",
        ylabel="share of features",
        xticks=range(1, 9),
    )
    ax.legend()
    return fig


def split_outcomes(named):
    """Section 5's fix: the share of split neurons whose two features separated, per optimiser.
    ``named``: {label: split_runs result}."""
    fig, ax = figure(width=4.4, height=3.0)
    labels = list(named)
    share = np.array([named[k].mean() for k in labels])
    count = np.array([len(named[k]) for k in labels])
    ax.bar(labels, share, yerr=np.sqrt(share * (1 - share) / count), capsize=4, color="C2")
    ax.axhline(0.5, color="k", ls="--", lw=1, label="two independent races: 1/2")
    ax.set(ylim=(0, 1), ylabel="features separated", title="duplicate, split, perturb, train on")
    ax.legend()
    return fig


def sorted_weights(W, label=""):
    """A trained W with its used neurons sorted by the feature they represent; polysemantic
    neurons marked above the matrix and counted in the title, after ``label``."""
    W = np.asarray(W)
    used = np.abs(W).max(0) > 0.5
    owner = np.abs(W).argmax(0)
    order = np.flatnonzero(used)[np.argsort(owner[used], kind="stable")]
    poly = th.polysemantic_neurons(W).numpy()[order]
    fig, ax = figure(width=5.2, height=4.0)
    ax.imshow(W[:, order], vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax.scatter(
        np.flatnonzero(poly), np.full(poly.sum(), -1.2), marker="v", color="k", s=14, clip_on=False
    )
    ax.set(
        xlabel=f"the {len(order)} used neurons of {W.shape[1]}, sorted",
        ylabel="feature i",
        title=f"{label}{poly.sum()} polysemantic neurons (▼)",
    )
    ax.grid(False)
    return fig


LANDING_KINDS = ("no winner", "opposite sign\nonly", "same sign\nonly", "both signs")


def landings(result):
    """Where features land for the last time: per kind of neuron, the landings observed over
    those a uniformly drawn neuron would give, with Poisson errors. ``result``: ``landings``."""
    fig, ax = figure(width=4.8, height=3.0)
    observed, expected = result.observed.sum(0), result.expected.sum(0)
    ratio = observed / expected
    error = np.sqrt(observed) / expected
    ax.bar(LANDING_KINDS, ratio, yerr=error, capsize=4, color=["C0", "C3", "C7", "C7"])
    ax.axhline(1.0, color="k", ls="--", lw=1, label="a neuron drawn uniformly")
    ax.set(
        ylabel="landings / uniform",
        xlabel="the neuron's other winners, by sign, before the feature lands",
        title=f"ρ = {result.preference:.2f}; final rate {result.rate:.2f}, predicted "
        f"{result.predicted:.2f} (× 1/(2m))",
    )
    ax.legend(loc="upper right")
    return fig


def landing_rates(hiddens, results):
    """Per m, the final winners' coincidence rate against the rate their landings predict,
    in units of 1/(2m), with jackknife standard errors. ``results``: ``landings`` per m."""
    fig, ax = figure(width=4.8, height=3.0)
    hiddens = np.asarray(hiddens)
    offset = 0.01 * hiddens.max()  # the two side by side at each m
    for shift, name, value in [
        (-offset, "final winners", "rate"),
        (offset, "predicted by the landings", "predicted"),
    ]:
        ax.errorbar(
            hiddens + shift,
            [getattr(r, value) for r in results],
            yerr=[r.jackknife(value) for r in results],
            fmt="o",
            capsize=3,
            label=name,
        )
    ax.axhline(1.0, color="k", ls="--", lw=1, label="the count: 1/(2m)")
    ax.set(xlabel="m", ylabel="coincidences × 2m", title="Figure 3's runs")
    ax.legend(loc="lower left")
    return fig
