"""Instances for paper 05: a finite population of agent types (the true distribution D), random and
two-point generators. The generators are ours; the paper has no experiments.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .method import Envelope, StepCurves, Tensor, _check_types, envelope, mean_reward

__all__ = [
    "CurvePopulation", "Population", "alternating_population", "random_population", "random_types",
    "staircase_population", "staircase_types", "two_point_population",
]


def _check_probs(probs: Tensor, n_types: int) -> None:
    if probs.shape != (n_types,) or (probs < 0).any():
        raise ValueError("probs must be a non-negative vector with one entry per type")
    if not torch.isclose(probs.sum(), probs.new_tensor(1.0)):
        raise ValueError("probs must sum to 1")


class _Sampling:
    """Sampling from a finite population of reward step functions ``env`` with probabilities ``probs``."""

    env: Envelope
    probs: Tensor

    def sample_weights(self, n: int, reps: int, rng: np.random.Generator) -> Tensor:
        """Empirical type frequencies of ``reps`` independent samples of ``n`` i.i.d. types: shape ``(reps, T)``.

        Only the counts matter for EUM, so they are drawn directly (multinomial), at a cost independent of ``n``.
        """
        if n < 1 or reps < 1:
            raise ValueError(f"need n >= 1 and reps >= 1, got n={n}, reps={reps}")
        p = self.probs.detach().cpu().double().numpy()
        counts = rng.multinomial(n, p / p.sum(), size=reps)
        return torch.as_tensor(counts, dtype=self.probs.dtype, device=self.probs.device) / n

    def empirical(self, weights: Tensor) -> StepCurves:
        """Empirical mean-reward curves for the sample frequencies ``weights`` (from :meth:`sample_weights`)."""
        return mean_reward(self.env, weights)


@dataclass
class Population(_Sampling):
    """A finite population of agent types with probabilities ``probs`` (the "true" distribution D)."""

    R: Tensor
    c: Tensor
    probs: Tensor

    def __post_init__(self) -> None:
        _check_types(self.R, self.c)
        _check_probs(self.probs, self.R.shape[0])
        self.env = envelope(self.R, self.c)
        self.truth = mean_reward(self.env, self.probs[None, :])


@dataclass
class CurvePopulation(_Sampling):
    """A finite population of arbitrary right-continuous reward step functions of α (``env``), not necessarily
    the best responses of any agent: the control of notebook 05's claim C7, whose rewards need not be monotone.
    EUM, the sup deviation and :func:`~repro.papers.contracts.run_trials` work on it unchanged."""

    env: Envelope
    probs: Tensor

    def __post_init__(self) -> None:
        _check_probs(self.probs, self.env.rewards.shape[0])
        self.truth = mean_reward(self.env, self.probs[None, :])


def random_types(n_types: int, n_actions: int, n_outcomes: int = 10, *, rng: np.random.Generator,
                 concentration: float = 0.5, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """Random agent types ``(R, c)`` of shape ``(n_types, n_actions)``; action 0 is the null action (R = c = 0).

    Outcome rewards ``r`` are sorted uniforms on [0, 1], drawn once; each action's outcome distribution is
    ``Dirichlet(concentration)`` over ``n_outcomes`` outcomes, so ``R_i = ⟨F_i, r⟩``. Costs are
    ``c_i = s · R_i² · U(0.5, 1.5)`` with a per-type scale ``s ~ U(0.3, 2.5)``: costs convex in the reward
    give envelopes with several pieces inside [0, 1] (degenerate instances would make every check trivial).
    This generator is ours; the paper has no experiments.
    """
    if n_types < 1 or n_actions < 1 or n_outcomes < 1:
        raise ValueError("n_types, n_actions and n_outcomes must be positive")
    r = np.sort(rng.uniform(0, 1, n_outcomes))
    F = rng.dirichlet(np.full(n_outcomes, concentration), size=(n_types, n_actions))
    R = F @ r
    s = rng.uniform(0.3, 2.5, size=(n_types, 1))
    c = s * R**2 * rng.uniform(0.5, 1.5, size=R.shape)
    R[:, 0] = 0.0
    c[:, 0] = 0.0
    return (torch.as_tensor(R, dtype=dtype, device=device), torch.as_tensor(c, dtype=dtype, device=device))


def random_population(n_types: int, n_actions: int, n_outcomes: int = 10, *, rng: np.random.Generator,
                      device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64) -> Population:
    """A finite population of ``n_types`` random types with random (Dirichlet(1)) probabilities."""
    R, c = random_types(n_types, n_actions, n_outcomes, rng=rng, device=device, dtype=dtype)
    probs = torch.as_tensor(rng.dirichlet(np.ones(n_types)), dtype=dtype, device=device)
    return Population(R=R, c=c, probs=probs / probs.sum())


def two_point_population(eta: float, *, device: torch.device | str = "cpu",
                         dtype: torch.dtype = torch.float64) -> Population:
    """A hard instance in the spirit of the lower bound of Dütting et al. (2025): two types that both have one
    action with reward 1, costing 1/4 (type A) or 3/4 (type B); ``P(A) = 1/3 + eta``.

    Then ``u(1/4) = 3/4 · P(A)`` and ``u(3/4) = 1/4``, so the optimal contract is 1/4 for ``eta > 0`` and the
    wrong one costs ``ε = 3/4 · |eta|``. EUM errs exactly when the sample frequency of A falls below 1/3 (a tie
    goes to the smaller contract), a binomial tail that needs ``N ≍ ln(1/δ)/eta²`` samples to push below δ.
    """
    if not -1 / 3 < eta < 2 / 3:
        raise ValueError(f"eta must lie in (-1/3, 2/3), got {eta}")
    R = torch.tensor([[0.0, 1.0], [0.0, 1.0]], dtype=dtype, device=device)
    c = torch.tensor([[0.0, 0.25], [0.0, 0.75]], dtype=dtype, device=device)
    probs = torch.tensor([1 / 3 + eta, 2 / 3 - eta], dtype=dtype, device=device)
    return Population(R=R, c=c, probs=probs)


def staircase_types(n_types: int, n_actions: int, *, rng: np.random.Generator, concentration: float = 0.1,
                    spread: float = 1.0, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """Types that use every action: ``(R, c)`` of shape ``(n_types, n_actions)`` whose best-response envelope has
    exactly ``n_actions − 1`` breakpoints, at sorted uniforms in ``[0, spread)``, with reward jumps
    ``Dirichlet(concentration)`` summing to 1 (action 0 is the null action, the last one earns reward 1).

    Built for the question "can the number of actions matter?": each type is as rich as ``k`` actions allow.
    Small ``concentration`` makes one jump dominate (a near 0/1 step, the largest variance a monotone reward can
    have); large ``concentration`` spreads the reward over many small steps. Costs follow from the breakpoints:
    the switch from action ``i − 1`` to ``i`` happens where ``α R_{i−1} − c_{i−1} = α R_i − c_i``, so
    ``c_i = c_{i−1} + b_i (R_i − R_{i−1})`` (convex in the reward because the ``b_i`` increase). This generator is
    ours; the paper has no experiments.
    """
    if n_types < 1 or n_actions < 2:
        raise ValueError("need n_types >= 1 and n_actions >= 2 (a null action and at least one other)")
    if not concentration > 0 or not 0 < spread <= 1:
        raise ValueError(f"need concentration > 0 and spread in (0, 1], got {concentration}, {spread}")
    k = n_actions
    b = np.sort(rng.uniform(0, spread, size=(n_types, k - 1)), axis=1)
    jumps = rng.dirichlet(np.full(k - 1, concentration), size=n_types) if k > 2 else np.ones((n_types, 1))
    R = np.concatenate([np.zeros((n_types, 1)), np.cumsum(jumps, axis=1)], axis=1)
    R[:, -1] = 1.0                                   # the cumulative sum, without its rounding
    c = np.concatenate([np.zeros((n_types, 1)), np.cumsum(b * np.diff(R, axis=1), axis=1)], axis=1)
    return (torch.as_tensor(np.clip(R, 0, 1), dtype=dtype, device=device),
            torch.as_tensor(c, dtype=dtype, device=device))


def staircase_population(n_types: int, n_actions: int, *, rng: np.random.Generator, concentration: float = 0.1,
                         spread: float = 1.0, device: torch.device | str = "cpu",
                         dtype: torch.dtype = torch.float64) -> Population:
    """A uniform population of :func:`staircase_types`."""
    R, c = staircase_types(n_types, n_actions, rng=rng, concentration=concentration, spread=spread, device=device,
                           dtype=dtype)
    return Population(R=R, c=c, probs=torch.full((n_types,), 1.0 / n_types, dtype=dtype, device=device))


def alternating_population(n_types: int, n_actions: int, *, rng: np.random.Generator, spread: float = 1.0,
                           device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64
                           ) -> CurvePopulation:
    """The control of the number-of-actions test: ``n_types`` uniform types with ``n_actions − 1`` switches at
    sorted uniforms in ``[0, spread)`` (as :func:`staircase_types`), whose reward *alternates* between 0 and 1 at
    every switch (random phase per type) instead of climbing.

    No agent behaves like this: a best response's reward is non-decreasing in α, the property the paper's proof
    rests on. Without it, the sup deviation over α of ``k``-piece step functions can grow with ``k`` (more
    nearly independent pieces to take the sup over), so a test that cannot tell this population from the
    staircases cannot see the paper's point.
    """
    if n_types < 1 or n_actions < 2 or not 0 < spread <= 1:
        raise ValueError("need n_types >= 1, n_actions >= 2 and spread in (0, 1]")
    breaks = np.sort(rng.uniform(0, spread, size=(n_types, n_actions - 1)), axis=1)
    phase = rng.integers(0, 2, size=(n_types, 1))
    levels = (np.arange(n_actions)[None, :] + phase) % 2
    env = Envelope(breaks=torch.as_tensor(breaks, dtype=dtype, device=device),
                   rewards=torch.as_tensor(levels, dtype=dtype, device=device),
                   actions=torch.arange(n_actions, device=device).expand(n_types, -1).contiguous())
    return CurvePopulation(env=env, probs=torch.full((n_types,), 1.0 / n_types, dtype=dtype, device=device))

