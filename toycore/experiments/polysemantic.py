"""Chapter 3 experiments: incidental polysemanticity from l1 regularisation.

Two kinds of run. The sparsification ODE of one encoding without interference (Figure 2, Figure
7) is simulated exactly and fast through Appendix B's observation that every surviving weight
moves by the same affine map. The tied model itself (``TiedBasisAutoencoder``) trains many
instances at once with its closed-form gradient: AdamW for the text's Figure 3 settings, plain
gradient descent where the text reasons about gradient flow. Runs that take long are ``@cached``.
"""

from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy import stats
from torch import nn

from .. import shards
from ..cache import cached
from ..checks import check_range, check_seeds, check_size
from ..claims import seed_tolerance
from ..devices import to_host
from ..models import Instances, TiedBasisAutoencoder, _device, _normal
from ..profiles import select
from ..seeding import generator
from ..sizes import POLYSEMANTIC
from ..theory import polysemantic as th
from ..train import record_steps, train

DTYPE = torch.float64
# The authors' recipe for Figure 3 (their collisions.py): l1 strength λ, AdamW's learning rate
# (with its default weight decay, 0.01) and the number of steps
FIGURE3_L1 = 1e-3
FIGURE3_LR = 1e-3
FIGURE3_STEPS = 7500
# Above this n (the text's is 256) Figure 3's final winners coincide measurably less often than
# 1/(2m): where features land (the landing rows) is the chapter's reading of why
FEWER_COLLISIONS_ABOVE_N = 128


# --- the sparsification ODE without interference ----------------------------------------------


def sizes(profile=None):
    """This chapter's sizes in ``profile`` (default: ``$TOYCORE_PROFILE``, else ``cpu``), from
    ``toycore.sizes.POLYSEMANTIC``, as nested attributes."""
    return select(profile, **POLYSEMANTIC)


def initial_encoding(hidden, seed, std_scale=0.9):
    """The text's Figure 2 start: |N(0, (0.9/√m)²)| in each of m coordinates, (m,) float64."""
    check_size("hidden", hidden)
    g = generator(seed, "encoding")
    return (torch.randn(hidden, generator=g, dtype=DTYPE) * std_scale * hidden**-0.5).abs().numpy()


def _check_ode(initial, l1, dt, steps):
    initial = np.asarray(initial, dtype=float)
    if initial.ndim != 1 or not len(initial) or not np.all(initial > 0):
        raise ValueError("initial must be a non-empty vector of positive weights")
    check_range("l1", l1, 0, low_open=True)
    check_range("dt", dt, 0, 1, low_open=True)
    check_size("steps", steps)
    return initial


def euler_sparsification(initial, l1, dt, steps):
    """Plain Euler on dw/dt = (1 - |w|²) w - λ sign(w), coordinates that reach 0 dropped
    (set to 0 for good), every coordinate stored: (steps + 1, m). For checking the fast one."""
    w = _check_ode(initial, l1, dt, steps).copy()
    path = [w.copy()]
    for _ in range(steps):
        w = np.where(w > 0, w + dt * ((1 - w @ w) * w - l1), 0.0)
        w = np.maximum(w, 0.0)
        path.append(w.copy())
    return np.array(path)


@dataclass(frozen=True)
class Sparsification:
    """One simulated sparsification: the survivors' norms, count and affine map at every step."""

    time: np.ndarray  # (steps + 1,) training time t = dt × step
    l1_norm: np.ndarray  # (steps + 1,) |w|_1
    norm: np.ndarray  # (steps + 1,) |w|²
    nonzero: np.ndarray  # (steps + 1,) int, the survivors m'
    scale: np.ndarray  # (steps + 1,) a(t) in w_k(t) = a(t) w_k(0) + b(t)
    shift: np.ndarray  # (steps + 1,) b(t)
    initial: np.ndarray  # (hidden,) the initial weights, largest first
    l1: float  # λ
    dt: float  # the Euler step


def simulate_sparsification(initial, l1, dt, steps):
    """The same Euler iteration in O(1) per step, however large m.

    An Euler step maps every surviving weight by the same affine map w -> c w - dt λ with
    c = 1 + dt (1 - |w|²), so at every step the survivors are the m' largest initial weights
    and w_k(t) = a(t) w_k(0) + b(t). Prefix sums of the sorted initial weights give |w|² and
    |w|_1 in O(1); m' only decreases. Returns, per step 0..steps: time, |w|_1, |w|², m', a, b.
    """
    w0 = np.sort(_check_ode(initial, l1, dt, steps))[::-1]
    first, second = np.cumsum(w0).tolist(), np.cumsum(w0**2).tolist()
    w0 = w0.tolist()
    a, b, alive = 1.0, 0.0, len(w0)
    out = np.empty((steps + 1, 5))
    for step in range(steps + 1):
        s1, s2 = first[alive - 1], second[alive - 1]
        norm = a * a * s2 + 2 * a * b * s1 + alive * b * b
        out[step] = (a * s1 + alive * b, norm, alive, a, b)
        c = 1 + dt * (1 - norm)
        a, b = a * c, b * c - dt * l1
        while alive > 1 and a * w0[alive - 1] + b <= 0:
            alive -= 1
    return Sparsification(
        time=dt * np.arange(steps + 1),
        l1_norm=out[:, 0],
        norm=out[:, 1],
        nonzero=out[:, 2].astype(int),
        scale=out[:, 3],
        shift=out[:, 4],
        initial=np.array(w0),
        l1=l1,
        dt=dt,
    )


def survivors_relative_variance(run, initial=None):
    """The relative variance Var/E² of the surviving weights at every step of a simulation,
    from the same prefix sums (``initial`` defaults to the run's own start)."""
    w0 = run.initial if initial is None else np.sort(initial)[::-1]
    k = run.nonzero
    s1, s2 = np.cumsum(w0)[k - 1], np.cumsum(w0**2)[k - 1]
    mean = (run.scale * s1 + k * run.shift) / k
    square = (run.scale**2 * s2 + 2 * run.scale * run.shift * s1 + k * run.shift**2) / k
    return np.maximum(square - mean**2, 0.0) / mean**2


@dataclass(frozen=True)
class SparsificationRuns:
    """Figure 2's simulations: one per seed and one from the regular-percentile start."""

    hidden: int  # m
    l1: float  # λ
    seeds: np.ndarray  # (seeds,)
    runs: list  # (seeds,) of Sparsification, one per seed
    ideal: Sparsification  # from the regular-percentile start


@cached
def sparsification_runs(hidden, l1, seeds, *, dt, steps):
    """Figure 2's simulation for each seed, plus one from the regular-percentile start."""
    seeds = check_seeds(seeds)
    runs = [simulate_sparsification(initial_encoding(hidden, s), l1, dt, steps) for s in seeds]
    ideal = simulate_sparsification(
        th.regular_percentiles(hidden, 0.9 * hidden**-0.5), l1, dt, steps
    )
    return SparsificationRuns(hidden=hidden, l1=l1, seeds=np.array(seeds), runs=runs, ideal=ideal)


def log_slope(x, y):
    """The least-squares slope of log y against log x."""
    return np.polyfit(np.log(x), np.log(y), 1)[0]


def middle_phase(time, hidden, l1, start=10, stop=0.1):
    """Figure 2's middle phase, t in [start/(λ√m), stop/λ]. The default [10/(λ√m), 0.1/λ] is
    well after the start and well before the end; start=1, stop=1 is the text's whole middle
    phase. A mask like ``time``."""
    return (time >= start / (l1 * hidden**0.5)) & (time <= stop / l1)


def share_inside_bounds(result):
    """Figure 7's orange curve against its red ones: per seed, the share of steps with at least
    two survivors at which their relative variance lies between Appendix B's bounds from the
    seed's own start (to a relative 1e-9, for rounding). (seeds,)"""
    shares = []
    for run in result.runs:
        lower, upper = th.relative_variance_bounds(run.initial)
        alive = run.nonzero >= 2
        k, value = run.nonzero[alive], survivors_relative_variance(run)[alive]
        shares.append(_between_bounds(value, k, lower, upper).mean())
    return np.array(shares)


def percentile_gap(result, points=60):
    """How far Appendix B's bounds from each seed's start lie from those from the
    regular-percentile start (Figure 7's red and pink curves) as m' shrinks: at ``points``
    values of m' spaced evenly in log m' from 2 to m, the larger of the two bounds' relative
    gaps, per seed. The bounds depend on the start alone, so no run is needed.

    Returns (m', gap): (points,) and (seeds, points), fewer points where two round alike."""
    survivors = np.unique(np.geomspace(2, result.hidden, points).round().astype(int))
    ideal = np.stack(th.relative_variance_bounds(result.ideal.initial))[:, survivors - 1]
    gaps = [
        np.abs(
            np.stack(th.relative_variance_bounds(run.initial))[:, survivors - 1] / ideal - 1
        ).max(0)  # (2, m') -> (m',): the farther bound
        for run in result.runs
    ]
    return survivors, np.array(gaps)


