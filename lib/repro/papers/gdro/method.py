"""Prompt-GDRO and Rollout-GDRO: the two adversaries of multi-adversary GDRO for GRPO, and their theory.

Paper: K. Panaganti, Z. Liang, W. Yu, H. Mi, D. Yu, "Group Distributionally Robust Optimization-Driven
Reinforcement Learning for LLM Reasoning" (arXiv 2601.19280, ICML 2026). Notebook: ``notebooks/15-grpo-gdro.ipynb``.
Checked against the authors' patch github.com/kishanpb/verl-gdro (``verl/trainer/group_dro_grpo.py``:
``PassKOnlineClassifier``, ``ClassDroExp3p.compute_weights / update_with_losses / rollout_choose_arms /
update_rollout_arm_losses``; ``verl/trainer/ppo/ray_trainer.py``: weight normalisation and the dual step).

* :func:`grpo_advantages`: the group-relative advantage ``A_ij = (r_ij - mean_i) / (std_i + eps)``.
* :class:`OnlineDifficultyBins`: the online difficulty classifier (per-prompt accuracy over a sliding window of
  visits, mapped to bins by edges, with hysteresis). Bin 0 is the hardest (lowest pass rate).
* :class:`PromptGDRO`: the data adversary, an EXP3P sampler over bins with an EMA-debiased score, realised as a
  per-prompt scaling of the advantages.
* :class:`RolloutGDRO`: the compute adversary, one EXP3P bandit over rollout counts ("arms") per bin; a dynamic
  programme (:func:`allocate_arms`) picks one arm per bin under the batch's rollout budget and a dual price ``mu``
  keeps the realised mean at ``n_bar``.
* Theory: :func:`entropic_gdro` (Lemma 4.1: the entropy-regularised worst case and its softmax maximiser),
  :func:`sqrt_allocation` and :func:`shadow_price_allocation` (the square-root rule minimising the variance proxy
  ``sum_b q_b v_b / n_b`` at a fixed mean budget), :func:`wse` (the weighted standard error of Fig. 6b).

Deliberate deviations (all documented in the notebook):

* Hysteresis: for a one-bin move identical to the repo; for a jump over several bins the repo compares with the
  lowest crossed edge (on the way down a prompt that lands just under ``edges[new]`` keeps its old, much easier bin),
  we compare with the edge of the *current* bin on the side of the move.
* Budget: the repo's DP takes the total closest to the budget and, when no exact split exists, falls back to a
  proportional allocator without a dual step. Ours keeps the DP; when the budget cannot be met exactly the sign of
  the dual price ``mu`` picks the nearest total below (``mu > 0``, overspent so far) or above (``mu < 0``), and
  ``mu`` is updated from the realised rollouts every step, so the long-run mean stays on budget. When an exact split
  exists (always, with the repo's arms 2..12 and an integer ``n_bar``) the choice is the repo's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = [
    "OnlineDifficultyBins", "PromptGDRO", "RolloutGDRO", "allocate_arms", "entropic_gdro", "grpo_advantages",
    "shadow_price_allocation", "sqrt_allocation", "wse",
]

Tensor = torch.Tensor


def _finite(name: str, x: Tensor) -> None:
    if x.numel() == 0:
        raise ValueError(f"{name} is empty")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf")


# --------------------------------------------------------------------------------------------------- GRPO


def grpo_advantages(rewards: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO's group-relative advantages (paper eq. 5): ``A_ij = (r_ij - mean_i) / (std_i + eps)``.

    ``rewards`` and ``group_ids`` are flat ``(M,)`` tensors (rollout ``j`` of prompt ``i`` carries ``group_ids = i``;
    groups may have different sizes, as under Rollout-GDRO). The standard deviation is the population one (divide
    by the group size), as in verl's ``compute_grpo_outcome_advantage``. A group whose rewards are all equal gets
    advantage 0. Batched: two ``index_add`` passes, no loop over groups.
    """
    _finite("rewards", rewards)
    if group_ids.shape != rewards.shape or rewards.ndim != 1:
        raise ValueError(f"rewards and group_ids must be equal-length 1-d tensors, got {tuple(rewards.shape)} "
                         f"and {tuple(group_ids.shape)}")
    if int(group_ids.min()) < 0:
        raise ValueError("group ids must be non-negative integers")
    g = group_ids.long()
    n_groups = int(g.max()) + 1
    r = rewards.to(torch.float64)
    size = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(0, g, torch.ones_like(r))
    mean = torch.zeros_like(size).index_add_(0, g, r) / size.clamp_min(1.0)
    centred = r - mean[g]
    var = torch.zeros_like(size).index_add_(0, g, centred**2) / size.clamp_min(1.0)
    return (centred / (var.sqrt()[g] + eps)).to(rewards.dtype)


