"""The notebook's harness for paper 12: probes, task identification against context length, alignment, roles,
the seed study of distillation, and returns on held-out (OOD) tasks."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ...common import stats
from .method import (
    AgentTrajectories,
    ConditionedPolicy,
    D2TRConfig,
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

Tensor = torch.Tensor


# ----------------------------------------------------------------------------------------------------------------
# probes
# ----------------------------------------------------------------------------------------------------------------
def probe_accuracy(x_train: Tensor, y_train: Tensor, x_test: Tensor, y_test: Tensor, *, max_iter: int = 300
                   ) -> float:
    """Held-out accuracy of a multinomial logistic-regression probe (scikit-learn) on standardised inputs."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    xa, xb = x_train.detach().double().cpu().numpy(), x_test.detach().double().cpu().numpy()
    if len(xa) == 0 or len(xb) == 0 or not (np.isfinite(xa).all() and np.isfinite(xb).all()):
        raise ValueError("probe_accuracy needs non-empty, finite inputs")
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=max_iter))
    clf.fit(xa, y_train.cpu().numpy())
    return float(clf.score(xb, y_test.cpu().numpy()))


@dataclass
class Leakage:
    """Single-observation probes (no context) for the joint task, the wind and the decoy, with their chances."""

    joint: float
    wind: float
    decoy: float
    chance_joint: float
    chance_wind: float
    chance_decoy: float


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
    accs = [probe_accuracy(xa, f(ya), xb, f(yb)) for f in (lambda y: y, lambda y: y // L, lambda y: y % L)]
    return Leakage(*accs, 1 / len(train.tasks), 1 / n_w, 1 / L)


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
    """Teacher, distilled student and local-only encoder of one seed, with their task-ID curves."""

    teacher: TrajEncoder
    student: TrajEncoder
    local: TrajEncoder
    curves: dict[str, TaskID]
    cos: list[float]
    losses: dict[str, list[float]] = field(default_factory=dict)


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
                                  seed=cfg.seed + 100)
              for name, enc, view in (("teacher", teacher, "global"), ("distilled", student, "local"),
                                      ("local-only", local, "local"))}
    cos = [alignment(student, teacher, held, k, n_query, seed=cfg.seed + 200) for k in ks]
    return Representations(teacher, student, local, curves, cos, {"teacher": lt, "distilled": ls, "local-only": ll})


@dataclass
class SeedStudy:
    """Task-ID curves of the distilled and local-only encoders over training seeds: ``acc[name][family]`` is
    ``(seeds, len(ks))``; ``gap[family]`` the per-seed mean over ``ks`` of distilled − local-only."""

    seeds: list[int]
    ks: list[int]
    acc: dict[str, dict[str, np.ndarray]]
    cos: np.ndarray

    def gap(self, family: str) -> np.ndarray:
        return (self.acc["distilled"][family] - self.acc["local-only"][family]).mean(1)


def seed_study(runs: list[Representations], seeds: list[int]) -> SeedStudy:
    """Collect the curves of :func:`train_representations` runs (one per seed) into arrays."""
    names, fams = ("teacher", "distilled", "local-only"), ("joint", "wind", "decoy")
    acc = {n: {f: np.stack([getattr(r.curves[n], f) for r in runs]) for f in fams} for n in names}
    return SeedStudy(list(seeds), runs[0].curves["teacher"].ks, acc, np.array([r.cos for r in runs]))


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
    """Role labels of the three labellers, and per variant: role probe and task probe on ``r_i``, HSIC."""

    labels: dict[str, Tensor]
    probes: dict[str, dict[str, float]]
    encoders: dict[str, object]
    majority: float


@torch.no_grad()
def _role_embeddings(model, trans: Tensor, student: TrajEncoder, m: int, g: torch.Generator):
    T, E, S, N, Fd = trans.shape
    ts = torch.rand(T * E * N, S, generator=g).argsort(1)[:, :m].to(trans.device)
    flat = trans.movedim(3, 2).reshape(T * E * N, S, Fd)
    x = flat[torch.arange(T * E * N, device=trans.device)[:, None], ts]
    return model(x, ts), student(x)


def scripted_variant(weight: float) -> str:
    """The name of the role encoder trained on scripted labels with HSIC weight ``weight``."""
    return f"scripted, HSIC {weight:g}" if weight else "scripted, no HSIC"