def percentile_gap_words(survivors, gap):
    """``percentile_gap``'s mean over seeds at the two ends of m', and its log-log slope, as a
    clause the prose can quote."""
    mean = gap.mean(0)
    slope = log_slope(survivors, mean)
    direction = {-1: "grows as m' shrinks", 0: "stays level as m' shrinks", 1: "shrinks with m'"}
    return (
        f"{direction[int(np.sign(slope))]}: "
        f"{mean[-1]:.1%} with all m = {survivors[-1]:,} weights left, "
        f"{mean[0]:.0%} with {survivors[0]} (log-log slope {slope:.2f}, mean over seeds)"
    )


def middle_relative_variance(result):
    """The lowest and highest relative variance of the survivors over every seed's middle
    phase (Appendix B says it stays Θ(1)): (low, high)."""
    middle = [
        survivors_relative_variance(run)[middle_phase(run.time, result.hidden, result.l1)]
        for run in result.runs
    ]
    return min(v.min() for v in middle), max(v.max() for v in middle)


# Appendix B's law at more than Figure 2's size: m = 10⁴, 10⁵ (Figure 2's) and 10⁶
LAW_SIZES = (10**4, 10**5, 10**6)
# λt late in the middle phase: the survivors left there depend on λt alone (m' ∝ 1/(λt)²), not
# on m; it lies in the middle phase [1/(λ√m), 1/λ] for m ≥ 1/LATE²
LATE = 0.1


@dataclass(frozen=True)
class LawAtSizes:
    """Appendix B's |w|_1 = 1/Θ(1/√m + λt) "with high probability in m", at several m: the
    ratio r = |w|_1 (1/√m + λt) (the law with constants 1 gives r = 1) on each seed's run,
    each m from seeds of its own."""

    hiddens: np.ndarray  # (sizes,) m
    seeds: int  # runs at each m
    extreme: np.ndarray  # (sizes,) largest max(r, 1/r) over seeds and [1/(λ√m), 1/λ]
    start_spread: np.ndarray  # (sizes,) the seeds' sd of log r at t = 1/(λ√m)
    start_share: np.ndarray  # (sizes,) the share m'/m of weights left there, mean over seeds
    late_spread: np.ndarray  # (sizes,) the seeds' sd of log r at λt = LATE
    late_survivors: np.ndarray  # (sizes,) the survivors m' there, mean over seeds


def size_seeds(seeds, index):
    """The seeds of the ``index``-th size: ``seeds`` moved past those of the sizes before it,
    so that no two sizes share a start (``initial_encoding`` at a smaller m would be the first
    draws of the larger m's)."""
    return [s + index * (max(seeds) + 1) for s in seeds]


@cached
def law_at_sizes(hiddens, l1, seeds, *, dt):
    """Figure 2's simulation at each m of ``hiddens`` for each seed (``size_seeds``), up to
    t = 1/λ, measured as ``LawAtSizes`` says."""
    seeds = check_seeds(seeds)
    if len(seeds) < 2 or len(hiddens) < 2:
        raise ValueError(
            f"a spread over seeds, compared across sizes, needs at least 2 seeds and 2 sizes; "
            f"got {len(seeds)} seeds and {len(hiddens)} sizes"
        )
    for hidden in hiddens:
        check_size("hidden", hidden, minimum=round(LATE**-2))
    check_range("l1", l1, 0, low_open=True)
    check_range("dt", dt, 0, 1, low_open=True)
    steps = int(np.ceil(1 / (l1 * dt)))  # to the end of the middle phase, t = 1/λ
    out = {key: [] for key in ("extreme", "start", "share", "late", "survivors")}
    for index, hidden in enumerate(hiddens):
        runs = [
            simulate_sparsification(initial_encoding(hidden, s), l1, dt, steps)
            for s in size_seeds(seeds, index)
        ]
        t = runs[0].time
        log_r = np.log([run.l1_norm * (hidden**-0.5 + l1 * t) for run in runs])  # (seeds, steps)
        whole = middle_phase(t, hidden, l1, start=1, stop=1)
        out["extreme"].append(np.abs(log_r[:, whole]).max())
        start, late = np.searchsorted(t, [1 / (l1 * hidden**0.5), LATE / l1])
        out["start"].append(log_r[:, start].std(ddof=1))
        out["share"].append(np.mean([run.nonzero[start] for run in runs]) / hidden)
        out["late"].append(log_r[:, late].std(ddof=1))
        out["survivors"].append(np.mean([run.nonzero[late] for run in runs]))
    return LawAtSizes(
        hiddens=np.array(hiddens),
        seeds=len(seeds),
        extreme=np.exp(out["extreme"]),
        start_spread=np.array(out["start"]),
        start_share=np.array(out["share"]),
        late_spread=np.array(out["late"]),
        late_survivors=np.array(out["survivors"]),
    )


def spread_ratio_tolerance(seeds, confidence=0.95):
    """How far apart, as |log| of their ratio, two standard deviations each from ``seeds``
    independent samples of one normal law fall with probability ``confidence``: half the log
    of the F test's two-sided bound F(1 - (1 - confidence)/2; seeds - 1, seeds - 1)."""
    return 0.5 * np.log(stats.f.ppf(1 - (1 - confidence) / 2, seeds - 1, seeds - 1))


def spread_slope_tolerance(hiddens, seeds, confidence=0.95):
    """The two-sided ``confidence`` half-width of the log-log slope of standard deviations
    against ``hiddens``, each from ``seeds`` independent normal samples: the log of such a
    standard deviation has variance about 1/(2(seeds - 1)), and a least-squares slope divides
    it by the spread of log m."""
    x = np.log(np.asarray(hiddens, dtype=float))
    error = (1 / (2 * (seeds - 1)) / ((x - x.mean()) ** 2).sum()) ** 0.5
    return stats.norm.ppf(1 - (1 - confidence) / 2) * error


@dataclass(frozen=True)
class SparsificationPhases:
    """Figure 2's three phases, measured on each seed's run."""

    start: np.ndarray  # (seeds,) |w|_1(0)/√m
    slope: np.ndarray  # (seeds,) d log|w|_1 / d log t over the text's middle phase
    law_slope: np.ndarray  # (seeds,) the same fit to the law 1/(1/√m + λt) at the same times
    rate: np.ndarray  # (seeds,) d(1/|w|_1)/dt over [10/(λ√m), 0.1/λ], in units of λ
    end: np.ndarray  # (seeds,) λt when m' first reaches 1
    quasi_static: np.ndarray  # (seeds,) largest |(1 - |w|²) / (λ|w|_1/|w|²) - 1|, middle phase
    proxy: tuple  # (low, high) of m' / |w|_1² over every seed's [10/(λ√m), 0.1/λ]


def sparsification_phases(result):
    """Figure 2's three phases, measured on each seed's run (arrays over seeds):
    start: |w|_1(0)/√m; slope: d log|w|_1 / d log t over the text's whole middle phase
    [1/(λ√m), 1/λ], and law_slope the same fit to the law with constants 1 (which bends from
    slope -1/2 to -1 there); rate: d(1/|w|_1)/dt over [10/(λ√m), 0.1/λ], in units of λ (the
    law says 1); end: λt when m' first reaches 1; quasi_static: the largest relative gap
    between the two sides of the text's 1 - |w|² ≈ λ|w|_1/|w|² over [1/(λ√m), 1/λ]; proxy:
    the range of m'/|w|_1² over every seed's [10/(λ√m), 0.1/λ]."""
    m, l1 = result.hidden, result.l1
    out = {key: [] for key in ("start", "slope", "law_slope", "rate", "end", "quasi", "proxy")}
    for run in result.runs:
        whole = middle_phase(run.time, m, l1, start=1, stop=1)
        balance = (1 - run.norm[whole]) / (l1 * run.l1_norm[whole] / run.norm[whole])
        # the slope over 2.5 decades, on log-spaced steps so that each decade counts the same
        index = np.unique(np.searchsorted(run.time, np.geomspace(*run.time[whole][[0, -1]], 200)))
        t, norm = run.time[index], run.l1_norm[index]
        law, _ = th.sparsification_law(t, m, l1)
        out["slope"].append(log_slope(t, norm))
        out["law_slope"].append(log_slope(t, law))
        out["quasi"].append(np.abs(balance - 1).max())
        middle = middle_phase(run.time, m, l1)
        out["rate"].append(np.polyfit(run.time[middle], 1 / run.l1_norm[middle], 1)[0] / l1)
        out["proxy"].append(run.nonzero[middle] / run.l1_norm[middle] ** 2)
        out["start"].append(run.l1_norm[0] / m**0.5)
        out["end"].append(l1 * run.time[np.argmax(run.nonzero == 1)])
    return SparsificationPhases(
        start=np.array(out["start"]),
        slope=np.array(out["slope"]),
        law_slope=np.array(out["law_slope"]),
        rate=np.array(out["rate"]),
        end=np.array(out["end"]),
        quasi_static=np.array(out["quasi"]),
        proxy=(min(p.min() for p in out["proxy"]), max(p.max() for p in out["proxy"])),
    )


@dataclass(frozen=True)
class AffineCheck:
    """Appendix B checked on plain Euler: the affine map's fit and the variance bounds."""

    residual: float  # the largest residual of the affine fit, relative to the largest weight
    inside: float  # the share of steps whose relative variance lies between the bounds