# ------------------------------------------------------------------------------------------- the theory


def entropic_gdro(losses: Tensor, eta: float) -> tuple[Tensor, Tensor]:
    """Entropy-regularised GDRO (paper Lemma 4.1): ``R_eta(L) = max_q <q, L> + H(q)/eta = (1/eta) log sum_b
    exp(eta L_b)``, attained at ``q* = softmax(eta L)``. Returns ``(R_eta, q*)``; ``max L <= R_eta <= max L +
    log(B)/eta``. ``losses`` has the bins in its last dimension (batched over leading ones)."""
    _finite("losses", losses)
    if not eta > 0:
        raise ValueError(f"eta must be positive, got {eta}")
    value = torch.logsumexp(eta * losses, dim=-1) / eta
    return value, torch.softmax(eta * losses, dim=-1)


def _check_qv(q: Tensor, v: Tensor, n_bar: float) -> None:
    _finite("q", q)
    _finite("v", v)
    if q.shape != v.shape:
        raise ValueError(f"q and v must have the same shape, got {tuple(q.shape)} and {tuple(v.shape)}")
    if bool((q < 0).any()) or not float(q.sum()) > 0:
        raise ValueError("q must be non-negative with a positive sum")
    if bool((v < 0).any()):
        raise ValueError("variances v must be non-negative")
    if not n_bar > 0:
        raise ValueError(f"n_bar must be positive, got {n_bar}")


def sqrt_allocation(q: Tensor, v: Tensor, n_bar: float) -> Tensor:
    """The square-root (Neyman) rule: ``n_b* = n_bar sqrt(v_b) / sum_j q_j sqrt(v_j)`` minimises the variance proxy
    ``sum_b q_b v_b / n_b`` subject to ``sum_b q_b n_b = n_bar`` (paper §4, Thm 4.2; ``q`` are bin shares, ``v``
    per-rollout variances). Needs at least one bin with ``q_b v_b > 0``."""
    _check_qv(q, v, n_bar)
    s = v.sqrt()
    denom = (q * s).sum() / q.sum()
    if not float(denom) > 0:
        raise ValueError("every bin with positive share has zero variance: the allocation is undetermined")
    return n_bar * s / denom


def shadow_price_allocation(q: Tensor, v: Tensor, n_bar: float, n_min: float = 0.0, n_max: float = math.inf,
                            tol: float = 1e-12, max_iter: int = 200) -> tuple[Tensor, float]:
    """The same problem solved through its shadow price, with optional box constraints ``n_min <= n_b <= n_max``.

    Stationarity of the Lagrangian ``sum_b q_b v_b / n_b + mu (sum_b q_b n_b - n_bar)`` gives
    ``n_b(mu) = clip(sqrt(v_b / mu), n_min, n_max)``; the realised mean ``sum_b q_b n_b(mu) / sum_b q_b`` falls in
    ``mu``, so bisection on ``log mu`` finds the price that meets the budget. Without bounds this is
    :func:`sqrt_allocation`. Returns ``(n, mu)``.
    """
    _check_qv(q, v, n_bar)
    if not (0 <= n_min <= n_bar <= n_max):
        raise ValueError(f"need 0 <= n_min <= n_bar <= n_max, got {n_min}, {n_bar}, {n_max}")
    w = q / q.sum()
    if not float((w * v).sum()) > 0:
        raise ValueError("every bin with positive share has zero variance: the allocation is undetermined")

    def alloc(mu: float) -> Tensor:
        return (v / mu).sqrt().clamp(n_min, n_max)

    lo, hi = -60.0, 60.0  # log mu bracket; mean(alloc) is non-increasing in mu
    for _ in range(max_iter):
        mid = 0.5 * (lo + hi)
        if float((w * alloc(math.exp(mid))).sum()) > n_bar:
            lo = mid
        else:
            hi = mid
        if hi - lo < tol:
            break
    mu = math.exp(0.5 * (lo + hi))
    return alloc(mu), mu


