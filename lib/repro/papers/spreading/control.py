"""Control learners: the distributional critic's loss (Truncated Quantile Critics) and the cross-entropy method.

TQC (Kuznetsov et al., ICML 2020; the paper's critic). Each of ``C`` critics outputs ``M`` quantile atoms
``z_{c,m}`` of the return at fractions ``τ_m = (2m − 1)/(2M)``. The target pools the ``C·M`` atoms of the target
critics at the next state, sorts them and **drops the top** ``d·C`` (:func:`truncate_target_atoms`): the
truncation controls overestimation. Each critic regresses on the kept targets with the quantile Huber loss
(:func:`quantile_huber_loss`)

    ρ_τ^κ(u) = |τ − 1{u < 0}| · L_κ(u) / κ,   L_κ(u) = u²/2 if |u| ≤ κ else κ(|u| − κ/2),   u = target − atom,

summed over the atoms and averaged over targets, critics and the batch (QR-DQN, Dabney et al. 2018; sb3-contrib's
``quantile_huber_loss`` is the ``κ = 1`` case). Because the atoms are quantiles, a bimodal return (extinction vs
cascade) keeps both modes, where a mean critic sits in the "valley" between them (the paper's third pathology).
Note ``κ`` sets the scale: for returns spread over much less than ``κ`` the loss is quadratic everywhere and its
minimisers are expectiles, not quantiles (:func:`fit_return_quantiles` shows it).

CEM (:func:`cem_optimize`): a Gaussian over logits, the ``elites`` best of ``population`` samples refit its mean
and standard deviation each iteration; parameters are squashed into ``[0, 1]`` by a sigmoid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...common.train import fit

__all__ = ["CEMResult", "cem_optimize", "fit_return_quantiles", "quantile_huber_loss", "truncate_target_atoms"]


def quantile_huber_loss(current: Tensor, target: Tensor, *, kappa: float = 1.0, taus: Tensor | None = None,
                        sum_over_quantiles: bool = True) -> Tensor:
    """Quantile Huber loss of atoms ``current`` (``[B, M]`` or ``[B, C, M]``) against target samples ``target``
    (``[B, T]``, or ``[B, 1, T]`` / ``[B, C, T]`` with critics). ``taus``: the atoms' fractions (default the
    midpoints ``(m + ½)/M``)."""
    if current.ndim == 3 and target.ndim == 2:
        target = target[:, None, :]
    if current.ndim not in (2, 3) or target.ndim != current.ndim:
        raise ValueError(f"current must be [B, M] or [B, C, M] and target [B, T] (or [B, 1|C, T]), got "
                         f"{tuple(current.shape)} and {tuple(target.shape)}")
    if current.shape[0] != target.shape[0]:
        raise ValueError("current and target need the same batch size")
    if not kappa > 0:
        raise ValueError(f"kappa must be positive, got {kappa!r}")
    M = current.shape[-1]
    if taus is None:
        taus = (torch.arange(M, device=current.device, dtype=current.dtype) + 0.5) / M
    taus = taus.reshape(*([1] * (current.ndim - 1)), M, 1)
    u = target.unsqueeze(-2) - current.unsqueeze(-1)  # [B, (C,) M, T]: target − atom
    au = u.abs()
    huber = torch.where(au <= kappa, 0.5 * u**2, kappa * (au - 0.5 * kappa)) / kappa
    loss = (taus - (u.detach() < 0).to(u.dtype)).abs() * huber
    return loss.sum(-2).mean() if sum_over_quantiles else loss.mean()


def truncate_target_atoms(atoms: Tensor, drop_per_net: int, n_critics: int | None = None) -> Tensor:
    """TQC's truncation: pool the atoms of all critics (``[B, C, M]``, or ``[B, C·M]`` with ``n_critics``), sort
    them and keep the lowest ``C·M − drop_per_net·C``, ``[B, kept]`` ascending."""
    if atoms.ndim == 3:
        B, C, M = atoms.shape
        pooled = atoms.reshape(B, C * M)
    elif atoms.ndim == 2 and n_critics:
        B, C = atoms.shape[0], n_critics
        if atoms.shape[1] % C:
            raise ValueError(f"{atoms.shape[1]} atoms do not split over {C} critics")
        pooled = atoms
    else:
        raise ValueError("atoms must be [B, C, M], or [B, C*M] with n_critics")
    keep = pooled.shape[1] - drop_per_net * C
    if not (isinstance(drop_per_net, int) and drop_per_net >= 0 and keep >= 1):
        raise ValueError(f"drop_per_net={drop_per_net!r} must be an int in [0, M) ({pooled.shape[1] // C} atoms)")
    return torch.sort(pooled, dim=1).values[:, :keep]


class _Atoms(nn.Module):
    def __init__(self, init: Tensor):
        super().__init__()
        self.z = nn.Parameter(init.clone())


def fit_return_quantiles(returns: Tensor, n_atoms: int = 25, *, kappa: float = 1.0, steps: int = 400,
                         lr: float = 0.02) -> Tensor:
    """The ``M`` atoms a quantile critic converges to on a sample of returns from one state: minimise the quantile
    Huber loss of the atoms against all the returns with Adam (``repro.common.train.fit``). Sorted ``[M]``."""
    r = torch.as_tensor(returns, dtype=torch.float32).reshape(1, -1)
    if r.numel() == 0 or torch.isnan(r).any():
        raise ValueError("returns must be a non-empty sample without NaN")
    model = _Atoms(torch.full((1, n_atoms), float(r.mean()), device=r.device)
                   + torch.linspace(-1e-3, 1e-3, n_atoms, device=r.device))
    fit(model, lambda i: quantile_huber_loss(model.z, r, kappa=kappa), steps, lr=lr, schedule="cosine")
    return torch.sort(model.z.detach()[0]).values


@dataclass
class CEMResult:
    """Per independent run (``[S, dim]``): the final mean squashed to ``[0, 1]`` and the best sample seen (with its
    score ``[S]``); per iteration the runs' elite mean scores, best scores and means."""

    mean: Tensor
    best: Tensor
    best_score: Tensor
    history: list[dict]


