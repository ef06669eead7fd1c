"""The notebook's harness for paper 12: probes, task identification against context length, alignment, roles,
the seed study of distillation, and returns on held-out (OOD) tasks."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F

from ...common import stats
from ...common.seeding import derive
from .method import (
    AgentTrajectories,
    ConditionedPolicy,
    D2TRConfig,
    RoleEncoder,
    TrajEncoder,
    conditioning,
    hsic,
    kmeans_roles,
    random_roles,
    sample_contexts,
    scripted_role_labeller,
    train_actor,
    train_role_encoder,
    train_student,
    train_teacher,
    trajectory_features,
)
from .problems import CoopNavEnv, Dataset, TaskSet, collect_dataset, obs_features, pd_controller, transition_features

__all__ = [
    "BC", "D2TR", "LOCAL", "NO_ROLES", "ORACLE", "RAW", "TASK_EMBEDDING", "Leakage", "Representations", "Returns",
    "ReturnStudy", "RoleStudy", "SeedStudy", "TaskID", "alignment", "behaviour_returns", "decentralization_gap",
    "embedding_maps", "evaluate", "leakage_probe", "probe_accuracy", "probe_correct", "raw_role_features",
    "return_study", "role_study", "scripted_variant", "seed_study", "study_role_encoders", "task_id_curve",
    "train_policies", "train_representations",
]

Tensor = torch.Tensor


# ----------------------------------------------------------------------------------------------------------------
# probes
# ----------------------------------------------------------------------------------------------------------------
def probe_correct(x_train: Tensor, y_train: Tensor, x_test: Tensor, y_test: Tensor, *, max_iter: int = 300
                  ) -> np.ndarray:
    """Per test point, whether a multinomial logistic-regression probe (scikit-learn, standardised inputs) fitted
    on the training points names its label: a boolean array ``(len(x_test),)``, the items a bootstrap resamples."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    xa, xb = x_train.detach().double().cpu().numpy(), x_test.detach().double().cpu().numpy()
    if len(xa) == 0 or len(xb) == 0 or not (np.isfinite(xa).all() and np.isfinite(xb).all()):
        raise ValueError("probe_accuracy needs non-empty, finite inputs")
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=max_iter))
    clf.fit(xa, y_train.cpu().numpy())
    return clf.predict(xb) == y_test.cpu().numpy()


def probe_accuracy(x_train: Tensor, y_train: Tensor, x_test: Tensor, y_test: Tensor, *, max_iter: int = 300
                   ) -> float:
    """Held-out accuracy of the logistic-regression probe of :func:`probe_correct`."""
    return float(probe_correct(x_train, y_train, x_test, y_test, max_iter=max_iter).mean())


@dataclass
class Leakage:
    """Single-observation probes (no context) for the joint task, the wind and the decoy, with their chances;
    ``correct[family]`` says, per held-out observation, whether that probe named it (the bootstrap's items)."""

    joint: float
    wind: float
    decoy: float
    chance_joint: float
    chance_wind: float
    chance_decoy: float
    correct: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    FAMILIES = ("joint", "wind", "decoy")

    def items(self) -> tuple[np.ndarray, ...]:
        """The per-observation correctness of the three probes (joint, wind, decoy), one array each."""
        return tuple(self.correct[f] for f in self.FAMILIES)

    def max_excess(self, joint: np.ndarray, wind: np.ndarray, decoy: np.ndarray) -> float:
        """The largest probe accuracy over its chance among the three families (a bootstrap statistic)."""
        return float(max(np.mean(joint) - self.chance_joint, np.mean(wind) - self.chance_wind,
                         np.mean(decoy) - self.chance_decoy))