def _between_bounds(value, survivors, lower, upper):
    """Whether a relative variance with ``survivors`` weights left lies between Appendix B's
    bounds (``relative_variance_bounds``), to a relative 1e-9 for rounding."""
    low, high = lower[survivors - 1], upper[survivors - 1]
    return (low * (1 - 1e-9) <= value) & (value <= high * (1 + 1e-9))


def affine_check(hidden, l1, dt, steps, seed=0):
    """Appendix B on plain Euler (no affine shortcut): at every step, fit one affine map from the
    initial survivors to the current ones and report the largest residual relative to the
    weights; and whether the survivors' relative variance lies between the bounds."""
    initial = initial_encoding(hidden, seed)
    path = euler_sparsification(initial, l1, dt, steps)
    lower, upper = th.relative_variance_bounds(initial)
    residual, inside = 0.0, []
    for w in path[1:]:
        alive = w > 0
        if alive.sum() < 2:
            break
        A = np.stack([initial[alive], np.ones(alive.sum())], axis=1)
        fit, *_ = np.linalg.lstsq(A, w[alive], rcond=None)
        residual = max(residual, np.abs(A @ fit - w[alive]).max() / w[alive].max())
        rv, k = th.relative_variance(w[alive]), alive.sum()
        inside.append(_between_bounds(rv, k, lower, upper))
    return AffineCheck(residual=residual, inside=np.mean(inside))


# --- the tied model -----------------------------------------------------------------------------


def initial_weights(features, hidden, seeds):
    """The N(0, 1/m) start each seed gives ``TiedBasisAutoencoder``: (seeds, features, hidden)."""
    return TiedBasisAutoencoder(features, hidden, seeds, l1=0.0).W.detach().to(DTYPE).cpu()


def _overlap_tracker(model):
    """A metric: the mean of W_i·W_j over the pairs i ≠ j with W_i·W_j > 0 at the start."""
    with torch.no_grad():
        G = model.W @ model.W.transpose(-1, -2)
    positive = (G > 0) & ~torch.eye(G.shape[-1], dtype=torch.bool, device=G.device)
    count = positive.sum((-2, -1))

    def overlap(model):
        return ((model.W @ model.W.transpose(-1, -2)) * positive).sum((-2, -1)) / count

    return overlap


def _threshold_agreement(model):
    """Among the coordinates clearly away from their encoding's threshold θ_i (by more than
    10%, and above θ_i / 2 so that dead ones do not count), the fraction that move the way the
    threshold says: grow above θ_i, shrink below. Uses the gradient the step just computed,
    interference included: (instances,)."""
    W = model.W
    theta = th.threshold(W.square().sum(-1), model.l1[:, None])[..., None]
    size = W.abs()
    growing = -(model.W.grad * W.sign()) > 0
    decided = (size > theta / 2) & ((size - theta).abs() > 0.1 * theta)
    agree = decided & (growing == (size > theta))
    return agree.sum((-2, -1)) / decided.sum((-2, -1)).clamp(min=1)


def _train(model, *, steps, lr, optimizer, records, metrics=None, desc):
    """Train and return the history and the final W as a float64 array. Arrays, not tensors:
    results feed other cached runs, and joblib hashes arrays by content."""
    history = train(
        model,
        None,
        steps=steps,
        lr=lr,
        optimizer=optimizer,
        record_at=record_steps(steps, records),
        metrics=metrics,
        desc=desc,
    )
    return history, to_host(model.W.to(DTYPE))


# the intervals between records of each feature's winner over a run, evenly spaced in steps
# (one record more than this; fewer where a run has fewer steps)
WINNER_RECORDS = 75


def _winner(model):
    """A metric: the neuron of each encoding's largest weight, (instances, n)."""
    return model.W.detach().abs().argmax(-1).cpu()


def _winner_positive(model):
    """A metric: whether each encoding's largest weight is positive, (instances, n)."""
    W = model.W.detach()
    return (W.gather(-1, W.abs().argmax(-1, keepdim=True))[..., 0] > 0).cpu()


@cached
def polysemantic_shard(features, hidden, seeds, l1, *, steps, lr):
    """One shard of Figure 3: one model per seed at one m (batched), with the authors' AdamW,
    every feature's winner and its sign recorded at WINNER_RECORDS + 1 evenly spaced steps
    (rounded, so fewer where ``steps`` < WINNER_RECORDS). Returns a dict of "W", the final W
    (seeds, n, m) float64, "steps" (records,), and "winner" and "positive" (records, seeds,
    n)."""
    model = TiedBasisAutoencoder(features, hidden, seeds, l1)
    history = train(
        model,
        None,
        steps=steps,
        lr=lr,
        optimizer="adamw",
        record_at=np.linspace(0, steps, WINNER_RECORDS + 1).round().astype(int),
        metrics=dict(winner=_winner, positive=_winner_positive),
        desc=f"n={features} m={hidden}, {len(seeds)} seeds",
    )
    return dict(W=to_host(model.W.to(DTYPE)), steps=history.steps, **history.metrics)


@dataclass(frozen=True)
class WinnerPaths:
    """Each feature's winner followed through Figure 3's training, one model per seed."""

    features: int  # n
    hidden: int  # m
    seeds: np.ndarray  # (seeds,)
    steps: np.ndarray  # (records,) the steps recorded, 0 and the last included
    winner: np.ndarray  # (records, seeds, n) the neuron of each encoding's largest weight
    positive: np.ndarray  # (records, seeds, n) whether that weight is positive


@dataclass(frozen=True)
class PolysemanticSweep:
    """Figure 3's models: one per (m, seed), their final W, polysemantic neuron counts and
    every feature's winner over time."""

    features: int  # n
    hiddens: np.ndarray  # (hiddens,) the sizes m
    seeds: np.ndarray  # (seeds,)
    l1: float  # λ
    W: list  # (hiddens,) of (seeds, features, hidden) float64 arrays, hidden = hiddens[i]
    counts: np.ndarray  # (hiddens, seeds) polysemantic neurons
    paths: list  # (hiddens,) of WinnerPaths


def polysemantic_sweep(features, hiddens, seeds, l1, *, steps, lr):
    """Figure 3: for each m, train one model per seed, one shard per m (``toycore.shards``).

    Returns final W per m (a list of (seeds, n, m) float64), the polysemantic neuron counts
    (len(hiddens), seeds) and each m's WinnerPaths."""
    # the shards' own checks would run only once the sweep has started: check here first
    seeds, features = list(check_seeds(seeds)), check_size("features", features)
    for hidden in hiddens:
        check_size("hidden", hidden, minimum=features)
    check_range("l1", l1, 0)
    check_size("steps", steps)
    check_range("lr", lr, 0, low_open=True)
    calls = [((features, hidden, seeds, l1), dict(steps=steps, lr=lr)) for hidden in hiddens]
    parts = shards.run(polysemantic_shard, calls, f"Figure 3, n={features}")
    finals = [part["W"] for part in parts]
    counts = np.array([th.count_polysemantic(W).numpy() for W in finals])
    paths = [
        WinnerPaths(
            features=features,
            hidden=hidden,
            seeds=np.array(seeds),
            steps=part["steps"],
            winner=part["winner"],
            positive=part["positive"],
        )
        for hidden, part in zip(hiddens, parts)
    ]
    return PolysemanticSweep(
        features=features,
        hiddens=np.array(hiddens),
        seeds=np.array(seeds),
        l1=l1,
        W=finals,
        counts=counts,
        paths=paths,
    )


def winner_paths(features, hidden, seeds, *, steps=FIGURE3_STEPS, lr=FIGURE3_LR, l1=FIGURE3_L1):
    """Figure 3's training at one m with every feature's winner recorded over time."""
    return polysemantic_sweep(features, [hidden], seeds, l1, steps=steps, lr=lr).paths[0]


@dataclass(frozen=True)
class GradientFlow:
    """Plain gradient descent on one model per seed, with its metrics recorded over time."""

    features: int  # n
    hidden: int  # m
    seeds: np.ndarray  # (seeds,)
    l1: float  # λ
    time: np.ndarray  # (records,) training time lr × steps
    W: np.ndarray  # (seeds, features, hidden) float64, at the end
    overlap: np.ndarray  # (records, seeds) mean W_i·W_j over the pairs positive at the start
    agreement: np.ndarray  # (records, seeds) share of decided weights moving as θ says


@cached
def gradient_flow_run(features, hidden, seeds, l1, *, steps, lr, records=60):
    """Plain gradient descent (a small-step stand-in for the text's gradient flow), recording
    the overlap of the initially positive pairs and the threshold agreement over time."""
    model = TiedBasisAutoencoder(features, hidden, seeds, l1)
    metrics = {"overlap": _overlap_tracker(model), "agreement": _threshold_agreement}
    history, W = _train(
        model,
        steps=steps,
        lr=lr,
        optimizer="sgd",
        records=records,
        metrics=metrics,
        desc=f"gradient descent n={features} m={hidden}",
    )
    return GradientFlow(
        features=features,
        hidden=hidden,
        seeds=np.array(seeds),
        l1=l1,
        time=history.steps * lr,
        W=W,
        overlap=history.metrics["overlap"],
        agreement=history.metrics["agreement"],
    )


