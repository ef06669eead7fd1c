"""Exact envelopes, step curves, EUM and the sup deviation for linear contracts (paper 05).

See :mod:`repro.papers.contracts` for the model and why everything here is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Envelope", "StepCurves", "envelope", "mean_reward", "sup_deviation"]

Tensor = torch.Tensor


def _check_types(R: Tensor, c: Tensor) -> None:
    if R.ndim != 2 or R.shape != c.shape:
        raise ValueError(f"R and c must both have shape (types, actions); got {tuple(R.shape)}, {tuple(c.shape)}")
    if R.shape[0] == 0 or R.shape[1] == 0:
        raise ValueError("need at least one type and one action")
    if not (torch.isfinite(R).all() and torch.isfinite(c).all()):
        raise ValueError("R and c must be finite")
    if (R < 0).any() or (R > 1).any():
        raise ValueError("expected rewards R must lie in [0, 1]")
    if (c < 0).any():
        raise ValueError("costs c must be non-negative")


def _lex_argmax(primary: Tensor, secondary: Tensor, mask: Tensor | None = None) -> Tensor:
    """Row-wise argmax of ``primary``, ties broken by the largest ``secondary`` (entries outside ``mask``
    are excluded)."""
    neg_inf = torch.tensor(float("-inf"), dtype=primary.dtype, device=primary.device)
    p = primary if mask is None else torch.where(mask, primary, neg_inf)
    top = p.max(dim=1, keepdim=True).values
    tie = p == top
    return torch.where(tie, secondary, neg_inf).argmax(dim=1)


@dataclass
class Envelope:
    """Each type's best-response reward as a right-continuous step function of α on [0, 1].

    ``breaks[t]`` (sorted, padded with +inf to ``k − 1``) are the contracts at which type ``t`` switches
    action; ``rewards[t, j]`` is its expected reward ``R_{i*(α)}`` on the j-th piece (piece 0 starts at α = 0;
    padding repeats the last reward). ``actions`` are the chosen action indices, same layout.
    """

    breaks: Tensor
    rewards: Tensor
    actions: Tensor

    @property
    def n_breaks(self) -> Tensor:
        """Number of breakpoints in [0, 1] per type."""
        return torch.isfinite(self.breaks).sum(dim=1)

    def reward(self, alpha: Tensor) -> Tensor:
        """``R_{i*(α)}`` for every type (rows) at every contract in ``alpha`` (columns)."""
        alpha = torch.as_tensor(alpha, dtype=self.breaks.dtype, device=self.breaks.device)
        idx = torch.searchsorted(self.breaks.contiguous(), alpha.expand(len(self.breaks), -1).contiguous(),
                                 right=True)
        return self.rewards.gather(1, idx)

    def utility(self, alpha: Tensor) -> Tensor:
        """The principal's utility ``u_θ(α) = (1 − α) R_{i*(α)}`` per type and contract."""
        alpha = torch.as_tensor(alpha, dtype=self.breaks.dtype, device=self.breaks.device)
        return (1 - alpha) * self.reward(alpha)


def envelope(R: Tensor, c: Tensor) -> Envelope:
    """Best-response envelopes of a batch of types (rows of ``R``, ``c``; shape ``(types, actions)``).

    Walks the upper envelope of the lines ``α R_i − c_i`` from α = 0: from the current action ``a`` the next
    switch is the smallest crossing ``(c_i − c_a)/(R_i − R_a)`` over actions with ``R_i > R_a``; at a tie the
    highest reward wins (the paper's principal-favouring tie-break). All types advance together, so a batch
    costs ``O(pieces × types × actions)`` tensor work.
    """
    _check_types(R, c)
    T, k = R.shape
    cur = _lex_argmax(-c, R)  # best action at α = 0, ties -> highest reward
    breaks = torch.full((T, max(k - 1, 1)), float("inf"), dtype=R.dtype, device=R.device)
    actions = cur.new_empty((T, max(k, 2)))
    actions[:, 0] = cur
    alpha = torch.zeros(T, dtype=R.dtype, device=R.device)
    inf = torch.tensor(float("inf"), dtype=R.dtype, device=R.device)
    step = 0
    for step in range(k - 1):
        Ra = R.gather(1, cur[:, None])
        ca = c.gather(1, cur[:, None])
        steeper = R > Ra
        cross = torch.where(steeper, (c - ca) / torch.where(steeper, R - Ra, 1.0), inf)
        nxt = cross.min(dim=1).values
        active = nxt <= 1
        if not active.any():
            break
        # Rounding can put a crossing a hair below the current point; the envelope never goes back.
        nxt = torch.maximum(nxt, alpha)
        new = _lex_argmax(-cross, R, mask=steeper)
        breaks[:, step] = torch.where(active, nxt, inf)
        alpha = torch.where(active, nxt, alpha)
        cur = torch.where(active, new, cur)
        actions[:, step + 1] = cur
    else:
        step = k - 1
    actions[:, step + 1:] = cur[:, None]
    actions = actions[:, :k]
    return Envelope(breaks=breaks[:, : k - 1] if k > 1 else breaks[:, :0], rewards=R.gather(1, actions),
                    actions=actions)