def role_study(train: Dataset, held: Dataset, student: TrajEncoder, cfg: D2TRConfig, *, hsic_weights: list[float],
               n_probe: int = 3000) -> RoleStudy:
    """Scripted / KMeans / random labels; role encoders on the scripted labels for each HSIC weight, and on the
    KMeans and random labels (weight ``cfg.hsic_weight``); linear probes of held-out ``r_i`` (and of ``z_i``) for
    the scripted role and for the task."""
    g = torch.Generator().manual_seed(cfg.seed + 300)
    torch.manual_seed(cfg.seed + 300)  # weight init independent of whatever was trained before
    tr_traj, he_traj = AgentTrajectories.of(train), AgentTrajectories.of(held)
    T, E, S, N = train.shape
    feats = trajectory_features(tr_traj)
    labels = {"scripted": scripted_role_labeller(tr_traj), "kmeans": kmeans_roles(feats, cfg.role_k, cfg.seed),
              "random": random_roles((T, E, N), cfg.role_k, cfg.seed)}
    held_role = scripted_role_labeller(he_traj)
    tr, he = train.transitions(), held.transitions()
    task_tr = torch.arange(T)[:, None, None].expand(T, E, N).reshape(-1)
    task_he = torch.arange(T)[:, None, None].expand(held.shape[0], held.shape[1], N).reshape(-1)
    probes, encoders = {}, {}
    variants = [(scripted_variant(w), "scripted", w) for w in hsic_weights]
    variants += [("KMeans", "kmeans", cfg.hsic_weight), ("random", "random", cfg.hsic_weight)]
    for name, lab, w in variants:
        model, _ = train_role_encoder(tr, labels[lab], student, cfg, g, hsic_weight=w)
        encoders[name] = model
        ra, za = _role_embeddings(model, tr, student, cfg.role_steps_per_episode, g)
        rb, zb = _role_embeddings(model, he, student, cfg.role_steps_per_episode, g)
        ia = torch.randperm(len(ra), generator=g)[:n_probe]
        ib = torch.randperm(len(rb), generator=g)[:n_probe]
        ya = labels["scripted"].reshape(-1)
        probes[name] = {
            "role_probe": probe_accuracy(ra[ia], ya[ia], rb[ib], held_role.reshape(-1)[ib]),
            "task_probe": probe_accuracy(ra[ia], task_tr[ia], rb[ib], task_he[ib]),
            "hsic": float(hsic(rb[ib[:512]], zb[ib[:512]])),
        }
        if name == variants[0][0]:
            probes["z_i (task embedding)"] = {
                "role_probe": probe_accuracy(za[ia], ya[ia], zb[ib], held_role.reshape(-1)[ib]),
                "task_probe": probe_accuracy(za[ia], task_tr[ia], zb[ib], task_he[ib]), "hsic": float("nan")}
    counts = torch.bincount(held_role.reshape(-1), minlength=3).double()
    return RoleStudy(labels, probes, encoders, float(counts.max() / counts.sum()))


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
                               seed=seed + 1, device=device)
    g = torch.Generator().manual_seed(seed + 2)
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


def train_policies(train: Dataset, reps: Representations, roles: RoleStudy, cfg: D2TRConfig, *,
                   role_ablation: bool = True) -> dict[str, ConditionedPolicy]:
    """The policies compared on OOD tasks: BC without a task representation, local-only InfoNCE, D²TR-lite without
    roles, D²TR-lite (scripted roles; with ``role_ablation`` also KMeans and random roles) and the centralized
    oracle."""
    g = torch.Generator().manual_seed(cfg.seed + 400)
    torch.manual_seed(cfg.seed + 400)  # weight init independent of whatever was trained before
    role_enc = {"kmeans": roles.encoders["KMeans"], "random": roles.encoders["random"],
                "scripted": roles.encoders[scripted_variant(cfg.hsic_weight)]}
    specs = [("BC (no task rep.)", None, None, False), ("local InfoNCE", reps.local, None, False),
             ("D²TR-lite, no roles", reps.student, None, False),
             ("D²TR-lite (scripted roles)", reps.student, role_enc["scripted"], False),
             ("D²TR-lite (KMeans roles)", reps.student, role_enc["kmeans"], False),
             ("D²TR-lite (random roles)", reps.student, role_enc["random"], False),
             ("centralized oracle", reps.teacher, None, True)]
    if not role_ablation:
        specs = [sp for sp in specs if "KMeans" not in sp[0] and "random" not in sp[0]]
    out = {}
    for name, enc, role, central in specs:
        cond = conditioning(train, enc, role, cfg, g, centralized=central)
        actor, _ = train_actor(train, cond, cfg, g)
        out[name] = ConditionedPolicy(actor, enc, role, centralized=central, name=name)
    return out