# Section 2 assumes λ ≤ 1/√m "such that l1 regularization does not impose total and degenerate
# sparsity on weights". We look for where that sparsity sets in: λ√m from the bound up to 32 in
# half-octaves, by gradient descent with steps small enough to follow the flow (a step moves a
# weight by lr·λ, far below its initial size 1/√m), until the largest initial weight, about
# 3.5/√m, would have shrunk to zero even at the bound (t = 3.5/(λ√m) ≤ 3.5).
L1_MULTIPLES = tuple(2 ** (k / 2) for k in range(11))  # λ√m: 1, √2, 2, ..., 32
L1_SWEEP_TIME = 10.0
L1_SWEEP_LR = 0.002
L1_BOUND_SIZES = (1, 4)  # the m it runs at, in units of the gradient-descent setting's m
DEAD_NORM = 0.5  # a dead encoding: ‖W_i‖ below half the unit length (trained norms are near 0 or 1)


@cached
def l1_bound_shard(features, hidden, seeds, multiple, *, time, lr):
    """Gradient descent at λ = multiple/√m from the N(0, 1/m) start until ``time``: the final
    encoding lengths ‖W_i‖, (seeds, n) float64."""
    model = TiedBasisAutoencoder(features, hidden, seeds, multiple / hidden**0.5)
    _, W = _train(
        model,
        steps=round(time / lr),
        lr=lr,
        optimizer="sgd",
        records=2,
        desc=f"n={features} m={hidden}, λ√m = {multiple:.3g}",
    )
    return np.linalg.norm(W, axis=-1)


@dataclass(frozen=True)
class L1Bound:
    """Where the ℓ1 term kills whole encodings: per m and λ√m, the share of dead encodings."""

    features: int  # n
    hiddens: np.ndarray  # (hiddens,) the sizes m
    multiples: np.ndarray  # (multiples,) λ√m, increasing
    dead: np.ndarray  # (hiddens, multiples) share of encodings with ‖W_i‖ < DEAD_NORM, all seeds

    def half_dead(self):
        """Per m, the λ√m at which half the encodings are dead, interpolated in log λ√m between
        the grid's values around it; the grid's first value if half are dead there already, inf
        if never on the grid. (hiddens,)"""
        return np.array([crossing(self.multiples, dead, 0.5) for dead in self.dead])


def crossing(x, y, level):
    """The x at which y first reaches ``level`` from below, interpolated in log x: x[0] if y
    starts there, inf if it never does (for a falling y, pass -y and -level)."""
    x, y = np.log(np.asarray(x, float)), np.asarray(y, float)
    above = np.flatnonzero(y >= level)
    if not len(above):
        return np.inf
    k = above[0]
    if k == 0:
        return float(np.exp(x[0]))
    share = (level - y[k - 1]) / (y[k] - y[k - 1])
    return float(np.exp(x[k - 1] + share * (x[k] - x[k - 1])))


def l1_bound(
    features, hiddens, seeds, multiples=L1_MULTIPLES, *, time=L1_SWEEP_TIME, lr=L1_SWEEP_LR
):
    """Section 2's λ ≤ 1/√m: for each m and λ√m, train one model per seed (one shard per pair,
    ``toycore.shards``) and count the encodings the ℓ1 term kills."""
    seeds, features = list(check_seeds(seeds)), check_size("features", features)
    for hidden in hiddens:
        check_size("hidden", hidden, minimum=features)
    multiples = np.asarray(multiples, dtype=float)
    if not (multiples.ndim == 1 and len(multiples) and np.all(multiples > 0)):
        raise ValueError("multiples must be positive values of λ√m")
    if np.any(np.diff(multiples) <= 0):
        raise ValueError("multiples must increase")
    check_range("time", time, 0, low_open=True)
    check_range("lr", lr, 0, low_open=True)
    calls = [
        ((features, int(hidden), seeds, float(c)), dict(time=time, lr=lr))
        for hidden in hiddens
        for c in multiples
    ]
    norms = shards.run(l1_bound_shard, calls, f"λ up to {multiples[-1]:g}/√m, n={features}")
    dead = np.array([(norm < DEAD_NORM).mean() for norm in norms])
    return L1Bound(
        features=features,
        hiddens=np.array(hiddens),
        multiples=multiples,
        dead=dead.reshape(len(hiddens), len(multiples)),
    )


@dataclass(frozen=True)
class InitialForces:
    """The forces on each encoding at initialisation, along W_i, for several m at one n."""

    features: int  # n
    hiddens: np.ndarray  # (hiddens,) the sizes m
    std_scale: float  # the start is N(0, (std_scale/√m)²)
    interference: np.ndarray  # (hiddens,) mean over i and seeds of Σ_{j≠i} ReLU(W_i·W_j)²
    benefit: np.ndarray  # (hiddens,) mean over i and seeds of (1 - |W_i|²) |W_i|²
    benefit_size: np.ndarray  # (hiddens,) mean over i and seeds of |(1 - |W_i|²) |W_i|²|
    # (hiddens,) mean over i and seeds of the share of the interference force's squared length
    # that lies along W_i: cos² of its angle with W_i
    along: np.ndarray


def along_prediction(features, hiddens):
    """The share of the interference force's squared length along W_i at an N(0, s²/m) start,
    for large n and m, for each m in ``hiddens`` (the along part's own spread over its n-1
    terms is left out). Along W_i the terms ReLU(W_i·W_j) W_j
    contribute ReLU(W_i·W_j)²/|W_i|, all of one sign: (n-1) s⁴/(2m) / s in all. Across it the
    W_j point in independent directions and add like a random walk, a squared length
    (n-1) s⁴/(2m) · s². So the across part's square is 2m/(n-1) times the along part's, and the
    share along W_i is 1 / (1 + 2m/(n-1)), whatever s."""
    return 1 / (1 + 2 * np.asarray(hiddens) / (features - 1))


def initial_forces(features, hiddens, seeds, std_scale=1.0):
    """§2.1's comparison at initialisation: the interference and the feature benefit, each
    projected on W_i, from the N(0, (std_scale/√m)²) start of ``TiedBasisAutoencoder``.
    The text expects interference Θ(n/m) against a benefit Θ(1)."""
    check_range("std_scale", std_scale, 0, low_open=True)
    interference, benefit, size, along = [], [], [], []
    for hidden in hiddens:
        model = TiedBasisAutoencoder(
            features, hidden, seeds, init_std=std_scale * hidden**-0.5, dtype=DTYPE, device="cpu"
        )
        W = model.W.detach()
        G = W @ W.transpose(-1, -2)  # (seeds, n, n)
        norm = G.diagonal(dim1=-2, dim2=-1)  # (seeds, n)
        interference.append((torch.relu(G).square().sum(-1) - norm.square()).mean().item())
        benefit.append(((1 - norm) * norm).mean().item())
        size.append(((1 - norm) * norm).abs().mean().item())
        # the interference force on each W_i: -Σ_{j≠i} ReLU(W_i·W_j) W_j, (seeds, n, m)
        force = -(torch.relu(G) - torch.diag_embed(norm)) @ W
        # (seeds, n); NaN for an encoding with no acute partner, which feels no force at all
        cosine = (force * W).sum(-1) / (force.norm(dim=-1) * W.norm(dim=-1))
        along.append(cosine.square().nanmean().item())
    return InitialForces(
        features=features,
        hiddens=np.array(hiddens),
        std_scale=std_scale,
        interference=np.array(interference),
        benefit=np.array(benefit),
        benefit_size=np.array(size),
        along=np.array(along),
    )


def dominance_words(hiddens, features, interference, benefit):
    """Where the feature benefit outweighs the interference along m (``initial_forces``'
    (hiddens,) arrays), as a clause the prose can quote: "from m = 2n on; at m = n the
    interference, 0.323, is above the benefit, 0.133"."""

    def size(m):
        return "n" if m == features else f"{m // features}n"

    hiddens = list(hiddens)
    ahead = [m for m, i, b in zip(hiddens, interference, benefit) if b > i]
    first = (
        f"at m = {size(hiddens[0])} the interference, {interference[0]:.3f}, is "
        f"{'above' if interference[0] > benefit[0] else 'not above'} the benefit, "
        f"{benefit[0]:.3f}"
    )
    if not ahead:
        where = "at no m of this sweep"
    elif ahead == hiddens:
        where = "at every m of this sweep"
    elif ahead == hiddens[hiddens.index(ahead[0]) :]:
        where = f"from m = {size(ahead[0])} on"
    else:
        where = "at m = " + ", ".join(map(size, ahead))
    return f"{where}; {first}"


@dataclass(frozen=True)
class OverlapDecay:
    """How the mean positive overlap of a gradient-descent run falls, read off its records."""

    first_time: float  # t of the first record after 0
    first_rate: np.ndarray  # (seeds,) e-folds per unit time up to that record
    half_rate: np.ndarray  # (seeds,) e-folds per unit time over t <= 1/2
    cross_time: float  # t of the first record with a negative mean (over seeds) overlap (NaN: none)
    cross_last: float  # the mean overlap one record before (NaN: no crossing, or at the start)


