"""GAM, the Generalized Action Manifold, on a planar analogue: arc-length and Sim(2) factorisation of trajectories.

Paper: H. Lyu, C. Chen, M. Cao, Y. Ji, C. Xu, "General Covariant Action Modeling: Constructing Generalized Manifolds
via Spatio-Temporal Decoupling", ICML 2026 (arXiv 2606.00110). Notebook: ``notebooks/13-gam-action-manifold.ipynb``.

Quick start::

    >>> import torch
    >>> from repro.papers import action_manifold as gam
    >>> data = gam.make_skill_dataset(5, rng=0, dtype=torch.float64)  # 6 skills × 5 demos: random pose, speed, noise
    >>> W, xi, u, L = gam.factorize(data.x, 32)  # schema W (canonical path), pose ξ = log g ∈ sim(2), timing u
    >>> g = gam.sim2_exp(torch.tensor([1.0, -2.0, 0.7, 0.3], dtype=torch.float64))  # move, rotate and scale ...
    >>> W2, xi2, u2, L2 = gam.factorize(gam.sim2_act(g, data.x), 32)  # ... every demonstration, then factorise
    >>> print(data.x.shape, float((W2 - W).abs().max()) < 1e-9, float((u2 - u).abs().max()) < 1e-9)  # invariant
    torch.Size([30, 50, 2]) True True
    >>> print(float((gam.compose(W, xi, u) - data.x).norm(dim=-1).max()) < 0.05)  # x(t) = exp(ξ)·W(u(t))
    True

The paper argues that policies regressing absolute coordinates entangle a task's geometry with one placement and one
speed, and factorises trajectories along two invariances: an *Arc-Length Parameterizer* (path apart from timing) and
a *Schema-Affine-Factorization* (a canonical "world line" in a pose-normalised frame, the *schema*, apart from the
group element that places it, the *affine modulation*), inside a VLA evaluated on LIBERO and SimplerEnv.

**Public code checked against: none.** No code was released and only the abstract is public; the equations here are
the standard ones the abstract names (arc-length reparameterisation; Sim(2) with its closed-form exp/log), marked
*inferred* in the spec, and tested against scipy's ``expm``/``logm`` and analytic answers.

Deliberate deviations (all forced by the missing VLA, simulator and data):

* A **planar analogue** of the VLA setting: six generated 2-D skills whose shapes vary continuously per demonstration
  (a shape parameter ``a``: arc height, zigzag amplitude, ...); the "language" input is a skill token with ``a``, the
  "vision" input is the (start, goal) pair; planar Sim(2) instead of 3-D end-effector poses.
* GAM-lite's frame is analytic (the start → goal chord), so its rotation equivariance holds *by construction*; the
  notebook says so, adds a learned equivariant frame (:class:`~.models.GAMEq`), feeds noisy poses, and holds every
  learned schema against the no-learning lookup of the training demos (:class:`~.models.SchemaLookup`).
* Training uses full batches up to 96 demonstrations and random batches of 96 above (equal work per step).

Layout: :mod:`.method` (arc length, retiming, Sim(2) exp/log/act, canonical frame, factorize/compose, Fréchet),
:mod:`.problems` (skills and their shape parameter, warps, :func:`make_skill_dataset`), :mod:`.models` (the 2×2
ablation, the learned equivariant frame, the lookup controls and :func:`train`), :mod:`.experiment` (the notebook's
harness).
"""

from .experiment import *
from .method import *
from .models import *
from .problems import *

__all__ = [*experiment.__all__, *method.__all__, *models.__all__, *problems.__all__]
