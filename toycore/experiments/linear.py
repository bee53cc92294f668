"""Chapter 1 experiments: linear autoencoders on sparse data, checked against the theory.

Everything runs in float64: the claims here are identities that should hold to many digits.
Everything also runs on the CPU, whatever the book's device: the sizes are tiny (D <= 16), and
scipy integrates the gradient flows on the host, so a GPU would only add transfers.
Functions that train are ``@cached``; the others take well under a second.
"""

from dataclasses import dataclass

import numpy as np
import torch

from ..cache import cached
from ..data import SparseUniform, sparse_moments
from ..models import LinearAutoencoder, TiedLinear
from ..profiles import select
from ..progress import progress_bar
from ..seeding import generator
from ..sizes import LINEAR
from ..theory import linear as th
from ..train import History, train

DTYPE = torch.float64
DEVICE = torch.device("cpu")


def sizes(profile=None):
    """This chapter's sizes in ``profile`` (default: ``$TOYCORE_PROFILE``, else ``cpu``), from
    ``toycore.sizes.LINEAR``, as nested attributes."""
    return select(profile, **LINEAR)


def dataset(features, sparsity, samples, seeds):
    """A fixed sparse data set per instance: (instances, samples, features), float64."""
    return SparseUniform(seeds, features, sparsity, device=DEVICE, dtype=DTYPE).sample(samples)


@dataclass(frozen=True)
class SpectralData:
    """One seed's data set, its sample second moment Σ and Σ's eigendecomposition."""

    x: torch.Tensor  # (1, samples, features) the data set
    sigma: torch.Tensor  # (features, features) Σ, its sample second moment
    eigenvalues: torch.Tensor  # (features,) Σ's eigenvalues, decreasing
    eigenvectors: torch.Tensor  # (features, features) the matching eigenvectors, as columns


def spectral_data(features, sparsity, samples, seed):
    """One seed's data set x (1, samples, features), its Σ, and Σ's eigenvalues and eigenvectors."""
    x = dataset(features, sparsity, samples, [seed])
    sigma = th.second_moment(x[0])
    eigenvalues, eigenvectors = th.eigh_descending(sigma)
    return SpectralData(x=x, sigma=sigma, eigenvalues=eigenvalues, eigenvectors=eigenvectors)


# --- 1. moments and spectrum -------------------------------------------------------------------


@dataclass(frozen=True)
class Moment:
    """One moment of the data: measured over the seeds, exact, and the measurement's error."""

    measured: float  # mean over seeds of the Monte Carlo value
    spread: float  # standard deviation of the value over seeds
    exact: float  # the closed form
    standard_error: float  # of the measured mean over all seeds' samples


def moments(features, sparsity, samples, seeds):
    """Monte Carlo E x_i, E x_i^2, E x_i x_j (i != j), the share of zero entries of x ⊗ x on
    and off its diagonal, and the number of active features per data point, per seed, with the
    exact standard error of their mean over all samples and seeds, as {"mean" | "square" |
    "cross" | "zero_square" | "zero_cross" | "active": Moment}. Each sample's value averages
    over its D entries (independent) or its D(D-1) pairs of entries: the latter a U-statistic,
    whose variance is (4(D-2) ζ₁ + 2 ζ₂) / (D(D-1)), ζ₁ the variance of the pair value given one
    entry and ζ₂ that of the pair value."""
    x = dataset(features, sparsity, samples, seeds)  # (seeds, samples, features)
    off_diagonal = ~torch.eye(features, dtype=torch.bool)
    products = x.transpose(-1, -2) @ x / samples
    active = (x != 0).to(x.dtype)  # u ~ U[0, 1] is never 0: x_i = 0 exactly when c_i = 0
    zero_products = 1 - active.transpose(-1, -2) @ active / samples  # P(x_i x_j = 0)
    measured = {
        "mean": x.mean((-1, -2)),
        "square": x.pow(2).mean((-1, -2)),
        "cross": products[:, off_diagonal].mean(-1),
        "zero_square": 1 - active.mean((-1, -2)),
        "zero_cross": zero_products[:, off_diagonal].mean(-1),
        "active": active.sum(-1).mean(-1),
    }
    exact = sparse_moments(sparsity)
    density = 1 - sparsity
    exact |= {
        "zero_square": sparsity,
        "zero_cross": 1 - density**2,
        "active": density * features,
    }
    pairs = features * (features - 1)

    def pair_average(given_one, whole):  # the variance of a U-statistic over a sample's pairs
        return (4 * (features - 2) * given_one + 2 * whole) / pairs

    variance = {  # the variance of one sample's value
        "mean": exact["variance"] / features,
        "square": (exact["fourth"] - exact["square"] ** 2) / features,
        # x_i x_j given x_i is x_i E x: ζ₁ = (E x)² Var x
        "cross": pair_average(
            exact["mean"] ** 2 * exact["variance"], exact["square"] ** 2 - exact["cross"] ** 2
        ),
        "zero_square": sparsity * density / features,
        # 1 - a_i a_j given the indicator a_i is 1 - a_i ρ: ζ₁ = ρ² ρ(1 - ρ)
        "zero_cross": pair_average(density**3 * sparsity, density**2 * (1 - density**2)),
        "active": features * sparsity * density,
    }
    n = samples * len(seeds)
    return {
        name: Moment(
            measured=float(values.mean()),
            spread=float(values.std()),
            exact=exact[name],
            standard_error=(variance[name] / n) ** 0.5,
        )
        for name, values in measured.items()
    }


