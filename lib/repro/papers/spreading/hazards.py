"""Holding-time laws of the renewal SIR process: hazard ``h(t)``, cumulative hazard ``H(t) = -ln S(t)``, survival
and density, in torch (float64), plus NumPy samplers for the EoN reference and the per-step recovery table of the
tau-leap engine.

A node that became infectious ``a`` time units ago recovers at rate ``h(a)`` (a renewal process: its clock restarts
when it changes state). The Markov (memoryless) special case is the exponential law, whose hazard is constant.
The forms follow FlashSpread (``flashspread/models/hazards.py``, the simulator the paper trains in), written here in
our own words:

* Weibull(k, λ): ``h(t) = (k/λ)(t/λ)^{k-1}``, ``H(t) = (t/λ)^k``.
* log-normal(μ, σ): ``h(t) = √(2/π) / (t σ erfcx(z))`` with ``z = (ln t − μ)/(σ√2)``; the scaled complementary
  error function keeps the ratio ``pdf/S`` finite far in the tail, where ``pdf`` and ``S`` both underflow.
* gamma(a, θ): ``S(t) = Q(a, t/θ)`` (regularised upper incomplete gamma), ``h = pdf / S``, in log space.

:func:`period_survival` turns a law into the distribution of the number of tau-leap steps ``D`` a node stays
infectious, ``P(D > k)``. The "exact" rule recovers with probability ``1 − S(a+dt)/S(a)`` in the step from age ``a``
(the survival ratio, so ``P(D > k) = S(k·dt)`` exactly); the "hazard" rule is FlashSpread's first-order
``1 − exp(−h(a)·dt)``, biased by O(dt).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["Exponential", "Gamma", "Law", "LogNormal", "Weibull", "period_survival"]

RULES = ("exact", "hazard")
_F64 = torch.float64


def _t(t: Tensor | float | np.ndarray) -> Tensor:
    t = torch.as_tensor(t, dtype=_F64)
    if torch.isnan(t).any():
        raise ValueError("holding-time law evaluated at NaN")
    if (t < 0).any():
        raise ValueError("holding-time law evaluated at a negative age")
    return t


def _positive(name: str, **values: float) -> None:
    for k, v in values.items():
        if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name}: {k} must be a finite positive number, got {v!r}")


class Law:
    """A holding-time law on ``[0, ∞)``. Subclasses give :meth:`hazard` and :meth:`cumulative_hazard` (torch,
    float64, any device of ``t``), :attr:`mean` and a NumPy :meth:`sample`."""

    name = "law"

    def hazard(self, t: Tensor | float) -> Tensor:
        raise NotImplementedError

    def cumulative_hazard(self, t: Tensor | float) -> Tensor:
        raise NotImplementedError

    def survival(self, t: Tensor | float) -> Tensor:
        """``S(t) = exp(−H(t))``, the probability that the holding time exceeds ``t``."""
        return torch.exp(-self.cumulative_hazard(t))

    def pdf(self, t: Tensor | float) -> Tensor:
        """``f(t) = h(t) S(t)``."""
        return self.hazard(t) * self.survival(t)

    @property
    def mean(self) -> float:
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...] | None = None) -> np.ndarray | float:
        raise NotImplementedError

    def markov(self) -> Exponential:
        """The exponential law with the same mean: the Markovian simplification the paper compares against."""
        return Exponential(1.0 / self.mean)


@dataclass(frozen=True)
class Exponential(Law):
    """Constant hazard ``rate``: the Markov SIR model (recovery rate γ)."""

    rate: float
    name = "exponential"

    def __post_init__(self) -> None:
        _positive("Exponential", rate=self.rate)

    def hazard(self, t: Tensor | float) -> Tensor:
        return torch.full_like(_t(t), self.rate)

    def cumulative_hazard(self, t: Tensor | float) -> Tensor:
        return self.rate * _t(t)

    @property
    def mean(self) -> float:
        return 1.0 / self.rate

    def sample(self, rng: np.random.Generator, size=None):
        return rng.exponential(1.0 / self.rate, size)


@dataclass(frozen=True)
class Weibull(Law):
    """Weibull law, shape ``k`` and scale ``lam``; ``k > 1`` gives a rising hazard (ageing infections)."""

    shape: float
    scale: float
    name = "weibull"

    def __post_init__(self) -> None:
        _positive("Weibull", shape=self.shape, scale=self.scale)

    def hazard(self, t: Tensor | float) -> Tensor:
        x = _t(t) / self.scale
        return (self.shape / self.scale) * x.pow(self.shape - 1.0)

    def cumulative_hazard(self, t: Tensor | float) -> Tensor:
        return (_t(t) / self.scale).pow(self.shape)

    @property
    def mean(self) -> float:
        return self.scale * math.gamma(1.0 + 1.0 / self.shape)

    def sample(self, rng: np.random.Generator, size=None):
        return self.scale * rng.weibull(self.shape, size)


@dataclass(frozen=True)
class LogNormal(Law):
    """Log-normal law: ``ln T ~ N(mu, sigma²)``."""

    mu: float
    sigma: float
    name = "lognormal"

    def __post_init__(self) -> None:
        if not math.isfinite(self.mu):
            raise ValueError(f"LogNormal: mu must be finite, got {self.mu!r}")
        _positive("LogNormal", sigma=self.sigma)

    def _z(self, t: Tensor) -> Tensor:
        return (torch.log(t) - self.mu) / (self.sigma * math.sqrt(2.0))

    def hazard(self, t: Tensor | float) -> Tensor:
        t = _t(t)
        z = self._z(t)
        # h = pdf/S = sqrt(2/pi) / (t sigma erfcx(z)); at t = 0, erfcx(-inf) = inf gives h = 0.
        h = math.sqrt(2.0 / math.pi) / (t * self.sigma * torch.special.erfcx(z))
        return torch.where(t > 0, h, torch.zeros_like(t))

    def cumulative_hazard(self, t: Tensor | float) -> Tensor:
        z = self._z(_t(t))
        # -ln S with S = erfc(z)/2; for z > 0 use erfc(z) = erfcx(z) exp(-z^2) so the tail never underflows.
        tail = -(math.log(0.5) + torch.log(torch.special.erfcx(z.clamp(min=0.0))) - z.clamp(min=0.0) ** 2)
        body = -torch.log(0.5 * torch.special.erfc(z.clamp(max=0.0)))
        return torch.where(z > 0, tail, body)

    @property
    def mean(self) -> float:
        return math.exp(self.mu + 0.5 * self.sigma**2)

    def sample(self, rng: np.random.Generator, size=None):
        return rng.lognormal(self.mu, self.sigma, size)


@dataclass(frozen=True)
class Gamma(Law):
    """Gamma law, shape ``a`` and scale ``theta``."""

    shape: float
    scale: float
    name = "gamma"

    def __post_init__(self) -> None:
        _positive("Gamma", shape=self.shape, scale=self.scale)

    def _log_pdf(self, t: Tensor) -> Tensor:
        a, x = self.shape, t / self.scale
        return (a - 1.0) * torch.log(x) - x - math.lgamma(a) - math.log(self.scale)

    def cumulative_hazard(self, t: Tensor | float) -> Tensor:
        t = _t(t)
        return -torch.log(torch.special.gammaincc(torch.full_like(t, self.shape), t / self.scale))

    def hazard(self, t: Tensor | float) -> Tensor:
        t = _t(t)
        # h = pdf / S in log space (S = Q(a, t/theta) underflows only beyond ~700 scales).
        h = torch.exp(self._log_pdf(t) + self.cumulative_hazard(t))
        at0 = torch.full_like(t, math.inf if self.shape < 1 else (1.0 / self.scale if self.shape == 1 else 0.0))
        return torch.where(t > 0, h, at0)

    @property
    def mean(self) -> float:
        return self.shape * self.scale

    def sample(self, rng: np.random.Generator, size=None):
        return rng.gamma(self.shape, self.scale, size)


def period_survival(law: Law, dt: float, rule: str = "exact", *, tol: float = 1e-12,
                    max_steps: int = 200_000) -> Tensor:
    """``P(D > k)`` for ``k = 0, 1, ..., L`` (float64), where ``D`` is the number of tau-leap steps of length ``dt``
    a node stays infectious.

    ``rule="exact"``: in the step from age ``a`` the node recovers with probability ``1 − S(a+dt)/S(a)``, so the
    product telescopes to ``P(D > k) = S(k·dt)``. ``rule="hazard"``: FlashSpread's ``1 − exp(−h(a)·dt)``, so
    ``P(D > k) = exp(−dt Σ_{j<k} h(j·dt))``. The table stops at the first ``k`` with ``P(D > k) < tol`` (or at
    ``max_steps``), where the remaining mass is put: ``P(D > L) = 0``.
    """
    if rule not in RULES:
        raise ValueError(f"unknown recovery rule {rule!r}; use one of {RULES}")
    _positive("period_survival", dt=dt)
    out: list[Tensor] = []
    start, chunk, log_acc = 0, 4096, 0.0
    while start <= max_steps:
        k = torch.arange(start, min(start + chunk, max_steps + 1), dtype=_F64)
        if rule == "exact":
            surv = law.survival(k * dt)
        else:
            h = law.hazard(k * dt).nan_to_num(posinf=1e300)
            logs = log_acc - dt * torch.cumsum(torch.cat([torch.zeros(1, dtype=_F64), h[:-1]]), 0)
            log_acc = float(logs[-1] - dt * h[-1])
            surv = torch.exp(logs)
        out.append(surv)
        if bool((surv < tol).any()):
            break
        start += chunk
    surv = torch.cat(out)
    below = torch.nonzero(surv < tol)
    last = int(below[0]) if len(below) else len(surv) - 1
    surv = surv[: last + 1].clone()
    surv[0] = 1.0
    surv[last] = 0.0
    return surv
