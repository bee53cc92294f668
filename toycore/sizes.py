"""Every chapter's sizes in each profile (see ``toycore.profiles``): ``ci`` for the tests,
``cpu`` for a laptop, ``paper`` for the texts' own sizes on a GPU.

A chapter reads its table with ``P = ex.sizes(profile)``: nested dicts become nested
attributes (``P.flow.n``). The tables sit outside the cache key: a size reaches a computation
only as an argument, and arguments are part of each result's key.
"""

import numpy as np

# Chapter 1: linear autoencoders (the text's D features, d hidden, sparsity S, T samples).
LINEAR = dict(
    ci=dict(
        D=5,  # features
        d=2,  # hidden dimensions
        S=0.8,  # sparsity: each feature is zero with probability S
        T=64,  # samples in the fixed data set
        seeds=range(3),
        steps=3000,  # full-batch gradient descent steps
        lr=1.0,
        moment_samples=4096,  # samples per seed for the moments of section 1
        spectrum_T=[256, 1024, 4096, 16384],  # data set sizes at which Σ's spectrum splits
        census=(4, 2),  # (D, d) at which every critical point is enumerated
        critical_starts=24,  # random starts of the independent critical-point search
        flow_time=50.0,  # how long the gradient flows run
        explorer=dict(features=6, hidden=(1, 2), sparsities=(0.5, 0.9), steps=600),
    ),
    cpu=dict(
        D=8,
        d=3,
        S=0.8,
        T=256,
        seeds=range(8),
        steps=10000,
        lr=1.0,
        moment_samples=16384,
        spectrum_T=[256, 1024, 4096, 16384, 65536],
        census=(6, 3),
        critical_starts=64,
        flow_time=200.0,
        explorer=dict(
            features=8,
            hidden=(1, 2, 3, 4),
            sparsities=(0.0, 0.5, 0.8, 0.9, 0.95, 0.99),
            steps=3000,
        ),
    ),
    paper=dict(
        D=16,
        d=4,
        S=0.9,
        T=1024,
        seeds=range(16),
        steps=100000,
        lr=2.0,
        moment_samples=65536,
        spectrum_T=[256, 1024, 4096, 16384, 65536, 262144],
        census=(7, 3),
        critical_starts=128,
        flow_time=1000.0,
        explorer=dict(
            features=12,
            hidden=(1, 2, 3, 4, 6),
            sparsities=(0.0, 0.5, 0.8, 0.9, 0.95, 0.99),
            steps=10000,
        ),
    ),
)

# Chapter 2: the ReLU output model (Elhage et al.'s n features in m dimensions).
RELU = dict(
    ci=dict(
        seeds=range(2),
        steps=1500,  # AdamW steps of the classic pictures
        lr=1e-2,
        # 1 - S of the n=5, m=2 pictures, with the 0.2 and 0.1 of Elhage et al.'s figure
        classic_density=[1.0, 0.2, 0.1, 0.05],
        # seeds at the introductory figure's three sparsities, for the share that finds its shape
        figure_seeds=range(4),
        # the sweep over sparsity: importance decay^i, 1 - S from dense to sparse
        wide=dict(n=12, m=3, decay=0.7, density=[1.0, 0.1, 0.003], steps=3000),
        # learned directions against the best of `restarts` packings, per (n, m) in shapes
        packing=dict(shapes=[(5, 2)], S=0.95, restarts=16, steps=1000),
        samples=4096,  # Monte Carlo samples per term of the pattern expansion
        random_models=16,  # random W (and b) per sparsity for the exact identities
    ),
    cpu=dict(
        seeds=range(4),
        steps=5000,
        lr=3e-3,
        classic_density=sorted({*map(float, 20 ** -np.linspace(0, 1, 7)), 0.2, 0.1}, reverse=True),
        figure_seeds=range(16),
        wide=dict(n=20, m=5, decay=0.7, steps=5000, density=[1, 0.3, 0.1, 0.03, 0.01, 0.003]),
        packing=dict(shapes=[(5, 2), (7, 3), (8, 3), (10, 3)], S=0.95, restarts=64, steps=2000),
        samples=16384,
        random_models=32,
    ),
    paper=dict(
        seeds=range(8),
        steps=10000,
        lr=1e-3,
        classic_density=sorted({*map(float, 20 ** -np.linspace(0, 1, 10)), 0.2, 0.1}, reverse=True),
        # eight seeds put the share at S = 0.9 at 0.5, 0.75, 0.375 or 0.75 by which eight
        figure_seeds=range(32),
        wide=dict(
            n=20, m=5, decay=0.7, density=[1, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001], steps=10000
        ),
        packing=dict(
            shapes=[(5, 2), (7, 3), (8, 3), (10, 3), (12, 4), (16, 5)],
            S=0.95,
            restarts=256,
            steps=4000,
        ),
        samples=65536,
        random_models=64,
    ),
)

