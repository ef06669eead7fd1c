"""Action and value sufficiency of goal representations, exactly, and learned goal representations (paper 07).

Notation (all entropies in nats, averaged uniformly over the valid (state, goal) pairs; a representation
``Z = φ(S, G)`` is given by its integer keys per pair):

* ``Δ_A = I(A; G | S, Z) = H(A|S,Z) − H(A|S,G)``: action insufficiency, where ``p(a | s, z)`` is the mean of
  ``π*(a | s, g)`` over the pairs that share ``(s, z)`` (the Bayes, "mixed", policy of a perfect low-level actor that
  only sees ``z``).
* ``Δ_V = I(V; G | S, Z) = H(V|S,Z)``: value insufficiency (``H(V|S,G) = 0``: the value is a function of the pair).
* ``I(A; Z | S, V) = H(A|S,V) − H(A|S,V,Z)`` and ``I(A; V | S, Z) = H(A|S,Z) − H(A|S,V,Z)``, so that
  ``H(A|S,Z) = H(A|S,V) − I(A;Z|S,V) + I(A;V|S,Z)``.

The released code computes the two mutual informations as these differences, which makes the identity hold by
construction; :func:`group_entropies` also computes them (and ``Δ_A``) in the KL form
``I(X; Y | W) = E KL(p(x | w, y) ‖ p(x | w))``, so the identity's residual is a real check of the grouping.

Groups are formed with ``torch.unique`` on mixed-radix keys and sums with ``index_add_``: one pass over the pairs per
representation (the released code loops in Python over pairs). Learned representations (:func:`train_goal_rep`)
follow the OTA agent of the public code: ``φ([s; g])`` is an MLP with a length-normalised output, the value head sees
``(s, φ)`` and the actor head sees ``(s, φ)``; "value-derived" trains φ through the value loss, "actor-derived" through
the actor's log-loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ...common.train import fit
from .problems import DiscreteCube, Tasks

__all__ = [
    "GoalRepAgent", "TrainedRep", "entropy", "first_hit_times", "group_entropies", "group_ids", "mixed_policy",
    "policy_of", "rollout_success", "success_probability", "success_rate", "train_goal_rep",
]

Tensor = torch.Tensor


# ------------------------------------------------------------------------------------------- grouping, entropies
def group_ids(*cols: Tensor) -> tuple[Tensor, int]:
    """Dense ids ``0..K−1`` of the distinct rows of integer columns (each ``(P,)`` or ``(P, k)``), and ``K``.

    Each column is shifted to start at 0 and combined with the others in mixed radix (radix = its range); the
    key is compacted with ``torch.unique`` before the product of radices could overflow int64, and at the end."""
    flat = [c[:, None] if c.ndim == 1 else c for c in cols]
    parts = [c[:, j] for c in flat for j in range(c.shape[1])]
    if not parts or len(parts[0]) == 0:
        raise ValueError("group_ids needs at least one non-empty column")
    key = torch.zeros_like(parts[0], dtype=torch.long)
    size = 1
    for col in parts:
        lo, hi = int(col.min()), int(col.max())
        radix = hi - lo + 1
        if radix >= 2**31:  # sparse codes (hashes): compact the column itself first
            u, col = torch.unique(col, return_inverse=True)
            lo, radix = 0, len(u)
        if size * radix >= 2**62:
            uk, key = torch.unique(key, return_inverse=True)
            size = len(uk)
        key = key * radix + (col.long() - lo)
        size *= radix
    uk, ids = torch.unique(key, return_inverse=True)
    return ids, len(uk)


def _group_mean(x: Tensor, ids: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Mean of the rows of ``x`` within each group and the group sizes."""
    counts = torch.bincount(ids, minlength=k).to(x.dtype)
    sums = torch.zeros(k, x.shape[1], dtype=x.dtype, device=x.device).index_add_(0, ids, x)
    return sums / counts[:, None], counts


def entropy(p: Tensor) -> Tensor:
    """Shannon entropy in nats of each row of ``p`` (``0 log 0 = 0``)."""
    return -torch.special.xlogy(p, p).sum(-1)


