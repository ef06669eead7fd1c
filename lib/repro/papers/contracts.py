"""Linear contracts and Empirical Utility Maximization (EUM).

Paper: M. M. Høgsgaard, "The Optimal Sample Complexity of Linear Contracts", ICML 2026 (arXiv 2601.01496).
Notebook: ``notebooks/05-linear-contracts.ipynb``.

Model. An agent type is, for each action ``i``, an expected reward ``R_i ∈ [0, 1]`` (the outcome distribution
``F_i`` integrated against the principal's rewards) and a cost ``c_i ≥ 0``. Under the linear contract
``α ∈ [0, 1]`` the agent earns ``α R_i − c_i`` and best-responds, ties broken in favour of the principal
(the highest ``R_i``). The principal's utility is ``u_θ(α) = (1 − α) R_{i*(α)}`` and the objective is
``u(α) = E_θ u_θ(α)``. EUM returns ``argmax_α (1/N) Σ_j u_{θ_j}(α)``; the paper proves that
``N = O(ln(1/δ)/ε²)`` samples make EUM ε-optimal and, more strongly, ``sup_α |û(α) − u(α)| ≤ ε``
(uniform convergence), with no dependence on the number of actions.

Exact computation (what makes the experiments free of grid error):

* ``R_{i*(α)}`` is a non-decreasing, right-continuous step function: the upper envelope of the lines
  ``α R_i − c_i`` has at most ``k − 1`` breakpoints (:func:`envelope`, a vectorised walk along the envelope).
* A weighted mean of such step functions is again a step function, whose jumps are the union of all
  breakpoints (:func:`mean_reward`). On each piece ``[b_i, b_{i+1})`` the utility ``(1 − α) L_i`` is
  linear and decreasing, so its maximum over the piece is at the left end ``b_i``, where it is attained.
  Hence EUM is a scan over ``{0} ∪ breakpoints`` (:meth:`StepCurves.eum`), and the sup of
  ``|û − u| = (1 − α) |L̂_i − L_i|`` over the piece is also at ``b_i`` (:func:`sup_deviation`):
  both are exact, with no grid.

Everything is batched torch: many types, many weightings (Monte-Carlo repetitions) at once, on any device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

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


# --------------------------------------------------------------------------------------------------------
# Instances


@dataclass
class Population:
    """A finite population of agent types with probabilities ``probs`` (the "true" distribution D)."""

    R: Tensor
    c: Tensor
    probs: Tensor

    def __post_init__(self) -> None:
        _check_types(self.R, self.c)
        if self.probs.shape != (self.R.shape[0],) or (self.probs < 0).any():
            raise ValueError("probs must be a non-negative vector with one entry per type")
        if not torch.isclose(self.probs.sum(), self.probs.new_tensor(1.0)):
            raise ValueError("probs must sum to 1")
        self.env = envelope(self.R, self.c)
        self.truth = mean_reward(self.env, self.probs[None, :])

    def sample_weights(self, n: int, reps: int, rng: np.random.Generator) -> Tensor:
        """Empirical type frequencies of ``reps`` independent samples of ``n`` i.i.d. types: shape ``(reps, T)``.

        Only the counts matter for EUM, so they are drawn directly (multinomial), at a cost independent of ``n``.
        """
        if n < 1 or reps < 1:
            raise ValueError(f"need n >= 1 and reps >= 1, got n={n}, reps={reps}")
        p = self.probs.detach().cpu().double().numpy()
        counts = rng.multinomial(n, p / p.sum(), size=reps)
        return torch.as_tensor(counts, dtype=self.R.dtype, device=self.R.device) / n

    def empirical(self, weights: Tensor) -> StepCurves:
        """Empirical mean-reward curves for the sample frequencies ``weights`` (from :meth:`sample_weights`)."""
        return mean_reward(self.env, weights)


@dataclass
class Trials:
    """Per-repetition outcomes of EUM on ``reps`` samples of size ``n``: sup deviation, EUM contract,
    its suboptimality ``u(α*) − u(α̂)``, and the optimal contract ``α*``."""

    n: int
    sup_dev: Tensor
    alpha_hat: Tensor
    subopt: Tensor
    alpha_star: float


def run_trials(pop: Population, n: int, reps: int, rng: np.random.Generator, chunk: int = 0) -> Trials:
    """Draw ``reps`` samples of ``n`` types, run EUM on each and measure it exactly against the population.

    ``chunk`` bounds the repetitions handled at once (memory ~ chunk × breakpoints); 0 picks a size for ~2e7
    entries.
    """
    P = int(torch.isfinite(pop.env.breaks).sum()) + 1
    chunk = chunk or max(1, int(2e7 // P))
    a_star, u_star = pop.truth.eum()
    sup, a_hat, sub = [], [], []
    for start in range(0, reps, chunk):
        w = pop.sample_weights(n, min(chunk, reps - start), rng)
        emp = pop.empirical(w)
        dev, _ = sup_deviation(emp, pop.truth)
        ah, _ = emp.eum()
        sup.append(dev)
        a_hat.append(ah)
        sub.append(u_star - pop.truth.utility_grid(ah)[0])
    return Trials(n=n, sup_dev=torch.cat(sup), alpha_hat=torch.cat(a_hat), subopt=torch.cat(sub),
                  alpha_star=float(a_star[0]))


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
