"""The notebook's harness: exact checks of the two invariances, and the 2×2 ablation (arc-length × Sim(2) frame)
beside the absolute baselines, the learned equivariant frame and the lookup controls, trained on sparse
demonstrations of shape-varying skills and tested out of distribution.

Every policy family is one stacked model (:mod:`.models`) whose members are the variants: the main setting (16 demos
per skill, Beta(1–3) warps, shapes ``a ~ U[0, 1]``), the data sizes of the data-efficiency curve, the training-warp
families, the fixed-shape generator (GAM-lite only), and the seeds. Every error is kept per seed
(:meth:`Suite.per_seed`), so the notebook's claims get their intervals over seeds from :mod:`repro.common.stats`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg
import torch

from .method import (
    arclength_resample,
    chord_frame,
    compose,
    factorize,
    frechet,
    path_error,
    retime,
    sim2_act,
    sim2_exp,
    sim2_log,
    sim2_matrix,
)
from .models import AbsoluteMLP, GAMEq, GAMLite, SchemaLookup, train
from .problems import CORNERED, SKILLS, SMOOTH, SkillData, make_skill_dataset, time_warps

__all__ = ["CONTROLS", "FAMILIES", "Checks", "Suite", "exact_checks", "pose_grid", "run_suite"]

FAMILIES = ("B", "B+aug", "A-only", "S-only", "GAM", "GAM-eq")   # B+aug: B trained with rotation augmentation
CONTROLS = ("lookup-mean", "lookup-nearest")                    # SchemaLookup(mode="mean" / "nearest")
SPLITS = ("ID", "OODrot", "OODscale")
Variant = tuple[int, str, str]          # (demos per skill, training warp, "vary" | "fixed" shapes)


# ------------------------------------------------------------------------------------------------ exact checks
@dataclass
class Checks:
    """Exact properties of :mod:`.method` (float64)."""

    schema_invariance: float        # max |W(g·x) − W(x)| over random g, open (chord) and closed (moment) paths
    exp_log: float                  # max |exp(log G) − G| and |log(exp ξ) − ξ|
    vs_scipy: float                 # max |sim2_exp − scipy expm| and |sim2_log − scipy logm|
    warp: np.ndarray                # [skills, families] max |P(warped) − P(unwarped)|
    warp_families: tuple[str, ...]
    roundtrip_sim2: float           # max |exp(ξ)·W − P|
    roundtrip_full: dict[int, float]  # n → max |compose(factorize(x)) − x| on noisy T = 50 demos

    @property
    def warp_smooth(self) -> float:
        return float(self.warp[[SKILLS.index(k) for k in SMOOTH]].max())

    @property
    def warp_cornered(self) -> float:
        return float(self.warp[[SKILLS.index(k) for k in CORNERED]].max())


def _random_sim2(count: int, rng: np.random.Generator, f64: dict) -> torch.Tensor:
    theta, s = rng.uniform(-np.pi, np.pi, count), np.exp(rng.uniform(np.log(0.1), np.log(10.0), count))
    t = rng.uniform(-100, 100, (count, 2))
    rot = torch.polar(torch.as_tensor(s, **f64), torch.as_tensor(theta, **f64))
    return sim2_matrix(rot, torch.complex(*torch.as_tensor(t, **f64).unbind(-1)))


def exact_checks(paths: torch.Tensor, *, n_g: int = 2000, warps_per: int = 25, T_dense: int = 2000, n_dense: int = 64,
                 families: tuple[str, ...] = ("beta", "stopgo", "softplus", "beta_strong"), seed: int = 0) -> Checks:
    """Schema invariance, exp/log against scipy, time-warp invariance and round trips (spec §4, C1/C2)."""
    rng = np.random.default_rng([seed, 1])
    f64 = dict(device=paths.device, dtype=torch.float64)
    paths = paths.to(**f64)
    demos = make_skill_dataset(n_g // len(SKILLS), rng=rng, device=paths.device, dtype=torch.float64)
    g = _random_sim2(len(demos), rng, f64)
    W0 = factorize(demos.x, 32)[0]
    inv = float((factorize(sim2_act(g, demos.x), 32)[0] - W0).abs().max())
    circle = torch.polar(torch.ones(200, **f64), torch.linspace(0, 2 * np.pi, 200, **f64))
    closed = torch.stack([2 * circle.real + 0.3 * circle.imag**2, circle.imag], -1)  # an asymmetric closed curve
    closed = closed.expand(len(g), -1, -1)
    Wc = factorize(closed, 64, "moment")[0]
    inv = max(inv, float((factorize(sim2_act(g, closed), 64, "moment")[0] - Wc).abs().max()))
    # exp/log: round trips, and against scipy's matrix exponential / logarithm of the algebra matrix
    xi = torch.as_tensor(np.c_[rng.normal(0, 2, (n_g, 2)), rng.uniform(-3.1, 3.1, n_g), rng.normal(0, 1, n_g)], **f64)
    G = sim2_exp(xi)
    exp_log = max(float((sim2_log(G) - xi).abs().max()), float((sim2_exp(sim2_log(g)) - g).abs().max()))
    vs = 0.0
    for k in range(min(200, n_g)):  # at most 200 scipy comparisons, never past the n_g draws
        rx, ry, th, lam = xi[k].tolist()
        A = np.array([[lam, -th, rx], [th, lam, ry], [0.0, 0.0, 0.0]])
        vs = max(vs, np.abs(scipy.linalg.expm(A) - G[k].cpu().numpy()).max(),
                 np.abs(scipy.linalg.logm(G[k].cpu().numpy()).real - A).max())
    # time-warp invariance: the arc-length path of a warped dense execution against the unwarped one
    warp = np.zeros((len(SKILLS), len(families)))
    plain = arclength_resample(retime(paths, torch.linspace(0, 1, T_dense, **f64)), n_dense)[0]
    for j, fam in enumerate(families):
        u = torch.as_tensor(time_warps(fam, warps_per * len(SKILLS), T_dense, rng), **f64).view(len(SKILLS), -1,
                                                                                                  T_dense)
        P = arclength_resample(retime(paths[:, None].expand(-1, warps_per, -1, -1), u), n_dense)[0]
        warp[:, j] = (P - plain[:, None]).norm(dim=-1).amax((1, 2)).cpu().numpy()
    # round trips: the Sim(2) part is exact; the full one goes through an n-point polyline
    Wf, xif, uf, _ = factorize(demos.x, 32)
    Pf = arclength_resample(demos.x, 32)[0]
    rt_sim2 = float((sim2_act(sim2_exp(xif), Wf) - Pf).abs().max())
    full = {}
    for n in (32, 256):
        Wn, xin, un, _ = factorize(demos.x, n)
        full[n] = float((compose(Wn, xin, un) - demos.x).norm(dim=-1).max())
    return Checks(inv, exp_log, float(vs), warp, families, rt_sim2, full)


# ------------------------------------------------------------------------------------------------ the suite
@dataclass
class Suite:
    """Trained stacks, their variants and every measured error, kept per seed (``seeds`` in order).

    ``err[f][variant][split]``: one value per seed of the mean clean-path error of family ``f`` (a policy of
    :data:`FAMILIES` or a control of :data:`CONTROLS`) on a test split. ``angle_err`` and ``noise_err`` (main variant):
    ``[seeds, angles]`` and ``[seeds, noise levels]``; ``timed_rmse[k][split]``: one value per seed."""

    cfg: dict
    seeds: list[int]
    models: dict[str, AbsoluteMLP | GAMLite | GAMEq]
    members: dict[str, list[tuple[int, str, str, int]]]   # family → [(demos per skill, warp, shapes, seed)]
    train_sets: dict[tuple[int, str, str, int], SkillData]
    tests: dict[str, SkillData]
    lookups: dict[tuple[str, int, str, str, int], SchemaLookup] = field(default_factory=dict)
    err: dict[str, dict[Variant, dict[str, np.ndarray]]] = field(default_factory=dict)
    angle_err: dict[str, np.ndarray] = field(default_factory=dict)
    noise_err: dict[str, np.ndarray] = field(default_factory=dict)
    timed_rmse: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    frechet_id: dict[str, float] = field(default_factory=dict)
    success: dict[str, dict[str, float]] = field(default_factory=dict)
    untrained_gam: dict[str, float] = field(default_factory=dict)

    @property
    def main_variant(self) -> Variant:
        """(demos per skill, training warp, shapes) of the main comparison."""
        return self.cfg["n_per_skill"], "beta", "vary"

    def per_seed(self, family: str, split: str, variant: Variant | None = None) -> np.ndarray:
        """Errors of ``family`` on ``split``, one per seed (main variant unless given)."""
        return self.err[family][variant or self.main_variant][split]

    def main(self, family: str, split: str, variant: Variant | None = None) -> float:
        """Error on ``split``, mean over seeds (main variant unless given)."""
        return float(self.per_seed(family, split, variant).mean())

    def index(self, family: str, variant: Variant | None = None, seed_index: int = 0) -> int:
        """Position of one member of ``family`` in its stack (B and B+aug share the time-indexed absolute stack)."""
        variant = variant or self.main_variant
        e = [i for i, m in enumerate(self.members[family]) if m[:3] == variant][seed_index]
        return _member(family, self.members, e)

    def predict(self, family: str, skill: torch.Tensor, shape: torch.Tensor, start: torch.Tensor,
                goal: torch.Tensor, variant: Variant | None = None, seed_index: int = 0) -> torch.Tensor:
        """World paths ``[N, m, 2]`` of one member (or of a control, built on that seed's training set)."""
        variant = variant or self.main_variant
        with torch.no_grad():
            if family in CONTROLS:
                return self.lookups[(family, *variant, self.seeds[seed_index])](skill, shape, start, goal)[0]
            return self.models[_stack(family)](skill, shape, start, goal)[self.index(family, variant, seed_index)]


def _member(family: str, members: dict, e: int) -> int:
    """Index of member ``e`` of ``family`` inside its stack (B and B+aug share the time-indexed absolute stack)."""
    return e + (len(members["B"]) if family == "B+aug" else 0)


def _stack(family: str) -> str:
    return "B" if family == "B+aug" else family


def _variants(cfg: dict) -> dict[str, list[Variant]]:
    """The variants each family trains, per seed."""
    n0 = cfg["n_per_skill"]
    if n0 not in cfg["sizes"] or "beta" not in cfg["train_warps"]:
        raise ValueError("the main setting (n_per_skill, 'beta') must be among sizes and train_warps")
    sizes = [(n, "beta", "vary") for n in cfg["sizes"]]
    warps = [(n0, w, "vary") for w in cfg["train_warps"] if w != "beta"]
    full = sizes + warps
    return {"B": full, "B+aug": sizes, "A-only": full, "S-only": full,
            "GAM": full + [(n0, "beta", "fixed")], "GAM-eq": [(n0, "beta", "vary")]}


def _data_kw(cfg: dict, dev, dtype) -> dict:
    return dict(device=dev, dtype=dtype, noise=cfg["noise"], T=cfg["T"], n_eval=cfg["n"])


def _test_sets(cfg: dict, seed: int, dev, dtype) -> dict[str, SkillData]:
    mk = _data_kw(cfg, dev, dtype)
    n = cfg["n_test"]
    tests = {"ID": make_skill_dataset(n, rng=np.random.default_rng([seed, 10]), **mk),
             "OODrot": make_skill_dataset(n, theta_deg=(90.0, 180.0), rng=np.random.default_rng([seed, 11]), **mk),
             "OODscale": make_skill_dataset(n, scale=(1.5, 2.5), rng=np.random.default_rng([seed, 12]), **mk),
             "ID-fixed": make_skill_dataset(n, shape=(0.5, 0.5), rng=np.random.default_rng([seed, 13]), **mk)}
    for w in ("stopgo", "softplus"):  # same poses and shapes as ID (drawn before the warp), only the timing changes
        tests[w] = make_skill_dataset(n, warp=w, rng=np.random.default_rng([seed, 10]), **mk)
    for i, a in enumerate(cfg["angles"]):
        rng = np.random.default_rng([seed, 20 + i])
        tests[f"angle{a}"] = make_skill_dataset(cfg["n_angle"], theta_deg=(a, a), rng=rng, **mk)
    return tests


def _build(cfg: dict, members: dict, seed: int) -> dict[str, AbsoluteMLP | GAMLite | GAMEq]:
    torch.manual_seed(seed)
    kw = dict(width=cfg["width"], depth=cfg["depth"])
    K, T, n = len(SKILLS), cfg["T"], cfg["n"]
    return {"B": AbsoluteMLP(K, T, arclength=False, members=len(members["B"]) + len(members["B+aug"]), **kw),
            "A-only": AbsoluteMLP(K, n, arclength=True, members=len(members["A-only"]), **kw),
            "S-only": GAMLite(K, T, T, arclength=False, members=len(members["S-only"]), **kw),
            "GAM": GAMLite(K, n, T, arclength=True, members=len(members["GAM"]), **kw),
            "GAM-eq": GAMEq(K, n, members=len(members["GAM-eq"]), **kw)}


def _success(pred: torch.Tensor, data: SkillData, tol: float) -> torch.Tensor:
    """Relative success: final point within ``tol·s`` of the goal and clean path error below ``tol·s``."""
    s = data.scale.to(pred.dtype)
    end = (pred[..., -1, :] - data.goal).norm(dim=-1) < tol * s
    return (end & (path_error(pred, data.clean_path) < tol * s)).to(pred.dtype).mean(-1)


def run_suite(cfg: dict, seeds: list[int], *, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> Suite:
    """Train every family's variants for every seed (one stacked fit per architecture), build the lookup controls
    on the same training sets, and measure all splits. The test sets are shared by all seeds (drawn from
    ``seeds[0] + 1000``), so per-seed values differ only by training data and initialisation."""
    var = _variants(cfg)
    members = {f: [(*v, s) for s in seeds for v in vs] for f, vs in var.items()}
    mk = _data_kw(cfg, device, dtype)
    keys = sorted({m for ms in members.values() for m in ms})
    train_sets = {k: make_skill_dataset(k[0], warp=k[1], shape=(0.0, 1.0) if k[2] == "vary" else (0.5, 0.5),
                                        rng=np.random.default_rng([k[3], 0, k[0], len(k[1]), len(k[2])]), **mk)
                  for k in keys}
    tests = _test_sets(cfg, seeds[0] + 1000, device, dtype)
    models = _build(cfg, members, seeds[0])
    fit_kw = dict(steps=cfg["steps"], lr=cfg["lr"], batch=cfg["batch"], seed=seeds[0])
    b_members = members["B"] + members["B+aug"]
    train(models["B"], [train_sets[k] for k in b_members],
          augment=[False] * len(members["B"]) + [True] * len(members["B+aug"]), **fit_kw)
    for f in ("A-only", "S-only", "GAM", "GAM-eq"):
        train(models[f], [train_sets[k] for k in members[f]], **fit_kw)
    suite = Suite(cfg, list(seeds), models, members, train_sets, tests)
    for (n, w, sh, seed) in members["GAM"]:        # the controls, on every training set GAM-lite saw
        for c in CONTROLS:
            suite.lookups[(c, n, w, sh, seed)] = SchemaLookup(train_sets[(n, w, sh, seed)], cfg["n"], c[7:])
    _measure(suite)
    return suite


def _predict_all(suite: Suite, family: str, data: SkillData, start=None, goal=None) -> tuple[torch.Tensor, list]:
    """Predictions of every member of ``family`` (or every lookup of a control) ``[E, N, m, 2]``, and the
    member keys ``(n, warp, shapes, seed)`` in the same order."""
    start = data.start if start is None else start
    goal = data.goal if goal is None else goal
    with torch.no_grad():
        if family in CONTROLS:
            keys = [k[1:] for k in suite.lookups if k[0] == family]
            preds = [suite.lookups[(family, *k)](data.skill, data.shape, start, goal)[0] for k in keys]
            return torch.stack(preds), keys
        pred = suite.models[_stack(family)](data.skill, data.shape, start, goal)
    idx = [_member(family, suite.members, e) for e in range(len(suite.members[family]))]
    return pred[idx], suite.members[family]


def _errors(suite: Suite, family: str, data: SkillData, start=None, goal=None) -> tuple[np.ndarray, list]:
    """Clean-path error of every member of ``family`` on ``data`` (optionally with perturbed start/goal inputs)."""
    pred, keys = _predict_all(suite, family, data, start, goal)
    return path_error(pred, data.clean_path).mean(-1).cpu().numpy().astype(np.float64), keys


def _by_variant(values: np.ndarray, keys: list, seeds: list[int]) -> dict[Variant, np.ndarray]:
    """``{variant: values in seed order}`` from per-member values."""
    out: dict[Variant, list] = {}
    for v, k in sorted(zip(values, keys, strict=True), key=lambda t: (t[1][:3], seeds.index(t[1][3]))):
        out.setdefault(k[:3], []).append(v)
    return {k: np.asarray(v) for k, v in out.items()}


def _measure(suite: Suite) -> None:
    cfg, tests, seeds = suite.cfg, suite.tests, suite.seeds
    rng = np.random.default_rng([seeds[0], 99])
    idd = tests["ID"]
    noise = [torch.as_tensor(rng.normal(0, 1, (2, len(idd), 2)), device=idd.x.device, dtype=idd.x.dtype) * s
             for s in cfg["pose_noise"]]
    main = suite.main_variant
    for f in FAMILIES + CONTROLS:
        suite.err[f] = {}
        for split in SPLITS + ("ID-fixed",):
            e, keys = _errors(suite, f, tests[split])
            for v, vals in _by_variant(e, keys, seeds).items():
                if (split == "ID-fixed") == (v[2] == "fixed"):
                    suite.err[f].setdefault(v, {})[split] = vals
        suite.angle_err[f] = np.stack([_by_variant(*_errors(suite, f, tests[f"angle{a}"]), seeds)[main]
                                       for a in cfg["angles"]], -1)
        suite.noise_err[f] = np.stack([_by_variant(*_errors(suite, f, idd, idd.start + z[0], idd.goal + z[1]),
                                                   seeds)[main] for z in noise], -1)
    _timing_and_extras(suite)


def _timing_and_extras(suite: Suite) -> None:
    """Time-indexed RMSE on the unseen warps (and the 32-point polyline's own floor), Fréchet on ID, relative
    success, and an untrained GAM-lite."""
    tests, models, cfg = suite.tests, suite.models, suite.cfg
    main = suite.main_variant

    def rmse(p: torch.Tensor, d: SkillData) -> torch.Tensor:
        return (p - d.clean_timed).pow(2).sum(-1).mean((-2, -1)).sqrt()

    for split in ("ID", "stopgo", "softplus"):
        d = tests[split]
        with torch.no_grad():
            out = {"B": models["B"](d.skill, d.shape, d.start, d.goal),
                   "S-only": models["S-only"].timed(d.skill, d.shape, d.start, d.goal),
                   "GAM (own timing)": models["GAM"].timed(d.skill, d.shape, d.start, d.goal),
                   "GAM (commanded timing)": models["GAM"].timed(d.skill, d.shape, d.start, d.goal, d.u)}
        for k, p in out.items():
            fam = k.split(" ")[0]
            idx = [suite.index(fam, main, i) for i in range(len(suite.seeds))]
            suite.timed_rmse.setdefault(k, {})[split] = rmse(p[idx], d).cpu().numpy().astype(np.float64)
        # GAM-lite's schema re-spaced by its own arc length first: its knots sit at the noisy demos' fractions
        W = models["GAM"].schema(d.skill, d.shape).detach()
        idx = [suite.index("GAM", main, i) for i in range(len(suite.seeds))]
        respaced = sim2_act(chord_frame(d.start, d.goal), retime(arclength_resample(W[idx], cfg["n"])[0], d.u))
        suite.timed_rmse.setdefault("GAM (commanded, knots re-spaced)", {})[split] = \
            rmse(respaced, d).cpu().numpy().astype(np.float64)
        # the floor: the true path, read at the same n arc-length knots, executed with the same commanded timing
        floor = rmse(retime(d.clean_path, d.u), d).expand(len(suite.seeds))
        suite.timed_rmse.setdefault("true path at n knots (commanded)", {})[split] = \
            floor.cpu().numpy().astype(np.float64)
    for f in FAMILIES + CONTROLS:
        for split in ("ID", "OODrot"):
            d = tests[split]
            p = suite.predict(f, d.skill, d.shape, d.start, d.goal)
            suite.success.setdefault(f, {})[split] = float(_success(p, d, cfg["success_tol"]))
            if split == "ID":
                P = arclength_resample(p, cfg["n"])[0]
                suite.frechet_id[f] = float(frechet(P, d.clean_path).mean())
    torch.manual_seed(12345)
    fresh = GAMLite(len(SKILLS), cfg["n"], cfg["T"], arclength=True, width=cfg["width"],
                    depth=cfg["depth"]).to(device=tests["ID"].x.device, dtype=tests["ID"].x.dtype)
    for split in ("ID", "OODrot"):
        d = tests[split]
        with torch.no_grad():
            pred = fresh(d.skill, d.shape, d.start, d.goal)[0]
            suite.untrained_gam[split] = float(path_error(pred, d.clean_path).mean())


def pose_grid(skill: int, thetas_deg: Sequence[float], scales: Sequence[float], shape: float = 0.5, *,
              device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(skill, shape, start, goal) for every (θ, s) of a grid, all starting at the origin, at one shape parameter:
    the manifold a policy spans."""
    th, s = np.meshgrid(np.deg2rad(np.asarray(thetas_deg, float)), np.asarray(scales, float), indexing="ij")
    goal = torch.as_tensor(np.stack([s * np.cos(th), s * np.sin(th)], -1).reshape(-1, 2), device=device, dtype=dtype)
    skill_ids = torch.full((len(goal),), skill, device=device, dtype=torch.long)
    return skill_ids, torch.full((len(goal),), shape, device=device, dtype=dtype), torch.zeros_like(goal), goal
