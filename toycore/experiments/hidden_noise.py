"""Chapter 4 experiments: sparsity from noise in the hidden layer.

The tied model with hidden noise, ``TiedBasisAutoencoder(noise=..., sigma=...)``, trains every
combination of noise law, σ and seed as instances of one batched run, with plain SGD as in the
authors' code. Figure 5's two sides are shards (``toycore.shards``). Appendix C's one-step
expansion is checked by Monte Carlo on a single encoding, on the host (its least-squares
control variates use a solver only the CPU has). Runs that take long are ``@cached``.
"""

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from .. import shards
from ..cache import cached
from ..checks import check_choice, check_range, check_seeds, check_size
from ..devices import to_host
from ..models import TiedBasisAutoencoder, tied_basis_reference_loss
from ..noise import STANDARD_MOMENTS, check_noise, standard_noise
from ..profiles import select
from ..seeding import generator
from ..sizes import HIDDEN_NOISE
from ..theory import hidden_noise as th
from ..theory.polysemantic import count_polysemantic
from ..train import make_optimizer, record_steps, train
from ..words import course

DTYPE = torch.float64
# Figure 5's growth with magnitude: the largest fall of the final mean ‖W_i‖₄⁴ from one λ or σ
# to the next larger that still reads as growth (ours)
GROWTH_TOLERANCE = 0.02
METRICS = {
    "fourth": lambda model: th.fourth_norms(model.W),
    "squared": lambda model: th.squared_norms(model.W),
}


def sizes(profile=None):
    """This chapter's sizes in ``profile`` (default: ``$TOYCORE_PROFILE``, else ``cpu``), from
    ``toycore.sizes.HIDDEN_NOISE``, as nested attributes."""
    return select(profile, **HIDDEN_NOISE)


def _run(model, *, steps, lr, records, desc):
    """SGD; the per-encoding fourth and squared norms at log-spaced steps and the final W."""
    history = train(
        model,
        None,
        steps=steps,
        lr=lr,
        optimizer="sgd",
        record_at=record_steps(steps, records),
        metrics=METRICS,
        desc=desc,
    )
    return (
        history.steps,
        history.metrics["fourth"].astype(float),
        history.metrics["squared"].astype(float),
        to_host(model.W.to(DTYPE)),
    )


# Past Figure 5's noise grid: a σ at which the authors' SGD diverges, tried on these seeds for
# at most this many steps (section 2 says why the grid stops short of it).
DIVERGING_SIGMA, DIVERGING_SEEDS, DIVERGING_STEPS = 0.7, range(8), 200


def diverging_words(first, steps):
    """``steps_to_diverge``'s result as a clause the prose can quote."""
    diverged = first[first >= 0]
    if diverged.size == 0:
        return f"training stayed finite in every seed for {steps} steps"
    if diverged.size == first.size:
        return f"training diverged in every seed within {max(diverged.max(), 1)} steps"
    return f"training diverged in {diverged.size} of {first.size} seeds within {steps} steps"


def steps_to_diverge(features, hidden, sigma, seeds, *, steps, lr):
    """Under bipolar noise of strength ``sigma``, SGD at ``lr`` from each seed's start: the
    number of steps after which each seed's loss is first not finite, or -1 where it stays
    finite for ``steps`` steps: (seeds,). Why the strength grids stop short of such a σ."""
    seeds = list(check_seeds(seeds))
    model = TiedBasisAutoencoder(features, hidden, seeds, noise="bipolar", sigma=sigma)
    optim = make_optimizer("sgd", model.parameters(), lr)
    first = np.full(len(seeds), -1)
    for step in range(steps):
        optim.zero_grad(set_to_none=True)
        loss = model.loss_and_grad().detach().cpu().numpy()  # (seeds,)
        first[(first < 0) & ~np.isfinite(loss)] = step
        if (first >= 0).all():
            break
        optim.step()
    return first


@dataclass(frozen=True)
class NoiseRuns:
    """Figure 4: every (law, σ, seed) trained side by side, its norms over time and final W."""

    kinds: list[str]  # (laws,) the noise laws, checked names
    sigmas: np.ndarray  # (sigmas,) the noise strengths σ
    seeds: np.ndarray  # (seeds,)
    hidden: int  # m, the hidden width
    lr: float  # the SGD learning rate
    steps: np.ndarray  # (records,) the recorded steps
    fourth: np.ndarray  # (records, laws, sigmas, seeds, features) ‖W_i‖₄⁴
    squared: np.ndarray  # (records, laws, sigmas, seeds, features) ‖W_i‖₂²
    W: np.ndarray  # (laws, sigmas, seeds, features, hidden) the final weights