@dataclass(frozen=True)
class SpectrumSplitting:
    """How far the sample spectrum is from the population's, per sample size T."""

    sample_sizes: np.ndarray  # (sizes,) the sample sizes T
    width: np.ndarray  # (sizes, seeds) relative bulk width (λ_2 - λ_D) / bulk
    top_error: np.ndarray  # (sizes, seeds) relative error of the top eigenvalue
    bulk_error: np.ndarray  # (sizes, seeds) relative error of the mean of λ_2, ..., λ_D
    slope: float  # fitted log-log slope of the mean width against T
    population: dict  # {"top", "bulk"}: the population's two eigenvalues


def spectrum_splitting(features, sparsity, sample_sizes, seeds):
    """How the population's degenerate bulk eigenvalue splits in sample second-moment matrices.

    Returns per sample size T the relative bulk width (λ_2 - λ_D) / bulk and the relative errors
    of the top eigenvalue and of the bulk's mean, each as (seeds,) arrays, plus the fitted
    log-log slope of the width.
    """
    population = th.population_spectrum(features, sparsity)
    width, top_error, bulk_error = [], [], []
    for T in sample_sizes:
        eigenvalues, _ = th.eigh_descending(th.second_moment(dataset(features, sparsity, T, seeds)))
        width.append(((eigenvalues[:, 1] - eigenvalues[:, -1]) / population["bulk"]).numpy())
        top_error.append((eigenvalues[:, 0] / population["top"] - 1).numpy())
        bulk_error.append((eigenvalues[:, 1:].mean(-1) / population["bulk"] - 1).numpy())
    width = np.array(width)
    slope = np.polyfit(np.log(sample_sizes), np.log(width.mean(1)), 1)[0]
    return SpectrumSplitting(
        sample_sizes=np.array(sample_sizes),
        width=width,
        top_error=np.array(top_error),
        bulk_error=np.array(bulk_error),
        slope=slope,
        population=population,
    )


# --- 2. gradient descent finds the top-d projection --------------------------------------------


@dataclass(frozen=True)
class MinimumRun:
    """Gradient descent on the untied model, one instance per seed, against Corollary 2."""

    history: History  # loss (records, seeds) along the run
    loss: np.ndarray  # (seeds,) final loss
    predicted: np.ndarray  # (seeds,) Corollary 2's minimum, tr Σ - (λ_1 + ... + λ_d)
    relative_error: np.ndarray  # (seeds,) |loss - predicted| / predicted
    projection_error: np.ndarray  # (seeds,) ||AB - P|| for P the top-d projection
    eigengap: np.ndarray  # (seeds,) λ_d - λ_d+1


