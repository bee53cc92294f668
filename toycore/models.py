"""Models with a leading instances dimension, so seeds and hyperparameter grids train as one batch.

Every model maps x of shape (instances, batch, features) to the same shape and has
``loss(x) -> (instances,)``: the mean over the batch of the squared error summed over features.
Summing that vector and calling backward gives each instance exactly the gradient it would get
if trained alone. A model is built on ``device`` (default ``toycore.devices.current()``), its
initial weights drawn there from each seed's own generator.

Shapes are named in the annotations: ``instances`` (one per seed or grid point), ``batch``
(samples), ``features`` (n, the data's dimension) and ``hidden`` (m, the bottleneck's). Each
model's W is laid out as its text writes it, so that the formulas read the same here:
ToyModel's W is (hidden, features), feature i's embedding the column W_i, as in Elhage et al.;
TiedBasisAutoencoder's is (features, hidden), feature i's encoding the row W_i, as in Lecomte
et al.
"""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from . import devices
from .checks import check_choice, check_per_instance, check_range, check_seeds, check_size
from .data import basis_vectors
from .devices import matmul_operand as _m
from .noise import HiddenNoise
from .seeding import generator


def _device(device):
    """The device a model is built on: ``device``, else ``toycore.devices.current()``."""
    return devices.current() if device is None else torch.device(device)


def _normal(seeds, shapes, std, dtype, device):
    """N(0, std^2) tensors of the given shapes, drawn in order from each seed's init stream
    (a generator on ``device``). Returns one stacked tensor per shape: (instances, *shape).
    """
    per_seed = []
    for seed in seeds:
        g = generator(seed, "init", device)
        per_seed.append(
            [torch.randn(shape, generator=g, dtype=dtype, device=device) * std for shape in shapes]
        )
    return [torch.stack(draws) for draws in zip(*per_seed)]


Batch = Float[Tensor, "instances batch features"]
PerInstance = Float[Tensor, "instances"]


def reconstruction_loss(x: Batch, x_hat: Batch) -> PerInstance:
    """Mean over the batch of ||x - x_hat||^2."""
    return (x - x_hat).pow(2).sum(-1).mean(-1)


class Instances(nn.Module):
    """What every model here shares: one instance per seed, ``features`` inputs and outputs, and
    a check that inputs are (instances, batch, features) before any work."""

    def __init__(self, features, seeds):
        super().__init__()
        self.seeds = check_seeds(seeds)
        self.features = check_size("features", features)

    def check_inputs(self, x: Batch, instances=None) -> Batch:
        """x itself; ``instances``: how many the weights in use hold, if not one per seed."""
        expected = (len(self.seeds) if instances is None else instances, self.features)
        if x.dim() != 3 or (x.shape[0], x.shape[-1]) != expected:
            raise ValueError(
                f"inputs must have shape (instances={expected[0]}, batch, "
                f"features={expected[1]}); got {tuple(x.shape)}"
            )
        return x

    def initial_std(self, init_std, default):
        """The std of the normal initial weights: ``init_std`` if given, else ``default``."""
        return (
            default
            if init_std is None
            else float(check_range("init_std", init_std, 0, low_open=True))
        )


class LinearAutoencoder(Instances):
    """x -> A B x with untied A (features x hidden) and B (hidden x features), no biases.

    A: (instances, features, hidden) decodes; B: (instances, hidden, features) encodes.
    """

    def __init__(self, features, hidden, seeds, init_std=None, dtype=torch.float32, device=None):
        super().__init__(features, seeds)
        self.hidden = check_size("hidden", hidden, maximum=features)
        std = self.initial_std(init_std, features**-0.5)
        A, B = _normal(
            self.seeds, [(features, hidden), (hidden, features)], std, dtype, _device(device)
        )
        self.A: Float[Tensor, "instances features hidden"] = nn.Parameter(A)
        self.B: Float[Tensor, "instances hidden features"] = nn.Parameter(B)

    def product(self) -> Float[Tensor, "instances features features"]:
        """The end-to-end matrix A B."""
        return self.A @ self.B

    def forward(self, x: Batch) -> Batch:
        # (instances, hidden, features) x (instances, batch, features) -> (instances, batch, hidden)
        hidden = torch.einsum("ihf,ibf->ibh", self.B, self.check_inputs(x))
        # (instances, features, hidden) x (instances, batch, hidden) -> (instances, batch, features)
        return torch.einsum("ifh,ibh->ibf", self.A, hidden)

    def loss(self, x: Batch) -> PerInstance:
        return reconstruction_loss(x, self(x))


