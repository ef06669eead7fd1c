"""The notebook's harness: exact checks of the two invariances, and the 2×2 ablation (arc-length × Sim(2) frame)
beside the absolute baselines, trained on sparse demonstrations and tested out of distribution.

Every policy family is one stacked model (:mod:`.models`) whose members are the variants: the main setting (16 demos
per skill, Beta(1–3) warps), the data sizes of the data-efficiency curve, the training-warp families, and the seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg
import torch

from .method import (
    arclength_resample,
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
from .models import AbsoluteMLP, GAMLite, train
from .problems import CORNERED, SKILLS, SMOOTH, SkillData, make_skill_dataset, skill_paths, time_warps

__all__ = ["FAMILIES", "Checks", "Suite", "exact_checks", "pose_grid", "run_suite"]

FAMILIES = ("B", "B+aug", "A-only", "S-only", "GAM")   # B+aug: B trained with rotation augmentation


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
    demos = make_skill_dataset(n_g // len(SKILLS), rng=rng, paths=paths, device=paths.device, dtype=torch.float64)
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
    for k in range(200):
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
    """Trained stacks, their variants and every measured error (means over seeds unless said otherwise)."""

    cfg: dict
    models: dict[str, AbsoluteMLP | GAMLite]
    members: dict[str, list[tuple[int, str, int]]]     # family → [(demos per skill, warp, seed)] per member
    train_sets: dict[tuple[int, str, int], SkillData]
    tests: dict[str, SkillData]
    err: dict[str, dict[tuple[int, str], dict[str, float]]] = field(default_factory=dict)
    angle_err: dict[str, np.ndarray] = field(default_factory=dict)   # main variant, per angle
    noise_err: dict[str, np.ndarray] = field(default_factory=dict)   # main variant, per start/goal noise level
    timed_rmse: dict[str, dict[str, float]] = field(default_factory=dict)
    frechet_id: dict[str, float] = field(default_factory=dict)
    success: dict[str, dict[str, float]] = field(default_factory=dict)
    untrained_gam: dict[str, float] = field(default_factory=dict)

    @property
    def main_variant(self) -> tuple[int, str]:
        """(demos per skill, training warp) of the main comparison."""
        return self.cfg["n_per_skill"], "beta"

    def main(self, family: str, split: str) -> float:
        """Error of the main variant on ``split`` (mean over seeds)."""
        return self.err[family][self.main_variant][split]

    def index(self, family: str, variant: tuple[int, str] | None = None, seed_index: int = 0) -> int:
        """Position of one member of ``family`` in its stack (B and B+aug share the time-indexed absolute stack)."""
        variant = variant or self.main_variant
        e = [i for i, (n, w, _) in enumerate(self.members[family]) if (n, w) == variant][seed_index]
        return _member(family, self.members, e)

    def predict(self, family: str, skill: torch.Tensor, start: torch.Tensor, goal: torch.Tensor,
                variant: tuple[int, str] | None = None, seed_index: int = 0) -> torch.Tensor:
        """World paths ``[N, m, 2]`` of one member."""
        with torch.no_grad():
            return self.models[_stack(family)](skill, start, goal)[self.index(family, variant, seed_index)]


def _member(family: str, members: dict, e: int) -> int:
    """Index of member ``e`` of ``family`` inside its stack (B and B+aug share the time-indexed absolute stack)."""
    return e + (len(members["B"]) if family == "B+aug" else 0)


def _stack(family: str) -> str:
    return "B" if family == "B+aug" else family


def _variants(cfg: dict) -> dict[str, list[tuple[int, str]]]:
    if cfg["n_per_skill"] not in cfg["sizes"] or "beta" not in cfg["train_warps"]:
        raise ValueError("the main setting (n_per_skill, 'beta') must be among sizes and train_warps")
    sizes = [(n, "beta") for n in cfg["sizes"]]
    warps = [(cfg["n_per_skill"], w) for w in cfg["train_warps"] if w != "beta"]
    full = sizes + warps
    return {"B": full, "B+aug": sizes, "A-only": full, "S-only": full, "GAM": full}


def _test_sets(cfg: dict, paths: torch.Tensor, seed: int, dev, dtype) -> dict[str, SkillData]:
    mk = dict(paths=paths, device=dev, dtype=dtype, noise=cfg["noise"], T=cfg["T"], n_eval=cfg["n"])
    n = cfg["n_test"]
    tests = {"ID": make_skill_dataset(n, rng=np.random.default_rng([seed, 10]), **mk),
             "OODrot": make_skill_dataset(n, theta_deg=(90.0, 180.0), rng=np.random.default_rng([seed, 11]), **mk),
             "OODscale": make_skill_dataset(n, scale=(1.5, 2.5), rng=np.random.default_rng([seed, 12]), **mk)}
    for w in ("stopgo", "softplus"):  # same poses as ID (drawn before the warp), only the timing changes
        tests[w] = make_skill_dataset(n, warp=w, rng=np.random.default_rng([seed, 10]), **mk)
    for i, a in enumerate(cfg["angles"]):
        rng = np.random.default_rng([seed, 20 + i])
        tests[f"angle{a}"] = make_skill_dataset(cfg["n_angle"], theta_deg=(a, a), rng=rng, **mk)
    return tests


def _build(cfg: dict, members: dict, seed: int) -> dict[str, AbsoluteMLP | GAMLite]:
    torch.manual_seed(seed)
    kw = dict(width=cfg["width"], depth=cfg["depth"])
    K, T, n = len(SKILLS), cfg["T"], cfg["n"]
    return {"B": AbsoluteMLP(K, T, arclength=False, members=len(members["B"]) + len(members["B+aug"]), **kw),
            "A-only": AbsoluteMLP(K, n, arclength=True, members=len(members["A-only"]), **kw),
            "S-only": GAMLite(K, T, T, arclength=False, members=len(members["S-only"]), **kw),
            "GAM": GAMLite(K, n, T, arclength=True, members=len(members["GAM"]), **kw)}


def _success(pred: torch.Tensor, data: SkillData, tol: float) -> torch.Tensor:
    """Relative success: final point within ``tol·s`` of the goal and clean path error below ``tol·s``."""
    s = data.scale.to(pred.dtype)
    end = (pred[..., -1, :] - data.goal).norm(dim=-1) < tol * s
    return (end & (path_error(pred, data.clean_path) < tol * s)).to(pred.dtype).mean(-1)


def run_suite(cfg: dict, seeds: list[int], *, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> Suite:
    """Train every family's variants for every seed (one stacked fit per architecture) and measure all splits."""
    paths = skill_paths(device=device)
    var = _variants(cfg)
    members = {f: [(n, w, s) for s in seeds for (n, w) in v] for f, v in var.items()}
    mk = dict(paths=paths, device=device, dtype=dtype, noise=cfg["noise"], T=cfg["T"], n_eval=cfg["n"])
    keys = {(n, w, s) for m in members.values() for (n, w, s) in m}
    train_sets = {k: make_skill_dataset(k[0], warp=k[1], rng=np.random.default_rng([k[2], 0, k[0], len(k[1])]), **mk)
                  for k in sorted(keys)}
    tests = _test_sets(cfg, paths, seeds[0] + 1000, device, dtype)
    models = _build(cfg, members, seeds[0])
    fit_kw = dict(steps=cfg["steps"], lr=cfg["lr"], batch=cfg["batch"], seed=seeds[0])
    b_members = members["B"] + members["B+aug"]
    train(models["B"], [train_sets[k] for k in b_members],
          augment=[False] * len(members["B"]) + [True] * len(members["B+aug"]), **fit_kw)
    for f in ("A-only", "S-only", "GAM"):
        train(models[f], [train_sets[k] for k in members[f]], **fit_kw)
    suite = Suite(cfg, models, members, train_sets, tests)
    _measure(suite, seeds)
    return suite