def wse(q: Tensor, sigma: Tensor, n: Tensor) -> Tensor:
    """Weighted standard error (paper Fig. 6b): ``WSE = sum_b q_b sigma_b / sqrt(n_b)`` over the last dimension."""
    _finite("sigma", sigma)
    if bool((torch.as_tensor(n) <= 0).any()):
        raise ValueError("rollout counts n must be positive")
    return (q * sigma / torch.as_tensor(n, dtype=sigma.dtype, device=sigma.device).sqrt()).sum(-1)


# ------------------------------------------------------------------------- the arm-selection programme


def allocate_arms(counts: Tensor, arms: Sequence[int], utility: Tensor, budget: int,
                  direction: int = 0) -> tuple[Tensor, int]:
    """One arm per bin maximising ``sum_b utility[b, arm_b]`` subject to ``sum_b counts_b * arm_b = budget``.

    The repo's ``rollout_choose_arms`` (a DP over the running total): bins with ``counts_b = 0`` are skipped (arm
    index ``-1``). Among the reachable totals the one equal to ``budget`` is taken; if none is, the nearest total
    below (``direction < 0``), above (``direction > 0``) or either side (``direction = 0``, ties to the higher
    utility). Vectorised over totals: one ``(arms, totals)`` max per bin. Returns ``(arm index per bin, total)``.
    """
    counts = torch.as_tensor(counts, dtype=torch.long)
    if counts.ndim != 1 or utility.shape != (counts.numel(), len(arms)):
        raise ValueError(f"utility must have shape (bins, arms) = ({counts.numel()}, {len(arms)}), "
                         f"got {tuple(utility.shape)}")
    if bool((counts < 0).any()) or int(counts.sum()) == 0:
        raise ValueError("counts must be non-negative with at least one prompt")
    if torch.isnan(utility).any():
        raise ValueError("utility contains NaN")
    dev = utility.device
    arm_t = torch.as_tensor(list(arms), dtype=torch.long, device=dev)
    if bool((arm_t < 1).any()):
        raise ValueError("arms must be positive rollout counts")
    top = int((counts.to(dev) * arm_t.max()).sum())
    neg = torch.tensor(-math.inf, dtype=torch.float64, device=dev)
    best = torch.full((top + 1,), -math.inf, dtype=torch.float64, device=dev)
    best[0] = 0.0
    live = [b for b in range(counts.numel()) if int(counts[b]) > 0]
    back = []
    for b in live:
        shifts = int(counts[b]) * arm_t  # the total added by each arm
        idx = torch.arange(top + 1, device=dev)[None, :] - shifts[:, None]  # (arms, totals): previous total
        prev = torch.where(idx >= 0, best[idx.clamp_min(0)], neg)
        cand = prev + utility[b].to(torch.float64)[:, None]
        best, arg = cand.max(dim=0)
        back.append(arg)
    reach = torch.isfinite(best).nonzero()[:, 0]
    exact = reach[reach == budget]
    if exact.numel():
        total = budget
    else:
        below, above = reach[reach < budget], reach[reach > budget]
        if direction < 0 and below.numel():
            total = int(below.max())
        elif direction > 0 and above.numel():
            total = int(above.min())
        else:
            cands = [int(x) for x in (below.max() if below.numel() else None,
                                      above.min() if above.numel() else None) if x is not None]
            # nearest first, then the higher utility (the repo's tie-break)
            total = min(cands, key=lambda s: (abs(s - budget), -float(best[s])))
    choice = torch.full((counts.numel(),), -1, dtype=torch.long)
    s = total
    for b, arg in zip(reversed(live), reversed(back), strict=True):
        k = int(arg[s])
        choice[b] = k
        s -= int(counts[b]) * int(arm_t[k])
    return choice, total


# --------------------------------------------------------------------------------------- the classifier