class TiedLinear(Instances):
    """x -> W^T W x with one W: (instances, hidden, features), i.e. A = W^T and B = W."""

    def __init__(self, features, hidden, seeds, init_std=None, dtype=torch.float32, device=None):
        super().__init__(features, seeds)
        self.hidden = check_size("hidden", hidden, maximum=features)
        std = self.initial_std(init_std, features**-0.5)
        (W,) = _normal(self.seeds, [(hidden, features)], std, dtype, _device(device))
        self.W: Float[Tensor, "instances hidden features"] = nn.Parameter(W)

    def product(self) -> Float[Tensor, "instances features features"]:
        """The end-to-end matrix W^T W."""
        return self.W.transpose(-1, -2) @ self.W

    def forward(self, x: Batch) -> Batch:
        # (instances, hidden, features) x (instances, batch, features) -> (instances, batch, hidden)
        hidden = torch.einsum("ihf,ibf->ibh", self.W, self.check_inputs(x))
        # the same W read the other way: -> (instances, batch, features)
        return torch.einsum("ihf,ibh->ibf", self.W, hidden)

    def loss(self, x: Batch) -> PerInstance:
        return reconstruction_loss(x, self(x))


OUTPUTS = ("relu", "linear")


def check_importance(importance, instances, features, dtype=torch.float32, device="cpu"):
    """Per-feature importance as (instances, features): None means all ones; one row (features,)
    is shared by every instance. Every value must be finite and > 0."""
    if importance is None:
        return torch.ones(instances, features, dtype=dtype, device=device)
    tensor = torch.as_tensor(importance, dtype=dtype, device=device)
    if tensor.dim() == 1:
        tensor = tensor.expand(instances, -1)
    if tensor.shape != (instances, features):
        raise ValueError(
            f"importance must have shape ({features},) or ({instances}, {features}); "
            f"got {tuple(tensor.shape)}"
        )
    if not torch.all(torch.isfinite(tensor) & (tensor > 0)):
        raise ValueError("importance values must be finite and > 0")
    return tensor.clone()


class ToyModel(Instances):
    """The toy model of superposition: x -> out(Wᵀ W x + b), out = ReLU (default) or identity.

    W: (instances, hidden, features), column W_i embeds feature i; b: (instances, features).
    The loss weights feature i's squared error by its importance I_i: (instances, features).
    Init as in Elhage et al.: Xavier-normal W, zero b.
    """

    def __init__(
        self,
        features,
        hidden,
        seeds,
        importance=None,
        output="relu",
        init_std=None,
        dtype=torch.float32,
        device=None,
    ):
        super().__init__(features, seeds)
        self.hidden = check_size("hidden", hidden)
        self.output, device = check_choice("output", output, OUTPUTS), _device(device)
        self.register_buffer(
            "importance", check_importance(importance, len(self.seeds), features, dtype, device)
        )
        std = self.initial_std(init_std, (2 / (features + hidden)) ** 0.5)
        (W,) = _normal(self.seeds, [(hidden, features)], std, dtype, device)
        self.W: Float[Tensor, "instances hidden features"] = nn.Parameter(W)
        b = torch.zeros(len(self.seeds), features, dtype=dtype, device=device)
        self.b: Float[Tensor, "instances features"] = nn.Parameter(b)

    def forward(self, x: Batch) -> Batch:
        return toy_output(self.W, self.b, self.check_inputs(x), self.output)

    def loss(self, x: Batch) -> PerInstance:
        """Mean over the batch of Σ_i I_i (x_i - y_i)^2."""
        return toy_sample_loss(
            self.W, self.b, self.importance, self.check_inputs(x), self.output
        ).mean(-1)


def toy_output(
    W: Float[Tensor, "instances hidden features"],
    b: Float[Tensor, "instances features"],
    x: Batch,
    output="relu",
) -> Batch:
    """out(x Wᵀ W + b), out = ReLU or identity."""
    # one matmul with Wᵀ W (instances, features, features): for these small sizes it beats
    # going through the hidden layer; b broadcasts over the batch as (instances, 1, features)
    pre = torch.baddbmm(b[:, None, :], x, W.transpose(-1, -2) @ W)
    return torch.relu(pre) if output == "relu" else pre