def _kl(p: Tensor, q: Tensor) -> Tensor:
    """Row-wise ``KL(p ‖ q)``; ``q`` is a mixture containing ``p``, so ``q > 0`` wherever ``p > 0``."""
    return (torch.special.xlogy(p, p) - torch.special.xlogy(p, q)).sum(-1)


def _check_pairs(action: Tensor, values: Tensor, state_idx: Tensor, z_keys: Tensor) -> None:
    P = action.shape[0]
    if action.ndim != 2 or P == 0:
        raise ValueError(f"action must be a non-empty (pairs, actions) array, got shape {tuple(action.shape)}")
    if not torch.isfinite(action).all() or (action < 0).any():
        raise ValueError("action distributions must be finite and non-negative")
    if not torch.allclose(action.sum(-1), torch.ones_like(action[:, 0]), atol=1e-9):
        raise ValueError("each action row must sum to 1")
    for name, t in (("values", values), ("state_idx", state_idx), ("z_keys", z_keys)):
        if t.shape[0] != P:
            raise ValueError(f"{name} has {t.shape[0]} rows, action has {P}")
        if t.is_floating_point():
            raise ValueError(f"{name} must hold integer keys (quantise a continuous representation first)")


def group_entropies(action: Tensor, values: Tensor, state_idx: Tensor, z_keys: Tensor) -> dict[str, float]:
    """The information terms of a discrete representation over uniformly weighted pairs.

    ``action (P, A)``: ``π*(·|s, g)`` per pair; ``values (P,)``: the integer value; ``state_idx (P,)``; ``z_keys (P,)``
    or ``(P, k)`` integers (equal rows = equal ``z``). Returns ``H_A_SG, H_A_SZ, H_V_SZ, H_A_SV, H_A_SVZ, Delta_A,
    Delta_V, I_A_Z_given_SV, I_A_V_given_SZ`` (entropy differences, as the paper defines them), their KL forms
    ``Delta_A_kl, I_A_Z_given_SV_kl, I_A_V_given_SZ_kl``, the identity residual
    ``H(A|S,Z) − (H(A|S,V) − I_kl(A;Z|S,V) + I_kl(A;V|S,Z))`` and the number of ``(s, z)`` groups."""
    _check_pairs(action, values, state_idx, z_keys)
    p = action.to(torch.float64)
    g_sz, k_sz = group_ids(state_idx, z_keys)
    g_sv, k_sv = group_ids(state_idx, values)
    g_svz, k_svz = group_ids(g_sz, values)  # (s, z, v): refine the (s, z) groups by the value
    m_sz, c_sz = _group_mean(p, g_sz, k_sz)
    m_sv, c_sv = _group_mean(p, g_sv, k_sv)
    m_svz, c_svz = _group_mean(p, g_svz, k_svz)
    P = p.shape[0]
    # H(A | W) = Σ_w |w|/P · H(mean of π* over the pairs in w), for W = (S,G), (S,Z), (S,V), (S,V,Z)
    H_A_SG = entropy(p).mean()
    H_A_SZ = (c_sz * entropy(m_sz)).sum() / P
    H_A_SV = (c_sv * entropy(m_sv)).sum() / P
    H_A_SVZ = (c_svz * entropy(m_svz)).sum() / P
    # H(V | S, Z): the value histogram inside each (s, z) group; p(v | s, z) = |(s, z, v)| / |(s, z)|
    parent = torch.zeros(k_svz, dtype=torch.long, device=p.device).index_copy_(0, g_svz, g_sz)
    H_V_SZ = -(c_svz * torch.log(c_svz / c_sz[parent])).sum() / P
    # KL forms: I(A;G|S,Z) pair by pair; I(A;Z|S,V) and I(A;V|S,Z) over the (s, z, v) groups and their parents
    dA_kl = _kl(p, m_sz[g_sz]).mean()
    parent_sv = torch.zeros(k_svz, dtype=torch.long, device=p.device).index_copy_(0, g_svz, g_sv)
    i_az_kl = (c_svz * _kl(m_svz, m_sv[parent_sv])).sum() / P
    i_av_kl = (c_svz * _kl(m_svz, m_sz[parent])).sum() / P
    out = {
        "H_A_SG": H_A_SG, "H_A_SZ": H_A_SZ, "H_V_SZ": H_V_SZ, "H_A_SV": H_A_SV, "H_A_SVZ": H_A_SVZ,
        "Delta_A": H_A_SZ - H_A_SG, "Delta_V": H_V_SZ, "I_A_Z_given_SV": H_A_SV - H_A_SVZ,
        "I_A_V_given_SZ": H_A_SZ - H_A_SVZ, "Delta_A_kl": dA_kl, "I_A_Z_given_SV_kl": i_az_kl,
        "I_A_V_given_SZ_kl": i_av_kl, "identity_residual": H_A_SZ - (H_A_SV - i_az_kl + i_av_kl),
    }
    res = {k: float(v) + 0.0 for k, v in out.items()}  # + 0.0 turns −0.0 into 0.0
    res["groups_sz"] = float(k_sz)
    return res