def cem_optimize(objective: Callable[[Tensor, int], Tensor], dim: int, *, runs: int = 1, iters: int = 8,
                 population: int = 16, elites: int = 4, init_mean: float | Tensor = 0.0, init_std: float = 1.5,
                 min_std: float = 0.05, generator: torch.Generator | None = None) -> CEMResult:
    """Maximise ``objective(thetas [S, P, dim] in [0, 1], iteration) -> scores [S, P]`` by the cross-entropy method
    over logits, ``S = runs`` independent optimisations batched together (one objective call per iteration): a
    diagonal Gaussian per run, refit to its ``elites`` best samples each iteration, std floored at ``min_std``."""
    if not (1 <= elites <= population) or iters < 1 or dim < 1 or runs < 1:
        raise ValueError(f"need iters, dim, runs >= 1 and 1 <= elites <= population, got iters={iters}, dim={dim}, "
                         f"runs={runs}, elites={elites}, population={population}")
    mu = torch.as_tensor(init_mean, dtype=torch.float64).expand(runs, dim).clone()
    sd = torch.full((runs, dim), float(init_std), dtype=torch.float64)
    best = torch.sigmoid(mu).clone()
    best_score = torch.full((runs,), -float("inf"), dtype=torch.float64)
    history = []
    for it in range(iters):
        z = mu[:, None, :] + sd[:, None, :] * torch.randn(runs, population, dim, generator=generator,
                                                          dtype=torch.float64)
        theta = torch.sigmoid(z)
        scores = torch.as_tensor(objective(theta, it), dtype=torch.float64).cpu()
        if scores.shape != (runs, population) or torch.isnan(scores).any():
            raise ValueError(f"objective must return [{runs}, {population}] scores without NaN")
        top = torch.topk(scores, elites, dim=1).indices  # [S, elites]
        elite_z = torch.gather(z, 1, top[:, :, None].expand(-1, -1, dim))
        top_score = scores.gather(1, top[:, :1])[:, 0]
        better = top_score > best_score
        best[better] = theta[better, top[better, 0]]
        best_score = torch.where(better, top_score, best_score)
        mu, sd = elite_z.mean(1), elite_z.std(1, unbiased=False).clamp(min=min_std)
        history.append({"iteration": it, "elite_score": scores.gather(1, top).mean(1).tolist(),
                        "best_score": top_score.tolist(), "mean": torch.sigmoid(mu).tolist()})
    return CEMResult(mean=torch.sigmoid(mu), best=best, best_score=best_score, history=history)