# Chapter 3: incidental polysemanticity (n features, m neurons, l1 strength λ).
POLYSEMANTIC = dict(
    ci=dict(
        ode_seeds=range(2),  # seeds of the one-encoding ODE of Figure 2
        size_seeds=range(8),  # seeds of the same ODE at m = 10⁴, 10⁵ and 10⁶ (Appendix B)
        # gradient descent standing in for the gradient flow: the threshold and the overlaps
        flow=dict(n=32, m=128, seeds=range(4), l1=0.01, steps=4000, lr=0.05),
        # the text's malign collision, two encodings alone sharing one coordinate, at the
        # flow's m; many seeds, for the few where the smaller weight keeps it (sized on a first
        # run of 256 seeds: from 9% at m = 128 to 1% at m = 512)
        alone_seeds=range(64),
        law=dict(n=64, ms=[64, 128, 256], seeds=range(8)),  # Figure 3's sweep over m
        # section 5's proposed fix, on at most per_model polysemantic neurons of each source model
        split=dict(seeds=range(16), steps=6000, per_model=16),
        explorer=dict(n=16, ms=[16, 32], l1s=[1e-3, 1e-2], steps=3000),
        # section 5's "until m ≈ n²": Figure 3's setting at a small n, m from n to n²
        persist=dict(n=8, ms=[8, 16, 32, 64], seeds=range(64)),
        interference_seeds=range(16),  # the forces at initialisation, m from n to 16n
        # Figure 3's training at m = 2n, each feature's winner followed in time (section 7)
        landing=dict(n=64, m=128, seeds=range(64)),
    ),
    cpu=dict(
        ode_seeds=range(4),
        size_seeds=range(8),
        flow=dict(n=64, m=256, seeds=range(16), l1=0.01, steps=4000, lr=0.05),
        alone_seeds=range(256),
        law=dict(n=64, ms=[64, 128, 256, 512, 1024], seeds=range(16)),
        split=dict(seeds=range(16), steps=10000, per_model=16),
        explorer=dict(n=32, ms=[32, 64, 128], l1s=[3e-4, 1e-3, 3e-3, 1e-2], steps=7500),
        persist=dict(n=10, ms=[10, 20, 50, 100], seeds=range(256)),
        interference_seeds=range(32),
        landing=dict(n=64, m=128, seeds=range(64)),
    ),
    paper=dict(
        ode_seeds=range(8),
        size_seeds=range(16),
        flow=dict(n=128, m=512, seeds=range(16), l1=0.01, steps=4000, lr=0.05),
        alone_seeds=range(1024),
        # the authors' collisions.py: m from 256 to 4096 in steps of 256, sixteen sizes
        law=dict(n=256, ms=list(range(256, 4097, 256)), seeds=range(16)),
        # n = m = 256 models have about n²/(4m) = 64 polysemantic neurons each, and one run
        # costs 64 of cpu's n = 64: 16 of each model keep cpu's 256 runs (a rate's standard
        # error about 0.03) at a quarter of the cost of all
        split=dict(seeds=range(16), steps=10000, per_model=16),
        explorer=dict(n=32, ms=[32, 64, 128], l1s=[3e-4, 1e-3, 3e-3, 1e-2], steps=7500),
        persist=dict(n=16, ms=[16, 32, 64, 128, 256], seeds=range(256)),
        interference_seeds=range(64),
        landing=dict(n=256, m=512, seeds=range(16)),
    ),
)

