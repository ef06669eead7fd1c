"""The momentum LMO method of paper 01: the three linear minimization oracles, the optimizer, τ-nice sampling and
its expected-smoothness (ABC) constants.

See :mod:`repro.papers.lmo` for the method family, the α convention (``β = 1 − α``) and the ABC derivation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch.optim import Optimizer

from ...common.linalg import newton_schulz5

__all__ = [
    "ABC", "LMO_NAMES", "LMOMomentum", "dual_norm", "get_lmo", "lmo_l2", "lmo_sign", "lmo_spectral",
    "momentum_direction", "tau_nice_abc", "tau_nice_indices", "tau_nice_second_moment", "tau_nice_variance_factor",
    "unit_length",
]

Tensor = torch.Tensor

# --------------------------------------------------------------------------------------------------------------
# Linear minimization oracles. ``batch_dims`` leading dimensions index independent problems (configurations);
# the norm ball lives on the remaining dimensions.
# --------------------------------------------------------------------------------------------------------------

LMO_NAMES = ("l2", "sign", "spectral", "spectral-ns5")


def _check_batch_dims(m: Tensor, batch_dims: int, need_matrix: bool = False) -> None:
    if not 0 <= batch_dims < m.ndim:
        raise ValueError(f"batch_dims must be in [0, {m.ndim - 1}] for a tensor of shape {tuple(m.shape)}, "
                         f"got {batch_dims}")
    if need_matrix and m.ndim - batch_dims != 2:
        raise ValueError(f"the spectral LMO needs matrices: shape {tuple(m.shape)} with batch_dims={batch_dims} "
                         f"leaves {m.ndim - batch_dims} dims, not 2")


def _scaled(m: Tensor, dims: tuple[int, ...]) -> Tensor:
    """``m`` divided by its largest absolute entry over ``dims`` (zero blocks stay zero): every entry lies in
    ``[−1, 1]`` and the largest is ±1, so a norm of the result neither under- nor overflows, whatever the scale of
    ``m`` (a float32 gradient of 1e-24 per entry squares to 0; one of 1e30 squares to inf)."""
    scale = m.abs().amax(dim=dims, keepdim=True)
    return m / torch.where(scale > 0, scale, torch.ones_like(scale))


def lmo_l2(m: Tensor, batch_dims: int = 0) -> Tensor:
    """ℓ2-ball LMO ``−m/‖m‖₂`` (normalized SGD); the norm runs over all dims after ``batch_dims``.
    ``m`` is scaled by its largest entry before the norm, so the result has length 1 for any finite nonzero ``m``
    (no under- or overflow at extreme gradient scales). A zero ``m`` maps to zero."""
    _check_batch_dims(m, batch_dims)
    dims = tuple(range(batch_dims, m.ndim))
    u = _scaled(m, dims)
    norm = torch.linalg.vector_norm(u, dim=dims, keepdim=True)
    return -u / torch.where(norm > 0, norm, torch.ones_like(norm))


def lmo_sign(m: Tensor, batch_dims: int = 0) -> Tensor:
    """ℓ∞-ball LMO ``−sign(m)`` (sign descent); elementwise, so ``batch_dims`` only validates the shape."""
    _check_batch_dims(m, batch_dims)
    return -torch.sign(m)


def lmo_spectral(m: Tensor, batch_dims: int = 0, method: str = "svd", steps: int = 5,
                 ns_dtype: torch.dtype | str | None = "auto") -> Tensor:
    """Spectral-norm-ball LMO ``−U Vᵀ`` for ``m = U Σ Vᵀ`` (Muon), on the last two dims.

    ``method="svd"`` is exact (``torch.linalg.svd``), over the nonzero singular values only
    (:func:`_polar_of_range`): the minimal-norm minimiser, so a zero ``m`` maps to zero as the other LMOs, Muon's
    Newton–Schulz and ``method="ns5"`` do, and a rank-deficient ``m`` adds no null-space directions (the full polar
    factor would add LAPACK's arbitrary basis of the null space, a step of ``lr·√min(rows, cols)`` for a zero
    gradient); ``method="ns5"`` is Muon's Newton–Schulz approximation
    (:func:`repro.common.linalg.newton_schulz5`) in working precision ``ns_dtype`` (``"auto"``: bfloat16 on CUDA
    as Muon does, the input's dtype elsewhere). Both are invariant to the scale of ``m``; each matrix is divided by
    its largest entry first, so that extreme scales neither under- nor overflow (Muon's ``G/(‖G‖_F + 1e-7)``
    would return ~0 for a float32 ``G`` of 1e-24 per entry, whose norm underflows).
    """
    _check_batch_dims(m, batch_dims, need_matrix=True)
    m = _scaled(m, (-2, -1))
    if method == "svd":
        return -_polar_of_range(m)
    if method == "ns5":
        if ns_dtype == "auto":
            ns_dtype = torch.bfloat16 if m.device.type == "cuda" else None
        return -newton_schulz5(m, steps=steps, dtype=ns_dtype)
    raise ValueError(f"unknown spectral LMO method {method!r}; use 'svd' or 'ns5'")


def _polar_of_range(m: Tensor) -> Tensor:
    """``U_r V_rᵀ`` over the singular values of each matrix above ``max(rows, cols)·eps·σ_max`` (NumPy's
    ``matrix_rank`` tolerance): the polar factor restricted to the range of ``m``; 0 for a zero matrix."""
    U, S, Vh = torch.linalg.svd(m, full_matrices=False)
    tol = S[..., :1] * (max(m.shape[-2:]) * torch.finfo(m.dtype).eps)
    keep = (S > tol).to(m.dtype)  # σ_max = 0 (a zero matrix) keeps nothing
    return (U * keep[..., None, :]) @ Vh


def get_lmo(name: str) -> Callable[..., Tensor]:
    """The LMO called ``name`` (one of :data:`LMO_NAMES`) as ``fn(m, batch_dims=0) -> Tensor``."""
    table: dict[str, Callable[..., Tensor]] = {
        "l2": lmo_l2, "sign": lmo_sign, "spectral": partial(lmo_spectral, method="svd"),
        "spectral-ns5": partial(lmo_spectral, method="ns5"),
    }
    if name not in table:
        raise ValueError(f"unknown LMO {name!r}; valid names are {', '.join(map(repr, LMO_NAMES))}")
    return table[name]


def dual_norm(m: Tensor, name: str, batch_dims: int = 0) -> Tensor:
    """The dual norm ``‖m‖_* = −⟨m, lmo(m)⟩`` of LMO ``name``: ℓ2, ℓ1, or nuclear (both spectral LMOs)."""
    if name not in LMO_NAMES:
        raise ValueError(f"unknown LMO {name!r}; valid names are {', '.join(map(repr, LMO_NAMES))}")
    spectral = name.startswith("spectral")
    _check_batch_dims(m, batch_dims, need_matrix=spectral)
    if spectral:
        return torch.linalg.svdvals(m).sum(-1)
    dims = tuple(range(batch_dims, m.ndim))
    return torch.linalg.vector_norm(m, ord=2 if name == "l2" else 1, dim=dims)


def unit_length(name: str, shape: Sequence[int]) -> float:
    """Euclidean (Frobenius) length of an exact LMO output for a generic ``m`` of ``shape``: 1 for ℓ2,
    ``√numel`` for sign, ``√min(rows, cols)`` for spectral. Divide a learning rate by it to compare LMOs at
    equal Euclidean step length."""
    if name == "l2":
        return 1.0
    if name == "sign":
        return math.sqrt(math.prod(shape))
    if name.startswith("spectral") and len(shape) == 2:
        return math.sqrt(min(shape))
    raise ValueError(f"unknown LMO {name!r} or wrong shape {tuple(shape)} for it")


# --------------------------------------------------------------------------------------------------------------
# The optimizer
# --------------------------------------------------------------------------------------------------------------

def momentum_direction(m: Tensor, g: Tensor, alpha: float | Tensor, nesterov: bool = False) -> Tensor:
    """Update the momentum in place, ``m ← (1 − α) m + α g`` (α: weight of the fresh gradient; PyTorch's
    β = 1 − α), and return what the LMO is applied to: ``m``, or with Nesterov ``(1 − α) m + α g``
    (Muon's ``grad.lerp(buf, β)``). ``alpha`` may be a tensor broadcasting against ``m`` (one α per config).
    Computed as a weighted sum, not as ``m + α (g − m)`` (``lerp``), whose difference overflows when ``m`` and ``g``
    are finite but near the largest float with opposite signs."""
    m.mul_(1 - alpha).add_(g * alpha)
    return m * (1 - alpha) + g * alpha if nesterov else m


class LMOMomentum(Optimizer):
    """Momentum LMO method ``m ← (1 − α) m + α g``, ``p ← p + lr · lmo(m)`` (paper's Algorithm family).

    Args:
        lr: the step length η (radius of the norm ball; the ℓ2 step has Euclidean length exactly ``lr`` for any
            finite nonzero gradient, however small or large its entries).
        alpha: weight of the FRESH gradient in ``(0, 1]`` (paper's convention). PyTorch's momentum
            coefficient is ``β = 1 − alpha``: Muon's default ``momentum=0.95`` is ``alpha=0.05``;
            ``alpha=1`` is memory-less normalized SGD / sign descent / orthogonalized SGD.
        lmo: ``"l2"``, ``"sign"``, ``"spectral"`` (exact SVD), ``"spectral-ns5"`` (Muon's Newton–Schulz), or a
            callable ``fn(m) -> direction``. The LMO acts on each parameter tensor separately; the spectral
            LMOs need ≥ 2-D parameters (higher-D ones are flattened to ``(shape[0], -1)`` as Muon does).
        nesterov: apply the LMO to ``(1 − α) m + α g`` instead of ``m``.

    The momentum starts at the first gradient (``m₀ = g₀``), so no bias correction is needed.
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float = 0.02, alpha: float = 0.1,
                 lmo: str | Callable[[Tensor], Tensor] = "l2", nesterov: bool = False):
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha (weight of the fresh gradient; PyTorch's beta = 1 - alpha) must be in (0, 1], "
                             f"got {alpha}")
        if isinstance(lmo, str):
            get_lmo(lmo)  # validates the name
        elif not callable(lmo):
            raise ValueError(f"lmo must be a name in {LMO_NAMES} or a callable, got {lmo!r}")
        super().__init__(params, dict(lr=lr, alpha=alpha, lmo=lmo, nesterov=nesterov))
        for group in self.param_groups:
            if isinstance(group["lmo"], str) and group["lmo"].startswith("spectral"):
                bad = [tuple(p.shape) for p in group["params"] if p.ndim < 2]
                if bad:
                    raise ValueError(f"the spectral LMO needs matrix parameters; got shapes {bad} (use another "
                                     "optimizer or the 'l2'/'sign' LMO for vectors)")

    @staticmethod
    def _direction(lmo: str | Callable[[Tensor], Tensor], m: Tensor) -> Tensor:
        if callable(lmo):
            return lmo(m)
        if lmo.startswith("spectral"):
            return get_lmo(lmo)(m.reshape(m.shape[0], -1)).reshape(m.shape)
        return get_lmo(lmo)(m)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "m" not in state:
                    state["m"] = p.grad.detach().clone()
                    src = state["m"]
                else:
                    src = momentum_direction(state["m"], p.grad, group["alpha"], group["nesterov"])
                p.add_(self._direction(group["lmo"], src), alpha=group["lr"])
        return loss


# --------------------------------------------------------------------------------------------------------------
# τ-nice sampling and its expected-smoothness (ABC) constants
# --------------------------------------------------------------------------------------------------------------

def _check_tau(n: int, tau: int) -> None:
    if not (isinstance(n, int | np.integer) and isinstance(tau, int | np.integer)) or not 1 <= tau <= n:
        raise ValueError(f"need integers 1 <= tau <= n, got tau={tau!r}, n={n!r}")


def tau_nice_variance_factor(n: int, tau: int) -> float:
    """``v(τ) = (n − τ)/(τ (n − 1))``: the variance of a τ-nice mean gradient is ``v`` times the per-sample
    variance ``(1/n) Σ ‖∇f_i − ∇f‖²`` (0 at ``τ = n``; 1 at ``τ = 1``)."""
    _check_tau(n, tau)
    return 0.0 if n == 1 else (n - tau) / (tau * (n - 1))


@dataclass(frozen=True)
class ABC:
    """Expected-smoothness constants: ``E‖g‖² ≤ 2A (f − f_inf) + B ‖∇f‖² + C``."""

    A: float
    B: float
    C: float


def tau_nice_abc(L: Sequence[float] | Tensor, f_inf_i: Sequence[float] | Tensor, f_inf: float, tau: int) -> ABC:
    """ABC constants of τ-nice sampling for ``f = (1/n) Σ f_i`` with ``f_i`` ``L_i``-smooth and ``f_i ≥ f_inf_i``:
    ``A = v max L_i``, ``B = 1 − v``, ``C = 2 A Δ_inf`` with ``Δ_inf = f_inf − mean(f_inf_i) ≥ 0``
    (derivation: :mod:`repro.papers.lmo`)."""
    L = np.asarray(L, dtype=float)
    f_inf_i = np.asarray(f_inf_i, dtype=float)
    if L.ndim != 1 or L.shape != f_inf_i.shape or (L < 0).any():
        raise ValueError("L and f_inf_i must be 1-D of equal length, L >= 0")
    v = tau_nice_variance_factor(len(L), tau)
    delta_inf = f_inf - float(f_inf_i.mean())
    if delta_inf < -1e-9 * max(1.0, abs(f_inf)):
        raise ValueError(f"f_inf must be >= mean(f_inf_i) (got Δ_inf = {delta_inf})")
    A = v * float(L.max())
    return ABC(A=A, B=1.0 - v, C=2 * A * max(delta_inf, 0.0))


def tau_nice_second_moment(grads: Tensor, tau: int) -> Tensor:
    """Exact ``E‖g‖²`` of the τ-nice mean of the rows of ``grads`` (shape ``(n, d)``):
    ``(1 − v) ‖mean‖² + v · mean_i ‖grads_i‖²``."""
    if grads.ndim != 2:
        raise ValueError(f"grads must have shape (n, d), got {tuple(grads.shape)}")
    v = tau_nice_variance_factor(grads.shape[0], tau)
    return (1 - v) * grads.mean(0).square().sum() + v * grads.square().sum(1).mean()


def tau_nice_indices(n: int, tau: int, size: Sequence[int], generator: torch.Generator | None = None,
                     device: torch.device | str | None = None) -> Tensor:
    """``size + (τ,)`` indices: each row a uniformly random τ-subset of ``range(n)`` (without replacement)."""
    _check_tau(n, tau)
    keys = torch.rand(*size, n, generator=generator, device=device)
    if tau == 1:
        return keys.argmax(-1, keepdim=True)
    return keys.topk(tau, dim=-1, sorted=False).indices