@cached
def noise_runs(features, hidden, kinds, sigmas, seeds, *, steps, lr, records=120):
    """Figure 4 and the laws beyond the text: every (law, σ, seed) trained side by side.

    fourth, squared: (records, laws, σs, seeds, features); W: (laws, σs, seeds, n, m)."""
    seeds = check_seeds(seeds)
    kinds = [check_noise(k) for k in kinds]
    grid = list(itertools.product(kinds, sigmas, seeds))
    model = TiedBasisAutoencoder(
        features,
        hidden,
        [s for *_, s in grid],
        noise=[k for k, *_ in grid],
        sigma=[g for _, g, _ in grid],
    )
    steps_at, fourth, squared, W = _run(
        model, steps=steps, lr=lr, records=records, desc=f"{len(grid)} noisy models"
    )
    shape = (len(kinds), len(sigmas), len(seeds))
    return NoiseRuns(
        kinds=kinds,
        sigmas=np.array(sigmas),
        seeds=np.array(seeds),
        hidden=hidden,
        lr=lr,
        steps=steps_at,
        fourth=fourth.reshape(len(steps_at), *shape, features),
        squared=squared.reshape(len(steps_at), *shape, features),
        W=W.reshape(*shape, features, hidden),
    )


SIDES = ("l1", "noise")


@dataclass(frozen=True)
class StrengthSide:
    """One side of Figure 5 (l1 at each λ, or bipolar noise at each σ): norms over time, final W."""

    values: np.ndarray  # (values,) the λs or σs of this side
    steps: np.ndarray  # (records,) the recorded steps
    fourth: np.ndarray  # (records, values, seeds, features) ‖W_i‖₄⁴
    squared: np.ndarray  # (records, values, seeds, features) ‖W_i‖₂²
    W: np.ndarray  # (values, seeds, features, hidden) the final weights


@cached
def strength_side(features, hidden, values, seeds, *, side, steps, lr, records=120):
    """One shard of Figure 5: l1 without noise at each λ in ``values`` (side "l1"), or bipolar
    noise without l1 at each σ (side "noise"), every (value, seed) an instance of one run.

    Returns the recorded steps, fourth and squared (records, values, seeds, features) and the
    final W (values, seeds, n, m)."""
    check_choice("side", side, SIDES)
    per_instance = [value for value in values for _ in seeds]
    options = dict(l1=per_instance) if side == "l1" else dict(noise="bipolar", sigma=per_instance)
    model = TiedBasisAutoencoder(features, hidden, list(seeds) * len(values), **options)
    steps_at, fourth, squared, W = _run(
        model, steps=steps, lr=lr, records=records, desc=f"{len(per_instance)} models over {side}"
    )
    shape = (len(values), len(seeds))
    return StrengthSide(
        values=np.array(values),
        steps=steps_at,
        fourth=fourth.reshape(-1, *shape, features),
        squared=squared.reshape(-1, *shape, features),
        W=W.reshape(*shape, features, hidden),
    )


@dataclass(frozen=True)
class StrengthSweep:
    """Figure 5: the l1 side and the noise side, trained for the same steps from the same seeds."""

    steps: np.ndarray  # (records,) the recorded steps, the same on both sides
    seeds: np.ndarray  # (seeds,)
    hidden: int  # m, the hidden width
    lr: float  # the SGD learning rate
    l1: StrengthSide  # l1 without noise at each λ
    noise: StrengthSide  # bipolar noise without l1 at each σ


def strength_sweep(features, hidden, l1s, sigmas, seeds, *, steps, lr, records=120):
    """Figure 5: l1 without noise at each λ, and bipolar noise without l1 at each σ, same steps;
    each side one shard (``strength_side``), run through ``toycore.shards``.

    Returns one ``StrengthSide`` per side ("l1", "noise") with fourth and squared (records,
    values, seeds, features) and the final W (values, seeds, n, m)."""
    # the shards' own checks would run only once the sweep has started: check here first
    seeds, features = list(check_seeds(seeds)), check_size("features", features)
    check_size("hidden", hidden, minimum=features)
    check_range("l1s", l1s, 0)
    check_range("sigmas", sigmas, 0)
    check_size("steps", steps)
    check_range("lr", lr, 0, low_open=True)
    options = dict(steps=steps, lr=lr, records=records)
    l1, noise = shards.run(
        strength_side,
        [
            ((features, hidden, list(l1s), seeds), dict(side="l1", **options)),
            ((features, hidden, list(sigmas), seeds), dict(side="noise", **options)),
        ],
        "Figure 5",
    )
    return StrengthSweep(
        steps=l1.steps, seeds=np.array(seeds), hidden=hidden, lr=lr, l1=l1, noise=noise
    )


