"""POGO's method (Javaloy & Vergari, ICML 2026): the relative gradient, the normal correction, the fused step,
the quartic λ, the base optimisers, the :class:`POGO` optimiser, and Landing (Ablin & Peyré 2022) for comparison.
The package docstring (:mod:`repro.papers.pogo`) states the conventions and the deviations from the public code.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any

import torch

from ...common.linalg import newton_schulz5, polar
from ...common.numerics import wide_float

Tensor = torch.Tensor

__all__ = [
    "POGO", "Landing", "SGDBase", "VectorAdamBase", "MuonBase", "relative_gradient", "normal_correction",
    "pogo_update", "landing_field", "safe_step_size", "quartic_coefficients", "solve_lambda_quartic",
    "orthogonality_error", "random_stiefel", "polar_factor", "CPU_BLOCK_BYTES", "GRAM_BLOCK_ROWS", "gram",
    "gram_block_rows",
]


# ---------------------------------------------------------------------------------------------------------
# Helpers on batches of matrices


def _check_matrix(X: Tensor, name: str = "X") -> None:
    if not isinstance(X, Tensor) or X.ndim < 2:
        raise ValueError(f"{name} must be a matrix or a batch of matrices (..., p, n), got "
                         f"{tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__}")


def _eye(p: int, like: Tensor) -> Tensor:
    return torch.eye(p, dtype=like.dtype, device=like.device)


def orthogonality_error(X: Tensor) -> Tensor:
    """Distance to the Stiefel manifold of each matrix in ``X`` (``(..., p, n)``): ``‖X Xᵀ − I_p‖_F`` for wide or
    square matrices, ``‖Xᵀ X − I_n‖_F`` for tall ones. Returns a tensor of shape ``X.shape[:-2]``."""
    _check_matrix(X)
    Y = X if X.shape[-2] <= X.shape[-1] else X.mT
    gram = Y @ Y.mT
    return torch.linalg.matrix_norm(gram - _eye(Y.shape[-2], Y))


def random_stiefel(batch: int | tuple[int, ...], p: int, n: int, *, rows: bool = True,
                   generator: torch.Generator | None = None, device: torch.device | str | None = None,
                   dtype: torch.dtype = torch.float32) -> Tensor:
    """Haar-random orthonormal matrices: shape ``(*batch, p, n)`` with ``X Xᵀ = I_p`` (``rows=True``, ``p <= n``),
    else ``(*batch, n, p)`` with ``Xᵀ X = I_p``. QR of a Gaussian with the sign fix ``diag(R) > 0`` (which makes
    the factor Haar-distributed), computed in float64 and cast to ``dtype``."""
    batch = (batch,) if isinstance(batch, int) else tuple(batch)
    if p < 1 or n < 1 or any(b < 0 for b in batch):
        raise ValueError(f"sizes must be positive, got batch={batch}, p={p}, n={n}")
    if p > n:
        raise ValueError(f"need p <= n for p orthonormal vectors in R^n, got p={p}, n={n}")
    gen_device = generator.device if generator is not None else "cpu"
    Z = torch.randn(*batch, n, p, generator=generator, dtype=torch.float64, device=gen_device)
    Q, R = torch.linalg.qr(Z)
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).add(0.5).sign().unsqueeze(-2)
    Q = Q.to(device=device if device is not None else gen_device, dtype=dtype)
    return Q.mT.contiguous() if rows else Q.contiguous()


def polar_factor(X: Tensor) -> Tensor:
    """The orthonormal polar factor ``U Vᵀ`` of each matrix (``X = U S Vᵀ``, thin SVD): the closest point of the
    Stiefel manifold in Frobenius norm. Used by the "Adam + SVD projection" baseline and as a reference."""
    _check_matrix(X)
    return polar(X)


# ---------------------------------------------------------------------------------------------------------
# The two halves of a POGO step (batched, any device and dtype)


def relative_gradient(X: Tensor, G: Tensor) -> Tensor:
    """POGO's relative gradient ``R = ½ (X Xᵀ G − X Gᵀ X)`` for row-orthonormal ``X`` (``(..., p, n)``).

    On the manifold this is ``X·skew(Xᵀ G)``, half the Riemannian gradient under the canonical metric, and it is
    tangent: ``X Rᵀ + R Xᵀ = 0``. Four batched matrix products."""
    _check_matrix(X)
    if G.shape != X.shape:
        raise ValueError(f"gradient shape {tuple(G.shape)} differs from the point's {tuple(X.shape)}")
    XXt = X @ X.mT
    XGt = X @ G.mT
    return 0.5 * (XXt @ G - XGt @ X)


def normal_correction(M: Tensor, lam: float | Tensor = 0.5) -> Tensor:
    """POGO's normal step ``M + λ (M − M Mᵀ M)``; with ``λ = ½`` it is one order-1 Newton–Schulz step towards
    the polar factor of ``M`` (singular values ``s ↦ 1.5 s − 0.5 s³``). ``lam`` may be a tensor of shape
    ``M.shape[:-2]`` (one ``λ`` per matrix). Two batched matrix products."""
    _check_matrix(M, "M")
    MMtM = (M @ M.mT) @ M
    if isinstance(lam, Tensor):
        lam = lam[..., None, None]
    return (1 + lam) * M - lam * MMtM


CPU_BLOCK_BYTES = 1 << 20
"""Working-set size of one block of the fused CPU step (:func:`pogo_update`): about 1 MiB, so that a block's
matrices and its temporaries stay in a core's L2 cache (1–2 MiB on current x86 cores)."""