class OnlineDifficultyBins:
    """Online difficulty classifier (paper §3.1, repo ``PassKOnlineClassifier``).

    Each prompt (an integer ``uid`` in ``0..n_prompts-1``) keeps its last ``history`` visit values ``c_t(x) in
    [0, 1]`` (the repo: 1 if any rollout was correct; we pass the visit's mean reward, see the notebook). Its
    accuracy is their mean (0 for a prompt never seen, as in the repo); ``edges`` (increasing, inside (0, 1)) cut
    ``[0, 1]`` into ``len(edges) + 1`` bins, bin 0 the hardest. Hysteresis ``delta``: a prompt leaves its current bin
    only when its accuracy passes that bin's edge by more than ``delta``. All state is tensors on ``device``.
    """

    def __init__(self, n_prompts: int, edges: Sequence[float], history: int = 8, hysteresis: float = 0.0,
                 device: torch.device | str = "cpu"):
        e = torch.tensor(sorted(set(float(x) for x in edges)), dtype=torch.float64)
        if e.numel() < 1 or bool(((e <= 0) | (e >= 1)).any()):
            raise ValueError(f"edges must lie strictly inside (0, 1), got {list(edges)}")
        if n_prompts < 1 or history < 1:
            raise ValueError(f"need n_prompts >= 1 and history >= 1, got {n_prompts}, {history}")
        if not 0.0 <= hysteresis < 0.5:
            raise ValueError(f"hysteresis must lie in [0, 0.5), got {hysteresis}")
        self.device = torch.device(device)
        self.edges = e.to(self.device)
        self.history, self.hysteresis = int(history), float(hysteresis)
        self.values = torch.zeros(n_prompts, history, dtype=torch.float64, device=self.device)
        self.seen = torch.zeros(n_prompts, dtype=torch.long, device=self.device)
        self.last_bin = torch.full((n_prompts,), -1, dtype=torch.long, device=self.device)

    @property
    def num_bins(self) -> int:
        return int(self.edges.numel()) + 1

    def update(self, uids: Tensor, values: Tensor) -> None:
        """Record one visit value per prompt (``uids`` unique within a call)."""
        uids = uids.to(self.device).long()
        values = values.to(self.device, torch.float64)
        _finite("values", values)
        if uids.shape != values.shape or uids.unique().numel() != uids.numel():
            raise ValueError("uids must be unique and match values in shape")
        if bool(((values < 0) | (values > 1)).any()):
            raise ValueError("visit values must lie in [0, 1]")
        slot = self.seen[uids] % self.history  # ring buffer
        self.values[uids, slot] = values
        self.seen[uids] += 1

    def accuracy(self, uids: Tensor) -> Tensor:
        """Mean of the stored visit values (0 for unseen prompts)."""
        uids = uids.to(self.device).long()
        n = self.seen[uids].clamp(max=self.history)
        return self.values[uids].sum(1) / n.clamp_min(1)

    def raw_bins(self, acc: Tensor) -> Tensor:
        """Bin of each accuracy without hysteresis: the number of edges ``<= acc``."""
        return torch.searchsorted(self.edges, acc.to(self.edges.dtype), right=True)

    def bins(self, uids: Tensor) -> Tensor:
        """Current bins of ``uids`` with hysteresis; remembers them as the prompts' bins."""
        uids = uids.to(self.device).long()
        acc = self.accuracy(uids)
        raw = self.raw_bins(acc)
        prev = self.last_bin[uids]
        prev = torch.where(prev < 0, raw, prev)  # first classification: no inertia
        e = self.edges
        up_edge = e[prev.clamp(max=e.numel() - 1)]  # the upper edge of the current bin
        down_edge = e[(prev - 1).clamp(min=0)]  # its lower edge
        stay_up = (raw > prev) & (acc < up_edge + self.hysteresis)
        stay_down = (raw < prev) & (acc > down_edge - self.hysteresis)
        out = torch.where(stay_up | stay_down, prev, raw)
        self.last_bin[uids] = out
        return out


# ---------------------------------------------------------------------------------------- Prompt-GDRO