def overlap_decay(flow):
    """The early decay of ``GradientFlow.overlap``: its rate up to the first record and over
    t <= 1/2, and when the mean overlap first overshoots below zero (NaN where it never does)."""
    half = np.searchsorted(flow.time, 0.5)
    (crossed,) = np.nonzero(flow.overlap.mean(1) <= 0)
    cross = crossed[0] if crossed.size else None
    return OverlapDecay(
        first_time=flow.time[1],
        first_rate=np.log(flow.overlap[0] / flow.overlap[1]) / flow.time[1],
        half_rate=np.log(flow.overlap[0] / flow.overlap[half]) / flow.time[half],
        cross_time=np.nan if cross is None else flow.time[cross],
        cross_last=np.nan if not cross else flow.overlap[cross - 1].mean(),
    )


@dataclass(frozen=True)
class OverlapRate:
    """The initial decay rate of the positive overlaps under small steps, and the text's."""

    measured: np.ndarray  # (seeds,) e-folds per unit time of the mean positive overlap
    predicted: np.ndarray  # (seeds,) 4 (|W_i|² + |W_j|²), weighted as that mean is, at t = 0
    time: float  # the span of the fit


def step_share_words(step_rate, pair_rate, first_rate):
    """How much of the gap between the first record's decay rate and the pair's predicted rate
    a coarse step's own rate accounts for, as a clause the prose can quote."""
    gap = first_rate - pair_rate
    share = (step_rate - pair_rate) / gap if gap else float("nan")
    if not np.isfinite(share) or share <= 0:
        return "none of the difference, which we have not traced"
    if share < 1:
        return f"{share:.0%} of the difference; we have not traced the rest"
    return f"all of the difference and more ({share:.0%} of it)"


def predicted_overlap_rate(W):
    """The rate at which the mean of the positive W_i·W_j falls if each pair felt only its own
    interference, d(W_i·W_j)/dt = -4 (W_i·W_j)(|W_i|² + |W_j|²) (§2.1, with our loss's 4):
    Σ g_ij 4(|W_i|² + |W_j|²) / Σ g_ij over the pairs with g_ij = W_i·W_j > 0. W: (seeds, n, m)."""
    G = W @ W.transpose(-1, -2)
    norm = G.diagonal(dim1=-2, dim2=-1)
    positive = torch.relu(G) * ~torch.eye(G.shape[-1], dtype=torch.bool)
    rate = 4 * (norm[..., :, None] + norm[..., None, :])
    return ((positive * rate).sum((-2, -1)) / positive.sum((-2, -1))).numpy()


@cached
def overlap_rate(features, hidden, seeds, l1, *, lr, steps):
    """Gradient descent with small steps (lr × steps of training time, every step recorded)
    from the usual start; the decay rate of the mean positive overlap by a linear fit of its
    log against t, per seed, beside ``predicted_overlap_rate`` of the start."""
    model = TiedBasisAutoencoder(features, hidden, seeds, l1, dtype=DTYPE)
    predicted = predicted_overlap_rate(model.W.detach().cpu())
    history, _ = _train(
        model,
        steps=steps,
        lr=lr,
        optimizer="sgd",
        records=steps + 1,
        metrics={"overlap": _overlap_tracker(model)},
        desc=f"small steps n={features} m={hidden}",
    )
    time = history.steps * lr
    slope = np.polyfit(time, np.log(history.metrics["overlap"]), 1)[0]  # (seeds,)
    return OverlapRate(measured=-slope, predicted=predicted, time=time[-1])


def _instances_from(W, l1):
    """A model whose instances start from the given W (instances, features, hidden)."""
    instances, features, hidden = W.shape
    model = TiedBasisAutoencoder(features, hidden, range(instances), l1)
    with torch.no_grad():
        model.W.copy_(W)
    return model


def forced_collisions(initial, lead=1.0, alone=False):
    """Make features 0 and 1 share their largest coordinate, with opposite signs (benign) and
    with the same sign (malign): feature 1's largest entry is swapped into feature 0's largest
    coordinate k, and its sign set. ``lead`` > 1 scales both shared entries up so that, without
    interference, they would surely win their races. ``alone``: the text's case, two rows that
    share only k: besides k, feature 0 keeps its even-numbered coordinates and feature 1 its
    odd ones, the rest set to zero. ``initial``: (seeds, n, m). Returns the benign and the
    malign starts (each (seeds, n, m)) and k (seeds,)."""
    if not lead >= 1:
        raise ValueError(f"lead must be >= 1; got {lead!r}")
    W = torch.as_tensor(initial, dtype=DTYPE)
    rows = torch.arange(len(W))
    k = W[:, 0].abs().argmax(-1)
    largest = W[:, 1].abs().argmax(-1)
    odd = torch.arange(W.shape[-1]) % 2 == 1  # (m,)
    starts = []
    for sign in (-1.0, 1.0):
        start = W.clone()
        start[rows, 1, largest] = W[rows, 1, k]  # the swap; entry k is set below
        if alone:
            start[:, 0, odd] = 0
            start[:, 1, ~odd] = 0
        start[rows, 0, k] = lead * W[rows, 0, k]
        start[rows, 1, k] = sign * lead * W[rows, 1, largest].abs() * W[rows, 0, k].sign()
        starts.append(start)
    return starts[0], starts[1], k


@dataclass(frozen=True)
class Collisions:
    """Gradient descent from forced collisions: both features' weights on the shared neuron."""

    time: np.ndarray  # (records,) training time lr × steps
    shared: dict  # {"benign" | "malign": (records, seeds, 2)} weights of features 0 and 1 on k


@cached
def collision_runs(features, hidden, seeds, l1, *, steps, lr, lead=1.0, alone=False, records=60):
    """Gradient descent from the benign and the malign forced collision of each seed
    (``forced_collisions``), recording both features' weights on the shared neuron k over
    time."""
    benign, malign, k = forced_collisions(initial_weights(features, hidden, seeds), lead, alone)
    model = _instances_from(torch.cat([benign, malign]).float(), l1)
    device = model.W.device
    both = torch.cat([k, k]).to(device)
    rows, pair = (
        torch.arange(len(both), device=device)[:, None],
        torch.arange(2, device=device)[None, :],
    )
    shared = {"shared": lambda model: model.W[rows, pair, both[:, None]]}
    history, _ = _train(
        model,
        steps=steps,
        lr=lr,
        optimizer="sgd",
        records=records,
        metrics=shared,
        desc=f"forced collisions, {len(both)} runs",
    )
    count = len(k)
    return Collisions(
        time=history.steps * lr,
        shared={
            "benign": history.metrics["shared"][:, :count],
            "malign": history.metrics["shared"][:, count:],
        },
    )


def split_neurons(W, noise, seed=0, per_model=None):
    """Section 5's proposed fix, for the polysemantic neurons of every model in W (models, n, m):
    all of them, or at most ``per_model`` of each model's, drawn at random.

    Each instance is one model with one polysemantic neuron k duplicated into a new last column.
    The text halves the copies' outgoing weights; in a tied model the outgoing weights are the
    incoming ones, so both copies get W_k/√2, which leaves W Wᵀ (and the loss's data term) as
    it was, plus independent N(0, noise²) perturbations on the features' nonzero entries.
    Returns the starts (instances, n, m + 1), the two features (instances, 2), the model
    each instance came from (instances,) and the neuron k it split (instances,), whose copy is
    the last column."""
    W = torch.as_tensor(W, dtype=DTYPE)
    polysemantic = th.polysemantic_neurons(W)  # (models, m)
    if not polysemantic.any():
        raise ValueError(
            "no polysemantic neuron to split: every neuron represents at most one feature"
        )
    if per_model is not None:
        check_size("per_model", per_model)
    starts, features, which, columns = [], [], [], []
    for model in range(len(W)):
        g = generator(seed, f"split {model}")  # one stream per model: its shard stands alone
        neurons = polysemantic[model].nonzero().flatten()
        if per_model is not None and len(neurons) > per_model:
            neurons = neurons[torch.randperm(len(neurons), generator=g)[:per_model]].sort().values
        for k in neurons.tolist():
            column = W[model, :, k] / 2**0.5
            start = torch.cat([W[model], column[:, None]], dim=1)  # (n, m + 1)
            start[:, k] = column
            on = th.representing(W[model, :, k]).nonzero().flatten()
            start[on[:, None], torch.tensor([k, -1])] += noise * torch.randn(
                len(on), 2, generator=g, dtype=DTYPE
            )
            starts.append(start)
            features.append(on[:2])
            which.append(model)
            columns.append(k)
    return torch.stack(starts), torch.stack(features), torch.tensor(which), torch.tensor(columns)


def shared_leads(starts, features, columns):
    """For each split start of ``split_neurons``: whether its two features start ahead on the
    same copy, each feature's lead being the copy (neuron k or its copy, the last column)
    where its weight is larger in size: bool (instances,)."""
    rows = torch.arange(len(starts))[:, None]
    on_k = starts[rows, features, columns[:, None]].abs()  # (instances, 2)
    on_copy = starts[rows, features, -1].abs()
    ahead_on_k = on_k > on_copy
    return ahead_on_k[:, 0] == ahead_on_k[:, 1]


