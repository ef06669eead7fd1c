"""The notebook's test problems (generated data, closed-form optima): online PCA (the public code's example) and
a batch of orthogonal Procrustes problems (the "many small matrices" regime)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .method import Tensor, polar_factor, random_stiefel

__all__ = ["PCAProblem", "ProcrustesProblem"]


@dataclass
class PCAProblem:
    """Online-PCA benchmark of the public code (adapted from RSDM, Han et al. 2025), column form:
    ``f(W) = −½ tr(Wᵀ A W)`` over ``W ∈ R^{n×p}``, ``Wᵀ W = I``, with
    ``A = Q diag(scale·logspace(−log10 cond, 0, n)) Qᵀ`` (condition number ``cond``). The optimum is ``−½`` times
    the sum of the ``p`` largest eigenvalues, and the relative optimality gap is ``|f − f*| / |f*|``, as in the
    public code.

    (The public example builds ``Q D Q`` and symmetrises it, which does not keep the stated spectrum; we use
    ``Q D Qᵀ``.) Build with :meth:`generate`."""

    A: Tensor
    p: int
    f_star: float
    _A64: Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._A64 = self.A.double()

    @classmethod
    def generate(cls, n: int, p: int, cond: float = 1000.0, scale: float = 10.0, *,
                 generator: torch.Generator | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> PCAProblem:
        if not 1 <= p <= n or cond < 1:
            raise ValueError(f"need 1 <= p <= n and cond >= 1, got n={n}, p={p}, cond={cond}")
        eig = scale * torch.logspace(-math.log10(cond), 0, n, dtype=torch.float64)
        Q = random_stiefel(1, n, n, generator=generator, dtype=torch.float64)[0]
        A = (Q * eig) @ Q.T
        A = 0.5 * (A + A.T)
        f_star = -0.5 * float(eig.sort().values[-p:].sum())
        return cls(A=A.to(device=device, dtype=dtype), p=p, f_star=f_star)

    def init(self, generator: torch.Generator | None = None) -> Tensor:
        """A random feasible start, shape ``(1, n, p)`` (column-orthonormal)."""
        n = self.A.shape[0]
        return random_stiefel(1, self.p, n, rows=False, generator=generator, dtype=self.A.dtype).to(self.A.device)

    def loss(self, W: Tensor) -> Tensor:
        return -0.5 * (W * (self.A @ W)).sum()

    def grad(self, W: Tensor) -> Tensor:
        return -(self.A @ W)

    def gap(self, W: Tensor) -> float:
        """Relative optimality gap, evaluated in float64."""
        f = -0.5 * float((W.double() * (self._A64 @ W.double())).sum())
        return abs(f - self.f_star) / abs(self.f_star)


@dataclass
class ProcrustesProblem:
    """A batch of orthogonal Procrustes problems ``f(X) = ½ Σ_b ‖X_b A_b − B_b‖²_F`` over square orthogonal
    ``X_b ∈ R^{p×p}``, with ``A_b ∈ R^{p×m}`` (entries ``N(0, 1/m)``) and ``B_b = Q_b A_b + noise·E_b`` for Haar
    ``Q_b``. The optimum is the polar factor of ``B_b A_bᵀ`` (Schönemann 1966); :meth:`init` starts on its
    connected component (same determinant sign), so every method can reach it. The relative gap is
    ``(f − f*) / (f_rand − f*)`` with ``f_rand = ½ Σ_b (‖A_b‖² + ‖B_b‖²)``, the mean of ``f`` over Haar-random
    ``X``: 1 for a random guess, 0 at the optimum. Build with :meth:`generate`."""

    A: Tensor
    B: Tensor
    f_star: float
    f_rand: float
    _A64: Tensor = field(init=False, repr=False)
    _B64: Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._A64, self._B64 = self.A.double(), self.B.double()

    @classmethod
    def generate(cls, b: int, p: int, m: int, noise: float = 0.1, *, generator: torch.Generator | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> ProcrustesProblem:
        if b < 1 or p < 1 or m < 1 or noise < 0:
            raise ValueError(f"need b, p, m >= 1 and noise >= 0, got b={b}, p={p}, m={m}, noise={noise}")
        gen_device = generator.device if generator is not None else "cpu"
        kw = dict(generator=generator, dtype=torch.float64, device=gen_device)
        A = torch.randn(b, p, m, **kw) / math.sqrt(m)
        Q = random_stiefel(b, p, p, generator=generator, dtype=torch.float64)
        B = Q @ A + noise * torch.randn(b, p, m, **kw) / math.sqrt(m)
        X_star = polar_factor(B @ A.mT)
        f_star = 0.5 * float((X_star @ A - B).square().sum())
        f_rand = 0.5 * float(A.square().sum() + B.square().sum())
        return cls(A=A.to(device=device, dtype=dtype), B=B.to(device=device, dtype=dtype), f_star=f_star,
                   f_rand=f_rand)

    def init(self, generator: torch.Generator | None = None) -> Tensor:
        """A Haar-random start, shape ``(b, p, p)``, on the optimum's connected component: orthogonal matrices
        with ``det = +1`` and ``det = −1`` are two components that no continuous method crosses, so each start has
        the first row's sign flipped where its determinant differs from the optimum's."""
        b, p, _ = self.A.shape
        X = random_stiefel(b, p, p, generator=generator, dtype=torch.float64)
        A, B = self.A.double().cpu(), self.B.double().cpu()
        flip = torch.linalg.det(X).sign() != torch.linalg.det(polar_factor(B @ A.mT)).sign()
        X[flip, 0] *= -1
        return X.to(device=self.A.device, dtype=self.A.dtype)

    def loss(self, X: Tensor) -> Tensor:
        return 0.5 * (X @ self.A - self.B).square().sum()

    def grad(self, X: Tensor) -> Tensor:
        return (X @ self.A - self.B) @ self.A.mT

    def gap(self, X: Tensor) -> float:
        """Relative optimality gap, evaluated in float64."""
        f = 0.5 * float((X.double() @ self._A64 - self._B64).square().sum())
        return (f - self.f_star) / (self.f_rand - self.f_star)