class PromptGDRO:
    """The data adversary (paper eqs. 12-16; repo ``ClassDroExp3p`` with ``debias_scores_ema=True``).

    Per step, for each bin ``b`` present: ``l_t(b)`` = mean prompt loss of its prompts (divided by the bin's batch
    share with ``norm_by_share``); score ``S_t(b) = (1 - beta) S_{t-1}(b) + beta l_t(b)`` (the first observation
    initialises it); ``q(b) = (1 - gamma) softmax(eta clip(S, -C, C))_b + gamma / B_present`` over the bins present.
    ``score="cumulative"`` is the repo's un-debiased default (``S`` = running sum), kept for the tests. Realised as
    advantage scaling: prompt ``i`` in bin ``b_i`` gets ``w_i = q(b_i)`` normalised to mean 1 over the batch and
    clipped at ``w_max`` (repo: ``ray_trainer.py``).
    """

    def __init__(self, num_bins: int, eta: float = 0.65, gamma: float = 0.01, beta: float = 0.12,
                 clip: float = 5.0, w_max: float = 15.0, norm_by_share: bool = False, score: str = "ema",
                 device: torch.device | str = "cpu"):
        if num_bins < 1:
            raise ValueError(f"num_bins must be >= 1, got {num_bins}")
        if not (eta > 0 and 0 <= gamma <= 1 and 0 < beta <= 1 and clip > 0 and w_max > 0):
            raise ValueError("need eta > 0, 0 <= gamma <= 1, 0 < beta <= 1, clip > 0, w_max > 0")
        if score not in ("ema", "cumulative"):
            raise ValueError(f"score must be 'ema' or 'cumulative', got {score!r}")
        self.num_bins, self.eta, self.gamma, self.beta = num_bins, eta, gamma, beta
        self.clip, self.w_max, self.norm_by_share, self.score_kind = clip, w_max, norm_by_share, score
        self.device = torch.device(device)
        self.score = torch.zeros(num_bins, dtype=torch.float64, device=self.device)
        self.count = torch.zeros(num_bins, dtype=torch.long, device=self.device)

    def _check_bins(self, bin_ids: Tensor) -> Tensor:
        b = bin_ids.to(self.device).long()
        if b.numel() == 0 or int(b.min()) < 0 or int(b.max()) >= self.num_bins:
            raise ValueError(f"bin ids must be non-empty and lie in 0..{self.num_bins - 1}")
        return b

    def update(self, bin_ids: Tensor, losses: Tensor) -> Tensor:
        """Feed one step's per-prompt losses; returns the per-bin step losses ``l_t`` (NaN where absent)."""
        b = self._check_bins(bin_ids)
        x = losses.to(self.device, torch.float64)
        _finite("losses", x)
        if x.shape != b.shape:
            raise ValueError("losses and bin_ids must have the same shape")
        n = torch.bincount(b, minlength=self.num_bins).to(torch.float64)
        present = n > 0
        step = torch.zeros(self.num_bins, dtype=torch.float64, device=self.device).index_add_(0, b, x)
        step = step / n.clamp_min(1)  # per-bin mean loss
        if self.norm_by_share:
            step = step / (n / n.sum()).clamp_min(1e-12)
        first = present & (self.count == 0)
        if self.score_kind == "ema":
            ema = (1 - self.beta) * self.score + self.beta * step
            self.score = torch.where(first, step, torch.where(present, ema, self.score))
        else:
            self.score = torch.where(present, self.score + step, self.score)
        self.count += present.long()
        return torch.where(present, step, torch.full_like(step, math.nan))

    def q(self, present: Tensor | None = None) -> Tensor:
        """The EXP3P distribution over bins (``(num_bins,)``, zero outside ``present``; default: the bins seen)."""
        mask = (self.count > 0) if present is None else present.to(self.device).bool()
        if not bool(mask.any()):
            mask = torch.ones(self.num_bins, dtype=torch.bool, device=self.device)
        logits = torch.where(mask, self.eta * self.score.clamp(-self.clip, self.clip),
                             torch.full_like(self.score, -math.inf))
        mix = (1 - self.gamma) * torch.softmax(logits, 0) + self.gamma / int(mask.sum())
        return torch.where(mask, mix, torch.zeros_like(mix))

    def weights(self, bin_ids: Tensor) -> Tensor:
        """Per-prompt advantage scales: ``q(b_i)`` over the bins present, normalised to mean 1, clipped at
        ``w_max``."""
        b = self._check_bins(bin_ids)
        present = torch.bincount(b, minlength=self.num_bins) > 0
        w = self.q(present)[b]
        w = w * (w.numel() / w.sum())
        return w.clamp(max=self.w_max)


# --------------------------------------------------------------------------------------- Rollout-GDRO


