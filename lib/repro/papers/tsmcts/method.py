"""SMC, SMCTS and TSMCTS as batched policy-improvement operators (Oren et al., ICML 2026), plus the Gumbel
MuZero pieces they share (Danihelka et al., ICLR 2022).

Every search runs ``B`` independent searches at once (a batch of root states, e.g. roots × seeds) with ``P``
particles each, as ``(B, P)`` tensors on the model's device: one batched model call per depth step, no Python
loop over particles or roots. Each returns a :class:`SearchResult` (action, policy target, root value, root
Q-estimates and visits) with :class:`Diagnostics` (model calls per root, distinct root actions behind the
targets, the ESS trace, resampling events).

The algorithm box of the paper was not readable (see the package docstring): :func:`smc_search` is the SPO /
TRT-SMC style baseline the paper compares against, and :func:`smcts_search` / :func:`tsmcts_search` are our
reconstruction of SMCTS and TSMCTS from the paper's text, labelled as such in the notebook.

Segments. Within-group resampling (one group per root action in TSMCTS) uses *segments*: a non-decreasing
vector ``seg`` of length ``P`` giving each particle's group, the same for every row of the batch. All segment
reductions are scatter operations, so groups of unequal size cost nothing extra.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .problems import Network, TabularModel

__all__ = ["C_SCALE", "C_VISIT", "Diagnostics", "SearchResult", "completed_q", "ess", "gumbel_top_k",
           "score_considered", "sequential_halving_schedule", "sigma_transform", "smc_search", "smcts_search",
           "systematic_resample", "tsmcts_search"]

C_VISIT = 50.0  # mctx's maxvisit_init
C_SCALE = 0.1  # mctx's value_scale


@dataclass
class Diagnostics:
    """What a search did, per root (row): ``model_calls`` (an int, the same for every row: batched model calls
    × particles), ``unique_ancestors`` (distinct root actions the policy target rests on: for SMC the distinct
    root ancestors of the final particles; for (T)SMCTS the root actions with any particle), ``ess_trace``
    (``(B, rounds, K)``: mean over groups of ESS / group size at each depth, before resampling),
    ``resamples`` (resampling events per search, counted per group) and ``final_ancestors`` (distinct root
    actions among the particles alive at the very end); ``covered_round0``: distinct root actions among the
    particles of (T)SMCTS's first round (None for SMC)."""

    model_calls: int
    unique_ancestors: torch.Tensor
    ess_trace: torch.Tensor
    resamples: torch.Tensor
    final_ancestors: torch.Tensor
    covered_round0: torch.Tensor | None = None


@dataclass
class SearchResult:
    """A search's outputs per root: ``action`` (B,), ``policy`` target (B, A), root ``value`` (B,), root ``q``
    estimates (B, A; NaN where an action has no estimate), ``visits`` (B, A; particles or simulations) and
    ``diagnostics``."""

    action: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    q: torch.Tensor
    visits: torch.Tensor
    diagnostics: Diagnostics


# ----------------------------------------------------------------------------------- Gumbel MuZero building blocks
def gumbel_top_k(logits: torch.Tensor, k: int, generator: torch.Generator | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gumbel-top-k: ``g ~ Gumbel(0, 1)`` per action and the ``k`` actions with the largest ``g + logits``,
    in decreasing order. This samples ``k`` actions without replacement from ``softmax(logits)``
    (Plackett–Luce; Kool et al. 2019), as in Gumbel MuZero's root. Returns ``(g, top)``, shapes (B, A), (B, k)."""
    if logits.ndim != 2:
        raise ValueError(f"gumbel_top_k: logits must be (B, A), got shape {tuple(logits.shape)}")
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"gumbel_top_k: k must lie in [1, {logits.shape[1]}], got {k}")
    if not torch.isfinite(logits).all():
        raise ValueError("gumbel_top_k: logits hold NaN or inf")
    u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
    tiny = torch.finfo(logits.dtype).tiny
    g = -torch.log(-torch.log(u.clamp_min(tiny)))
    top = torch.topk(g + logits, k, dim=1).indices
    return g, top