def _block_size(X: Tensor, block_bytes: int | None) -> int:
    """How many matrices of the ``(B, p, n)`` batch one block of the fused step takes: the whole batch off the CPU
    (a GPU wants one large launch) or when ``block_bytes`` is 0; else as many as keep the block's working set —
    ``X``, ``D``, ``M`` and the result (``p × n`` each) and the products (three ``p × p``, or two ``n × n`` and one
    ``p × p`` in the square-ish form) — within ``block_bytes``."""
    B, p, n = X.shape
    budget = CPU_BLOCK_BYTES if block_bytes is None else block_bytes
    if X.device.type != "cpu" or budget <= 0:
        return max(B, 1)
    products = 2 * n * n + p * p if _square_form(p, n) else 3 * p * p
    return max(1, min(B, budget // (X.element_size() * (4 * p * n + products))))


GRAM_BLOCK_ROWS = 64
"""Rows per block of the triangular Gram ``X Xᵀ`` (:func:`gram`) that the fused CPU step uses for ``p >= 4 ×
GRAM_BLOCK_ROWS``. Measured on one CPU thread (float32, MKL): the Gram took 0.69× the time of the full product at
512×1024 (0.5625× the FLOPs), 0.66× at 1024×4096 and 0.77–0.80× at 256×512 and 256×1024; 32 or 128 rows did no
better, and at ``p = 128`` (two blocks) nothing was gained."""


def gram(X: Tensor, block_rows: int = 0) -> Tensor:
    """The Gram matrices ``X Xᵀ`` of a batch ``(B, p, n)``. ``block_rows = r > 0`` computes only the upper block
    triangle, one product per block of ``r`` rows (block ``i`` against rows ``i·r`` onwards), and mirrors it into
    the lower one: ``p²n (1 + r/p)`` FLOPs instead of ``2p²n``, the saving of BLAS's ``syrk``, which PyTorch does not
    expose. ``block_rows = 0``: one batched product. The two agree up to the rounding of each entry's dot product
    (bit for bit with MKL, float32, at 512×1024, 256×1024 and 1024×4096)."""
    _check_matrix(X)
    if block_rows < 0:
        raise ValueError(f"block_rows must be >= 0, got {block_rows}")
    p = X.shape[-2]
    if block_rows == 0 or block_rows >= p:
        return X @ X.mT
    out = X.new_empty(*X.shape[:-1], p)
    for a in range(0, p, block_rows):
        b = min(a + block_rows, p)
        blk = X[..., a:b, :] @ X[..., a:, :].mT  # rows a..b against rows a..p: the block row right of the diagonal
        out[..., a:b, a:] = blk
        out[..., b:, a:b] = blk[..., b - a :].mT  # its mirror below the diagonal block
    return out


def gram_block_rows(p: int, device: torch.device | str = "cpu", gram_rows: int | None = None) -> int:
    """The ``block_rows`` of :func:`gram` that the fused step (:func:`pogo_update`) uses for the ``p × p`` Grams
    of matrices on ``device``: ``gram_rows`` when given, else :data:`GRAM_BLOCK_ROWS` on the CPU when ``p`` spans
    at least four blocks, else 0 (one product; off the CPU one launch is kept: not measured there)."""
    if gram_rows is not None:
        if gram_rows < 0:
            raise ValueError(f"gram_rows must be >= 0 or None, got {gram_rows}")
        return gram_rows
    return GRAM_BLOCK_ROWS if torch.device(device).type == "cpu" and p >= 4 * GRAM_BLOCK_ROWS else 0


def _square_form(p: int, n: int) -> bool:
    """Whether the relative gradient is cheaper as ``½ X (Xᵀ D − (Xᵀ D)ᵀ)`` (2 products, ``2pn²`` flops) than as
    ``½ (X Xᵀ D − X Dᵀ X)`` (4 products, ``4p²n`` flops): when ``n < 2p``, e.g. square matrices."""
    return n < 2 * p


def pogo_update(X: Tensor, D: Tensor, lr: float, lam: float | Tensor = 0.5, *, out: Tensor | None = None,
                block_bytes: int | None = None, gram_rows: int | None = None) -> Tensor:
    """One POGO step from the point ``X`` along the base direction ``D``: ``normal_correction(X − lr·R(X, D), λ)``.

    For a ``(B, p, n)`` batch and a scalar ``λ`` the step is fused into ``bmm``/``baddbmm`` calls with no other
    elementwise pass over the batch. Wide matrices (``n >= 2p``) take six products, each associated so that only
    ``p × p`` intermediates appear (never ``n × n``): the Grams ``X Xᵀ`` and ``M Mᵀ``, ``X Dᵀ``, and the three
    ``p × p`` by ``p × n`` products ``(X Xᵀ) D``, ``(X Dᵀ) X`` and ``(M Mᵀ) M``, ``12 p²n`` FLOPs. The two Grams
    are symmetric: on the CPU (``p >= 256``) only their upper block triangle is computed (:func:`gram`;
    ``gram_rows``: rows per block, 0 = one product, ``None`` = :func:`gram_block_rows`), ``10.25 p²n`` FLOPs at
    ``p = 512`` for the same step (:mod:`repro.papers.pogo.flops` counts why no product can be dropped). When
    ``n < 2p`` (square matrices) ``X Xᵀ D − X Dᵀ X = X (Xᵀ D − (Xᵀ D)ᵀ)`` by associativity: four products.
    On the CPU it runs block by block over the batch (:data:`CPU_BLOCK_BYTES`; ``block_bytes=0``: the whole batch at
    once), so that a block's temporaries stay in cache: on 10⁴ matrices of 16×16 the unblocked
    products streamed every 10 MB temporary through memory, and the time per step grew faster than the number of
    matrices. The result goes to ``out`` when given, which may be ``X`` itself (each block reads its matrices
    before it writes them)."""
    if X.ndim == 3 and D.shape == X.shape and not isinstance(lam, Tensor):
        out = torch.empty_like(X) if out is None else out
        if out.shape != X.shape:
            raise ValueError(f"out has shape {tuple(out.shape)}, the point {tuple(X.shape)}")
        square = _square_form(X.shape[-2], X.shape[-1])
        step = _block_size(X, block_bytes)
        rows = gram_block_rows(X.shape[-2], X.device, gram_rows)
        for s in range(0, X.shape[0], step):
            x, d = X[s : s + step], D[s : s + step]
            if square:
                A = torch.bmm(x.mT, d)  # Xᵀ D (n × n)
                M = torch.baddbmm(x, x, A - A.mT, alpha=-0.5 * lr)  # X − lr·½ X (Xᵀ D − Dᵀ X)
            else:
                XDt = torch.bmm(x, d.mT)  # X Dᵀ (p × p)
                M = torch.baddbmm(x, gram(x, rows), d, alpha=-0.5 * lr)  # X − lr·½ (X Xᵀ) D
                M.baddbmm_(XDt, x, alpha=0.5 * lr)  # ... + lr·½ (X Dᵀ) X
            # normal correction: (1 + λ) M − λ (M Mᵀ) M, written into the block of the result
            torch.baddbmm(M, gram(M, rows), M, beta=1 + lam, alpha=-lam, out=out[s : s + step])
        return out
    X_new = normal_correction(X - lr * relative_gradient(X, D), lam)
    if out is not None:
        out.copy_(X_new)
        return out
    return X_new


def quartic_coefficients(M: Tensor, B: Tensor) -> Tensor:
    """Coefficients ``(c4, c3, c2, c1, c0)`` (last axis) of ``f(λ) = ‖(M + λB)(M + λB)ᵀ − I‖²_F`` per matrix.

    With ``A0 = M Mᵀ − I``, ``A1 = M Bᵀ + B Mᵀ``, ``A2 = B Bᵀ``: ``f = ‖A0 + λA1 + λ²A2‖²``, so
    ``c4 = ⟨A2,A2⟩``, ``c3 = 2⟨A1,A2⟩``, ``c2 = 2⟨A0,A2⟩ + ⟨A1,A1⟩``, ``c1 = 2⟨A0,A1⟩``, ``c0 = ⟨A0,A0⟩``."""
    _check_matrix(M, "M")
    A0 = M @ M.mT - _eye(M.shape[-2], M)
    MBt = M @ B.mT
    A1 = MBt + MBt.mT
    A2 = B @ B.mT

    def ip(U: Tensor, V: Tensor) -> Tensor:
        return (U * V).sum(dim=(-2, -1))

    return torch.stack([ip(A2, A2), 2 * ip(A1, A2), 2 * ip(A0, A2) + ip(A1, A1), 2 * ip(A0, A1), ip(A0, A0)], -1)


def _polyval(c: Tensor, x: Tensor) -> Tensor:
    out = torch.zeros_like(x)
    for k in range(c.shape[-1]):
        out = out * x + c[..., k : k + 1]
    return out


def solve_lambda_quartic(M: Tensor, B: Tensor, default: float = 0.5) -> Tensor:
    """The real ``λ`` (one per matrix) that minimises ``‖(M + λB)(M + λB)ᵀ − I‖²_F``, the optional adaptive λ of
    POGO. The minimiser of the quartic is a real root of its cubic derivative; the roots come from the eigenvalues
    of the companion matrix (batched, float64 where the device has it), and the candidate (real parts of the three
    roots, and ``default``) with the smallest residual wins, so the result is never worse than ``λ = default``.
    Where ``B = 0`` (``M`` already orthonormal) ``λ = default``."""
    # f(λ) = c4 λ⁴ + c3 λ³ + c2 λ² + c1 λ + c0 ≥ 0, per matrix of the batch (last axis: c4 ... c0)
    c = quartic_coefficients(M, B)
    # the roots are found in float64 (MPS has none: float32 there), whatever the parameter's dtype
    work = wide_float(c.device)
    c = c.to(work)
    # divide f by its largest coefficient: the same minimiser, and no overflow in λ⁴ for large matrices
    scale = c.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(work).tiny)
    c = c / scale
    # f'(λ) = 4c4 λ³ + 3c3 λ² + 2c2 λ + c1; c4 = ‖B Bᵀ‖² is 0 only when B = 0 (then f does not depend on λ)
    lead = 4 * c[..., 0]
    ok = lead > 1e-12
    safe_lead = torch.where(ok, lead, torch.ones_like(lead))
    # the monic cubic λ³ + d2 λ² + d1 λ + d0 = f'(λ) / 4c4 ...
    d = torch.stack([3 * c[..., 1], 2 * c[..., 2], c[..., 3]], -1) / safe_lead[..., None]
    # ... has its three roots as the eigenvalues of its companion matrix [[-d2, -d1, -d0], [1, 0, 0], [0, 1, 0]]
    comp = torch.zeros(*c.shape[:-1], 3, 3, dtype=work, device=c.device)
    comp[..., 0, :] = -d
    comp[..., 1, 0] = 1
    comp[..., 2, 1] = 1
    # a cubic has one or three real roots; a complex pair's real part is a harmless extra candidate
    roots = torch.linalg.eigvals(comp).real
    # candidates: the stationary points and λ = default; the global minimiser of f is among the real roots,
    # and keeping `default` makes the choice never worse than the fixed-λ step
    cand = torch.cat([roots, torch.full_like(roots[..., :1], default)], -1)
    vals = _polyval(c, cand)
    best = cand.gather(-1, vals.argmin(-1, keepdim=True)).squeeze(-1)
    # B = 0: M is already on the manifold and every λ is a minimiser; keep the default
    best = torch.where(ok, best, torch.full_like(best, default))
    return best.to(M.dtype)


# ---------------------------------------------------------------------------------------------------------
# Base optimisers: turn the Euclidean gradient of a (B, p, n) batch into a direction


class SGDBase:
    """SGD with momentum as POGO's base direction (PyTorch-style buffer ``b ← μ b + (1 − dampening) g``).

    ``public_init=True`` reproduces the public code's first step, where the buffer starts at ``g`` *before* the
    update (so the first direction is ``(1 + μ − dampening) g``); ``False`` starts it at ``g`` as PyTorch does."""

    def __init__(self, momentum: float = 0.0, nesterov: bool = False, dampening: float = 0.0,
                 public_init: bool = True):
        if momentum < 0 or not 0 <= dampening <= 1:
            raise ValueError(f"need momentum >= 0 and dampening in [0, 1], got {momentum}, {dampening}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum needs momentum > 0 and zero dampening")
        self.momentum, self.nesterov, self.dampening, self.public_init = momentum, nesterov, dampening, public_init

    def __call__(self, X: Tensor, G: Tensor, state: dict[str, Any]) -> Tensor:
        mu = self.momentum
        if mu == 0:
            return G
        if "momentum_buffer" not in state:
            if not self.public_init:
                state["momentum_buffer"] = G.clone()
                return G.add(G, alpha=mu) if self.nesterov else G.clone()
            state["momentum_buffer"] = G.clone()
        buf = state["momentum_buffer"]
        buf.mul_(mu).add_(G, alpha=1 - self.dampening)
        return G.add(buf, alpha=mu) if self.nesterov else buf

    def __repr__(self) -> str:
        return f"SGDBase(momentum={self.momentum}, nesterov={self.nesterov}, dampening={self.dampening})"


class VectorAdamBase:
    """VectorAdam as POGO's base: Adam's first moment per entry, but one second moment per *matrix* (the squared
    Frobenius norm of its gradient), so the direction ``m̂ / (√v̂ + eps)`` keeps each matrix's gradient geometry.
    Bias corrections use ``state["step"]``, which :class:`POGO` counts (starting at 1) before calling the base."""

    def __init__(self, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1) or eps < 0:
            raise ValueError(f"need betas in [0, 1) and eps >= 0, got {betas}, {eps}")
        self.betas, self.eps = betas, eps

    def __call__(self, X: Tensor, G: Tensor, state: dict[str, Any]) -> Tensor:
        b1, b2 = self.betas
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(G)
            state["exp_avg_sq"] = torch.zeros(G.shape[:-2], dtype=G.dtype, device=G.device)
        t = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.lerp_(G, 1 - b1)
        v.mul_(b2).add_(G.square().sum(dim=(-2, -1)), alpha=1 - b2)
        denom = (v / (1 - b2**t)).sqrt_().add_(self.eps)
        return m / ((1 - b1**t) * denom[..., None, None])

    def __repr__(self) -> str:
        return f"VectorAdamBase(betas={self.betas}, eps={self.eps})"


class MuonBase(SGDBase):
    """Muon as POGO's base: SGD momentum, then Muon's quintic Newton–Schulz orthogonalisation of *each* matrix's
    direction (:func:`repro.common.linalg.newton_schulz5`, ``ns_steps`` iterations)."""

    def __init__(self, momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5, public_init: bool = True):
        super().__init__(momentum=momentum, nesterov=nesterov, public_init=public_init)
        if ns_steps < 1:
            raise ValueError(f"ns_steps must be >= 1, got {ns_steps}")
        self.ns_steps = ns_steps

    def __call__(self, X: Tensor, G: Tensor, state: dict[str, Any]) -> Tensor:
        return newton_schulz5(super().__call__(X, G, state), steps=self.ns_steps)

    def __repr__(self) -> str:
        return f"MuonBase(momentum={self.momentum}, nesterov={self.nesterov}, ns_steps={self.ns_steps})"


# ---------------------------------------------------------------------------------------------------------
# Optimisers


def _as_batch(t: Tensor, rows: bool) -> Tensor:
    """View a parameter (or its gradient) ``(..., a, b)`` as a ``(B, p, n)`` batch of wide matrices."""
    flat = t.reshape(-1, *t.shape[-2:])
    return flat if rows else flat.mT


def _shares_memory(view: Tensor, param: Tensor) -> bool:
    """Whether ``view`` (a reshape of ``param``) shares its storage, i.e. the reshape did not copy."""
    return view.untyped_storage().data_ptr() == param.untyped_storage().data_ptr()


def _check_param_shape(param: Tensor, rows: bool, who: str) -> None:
    if param.ndim < 2:
        raise ValueError(f"{who} optimises matrices (..., p, n); got a parameter of shape {tuple(param.shape)}")
    a, b = param.shape[-2:]
    p, n = (a, b) if rows else (b, a)
    if p > n:
        want = "(..., p, n) with p <= n" if rows else "(..., n, p) with p <= n (rows=False)"
        raise ValueError(f"{who}: parameter of shape {tuple(param.shape)} cannot be orthonormal as {want}; "
                         f"use rows={not rows} for this orientation")
    if not param.dtype.is_floating_point:
        raise ValueError(f"{who} needs floating-point parameters, got {param.dtype}")


def _check_lr(lr: float) -> None:
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr >= 0):
        raise ValueError(f"learning rate must be a finite number >= 0, got {lr!r}")