@dataclass(frozen=True)
class SingleRuns:
    """Figure 6: one instance (one seed) under bipolar noise at each σ, its norms over time."""

    sigmas: np.ndarray  # (sigmas,) the noise strengths σ
    seed: int  # the one seed, the same at every σ
    steps: np.ndarray  # (records,) the recorded steps
    fourth: np.ndarray  # (records, sigmas, features) ‖W_i‖₄⁴
    squared: np.ndarray  # (records, sigmas, features) ‖W_i‖₂²
    W: np.ndarray  # (sigmas, features, hidden) the final weights
    lr: float  # the SGD learning rate


@cached
def single_runs(features, hidden, sigmas, seed, *, steps, lr, records=300):
    """Figure 6: one instance (one seed) under bipolar noise at each σ: each encoding's fourth
    norm over time, (records, σs, features), and the final W, (σs, n, m)."""
    model = TiedBasisAutoencoder(
        features, hidden, [seed] * len(sigmas), noise="bipolar", sigma=sigmas
    )
    steps_at, fourth, squared, W = _run(
        model,
        steps=steps,
        lr=lr,
        records=records,
        desc=f"seed {seed}, σ = {', '.join(map(str, sigmas))}",
    )
    return SingleRuns(
        sigmas=np.array(sigmas),
        seed=seed,
        steps=steps_at,
        fourth=fourth,
        squared=squared,
        W=W,
        lr=lr,
    )


def time_to_level(steps, fourth, level):
    """The first recorded step at which the mean fourth norm reaches ``level``; NaN if never.

    fourth: (records, ...) averaged over every axis but the first."""
    mean = fourth.reshape(len(steps), -1).mean(-1)
    reached = np.flatnonzero(mean >= level)
    return float(steps[reached[0]]) if reached.size else np.nan


def late_wander(steps, fourth):
    """How far each encoding's ‖W_i‖₄⁴ wanders late in a run: its standard deviation over the
    recorded steps of the run's last half, median over seeds and encodings. Where the mean
    does not move (Gaussian noise), this is the oscillation of Figure 4.

    steps: (records,); fourth: (records, seeds, encodings) -> a float."""
    late = steps >= steps[-1] / 2
    return float(np.median(fourth[late].std(0)))


def wander_words(sigmas, wanders):
    """The late wander per σ (``late_wander``), as a clause the prose can quote."""
    rises = course(wanders) == 1
    return ("grows with σ" if rises else "does not grow with σ at every step") + (
        " (" + ", ".join(f"{w:.3f} at σ = {s:g}" for s, w in zip(sigmas, wanders)) + ")"
    )


def side_times(steps, side, level):
    """Per λ or σ of a side of the strength sweep, the steps until its mean ‖W_i‖₄⁴ reaches
    ``level``, NaN if never: (values,)."""
    return np.array(
        [time_to_level(steps, side.fourth[:, k], level) for k in range(len(side.values))]
    )