@cached
def train_to_minimum(features, hidden, sparsity, samples, seeds, steps, lr, init_std):
    """Full-batch gradient descent on the untied model, one instance per seed.

    Returns the final loss, its Corollary 2 prediction, and the distance of AB from the
    projection onto the top-``hidden`` eigenvectors, each per seed.
    """
    x = dataset(features, sparsity, samples, seeds)
    model = LinearAutoencoder(
        features, hidden, seeds, init_std=init_std, dtype=DTYPE, device=DEVICE
    )
    history = train(model, x, steps=steps, lr=lr, desc="gradient descent to the minimum")
    eigenvalues, eigenvectors = th.eigh_descending(th.second_moment(x))
    predicted = torch.stack([th.critical_loss(lam, range(hidden)) for lam in eigenvalues])
    projection = torch.stack([th.top_projection(U, hidden) for U in eigenvectors])
    final_loss = th.linear_loss(model.A, model.B, th.second_moment(x)).detach()
    return MinimumRun(
        history=history,
        loss=final_loss.numpy(),
        predicted=predicted.numpy(),
        relative_error=((final_loss - predicted) / predicted).abs().numpy(),
        projection_error=(model.product().detach() - projection).norm(dim=(-2, -1)).numpy(),
        eigengap=(eigenvalues[:, hidden - 1] - eigenvalues[:, hidden]).numpy(),
    )


# --- 3. every critical point ---------------------------------------------------------------------


@dataclass(frozen=True)
class CriticalPoint:
    """One critical point U_I C: its loss and prediction, gradient and Hessian counts."""

    index_set: tuple  # (hidden,) the eigenvector indices I
    loss: float  # loss at the point
    predicted: float  # the sum of the eigenvalues outside I
    gradient_norm: float  # norm of the gradient in (A, B)
    hessian_min: float  # the Hessian's smallest eigenvalue
    negative: int  # number of negative Hessian eigenvalues
    positive: int  # number of positive Hessian eigenvalues
    zero: int  # number of Hessian eigenvalues zero up to rounding
    inversions: int  # number of (j in I, k not in I, k < j)


@dataclass(frozen=True)
class Census:
    """Every critical point of one sample Σ."""

    rows: list  # (index sets,) of CriticalPoint, the global minimum first
    eigenvalues: np.ndarray  # (features,) Σ's eigenvalues, decreasing


def zero_eigenvalue(hessian):
    """The size below which a Hessian eigenvalue counts as zero up to rounding: 1e3 machine
    epsilons of the largest. A random C can be ill-conditioned, which inflates the largest
    eigenvalue, so a looser relative cut (1e-9) would count small real eigenvalues as zero."""
    return 1e3 * torch.finfo(hessian.dtype).eps * hessian.abs().max()


def checked_spectral_data(features, sparsity, samples, seed):
    """``spectral_data``, refused when Σ is singular or has a repeated eigenvalue (the text's
    assumption, which Proposition 1 needs)."""
    data = spectral_data(features, sparsity, samples, seed)
    eigenvalues = data.eigenvalues
    gaps = -eigenvalues.diff()
    if eigenvalues[-1] <= 1e-9 * eigenvalues[0] or gaps.min() <= 1e-9 * eigenvalues[0]:
        raise ValueError(
            f"Σ from {samples} samples (seed {seed}) is singular or has a repeated "
            f"eigenvalue, which Proposition 1 excludes: use more samples"
        )
    return data


def critical_point_census(features, hidden, sparsity, samples, seed):
    """All C(D, d) critical points of one sample Σ, each with a random invertible C.

    Per index set: the loss and its prediction, the gradient norm, and the Hessian's counts of
    negative, positive and zero eigenvalues next to the number of inversions (j in I, k not in
    I, k < j).
    """
    data = checked_spectral_data(features, sparsity, samples, seed)
    sigma, eigenvalues, eigenvectors = data.sigma, data.eigenvalues, data.eigenvectors
    g = generator(seed, "census")
    rows = []
    for index_set in th.index_sets(features, hidden):
        C = torch.randn(hidden, hidden, generator=g, dtype=DTYPE) + 2 * torch.eye(hidden)
        A, B = th.critical_point(eigenvectors, index_set, C)
        grad_A, grad_B = th.linear_gradients(A, B, sigma)
        hessian = th.hessian_eigenvalues(A, B, sigma)
        zero = zero_eigenvalue(hessian)
        rows.append(
            CriticalPoint(
                index_set=index_set,
                loss=float(th.linear_loss(A, B, sigma)),
                predicted=float(th.critical_loss(eigenvalues, index_set)),
                gradient_norm=float(torch.sqrt(grad_A.pow(2).sum() + grad_B.pow(2).sum())),
                hessian_min=float(hessian[0]),
                negative=int((hessian < -zero).sum()),
                positive=int((hessian > zero).sum()),
                zero=int((hessian.abs() <= zero).sum()),
                inversions=len(th.inversions(index_set, features)),
            )
        )
    return Census(rows=rows, eigenvalues=eigenvalues.numpy())