def _errors(suite: Suite, family: str, data: SkillData, start=None, goal=None) -> np.ndarray:
    """Clean-path error of every member of ``family`` on ``data`` (optionally with perturbed start/goal inputs)."""
    start = data.start if start is None else start
    goal = data.goal if goal is None else goal
    with torch.no_grad():
        pred = suite.models[_stack(family)](data.skill, start, goal)
    idx = [_member(family, suite.members, e) for e in range(len(suite.members[family]))]
    return path_error(pred[idx], data.clean_path).mean(-1).cpu().numpy()


def _measure(suite: Suite, seeds: list[int]) -> None:
    cfg, tests = suite.cfg, suite.tests
    rng = np.random.default_rng([seeds[0], 99])
    idd = tests["ID"]
    noise = {s: torch.as_tensor(rng.normal(0, 1, (2, len(idd), 2)), device=idd.x.device, dtype=idd.x.dtype) * s
             for s in cfg["pose_noise"]}
    for f in FAMILIES:
        variants = sorted({(n, w) for n, w, _ in suite.members[f]})
        mask = {v: np.array([(n, w) == v for n, w, _ in suite.members[f]]) for v in variants}
        suite.err[f] = {v: {} for v in variants}
        for split in ("ID", "OODrot", "OODscale"):
            e = _errors(suite, f, tests[split])
            for v in variants:
                suite.err[f][v][split] = float(e[mask[v]].mean())
        main = mask[suite.main_variant]
        suite.angle_err[f] = np.array([_errors(suite, f, tests[f"angle{a}"])[main].mean() for a in cfg["angles"]])
        suite.noise_err[f] = np.array([_errors(suite, f, idd, idd.start + z[0], idd.goal + z[1])[main].mean()
                                       for z in noise.values()])
    _timing_and_extras(suite)