def toy_sample_loss(
    W: Float[Tensor, "instances hidden features"],
    b: Float[Tensor, "instances features"],
    importance: Float[Tensor, "instances features"],
    x: Batch,
    output="relu",
) -> Float[Tensor, "instances batch"]:
    """Σ_i I_i (x_i - y_i)^2 for each sample."""
    return (importance[:, None, :] * (x - toy_output(W, b, x, output)).square()).sum(-1)


def gram(
    W: Float[Tensor, "instances features hidden"], blocks=4
) -> Float[Tensor, "instances features features"]:
    """G = W Wᵀ, computing each off-diagonal block once.

    G is symmetric, so only the block rows' upper parts are multiplied and mirrored: at
    n = 256, m = 1024 this takes 0.8 of the time of one full product on 2 cores."""
    n = W.shape[-2]
    if n < 64 * blocks:
        return W @ W.transpose(-1, -2)
    G = torch.empty(*W.shape[:-2], n, n, dtype=W.dtype, device=W.device)
    edges = [n * b // blocks for b in range(blocks + 1)]
    for start, stop in zip(edges, edges[1:]):
        rows = W[..., start:stop, :] @ W[..., start:, :].transpose(-1, -2)
        G[..., start:stop, start:] = rows
        G[..., start:, start:stop] = rows.transpose(-1, -2)
    return G


def tied_basis_reconstruction(G: Float[Tensor, "*instances features features"]):
    """The tied model's squared error summed over the n basis vectors, from G = W Wᵀ:
    Σ_i (1 - G_ii)² + Σ_{i≠j} ReLU(G_ij)², one number per leading index."""
    diagonal = G.diagonal(dim1=-2, dim2=-1)
    interference = torch.relu(G).square().sum((-2, -1)) - diagonal.square().sum(-1)
    return (1 - diagonal).square().sum(-1) + interference


class TiedBasisAutoencoder(Instances):
    """The model of incidental polysemanticity: y = ReLU(W (Wᵀ x + ξ)) with tied W, trained on the
    n basis vectors e_1..e_n (all of them, every step), with an l1 penalty on W and optionally
    noise ξ in the hidden layer, drawn fresh every step and shared by the n inputs.

    W: (instances, features, hidden); row W_i encodes feature i in the hidden layer. Output j on
    input e_i is ReLU(P_ji) with P = W Wᵀ + (W ξ) 1ᵀ, so the loss summed over the n inputs is

        L = Σ_ij (ReLU(P_ji) - δ_ji)² + λ Σ_ik |W_ik|,
        ∂L/∂W = (D + Dᵀ) W + (D 1) ξᵀ + λ sign(W),  D_ji = 2 (ReLU(P_ji) - δ_ji) 1[P_ji > 0].

    Without noise D is symmetric and (D + Dᵀ) W = 4 M W with M_ii = |W_i|² - 1 and
    M_ij = ReLU(W_i·W_j). A step costs two (n x m)(m x n)-sized products and no autograd. λ, the
    noise law (``noise``, see ``toycore.noise``) and σ may differ per instance. Init N(0, 1/m),
    as in the authors' code.
    """

    def __init__(
        self,
        features,
        hidden,
        seeds,
        l1=0.0,
        noise=None,
        sigma=0.0,
        init_std=None,
        dtype=torch.float32,
        device=None,
    ):
        super().__init__(features, seeds)
        self.hidden = check_size("hidden", hidden)
        if hidden < features:
            raise ValueError(
                f"hidden must be >= features ({features}): the model is about "
                f"polysemanticity that is not needed; got hidden={hidden}"
            )
        device = _device(device)
        self.register_buffer("l1", check_per_instance("l1", l1, len(self.seeds), dtype).to(device))
        if noise is None and torch.any(torch.as_tensor(sigma) != 0):
            raise ValueError(f"sigma={sigma!r} needs a noise law: pass noise=")
        self.noise = (
            None
            if noise is None
            else HiddenNoise(self.seeds, hidden, noise, sigma, dtype, device=device)
        )
        std = self.initial_std(init_std, hidden**-0.5)
        (W,) = _normal(self.seeds, [(features, hidden)], std, dtype, device)
        self.W: Float[Tensor, "instances features hidden"] = nn.Parameter(W)

    @torch.no_grad()
    def loss(self) -> PerInstance:
        """The loss on the whole data set without noise."""
        W = self.W
        return tied_basis_reconstruction(gram(W)) + self.l1 * W.abs().sum((-2, -1))

    @torch.no_grad()
    def loss_and_grad(self) -> PerInstance:
        """The loss of one step, with its noise if any; W.grad set to its gradient."""
        W = self.W
        P = gram(W)  # (instances, features, features)
        if self.noise is not None:
            xi = self.noise.next()  # (instances, hidden)
            P += W @ xi.unsqueeze(-1)  # + (instances, features, 1): W ξ added to every column
        error = torch.relu(P)
        error.diagonal(dim1=-2, dim2=-1).sub_(1)
        loss = error.square().sum((-2, -1)) + self.l1 * W.abs().sum((-2, -1))
        D = error.mul_(2)
        D.diagonal(dim1=-2, dim2=-1).mul_(P.diagonal(dim1=-2, dim2=-1) > 0)
        if self.noise is None:
            W.grad = torch.baddbmm(torch.sign(W).mul_(self.l1[:, None, None]), D, W, alpha=2.0)
        else:
            grad = torch.baddbmm(torch.sign(W).mul_(self.l1[:, None, None]), D + D.mT, W)
            W.grad = grad.baddbmm_(D.sum(-1, keepdim=True), xi.unsqueeze(-2))
        return loss


def tied_basis_reference_loss(W: Float[Tensor, "instances features hidden"], l1, xi=None):
    """The same loss computed the plain way, through the network with autograd-able einsums:
    the basis vectors as a batch, hidden = x W + ξ, y = ReLU(hidden Wᵀ), summed squared error plus
    λ |W|_1. For checking the closed form and benchmarking against it: (instances,).
    xi: the step's noise (instances, hidden), or None."""
    x = basis_vectors(W.shape[0], W.shape[1], device=W.device, dtype=W.dtype)  # batch = features
    # (instances, batch, features) x (instances, features, hidden) -> (instances, batch, hidden)
    hidden = torch.einsum("ibf,ifh->ibh", x, W)
    if xi is not None:
        hidden = hidden + xi.unsqueeze(-2)  # the step's ξ, shared by the batch
    # (instances, batch, hidden) x (instances, features, hidden) -> (instances, batch, features)
    y = torch.relu(torch.einsum("ibh,ifh->ibf", hidden, W))
    return (y - x).square().sum((-2, -1)) + l1 * W.abs().sum((-2, -1))


def check_hidden_sizes(hidden, instances, features):
    """Hidden sizes per instance as a list: one int for all, or one per instance, each in
    1..features; a clear error otherwise."""
    sizes = (
        [hidden] * instances
        if isinstance(hidden, int) and not isinstance(hidden, bool)
        else list(hidden)
    )
    if len(sizes) != instances:
        raise ValueError(f"hidden must be one size or {instances} sizes; got {len(sizes)}")
    return [check_size("hidden", size, maximum=features) for size in sizes]


class UntiedAutoencoder(Instances):
    """The model of the Persian rug paper (and Elhage et al.'s untied variant):
    y = out(W_out W_in x + b), out = ReLU (default) or identity.

    W_in: (instances, hidden, features) compresses, W_out: (instances, features, hidden) and the
    bias b: (instances, features) decode. ``hidden`` may differ per instance: smaller ones are
    zero-padded to the largest, and padded weights get exactly zero gradient (a padded row of
    W_in meets a zero column of W_out), so Adam never moves them and each instance trains as
    it would alone. Init as torch.nn.Linear, as in the authors' code: W_in ~ U(±1/√features),
    W_out and b ~ U(±1/√hidden). The loss is the squared error averaged over features and batch
    (the authors' F.mse_loss); the text's eq. 2 sums over features, which is ``features`` times it.
    """

    def __init__(self, features, hidden, seeds, output="relu", dtype=torch.float32, device=None):
        super().__init__(features, seeds)
        self.hidden_sizes = check_hidden_sizes(hidden, len(self.seeds), features)
        self.output, device = check_choice("output", output, OUTPUTS), _device(device)
        instances, widest = len(self.seeds), max(self.hidden_sizes)
        W_in = torch.zeros(instances, widest, features, dtype=dtype, device=device)
        W_out = torch.zeros(instances, features, widest, dtype=dtype, device=device)
        b = torch.zeros(instances, features, dtype=dtype, device=device)

        def uniform(shape, bound, g):
            return (torch.rand(shape, generator=g, dtype=dtype, device=device) * 2 - 1) * bound

        for i, (seed, size) in enumerate(zip(self.seeds, self.hidden_sizes)):
            g = generator(seed, "init", device)
            W_in[i, :size] = uniform((size, features), features**-0.5, g)
            W_out[i, :, :size] = uniform((features, size), size**-0.5, g)
            b[i] = uniform((features,), size**-0.5, g)
        self.W_in: Float[Tensor, "instances hidden features"] = nn.Parameter(W_in)
        self.W_out: Float[Tensor, "instances features hidden"] = nn.Parameter(W_out)
        self.b: Float[Tensor, "instances features"] = nn.Parameter(b)

    def product(self) -> Float[Tensor, "instances features features"]:
        """W = W_out W_in."""
        return self.W_out @ self.W_in

    def forward(self, x: Batch) -> Batch:
        # under train_until_converged's functional_call, W_in holds only the running instances
        x = self.check_inputs(x, instances=self.W_in.shape[0])
        # every product's inputs as ``toycore.devices.matmul_precision`` asks (``_m``)
        hidden = torch.bmm(_m(x), _m(self.W_in).mT)  # -> (instances, batch, hidden)
        # b as (instances, 1, features) + (instances, batch, hidden) x (instances, hidden, features)
        pre = torch.baddbmm(self.b.unsqueeze(-2), _m(hidden), _m(self.W_out).mT)
        return torch.relu(pre) if self.output == "relu" else pre

    def loss(self, x: Batch) -> PerInstance:
        """Squared error averaged over the batch and the features."""
        return (x - self(x)).square().mean((-2, -1))

    @torch.no_grad()
    def loss_and_grads(self, x: Batch, W_in, W_out, b):
        """``loss(x)`` for the weights given (a subset of the instances, as
        ``train_until_converged`` gathers them) and the gradients of its sum for W_in, W_out and
        b, written out. Autograd's graph of the same forward pass makes more passes over the
        (instances, batch, features) activations than these gemms need, and on a CPU those passes
        made a batched step slower than a plain one-model loop."""
        scale = 2 / (x.shape[-2] * x.shape[-1])  # d mean(e²) / d e = scale · e
        x, W_in, W_out = _m(x), _m(W_in), _m(W_out)  # as the products read them
        hidden = torch.bmm(x, W_in.mT)  # -> (instances, batch, hidden)
        # -> (instances, batch, features): b broadcast over the batch, then W_out's product added
        output = torch.baddbmm(b.unsqueeze(-2), _m(hidden), W_out.mT)
        if self.output == "relu":
            output.clamp_min_(0)
        error = output - x  # y - x
        # each instance's sum of squared errors, as a reduction over (batch·features): written
        # as a batched product of the errors with themselves it runs as a matrix-vector kernel,
        # 3 to 4 times slower on a CPU and most of a large model's step on a GPU, and on a CPU
        # it sums in sequence (relative errors up to 2e-4 at 2^19 terms, against 1e-7)
        flat = error.flatten(1)
        loss = torch.linalg.vecdot(flat, flat) * (scale / 2)
        if self.output == "relu":
            # now d loss / d(pre-activation), up to ``scale``: 0 where the ReLU output 0, as
            # autograd's ReLU does it (masked_fill_ with a boolean mask took a third of the
            # step on a CPU)
            error = torch.ops.aten.threshold_backward(error, output, 0)
        # (instances, features, batch) x (instances, batch, hidden) -> (instances, features, hidden)
        grad_W_out = torch.bmm(_m(error).mT, _m(hidden)).mul_(scale)
        # (instances, batch, features) x (instances, features, hidden) -> (instances, batch, hidden)
        grad_hidden = torch.bmm(_m(error), W_out)
        # (instances, hidden, batch) x (instances, batch, features) -> (instances, hidden, features)
        grad_W_in = torch.bmm(_m(grad_hidden).mT, x).mul_(scale)
        return loss, (grad_W_in, grad_W_out, error.sum(-2).mul_(scale))