# A singular value of A below this fraction of its largest counts as zero.
RANK_TOLERANCE = 1e-6


@dataclass(frozen=True)
class FoundPoint:
    """A critical point found from a random start, knowing nothing of Σ's eigenvectors."""

    gradient_norm: float  # norm of the gradient in (A, B) where the search stopped
    rank_ratio: float  # A's smallest singular value over its largest (0: A is rank-deficient)
    rank: int  # A's numerical rank: its singular values above RANK_TOLERANCE times the largest
    index_set: tuple  # the eigenvectors AB keeps (u_iᵀ AB u_i > 1/2)
    form_error: float  # largest entry of A - U_I C, B - C⁻¹U_Iᵀ and AB - U_I U_Iᵀ, C = U_Iᵀ A
    projection_error: float  # largest entry of AB - U_I U_Iᵀ, whatever the size of I
    loss: float  # loss at the point
    predicted: float  # the sum of the eigenvalues outside I
    negative: int  # number of negative Hessian eigenvalues
    positive: int  # number of positive Hessian eigenvalues


@cached
def critical_points_found(features, hidden, sparsity, samples, seed, starts):
    """Critical points of one sample Σ found independently of Proposition 1: from ``starts``
    random (A, B) with standard normal entries, Levenberg-Marquardt drives the gradient (19) to
    zero. Each end point is then compared with the form (⋆) for the eigenvectors it keeps.

    A rank-deficient A (the text's proof assumes full rank) keeps fewer than ``hidden``
    eigenvectors; its form_error is then infinite, and the caller sets it apart by rank_ratio.
    Its AB is still compared with the projection onto the eigenvectors it keeps.
    """
    data = checked_spectral_data(features, sparsity, samples, seed)
    sigma, eigenvalues, eigenvectors = data.sigma, data.eigenvalues, data.eigenvectors
    g = generator(seed, "critical search")
    found = []
    bar = progress_bar(starts, f"critical points from random starts (seed {seed})")
    for _ in range(starts):
        A = torch.randn(features, hidden, generator=g, dtype=DTYPE)
        B = torch.randn(hidden, features, generator=g, dtype=DTYPE)
        A, B = th.solve_critical_point(sigma, A, B)
        grad_A, grad_B = th.linear_gradients(A, B, sigma)
        singular = torch.linalg.svdvals(A)
        index_set = th.projection_index_set(eigenvectors, A @ B)
        U_I = eigenvectors[:, list(index_set)]  # (features, |I|)
        projection_error = float((A @ B - U_I @ U_I.T).abs().max())
        form_error = float("inf")
        if len(index_set) == hidden:
            C = U_I.T @ A
            form_error = max(
                float((A - U_I @ C).abs().max()),
                float((B - torch.linalg.solve(C, U_I.T)).abs().max()),
                projection_error,
            )
        hessian = th.hessian_eigenvalues(A, B, sigma)
        zero = zero_eigenvalue(hessian)
        found.append(
            FoundPoint(
                gradient_norm=float(torch.sqrt(grad_A.pow(2).sum() + grad_B.pow(2).sum())),
                rank_ratio=float(singular[-1] / singular[0]),
                rank=int((singular > RANK_TOLERANCE * singular[0]).sum()),
                index_set=index_set,
                form_error=form_error,
                projection_error=projection_error,
                loss=float(th.linear_loss(A, B, sigma)),
                predicted=float(th.critical_loss(eigenvalues, index_set)),
                negative=int((hessian < -zero).sum()),
                positive=int((hessian > zero).sum()),
            )
        )
        bar.update(1)
    bar.close()
    return found


# --- 4. the saddle-escape perturbation -----------------------------------------------------------


@dataclass(frozen=True)
class EscapeDrops:
    """Loss decrease at the Prop. 3 perturbation for each eps, measured and predicted."""

    eps: np.ndarray  # (eps,) the perturbation sizes
    measured: np.ndarray  # (eps,) loss at the critical point minus loss at the perturbation
    predicted: np.ndarray  # (eps,) eps²/(1+eps²)(λ_k - λ_j)