def power_law(x, y):
    """The fit y = c x^k through the finite points: (k, c)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(y) & (y > 0)
    if ok.sum() < 2:
        raise ValueError("a power law needs at least two finite positive points")
    k, log_c = np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)
    return k, np.exp(log_c)


def _exponent(values, times):
    """k in time ∝ value^-k between two values: values (2,), times (2, ...) -> (...)."""
    return -np.log(times[1] / times[0]) / np.log(values[1] / values[0])


def local_exponent(values, times):
    """k in time ∝ value^-k between the two smallest values whose time is finite: the slope of
    the time on a log-log scale where the push is weakest. values ascending, (values,)."""
    reached = np.flatnonzero(np.isfinite(times))
    if reached.size < 2:
        raise ValueError("a local exponent needs two values that reach the level")
    return float(_exponent(np.asarray(values)[reached[:2]], np.asarray(times)[reached[:2]]))


@dataclass(frozen=True)
class RateExponents:
    """How the time to sparsify grows as each side's push weakens, in Figure 5's runs."""

    level: float  # the mean ‖W_i‖₄⁴ both sides must reach
    l1s: np.ndarray  # (l1s,) the λs of the l1 side
    l1_steps: np.ndarray  # (l1s,) steps to the level; NaN: never within the run
    sigmas: np.ndarray  # (sigmas,) the σs of the noise side
    sigma_steps: np.ndarray  # (sigmas,) steps to the level; NaN: never within the run
    l1_exponent: float  # k in steps ∝ λ^-k between the two smallest λ that reach the level
    sigma_exponent: float  # k in steps ∝ σ^-k between the two smallest σ that reach the level
    l1_seed_exponents: np.ndarray  # (seeds,) l1_exponent from each seed alone, same two λ
    l1_resolution: float  # how far the record grid alone can move l1_exponent


def rate_exponents(sweep, level):
    """Steps until the mean ‖W_i‖₄⁴ reaches ``level`` at each λ and σ of the strength sweep, and
    on each side the local exponent k (steps ∝ value^-k) where the push is weakest; on the l1
    side also each seed's own k between the same two λ (NaN where a seed misses the level), and
    the exponent's resolution: a crossing lies between two records, so each time is known only
    to a factor of the record grid's step there."""
    l1_steps = side_times(sweep.steps, sweep.l1, level)
    sigma_steps = side_times(sweep.steps, sweep.noise, level)
    l1_exponent = local_exponent(sweep.l1.values, l1_steps)  # refuses fewer than two λ
    pair = np.flatnonzero(np.isfinite(l1_steps))[:2]  # the two smallest λ that reach the level
    values = sweep.l1.values[pair]
    seed_steps = np.array(  # (seeds, 2)
        [
            [time_to_level(sweep.steps, sweep.l1.fourth[:, k, s], level) for k in pair]
            for s in range(sweep.l1.fourth.shape[2])
        ]
    )
    seed_exponents = _exponent(values, seed_steps.T)
    # the record step at each crossing, as a log-ratio (2,); unbounded at the first record
    at = np.searchsorted(sweep.steps, l1_steps[pair])
    before = sweep.steps[np.maximum(at - 1, 0)]
    grid = np.where(before > 0, np.log(sweep.steps[at] / np.maximum(before, 1)), np.inf)
    return RateExponents(
        level=level,
        l1s=sweep.l1.values,
        l1_steps=l1_steps,
        sigmas=sweep.noise.values,
        sigma_steps=sigma_steps,
        l1_exponent=l1_exponent,
        sigma_exponent=local_exponent(sweep.noise.values, sigma_steps),
        l1_seed_exponents=seed_exponents,
        l1_resolution=float(grid.sum() / np.log(values[1] / values[0])),
    )


@dataclass(frozen=True)
class NoiseTimeLaw:
    """How the steps to sparsify grow as σ shrinks: per σ, a fitted power law, its extrapolation."""

    sigmas: np.ndarray  # (sigmas,) the noise side's σs up to ``largest``
    steps_to: np.ndarray  # (sigmas,) steps until the mean ‖W_i‖₄⁴ reaches the level; NaN: never
    reached: np.ndarray  # (sigmas,) bool, whether the level was reached
    exponent: float  # k in steps = c σ^k, fitted where reached
    constant: float  # c in steps = c σ^k
    smallest: float  # the smallest σ that reached the level
    at_target: float  # the steps σ⁻⁴ predicts at ``target`` from ``smallest``


def noise_time_law(sweep, level, largest=0.2, target=0.01):
    """How the steps needed to reach mean ‖W_i‖₄⁴ >= ``level`` grow as σ shrinks, on the noise
    side of the strength sweep, σ up to ``largest``: per σ the steps (NaN if never reached), a
    power law fitted where reached, and the steps that σ⁻⁴ (the mildest growth the push allows)
    predicts at ``target`` from the smallest σ that reached the level."""
    noise = sweep.noise
    kept = noise.values <= largest
    sigmas = noise.values[kept].astype(float)
    steps_to = side_times(sweep.steps, noise, level)[kept]
    reached = np.isfinite(steps_to)
    exponent, constant = power_law(sigmas[reached], steps_to[reached])
    smallest = sigmas[reached][0]
    return NoiseTimeLaw(
        sigmas=sigmas,
        steps_to=steps_to,
        reached=reached,
        exponent=exponent,
        constant=constant,
        smallest=smallest,
        at_target=steps_to[reached][0] * (smallest / target) ** 4,
    )


def final_mean(side, value, quantity):
    """The mean over seeds and encodings of ``quantity`` (records, values, seeds, features) at
    its last record, at one λ or σ of a side of the strength sweep."""
    return float(quantity[-1, list(side.values).index(value)].mean())


def final_means(side, quantity):
    """``final_mean`` at every λ or σ of a side, smallest value first: (values,)."""
    return np.array([final_mean(side, value, quantity) for value in side.values])


def rise_after_peak(side):
    """The largest rise of the final mean ‖W_i‖₄⁴ from one λ or σ of a side to the next larger,
    past the side's peak (its largest final mean): 0 when past the peak the side only falls."""
    final = final_means(side, side.fourth)
    return float(max(np.diff(final[final.argmax() :]).max(initial=0.0), 0.0))