class RolloutGDRO:
    """The compute adversary (paper eqs. 17-21; repo ``rollout_choose_arms`` / ``update_rollout_arm_losses`` and the
    dual step in ``ray_trainer.py``).

    Per bin, an EXP3P distribution over the arms (rollout counts): ``p_b = (1 - gamma) softmax(eta score_b) +
    gamma / |arms|``. :meth:`choose` runs :func:`allocate_arms` with utility ``log p_b`` and budget ``n_bar *
    #prompts``. :meth:`update` credits the chosen arm of each bin: ``score_b[n_b] += -(J_b + mu (n_b - n_bar))``
    with ``J_b = -l_b`` (the bin's mean loss, the repo's ``est_j = -mean_lb``), then takes the dual step
    ``mu += dual_lr (realised mean - n_bar)``.
    """

    def __init__(self, num_bins: int, arms: Sequence[int] = tuple(range(2, 13)), n_bar: int = 4,
                 eta: float = 0.65, gamma: float = 0.01, dual_lr: float = 0.05,
                 device: torch.device | str = "cpu"):
        self.arms = tuple(int(a) for a in arms)
        if num_bins < 1 or len(self.arms) < 1 or min(self.arms) < 1:
            raise ValueError("need num_bins >= 1 and positive arms")
        if not (min(self.arms) <= n_bar <= max(self.arms)):
            raise ValueError(f"n_bar={n_bar} lies outside the arms {self.arms[0]}..{self.arms[-1]}")
        if not (eta > 0 and 0 <= gamma <= 1 and dual_lr >= 0):
            raise ValueError("need eta > 0, 0 <= gamma <= 1, dual_lr >= 0")
        self.num_bins, self.n_bar, self.eta, self.gamma, self.dual_lr = num_bins, n_bar, eta, gamma, dual_lr
        self.device = torch.device(device)
        self.scores = torch.zeros(num_bins, len(self.arms), dtype=torch.float64, device=self.device)
        self.mu = 0.0
        self._last: tuple[Tensor, Tensor] | None = None

    def probs(self) -> Tensor:
        """``(num_bins, arms)`` EXP3P probabilities."""
        base = torch.softmax(self.eta * self.scores, dim=1)
        return (1 - self.gamma) * base + self.gamma / len(self.arms)

    def choose(self, bin_counts: Tensor) -> Tensor:
        """Rollouts per bin (``(num_bins,)``, 0 for empty bins) for a batch with ``bin_counts`` prompts per bin."""
        c = torch.as_tensor(bin_counts, dtype=torch.long, device=self.device)
        if c.shape != (self.num_bins,):
            raise ValueError(f"bin_counts must have shape ({self.num_bins},), got {tuple(c.shape)}")
        budget = int(c.sum()) * self.n_bar
        direction = -1 if self.mu > 0 else (1 if self.mu < 0 else 0)
        idx, _ = allocate_arms(c, self.arms, self.probs().log(), budget, direction)
        arm_t = torch.tensor(self.arms, dtype=torch.long, device=self.device)
        n = torch.where(idx.to(self.device) >= 0, arm_t[idx.clamp_min(0).to(self.device)], 0)
        self._last = (c, n)
        return n

    def update(self, bin_losses: Tensor, bin_n: Tensor | None = None, bin_counts: Tensor | None = None) -> float:
        """Credit the arms chosen by the last :meth:`choose` (or ``bin_n``/``bin_counts``) with the per-bin mean
        losses (NaN or ignored where a bin was empty); dual step; returns the realised mean rollouts per prompt."""
        if bin_n is None or bin_counts is None:
            if self._last is None:
                raise RuntimeError("call choose() before update(), or pass bin_n and bin_counts")
            bin_counts, bin_n = self._last
        c = torch.as_tensor(bin_counts, dtype=torch.long, device=self.device)
        n = torch.as_tensor(bin_n, dtype=torch.long, device=self.device)
        loss = torch.as_tensor(bin_losses, dtype=torch.float64, device=self.device)
        live = (c > 0) & torch.isfinite(loss)
        arm_t = torch.tensor(self.arms, dtype=torch.long, device=self.device)
        k = (n[:, None] == arm_t[None, :]).long().argmax(1)
        adj = -loss + self.mu * (n.to(torch.float64) - self.n_bar)  # L_b(n) = J_b + mu (n - n_bar), J_b = -l_b
        rows = live.nonzero()[:, 0]
        self.scores[rows, k[rows]] += -adj[rows]
        realised = float((c * n).sum()) / max(1, int(c.sum()))
        self.mu += self.dual_lr * (realised - self.n_bar)
        return realised