def escape_drops(features, hidden, sparsity, samples, seed, index_set, j, k, eps_values):
    """Loss at the critical point minus loss at the Prop. 3 perturbation, measured and predicted."""
    data = spectral_data(features, sparsity, samples, seed)
    sigma, eigenvalues, eigenvectors = data.sigma, data.eigenvalues, data.eigenvectors
    A, B = th.critical_point(eigenvectors, index_set)
    base = th.linear_loss(A, B, sigma)
    measured = [
        float(base - th.linear_loss(*th.saddle_escape(eigenvectors, index_set, j, k, eps), sigma))
        for eps in eps_values
    ]
    predicted = [float(th.escape_drop(eigenvalues, j, k, eps)) for eps in eps_values]
    return EscapeDrops(
        eps=np.array(eps_values), measured=np.array(measured), predicted=np.array(predicted)
    )


# --- 5. gradient flows ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DescentRun:
    """Gradient descent with one lr next to the flow (20)-(21) at the same flow times."""

    times: np.ndarray  # (records,) flow time 2·lr·step of each record
    loss: np.ndarray  # (records,) gradient descent's loss
    deviation: float  # largest distance from the flow in the weights, relative to their size
    flow_loss: np.ndarray  # (records,) the flow's loss


@cached
def untied_flow_vs_descent(features, hidden, sparsity, samples, seed, duration, lrs, init_std):
    """Integrate (20)-(21) and run gradient descent with each lr over the same flow time.

    Gradient descent on L with step lr moves the weights by 2·lr·(flow), so step s sits at flow
    time 2·lr·s. Returns the loss along the flow and each run, and each run's largest distance
    from the flow in the weights, relative to their size, as {lr: DescentRun}.
    """
    data = spectral_data(features, sparsity, samples, seed)
    x, sigma = data.x, data.sigma
    model0 = LinearAutoencoder(
        features, hidden, [seed], init_std=init_std, dtype=DTYPE, device=DEVICE
    )
    A0, B0 = model0.A.detach()[0], model0.B.detach()[0]
    runs = {}
    for lr in lrs:
        steps = int(round(duration / (2 * lr)))
        model = LinearAutoencoder(
            features, hidden, [seed], init_std=init_std, dtype=DTYPE, device=DEVICE
        )
        record_at = np.linspace(0, steps, 101).round().astype(int)
        history = train(
            model,
            x,
            steps=steps,
            lr=lr,
            record_at=record_at,
            metrics={"A": lambda m: m.A, "B": lambda m: m.B},
            desc=f"descent, lr={lr}",
        )
        times = history.steps * 2 * lr
        A_flow, B_flow = th.integrate(lambda A, B: th.untied_flow(A, B, sigma), (A0, B0), times)
        weights_flow = torch.cat([A_flow.flatten(1), B_flow.flatten(1)], 1)
        weights_gd = torch.cat(
            [
                torch.from_numpy(history.metrics["A"][:, 0]).flatten(1),
                torch.from_numpy(history.metrics["B"][:, 0]).flatten(1),
            ],
            1,
        )
        deviation = ((weights_gd - weights_flow).norm(dim=1) / weights_flow.norm(dim=1)).max()
        runs[lr] = DescentRun(
            times=times,
            loss=history.loss[:, 0],
            deviation=float(deviation),
            flow_loss=th.linear_loss(A_flow, B_flow, sigma).numpy(),
        )
    return runs


@dataclass(frozen=True)
class EndPoint:
    """Where a tied flow ends."""

    projection_error: float  # ||WᵀW - P|| for P the top-d projection
    orthonormality: float  # ||WWᵀ - I||


@dataclass(frozen=True)
class TiedFlows:
    """The tied flow (22), its rotated form (23) and the tied loss's gradient flow."""

    times: np.ndarray  # (times,) the common time grid
    loss_22: np.ndarray  # (times,) tied loss along (22)
    loss_gradient: np.ndarray  # (times,) tied loss along the tied gradient flow
    minimum: float  # the PCA minimum
    rotation_error: float  # max over t of ||W(t)U - W̄(t)||, W̄ from (23)
    end_22: EndPoint  # where the flow (22) ends
    end_gradient: EndPoint  # where the tied gradient flow ends