@dataclass
class StepCurves:
    """A batch of ``B`` mean-reward step functions sharing the breakpoints ``breaks`` (shape ``(P,)``).

    ``levels[b, i]`` is curve ``b``'s mean reward on piece ``i``: piece 0 is ``[0, breaks[0])``, piece ``i``
    is ``[breaks[i-1], breaks[i])``. The utility of curve ``b`` is ``(1 − α) × level``.
    """

    breaks: Tensor
    levels: Tensor

    @property
    def starts(self) -> Tensor:
        """Left end of every piece: ``[0, breaks...]``."""
        return torch.cat([self.breaks.new_zeros(1), self.breaks])

    def reward_grid(self, alpha: Tensor) -> Tensor:
        """Mean reward of every curve on a shared grid: shape ``(B, A)``."""
        alpha = torch.as_tensor(alpha, dtype=self.levels.dtype, device=self.levels.device)
        idx = torch.searchsorted(self.breaks, alpha.contiguous(), right=True)
        return self.levels[:, idx]

    def reward_at(self, alpha: Tensor) -> Tensor:
        """Mean reward of curve ``b`` at its own contract ``alpha[b]``: shape ``(B,)``."""
        idx = torch.searchsorted(self.breaks, alpha.contiguous(), right=True)
        return self.levels.gather(1, idx[:, None])[:, 0]

    def utility_grid(self, alpha: Tensor) -> Tensor:
        """``(1 − α) × mean reward`` for every curve on a shared grid of contracts: shape ``(B, A)``."""
        alpha = torch.as_tensor(alpha, dtype=self.levels.dtype, device=self.levels.device)
        return (1 - alpha) * self.reward_grid(alpha)

    def utility_at(self, alpha: Tensor) -> Tensor:
        """Utility of curve ``b`` at its own contract ``alpha[b]``: shape ``(B,)``."""
        return (1 - alpha) * self.reward_at(alpha)

    def eum(self) -> tuple[Tensor, Tensor]:
        """Exact maximiser of each curve's utility: ``(alpha_hat (B,), utility (B,))``.

        The utility is decreasing on every piece, so the maximum over [0, 1] is attained at a piece's left
        end; the smallest maximising contract is returned.
        """
        values = (1 - self.starts) * self.levels
        best = values.argmax(dim=1)
        return self.starts[best], values.gather(1, best[:, None])[:, 0]


def mean_reward(env: Envelope, weights: Tensor | None = None) -> StepCurves:
    """Weighted mean of the types' reward step functions, for each row of ``weights`` (shape ``(B, T)``;
    default: the uniform average, ``B = 1``). The breakpoints are the union of all types' breakpoints."""
    T = env.rewards.shape[0]
    if weights is None:
        weights = env.rewards.new_full((1, T), 1.0 / T)
    if weights.ndim != 2 or weights.shape[1] != T:
        raise ValueError(f"weights must have shape (B, {T}), got {tuple(weights.shape)}")
    finite = torch.isfinite(env.breaks)
    owner = torch.arange(T, device=env.breaks.device)[:, None].expand_as(env.breaks)[finite]
    points = env.breaks[finite]
    jumps = (env.rewards[:, 1:] - env.rewards[:, :-1])[finite]
    order = torch.argsort(points, stable=True)
    points, owner, jumps = points[order], owner[order], jumps[order]
    base = weights @ env.rewards[:, 0]
    steps = weights[:, owner] * jumps  # (B, P)
    levels = torch.cat([base[:, None], base[:, None] + torch.cumsum(steps, dim=1)], dim=1)
    return StepCurves(breaks=points.contiguous(), levels=levels)


def sup_deviation(a: StepCurves, b: StepCurves) -> tuple[Tensor, Tensor]:
    """Exact ``sup_α |u_a(α) − u_b(α)|`` over [0, 1] and where it is attained, for each pair of curves
    (broadcast over the batch). On every piece of the merged breakpoints the gap is ``(1 − α)|ΔL|``, largest at
    the piece's left end."""
    starts = torch.unique(torch.cat([a.starts, b.starts]))  # sorted, includes 0
    gap = (1 - starts) * (a.reward_grid(starts) - b.reward_grid(starts)).abs()
    best = gap.argmax(dim=1)
    return gap.gather(1, best[:, None])[:, 0], starts[best]