# Chapter 4: sparsity from noise (the authors' n = 8, m = 16 and SGD lr 0.02 in every profile).
HIDDEN_NOISE = dict(
    ci=dict(
        sigmas=[0.1, 0.2],  # noise strengths of Figure 4
        seeds=range(2),
        steps=15_000,  # SGD steps of Figures 4 and 5
        l1s=[1e-5, 1e-3, 1.0, 2.0],  # Figure 5's l1 side
        sweep_sigmas=[0.02, 0.1, 0.15, 0.5],  # Figure 5's noise side
        sweep_seeds=range(2),
        fig6_sigma=0.15,  # Figure 6's single run
        fig6_steps=30_000,
        samples=200_000,  # noise draws per (law, lr) in the kurtosis check of appendix C
        lrs=[0.001, 0.02],
        compare_seeds=range(4),  # l1 and noise together
    ),
    cpu=dict(
        sigmas=[0.07, 0.1, 0.15],
        seeds=range(5),
        steps=100_000,
        l1s=[1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.3, 1.0, 2.0],
        sweep_sigmas=[0.02, 0.05, 0.07, 0.085, 0.1, 0.12, 0.15, 0.2, 0.3, 0.5],
        sweep_seeds=range(4),
        fig6_sigma=0.1,
        fig6_steps=100_000,
        samples=500_000,
        lrs=[0.001, 0.003, 0.01, 0.02],
        compare_seeds=range(16),
    ),
    paper=dict(
        sigmas=[0.07, 0.1, 0.15],
        seeds=range(5),
        steps=100_000,
        l1s=[1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.3, 1.0, 2.0],
        sweep_sigmas=[0.02, 0.05, 0.07, 0.085, 0.1, 0.12, 0.15, 0.2, 0.3, 0.5],
        sweep_seeds=range(5),
        fig6_sigma=0.1,
        fig6_steps=1_000_000,
        samples=2_000_000,
        lrs=[0.001, 0.003, 0.01, 0.02],
        compare_seeds=range(64),
    ),
)

# Chapter 5: the Persian rug (ns sparse features, nd = ratio ns dense, density p).
PERSIAN_RUG = dict(
    ci=dict(
        sizes=[32, 128],  # ns of the training grids
        densities=[0.01, 0.3],  # p of the grids
        ratios=[0.1, 0.25, 0.8],  # nd/ns of the grids
        grid_seeds=[0, 1],  # seeds of every grid cell
        max_steps=45_000,  # the cap on a run the stopping rule has not ended
        long_steps=8000,  # the fixed-length runs that test the stopping rule at small p
        sweep_sizes=[128, 256],  # ns of the sweep at p = 0.045, nd/ns = 0.25
        sweep_seeds=[0, 1],
        linear_features=32,  # ns of the linear baseline
        rug_features=256,  # ns of the live rug in the explorer
        # past the texts' sizes (ours, section 11): a GPU's in the paper profile; ci's size only
        # exercises the code, and the cpu profile stops at the texts' sizes
        beyond_sizes=[384],
        beyond_seeds=[0],
        # the text's own largest ns (section 13): a GPU's in the paper profile; ci's size only
        # exercises the code (its models are section 11's), the cpu profile has none
        text_largest_sizes=[384],
        text_largest_seeds=[0],
    ),
    cpu=dict(
        sizes=[32, 64, 128],
        densities=[0.01, 0.05, 0.2, 0.5],
        ratios=[0.05, 0.1, 0.25, 0.4, 0.6, 0.8],
        grid_seeds=[0, 1],
        max_steps=45_000,
        long_steps=20_000,
        sweep_sizes=[64, 128, 256, 512],
        sweep_seeds=[0, 1],
        linear_features=64,
        rug_features=1024,
        beyond_sizes=[],
        beyond_seeds=[],
        text_largest_sizes=[],
        text_largest_seeds=[],
    ),
    paper=dict(
        sizes=[128, 512, 2048],
        densities=[0.001, 0.01, 0.05, 0.1, 0.2, 0.4, 0.6],
        ratios=[0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.6, 0.8],
        grid_seeds=[0, 1, 2],
        # a cap the stopping rule should end first: ns = 2048 models learn at half the rate of
        # ns = 512 ones (lr 3e-3/√ns)
        max_steps=100_000,
        long_steps=100_000,
        sweep_sizes=[128, 256, 512, 1024, 2048],
        sweep_seeds=[0, 1, 2],
        linear_features=512,
        rug_features=8192,
        # three seeds each, p = 0.045, nd/ns = 0.25; not 8192 yet: how many steps its models
        # need is not measured, and at 3.4 ms a model-step (a shard of three, TF32, an H200)
        # they are what could push the part past one command's 10 minutes on a lent GPU
        beyond_sizes=[4096],
        beyond_seeds=[0, 1, 2],
        # Figure 6's caption and the authors' Figure 2 script speak of ns = 8192: three seeds of
        # the headline's recipe, a part of its own (some 10 ms a step for a shard of three at
        # this size on an H200 with TF32; its steps are not measured: ns = 4096 took 7,470 to
        # 9,810)
        text_largest_sizes=[8192],
        text_largest_seeds=[0, 1, 2],
    ),
)