class POGO(torch.optim.Optimizer):
    """POGO (Javaloy & Vergari, ICML 2026): ``X⁺ = M + λ (M − M Mᵀ M)``, ``M = X − lr·R(X, base(G))``.

    ``params``: tensors of row-orthonormal matrices ``(..., p, n)``, ``p <= n`` (``rows=False``: column-orthonormal
    ``(..., n, p)``), orthonormal at the first step (checked: ``check_tol`` bounds the largest
    ``‖X Xᵀ − I‖_F``; ``None`` disables the check). ``base``: :class:`SGDBase` (default, no momentum),
    :class:`VectorAdamBase` or :class:`MuonBase`. ``lambda_every = k > 0`` uses the quartic-minimising ``λ`` every
    ``k`` steps, else ``λ = ½``. Parameters with ``grad=None`` are skipped. The step is written into the
    parameter in place; on the CPU it runs in cache-sized blocks of matrices (``block_bytes``, default
    :data:`CPU_BLOCK_BYTES`; 0 = the whole batch at once) and computes the two Grams as block triangles
    (``gram_rows``: rows per block, default :func:`gram_block_rows`; 0 = one full product); see
    :func:`pogo_update`.

    **Step-size bound.** POGO never projects: the normal correction (one Newton–Schulz step) pulls ``M`` back only
    if ``M`` is close enough. On the manifold ``M Mᵀ = I + lr² R Rᵀ``, so each singular value of ``M`` is
    ``s = √(1 + lr² ρ²)`` (``ρ`` a singular value of the relative gradient ``R``, ``‖R‖₂ <= ‖D‖₂`` for the base
    direction ``D``) and the correction maps it to ``s (3 − s²) / 2``: the distance after a step is about
    ``¾ (lr ρ)⁴`` while ``lr·‖R‖₂ ≪ 1``, it is of order 1 near ``lr·‖R‖₂ = 1`` and the step collapses
    (``s = √3`` maps to 0) or blows up past ``lr·‖R‖₂ = √2``. The SGD base passes the gradient on unscaled, so a
    large gradient breaks the bound (with lr 0.1, gradients of 1e3 per entry gave a distance of 1e13 after one
    step); VectorAdam and Muon bases normalise it. Hence ``drift_tol``: after the first step and every
    ``check_every`` steps, a :class:`RuntimeWarning` names the parameter when its largest ``‖X Xᵀ − I‖_F``
    exceeds ``drift_tol`` (or is NaN); ``drift_tol=None`` turns the check off (one ``p × p`` product per checked
    step)."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], lr: float,
                 base: SGDBase | VectorAdamBase | None = None, weight_decay: float = 0.0, lambda_every: int = -1,
                 rows: bool = True, check_tol: float | None = 1e-3, block_bytes: int | None = None,
                 drift_tol: float | None = 0.1, check_every: int = 100, gram_rows: int | None = None):
        _check_lr(lr)
        if drift_tol is not None and not drift_tol > 0:
            raise ValueError(f"drift_tol must be > 0 or None, got {drift_tol}")
        if not isinstance(check_every, int) or check_every < 1:
            raise ValueError(f"check_every must be an int >= 1, got {check_every!r}")
        self.drift_tol, self.check_every = drift_tol, check_every
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        if not isinstance(lambda_every, int):
            raise ValueError(f"lambda_every must be an int (<= 0 disables it), got {lambda_every!r}")
        if check_tol is not None and check_tol <= 0:
            raise ValueError(f"check_tol must be > 0 or None, got {check_tol}")
        self.base = base if base is not None else SGDBase()
        if block_bytes is not None and block_bytes < 0:
            raise ValueError(f"block_bytes must be >= 0 or None, got {block_bytes}")
        if gram_rows is not None and gram_rows < 0:
            raise ValueError(f"gram_rows must be >= 0 or None, got {gram_rows}")
        defaults = dict(lr=lr, weight_decay=weight_decay, lambda_every=lambda_every, rows=rows, check_tol=check_tol,
                        block_bytes=block_bytes, gram_rows=gram_rows)
        super().__init__(params, defaults)
        for group in self.param_groups:
            _check_lr(group["lr"])
            for param in group["params"]:
                _check_param_shape(param, group["rows"], "POGO")

    def _check_orthonormal(self, X: Tensor, tol: float | None, where: str) -> None:
        if tol is None:
            return
        err = float(orthogonality_error(X).max()) if X.shape[0] else 0.0
        bound = max(tol, 10 * torch.finfo(X.dtype).eps * math.sqrt(X.shape[-2]))
        if not err <= bound:
            raise ValueError(
                f"POGO needs orthonormal parameters at the first step (it never projects); {where} has "
                f"max ||X X^T - I||_F = {err:.3g} > {bound:.3g}. Initialise it with repro.papers.pogo.random_stiefel, "
                f"a QR factor or the polar factor U V^T of its SVD (or pass check_tol=None).")

    def _check_drift(self, param: Tensor, rows: bool, step: int, where: str) -> None:
        """Warn when ``param`` left the manifold (see the class docstring), after step 1 and every
        ``check_every`` steps."""
        if self.drift_tol is None or not (step == 1 or step % self.check_every == 0):
            return
        X = _as_batch(param, rows)
        err = float(orthogonality_error(X).max()) if X.shape[0] else 0.0
        if not err <= self.drift_tol:
            warnings.warn(
                f"POGO: {where} is {err:.3g} from orthonormal (max ||X X^T - I||_F) after step {step}, more than "
                f"drift_tol={self.drift_tol:g}. POGO never projects: the step must keep lr * ||R||_2 well below 1 "
                "(R the relative gradient; the SGD base passes large gradients on unscaled). Lower lr, clip the "
                "gradient or use VectorAdamBase / MuonBase.", RuntimeWarning, stacklevel=5)  # past torch's wrappers

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # noqa: D102 (torch.optim.Optimizer API)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for gi, group in enumerate(self.param_groups):
            lr, wd, rows, every = group["lr"], group["weight_decay"], group["rows"], group["lambda_every"]
            fused = dict(block_bytes=group.get("block_bytes"), gram_rows=group.get("gram_rows"))
            for pi, param in enumerate(group["params"]):
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise ValueError("POGO does not support sparse gradients")
                X = _as_batch(param, rows)
                G = _as_batch(param.grad, rows)
                state = self.state[param]
                if "step" not in state:
                    _check_param_shape(param, rows, "POGO")
                    self._check_orthonormal(X, group["check_tol"], f"parameter {pi} of group {gi}")
                    state["step"] = 0
                state["step"] += 1
                if wd:
                    G = G.add(X, alpha=wd)
                D = self.base(X, G, state)
                if every > 0 and state["step"] % every == 0:
                    M = X - lr * relative_gradient(X, D)
                    X_new = normal_correction(M, solve_lambda_quartic(M, M - (M @ M.mT) @ M))
                elif _shares_memory(X, param):  # X is a view of the parameter: step it in place, block by block
                    pogo_update(X, D, lr, out=X, **fused)
                    self._check_drift(param, rows, state["step"], f"parameter {pi} of group {gi}")
                    continue
                else:
                    X_new = pogo_update(X, D, lr, **fused)
                param.copy_((X_new if rows else X_new.mT).reshape(param.shape))
                self._check_drift(param, rows, state["step"], f"parameter {pi} of group {gi}")
        return loss


def _landing_parts(X: Tensor, G: Tensor, lambda_regul: float) -> tuple[Tensor, Tensor]:
    XXt = X @ X.mT
    XGt = X @ G.mT
    field = XXt @ (0.5 * G + lambda_regul * X) - 0.5 * (XGt @ X) - lambda_regul * X
    return field, XXt


def landing_field(X: Tensor, G: Tensor, lambda_regul: float = 1.0) -> Tensor:
    """The landing field ``R + λ (X Xᵀ − I) X`` for row matrices ``(..., p, n)``, ``R = ½ (X Xᵀ G − X Gᵀ X)``
    (the row-aware relative gradient: ``skew(G Xᵀ)·X`` would vanish for PCA-type losses when ``p < n``).
    Four matrix products: ``X Xᵀ (½G + λX) − ½ (X Gᵀ) X − λX``."""
    _check_matrix(X)
    return _landing_parts(X, G, lambda_regul)[0]


def safe_step_size(d: Tensor, g: Tensor, lambda_regul: float, eps: float, reg: float = 1e-7) -> Tensor:
    """Landing's safe step (Ablin & Peyré 2022): the largest ``η`` for which the bound on the next distance to the
    manifold stays ``<= eps``, given the current distance ``d = ‖X Xᵀ − I‖_F`` and ``g = ‖landing field‖_F``:
    ``η = (β + √(β² + α·max(eps − d, 0))) / (α + reg)`` with ``α = g²``, ``β = λ d (1 − d)``, capped at ``1/(2λ)``."""
    alpha = g.square()
    beta = lambda_regul * d * (1 - d)
    eta = (beta + (beta.square() + alpha * (eps - d).clamp_min(0)).sqrt()) / (alpha + reg)
    return eta.clamp_max(1.0 / (2.0 * lambda_regul))


class Landing(torch.optim.Optimizer):
    """Landing (Ablin & Peyré 2022; Ablin et al. 2024) for row-orthonormal matrices ``(..., p, n)``, ``p <= n``
    (``rows=False`` for column ones): ``X⁺ = X − η (R + λ (X Xᵀ − I) X)`` with the row-aware relative gradient
    ``R`` (momentum, if any, on ``R``) and, when ``safe_step = ε`` is given, the per-matrix step
    ``η = min(lr, safe_step_size(...))`` that keeps ``‖X Xᵀ − I‖_F <= ε``; ``safe_step=None`` uses ``η = lr``."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], lr: float, lambda_regul: float = 1.0,
                 safe_step: float | None = 0.5, momentum: float = 0.0, weight_decay: float = 0.0, rows: bool = True):
        _check_lr(lr)
        if lambda_regul <= 0 or momentum < 0 or weight_decay < 0:
            raise ValueError("need lambda_regul > 0, momentum >= 0 and weight_decay >= 0")
        if safe_step is not None and not safe_step > 0:
            raise ValueError(f"safe_step must be > 0 or None, got {safe_step}")
        super().__init__(params, dict(lr=lr, lambda_regul=lambda_regul, safe_step=safe_step, momentum=momentum,
                                      weight_decay=weight_decay, rows=rows))
        for group in self.param_groups:
            for param in group["params"]:
                _check_param_shape(param, group["rows"], "Landing")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # noqa: D102
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lam, eps, mu, rows = group["lambda_regul"], group["safe_step"], group["momentum"], group["rows"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                X = _as_batch(param, rows)
                G = _as_batch(param.grad, rows)
                if group["weight_decay"]:
                    G = G.add(X, alpha=group["weight_decay"])
                if mu > 0:
                    XXt = X @ X.mT
                    R = 0.5 * (XXt @ G - (X @ G.mT) @ X)
                    state = self.state[param]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = R.clone()
                    else:
                        state["momentum_buffer"].mul_(mu).add_(R)
                    field = state["momentum_buffer"] + lam * (XXt @ X - X)
                else:
                    field, XXt = _landing_parts(X, G, lam)
                if eps is None:
                    eta: float | Tensor = group["lr"]
                else:
                    d = torch.linalg.matrix_norm(XXt - _eye(X.shape[-2], X))
                    g = torch.linalg.matrix_norm(field)
                    eta = safe_step_size(d, g, lam, eps).clamp_max(group["lr"])[..., None, None]
                X_new = X - eta * field
                param.copy_((X_new if rows else X_new.mT).reshape(param.shape))
        return loss