def sparsifying_range(side, baseline, low=0.1, high=0.9):
    """Where a side of the strength sweep starts to sparsify: of the rise of the final mean
    ‖W_i‖₄⁴ from ``baseline`` (a random unit vector's) to its peak, the last λ or σ still under
    ``low`` of it before the first over ``high`` (the smallest value if none is under ``low``):
    (low value, high value)."""
    final = final_means(side, side.fourth)
    part = (final - baseline) / (final.max() - baseline)  # (values,) 0 at baseline, 1 at peak
    first_high = np.flatnonzero(part >= high)[0]
    under = np.flatnonzero(part[:first_high] <= low)
    return side.values[under[-1] if under.size else 0], side.values[first_high]


def normalised_fourth(side):
    """‖W_i‖₄⁴ / ‖W_i‖₂⁴, shaped like ``side.fourth``: 1 for an encoding on one neuron whatever
    its length, so that it changes with the encoding's shape and not with its length."""
    return side.fourth / np.maximum(side.squared, 1e-12) ** 2


@dataclass(frozen=True)
class StrengthReadings:
    """The λs and σs at which Figure 5's statements are read, and the peak they are read against."""

    below: float  # the largest λ below the collapse threshold 8/(3√3)
    collapsed: float  # the smallest λ above it
    top: float  # the largest σ
    peak: float  # the peak over σ of the final normalised fourth norm, mean over seeds, features


def strength_readings(sweep):
    """Where Figure 5's statements are read: the largest λ below the collapse threshold
    8/(3√3) and the smallest above it, the largest σ, and the peak over σ of the final
    normalised fourth norm."""
    l1, noise = sweep.l1, sweep.noise
    return StrengthReadings(
        below=l1.values[l1.values < th.l1_collapse()].max(),
        collapsed=l1.values[l1.values > th.l1_collapse()].min(),
        top=noise.values.max(),
        peak=max(final_mean(noise, s, normalised_fourth(noise)) for s in noise.values),
    )


@dataclass(frozen=True)
class CompromisingEncoding:
    """One encoding stuck between the neurons the others own (Figure 6)."""

    encoding: int  # its index i in W
    fourth: float  # its ‖W_i‖₄⁴
    columns: list[int]  # (shared,) the owned neurons j where it opposes the owner's sign
    spread: float  # max/min |W_ij| over those columns
    significant: list[int]  # (significant,) every neuron j, owned or not, with |W_ij| >= share


# A weight that counts as holding a neuron: Figure 6's compromise and the ℓ1 side's single neurons.
SIGNIFICANT = 0.1


def single_neuron_share(Ws, share=SIGNIFICANT):
    """The share of encodings, over models ``Ws`` (each (n, m)), whose weights of at least
    ``share`` in size all lie in one neuron."""
    return float(np.mean([(np.abs(np.asarray(W)) >= share).sum(-1) == 1 for W in Ws]))


def compromising_encodings(W, level=0.2, owner=0.5, share=SIGNIFICANT):
    """Figure 6's stuck encodings, found automatically.

    An encoding W_i compromises when its fourth norm stays below ``level`` and in every
    coordinate that another encoding owns (|W_i'j| >= ``owner``) it holds a weight of at least
    ``share`` with the sign opposite to the owner's. W: (n, m). Returns one record per such
    encoding: its index, fourth norm, the owned coordinates it shares, and the spread of its
    shares (max/min |weight| over them; the text: "comparable absolute values"), and every neuron
    in which it holds at least ``share``, whoever owns it."""
    W = np.asarray(W)
    owners = np.abs(W).argmax(0)
    owned = np.abs(W).max(0) >= owner
    found = []
    for i, f4 in enumerate(th.fourth_norms(W)):
        if f4 >= level:
            continue
        columns = [
            int(j)
            for j in np.flatnonzero(owned)
            if owners[j] != i
            and abs(W[i, j]) >= share
            and np.sign(W[i, j]) != np.sign(W[owners[j], j])
        ]
        others = int((owned & (owners != i)).sum())
        if columns and len(columns) == others:
            sizes = np.abs(W[i, columns])
            found.append(
                CompromisingEncoding(
                    encoding=i,
                    fourth=float(f4),
                    columns=columns,
                    spread=float(sizes.max() / sizes.min()),
                    significant=[int(j) for j in np.flatnonzero(np.abs(W[i]) >= share)],
                )
            )
    return found


def opposing_weights(W, owner=0.5, small=0.01):
    """Figure 6's smaller weights: in each neuron j that an encoding owns (|W_ij| >= ``owner``),
    the share of the other encodings i' whose weight opposes the owner's sign by at least
    ``small`` (W_i'j sign(W_ij) <= -small). W: (n, m). Returns (share, pairs counted)."""
    W = np.asarray(W)
    owners = np.abs(W).argmax(0)
    owned = np.flatnonzero(np.abs(W).max(0) >= owner)
    # (n, owned) each weight against its column's owner's sign; the owners themselves left out
    against = W[:, owned] * np.sign(W[owners[owned], owned])
    others = np.arange(len(W))[:, None] != owners[owned][None, :]
    return float((against[others] <= -small).mean()), int(others.sum())