@dataclass(frozen=True)
class SplitCoupling:
    """How the two races of a split neuron depend on each other, from which copy each feature
    starts ahead on and whether the split ended separated."""

    apart: float  # P(separated | the features start ahead on different copies)
    together: float  # P(separated | they start ahead on the same copy)
    excess: float  # apart + together - 1: 0 for independent races, whatever the odds a lead holds
    se: float  # its binomial standard error
    together_share: float  # the share of splits whose features start ahead on the same copy


def split_coupling(separated, shared):
    """``SplitCoupling`` from ``split_runs``' outcomes and ``shared_leads``, both (instances,).

    If each feature keeps its lead with probability q_i, independently of the other, a split
    whose leads lie on different copies separates with probability q_i q_j + (1 - q_i)(1 - q_j)
    and one whose leads share a copy with q_i (1 - q_j) + (1 - q_i) q_j: the two add to 1. So
    ``excess`` measures the coupling, and with leads on the same copy half the time (the noise
    is symmetric) the rate of separation is 1/2 + excess/2."""
    separated, shared = np.asarray(separated, dtype=bool), np.asarray(shared, dtype=bool)
    if not shared.any() or shared.all():
        raise ValueError(
            "split_coupling needs splits with leads on the same and on different copies"
        )
    apart, together = separated[~shared].mean(), separated[shared].mean()
    variance = apart * (1 - apart) / (~shared).sum() + together * (1 - together) / shared.sum()
    return SplitCoupling(
        apart=float(apart),
        together=float(together),
        excess=float(apart + together - 1),
        se=float(np.sqrt(variance)),
        together_share=float(shared.mean()),
    )


@cached
def split_shard(starts, features, l1, *, steps, lr, optimizer):
    """One shard of ``split_runs``: train the split starts (instances, n, m + 1) of one model and
    return, per instance, whether its two features (instances, 2) ended on different neurons,
    each monosemantic: bool (instances,)."""
    model = _instances_from(torch.as_tensor(starts).float(), l1)
    _, final = _train(
        model,
        steps=steps,
        lr=lr,
        optimizer=optimizer,
        records=2,
        desc=f"{len(starts)} split neurons",
    )
    final, features = torch.as_tensor(final), torch.as_tensor(features)
    rows = torch.arange(len(final))[:, None]
    homes = final.abs()[rows, features].argmax(-1)  # (instances, 2): each feature's neuron
    represented = th.representing(final)[rows, features, homes]
    alone = th.representing(final).sum(-2)[rows, homes] == 1
    separated = (homes[:, 0] != homes[:, 1]) & (represented & alone).all(-1)
    return separated.numpy()


def split_runs(W, l1, *, noise, steps, lr, optimizer, seed=0, per_model=None):
    """Train every split neuron's model on (see ``split_neurons``), one shard per source model
    (``toycore.shards``), and return, per instance, whether its two features ended on
    different neurons, each monosemantic: bool (instances,)."""
    check_range("l1", l1, 0)
    check_size("steps", steps)
    check_range("lr", lr, 0, low_open=True)
    starts, features, which, _ = split_neurons(W, noise, seed, per_model)
    calls = [
        (
            (starts[which == model].numpy(), features[which == model].numpy(), l1),
            dict(steps=steps, lr=lr, optimizer=optimizer),
        )
        for model in which.unique().tolist()
    ]
    outcomes = shards.run(split_shard, calls, f"{len(starts)} split neurons, {optimizer}")
    return np.concatenate(outcomes)


# --- Appendix A: untied weights, rotated inputs ------------------------------------------------


class UntiedBasisAutoencoder(Instances):
    """Appendix A's untied variant: y = ReLU(D Eᵀ x) on n orthonormal inputs x_i, the rows of
    ``inputs`` (default the basis), with targets e_i. E and D: (instances, features, hidden);
    E's row i is feature i's encoding (the encoder is Eᵀ), D's row j reads output j (the decoder
    is D), so the tied model is D = E = W. The penalty λ/2 (Σ_i |Eᵀ x_i|_1 + |D|_1), on the
    activations and the decoder, is the tied model's λ|W|_1 when D = E = W and the inputs are
    the basis. E and D start independent, each N(0, init_scale²/m). Trained by autograd."""

    def __init__(self, features, hidden, seeds, l1, inputs=None, init_scale=1.0, device=None):
        super().__init__(features, seeds)
        check_size("hidden", hidden, minimum=features)
        self.l1 = float(check_range("l1", l1, 0))
        std = check_range("init_scale", init_scale, 0, low_open=True) * hidden**-0.5
        device = _device(device)
        E, D = _normal(self.seeds, [(features, hidden)] * 2, std, DTYPE, device)
        self.basis = inputs is None
        inputs = torch.eye(features, dtype=DTYPE) if inputs is None else inputs
        self.register_buffer("inputs", torch.as_tensor(inputs, dtype=DTYPE).to(device))
        self.E = nn.Parameter(E)
        self.D = nn.Parameter(D)

    @property
    def W(self):
        """The encodings E, which play the tied model's W: (instances, features, hidden)."""
        return self.E

    def loss(self):
        """The summed squared error over the n inputs plus the penalty: (instances,)."""
        # (instances, n, m): row i is the activations on x_i; on the basis, E itself (the product
        # with the identity gives E exactly, and its gradient too: a third of the step's products)
        hidden = self.E if self.basis else self.inputs @ self.E
        error = torch.relu(hidden @ self.D.transpose(-1, -2))  # (instances, inputs, outputs)
        error = error - torch.eye(self.features, dtype=DTYPE, device=error.device)
        penalty = hidden.abs().sum((-2, -1)) + self.D.abs().sum((-2, -1))
        return error.square().sum((-2, -1)) + self.l1 / 2 * penalty


def untied_distance(E, D):
    """|D - E|_F / |E|_F per instance: 0 when the decoder is the encoder's transpose."""
    return (D - E).norm(dim=(-2, -1)) / E.norm(dim=(-2, -1))


@dataclass(frozen=True)
class UntiedRun:
    """Untied models trained from independent starts: how close the decoder came to Eᵀ."""

    start: np.ndarray  # (seeds,) |D - E|_F / |E|_F at initialisation
    distance: np.ndarray  # (seeds,) the same at the end
    product: np.ndarray  # (seeds,) mean over features of E_i·D_i at the end
    loss: np.ndarray  # (seeds,) final loss


# Appendix A's conditions for untied weights to end tied, as we read them: "start out small",
# a tenth of the usual scale; "some weight decay", enough to shrink a weight e^DECAY_OVER_RUN
# times over the run by itself
SMALL_START = 0.1
DECAY_OVER_RUN = 5.0


def decay_over_run(lr, steps):
    """The weight decay that alone shrinks a weight e^DECAY_OVER_RUN times in ``steps`` steps
    of ``lr`` (AdamW's decoupled decay multiplies it by 1 - lr x decay at every step)."""
    return DECAY_OVER_RUN / (check_range("lr", lr, 0, low_open=True) * check_size("steps", steps))


@cached
def untied_run(
    features, hidden, seeds, l1, *, steps, lr, optimizer, init_scale=1.0, weight_decay=None
):
    """Appendix A's claim that untied weights become tied: train ``UntiedBasisAutoencoder``
    on the basis (AdamW with torch's default weight decay 0.01, as the authors' tied runs,
    unless ``weight_decay`` is given; or plain gradient descent), from a start ``init_scale``
    times the usual, and measure the decoder against the encoder."""
    model = UntiedBasisAutoencoder(features, hidden, seeds, l1, init_scale=init_scale)
    start = untied_distance(model.E.detach(), model.D.detach())
    decay = {} if weight_decay is None else dict(weight_decay=weight_decay)
    history = train(
        model,
        None,
        steps=steps,
        lr=lr,
        optimizer=optimizer,
        record_at=[0, steps],
        desc=f"untied n={features} m={hidden} ({optimizer})",
        **decay,
    )
    E, D = model.E.detach(), model.D.detach()
    return UntiedRun(
        start=to_host(start),
        distance=to_host(untied_distance(E, D)),
        product=to_host((E * D).sum(-1).mean(-1)),
        loss=history.loss[-1],
    )


def random_rotation(features, seed):
    """A random orthogonal (features, features) matrix, float64: Q of the QR of a Gaussian."""
    g = generator(seed, "rotation")
    Q, R = torch.linalg.qr(torch.randn(features, features, generator=g, dtype=DTYPE))
    return Q * torch.sign(R.diagonal())  # the sign fix makes Q Haar-distributed


@dataclass(frozen=True)
class RotationRun:
    """The untied model trained on the basis and on rotated inputs from matching starts."""

    distance: np.ndarray  # (seeds,) |E_basis - X E_rotated|_F / |E_basis|_F at the end
    loss_gap: np.ndarray  # (seeds,) largest |loss_basis - loss_rotated| / loss_basis on record