@cached
def tied_flows(features, hidden, sparsity, samples, seed, duration, init_std):
    """The tied flow (22), its rotated form (23), and the true gradient flow of the tied loss.

    Returns, along a common time grid: the tied loss under (22) and under tied gradient descent's
    flow, the PCA minimum, how far W(t)U is from W̄(t) of (23), and where each flow ends
    (distance of WᵀW from the top-d projection, and ||WWᵀ - I||).
    """
    data = spectral_data(features, sparsity, samples, seed)
    sigma, eigenvalues, eigenvectors = data.sigma, data.eigenvalues, data.eigenvectors
    W0 = TiedLinear(
        features, hidden, [seed], init_std=init_std, dtype=DTYPE, device=DEVICE
    ).W.detach()[0]
    times = np.concatenate([[0], np.geomspace(1e-2, duration, 200)])
    (W_22,) = th.integrate(lambda W: th.tied_flow(W, sigma), (W0,), times)
    (W_23,) = th.integrate(
        lambda W: th.rotated_tied_flow(W, eigenvalues), (W0 @ eigenvectors,), times
    )
    (W_gd,) = th.integrate(lambda W: th.tied_gradient_flow(W, sigma), (W0,), times)

    def tied_loss(W):
        return th.linear_loss(W.transpose(-1, -2), W, sigma).numpy()

    def end_point(W):
        gram = W.T @ W
        return EndPoint(
            projection_error=float((gram - th.top_projection(eigenvectors, hidden)).norm()),
            orthonormality=float((W @ W.T - torch.eye(hidden, dtype=DTYPE)).norm()),
        )

    return TiedFlows(
        times=times,
        loss_22=tied_loss(W_22),
        loss_gradient=tied_loss(W_gd),
        minimum=float(th.critical_loss(eigenvalues, range(hidden))),
        rotation_error=float((W_22 @ eigenvectors - W_23).norm(dim=(-2, -1)).max()),
        end_22=end_point(W_22[-1]),
        end_gradient=end_point(W_gd[-1]),
    )


@dataclass(frozen=True)
class EnergyCheck:
    """The flow (22) under Σ = I against -∇E, and E along the flow."""

    mismatch: float  # relative mismatch of (22) and -∇E, E as we read (28)
    mismatch_as_printed: float  # the same for E as printed
    times: np.ndarray  # (times,) flow times
    energy: np.ndarray  # (times,) E as we read (28) along the flow
    energy_as_printed: np.ndarray  # (times,) E as printed along the flow


def energy_check(features, hidden, seed, duration, init_std):
    """Under Σ = I: compare the flow (22) with -∇E for E as we read (28) and as printed, and
    follow E along the flow. Returns the relative gradient mismatches and E(t)."""
    W0 = TiedLinear(
        features, hidden, [seed], init_std=init_std, dtype=DTYPE, device=DEVICE
    ).W.detach()[0]
    identity = torch.eye(features, dtype=DTYPE)
    flow = th.tied_flow(W0, identity)

    def mismatch(energy):
        W = W0.clone().requires_grad_(True)
        (gradient,) = torch.autograd.grad(energy(W), W)
        return float((flow + gradient).norm() / flow.norm())

    times = np.linspace(0, duration, 200)
    (W_t,) = th.integrate(lambda W: th.tied_flow(W, identity), (W0,), times)
    return EnergyCheck(
        mismatch=mismatch(th.energy),
        mismatch_as_printed=mismatch(th.energy_as_printed),
        times=times,
        energy=th.energy(W_t).numpy(),
        energy_as_printed=th.energy_as_printed(W_t).numpy(),
    )


# --- 6. escaping a saddle during training --------------------------------------------------------


@dataclass(frozen=True)
class SaddleRun:
    """Gradient descent started at the Prop. 3 perturbation of a saddle, one instance per eps."""

    steps: np.ndarray  # (records,) every step
    loss: np.ndarray  # (records, eps)
    eps: np.ndarray  # (eps,) the perturbation sizes
    saddle: float  # the saddle's critical value
    minimum: float  # the global minimum
    escape_steps: np.ndarray  # (eps,) step where the loss crosses halfway down, -1 if never
    all_critical_values: np.ndarray  # (index sets,) every critical point's loss
    predicted_steps_per_efold: float  # 1 / log(1 - lr·h_min)