# --- appendix C: the loss one SGD step later, by Monte Carlo ----------------------------------


def next_step_loss(encoding, kind, sigma, lr, samples, seed):
    """E over ξ of the expected loss on e_1 after one SGD step of the one-feature model from
    W = ``encoding`` (unit norm), with step noise ξ; the next step's noise ξ' is integrated
    exactly: E_ξ' (|W'|² - 1 + W'·ξ')² = (|W'|² - 1)² + σ²|W'|² while the ReLU stays on.

    The gradient is the model's own (autograd through ``tied_basis_reference_loss``). Control
    variates with known means (W·ξ, (W·ξ)², (W·ξ)³, |ξ|², (W·ξ)|ξ|², (W·ξ)²|ξ|²) remove the
    rotationally symmetric fluctuations, which are ~100x the kurtosis term at small η.
    Returns (estimate, standard error)."""
    kind = check_noise(kind)
    check_size("samples", samples, minimum=100)
    encoding = torch.as_tensor(encoding, dtype=DTYPE)
    hidden = encoding.numel()
    if abs(float(encoding.square().sum()) - 1) > 1e-9:
        raise ValueError("encoding must have unit norm")
    xi = standard_noise(kind, (samples, hidden), generator(seed, "monte-carlo"), DTYPE) * sigma
    W = encoding.expand(samples, 1, hidden).clone().requires_grad_()
    tied_basis_reference_loss(W, 0.0, xi).sum().backward()
    stepped = (W - lr * W.grad).detach()[:, 0]
    squared = stepped.square().sum(-1)
    loss = (squared - 1) ** 2 + sigma**2 * squared
    a, norm = xi @ encoding, xi.square().sum(-1)
    fourth = STANDARD_MOMENTS[kind][0] * sigma**4
    controls = torch.stack(
        [
            a,
            a**2 - sigma**2,
            a**3,
            norm - hidden * sigma**2,
            a * norm,
            a**2 * norm - (fourth + (hidden - 1) * sigma**4),
        ],
        1,
    )
    centred = controls - controls.mean(0)
    # bipolar noise has |ξ|² = mσ² exactly, so some controls are constant or repeat others:
    # scale each to unit spread and let a rank-revealing solver drop what is degenerate
    spread = centred.std(0).clamp(min=torch.finfo(DTYPE).tiny)
    beta = (
        torch.linalg.lstsq(
            centred / spread, (loss - loss.mean())[:, None], rcond=1e-9, driver="gelsd"
        ).solution[:, 0]
        / spread
    )
    adjusted = loss - controls @ beta
    return float(adjusted.mean()), float(adjusted.std() / samples**0.5)


def sparse_and_dense(hidden):
    """Two unit encodings with fourth norms 1 and 1/m: e_1 and (1, ..., 1)/√m."""
    sparse = torch.zeros(hidden, dtype=DTYPE)
    sparse[0] = 1
    return sparse, torch.full((hidden,), hidden**-0.5, dtype=DTYPE)


@dataclass(frozen=True)
class KurtosisCheck:
    """Appendix C by Monte Carlo: the sparse-minus-dense next-step loss, two predictions of it."""

    kinds: list[str]  # (laws,) the noise laws, checked names
    lrs: np.ndarray  # (lrs,) the learning rates η
    sigma: float  # the noise σ
    hidden: int  # m, the encodings' length
    measured: np.ndarray  # (laws, lrs) the Monte Carlo difference, sparse minus dense
    error: np.ndarray  # (laws, lrs) its standard error
    text: np.ndarray  # (laws, lrs) the text's leading term 16η²σ⁴Δ‖W‖₄⁴κ
    ours: np.ndarray  # (laws, lrs) with our η³ term


@cached
def kurtosis_check(hidden, kinds, sigma, lrs, samples, seed=0):
    """For each law and η: the next-step loss of the sparse minus the dense encoding, ± its
    standard error, and the text's and our predictions of that difference: (laws, ηs) arrays."""
    kinds = [check_noise(k) for k in kinds]  # every law checked before any sampling
    sparse, dense = sparse_and_dense(hidden)
    gap = 1 - 1 / hidden
    shape = (len(kinds), len(lrs))
    measured, error, text, ours = (np.zeros(shape) for _ in range(4))
    for (i, kind), (j, lr) in itertools.product(enumerate(kinds), enumerate(lrs)):
        (a, sa), (b, sb) = (
            next_step_loss(e, kind, sigma, lr, samples, seed + k)
            for k, e in enumerate((sparse, dense))
        )
        measured[i, j], error[i, j] = a - b, np.hypot(sa, sb)
        text[i, j] = th.sparsity_term(gap, kind, sigma, lr)
        ours[i, j] = th.sparsity_term(gap, kind, sigma, lr, hidden=hidden, order=3)
    return KurtosisCheck(
        kinds=list(kinds),
        lrs=np.array(lrs),
        sigma=sigma,
        hidden=hidden,
        measured=measured,
        error=error,
        text=text,
        ours=ours,
    )