@cached
def rotation_run(features, hidden, seeds, l1, *, steps, lr, optimizer, seed=0):
    """Appendix A's 'orthogonal inputs are the basis in disguise': inputs x_i = the rows of
    X = ``random_rotation`` (outputs still e_i), started from E' = Xᵀ E, so that the
    activations X E' = E are those of the basis run. Gradient descent then follows the same path
    in E = X E' (the loss is a function of X E' and D, and X is orthogonal); Adam's
    coordinate-wise step has no such symmetry."""
    X = random_rotation(features, seed)
    runs = []
    for inputs in (None, X):
        model = UntiedBasisAutoencoder(features, hidden, seeds, l1, inputs=inputs)
        if inputs is not None:
            with torch.no_grad():
                model.E.copy_(model.inputs.T @ model.E)
        history, _ = _train(
            model,
            steps=steps,
            lr=lr,
            optimizer=optimizer,
            records=20,
            desc=f"untied, {'rotated' if runs else 'basis'} inputs ({optimizer})",
        )
        runs.append((model.inputs @ model.E.detach(), history.loss))
    (E, loss), (E_rotated, loss_rotated) = runs
    return RotationRun(
        distance=to_host(untied_distance(E, E_rotated)),
        loss_gap=(np.abs(loss - loss_rotated) / loss).max(0),
    )


# --- analyses -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LawFit:
    """The constant c of count = c n²/m in a Figure 3 sweep, and the log-log slope of the mean
    count."""

    constant: float  # c: count·m/n², mean over m (each m alike) and seeds
    interval: tuple  # (low, high) its t-interval over seeds
    per_seed: np.ndarray  # (seeds,) each seed's count·m/n², mean over m
    per_m: np.ndarray  # (hiddens,) c read at each m alone: mean count·m/n²
    slope: float  # d log(mean count) / d log m


def law_fit(sweep, confidence=0.95):
    """The constant c of count = c n²/m: count·m/n² averaged over m, each m of the sweep
    counting alike (the text's claim is the same at every m; a least-squares fit of count =
    c n²/m would weigh each m by (n²/m)² and read mostly the smallest), then over seeds.

    Returns c with its t-interval over seeds, c read at each m alone, and the slope of
    log(mean count) against log m (the law says -1)."""
    x = sweep.features**2 / sweep.hiddens.astype(float)  # (hiddens,)
    per_seed = (sweep.counts / x[:, None]).mean(0)  # (seeds,)
    half = seed_tolerance(per_seed, confidence)
    mean_count = sweep.counts.mean(1)
    slope = log_slope(sweep.hiddens, np.maximum(mean_count, 1e-12))
    return LawFit(
        constant=per_seed.mean(),
        interval=(per_seed.mean() - half, per_seed.mean() + half),
        per_seed=per_seed,
        per_m=mean_count / x,
        slope=slope,
    )


def _pairs_sharing(index):
    """For index (seeds, n): which pairs i < j share their entry: bool (seeds, n, n), upper."""
    n = index.shape[-1]
    upper = torch.ones(n, n, dtype=torch.bool).triu(1)
    return (index[:, :, None] == index[:, None, :]) & upper


@dataclass(frozen=True)
class Persistence:
    """Section 5's 'until m ≈ n²', read off a Figure 3 sweep whose m runs from n to n²."""

    expected: np.ndarray  # (hiddens,) the law's mean count C(n, 2)/(2m)
    share: np.ndarray  # (hiddens,) share of models with at least one polysemantic neuron
    represented: np.ndarray  # (hiddens,) share of features with a weight in [0.8, 1.2]
    observed_last: int  # polysemantic neurons at m = n², all seeds together
    expected_last: float  # the law's count there, all seeds together


def persistence(sweep):
    """The counts of a sweep with m from n to n² against the law C(n, 2)/(2m): per m the law,
    the share of models with a polysemantic neuron and the share of features that some neuron
    represents (whose race is over), and at m = n² the total over seeds observed and
    expected."""
    n = sweep.features
    if sweep.hiddens[-1] != n**2:
        raise ValueError(f"the sweep must end at m = n² = {n**2}; got {sweep.hiddens[-1]}")
    expected = np.array([th.expected_polysemantic(n, int(m)) for m in sweep.hiddens])
    return Persistence(
        expected=expected,
        share=(sweep.counts > 0).mean(1),
        represented=np.array([th.representing(W).any(-1).double().mean().item() for W in sweep.W]),
        observed_last=int(sweep.counts[-1].sum()),
        expected_last=expected[-1] * sweep.counts.shape[1],
    )


@dataclass(frozen=True)
class WinnerStatistics:
    """Where each feature's winning coordinate ranked at the start, and how often pairs collide."""

    rank_counts: np.ndarray  # (hidden,) features whose winner ranked 1, 2, ..., m at the start
    largest_wins: float  # share of features whose winner was their largest at the start
    largest_collide: float  # share of pairs whose largest initial coordinates coincide
    opposite_given_collide: float  # share of those with opposite signs
    winners_collide: float  # share of pairs whose winners coincide
    hidden: int  # m
    features: int  # n


def winner_statistics(initial, final):
    """Footnote 6 and the collision counts behind 1/(2m), for one size.

    initial, final: (seeds, n, m). Each feature's winner is its largest |W_ik| at the end; its
    rank is that coordinate's place at initialisation (1 = largest). Returns the rank counts
    (m,), the fraction of pairs whose initial largest coordinates coincide, the fraction of
    those with opposite signs, and the fraction of pairs whose winners coincide."""
    initial, final = torch.as_tensor(initial), torch.as_tensor(final)
    seeds, n, m = initial.shape
    winner = final.abs().argmax(-1)
    start = initial.abs()
    rank = (start > start.gather(-1, winner[..., None])).sum(-1) + 1
    largest = start.argmax(-1)
    collide = _pairs_sharing(largest)
    sign = initial.gather(-1, largest[..., None])[..., 0].sign()
    opposite = collide & (sign[:, :, None] != sign[:, None, :])
    pairs = seeds * n * (n - 1) / 2
    return WinnerStatistics(
        rank_counts=torch.bincount(rank.flatten() - 1, minlength=m).numpy(),
        largest_wins=(rank == 1).double().mean().item(),
        largest_collide=collide.sum().item() / pairs,
        opposite_given_collide=opposite.sum().item() / max(collide.sum().item(), 1),
        winners_collide=_pairs_sharing(winner).sum().item() / pairs,
        hidden=m,
        features=n,
    )


def sweep_winner_statistics(sweep):
    """``winner_statistics`` for every m of a Figure 3 sweep."""
    return [
        winner_statistics(initial_weights(sweep.features, int(m), sweep.seeds.tolist()), W)
        for m, W in zip(sweep.hiddens, sweep.W)
    ]


@dataclass(frozen=True)
class PooledCollisions:
    """Collisions of largest initial coordinates pooled over sizes, and the final winners'."""

    observed: float  # collisions observed, all sizes
    expected: float  # collisions expected, Σ pairs/m
    opposite: float  # share of the observed with opposite signs
    winners: np.ndarray  # (sizes,) final winners' coincidence rate in units of 1/(2m)


def pooled_collisions(statistics, seeds):
    """Pool ``winner_statistics`` of several sizes, each over ``seeds`` models: the collisions
    of largest initial coordinates observed and expected (Σ pairs/m), the share of them with
    opposite signs, and per size the final winners' coincidence rate in units of 1/(2m)."""
    pairs = np.array([s.features * (s.features - 1) / 2 * seeds for s in statistics])
    hidden = np.array([s.hidden for s in statistics])
    collide = np.array([s.largest_collide for s in statistics]) * pairs
    opposite = np.array([s.opposite_given_collide for s in statistics]) * collide
    return PooledCollisions(
        observed=collide.sum(),
        expected=(pairs / hidden).sum(),
        opposite=opposite.sum() / collide.sum(),
        winners=np.array([s.winners_collide for s in statistics]) * 2 * hidden,
    )


# --- where moving winners land: the shortfall of benign collisions -----------------------------

EMPTY, BESIDE, SAME, BOTH = range(4)  # a neuron, as seen by a feature of a given sign


def _winners_on(winner, positive, hidden):
    """How many winners of each sign sit on each neuron: (..., hidden, 2), [..., 0] positive,
    for winner (..., n) the neuron each feature's largest weight is on and positive (..., n)
    whether that weight is positive."""
    counts = torch.zeros(*winner.shape[:-1], hidden * 2, dtype=torch.int64)
    slot = winner * 2 + (~positive).long()  # neuron k's positive winners at 2k, negative 2k+1
    counts.scatter_add_(-1, slot, torch.ones_like(slot))
    return counts.unflatten(-1, (hidden, 2))


def _neighbourhood(occupancy, positive):
    """For features of sign ``positive`` (..., n, 1 or m), the class of every neuron from the
    winners of other features on it, occupancy (..., n, m, 2) by sign: EMPTY (none), BESIDE (of
    the opposite sign only), SAME (of the same sign only) or BOTH."""
    same = torch.where(positive, occupancy[..., 0], occupancy[..., 1]) > 0
    opposite = torch.where(positive, occupancy[..., 1], occupancy[..., 0]) > 0
    return torch.where(
        same, torch.where(opposite, BOTH, SAME), torch.where(opposite, BESIDE, EMPTY)
    )


