"""Experiment harness of notebook 07: the anchor representations, the seeded random family of representations, the
exact sweep of ``Δ_A``/``Δ_V`` with control success, the quadrant counts, and learned actor- vs value-derived
representations over seeds.

The random family follows ``discrete-cube/sweep_random_phi_family.py`` of the public code: the same eleven
templates with the same weights, transforms, hash moduli and the same order of draws from a NumPy ``Generator``, so
seed 0 gives the released family (our own vectorised code: each representation is a few tensor operations on the
per-pair features instead of a Python function called per pair).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy import stats

from .method import group_entropies, group_ids, mixed_policy, success_probability, train_goal_rep
from .problems import DiscreteCube, Tasks

__all__ = [
    "ANCHORS", "TEMPLATES", "Collapse", "Learned", "Phi", "Sweep", "anchor_representations", "group_counts",
    "learned_reps", "partial_spearman", "quadrant_counts", "random_phi_family", "spearman", "sweep",
    "value_collapse_example",
]

Tensor = torch.Tensor
Feats = dict[str, Tensor]

ANCHORS = ("value_only", "distances", "actor_like", "signs", "dx_sign")
TEMPLATES = ("value_plus", "dist_coarse", "dir_subset", "dir_coarse", "mixed_dir_dist", "phase_split", "proj_mod",
             "two_hash", "hashed_actor", "hashed_dist", "drop_id")
TEMPLATE_WEIGHTS = (0.14, 0.16, 0.18, 0.16, 0.12, 0.08, 0.08, 0.04, 0.08, 0.08, 0.08)
DIR_FEATS = ("dx1", "dy1", "dx2", "dy2")
ACTOR_HASH_MODS = (2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128)
DIST_HASH_MODS = (2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64)
SENTINEL = -9


# ------------------------------------------------------------------------------------------- transforms
def _sgn(x: Tensor) -> Tensor:
    return torch.sign(x)


def _clip(c: int) -> Callable[[Tensor], Tensor]:
    return lambda x: x.abs().clamp(max=c)


def _sgn_bucket(c: int) -> Callable[[Tensor], Tensor]:
    return lambda x: torch.sign(x) * x.abs().clamp(max=c)


def _bucket(c: int) -> Callable[[Tensor], Tensor]:
    return lambda x: x.clamp(max=c)


T_RAW, T_SIGN, T_ABS = (lambda x: x), _sgn, (lambda x: x.abs())
T_PARITY = lambda x: x.abs() % 2  # noqa: E731
DIR_TF = {"raw": T_RAW, "sign": T_SIGN, "abs": T_ABS, "clip1": _clip(1), "clip2": _clip(2), "clip3": _clip(3),
          "parity": T_PARITY, "sgn_bucket2": _sgn_bucket(2), "sgn_bucket3": _sgn_bucket(3)}
DIST_TF = {"raw": T_RAW, "bucket2": _bucket(2), "bucket3": _bucket(3), "bucket4": _bucket(4), "parity": T_PARITY}
VALUE_TF = {"raw": T_RAW, "bucket3": lambda x: -(-x).clamp(max=3)}


def _pick(rng: np.random.Generator, names: tuple[str, ...] | list[str]) -> str:
    """One uniform choice (the same draw as ``rng.choice`` on the list)."""
    return names[int(rng.choice(len(names)))]


@dataclass
class Phi:
    """A discrete representation of one environment's valid pairs: a name, its template, a readable description;
    :attr:`z` evaluates its integer keys ``(P, k)`` on demand (equal rows = equal ``z``)."""

    name: str
    template: str
    desc: str
    keys: Callable[[Feats], Tensor] = field(repr=False)
    feats: Feats | None = field(default=None, repr=False)

    @property
    def z(self) -> Tensor:
        if self.feats is None:
            raise ValueError(f"representation {self.name} is not bound to an environment")
        return self.keys(self.feats)


def _stack(*cols: Tensor) -> Tensor:
    return torch.stack([c.long() for c in cols], 1)


def _parts(parts: list[tuple[str, Callable[[Tensor], Tensor] | None]]) -> Callable[[Feats], Tensor]:
    return lambda f: _stack(*[(tf(f[n]) if tf is not None else f[n]) for n, tf in parts])


def _hash(coeffs: np.ndarray, bias: int, mod: int, names: list[str]) -> Callable[[Feats], Tensor]:
    """Universal hash ``(bias + Σ c_i x_i) mod m`` of integer features (Python's modulo sign convention)."""
    c = torch.as_tensor(np.asarray(coeffs, dtype=np.int64))
    def h(f: Feats) -> Tensor:
        x = torch.stack([f[n].long() for n in names], 1)
        return torch.remainder(bias + (x * c.to(x.device)).sum(1), mod)
    return h


def _prefix(kind: str, h: Callable[[Feats], Tensor]) -> Callable[[Feats], Tensor]:
    if kind == "none":
        return lambda f: _stack(h(f))
    if kind == "holding":
        return lambda f: _stack(f["holding"], h(f))
    return lambda f: _stack(f["holding"], f["target"], h(f))


def anchor_representations(env: DiscreteCube, feats: Feats | None = None) -> list[Phi]:
    """The five hand-made anchors of the paper: ``value_only`` Z = (V); ``distances`` Z = (holding, |target→goal|₁,
    |agent→target|₁); ``actor_like`` ("full") Z = (holding, target, dx1, dy1, dx2, dy2); ``signs`` (their signs);
    ``dx_sign`` Z = (holding, target, sgn dx2). Bound to ``env``'s valid pairs."""
    feats = env.pair_features() if feats is None else feats
    phis = [
        Phi("value_only", "anchor", "Z=(V)", lambda f: _stack(f["V"])),
        Phi("distances", "anchor", "Z=(holding, d_bg, d_at)", lambda f: _stack(f["holding"], f["d_bg"], f["d_at"])),
        Phi("actor_like", "anchor", "Z=(holding, target, dx1, dy1, dx2, dy2)",
            lambda f: _stack(f["holding"], f["target"], f["dx1"], f["dy1"], f["dx2"], f["dy2"])),
        Phi("signs", "anchor", "Z=(holding, target, sgn dx1, sgn dy1, sgn dx2, sgn dy2)",
            lambda f: _stack(f["holding"], f["target"], *[torch.sign(f[k]) for k in DIR_FEATS])),
        Phi("dx_sign", "anchor", "Z=(holding, target, sgn dx2)",
            lambda f: _stack(f["holding"], f["target"], torch.sign(f["dx2"]))),
    ]
    for p in phis:
        p.feats = feats
    return phis


def _random_phi(k: int, rng: np.random.Generator) -> Phi:
    """Draw representation ``k`` of the random family (draw order as in the public generator)."""
    w = np.array(TEMPLATE_WEIGHTS, dtype=float)
    t = TEMPLATES[int(rng.choice(len(TEMPLATES), p=w / w.sum()))]
    name = f"rand_{t}_{k}"
    if t == "value_plus":
        use_target = bool(rng.integers(0, 2))
        tf = _pick(rng, list(VALUE_TF))
        parts = [("holding", None)] + ([("target", None)] if use_target else []) + [("V", VALUE_TF[tf])]
        return Phi(name, t, f"holding{'+target' if use_target else ''}+V:{tf}", _parts(parts))
    if t == "dist_coarse":
        tf1, tf2 = _pick(rng, list(DIST_TF)), _pick(rng, list(DIST_TF))
        use_target = bool(rng.integers(0, 2))
        parts = [("holding", None)] + ([("target", None)] if use_target else []) + [("d_bg", DIST_TF[tf1]),
                                                                                    ("d_at", DIST_TF[tf2])]
        return Phi(name, t, f"holding{'+target' if use_target else ''}+d_bg:{tf1}+d_at:{tf2}", _parts(parts))
    if t == "dir_subset":
        use_target = bool(rng.integers(0, 2))
        num = int(rng.integers(1, 5))
        chosen = [DIR_FEATS[i] for i in rng.choice(len(DIR_FEATS), size=num, replace=False)]
        parts = [("holding", None)] + ([("target", None)] if use_target else []) + [(c, T_SIGN) for c in chosen]
        return Phi(name, t, f"holding{'+target' if use_target else ''}+sign({','.join(chosen)})", _parts(parts))
    if t == "dir_coarse":
        tfs = [_pick(rng, list(DIR_TF)) for _ in range(4)]
        parts = [("holding", None), ("target", None)] + [(c, DIR_TF[x]) for c, x in zip(DIR_FEATS, tfs, strict=True)]
        return Phi(name, t, "holding+target+" + "+".join(f"{c}:{x}" for c, x in zip(DIR_FEATS, tfs, strict=True)),
                   _parts(parts))
    if t == "mixed_dir_dist":
        use_target = bool(rng.integers(0, 2))
        num = int(rng.integers(1, 5))
        chosen = [DIR_FEATS[i] for i in rng.choice(len(DIR_FEATS), size=num, replace=False)]
        tfs = [_pick(rng, ["sign", "parity", "clip1", "sgn_bucket2", "sgn_bucket3"]) for _ in range(num)]
        tf_bg, tf_at = _pick(rng, list(DIST_TF)), _pick(rng, list(DIST_TF))
        parts = ([("holding", None)] + ([("target", None)] if use_target else [])
                 + [(c, DIR_TF[x]) for c, x in zip(chosen, tfs, strict=True)]
                 + [("d_bg", DIST_TF[tf_bg]), ("d_at", DIST_TF[tf_at])])
        return Phi(name, t, "+".join(n for n, _ in parts), _parts(parts))
    if t == "phase_split":
        tf_a, tf_b = (_pick(rng, ["sign", "sgn_bucket2", "parity"]) for _ in range(2))
        tf_da, tf_db = (_pick(rng, ["bucket2", "bucket3", "bucket4"]) for _ in range(2))
        return Phi(name, t, f"phase_split(a={tf_a}, b={tf_b}, d_at={tf_da}, d_bg={tf_db})",
                   _phase_split(DIR_TF[tf_a], DIR_TF[tf_b], DIST_TF[tf_da], DIST_TF[tf_db]))
    if t == "proj_mod":
        pool = ["holding", "target", "dx1", "dy1", "dx2", "dy2", "d_at", "d_bg", "V"]
        m = int(rng.integers(3, len(pool) + 1))
        chosen = [pool[i] for i in rng.choice(len(pool), size=m, replace=False)]
        mod = int(rng.choice(ACTOR_HASH_MODS))
        coeffs = rng.integers(1, 2**31 - 1, size=m, dtype=np.int64)
        bias = int(rng.integers(0, 10**6))
        keep = ["none", "holding", "holding_target"][int(rng.choice(3, p=[0.30, 0.35, 0.35]))]
        return Phi(name, t, f"proj_mod({'+'.join(chosen)}, mod={mod}, prefix={keep})",
                   _prefix(keep, _hash(coeffs, bias, mod, chosen)))
    if t == "two_hash":
        mod1, mod2 = int(rng.choice(DIST_HASH_MODS)), int(rng.choice(DIST_HASH_MODS))
        c1 = rng.integers(1, 2**31 - 1, size=3, dtype=np.int64)
        c2 = rng.integers(1, 2**31 - 1, size=3, dtype=np.int64)
        b1, b2 = int(rng.integers(0, 10**6)), int(rng.integers(0, 10**6))
        use_target = bool(rng.integers(0, 2))
        h1, h2 = _hash(c1, b1, mod1, ["dx1", "dy1", "d_at"]), _hash(c2, b2, mod2, ["dx2", "dy2", "d_bg"])
        keys = ((lambda f: _stack(f["holding"], f["target"], h1(f), h2(f))) if use_target
                else (lambda f: _stack(f["holding"], h1(f), h2(f))))
        return Phi(name, t, f"two_hash(mod1={mod1}, mod2={mod2}, target={use_target})", keys)
    if t == "hashed_actor":
        mod = int(rng.choice(ACTOR_HASH_MODS))
        coeffs = rng.integers(1, 2**31 - 1, size=6, dtype=np.int64)
        bias = int(rng.integers(0, 10**6))
        keep = ["none", "holding", "holding_target"][int(rng.choice(3, p=[0.25, 0.35, 0.40]))]
        h = _hash(coeffs, bias, mod, ["dx1", "dy1", "dx2", "dy2", "d_bg", "d_at"])
        return Phi(name, t, f"hash_actor(mod={mod}, prefix={keep})", _prefix(keep, h))
    if t == "hashed_dist":
        mod = int(rng.choice(DIST_HASH_MODS))
        coeffs = rng.integers(1, 2**31 - 1, size=3, dtype=np.int64)
        bias = int(rng.integers(0, 10**6))
        use_target = bool(rng.integers(0, 2))
        h = _hash(coeffs, bias, mod, ["d_bg", "d_at", "V"])
        return Phi(name, t, f"hash_dist(mod={mod}, target={use_target})",
                   _prefix("holding_target" if use_target else "holding", h))
    # drop_id: the target colour is dropped
    tfs = [_pick(rng, ["sign", "parity", "clip1"]) for _ in range(4)]
    parts = [("holding", None)] + [(c, DIR_TF[x]) for c, x in zip(DIR_FEATS, tfs, strict=True)]
    return Phi(name, t, "holding+" + "+".join(f"{c}:{x}" for c, x in zip(DIR_FEATS, tfs, strict=True)),
               _parts(parts))


def _phase_split(tf_a, tf_b, tf_da, tf_db) -> Callable[[Feats], Tensor]:
    """Empty-handed: (h, t, a(dx1), a(dy1), −9, −9, da(d_at)); carrying: (h, t, −9, −9, b(dx2), b(dy2), db(d_bg))."""
    def keys(f: Feats) -> Tensor:
        h = f["holding"]
        empty = h == 0
        sent = torch.full_like(h, SENTINEL)
        pick = lambda x, y: torch.where(empty, x, y)  # noqa: E731
        return _stack(h, f["target"], pick(tf_a(f["dx1"]), sent), pick(tf_a(f["dy1"]), sent),
                      pick(sent, tf_b(f["dx2"])), pick(sent, tf_b(f["dy2"])), pick(tf_da(f["d_at"]), tf_db(f["d_bg"])))
    return keys


def random_phi_family(env: DiscreteCube, num: int, seed: int) -> list[Phi]:
    """The five anchors followed by ``num`` random representations drawn from the public generator's templates with
    ``np.random.default_rng(seed)``, bound to ``env``'s valid pairs."""
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    feats = env.pair_features()
    rng = np.random.default_rng(seed)
    randoms = [_random_phi(k, rng) for k in range(num)]
    for p in randoms:
        p.feats = feats
    return anchor_representations(env, feats) + randoms


# ------------------------------------------------------------------------------------------- the sweep
@dataclass
class Sweep:
    """Per representation: name, template, the information terms and the success rate of its Bayes policy (the
    released horizon rule) and with each task's own horizon."""

    names: list[str]
    templates: list[str]
    terms: dict[str, np.ndarray]
    success: np.ndarray
    success_task_horizon: np.ndarray

    def __getitem__(self, key: str) -> np.ndarray:
        return self.terms[key]

    def row(self, name: str) -> dict[str, float]:
        i = self.names.index(name)
        return {**{k: float(v[i]) for k, v in self.terms.items()}, "success": float(self.success[i]),
                "success_task_horizon": float(self.success_task_horizon[i])}

    @property
    def is_anchor(self) -> np.ndarray:
        return np.array([t == "anchor" for t in self.templates])


def sweep(env: DiscreteCube, phis: list[Phi], tasks: Tasks, chunk: int = 16) -> Sweep:
    """Exact information terms of every representation and the success of its Bayes policy on ``tasks``: the exact
    expected success (:func:`success_probability`), which the released code estimates with 50 rollouts per task."""
    if not phis:
        raise ValueError("need at least one representation")
    feats = env.pair_features()
    s, g = feats["s"], feats["g"]
    action = env.optimal_action_dist(torch.float64)[s, g]
    terms: dict[str, list[float]] = {}
    succ, succ_task = [], []
    for start in range(0, len(phis), chunk):
        batch = phis[start:start + chunk]
        tables = []
        for phi in batch:
            z = phi.keys(feats)  # the sweep's own features: phis may come from another binding of env
            for k, v in group_entropies(action, feats["V"], s, z).items():
                terms.setdefault(k, []).append(v)
            tables.append(mixed_policy(env, z))
        common, own = success_probability(env, torch.stack(tables), tasks)
        succ.append(common.mean(1).cpu().numpy())
        succ_task.append(own.mean(1).cpu().numpy())
    return Sweep(names=[p.name for p in phis], templates=[p.template for p in phis],
                 terms={k: np.array(v) for k, v in terms.items()}, success=np.concatenate(succ),
                 success_task_horizon=np.concatenate(succ_task))


def quadrant_counts(sw: Sweep, tol: float = 1e-9) -> dict[str, int]:
    """How many representations are value- and/or action-sufficient (a gap ≤ ``tol`` counts as zero), as the
    released sweep labels them."""
    vs = np.abs(sw["Delta_V"]) <= tol
    acs = np.abs(sw["Delta_A"]) <= tol
    return {"value-suff & action-suff": int((vs & acs).sum()), "value-suff & action-insuff": int((vs & ~acs).sum()),
            "value-insuff & action-suff": int((~vs & acs).sum()),
            "value-insuff & action-insuff": int((~vs & ~acs).sum())}


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (``scipy.stats.spearmanr``)."""
    return float(stats.spearmanr(x, y).statistic)


def partial_spearman(x: np.ndarray, y: np.ndarray, given: np.ndarray) -> float:
    """Spearman's ρ of ``x`` and ``y`` with ``given`` partialled out: the Pearson correlation of the ranks'
    residuals after a least-squares fit on the ranks of ``given`` (with intercept). Claims audit B (07 C3/C4): the
    association of success with Δ_V that Δ_A does not already explain."""
    rx, ry, rg = (stats.rankdata(v) for v in (x, y, given))
    basis = np.stack([np.ones_like(rg), rg], 1)
    res = [r - basis @ np.linalg.lstsq(basis, r, rcond=None)[0] for r in (rx, ry)]
    return float(stats.pearsonr(*res).statistic)


def group_counts(env: DiscreteCube, phis: list[Phi]) -> np.ndarray:
    """How many distinct ``(s, z)`` groups each representation keeps over the valid pairs: a plain resolution proxy
    (the control of C3 in notebook 07 — more groups, fewer goals merged)."""
    s, _ = env.valid_pairs()
    return np.array([group_ids(s, p.z)[1] for p in phis])


# ------------------------------------------------------------------------------------------- learned representations
@dataclass
class Learned:
    """Success and excess log-loss of learned actor- and value-derived representations, per seed."""

    seeds: list[int]
    success: dict[str, np.ndarray]
    excess_logloss: dict[str, np.ndarray]
    losses: dict[str, np.ndarray]

    @property
    def gap(self) -> float:
        """Mean over seeds of success(actor-derived) − success(value-derived)."""
        return float((self.success["actor"] - self.success["value"]).mean())


def learned_reps(env: DiscreteCube, tasks: Tasks, seeds: list[int], d: int, steps: int, **train_kw) -> Learned:
    """Train value-derived and actor-derived representations for every seed (:func:`train_goal_rep`, the seeds
    together); success is each learned actor's exact expected success on the sweep's tasks (released horizon
    rule)."""
    succ, exc, losses = {}, {}, {}
    for kind in ("value", "actor"):
        tr = train_goal_rep(env, kind, d, steps, list(seeds), **train_kw)
        succ[kind] = success_probability(env, tr.policy, tasks)[0].mean(1).cpu().numpy()
        exc[kind] = tr.excess_logloss.cpu().numpy()
        losses[kind] = tr.actor_losses.cpu().numpy()
        if kind == "value":
            losses["value_phase_value"] = tr.value_losses.cpu().numpy()
    return Learned(seeds=list(seeds), success=succ, excess_logloss=exc, losses=losses)


@dataclass
class Collapse:
    """A witness that ``Z = V`` is not action-sufficient: one state and two goals with the same value whose optimal
    actions are disjoint (the mixed policy of ``Z = V`` must split its mass between them)."""

    state: Tensor
    goals: Tensor
    value: int
    actions: list[list[int]]


def value_collapse_example(env: DiscreteCube) -> Collapse:
    """The first valid pair of goals (state-major order) that share a state and a value, have disjoint optimal
    action sets and the shortest distance among such pairs; empty-handed states only (easiest to draw)."""
    feats = env.pair_features()
    s, g, v = feats["s"], feats["g"], feats["V"]
    pi = env.optimal_action_dist()[s, g] > 0
    empty = feats["holding"] == 0
    best = None
    for d in range(1, int(env.dist.max()) + 1):
        cand = torch.nonzero(empty & (v == -d)).squeeze(1)
        for i in cand.tolist():
            same = cand[(s[cand] == s[i]) & (g[cand] > g[i])]
            disjoint = same[~(pi[same] & pi[i]).any(-1)]
            if len(disjoint):
                best = (i, int(disjoint[0]))
                break
        if best:
            break
    if best is None:
        raise RuntimeError("no value collapse found")
    i, j = best
    return Collapse(state=env.states[s[i]], goals=env.goals[torch.stack([g[i], g[j]])], value=int(v[i]),
                    actions=[torch.nonzero(pi[i]).squeeze(1).tolist(), torch.nonzero(pi[j]).squeeze(1).tolist()])