@dataclass(frozen=True)
class SigmaPower:
    """The σ-dependence of appendix C's term: the sparse-minus-dense next-step loss at two σs."""

    kind: str  # the noise law
    sigmas: np.ndarray  # (2,) the two σs
    lr: float  # the learning rate η
    measured: np.ndarray  # (2,) the Monte Carlo difference, sparse minus dense
    error: np.ndarray  # (2,) its standard error
    exponent: float  # log(measured ratio) / log(σ ratio)
    exponent_error: float  # its standard error, from the two above


@cached
def sigma_power(hidden, kind, sigmas, lr, samples, seed=0):
    """The next-step loss of the sparse minus the dense encoding at two σs (``next_step_loss``)
    and the power of σ it grows with, ± its standard error."""
    kind = check_noise(kind)
    if len(sigmas) != 2:
        raise ValueError(f"sigma_power needs two σs; got {len(sigmas)}")
    measured, error = np.zeros(2), np.zeros(2)
    for i, sigma in enumerate(sigmas):
        (a, sa), (b, sb) = (
            next_step_loss(e, kind, sigma, lr, samples, seed + k)
            for k, e in enumerate(sparse_and_dense(hidden))
        )
        measured[i], error[i] = a - b, np.hypot(sa, sb)
    span = np.log(sigmas[1] / sigmas[0])
    return SigmaPower(
        kind=kind,
        sigmas=np.array(sigmas),
        lr=lr,
        measured=measured,
        error=error,
        exponent=float(np.log(measured[1] / measured[0]) / span),
        exponent_error=float(np.hypot(*(error / measured)) / span),
    )


@dataclass(frozen=True)
class Identities:
    """Appendix C's intermediate identities against Monte Carlo, per law and unit encoding;
    z: (Monte Carlo mean - formula) / its standard error."""

    kinds: list[str]  # (laws,) the noise laws
    encodings: np.ndarray  # (encodings, hidden) sparse e_1, dense (1, ..., 1)/√m, random
    sigma: float  # the noise σ
    lr: float  # the learning rate η of the step
    gradient: np.ndarray  # (laws, encodings) max |autograd - 2(W·ξ)(2W + ξ)| over open draws
    closed: np.ndarray  # (laws, encodings) share of draws where the ReLU closes: 1 + W·ξ <= 0
    stepped: np.ndarray  # (laws, encodings) E|W'|², Monte Carlo
    stepped_error: np.ndarray  # (laws, encodings) its standard error
    stepped_z: np.ndarray  # (laws, encodings) against 1 - 4η(1 - 4η)σ² + 4η²(μ₄ + (m-1)σ⁴)
    cross: np.ndarray  # (laws, encodings) E[(W·ξ)²|ξ|²], Monte Carlo
    cross_z: np.ndarray  # (laws, encodings) against |W|²(μ₄ + (m - 1)σ⁴)
    fourth_z: np.ndarray  # (laws, encodings) E[(W·ξ)⁴] against 3σ⁴|W|₂⁴ + |W|₄⁴(μ₄ - 3σ⁴)
    fourth_text_z: np.ndarray  # (laws, encodings) against the text's first line, factor 6


def _standard_error(samples):
    """The standard error of the mean of draws (samples,), at least 1e-12 of the mean: draws
    with no spread (bipolar noise on e_1) are exact up to rounding."""
    return max(float(samples.std()) / len(samples) ** 0.5, 1e-12 * abs(float(samples.mean())))


def _z(samples, expected):
    """(mean - expected) / standard error of the mean, for draws (samples,)."""
    return (float(samples.mean()) - expected) / _standard_error(samples)


