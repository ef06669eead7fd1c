"""Momentum LMO optimizers (normalized SGD, sign descent, Muon) under expected smoothness (the ABC condition).

Paper: E. Shulgin, M. Awad, P. Richtárik, E. Gorbunov, "General Analysis of LMO-based Optimizers: Beyond Bounded
Variance", ICML 2026. Notebook: ``notebooks/01-lmo-momentum-abc.ipynb``. The Newton–Schulz iteration is also
POGO's Muon base (paper 19); both use :mod:`repro.common.linalg`.

Quick start::

    >>> import torch
    >>> from repro.papers import lmo
    >>> prob = lmo.matrix_regression(n=200, p=6, q=4, rank=2, noise=0.1, seed=0)  # least squares over 6×4 matrices
    >>> X = torch.zeros(6, 4, requires_grad=True)
    >>> opt = lmo.LMOMomentum([X], lr=0.05, alpha=0.1, lmo="spectral-ns5")  # Muon: Newton–Schulz LMO, β = 0.9
    >>> f0 = float(prob.excess(X.detach()))  # f(X) − f*
    >>> for _ in range(200): X.grad = prob.grad(X.detach()); opt.step()
    >>> print(round(f0, 1), float(prob.excess(X.detach())) < 0.01)
    4.7 True

The method family (one step, paper's convention)::

    m_k     = (1 − α) m_{k−1} + α g_k          α ∈ (0, 1] is the weight of the FRESH gradient (α = 1: no momentum)
    x_{k+1} = x_k + η lmo(m_k),                lmo(m) = argmin_{‖d‖ ≤ 1} ⟨m, d⟩

with ``g_k`` the mean gradient of a τ-nice mini-batch (τ indices drawn uniformly without replacement).
PyTorch's momentum coefficient is ``β = 1 − α`` (``torch.optim.SGD(momentum=β)``, Muon's ``momentum=0.95`` is
α = 0.05); "optimal momentum increases with the batch size" is a statement about α, i.e. β decreases.

The three LMOs, each with ``⟨m, lmo(m)⟩ = −‖m‖_*`` (the dual norm):

* ℓ2 ball → ``−m/‖m‖₂`` (normalized SGD with momentum), dual norm ℓ2;
* ℓ∞ ball → ``−sign(m)`` (sign descent, "Adam-like"), dual norm ℓ1;
* spectral-norm ball on matrices → ``−U Vᵀ`` for ``m = U Σ Vᵀ`` (Muon), dual norm nuclear. Muon approximates
  ``U Vᵀ`` by five steps of the quintic iteration ``X ← a X + (b A + c A²) X``, ``A = X Xᵀ``, from
  ``X₀ = G/‖G‖_F``; the public coefficients (a, b, c) = (3.4445, −4.7750, 2.0315) are tuned for speed, not
  exactness: singular values above 1.6e-3 of ‖G‖_F land in [0.68, 1.21], smaller ones fall short of it, and
  none reach 1 exactly (an inexact LMO; the band is derived in :func:`repro.common.linalg.newton_schulz5`).

The ℓ2 and spectral LMOs scale their input by its largest entry first, so that the ℓ2 step keeps its length for
any finite gradient (no under- or overflow in the norm), and the momentum is a weighted sum that cannot overflow.

Expected smoothness: ``E‖g(x)‖² ≤ 2A (f(x) − f_inf) + B ‖∇f(x)‖² + C``. For τ-nice sampling of a finite sum of
``L_i``-smooth ``f_i ≥ f_i,inf`` (derived in the notebook; cf. Khaled & Richtárik 2020) with
``v(τ) = (n − τ)/(τ (n − 1))``::

    E‖g‖² = (1 − v) ‖∇f‖² + v (1/n) Σ ‖∇f_i‖²        (exact)
    A = v max_i L_i,   B = 1 − v = n(τ − 1)/(τ(n − 1)),   C = 2 A Δ_inf,   Δ_inf = f_inf − (1/n) Σ f_i,inf.

The theorem's own constants are not public. :func:`bound_proxy` is a *proxy*: the standard bounded-variance
bound for momentum LMO methods (derived in the notebook) with the ABC-induced variance ``σ_τ² = 2 A Δ₀ + C``
plugged in; :func:`optimal_alpha_theory` and :func:`theory_sample_cost` minimise it.

Experiments: :func:`linear_regression` / :func:`matrix_regression` generate finite-sum least-squares problems and
:func:`run_grid` runs every (seed, α, learning rate) configuration of one batch size as one batched tensor
computation (any device); :func:`run_landscape`, :func:`summarize`, :func:`measured_sample_cost` and
:func:`proxy_sample_cost` are the notebook's harness.

Public code checked against: the paper's code was not available (only its abstract); Muon's Newton–Schulz
coefficients and its ``grad.lerp(buf, β)`` Nesterov form follow Keller Jordan's public Muon implementation
(github KellerJordan/Muon, ``muon.py``).
Deliberate deviations: the theory curves are our bound proxy, not the paper's theorem; the problems, sizes,
grids and the soft-argmin read-out are ours (the notebook's "Deviations and scale" lists them).

Layout: :mod:`.method` (LMOs, :class:`LMOMomentum`, τ-nice sampling and ABC constants), :mod:`.theory` (the bound
proxy), :mod:`.problems` (least squares), :mod:`.experiment` (the grid and the notebook's harness).
"""

from .experiment import *
from .method import *
from .problems import *
from .theory import *

__all__ = [*experiment.__all__, *method.__all__, *problems.__all__, *theory.__all__]