@dataclass(frozen=True)
class Landings:
    """Where features land on the neuron they end on, against neurons drawn uniformly; the
    per-seed counts behind it, from which any subset of seeds gives the same statistics."""

    observed: np.ndarray  # (seeds, 4) last landings on EMPTY, BESIDE, SAME and BOTH neurons
    expected: np.ndarray  # (seeds, 4) the same had each landed on a neuron drawn uniformly
    pairs: np.ndarray  # (seeds,) pairs of features whose final winners coincide
    moved: float  # share of features whose final neuron is not the one they started on
    features: int  # n
    hidden: int  # m

    def subset(self, keep):
        """The same landings over the seeds ``keep`` (a boolean mask or indices) only."""
        return replace(
            self, observed=self.observed[keep], expected=self.expected[keep], pairs=self.pairs[keep]
        )

    @property
    def preference(self):
        """ρ: per neuron, the rate of landing BESIDE over the rate on EMPTY."""
        observed, expected = self.observed.sum(0), self.expected.sum(0)
        return (observed[BESIDE] / expected[BESIDE]) / (observed[EMPTY] / expected[EMPTY])

    @property
    def preference_se(self):
        """The standard error of log ρ, the landings taken as Poisson counts."""
        observed = self.observed.sum(0)
        return np.sqrt(1 / observed[BESIDE] + 1 / observed[EMPTY])

    @property
    def predicted(self):
        """The final rate, in units of 1/(2m), that the landings predict: BESIDE landings
        over those that would be made were EMPTY and BESIDE neurons taken alike per neuron,
        ρ (X_E + X_B) / (X_E + ρ X_B) with X the neurons' shares."""
        observed, expected = self.observed.sum(0), self.expected.sum(0)
        alike = (observed[EMPTY] + observed[BESIDE]) * expected[BESIDE]
        return observed[BESIDE] * (expected[EMPTY] + expected[BESIDE]) / alike

    @property
    def rate(self):
        """Final winners coinciding, in units of 1/(2m)."""
        seeds, n = len(self.pairs), self.features
        return self.pairs.sum() / (seeds * n * (n - 1) / 2) * 2 * self.hidden

    def jackknife(self, name):
        """The standard error of the statistic ``name`` (one of the properties) by the
        jackknife over seeds."""
        count = len(self.pairs)
        return _jackknife([getattr(self.subset(np.arange(count) != k), name) for k in range(count)])


def _jackknife(leave_one_out):
    """The jackknife standard error from a statistic's values with each seed left out."""
    values = np.asarray(leave_one_out, dtype=float)
    if len(values) < 2:
        raise ValueError("a jackknife needs at least two seeds")
    return np.sqrt((len(values) - 1) / len(values) * ((values - values.mean()) ** 2).sum())


def landings(paths):
    """Where each feature landed for the last time, seen from the record before: on a neuron
    holding no other winner (EMPTY), beside winners of the opposite sign only (BESIDE: a
    benign collision forms), or beside one of its own sign (SAME, BOTH), each seen with the
    feature's final sign, against neurons drawn uniformly (not the one it left). If features
    took EMPTY and BESIDE neurons alike, the winners of opposite signs would sit independently
    and coincide at 1/(2m), as the count assumes (``Landings.predicted``)."""
    winner, positive = torch.as_tensor(paths.winner), torch.as_tensor(paths.positive).bool()
    records, seeds, n = winner.shape
    final = winner[-1]  # (seeds, n)
    # the first record from which each feature sits on its final neuron for good
    settled = (winner == final).flip(0).long().cumprod(0).flip(0)  # (records, seeds, n)
    arrival = records - settled.sum(0)  # (seeds, n); 0: it never left its final neuron
    before = (arrival - 1).clamp(min=0)
    feature = torch.arange(n)
    observed, expected = torch.zeros(seeds, 4), torch.zeros(seeds, 4)
    for seed in range(seeds):  # one model at a time: (n, m) per feature, not (seeds, n, m)
        late = arrival[seed] > 0
        then = before[seed]
        # the winners on every neuron at the record before each landing, itself left out:
        # (n, m, 2)
        seen = _winners_on(winner[then, seed], positive[then, seed], paths.hidden)
        own = winner[then, seed, feature]
        seen[feature, own, (~positive[then, seed, feature]).long()] -= 1
        where = _neighbourhood(seen, positive[-1, seed][:, None])  # (n, m)
        landed = where.gather(-1, final[seed][:, None])[:, 0][late]
        observed[seed] = torch.bincount(landed, minlength=4)
        where[feature, own] = 4  # the neuron a feature leaves is not one it lands on
        for kind in range(4):
            expected[seed, kind] = (where[late] == kind).sum() / (paths.hidden - 1)
    total = observed.sum(0)
    if total[EMPTY] == 0 or total[BESIDE] == 0:
        raise ValueError(
            f"too few landings to compare: {total[EMPTY]:.0f} on empty neurons and "
            f"{total[BESIDE]:.0f} beside a winner of the opposite sign; train more seeds"
        )
    return Landings(
        observed=observed.numpy(),
        expected=expected.numpy(),
        pairs=_pairs_sharing(final).sum((-2, -1)).numpy(),
        moved=(final != winner[0]).double().mean().item(),
        features=n,
        hidden=paths.hidden,
    )


def landing_gap(results):
    """The mean over sizes of the final rate minus the rate the landings predict, and its
    standard error by the jackknife over seeds (each size's runs share the seeds, and a
    size's rate and prediction come from the same landings, so they err together)."""
    seeds = {len(result.pairs) for result in results}
    if len(seeds) != 1 or seeds.pop() < 2:
        raise ValueError("the sizes' landings must hold as many seeds, the same, at least two")

    def gap(keep):
        return np.mean([r.subset(keep).rate - r.subset(keep).predicted for r in results])

    count = len(results[0].pairs)
    every = np.ones(count, dtype=bool)
    return gap(every), _jackknife([gap(np.arange(count) != k) for k in range(count)])


@cached
def explorer_runs(features, hiddens, l1s, seed, *, steps, lr):
    """One model per (m, λ) from the same seed, trained as in Figure 3: {(m, λ): W (n, m)}."""
    runs = {}
    for hidden in hiddens:
        model = TiedBasisAutoencoder(features, hidden, [seed] * len(l1s), l1s)
        _, W = _train(
            model, steps=steps, lr=lr, optimizer="adamw", records=2, desc=f"explorer m={hidden}"
        )
        runs.update({(hidden, l1): w for l1, w in zip(l1s, W)})
    return runs


def train_one(features, hidden, l1, steps, seed=0, lr=1e-3):
    """One small model trained as in Figure 3, for the live explorer: W (n, m)."""
    model = TiedBasisAutoencoder(features, hidden, [seed], l1)
    return _train(
        model,
        steps=steps,
        lr=lr,
        optimizer="adamw",
        records=2,
        desc=f"n={features} m={hidden} λ={l1}",
    )[1][0]


def keep_shared(runs, kind):
    """Per seed of ``collision_runs``: how many of the two features end on the shared neuron
    (|weight| in [0.8, 1.2]). kind: "benign" or "malign"."""
    return th.representing(runs.shared[kind][-1]).sum(-1).numpy()


def start_ratios(runs, kind="malign"):
    """Per seed of ``collision_runs``: the smaller of the two shared weights over the larger, in
    size, at the start (1: a tie). (seeds,)"""
    start = torch.as_tensor(runs.shared[kind][0]).abs()  # (seeds, 2)
    return (start.min(-1).values / start.max(-1).values).numpy()


def closer_to_a_tie(ratios, some, others):
    """How surely the seeds ``some`` (a boolean mask over ``ratios``, from ``start_ratios``)
    start closer to a tie than the seeds ``others``: the one-sided Mann-Whitney p that their
    ratios are larger; 1 (no evidence) where either group is empty."""
    ratios, some, others = np.asarray(ratios), np.asarray(some), np.asarray(others)
    for name, mask in (("some", some), ("others", others)):
        if mask.dtype != bool or mask.shape != ratios.shape:
            raise ValueError(
                f"{name} must be a boolean mask of the ratios' shape {ratios.shape}; "
                f"got {mask.dtype} of shape {mask.shape}"
            )
    if not (some.any() and others.any()):
        return 1.0
    return float(stats.mannwhitneyu(ratios[some], ratios[others], alternative="greater").pvalue)


def malign_keepers(runs):
    """For the malign starts of ``collision_runs`` where exactly one of the two features keeps
    the shared neuron: whether it is the one whose shared weight started larger in size. The
    pressures -W_ik W_jk² and -W_ik² W_jk favour the larger once the two rows share only that
    coordinate; at the start the rest of each row still moves both weights, so the start's order
    need not be the one that counts. bool (seeds with one keeper,)."""
    shared = torch.as_tensor(runs.shared["malign"])  # (records, seeds, 2); record 0 is the start
    keeps = th.representing(shared[-1])  # (seeds, 2)
    one = keeps.sum(-1) == 1
    return (keeps[one].int().argmax(-1) == shared[0, one].abs().argmax(-1)).numpy()