@cached
def appendix_c_identities(hidden, kinds, sigma, lr, samples, seed=0):
    """Appendix C's steps for one unit encoding W with no interference, each by Monte Carlo over
    ξ: the model's gradient on e_1 (autograd) against 2(W·ξ)(2W + ξ), which holds while the
    ReLU passes the output W·(W + ξ) = 1 + W·ξ (heavy-tailed noise closes it in rare draws), and
    the means of |W'|² after that SGD step, of (W·ξ)²|ξ|² and of (W·ξ)⁴, against the text's
    formulas."""
    kinds = [check_noise(k) for k in kinds]
    check_size("samples", samples, minimum=100)
    sparse, dense = sparse_and_dense(hidden)
    spread = torch.randn(hidden, generator=generator(seed, "encoding"), dtype=DTYPE)
    encodings = [sparse, dense, spread / spread.norm()]
    shape = (len(kinds), len(encodings))
    fields = {
        name: np.zeros(shape)
        for name in (
            "gradient",
            "closed",
            "stepped",
            "stepped_error",
            "stepped_z",
            "cross",
            "cross_z",
            "fourth_z",
            "text",
        )
    }
    for (i, kind), (j, encoding) in itertools.product(enumerate(kinds), enumerate(encodings)):
        xi = standard_noise(kind, (samples, hidden), generator(seed + j, kind), DTYPE) * sigma
        W = encoding.expand(samples, 1, hidden).clone().requires_grad_()
        tied_basis_reference_loss(W, 0.0, xi).sum().backward()
        gradient = W.grad[:, 0]
        stepped = (W.detach()[:, 0] - lr * gradient).square().sum(-1)
        projection, norm = xi @ encoding, xi.square().sum(-1)
        cross = projection**2 * norm
        open_ = 1 + projection > 0  # W is a unit vector: the ReLU's input is 1 + W·ξ
        fields["gradient"][i, j] = float(
            (gradient - th.one_input_gradient(encoding, xi))[open_].abs().max()
        )
        fields["closed"][i, j] = float((~open_).double().mean())
        fields["stepped"][i, j] = float(stepped.mean())
        # minus -8η W·ξ, whose mean is 0 by the symmetry of the law: the same mean, with the
        # fluctuation at first order in η removed
        adjusted = stepped + 8 * lr * projection
        fields["stepped_error"][i, j] = _standard_error(adjusted)
        fields["stepped_z"][i, j] = _z(adjusted, th.stepped_squared_norm(kind, sigma, lr, hidden))
        fields["cross"][i, j] = float(cross.mean())
        fields["cross_z"][i, j] = _z(cross, th.projection_norm_moment(kind, sigma, hidden))
        fields["fourth_z"][i, j] = _z(
            projection**4, th.projection_fourth_moment(kind, sigma, encoding.numpy())
        )
        fields["text"][i, j] = _z(
            projection**4, th.projection_fourth_moment(kind, sigma, encoding.numpy(), 6)
        )
    return Identities(
        kinds=kinds,
        encodings=torch.stack(encodings).numpy(),
        sigma=sigma,
        lr=lr,
        fourth_text_z=fields.pop("text"),
        **fields,
    )


# --- l1 against noise on the same network ---------------------------------------------------------


@dataclass(frozen=True)
class L1NoiseComparison:
    """The same initial weights trained under l1 (no noise) and under bipolar noise (no l1)."""

    seeds: np.ndarray  # (seeds,)
    l1: float  # λ on the l1 side
    sigma: float  # σ on the noise side
    W: dict[str, np.ndarray]  # {"l1", "noise"}: (seeds, features, hidden) the final weights
    counts: dict[str, np.ndarray]  # {"l1", "noise"}: (seeds,) polysemantic neurons per model


@cached
def l1_and_noise(features, hidden, seeds, l1, sigma, *, steps, lr):
    """The same initial weights trained with l1 (no noise) and with bipolar noise (no l1).

    Returns the final W of each, (seeds, n, m), and their polysemantic neuron counts."""
    seeds = check_seeds(seeds)
    finals = {}
    for name, options in (("l1", dict(l1=l1)), ("noise", dict(noise="bipolar", sigma=sigma))):
        model = TiedBasisAutoencoder(features, hidden, seeds, **options)
        finals[name] = _run(
            model, steps=steps, lr=lr, records=2, desc=f"{name}, {len(seeds)} seeds"
        )[3]
    return L1NoiseComparison(
        seeds=np.array(seeds),
        l1=l1,
        sigma=sigma,
        W=finals,
        counts={k: count_polysemantic(torch.as_tensor(W)).numpy() for k, W in finals.items()},
    )


@cached
def train_one(features, hidden, kind, sigma, steps, seed=0, lr=0.02):
    """One small noisy model for the live explorer: the steps, each encoding's fourth norm over
    time (records, n) and the final W (n, m). Cached, so that the explorer's first picture, drawn
    in every execution of the chapter, and any setting tried before are read back."""
    model = TiedBasisAutoencoder(features, hidden, [seed], noise=kind, sigma=sigma)
    steps_at, fourth, _, W = _run(model, steps=steps, lr=lr, records=100, desc=f"{kind} σ={sigma}")
    return steps_at, fourth[:, 0], W[0]
