"""Chapter 1 figures. Each function takes an experiment's result and returns a Figure."""

import numpy as np

from ..theory import linear as th
from . import figure


def spectrum(splitting, features_values=(4, 16, 64)):
    """Left: the sample bulk width against T with the T^-1/2 law. Right: population λ_1/λ_bulk
    against S, i.e. how far E x xᵀ is from a multiple of the identity."""
    fig, (left, right) = figure(2)
    T, width = splitting.sample_sizes, splitting.width
    left.errorbar(T, width.mean(1), yerr=width.std(1), fmt="o", label="sample Σ")
    reference = width.mean(1)[0] * np.sqrt(T[0] / T)
    left.plot(T, reference, "k--", label=r"$\propto T^{-1/2}$")
    left.set(
        xscale="log",
        yscale="log",
        xlabel="samples T",
        ylabel=r"bulk width $(\lambda_2-\lambda_D)/\lambda_{\rm bulk}$",
        title=f"splitting of the degenerate eigenvalue (slope {splitting.slope:.2f})",
    )
    left.legend()
    S = np.linspace(0, 0.999, 200)
    for D in features_values:
        ratio = [
            th.population_spectrum(D, s)["top"] / th.population_spectrum(D, s)["bulk"] for s in S
        ]
        right.plot(1 - S, ratio, label=f"D = {D}")
    right.set(
        xscale="log",
        yscale="log",
        xlabel="density 1 − S",
        ylabel=r"$\lambda_1 / \lambda_{\rm bulk}$ of $E\,xx^\top$",
        title="Σ ∝ I only when (1 − S)·D ≪ 1",
    )
    right.legend()
    return fig


def convergence(result):
    """(L - L_min)/L_min along gradient descent, one line per seed."""
    fig, ax = figure(width=5)
    history = result.history
    gap = np.maximum((history.loss - result.predicted) / result.predicted, 1e-17)
    ax.plot(history.steps, gap, alpha=0.7)
    ax.set(
        xscale="symlog",
        yscale="log",
        xlabel="step",
        ylabel=r"$(L - L_{\min}) / L_{\min}$",
        title="gradient descent reaches tr Σ − (λ₁ + … + λ_d)",
    )
    return fig


def census(result):
    """Left: each critical point's loss against the sum of the eigenvalues it leaves out.
    Right: the Hessian's negative eigenvalues against the inversions of its index set."""
    fig, (left, right) = figure(2)
    rows = result.rows
    predicted = [r.predicted for r in rows]
    left.plot(predicted, [r.loss for r in rows], "o")
    left.plot([min(predicted), max(predicted)], [min(predicted), max(predicted)], "k--", lw=1)
    left.set(
        xlabel=r"$\sum_{i\notin I}\lambda_i$",
        ylabel="loss at the critical point",
        title=f"all {len(rows)} critical points",
    )
    counts = {}
    for r in rows:
        key = (r.inversions, r.negative)
        counts[key] = counts.get(key, 0) + 1
    for (x, y), n in counts.items():
        right.scatter(x, y, s=40 + 30 * n, color="C1")
        right.annotate(f"×{n}", (x, y), textcoords="offset points", xytext=(8, -4), fontsize=8)
    top = max(r.inversions for r in rows)
    right.plot([0, top], [0, top], "k--", lw=1)
    right.set(
        xlabel="inversions: j ∈ I, k ∉ I, λ_k > λ_j",
        ylabel="negative Hessian eigenvalues",
        title="every saddle's escape directions",
    )
    return fig


def escape(drops):
    """Loss decrease at the Prop. 3 perturbation: measured against eps²/(1+eps²)(λ_k − λ_j)."""
    fig, ax = figure(width=5)
    ax.plot(
        drops.eps,
        drops.predicted,
        "k-",
        label=r"$\frac{\epsilon^2}{1+\epsilon^2}(\lambda_k-\lambda_j)$",
    )
    ax.plot(drops.eps, drops.measured, "o", label="measured")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="ε",
        ylabel="loss decrease",
        title="leaving a saddle along u_j → (u_j + ε u_k)/√(1+ε²)",
    )
    ax.legend()
    return fig


def flows(untied, tied, energy):
    """(a) the untied flow (20)-(21) and gradient descent; (b) the tied flow (22) against the
    tied loss's own gradient flow; (c) the energy (28) along (22) with Σ = I."""
    fig, (a, b, c) = figure(3, width=3.8)
    for lr, run in sorted(untied.items(), reverse=True):
        a.plot(
            run.times,
            run.loss,
            "o",
            ms=3,
            alpha=0.6,
            label=f"GD lr={lr} (dev. {run.deviation:.1e})",
        )
    run = untied[min(untied)]
    a.plot(run.times, run.flow_loss, "k-", lw=1, label="flow (20)–(21)")
    a.set(xlabel="flow time t = 2·lr·step", ylabel="loss", title="(a) untied: GD follows the flow")
    a.legend()
    b.plot(tied.times, tied.loss_22, label="flow (22)")
    b.plot(tied.times, tied.loss_gradient, label="tied gradient flow")
    b.axhline(tied.minimum, color="k", ls="--", lw=1, label="PCA minimum")
    b.set(
        xscale="log",
        xlabel="flow time t",
        ylabel="tied loss",
        title="(b) tied: (22) stalls above the minimum",
    )
    b.legend()
    c.plot(energy.times, energy.energy)
    c.set(xlabel="flow time t", ylabel="E", title="(c) energy (28) along (22), Σ = I")
    return fig


def saddle_run(run):
    """Loss along gradient descent started ε from a saddle, with every critical value."""
    fig, ax = figure(width=6)
    for value in run.all_critical_values:
        ax.axhline(value, color="0.85", lw=0.8, zorder=0)
    ax.axhline(run.saddle, color="C3", ls="--", lw=1, label="the saddle's critical value")
    ax.axhline(run.minimum, color="k", ls="--", lw=1, label="the minimum")
    for i, eps in enumerate(run.eps):
        ax.plot(run.steps, run.loss[:, i], label=f"ε = {eps:.0e}")
    ax.set(xlabel="step", ylabel="loss", title="a plateau at the saddle, then escape")
    ax.legend(ncol=2)
    return fig


def loss_curve(curve, hidden, sparsity):
    """One run's loss (as a fraction of tr Σ) against every critical value for (d, S)."""
    fig, ax = figure(width=6, height=3.4)
    critical = np.unique(np.round(curve.critical, 12))
    for value in critical:
        ax.axhline(value, color="0.8", lw=0.8, zorder=0)
    ax.axhline(critical.min(), color="k", ls="--", lw=1, label="global minimum")
    ax.plot(curve.steps + 1, curve.loss, color="C0", label="gradient descent")
    ax.set(
        xscale="log",
        xlabel="step + 1",
        ylabel="loss / tr Σ",
        ylim=(0, 1.02),
        title=f"d = {hidden}, S = {sparsity}: {len(critical)} critical values (grey)",
    )
    ax.legend(loc="lower left")
    return fig