def leakage_probe(train: Dataset, held: Dataset, n_train: int, n_test: int, seed: int = 0) -> Leakage:
    """Can one local observation (of any agent, any step, no context) name the task? Logistic probes."""
    g = torch.Generator().manual_seed(seed)
    L = train.n_landmarks

    def draw(ds: Dataset, n: int) -> tuple[Tensor, Tensor]:
        T, E, S1, N, D = ds.obs.shape
        flat = ds.obs.reshape(T, -1, D)
        t = torch.randint(0, T, (n,), generator=g)
        j = torch.randint(0, flat.shape[1], (n,), generator=g)
        return obs_features(flat[t.to(flat.device), j.to(flat.device)], L), t

    xa, ya = draw(train, n_train)
    xb, yb = draw(held, n_test)
    n_w = len(train.tasks) // L
    label = {"joint": lambda y: y, "wind": lambda y: y // L, "decoy": lambda y: y % L}
    correct = {f: probe_correct(xa, label[f](ya), xb, label[f](yb)) for f in Leakage.FAMILIES}
    return Leakage(*(float(correct[f].mean()) for f in Leakage.FAMILIES), 1 / len(train.tasks), 1 / n_w, 1 / L,
                   correct)


# ----------------------------------------------------------------------------------------------------------------
# task identification
# ----------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def embed_contexts(enc: TrajEncoder, ctx, *, view: str) -> Tensor:
    """``(..., N, d)`` per-agent local embeddings (``view="local"``) or ``(..., d)`` global ones."""
    if view == "global":
        return enc(ctx.glob, ctx.glob_mask())
    N, K = ctx.local.shape[-3], ctx.local.shape[-2]
    return enc(ctx.local, ctx.mask[..., None, :].expand(*ctx.mask.shape[:-1], N, K))


@dataclass
class TaskID:
    """Nearest-centroid task identification against context length: accuracies ``(len(ks),)``."""

    ks: list[int]
    joint: np.ndarray
    wind: np.ndarray
    decoy: np.ndarray


@torch.no_grad()
def task_id_curve(enc: TrajEncoder, train: Dataset, held: Dataset, ks: list[int], *, view: str, n_centroid: int,
                  n_query: int, seed: int = 0) -> TaskID:
    """Centroids per task from ``n_centroid`` contexts of the train episodes; queries: ``n_query`` contexts per task
    of the held-out episodes (every agent for a local encoder); cosine nearest centroid, at each length ``k``."""
    g = torch.Generator().manual_seed(seed)
    tr, he = train.transitions(), held.transitions()
    T, L = len(train.tasks), train.n_landmarks
    res = {"joint": [], "wind": [], "decoy": []}
    for k in ks:
        cen = embed_contexts(enc, sample_contexts(tr, torch.arange(T)[:, None].expand(T, n_centroid), k, k, g),
                             view=view)
        cen = F.normalize(cen.reshape(T, -1, cen.shape[-1]).mean(1), dim=-1)
        q = embed_contexts(enc, sample_contexts(he, torch.arange(T)[:, None].expand(T, n_query), k, k, g),
                           view=view)
        truth = torch.arange(T, device=q.device).reshape(T, *([1] * (q.ndim - 2))).expand(q.shape[:-1])
        pred = (q @ cen.T).argmax(-1)
        res["joint"].append(float((pred == truth).float().mean()))
        res["wind"].append(float((pred // L == truth // L).float().mean()))
        res["decoy"].append(float((pred % L == truth % L).float().mean()))
    return TaskID(list(ks), *(np.array(res[c]) for c in ("joint", "wind", "decoy")))


@torch.no_grad()
def alignment(student: TrajEncoder, teacher: TrajEncoder, held: Dataset, k: int, n: int, seed: int = 0) -> float:
    """Mean cosine between each agent's ``z_i`` and the teacher's ``z_c`` of the same transitions (held-out)."""
    g = torch.Generator().manual_seed(seed)
    T = len(held.tasks)
    ctx = sample_contexts(held.transitions(), torch.arange(T)[:, None].expand(T, n), k, k, g)
    zi, zc = embed_contexts(student, ctx, view="local"), embed_contexts(teacher, ctx, view="global")
    return float(F.cosine_similarity(zi, zc[..., None, :].expand_as(zi), dim=-1).mean())


# ----------------------------------------------------------------------------------------------------------------
# the representation study (one seed)
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class Representations:
    """Teacher, distilled student and local-only encoder of one seed, with their task-ID curves and, per context
    length, the mean cosine of each local encoder's ``z_i`` to the teacher's ``z_c`` of the same transitions."""

    teacher: TrajEncoder
    student: TrajEncoder
    local: TrajEncoder
    curves: dict[str, TaskID]
    cos: list[float]
    losses: dict[str, list[float]] = field(default_factory=dict)
    cos_local: list[float] = field(default_factory=list)


def train_representations(train: Dataset, held: Dataset, cfg: D2TRConfig, ks: list[int], *, n_centroid: int,
                          n_query: int) -> Representations:
    """Train the three task encoders of one seed on the train episodes and measure them on the held-out ones."""
    g = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    trans = train.transitions()
    teacher, lt = train_teacher(trans, cfg, g)
    student, ls = train_student(trans, teacher, cfg, g)
    local, ll = train_student(trans, None, cfg, g)
    curves = {name: task_id_curve(enc, train, held, ks, view=view, n_centroid=n_centroid, n_query=n_query,
                                  seed=derive(cfg.seed, "task-id-curve"))
              for name, enc, view in (("teacher", teacher, "global"), ("distilled", student, "local"),
                                      ("local-only", local, "local"))}
    # the same held-out contexts (seed) for both local encoders: the local-only one is the alignment's control
    cos = [alignment(student, teacher, held, k, n_query, seed=derive(cfg.seed, "alignment")) for k in ks]
    cos_local = [alignment(local, teacher, held, k, n_query, seed=derive(cfg.seed, "alignment")) for k in ks]
    return Representations(teacher, student, local, curves, cos, {"teacher": lt, "distilled": ls, "local-only": ll},
                           cos_local)


@dataclass
class SeedStudy:
    """Task-ID curves of the three encoders over training seeds: ``acc[name][family]`` is ``(seeds, len(ks))``;
    ``cos``/``cos_local`` ``(seeds, len(ks))`` the alignment of the distilled / local-only ``z_i`` to ``z_c``."""

    seeds: list[int]
    ks: list[int]
    acc: dict[str, dict[str, np.ndarray]]
    cos: np.ndarray
    cos_local: np.ndarray | None = None

    def mean_over_k(self, name: str, family: str) -> np.ndarray:
        """Per seed, the accuracy of encoder ``name`` on ``family`` averaged over the context lengths."""
        return self.acc[name][family].mean(1)

    def gap(self, family: str) -> np.ndarray:
        """Per seed, distilled − local-only accuracy averaged over the context lengths."""
        return self.mean_over_k("distilled", family) - self.mean_over_k("local-only", family)

    def margin(self, name: str, family: str, floor: float) -> np.ndarray:
        """Per seed, the accuracy at the longest context minus ``max(floor, accuracy at the shortest)``: ``>= 0``
        exactly when the longest context reaches ``floor`` and is no worse than the shortest."""
        a = self.acc[name][family]
        return a[:, -1] - np.maximum(floor, a[:, 0])


def seed_study(runs: list[Representations], seeds: list[int]) -> SeedStudy:
    """Collect the curves of :func:`train_representations` runs (one per seed) into arrays."""
    names, fams = ("teacher", "distilled", "local-only"), ("joint", "wind", "decoy")
    acc = {n: {f: np.stack([getattr(r.curves[n], f) for r in runs]) for f in fams} for n in names}
    return SeedStudy(list(seeds), runs[0].curves["teacher"].ks, acc, np.array([r.cos for r in runs]),
                     np.array([r.cos_local for r in runs]))


@torch.no_grad()
def embedding_maps(encoders: dict[str, tuple[TrajEncoder, str]], held: Dataset, ks: list[int], n: int,
                   seed: int = 0) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """2-D PCA (scikit-learn) of held-out embeddings per encoder and context length:
    ``{(name, k): (xy (M, 2), wind_id (M,), decoy (M,))}``; local encoders contribute every agent's ``z_i``."""
    from sklearn.decomposition import PCA

    g = torch.Generator().manual_seed(seed)
    T = len(held.tasks)
    he = held.transitions()
    out = {}
    for k in ks:
        ctx = sample_contexts(he, torch.arange(T)[:, None].expand(T, n), k, k, g)
        for name, (enc, view) in encoders.items():
            z = embed_contexts(enc, ctx, view=view)
            task = torch.arange(T).reshape(T, *([1] * (z.ndim - 2))).expand(z.shape[:-1]).reshape(-1)
            xy = PCA(2, random_state=0).fit_transform(z.reshape(-1, z.shape[-1]).double().cpu().numpy())
            out[(name, k)] = (xy, held.tasks.wind_id.cpu()[task].numpy(), held.tasks.decoy.cpu()[task].numpy())
    return out


# ----------------------------------------------------------------------------------------------------------------
# roles
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class RoleStudy:
    """Role labels of the three labellers and, per representation (each role encoder, the task embedding
    ``z_i`` and the raw transitions), the probes of held-out agent-episodes: ``probes[name]`` their accuracies
    and HSIC, ``correct[name]["role" | "task"]`` per held-out agent-episode whether the probe named it (the same
    agent-episodes and transitions for every representation, so comparisons are paired), ``maps[name]`` a 2-D
    PCA of the held-out role embeddings with ``held_role``/``held_wind`` their labels."""

    labels: dict[str, Tensor]
    probes: dict[str, dict[str, float]]
    encoders: dict[str, object]
    majority: float
    correct: dict[str, dict[str, np.ndarray]] = field(default_factory=dict, repr=False)
    maps: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    held_role: np.ndarray | None = None
    held_wind: np.ndarray | None = None
    chance_task: float = float("nan")


@dataclass
class _ProbeInputs:
    """``m`` random steps ``ts (P, m)`` of each of the ``P = T·E·N`` agent-episodes, their transitions
    ``x (P, m, F)``, the probe points ``idx`` and the labels of every agent-episode."""

    x: Tensor
    ts: Tensor
    idx: Tensor
    role: Tensor
    task: Tensor
    wind: Tensor


def _probe_inputs(ds: Dataset, role: Tensor, m: int, n: int, g: torch.Generator) -> _ProbeInputs:
    trans = ds.transitions()
    T, E, S, N, Fd = trans.shape
    P = T * E * N
    ts = torch.rand(P, S, generator=g).argsort(1)[:, :m]
    x = trans.movedim(3, 2).reshape(P, S, Fd)[torch.arange(P)[:, None], ts.to(trans.device)]
    task = torch.arange(T)[:, None, None].expand(T, E, N).reshape(-1)
    return _ProbeInputs(x, ts, torch.randperm(P, generator=g)[:n], role.reshape(-1).cpu(), task,
                        ds.tasks.wind_id.cpu()[task])


def raw_role_features(x: Tensor, ts: Tensor, horizon: int) -> Tensor:
    """The role probes' control input: an agent's transitions ``x (..., m, F)`` put in time order (by their steps
    ``ts (..., m)``), each followed by its clock ``t / horizon``, concatenated → ``(..., m·(F + 1))``."""
    order = ts.argsort(-1).to(x.device)
    xs = torch.gather(x, -2, order[..., None].expand_as(x))
    t = torch.gather(ts.to(x.device), -1, order).to(x.dtype) / horizon
    return torch.cat([xs, t[..., None]], -1).flatten(-2)


def scripted_variant(weight: float) -> str:
    """The name of the role encoder trained on scripted labels with HSIC weight ``weight``."""
    return f"scripted, HSIC {weight:g}" if weight else "scripted, no HSIC"


RAW = "raw transitions"
TASK_EMBEDDING = "z_i (task embedding)"


def role_study(train: Dataset, held: Dataset, student: TrajEncoder, cfg: D2TRConfig, *, hsic_weights: list[float],
               n_probe: int = 3000) -> RoleStudy:
    """Scripted / KMeans / random labels; role encoders on the scripted labels for each HSIC weight, and on the
    KMeans and random labels (weight ``cfg.hsic_weight``); linear probes of held-out ``r_i`` for the scripted role
    and for the task, and the same probes on ``z_i`` and on the raw transitions (:func:`raw_role_features`)."""
    from sklearn.decomposition import PCA

    g = torch.Generator().manual_seed(derive(cfg.seed, "roles"))  # training batches
    gp = torch.Generator().manual_seed(derive(cfg.seed, "probes"))  # the probes' transitions and points, shared by all
    torch.manual_seed(derive(cfg.seed, "roles"))  # weight init independent of whatever was trained before
    tr_traj, he_traj = AgentTrajectories.of(train), AgentTrajectories.of(held)
    T, E, S, N = train.shape
    labels = {"scripted": scripted_role_labeller(tr_traj),
              "kmeans": kmeans_roles(trajectory_features(tr_traj), cfg.role_k, cfg.seed),
              "random": random_roles((T, E, N), cfg.role_k, cfg.seed)}
    a = _probe_inputs(train, labels["scripted"], cfg.role_steps_per_episode, n_probe, gp)
    b = _probe_inputs(held, scripted_role_labeller(he_traj), cfg.role_steps_per_episode, n_probe, gp)

    def probe(name: str, ra: Tensor, rb: Tensor) -> None:
        correct[name] = {"role": probe_correct(ra[a.idx], a.role[a.idx], rb[b.idx], b.role[b.idx]),
                         "task": probe_correct(ra[a.idx], a.task[a.idx], rb[b.idx], b.task[b.idx])}
        probes[name] = {f"{k}_probe": float(v.mean()) for k, v in correct[name].items()}

    probes, correct, encoders, maps = {}, {}, {}, {}
    variants = [(scripted_variant(w), "scripted", w) for w in hsic_weights]
    variants += [("KMeans", "kmeans", cfg.hsic_weight), ("random", "random", cfg.hsic_weight)]
    with torch.no_grad():
        zb = student(b.x)
    for name, lab, w in variants:
        model, _ = train_role_encoder(train.transitions(), labels[lab], student, cfg, g, hsic_weight=w)
        encoders[name] = model
        with torch.no_grad():
            ra, rb = model(a.x, a.ts), model(b.x, b.ts)
        probe(name, ra, rb)
        probes[name]["hsic"] = float(hsic(rb[b.idx[:512]], zb[b.idx[:512]]))
        maps[name] = PCA(2, random_state=0).fit_transform(rb[b.idx].double().cpu().numpy())
    with torch.no_grad():
        probe(TASK_EMBEDDING, student(a.x), zb)
    probe(RAW, raw_role_features(a.x, a.ts, S), raw_role_features(b.x, b.ts, S))
    for name in (TASK_EMBEDDING, RAW):
        probes[name]["hsic"] = float("nan")
    counts = torch.bincount(b.role[b.idx], minlength=3).double()  # the majority class of the probe points
    return RoleStudy(labels, probes, encoders, float(counts.max() / counts.sum()), correct, maps,
                     b.role[b.idx].numpy(), b.wind[b.idx].numpy(), 1 / T)


@torch.no_grad()
def decentralization_gap(policy: ConditionedPolicy, held: Dataset, k: int, n: int, seed: int = 0) -> float:
    """Largest change of agent 0's ``z_0`` when the other agents' local contexts are replaced by other data and
    a NaN-poisoned global context is offered: exactly 0 for a decentralized encoder."""
    g = torch.Generator().manual_seed(seed)
    T = len(held.tasks)
    he = held.transitions()
    a = sample_contexts(he, torch.arange(T)[:, None].expand(T, n), k, k, g)
    b = sample_contexts(he, torch.randint(0, T, (T, n), generator=g), k, k, g)
    N = a.local.shape[-3]
    flat = a.local.reshape(T * n, N, k, -1)
    mixed = torch.cat([flat[:, :1], b.local.reshape(T * n, N, k, -1)[:, 1:]], 1)
    mask = a.mask.reshape(T * n, k)
    z = policy.task_embedding(flat, mask)
    z2 = policy.task_embedding(mixed, mask, torch.full_like(a.glob.reshape(T * n, k * N, -1), float("nan")))
    return float((z[:, 0] - z2[:, 0]).abs().max())


# ----------------------------------------------------------------------------------------------------------------
# evaluation on tasks (returns)
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class Returns:
    """Episode returns ``(T, episodes)`` of one policy on a task set, and the context length used."""

    name: str
    returns: np.ndarray
    context_episodes: int

    @property
    def mean(self) -> float:
        return float(self.returns.mean())

    @property
    def se(self) -> float:
        return stats.se(self.returns.mean(1))


@torch.no_grad()
def evaluate(policy: ConditionedPolicy, tasks: TaskSet, context_episodes: int, *, episodes: int = 16, steps: int = 25,
             n_agents: int = 3, sight: float = 0.5, seed: int = 0, device: torch.device | str = "cpu") -> Returns:
    """Decentralized execution on ``tasks``: each agent encodes its own view of ``context_episodes`` transitions
    (one from each of that many episodes of the task's offline data, collected by the behaviour policy), then all
    ``tasks × episodes`` worlds are rolled out at once with greedy actions; the role embedding is updated online
    from the agent's own transitions. Only the centralized oracle is handed the global context."""
    if context_episodes < 1:
        raise ValueError("context_episodes must be >= 1")
    L = int(tasks.decoy.max()) + 1
    T = len(tasks)
    ctx_data = collect_dataset(tasks, context_episodes, steps, n_agents=n_agents, n_landmarks=L, sight=sight,
                               seed=derive(seed, "context"), device=device)
    g = torch.Generator().manual_seed(derive(seed, "context-sample"))
    ctx = sample_contexts(ctx_data.transitions(), torch.arange(T)[:, None].expand(T, episodes), context_episodes,
                          context_episodes, g)
    B, N = T * episodes, n_agents
    local = ctx.local.reshape(B, N, context_episodes, -1)
    mask = ctx.mask.reshape(B, context_episodes)
    glob = ctx.glob.reshape(B, context_episodes * N, -1) if policy.centralized else None
    z = policy.task_embedding(local, mask, glob)
    env = CoopNavEnv(n_agents, L, tasks.wind.repeat_interleave(episodes, 0), B,
                     decoy=tasks.decoy.repeat_interleave(episodes, 0).cpu(), sight=sight, device=device,
                     dtype=z.dtype)
    obs = env.reset(g)
    history, total = [], torch.zeros(B, dtype=z.dtype, device=env.device)
    for _ in range(steps):
        hist = torch.stack(history, 2) if history else None
        r = policy.role_embedding(hist, B, N, obs)
        a = pd_controller(env, policy.act(obs, z, r))  # the policy picks a landmark, the skill moves there
        nxt, rew = env.step(a)
        total += rew
        history.append(transition_features(obs, a, rew, nxt, L))
        obs = nxt
    return Returns(policy.name, total.reshape(T, episodes).cpu().numpy(), context_episodes)


def behaviour_returns(tasks: TaskSet, eps: float, *, episodes: int, steps: int, n_agents: int = 3, sight: float = 0.5,
                      seed: int = 0, device: torch.device | str = "cpu") -> Returns:
    """Returns of the scripted behaviour policy at one noise level (a reference for the learned policies)."""
    ds = collect_dataset(tasks, episodes, steps, n_agents=n_agents, eps_levels=(eps,), sight=sight, seed=seed,
                         device=device)
    return Returns(f"behaviour ε={eps:g}", ds.rew.sum(-1).cpu().numpy(), 0)


BC, LOCAL, NO_ROLES, D2TR, ORACLE = ("BC (no task rep.)", "local InfoNCE", "D²TR-lite, no roles",
                                     "D²TR-lite (scripted roles)", "centralized oracle")


def train_policies(train: Dataset, reps: Representations, role_encoders: dict[str, RoleEncoder], cfg: D2TRConfig,
                   *, role_ablation: bool = True, policy_seed: int = 0) -> dict[str, ConditionedPolicy]:
    """The policies compared on OOD tasks: BC without a task representation, local-only InfoNCE, D²TR-lite without
    roles, D²TR-lite (scripted roles; with ``role_ablation`` also KMeans and random roles) and the centralized
    oracle. ``role_encoders``: ``"scripted"`` (and, for the ablation, ``"kmeans"``, ``"random"``) → encoder;
    ``policy_seed`` draws another initialisation and other batches for the same encoders."""
    g = torch.Generator().manual_seed(derive(cfg.seed, "policies", policy_seed))
    torch.manual_seed(derive(cfg.seed, "policies", policy_seed))  # weight init independent of what was trained before
    specs = [(BC, None, None, False), (LOCAL, reps.local, None, False), (NO_ROLES, reps.student, None, False),
             (D2TR, reps.student, "scripted", False)]
    if role_ablation:
        specs += [("D²TR-lite (KMeans roles)", reps.student, "kmeans", False),
                  ("D²TR-lite (random roles)", reps.student, "random", False)]
    specs.append((ORACLE, reps.teacher, None, True))
    out = {}
    for name, enc, role_name, central in specs:
        role = None if role_name is None else role_encoders[role_name]
        cond = conditioning(train, enc, role, cfg, g, centralized=central)
        actor, _ = train_actor(train, cond, cfg, g)
        out[name] = ConditionedPolicy(actor, enc, role, centralized=central, name=name)
    return out


def study_role_encoders(roles: RoleStudy, cfg: D2TRConfig) -> dict[str, RoleEncoder]:
    """The role study's encoders under the names :func:`train_policies` takes (HSIC weight ``cfg.hsic_weight``)."""
    return {"scripted": roles.encoders[scripted_variant(cfg.hsic_weight)], "kmeans": roles.encoders["KMeans"],
            "random": roles.encoders["random"]}


@dataclass
class ReturnStudy:
    """OOD returns of the compared policies over training seeds: ``returns (seeds, policy_seeds, policies, T,
    episodes)``. Within a training seed every policy (and policy seed) is evaluated in the same worlds: the same
    tasks, the same context transitions and the same start states, so differences between policies are paired
    by world; each training seed has its own worlds. ``policies``: those of the first training seed and policy
    seed."""

    names: list[str]
    seeds: list[int]
    returns: np.ndarray
    policies: dict[str, ConditionedPolicy] = field(default_factory=dict, repr=False)

    def _of(self, name: str) -> np.ndarray:
        return self.returns[:, :, self.names.index(name)]  # (seeds, policy_seeds, T, episodes)

    def per_seed(self, name: str) -> np.ndarray:
        """Per training seed, the mean return of ``name`` over its policy seeds, tasks and episodes."""
        return self._of(name).mean((1, 2, 3))

    def task_gaps(self, name: str, base: str) -> np.ndarray:
        """Per training seed and task, the paired return difference ``name − base`` averaged over policy seeds and
        episodes → ``(seeds, T)``."""
        return (self._of(name) - self._of(base)).mean((1, 3))

    def gap(self, name: str, base: str) -> np.ndarray:
        """Per training seed, the mean paired difference ``name − base`` (the same worlds for both)."""
        return self.task_gaps(name, base).mean(1)

    def paired_se(self, name: str, base: str) -> np.ndarray:
        """Per training seed, the standard error over tasks of the paired per-task difference."""
        return np.array([stats.se(row) for row in self.task_gaps(name, base)])

    def unpaired_se(self, name: str, base: str) -> np.ndarray:
        """Per training seed, the standard error over tasks that treats the two policies as independent samples
        (the earlier notebook's: the two per-policy standard errors combined in quadrature)."""
        a, b = self._of(name).mean((1, 3)), self._of(base).mean((1, 3))
        return np.array([float(np.hypot(stats.se(x), stats.se(y))) for x, y in zip(a, b, strict=True)])


def return_study(train: Dataset, ood: TaskSet, runs: list[Representations], seeds: list[int], roles: RoleStudy,
                 cfg: D2TRConfig, *, n_policy_seeds: int = 1, role_ablation: bool = False, context: int = 8,
                 episodes: int = 16, steps: int = 25, n_agents: int = 3, sight: float = 0.5, eval_seed: int = 7,
                 device: torch.device | str = "cpu") -> ReturnStudy:
    """For each training seed (its encoders from ``runs``; the first seed's role encoders from ``roles``, the
    others' trained here on the same labels against their own student, HSIC weight ``cfg.hsic_weight``), train
    the policies of :func:`train_policies` ``n_policy_seeds`` times and evaluate them all in that seed's worlds
    (:func:`evaluate`, seed ``derive(eval_seed, "worlds", i)`` for the ``i``-th training seed)."""
    if len(runs) != len(seeds) or not seeds or n_policy_seeds < 1:
        raise ValueError("return_study needs one representation run per seed and n_policy_seeds >= 1")
    kinds = ("scripted", "kmeans", "random") if role_ablation else ("scripted",)
    out, names, first = [], None, {}
    for i, (rep, seed) in enumerate(zip(runs, seeds, strict=True)):
        cfg_s = replace(cfg, seed=seed)
        if i == 0:
            enc = study_role_encoders(roles, cfg)
        else:  # the same labels, an encoder of this seed's own student (HSIC against its z_i)
            g = torch.Generator().manual_seed(derive(seed, "roles"))
            torch.manual_seed(derive(seed, "roles"))
            enc = {k: train_role_encoder(train.transitions(), roles.labels[k], rep.student, cfg_s, g)[0]
                   for k in kinds}
        per_policy_seed = []
        for p in range(n_policy_seeds):
            pols = train_policies(train, rep, enc, cfg_s, role_ablation=role_ablation, policy_seed=p)
            rets = [evaluate(pol, ood, context, episodes=episodes, steps=steps, n_agents=n_agents, sight=sight,
                             seed=derive(eval_seed, "worlds", i), device=device).returns for pol in pols.values()]
            names, first = names or list(pols), first or pols
            per_policy_seed.append(np.stack(rets))
        out.append(np.stack(per_policy_seed))
    return ReturnStudy(names, list(seeds), np.stack(out), first)