def sequential_halving_schedule(m: int, budget: int) -> list[tuple[int, ...]]:
    """Gumbel MuZero's Sequential Halving schedule as phases: phase ``j`` is a tuple of visits (here: particles)
    for each considered action, best-scored first. It follows ``mctx``'s rule: ``log2max = ceil(log2 m)``;
    each phase gives each of ``c`` considered actions ``max(1, floor(budget / (log2max · c)))`` visits, then
    ``c ← max(2, c // 2)``; the sequence is cut at ``budget`` (the last phase may be partial, its first actions
    getting one more). With ``m <= 1`` one action gets the whole budget."""
    if m < 1 or budget < 1:
        raise ValueError(f"sequential_halving_schedule: m and budget must be >= 1, got {m}, {budget}")
    if m == 1:
        return [(budget,)]
    log2max = math.ceil(math.log2(m))
    phases: list[tuple[int, ...]] = []
    c, used = m, 0
    while used < budget:
        extra = max(1, budget // (log2max * c))
        take = min(extra * c, budget - used)
        full, part = divmod(take, c)
        phases.append(tuple(full + (i < part) for i in range(c)))
        used += take
        c = max(2, c // 2)
    return phases


def completed_q(q: torch.Tensor, visits: torch.Tensor, prior_logits: torch.Tensor, raw_value: torch.Tensor
                ) -> torch.Tensor:
    """Completed Q-values (Danihelka et al. 2022, App. D; ``mctx.qtransform_completed_by_mix_value``): visited
    actions keep ``q``, unvisited ones get the mixed value
    ``v_mix = (v̂ + Σ_b N(b) · Σ_{a visited} π(a) q(a) / Σ_{a visited} π(a)) / (Σ_b N(b) + 1)``."""
    probs = torch.softmax(prior_logits, dim=-1).clamp_min(torch.finfo(prior_logits.dtype).tiny)
    seen = visits > 0
    q0 = torch.where(seen, q, torch.zeros_like(q))  # unvisited q may be NaN: never let it in
    n = visits.sum(-1)
    sum_p = torch.where(seen, probs, 0.0).sum(-1)
    weighted = torch.where(seen, probs * q0, 0.0).sum(-1) / torch.where(sum_p > 0, sum_p, 1.0)
    v_mix = (raw_value + n * weighted) / (n + 1)
    return torch.where(seen, q0, v_mix[..., None])


def sigma_transform(cq: torch.Tensor, visits: torch.Tensor, c_visit: float = C_VISIT, c_scale: float = C_SCALE,
                    rescale: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """``σ(q̂) = (c_visit + max_b N(b)) · c_scale · q̂`` with ``q̂`` min–max normalised over actions (Danihelka et
    al. 2022, Eq. 8 with mctx's defaults ``c_visit = 50``, ``c_scale = 0.1``)."""
    if rescale:
        lo = cq.min(-1, keepdim=True).values
        hi = cq.max(-1, keepdim=True).values
        cq = (cq - lo) / (hi - lo).clamp_min(eps)
    return (c_visit + visits.max(-1, keepdim=True).values) * c_scale * cq


def score_considered(gumbel: torch.Tensor, logits: torch.Tensor, sigma_q: torch.Tensor, visits: torch.Tensor
                     ) -> torch.Tensor:
    """Gumbel MuZero's final choice: among the actions with the most visits, ``argmax g + logits + σ(q̂)``
    (``mctx.seq_halving.score_considered``). Returns the action (B,)."""
    logits = logits - logits.max(-1, keepdim=True).values
    top = visits == visits.max(-1, keepdim=True).values
    score = torch.clamp_min(gumbel + logits + sigma_q, -1e9)
    return torch.where(top, score, torch.full_like(score, -math.inf)).argmax(-1)


# ------------------------------------------------------------------------------------------- segments and SMC parts
def _segments(P: int, segments: torch.Tensor | None, device: torch.device) -> tuple[torch.Tensor, int]:
    if segments is None:
        return torch.zeros(P, dtype=torch.long, device=device), 1
    seg = segments.to(device=device, dtype=torch.long)
    if seg.shape != (P,) or int(seg[0]) != 0 or bool((seg.diff() < 0).any()) or bool((seg.diff() > 1).any()):
        raise ValueError("segments must be a non-decreasing vector 0, 0, ..., 1, ... of one id per particle "
                         "without gaps")
    return seg, int(seg[-1]) + 1


def _equal_segments(seg: torch.Tensor, n_seg: int) -> bool:
    P = seg.numel()
    return P % n_seg == 0 and bool((seg == torch.arange(P, device=seg.device) // (P // n_seg)).all())


def _seg_logsumexp(x: torch.Tensor, seg: torch.Tensor, n_seg: int, equal: bool | None = None) -> torch.Tensor:
    """Log-sum-exp of ``x`` (B, P) within each segment: (B, n_seg)."""
    B, P = x.shape
    if _equal_segments(seg, n_seg) if equal is None else equal:
        return torch.logsumexp(x.view(B, n_seg, P // n_seg), -1)  # equal contiguous groups: a reshape
    idx = seg.expand_as(x)
    mx = torch.full((B, n_seg), -math.inf, dtype=x.dtype, device=x.device)
    mx = mx.scatter_reduce(1, idx, x, reduce="amax")
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    tot = torch.zeros_like(mx).scatter_add(1, idx, torch.exp(x - mx.gather(1, idx)))
    return torch.log(tot) + mx


def _seg_normalise(logw: torch.Tensor, seg: torch.Tensor, n_seg: int) -> torch.Tensor:
    return torch.exp(logw - _seg_logsumexp(logw, seg, n_seg).gather(1, seg.expand_as(logw)))


def ess(logw: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
    """Effective sample size ``(Σ w)² / Σ w²`` of log-weights ``(B, P)``, per segment: shape ``(B, n_seg)``."""
    if logw.ndim != 2:
        raise ValueError(f"ess: logw must be (B, P), got shape {tuple(logw.shape)}")
    if torch.isnan(logw).any():
        raise ValueError("ess: log-weights hold NaN")
    seg, n_seg = _segments(logw.shape[1], segments, logw.device)
    return torch.exp(2 * _seg_logsumexp(logw, seg, n_seg) - _seg_logsumexp(2 * logw, seg, n_seg))


def systematic_resample(weights: torch.Tensor, generator: torch.Generator | None = None,
                        segments: torch.Tensor | None = None) -> torch.Tensor:
    """Systematic resampling (Kitagawa 1996) of ``(B, P)`` weights, independently within each segment: one
    uniform ``U`` per (row, segment) and the ``n_s`` points ``(i + U) / n_s`` against the segment's cumulative
    weights. Returns ancestor indices ``(B, P)`` into the same row and segment. Each particle is copied
    ``floor(n_s w)`` or ``ceil(n_s w)`` times, and ``E[copies] = n_s w`` (weights are normalised per segment
    here, so they need only be non-negative)."""
    if weights.ndim != 2:
        raise ValueError(f"systematic_resample: weights must be (B, P), got shape {tuple(weights.shape)}")
    if not torch.isfinite(weights).all() or bool((weights < 0).any()):
        raise ValueError("systematic_resample: weights must be finite and non-negative")
    seg, n_seg = _segments(weights.shape[1], segments, weights.device)
    tot = torch.zeros(weights.shape[0], n_seg, dtype=weights.dtype, device=weights.device).index_add(1, seg, weights)
    if bool((tot <= 0).any()):
        raise ValueError("systematic_resample: a segment has zero total weight")
    return _systematic(weights / tot[:, seg], generator, seg, n_seg)


def _systematic(w: torch.Tensor, generator: torch.Generator | None, seg: torch.Tensor, n_seg: int) -> torch.Tensor:
    """:func:`systematic_resample` without the checks, for weights already normalised within segments."""
    B, P = w.shape
    if _equal_segments(seg, n_seg):
        return _systematic_equal(w, generator, n_seg)
    size = torch.bincount(seg, minlength=n_seg).to(w.dtype)  # n_s
    start = torch.cumsum(size, 0) - size
    csum = torch.cumsum(w, 1)
    base = torch.cat([torch.zeros(B, 1, dtype=w.dtype, device=w.device), csum[:, :-1]], 1)
    base = base[:, start.long()][:, seg]  # cumulative weight before each segment
    edge = start[seg] + size[seg] * (csum - base)  # within-segment CDF mapped onto [start_s, start_s + n_s]
    last = torch.cat([seg[1:] != seg[:-1], torch.ones(1, dtype=torch.bool, device=seg.device)])
    edge = torch.where(last, (start + size)[seg].expand(B, P), edge)  # end each segment exactly (rounding)
    u = torch.rand(B, n_seg, generator=generator, device=w.device, dtype=w.dtype)
    points = torch.arange(P, device=w.device, dtype=w.dtype) + u[:, seg]
    return torch.searchsorted(edge.contiguous(), points.contiguous(), right=True).clamp_max(P - 1)


def _systematic_equal(weights: torch.Tensor, generator: torch.Generator | None, n_seg: int) -> torch.Tensor:
    """:func:`systematic_resample` for equal contiguous segments: the same rule on a (B · n_seg, n) reshape."""
    B, P = weights.shape
    n = P // n_seg
    csum = torch.cumsum(weights.reshape(B * n_seg, n), 1)
    edge = n * csum / csum[:, -1:]
    edge[:, -1] = n  # end each segment exactly (rounding)
    u = torch.rand(B * n_seg, 1, generator=generator, device=weights.device, dtype=weights.dtype)
    # M_i = #{k : k + U < n C_i} = ceil(n C_i − U): the points that fall before particle i's upper edge. The
    # ancestor of point k is the first i with M_i > k, i.e. #{i : M_i <= k}: a histogram of M and a cumsum
    # (the same indices as a search of the points in the edges, without the search).
    M = torch.ceil(edge - u).long().clamp_(0, n)
    hist = torch.zeros(B * n_seg, n + 1, dtype=torch.long, device=weights.device)
    hist.scatter_add_(1, M, torch.ones_like(M))
    idx = torch.cumsum(hist[:, :n], 1).clamp_max(n - 1)
    return (idx.view(B, n_seg, n) + n * torch.arange(n_seg, device=weights.device)[:, None]).view(B, P)


def _check(model: TabularModel, net: Network, roots: torch.Tensor, n_particles: int, depth: int, tau: float,
           ess_threshold: float) -> None:
    if net.logits.shape != (model.n_states, model.n_actions):
        raise ValueError(f"network logits {tuple(net.logits.shape)} do not match the model's "
                         f"{(model.n_states, model.n_actions)}")
    if roots.ndim != 1 or roots.numel() == 0:
        raise ValueError("roots must be a non-empty 1-d tensor of state indices")
    if int(roots.min()) < 0 or int(roots.max()) >= model.n_states:
        raise ValueError("roots hold a state index outside the model")
    if n_particles < 1 or depth < 1:
        raise ValueError(f"need n_particles >= 1 and depth >= 1, got {n_particles}, {depth}")
    if not (tau > 0) or math.isnan(tau):
        raise ValueError(f"the twist temperature tau must be > 0 (math.inf: no twist), got {tau}")
    if not 0.0 <= ess_threshold <= 1.0:
        raise ValueError(f"ess_threshold must lie in [0, 1], got {ess_threshold}")


@dataclass
class _Particles:
    returns: torch.Tensor  # (B, P) bootstrapped return from the root, G = Σ γ^t r_t + γ^K V(s_K)
    logw: torch.Tensor  # (B, P)
    root_action: torch.Tensor  # (B, P)
    ess_trace: torch.Tensor  # (B, K)
    resamples: torch.Tensor  # (B,)
    calls: int


def _propagate(model: TabularModel, net: Network, roots: torch.Tensor, P: int, depth: int, tau: float,
               generator: torch.Generator | None, ess_threshold: float, first_action: torch.Tensor | None = None,
               seg: torch.Tensor | None = None) -> _Particles:
    """Run ``P`` particles per root for ``depth`` lock-step model calls: the twisted SMC of SPO / TRT-SMC."""
    B, dev = roots.numel(), roots.device
    seg, n_seg = _segments(P, seg, dev)
    size = torch.bincount(seg, minlength=n_seg).to(net.value.dtype)
    equal = _equal_segments(seg, n_seg)
    A = model.n_actions
    cdf = torch.softmax(net.logits, -1).cumsum(-1)  # prior π(·|s) as a CDF table, for inverse-CDF sampling
    cdf_cols = [cdf[:, j].contiguous() for j in range(A - 1)]
    flat_next, flat_reward = model.next_state.reshape(-1), model.reward.reshape(-1)
    s = roots[:, None].expand(B, P).contiguous()
    logw = torch.zeros(B, P, dtype=net.value.dtype, device=dev)
    ret = torch.zeros_like(logw)
    ident = torch.arange(P, device=dev).expand(B, P)
    trace, resamples, disc, calls, root_a = [], torch.zeros(B, device=dev), 1.0, 0, None
    for t in range(depth):
        # 1. propose: a_t ~ π(·|s_t) by inverse CDF (the root action may be fixed, as in TSMCTS's groups)
        if t == 0 and first_action is not None:
            a = first_action
        else:
            u = torch.rand(B, P, generator=generator, device=dev, dtype=cdf.dtype)
            a = torch.zeros(B, P, dtype=torch.long, device=dev)
            for col in cdf_cols:  # a loop over the A - 1 CDF columns, not over particles
                a += col.take(s) < u
        root_a = a if t == 0 else root_a
        # 2. one batched model call: (r_t, s_{t+1}) = step(s_t, a_t)
        flat = s * A + a
        r, s2 = flat_reward.take(flat).to(ret.dtype), flat_next.take(flat)
        calls += P
        ret = ret + disc * r
        disc *= model.gamma
        # 3. twist: log w += (r_t + γ V(s_{t+1}) − V(s_t)) / τ  (an advantage; τ = inf: plain Monte Carlo)
        if math.isfinite(tau):
            logw = logw + (r + model.gamma * net.value.take(s2) - net.value.take(s)) / tau
        s = s2
        # 4. ESS per group; resample a group when ESS < threshold · size (never after the last step)
        lse = _seg_logsumexp(logw, seg, n_seg, equal)
        rel = torch.exp(2 * lse - _seg_logsumexp(2 * logw, seg, n_seg, equal)) / size
        trace.append(rel.mean(-1))
        if t == depth - 1:
            break
        need = rel < ess_threshold  # (B, n_seg)
        if bool(need.any()):
            idx = _systematic(torch.exp(logw - lse[:, seg]), generator, seg, n_seg)
            keep = need[:, seg]
            idx = torch.where(keep, idx, ident)
            s, ret, root_a = s.gather(1, idx), ret.gather(1, idx), root_a.gather(1, idx)
            logw = torch.where(keep, torch.zeros_like(logw), logw)  # equal weights after resampling
            resamples = resamples + need.sum(-1)
    G = ret + disc * net.value.take(s)
    return _Particles(G, logw, root_a, torch.stack(trace, 1), resamples, calls)


def _distinct(actions: torch.Tensor, n_actions: int) -> torch.Tensor:
    hit = torch.zeros(actions.shape[0], n_actions, device=actions.device)
    return (hit.scatter_add(1, actions, torch.ones_like(actions, dtype=hit.dtype)) > 0).sum(-1)


# -------------------------------------------------------------------------------------------------------- operators
def smc_search(model: TabularModel, net: Network, roots: torch.Tensor, n_particles: int, depth: int,
               tau: float = 0.1, generator: torch.Generator | None = None, ess_threshold: float = 0.5
               ) -> SearchResult:
    """SMC search as a policy-improvement operator (SPO, Macfarlane et al. 2024; the paper's SMC baseline):
    ``N`` particles from the root, actions from the prior, weights ``∝ exp(Σ_t A_t / τ)`` with the advantage
    ``A_t = r_t + γV(s_{t+1}) − V(s_t)``, systematic resampling of all particles when ESS < threshold · N.
    Policy target: the weighted histogram of the final particles' root actions (their *root ancestors*);
    action: its argmax (ties: the prior's); root value: ``Σ_i w_i G_i``. Model calls: ``N · K`` per root."""
    _check(model, net, roots, n_particles, depth, tau, ess_threshold)
    A = model.n_actions
    p = _propagate(model, net, roots, n_particles, depth, tau, generator, ess_threshold)
    w = torch.softmax(p.logw, -1)
    policy = torch.zeros(roots.numel(), A, dtype=w.dtype, device=w.device).scatter_add(1, p.root_action, w)
    logits0 = net.logits[roots]
    best = policy == policy.max(-1, keepdim=True).values
    action = torch.where(best, logits0, torch.full_like(logits0, -math.inf)).argmax(-1)
    visits = torch.zeros_like(policy).scatter_add(1, p.root_action, torch.ones_like(w))
    qsum = torch.zeros_like(policy).scatter_add(1, p.root_action, w * p.returns)
    q = torch.where(policy > 0, qsum / policy.clamp_min(1e-300), torch.full_like(policy, math.nan))
    anc = _distinct(p.root_action, A)
    diag = Diagnostics(p.calls, anc, p.ess_trace[:, None], p.resamples, anc)
    return SearchResult(action, policy, (w * p.returns).sum(-1), q, visits, diag)


def _sh_search(model: TabularModel, net: Network, roots: torch.Tensor, n_particles: int, depth: int, m: int,
               tau: float, generator: torch.Generator | None, ess_threshold: float, c_visit: float, c_scale: float,
               halving: bool) -> SearchResult:
    """The shared driver of SMCTS (one round) and TSMCTS (Sequential Halving rounds); see :func:`tsmcts_search`."""
    _check(model, net, roots, n_particles, depth, tau, ess_threshold)
    B, A, dev = roots.numel(), model.n_actions, roots.device
    m = min(m, A)
    if m < 1:
        raise ValueError(f"m (considered actions) must be >= 1, got {m}")
    logits0, v0 = net.logits[roots], net.value[roots]
    # 1. Gumbel-top-m: the considered root actions, sampled without replacement from the prior
    gumbel, alive = gumbel_top_k(logits0, m, generator)
    if halving:
        schedule = sequential_halving_schedule(m, n_particles)
    else:
        if n_particles < m:
            raise ValueError(f"SMCTS needs n_particles >= m, got {n_particles} < {m}")
        schedule = [tuple(n_particles // m + (i < n_particles % m) for i in range(m))]
    sum_q = torch.zeros(B, A, dtype=v0.dtype, device=dev)
    visits = torch.zeros_like(sum_q)
    q_hat = torch.full_like(sum_q, math.nan)
    traces, resamples, calls, covered0 = [], torch.zeros(B, device=dev), 0, None
    for j, counts in enumerate(schedule):
        c = len(counts)
        if j > 0:
            # 2. halving: keep the c best of the surviving actions by g + logits + σ(completed Q̂)
            sq = sigma_transform(completed_q(q_hat, visits, logits0, v0), visits, c_visit, c_scale)
            score = (gumbel + logits0 + sq).gather(1, alive)
            alive = alive.gather(1, torch.argsort(score, dim=1, descending=True, stable=True)[:, :c])
        cnt = torch.tensor(counts, device=dev)
        seg = torch.repeat_interleave(torch.arange(c, device=dev), cnt)
        # 3. one SMC per surviving action: its particles all start with that root action and are resampled only
        #    within their own group, so no root action loses its particles
        p = _propagate(model, net, roots, int(cnt.sum()), depth, tau, generator, ess_threshold, alive[:, seg], seg)
        calls += p.calls
        traces.append(p.ess_trace)
        resamples = resamples + p.resamples
        if j == 0:
            covered0 = _distinct(alive[:, seg], A)
        # 4. backup: Q_j(a) = Σ_{i in group a} w̄_i G_i; accumulate over rounds with particle-count weights
        w = _seg_normalise(p.logw, seg, c)
        q_round = torch.zeros(B, c, dtype=w.dtype, device=dev).scatter_add(1, seg.expand(B, -1), w * p.returns)
        sum_q.scatter_add_(1, alive, cnt.to(w.dtype) * q_round)
        visits.scatter_add_(1, alive, cnt.to(w.dtype).expand(B, -1))
        q_hat = torch.where(visits > 0, sum_q / visits.clamp_min(1), torch.full_like(sum_q, math.nan))
    # 5. outputs as Gumbel MuZero: action among the most-visited; π' = softmax(logits + σ(completed Q̂))
    sq = sigma_transform(completed_q(q_hat, visits, logits0, v0), visits, c_visit, c_scale)
    action = score_considered(gumbel, logits0, sq, visits)
    policy = torch.softmax(logits0 + sq, -1)
    value = torch.where(visits > 0, q_hat, 0.0).mul(visits).sum(-1) / visits.sum(-1)
    final = torch.full((B,), len(schedule[-1]), device=dev)
    diag = Diagnostics(calls, (visits > 0).sum(-1), torch.stack(traces, 1), resamples, final, covered0)
    return SearchResult(action, policy, value, q_hat, visits, diag)


def smcts_search(model: TabularModel, net: Network, roots: torch.Tensor, n_particles: int, depth: int, m: int = 4,
                 tau: float = 0.1, generator: torch.Generator | None = None, ess_threshold: float = 0.5,
                 c_visit: float = C_VISIT, c_scale: float = C_SCALE) -> SearchResult:
    """SMCTS (our reconstruction): SMC read as a tree search. ``m`` root actions by Gumbel-top-k, the ``N``
    particles split evenly over them, each group a twisted SMC resampled only within itself; the root
    action values are backed up from the groups (``Q(a) = Σ_{i∈a} w̄_i G_i``) and the outputs are Gumbel
    MuZero's (completed Q, ``softmax(logits + σ)``). One round: :func:`tsmcts_search` without the halving."""
    return _sh_search(model, net, roots, n_particles, depth, m, tau, generator, ess_threshold, c_visit, c_scale,
                      halving=False)


def tsmcts_search(model: TabularModel, net: Network, roots: torch.Tensor, n_particles: int, depth: int, m: int = 4,
                  tau: float = 0.1, generator: torch.Generator | None = None, ess_threshold: float = 0.5,
                  c_visit: float = C_VISIT, c_scale: float = C_SCALE) -> SearchResult:
    """TSMCTS (our reconstruction of Oren et al. 2026): SMCTS inside Sequential Halving over the root actions.

    1. Gumbel-top-``m`` root actions (sampling without replacement from the prior).
    2. Rounds follow Gumbel MuZero's schedule over the particle budget (:func:`sequential_halving_schedule`,
       e.g. ``N = 32, m = 4``: 4 particles per action, then 8 per action for the best 2); every particle runs the
       full depth ``K``, so a search costs exactly ``N · K`` model calls, like :func:`smc_search`.
    3. In a round, each surviving action's particles start with that action and form one SMC group: advantage
       twist, systematic resampling *within* the group when its ESS < threshold · size.
    4. Backup ``Q_j(a) = Σ_{i∈a} w̄_i G_i``, accumulated over rounds weighted by particle counts; between rounds
       keep the best half by ``g + logits + σ(completed Q̂)``.
    5. Action: the Gumbel MuZero choice among the most-visited; policy target ``softmax(logits + σ(completed
       Q̂))``; root value: the particle-weighted mean of ``Q̂`` (MCTS's root value).

    ``tau = math.inf`` turns off the twist and with it all resampling: Sequential Halving over plain rollouts
    (the ablation the notebook always shows beside TSMCTS)."""
    return _sh_search(model, net, roots, n_particles, depth, m, tau, generator, ess_threshold, c_visit, c_scale,
                      halving=True)