def _timing_and_extras(suite: Suite) -> None:
    """Time-indexed RMSE on the unseen warps, Fréchet on ID, relative success, and an untrained GAM-lite."""
    tests, models = suite.tests, suite.models
    for split in ("ID", "stopgo", "softplus"):
        d = tests[split]
        with torch.no_grad():
            preds = {"B": models["B"](d.skill, d.start, d.goal)[suite.index("B")],
                     "S-only": models["S-only"].timed(d.skill, d.start, d.goal)[suite.index("S-only")],
                     "GAM (own timing)": models["GAM"].timed(d.skill, d.start, d.goal)[suite.index("GAM")],
                     "GAM (commanded timing)": models["GAM"].timed(d.skill, d.start, d.goal, d.u)[suite.index("GAM")]}
        for k, p in preds.items():
            suite.timed_rmse.setdefault(k, {})[split] = float((p - d.clean_timed).pow(2).sum(-1).mean().sqrt())
    for f in FAMILIES:
        for split in ("ID", "OODrot"):
            d = tests[split]
            p = suite.predict(f, d.skill, d.start, d.goal)
            suite.success.setdefault(f, {})[split] = float(_success(p, d, suite.cfg["success_tol"]))
            if split == "ID":
                P = arclength_resample(p, suite.cfg["n"])[0]
                suite.frechet_id[f] = float(frechet(P, d.clean_path).mean())
    torch.manual_seed(12345)
    fresh = GAMLite(len(SKILLS), suite.cfg["n"], suite.cfg["T"], arclength=True, width=suite.cfg["width"],
                    depth=suite.cfg["depth"]).to(device=tests["ID"].x.device, dtype=tests["ID"].x.dtype)
    for split in ("ID", "OODrot"):
        d = tests[split]
        with torch.no_grad():
            suite.untrained_gam[split] = float(path_error(fresh(d.skill, d.start, d.goal)[0], d.clean_path).mean())


def pose_grid(skill: int, thetas_deg: Sequence[float], scales: Sequence[float], *,
              device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(skill, start, goal) for every (θ, s) of a grid, all starting at the origin: the manifold a policy spans."""
    th, s = np.meshgrid(np.deg2rad(np.asarray(thetas_deg, float)), np.asarray(scales, float), indexing="ij")
    goal = torch.as_tensor(np.stack([s * np.cos(th), s * np.sin(th)], -1).reshape(-1, 2), device=device, dtype=dtype)
    return torch.full((len(goal),), skill, device=device, dtype=torch.long), torch.zeros_like(goal), goal
