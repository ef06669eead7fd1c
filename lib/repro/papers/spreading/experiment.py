"""Experiment harness of notebook 08: the engine against EoN, the three pathologies (optimism, hub blindness,
bimodal outcomes), Markov against renewal dynamics, control policies trained by CEM in each simulator and
evaluated on the renewal one, and transfer to larger graphs. Every function takes its seed explicitly, so the
notebook reproduces its numbers exactly.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import networkx as nx
import numpy as np
import torch
from torch import Tensor

from ...common import stats
from ...common.seeding import derive
from ...common.timing import Timer
from .control import CEMResult, cem_optimize
from .engine import INF, RenewalSIR
from .env import (
    SIMULATORS,
    ControlTask,
    SpreadingControlEnv,
    crn_draws,
    hubs_only,
    make_simulator,
    policy_returns,
    random_allocation,
    rollout,
)
from .hazards import Exponential, Law
from .mean_field import mean_field_ode
from .observation import degree_tiers

GRAPH_FAMILIES = ("ba", "hk")
EON_METHODS = ("nonmarkov", "fast_sir", "gillespie")
# Real social networks that ship inside networkx (offline): the paper's SNAP graphs (Facebook, Twitter, YouTube)
# do not, so these small ones are the only real graphs a zero-shot transfer can be tested on here.
REAL_GRAPHS = {
    "karate": nx.karate_club_graph,  # Zachary's karate club: 34 members, 78 friendships
    "les_miserables": nx.les_miserables_graph,  # co-appearance of the novel's 77 characters, 254 edges
    "florentine": nx.florentine_families_graph,  # marriages among 15 Renaissance families
    "davis": nx.davis_southern_women_graph,  # 18 women and the 14 events they attended (bipartite)
}


def make_graph(family: str, n: int, seed: int, *, m: int = 3, triangle_p: float = 0.3) -> nx.Graph:
    """A generated social-network stand-in: ``"ba"`` Barabási–Albert (``m`` edges per new node), ``"hk"``
    Holme–Kim (``powerlaw_cluster_graph``: BA plus triangle closure with probability ``triangle_p``, so heavy
    tails *and* clustering)."""
    if family == "ba":
        return nx.barabasi_albert_graph(n, m, seed=seed)
    if family == "hk":
        return nx.powerlaw_cluster_graph(n, m, triangle_p, seed=seed)
    raise ValueError(f"unknown graph family {family!r}; use one of {GRAPH_FAMILIES}")


def real_graph(name: str) -> nx.Graph:
    """One of :data:`REAL_GRAPHS` as a simple unweighted graph on nodes ``0 … N−1`` (labels in networkx's order;
    edge weights such as Les Misérables' co-appearance counts are dropped: the engine spreads along edges)."""
    if name not in REAL_GRAPHS:
        raise ValueError(f"unknown real graph {name!r}; use one of {sorted(REAL_GRAPHS)}")
    G = nx.Graph()
    src = REAL_GRAPHS[name]()
    G.add_nodes_from(range(src.number_of_nodes()))
    index = {v: i for i, v in enumerate(src.nodes)}
    G.add_edges_from((index[u], index[v]) for u, v in src.edges if u != v)
    return G


def import_eon():
    """EoN 2.0, its import-time DeprecationWarning (``scipy.ndimage.interpolation``) silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import EoN
    return EoN


# ----------------------------------------------------------------------------------------------- outbreaks
@dataclass
class OutbreakStats:
    """Final sizes summarised: extinction probability (final size < ``low``), mean size of major outbreaks, mean
    size, and the mass below ``low``, in ``[low, high]`` and above ``high``; with standard errors."""

    n: int
    p_ext: float
    se_p_ext: float
    major: float
    se_major: float
    mean: float
    mass_low: float
    mass_mid: float
    mass_high: float


def outbreak_stats(sizes: np.ndarray | Tensor, *, low: float = 0.05, high: float = 0.3) -> OutbreakStats:
    x = np.asarray(torch.as_tensor(sizes).cpu(), dtype=float)
    if x.ndim != 1 or len(x) < 2 or np.isnan(x).any():
        raise ValueError("need at least two final sizes, without NaN")
    ext = x < low
    maj = x[~ext]
    p = float(ext.mean())
    return OutbreakStats(n=len(x), p_ext=p, se_p_ext=stats.proportion_se(p, len(x)),
                         major=float(maj.mean()) if len(maj) else float("nan"), se_major=stats.se(maj),
                         mean=float(x.mean()), mass_low=p, mass_mid=float(((x >= low) & (x <= high)).mean()),
                         mass_high=float((x > high).mean()))


def extinct_share(sizes: np.ndarray, low: float = 0.05) -> float:
    """The extinction probability: the share of final sizes below ``low``."""
    return float((np.asarray(sizes) < low).mean())


def major_mean(sizes: np.ndarray, low: float = 0.05) -> float:
    """The mean final size of the major outbreaks (those of at least ``low``); NaN if there is none."""
    x = np.asarray(sizes)
    return float(x[x >= low].mean()) if (x >= low).any() else float("nan")


AGREEMENT = {"p_ext": extinct_share, "major": major_mean}


def agreement(ours: np.ndarray, reference: np.ndarray, what: str) -> stats.Estimate:
    """Engine minus reference (EoN) in ``what`` (:data:`AGREEMENT`: extinction probability or mean major size),
    with the percentile bootstrap interval over both sets of runs (:func:`repro.common.stats.bootstrap_compare`:
    resampled independently when their lengths differ, as the notebook's do)."""
    if what not in AGREEMENT:
        raise ValueError(f"unknown agreement statistic {what!r}; use one of {sorted(AGREEMENT)}")
    return stats.bootstrap_compare(np.asarray(ours, dtype=float), np.asarray(reference, dtype=float), AGREEMENT[what])


def _transmission_delay(source, target, beta: float, rng: np.random.Generator) -> float:
    return rng.exponential(1.0 / beta)


def _period(node, law: Law, rng: np.random.Generator) -> float:
    return float(law.sample(rng))


def eon_final_sizes(graph: nx.Graph, beta: float, law: Law, runs: int, seed: int, *,
                    method: str = "nonmarkov") -> tuple[np.ndarray, float]:
    """Final sizes of ``runs`` EoN simulations from one uniformly random initial node, and the seconds they took.
    ``"nonmarkov"``: ``fast_nonMarkov_SIR`` (exponential transmission delays of rate ``beta``, infectious periods
    from ``law``); ``"fast_sir"`` / ``"gillespie"``: EoN's Markov simulators (``law`` must be exponential).
    Run ``s`` is seeded only through ``rng=np.random.default_rng([seed, s])`` (EoN 2.0 ignores global seeds)."""
    if method not in EON_METHODS:
        raise ValueError(f"unknown EoN method {method!r}; use one of {EON_METHODS}")
    if method != "nonmarkov" and not isinstance(law, Exponential):
        raise ValueError(f"EoN's {method} simulates Markov SIR only; pass an Exponential law")
    EoN = import_eon()
    nodes, N = list(graph), graph.number_of_nodes()
    out = np.empty(runs)
    t0 = time.perf_counter()
    for s in range(runs):
        rng = np.random.default_rng([seed, s])
        init = [nodes[int(rng.integers(N))]]
        if method == "nonmarkov":
            res = EoN.fast_nonMarkov_SIR(graph, trans_time_fxn=_transmission_delay, rec_time_fxn=_period,
                                         trans_time_args=(beta, rng), rec_time_args=(law, rng),
                                         initial_infecteds=init, rng=rng)
        elif method == "fast_sir":
            res = EoN.fast_SIR(graph, beta, law.rate, initial_infecteds=init, rng=rng)
        else:
            res = EoN.Gillespie_SIR(graph, beta, law.rate, initial_infecteds=init, rng=rng)
        out[s] = res[3][-1] / N
    return out, time.perf_counter() - t0


@dataclass
class Outbreaks:
    """Uncontrolled engine outbreaks: per-tier state counts at ``t = 0, every, 2·every, …`` (``[T, R, K, 4]``,
    frozen after extinction), final sizes ``[R]``, the node tiers, and the seconds the simulation took."""

    counts: Tensor
    final: np.ndarray
    tiers: Tensor
    every: float
    seconds: float

    @property
    def times(self) -> np.ndarray:
        return np.arange(self.counts.shape[0]) * self.every


def record_outbreaks(graph: nx.Graph, beta: float, law: Law, replicas: int, seed: int, *, tiers: int = 4,
                     every: float = 1.0, tmax: float = 200.0, dt: float = 0.1,
                     device: torch.device | str = "cpu") -> Outbreaks:
    """Simulate ``replicas`` uncontrolled outbreaks with :class:`~.engine.RenewalSIR` and record the per-tier
    counts every ``every`` time units until all are over."""
    tier = degree_tiers(graph, tiers, device=device)
    eng = RenewalSIR(graph, beta, law, dt=dt, tiers=tier, device=device)
    t0 = time.perf_counter()
    eng.reset(replicas, seed=seed)
    frames = [eng.tier_counts()]
    while bool(eng.alive.any()) and eng.t < tmax - 1e-9:
        eng.step(None, every)
        frames.append(eng.tier_counts())
    seconds = time.perf_counter() - t0
    return Outbreaks(counts=torch.stack(frames).cpu(), final=eng.final_size().cpu().numpy(), tiers=tier.cpu(),
                     every=every, seconds=seconds)


def engine_final_sizes(graph: nx.Graph, beta: float, law: Law, replicas: int, seed: int, *, dt: float = 0.1,
                       rule: str = "exact", device: torch.device | str = "cpu") -> tuple[np.ndarray, float]:
    """Final sizes of ``replicas`` engine outbreaks from one uniformly random node, and the seconds they took."""
    eng = RenewalSIR(graph, beta, law, dt=dt, rule=rule, device=device)
    with Timer(eng.device, sync_start=False) as timer:  # the copy to the host is timed too
        eng.reset(replicas, seed=seed)
        sizes = eng.run().cpu().numpy()
    return sizes, timer.seconds


def beta_scan(graph: nx.Graph, betas: list[float], laws: dict[str, Law], replicas: int, seed: int, *,
              dt: float = 0.1, device: torch.device | str = "cpu") -> dict[str, dict[str, np.ndarray]]:
    """Extinction probability (with its standard error), mean final size, mean major size and the final sizes
    (``[B, replicas]``) against ``beta`` for each law."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for j, (name, law) in enumerate(laws.items()):
        rows, finals = [], []
        for b, beta in enumerate(betas):
            sizes, _ = engine_final_sizes(graph, beta, law, replicas, derive(seed, "beta-scan", j, b), dt=dt,
                                          device=device)
            st = outbreak_stats(sizes)
            rows.append((st.p_ext, st.mean, st.major, st.se_p_ext))
            finals.append(sizes)
        a = np.array(rows)
        out[name] = {"beta": np.asarray(betas), "p_ext": a[:, 0], "mean": a[:, 1], "major": a[:, 2],
                     "se_p_ext": a[:, 3], "sizes": np.stack(finals)}
    return out


# ----------------------------------------------------------------------------------------------- pathologies
def _features(out: Outbreaks) -> dict[str, Tensor]:
    c = out.counts.double()  # [T, R, K, 4]
    size = c[0].sum(-1, keepdim=True)  # [R, K, 1] tier sizes
    N = float(size[0].sum())
    T, R = c.shape[:2]
    return {"global": c.sum(2)[..., :3] / N, "stratified": (c / size)[..., :3].reshape(T, R, -1), "counts": c,
            "N": torch.tensor(N)}


@dataclass
class HubBlindness:
    """Held-out incidence prediction from the global and the stratified observation (:func:`hub_blindness`).

    ``scores``: ``r2_<observer>_<window>`` (held-out R²) and ``windows_<window>`` (how many windows qualified) for
    the windows ``all`` and ``early``. ``items[window][observer]``: per held-out outbreak the sums ``(n, Σy, Σy²,
    Σ(y − ŷ)²)`` over its test windows, from which :func:`r2_of_sums` recomputes the pooled R² of any resample of
    the outbreaks (the bootstrap resamples outbreaks, not the correlated windows within one)."""

    scores: dict[str, float]
    items: dict[str, dict[str, tuple[np.ndarray, ...]]] = field(default_factory=dict)


def r2_of_sums(n: np.ndarray, sy: np.ndarray, syy: np.ndarray, sse: np.ndarray) -> float:
    """The coefficient of determination ``1 − SSE / SST`` of the windows pooled over items, from per-item sums:
    ``SST = Σy² − (Σy)² / n`` (the same number as scikit-learn's ``r2_score`` on the pooled windows)."""
    N, Sy, Syy, Sse = (float(np.sum(a)) for a in (n, sy, syy, sse))
    sst = Syy - Sy * Sy / N
    return 1.0 - Sse / sst if sst > 0 else float("nan")


def _per_outbreak(rep: np.ndarray, y: np.ndarray, pred: np.ndarray) -> tuple[np.ndarray, ...]:
    ids, inv = np.unique(rep, return_inverse=True)
    sums = [np.bincount(inv, weights=w, minlength=len(ids)) for w in (np.ones_like(y), y, y * y, (y - pred) ** 2)]
    return tuple(sums)


def hub_blindness(out: Outbreaks, *, early: float = 0.1, alpha: float = 1e-4, max_windows: int = 8000,
                  seed: int = 0) -> HubBlindness:
    """How well the next interval's incidence (new infections / N) is predicted from the global observation
    (pooled S, I, R fractions) and from the stratified one (per-tier fractions): held-out R² of a ridge
    regression on degree-2 polynomial features (scikit-learn), trained on even replicas and tested on odd ones
    (at most ``max_windows`` random windows each). ``early``: the same restricted to windows where fewer than
    ``early`` of the nodes have been infected so far. Returns the scores and, per held-out outbreak, the sums the
    bootstrap of the R² needs (:class:`HubBlindness`)."""
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import PolynomialFeatures

    f = _features(out)
    c, N = f["counts"], float(f["N"])
    incidence = (c[:-1, :, :, 0].sum(-1) - c[1:, :, :, 0].sum(-1)) / N  # [T-1, R]
    live = c[:-1, :, :, INF].sum(-1) > 0
    attacked = 1.0 - f["global"][:-1, :, 0]
    T, R = incidence.shape
    is_train = (torch.arange(R) % 2 == 0)[None, :].expand(T, R)
    gen = torch.Generator().manual_seed(seed)
    res = HubBlindness(scores={})
    for window, mask in (("all", live), ("early", live & (attacked < early))):
        idx = {}
        for part, sel in (("train", mask & is_train), ("test", mask & ~is_train)):
            flat = torch.nonzero(sel.reshape(-1)).squeeze(1)
            idx[part] = flat[torch.randperm(len(flat), generator=gen)[:max_windows]]
        y = incidence.reshape(-1)
        y_test, replica = y[idx["test"]].numpy(), (idx["test"] % R).numpy()  # window t*R + r belongs to outbreak r
        res.items[window] = {}
        for name in ("global", "stratified"):
            X = f[name][:-1].reshape(T * R, -1)
            model = make_pipeline(PolynomialFeatures(2), Ridge(alpha=alpha))
            model.fit(X[idx["train"]].numpy(), y[idx["train"]].numpy())
            pred = model.predict(X[idx["test"]].numpy())
            res.scores[f"r2_{name}_{window}"] = float(r2_score(y_test, pred))
            res.items[window][name] = _per_outbreak(replica, y_test, pred)
        res.scores[f"windows_{window}"] = int(mask.sum())
    return res


def early_outcome_auc(out: Outbreaks, *, at: float = 3.0, major: float = 0.05) -> dict[str, float]:
    """How well the observation at time ``at`` tells a major outbreak (final size ≥ ``major``) from one that
    dies out: held-out ROC AUC of a logistic regression (scikit-learn) on the global and on the stratified
    observation, over the replicas still alive at ``at`` (even replicas train, odd ones test)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    f = _features(out)
    k = int(round(at / out.every))
    if not 0 <= k < f["counts"].shape[0]:
        raise ValueError(f"no recorded frame at t = {at}")
    alive = f["counts"][k, :, :, INF].sum(-1) > 0
    y = torch.as_tensor(out.final >= major)
    res: dict[str, float] = {"alive_at": int(alive.sum())}
    tr = alive & (torch.arange(len(y)) % 2 == 0)
    te = alive & (torch.arange(len(y)) % 2 == 1)
    for name in ("global", "stratified"):
        X = f[name][k]
        clf = LogisticRegression(max_iter=2000).fit(X[tr].numpy(), y[tr].numpy())
        res[f"auc_{name}"] = float(roc_auc_score(y[te].numpy(), clf.predict_proba(X[te].numpy())[:, 1]))
    return res


def mean_field_curve(graph: nx.Graph, beta: float, law: Law, times: np.ndarray) -> dict[str, np.ndarray]:
    """The mean-field ODE (exponential recovery with the law's mean) from one initial node."""
    return mean_field_ode(graph, beta, 1.0 / law.mean, times)


# ----------------------------------------------------------------------------------------------- control
def train_cem(graph: nx.Graph, dynamics: str, task: ControlTask, *, runs: int, iters: int, population: int,
              elites: int, episodes: int, seed: int, device: torch.device | str = "cpu") -> CEMResult:
    """``runs`` independent CEM optimisations (batched) of constant per-tier intensities in simulator
    ``dynamics``; each candidate is scored by its mean return over ``episodes`` episodes, with the episodes
    shared by the candidates of one run and iteration (common random numbers) and fresh every iteration."""
    if dynamics not in SIMULATORS:
        raise ValueError(f"unknown simulator {dynamics!r}; use one of {SIMULATORS}")
    sim = make_simulator(graph, dynamics, task, device=device)
    gen = torch.Generator().manual_seed(seed)
    K, N = task.tiers, graph.number_of_nodes()

    def objective(theta: Tensor, it: int) -> Tensor:
        S_, P, _ = theta.shape
        th = theta.reshape(S_ * P, K).to(device, torch.float32)
        if dynamics == "ode":
            sim.reset(S_ * P)
            return rollout(sim, th.double(), task)["return"].view(S_, P).cpu()
        s_it = derive(seed, "iteration", it)
        init, thr, qu = crn_draws(N, S_ * episodes, s_it, device)  # fresh per run and iteration
        # replica (run s, candidate p, episode e) plays episode (s, e): a run's candidates share its episodes
        ep = (torch.arange(S_, device=device)[:, None, None] * episodes
              + torch.arange(episodes, device=device)[None, None, :]).expand(S_, P, episodes).reshape(-1)
        sim.reset(S_ * P * episodes, initial=init[ep], thresholds=thr[ep], period_quantiles=qu[ep],
                  seed=s_it)
        ret = rollout(sim, th.repeat_interleave(episodes, 0), task)["return"]
        return ret.view(S_, P, episodes).mean(-1).cpu()

    return cem_optimize(objective, K, runs=runs, iters=iters, population=population, elites=elites,
                        generator=gen)


@dataclass
class Evaluation:
    """Per policy (``[P, E]``, episodes shared by all policies): return, attack rate, doses, hub retention."""

    names: list[str]
    ret: np.ndarray
    attack: np.ndarray
    doses: np.ndarray
    hubs_kept: np.ndarray

    def mean(self) -> np.ndarray:
        return self.ret.mean(1)

    def paired(self, a: int, b: int) -> tuple[float, float]:
        """Mean and standard error of the paired return difference policy ``a`` − policy ``b``."""
        d = self.ret[a] - self.ret[b]
        return float(d.mean()), stats.se(d)


def evaluate(graph: nx.Graph, dynamics: str, thetas: Tensor, names: list[str], task: ControlTask, *, episodes: int,
             seed: int, device: torch.device | str = "cpu") -> Evaluation:
    """Evaluate constant-intensity policies in one simulator on common episodes."""
    out = policy_returns(graph, dynamics, thetas, task, episodes=episodes, seed=seed, device=device)
    return Evaluation(names=list(names), **{k: out[k].cpu().numpy() for k in ("attack", "doses", "hubs_kept")},
                      ret=out["return"].cpu().numpy())


FIXED_POLICIES = ("no control", "hubs only", "random allocation")


def seed_policies(trained: Mapping[str, Tensor], tiers: int, *, fixed: Sequence[str] = FIXED_POLICIES,
                  ) -> tuple[list[str], Tensor]:
    """The policies evaluated per training seed: the ``fixed`` rules (no control, :func:`~.env.hubs_only`,
    :func:`~.env.random_allocation`) and, for each simulator, the policy trained in it with that seed (``trained``:
    simulator name -> ``[S, K]`` CEM results). Returns the names (``"<simulator>-trained"``) and ``[S, P, K]``."""
    rules = {"no control": torch.zeros(tiers), "hubs only": hubs_only(tiers),
             "random allocation": random_allocation(tiers)}
    unknown = sorted(set(fixed) - set(rules))
    if unknown:
        raise ValueError(f"unknown fixed policies {unknown}; use some of {FIXED_POLICIES}")
    S = {int(t.shape[0]) for t in trained.values()}
    if len(S) != 1 or any(t.ndim != 2 or t.shape[1] != tiers for t in trained.values()):
        raise ValueError(f"trained policies must all be [seeds, {tiers}] with one number of seeds")
    (n_seeds,) = S
    cols = [rules[f].expand(n_seeds, tiers) for f in fixed] + [t.float().cpu() for t in trained.values()]
    return [*fixed, *(f"{name}-trained" for name in trained)], torch.stack(cols, dim=1)


@dataclass
class SeedEvaluation:
    """Per training seed ``s``, policy ``p`` and episode ``e`` (``[S, P, E]``): return, attack rate, doses and hub
    retention of one simulator. Seed ``s``'s policies share the episodes of its own episode set (common random
    numbers), and the sets of different seeds are independent, so a per-seed mean carries both the training and
    the evaluation noise into the spread over seeds."""

    names: list[str]
    ret: np.ndarray
    attack: np.ndarray
    doses: np.ndarray
    hubs_kept: np.ndarray
    seeds: list[int]

    def of(self, name: str, what: str = "ret") -> np.ndarray:
        """``[S, E]``: policy ``name``'s ``what`` (ret, attack, doses, hubs_kept) in every seed's episodes."""
        return getattr(self, what)[:, self.names.index(name)]

    def per_seed(self, name: str, what: str = "ret") -> np.ndarray:
        """``[S]``: the mean over each seed's episodes."""
        return self.of(name, what).mean(-1)


def evaluate_seeds(graph: nx.Graph, dynamics: str, thetas: Tensor, names: Sequence[str], task: ControlTask, *,
                   episodes: int, seed: int, device: torch.device | str = "cpu") -> SeedEvaluation:
    """Evaluate seed ``s``'s policies ``thetas[s]`` (``[S, P, K]``) on its own episode set, drawn from the stream
    ``derive(seed, "episodes", s)`` (:func:`~.env.policy_returns`: common random numbers across the policies, and
    across simulators evaluated with the same ``seed``). The ODE is deterministic: one column per policy."""
    thetas = torch.as_tensor(thetas, dtype=torch.float32)
    if thetas.ndim != 3 or thetas.shape[1] != len(names):
        raise ValueError(f"thetas must be [seeds, {len(names)} policies, tiers], got {tuple(thetas.shape)}")
    sim = make_simulator(graph, dynamics, task, device=device)
    E = 1 if dynamics == "ode" else episodes
    seeds = [derive(seed, "episodes", s) for s in range(len(thetas))]
    outs = [policy_returns(graph, dynamics, th.to(device), task, episodes=E, seed=seeds[s], device=device, sim=sim)
            for s, th in enumerate(thetas)]
    arrays = {k: np.stack([o[k].cpu().numpy() for o in outs]) for k in ("return", "attack", "doses", "hubs_kept")}
    return SeedEvaluation(names=list(names), ret=arrays["return"], attack=arrays["attack"], doses=arrays["doses"],
                          hubs_kept=arrays["hubs_kept"], seeds=seeds)


def train_sb3(algo: str, graph: nx.Graph, task: ControlTask, *, dynamics: str = "renewal",
              observer: str = "stratified", steps: int = 20_000, seed: int = 0, eval_episodes: int = 50,
              device: str = "cpu") -> dict[str, object]:
    """Full mode: train sb3-contrib's TQC or stable-baselines3's SAC (``algo`` in {"tqc", "sac"}) on
    :class:`~.env.SpreadingControlEnv` and evaluate the deterministic policy on the renewal simulator. Returns the
    evaluation returns, the learning curve (episode returns seen in training) and the model."""
    from sb3_contrib import TQC
    from stable_baselines3 import SAC
    from stable_baselines3.common.monitor import Monitor

    env = Monitor(SpreadingControlEnv(graph, task, dynamics=dynamics, observer=observer))
    kw = dict(learning_starts=min(1000, steps // 4), seed=seed, device=device, verbose=0, gamma=0.99,
              buffer_size=max(steps, 1000))
    if algo == "tqc":
        model = TQC("MlpPolicy", env, top_quantiles_to_drop_per_net=2,
                    policy_kwargs=dict(n_critics=2, n_quantiles=25, net_arch=[64, 64]), **kw)
    elif algo == "sac":
        model = SAC("MlpPolicy", env, policy_kwargs=dict(net_arch=[64, 64]), **kw)
    else:
        raise ValueError(f"algo must be 'tqc' or 'sac', got {algo!r}")
    model.learn(steps)
    test = SpreadingControlEnv(graph, task, dynamics="renewal", observer=observer)
    returns = []
    for e in range(eval_episodes):
        obs, _ = test.reset(seed=10_000 + e)
        done, total = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, r, term, trunc, _ = test.step(action)
            total += r
            done = term or trunc
        returns.append(total)
    return {"eval_returns": np.array(returns), "train_returns": np.array(env.get_episode_rewards()), "model": model}