# ------------------------------------------------------------------------------------------- policies, rollouts
def mixed_policy(env: DiscreteCube, z_keys: Tensor, dtype: torch.dtype = torch.float64) -> Tensor:
    """The Bayes policy of a representation as a table ``(S, G, 6)``: on a valid pair, the mean of ``π*`` over the
    valid pairs with the same ``(s, z)``; elsewhere ``π*`` itself (the released evaluation's fallback: the paper
    averages only over valid pairs). ``z_keys`` has one row per valid pair, in :meth:`DiscreteCube.valid_pairs`
    order."""
    s, g = env.valid_pairs()
    if z_keys.shape[0] != len(s):
        raise ValueError(f"z_keys has {z_keys.shape[0]} rows, the environment has {len(s)} valid pairs")
    table = env.optimal_action_dist(dtype)
    ids, k = group_ids(s, z_keys)
    mean, _ = _group_mean(table[s, g], ids, k)
    table[s, g] = mean[ids]
    return table


def first_hit_times(env: DiscreteCube, policy: Tensor, tasks: Tasks, n_rollouts: int, rng: torch.Generator,
                    horizon: int | None = None) -> Tensor:
    """Roll out stochastic policies ``(S, G, 6)`` or ``(F, S, G, 6)`` from every task ``n_rollouts`` times and return
    the first step at which the goal holds, ``(F, T, R)`` (``horizon + 1`` if never within ``horizon`` steps;
    default horizon: the longest task horizon, which the released code applies to every task).

    Actions are drawn by inverse CDF, ``a = #{k : F_k ≤ u}`` with ``F`` the cumulative policy row (the released
    code's rule). One uniform draw per (task, rollout, step) is shared by all policies in the batch (common random
    numbers: identical policies get identical outcomes)."""
    if n_rollouts < 1:
        raise ValueError(f"n_rollouts must be >= 1, got {n_rollouts}")
    pol = policy[None] if policy.ndim == 3 else policy
    F, S, G, A = pol.shape
    if (S, G, A) != (env.num_states, env.num_goals, 6):
        raise ValueError(f"policy must have shape (S, G, 6) = ({env.num_states}, {env.num_goals}, 6), "
                         f"got {tuple(policy.shape)}")
    if not torch.isfinite(pol).all():
        raise ValueError("policy contains NaN or inf")
    H = int(tasks.horizon.max()) if horizon is None else int(horizon)
    cum = pol.cumsum(-1)
    cum = (cum / cum[..., -1:]).reshape(F * S * G, A)
    cum[:, -1] = 1.0  # u < 1, so the last action is drawn exactly when the others' mass is exhausted
    dev = cum.device
    T, R = len(tasks), n_rollouts
    u = torch.rand((T * R, H), generator=rng, device=dev, dtype=cum.dtype)
    # one row per trajectory (policy f, task i, rollout r), compacted as trajectories succeed
    traj = torch.arange(F * T * R, device=dev)
    f, rest = traj // (T * R), traj % (T * R)
    g = tasks.goal.to(dev)[rest // R]
    s = tasks.state.to(dev)[rest // R]
    base = f * (S * G) + g  # row of (f, s, g) in `cum` is base + s * G
    success, succ = env.success.reshape(-1), env.succ.reshape(-1)
    hit = torch.full((F * T * R,), H + 1, dtype=torch.long, device=dev)
    for t in range(H + 1):
        # success is checked before acting, as in the released rollout; a trajectory that succeeds stops here
        now = success[s * G + g]
        hit[traj[now]] = t
        keep = ~now
        traj, rest, g, s, base = traj[keep], rest[keep], g[keep], s[keep], base[keep]
        if t == H or len(traj) == 0:
            break
        # inverse-CDF draw: a = #{k : F_k <= u}
        a = (cum[base + s * G] <= u[rest, t, None]).sum(-1)
        s = succ[s * 6 + a]
    return hit.reshape(F, T, R)


def rollout_success(env: DiscreteCube, policy: Tensor, tasks: Tasks, n_rollouts: int, rng: torch.Generator,
                    per_task_horizon: bool = False) -> Tensor:
    """Success rate of each policy (shape ``(F,)``, or a scalar for one ``(S, G, 6)`` table) over tasks × rollouts.

    Default: every task gets the longest task horizon (what the released evaluation does); with
    ``per_task_horizon`` each task its own ``min(d* + margin, cap)``."""
    rate = success_rate(first_hit_times(env, policy, tasks, n_rollouts, rng), tasks, per_task_horizon)
    return rate[0] if policy.ndim == 3 else rate


def success_probability(env: DiscreteCube, policy: Tensor, tasks: Tasks) -> tuple[Tensor, Tensor]:
    """Exact probability that each policy reaches each task's goal, ``(F, T)`` twice: within the longest task
    horizon (the released rule) and within the task's own horizon. This is the expectation that
    :func:`rollout_success` estimates with rollouts, computed by dynamic programming on the Markov chain the policy
    induces: ``p_0 = 1[success]``, ``p_{t+1}(s, g) = 1`` on success, else ``Σ_a π(a|s,g) p_t(succ(s, a), g)``."""
    pol = policy[None] if policy.ndim == 3 else policy
    F, S, G, A = pol.shape
    if (S, G, A) != (env.num_states, env.num_goals, 6):
        raise ValueError(f"policy must have shape (S, G, 6) = ({env.num_states}, {env.num_goals}, 6), "
                         f"got {tuple(policy.shape)}")
    if not torch.isfinite(pol).all():
        raise ValueError("policy contains NaN or inf")
    pol = pol.to(torch.float64).permute(0, 1, 3, 2).contiguous()  # (F, S, A, G)
    s0, g0, h = (x.to(pol.device) for x in (tasks.state, tasks.goal, tasks.horizon))
    H = int(h.max())
    done = env.success.to(torch.float64)[None].expand(F, S, G)
    p = done.clone()
    own = torch.where(h == 0, p[:, s0, g0], torch.zeros_like(p[:, s0, g0]))
    for t in range(1, H + 1):
        # p_t(s, g) = Σ_a π(a|s,g) p_{t-1}(succ(s, a), g), and 1 once the goal holds
        p = torch.maximum(done, (pol * p[:, env.succ, :]).sum(2))
        own = torch.where(h == t, p[:, s0, g0], own)
    return p[:, s0, g0], own


def success_rate(hit: Tensor, tasks: Tasks, per_task_horizon: bool = False) -> Tensor:
    """Fraction of rollouts (``hit``: first-success steps ``(F, T, R)``) that reached the goal within the longest task
    horizon (the released rule) or within each task's own horizon, per policy ``(F,)``."""
    limit = tasks.horizon.to(hit.device)[None, :, None] if per_task_horizon else int(tasks.horizon.max())
    return (hit <= limit).to(torch.float64).mean(dim=(1, 2))


# ------------------------------------------------------------------------------------------- learned representations
class EnsembleMLP(nn.Module):
    """``E`` independent MLPs evaluated together with batched matrix products: input ``(E, B, in)``, output
    ``(E, B, out)``. Member ``e`` is initialised from its own seed like ``nn.Linear`` (uniform in ``±1/√fan_in``), so
    training several seeds at once gives each the result it would get alone (Adam's update is elementwise)."""

    def __init__(self, sizes: list[int], seeds: list[int], dtype: torch.dtype = torch.float32):
        super().__init__()
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            bound = fan_in**-0.5
            w = torch.stack([torch.empty(fan_in, fan_out, dtype=dtype).uniform_(-bound, bound, generator=g)
                             for g in gens])
            b = torch.stack([torch.empty(1, fan_out, dtype=dtype).uniform_(-bound, bound, generator=g)
                             for g in gens])
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(b))

    def forward(self, x: Tensor) -> Tensor:
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(b, x, w)
            if i < last:
                x = nn.functional.gelu(x)
        return x


class GoalRepAgent(nn.Module):
    """An ensemble of agents (one per seed): ``φ([s; g]) ∈ R^d`` (MLP, length-normalised to norm √d as in the
    public OTA agent), a value head ``V(s, φ)`` and an actor head ``π(a | s, φ)``, each an MLP with two hidden
    layers."""

    def __init__(self, s_dim: int, g_dim: int, d: int, seeds: list[int], hidden: int = 64, n_actions: int = 6,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        self.d = d
        seeds = list(seeds)
        self.encoder = EnsembleMLP([s_dim + g_dim, hidden, hidden, d], seeds, dtype)
        self.value = EnsembleMLP([s_dim + d, hidden, hidden, 1], [s + 10_007 for s in seeds], dtype)
        self.actor = EnsembleMLP([s_dim + d, hidden, hidden, n_actions], [s + 20_011 for s in seeds], dtype)

    def rep(self, s: Tensor, g: Tensor) -> Tensor:
        """``φ([s; g])`` for inputs ``(E, B, ·)``, on the sphere of radius √d."""
        z = self.encoder(torch.cat([s, g], -1))
        return z / z.norm(dim=-1, keepdim=True).clamp_min(1e-8) * self.d**0.5

    def logits(self, s: Tensor, z: Tensor) -> Tensor:
        return self.actor(torch.cat([s, z], -1))

    def v(self, s: Tensor, z: Tensor) -> Tensor:
        return self.value(torch.cat([s, z], -1)).squeeze(-1)


@dataclass
class TrainedRep:
    """Trained goal representations, one per seed: the agents, the per-seed loss curves, the actors' policy tables
    ``(E, S, G, 6)`` and their excess log-loss ``E[−log q(A|S,Z)] − H(A|S,G)`` over the valid pairs ``(E,)``, an upper
    bound on ``Δ_A`` of the learned ``Z`` (log-loss = ``H(A|S,G) + Δ_A + E KL(p(·|S,Z) ‖ q)``)."""

    kind: str
    seeds: list[int]
    agent: GoalRepAgent
    value_losses: Tensor
    actor_losses: Tensor
    policy: Tensor
    excess_logloss: Tensor


def _soft_ce(logits: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy ``−Σ_a π*(a) log q(a)`` per row."""
    return -(target * torch.log_softmax(logits, -1)).sum(-1)


class _Params(nn.Module):
    """The trainable part of a :class:`GoalRepAgent` for one phase (``fit`` optimises a module's parameters)."""

    def __init__(self, *mods: nn.Module):
        super().__init__()
        self.parts = nn.ModuleList(mods)


def train_goal_rep(env: DiscreteCube, kind: str, d: int, steps: int, seed: int | list[int], *, hidden: int = 64,
                   batch: int = 256, lr: float = 3e-3, dtype: torch.dtype = torch.float32) -> TrainedRep:
    """Learn goal representations (one per seed, trained together) on every solvable, not yet solved pair, with
    uniform minibatches, by one of:

    * ``"value"`` (value-derived, as in HIQL): φ and the value head regress the exact ``V/d_max`` for ``steps``;
      then φ is frozen and the actor head is fitted to ``π*`` by log-loss for ``steps``;
    * ``"actor"`` (actor-derived, the paper's proposal): φ and the actor head are fitted jointly to ``π*`` by
      log-loss for ``steps``.

    The actor is fitted to ``π*`` itself (soft targets), standing in for the advantage-weighted log-likelihood of
    the OTA agent. Trainings run through :func:`repro.common.train.fit` (Adam, cosine schedule)."""
    if kind not in ("value", "actor"):
        raise ValueError(f"kind must be 'value' or 'actor', got {kind!r}")
    if d < 1 or steps < 1:
        raise ValueError(f"need d >= 1 and steps >= 1, got d={d}, steps={steps}")
    seeds = [seed] if isinstance(seed, int) else list(seed)
    if not seeds:
        raise ValueError("need at least one seed")
    dev, E = env.device, len(seeds)
    s_idx, g_idx = torch.nonzero(env.dist > 0, as_tuple=True)
    xs, xg = env.one_hot(s_idx, g_idx, dtype)
    target = env.optimal_action_dist(dtype)[s_idx, g_idx]
    v_target = (env.values()[s_idx, g_idx] / env.dist.max()).to(dtype)
    agent = GoalRepAgent(xs.shape[1], xg.shape[1], d, seeds, hidden, dtype=dtype).to(dev)
    gens = [torch.Generator(device=dev).manual_seed(int(s)) for s in seeds]
    per_member: dict[str, list[Tensor]] = {"value": [], "actor": []}

    def draw() -> Tensor:  # each member its own minibatch stream: (E, batch)
        return torch.stack([torch.randint(0, len(s_idx), (batch,), generator=g, device=dev) for g in gens])

    def actor_step(encoder_grad: bool):
        def step(_: int) -> Tensor:
            i = draw()
            with torch.set_grad_enabled(encoder_grad):
                z = agent.rep(xs[i], xg[i])
            loss = _soft_ce(agent.logits(xs[i], z), target[i]).mean(-1)  # (E,)
            per_member["actor"].append(loss.detach())
            return loss.sum()  # members are independent: the sum trains each on its own loss
        return step

    def value_step(_: int) -> Tensor:
        i = draw()
        loss = ((agent.v(xs[i], agent.rep(xs[i], xg[i])) - v_target[i]) ** 2).mean(-1)
        per_member["value"].append(loss.detach())
        return loss.sum()

    if kind == "value":
        fit(_Params(agent.encoder, agent.value), value_step, steps, lr=lr, schedule="cosine")
        fit(_Params(agent.actor), actor_step(False), steps, lr=lr, schedule="cosine")
    else:
        fit(_Params(agent.encoder, agent.actor), actor_step(True), steps, lr=lr, schedule="cosine")
    agent.eval()
    policy = policy_of(env, agent)
    vs, vg = env.valid_pairs()
    pi = env.optimal_action_dist(torch.float64)[vs, vg]
    q = policy[:, vs, vg]
    excess = (-(pi * torch.log(q.clamp_min(1e-300))).sum(-1) - entropy(pi)).mean(-1)
    stack = lambda xs: torch.stack(xs, 1) if xs else torch.zeros(E, 0, device=dev)  # noqa: E731
    return TrainedRep(kind=kind, seeds=seeds, agent=agent, value_losses=stack(per_member["value"]),
                      actor_losses=stack(per_member["actor"]), policy=policy, excess_logloss=excess)


@torch.no_grad()
def policy_of(env: DiscreteCube, agent: GoalRepAgent, chunk: int = 32768) -> Tensor:
    """Each member's actor ``π(a | s, φ(s, g))`` on every pair, as tables ``(E, S, G, 6)`` in float64."""
    S, G = env.num_states, env.num_goals
    E = agent.encoder.weights[0].shape[0]
    s_all = torch.arange(S, device=env.device).repeat_interleave(G)
    g_all = torch.arange(G, device=env.device).repeat(S)
    dtype = agent.encoder.weights[0].dtype
    out = []
    for i in range(0, S * G, chunk):
        xs, xg = env.one_hot(s_all[i:i + chunk], g_all[i:i + chunk], dtype)
        xs, xg = xs.expand(E, -1, -1), xg.expand(E, -1, -1)
        out.append(torch.softmax(agent.logits(xs, agent.rep(xs, xg)), -1).to(torch.float64))
    return torch.cat(out, 1).reshape(E, S, G, 6)