@cached
def train_from_saddle(
    features, hidden, sparsity, samples, seed, index_set, j, k, eps_values, lr, efolds_after=25
):
    """Gradient descent started at the Prop. 3 perturbation of a saddle, one instance per eps.

    Near the saddle the unstable component grows by 1 - lr·h_min per step (h_min the Hessian's
    most negative eigenvalue). The run lasts long enough for the smallest eps to escape and then
    converge for ``efolds_after`` more e-folds at that rate. Returns the loss curves, the saddle and
    minimum losses, the step at which each run's loss crosses halfway between them (-1 if never),
    and the predicted steps per e-fold.
    """
    data = spectral_data(features, sparsity, samples, seed)
    x, sigma = data.x, data.sigma
    eigenvalues, eigenvectors = data.eigenvalues, data.eigenvectors
    h_min = float(th.hessian_eigenvalues(*th.critical_point(eigenvectors, index_set), sigma)[0])
    steps_per_efold = 1 / np.log(1 - lr * h_min)
    steps = int(np.ceil(steps_per_efold * (np.log(1 / min(eps_values)) + efolds_after)))
    model = LinearAutoencoder(
        features, hidden, [seed] * len(eps_values), dtype=DTYPE, device=DEVICE
    )
    with torch.no_grad():
        for i, eps in enumerate(eps_values):
            model.A[i], model.B[i] = th.saddle_escape(eigenvectors, index_set, j, k, eps)
    history = train(
        model,
        x.expand(len(eps_values), -1, -1),
        steps=steps,
        lr=lr,
        record_at=np.arange(steps + 1),
        desc="escaping a saddle",
    )
    saddle = float(th.critical_loss(eigenvalues, index_set))
    minimum = float(th.critical_loss(eigenvalues, range(hidden)))
    crossed = history.loss < (saddle + minimum) / 2
    return SaddleRun(
        steps=history.steps,
        loss=history.loss,
        eps=np.array(eps_values),
        saddle=saddle,
        minimum=minimum,
        escape_steps=np.where(crossed.any(0), crossed.argmax(0), -1),
        all_critical_values=np.array(
            [float(th.critical_loss(eigenvalues, I)) for I in th.index_sets(features, hidden)]
        ),
        predicted_steps_per_efold=steps_per_efold,
    )


# --- widgets: loss curves against the critical values ---------------------------------------------


@dataclass(frozen=True)
class LossCurve:
    """One run's loss and every critical value, as fractions of tr Σ."""

    steps: np.ndarray  # (records,)
    loss: np.ndarray  # (records,) loss / tr Σ
    critical: np.ndarray  # (index sets,) critical values / tr Σ


def loss_curves_run(features, hidden, sparsities, samples, steps, lr, seed, init_std):
    """Gradient descent from a small start, one instance per sparsity, for one hidden size.

    λ_1 of Σ ranges over 30x across S and lr must stay below about 1/(2λ_1), so each instance's
    data is divided by sqrt(λ_1): on x/sqrt(c), a step lr is exactly a step lr/c on x. Loss and
    critical values are reported as fractions of tr Σ, which that scaling leaves unchanged.
    Returns {S: LossCurve}.
    """
    x = SparseUniform(
        [seed] * len(sparsities), features, sparsities, device=DEVICE, dtype=DTYPE
    ).sample(samples)
    eigenvalues, _ = th.eigh_descending(th.second_moment(x))
    x = x / eigenvalues[:, :1, None].sqrt()
    model = LinearAutoencoder(
        features, hidden, [seed] * len(sparsities), init_std=init_std, dtype=DTYPE, device=DEVICE
    )
    history = train(model, x, steps=steps, lr=lr, desc=f"d={hidden}")
    trace = eigenvalues.sum(-1)
    critical = (
        torch.stack([th.critical_loss(eigenvalues, I) for I in th.index_sets(features, hidden)], -1)
        / trace[:, None]
    )
    # the loss on x/sqrt(λ_1) is L/λ_1; as a fraction of tr Σ it is L/tr Σ
    fraction = history.loss * (eigenvalues[:, 0] / trace).numpy()
    return {
        S: LossCurve(steps=history.steps, loss=fraction[:, i], critical=critical[i].numpy())
        for i, S in enumerate(sparsities)
    }


@cached
def loss_curves(features, hidden_values, sparsities, samples, steps, lr, seed, init_std):
    """``loss_curves_run`` for every hidden size: {(hidden, S): curve}."""
    curves = {}
    for hidden in hidden_values:
        for S, curve in loss_curves_run(
            features, hidden, sparsities, samples, steps, lr, seed, init_std
        ).items():
            curves[hidden, S] = curve
    return curves
