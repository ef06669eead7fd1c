"""The notebook's harness: data, source training, the scale sweep, AdaBN, the UDA arms, and the BCR studies.

Pipeline (quick mode; see the notebook for what it can and cannot show):

1. :func:`build_data`: disjoint identity pools for source training, target training (unlabeled) and test; scenes of
   the source domain, the target domain, the target camera at fixed heights (the scale sweep) and the source camera
   (``S_src``); oracle-box crops.
2. :func:`train_backbone`: backbone + plain head trained on source crops (cosine classifier, ``fit``).
3. :func:`cache_maps`: the backbone's RoI maps of every crop, with source BN statistics for source-domain crops
   and target statistics (AdaBN on the unlabeled target crops) for target-camera crops: domain-specific BN
   statistics with shared weights (a light form of the DSBN the paper's head uses).
4. Per seed, :func:`run_arms`: heads trained from scratch on the cached source maps (plain and with SDH), then the
   arms: source-only, AdaBN, UDA with pseudo-labels (DBSCAN on the Jaccard distance), + BCR, + SDH, + both, and the
   target-supervised oracle. UDA fine-tunes the head only (the backbone is frozen after AdaBN): a budget deviation.

Target identities never reach the pseudo-labeller: the UDA code sees an :class:`UnlabeledTarget` (maps only); the
truth lives in :class:`Data` and is used only to score pseudo-labels (ARI/NMI) after they are made.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
from torch import nn

from repro.common import stats as book_stats
from repro.common.mapping import Mapper, serial_map
from repro.common.seeding import derive
from repro.common.train import cosine_schedule, fit

from . import synth
from .cluster import BCRStats, bcr_labels, dbscan_labels, jaccard_distance, pseudo_ids
from .evaluate import SearchResult, oracle_search
from .memory import ClusterMemory
from .network import Backbone, CosineClassifier, Head, adabn, embed

__all__ = [
    "ARMS", "REGIMES", "Config", "PhaseDiagram", "SeedRun", "Summary", "bcr_mechanics", "bcr_phase_diagram",
    "make_config", "planted_clusters", "prepare", "run_seed", "run_seeds", "summarize", "uda",
]


@dataclass
class Config:
    """Every setting of the experiment (the notebook's ``CFG`` fills it)."""

    design: str = "fine"
    src_ids: int = 120
    src_scenes: int = 160
    tgt_ids: int = 100
    tgt_scenes: int = 130
    test_ids: int = 60
    test_scenes: int = 55
    heights: tuple[float, ...] = (120, 80, 50, 30, 20)
    input_hw: tuple[int, int] = (48, 24)
    widths: tuple[int, int, int, int] = (16, 32, 64, 96)
    dim: int = 128
    sdh_channels: int = 8
    sdh_weight: float = 1.0
    batch: int = 64
    src_epochs: int = 8
    src_lr: float = 2e-3
    uda_rounds: int = 2
    uda_iters: int = 60
    uda_lr: float = 1e-3
    outliers: str = "drop"
    k1: int = 12
    k2: int = 4
    eps: float = 0.5
    min_samples: int = 4
    seeds: tuple[int, ...] = (0, 1)


def make_config(settings: dict) -> Config:
    """A :class:`Config` from the notebook's ``CFG`` (keys that are not fields are ignored; lists become tuples)."""
    names = {f.name for f in dataclasses.fields(Config)}
    return Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in settings.items() if k in names})


@dataclass
class CropSet:
    """Crops (or their cached maps) of one split with their boxes, pids and scene indices (for evaluation)."""

    x: torch.Tensor
    boxes: torch.Tensor
    pids: torch.Tensor
    scenes: torch.Tensor


@dataclass(frozen=True)
class UnlabeledTarget:
    """What UDA sees of the target training set: its RoI maps, nothing else."""

    maps: torch.Tensor

    def __post_init__(self):
        if not self.maps.is_floating_point() or self.maps.ndim != 4:
            raise TypeError("UnlabeledTarget holds float RoI maps (n, C, H, W) only")


@dataclass
class Data:
    """The benchmark: source training crops with pids, target training crops (pids kept apart in ``target_truth``,
    for scoring pseudo-labels only), and test sets by name (``S_src``, ``T120`` … ``T20``, ``T_test``)."""

    source: CropSet
    target: torch.Tensor
    target_truth: np.ndarray
    tests: dict[str, CropSet]
    splits: dict[str, synth.Split] = field(repr=False, default_factory=dict)


def _cropset(split: synth.Split, hw: tuple[int, int], device) -> CropSet:
    return CropSet(synth.crop_rois(split, hw, device=device), torch.as_tensor(split.boxes, device=device),
                   torch.as_tensor(split.pids, device=device), torch.as_tensor(split.scene, device=device))


def build_data(cfg: Config, seed: int, device: torch.device | str = "cpu") -> Data:
    """Render every split (deterministic in ``seed``; identity pools are disjoint: source pids from 0, target
    training from 10 000, test from 20 000)."""
    src_ids = synth.make_identities(cfg.src_ids, seed, cfg.design, first_pid=0)
    tgt_ids = synth.make_identities(cfg.tgt_ids, derive(seed, "target-ids"), cfg.design, first_pid=10_000)
    test_ids = synth.make_identities(cfg.test_ids, derive(seed, "test-ids"), cfg.design, first_pid=20_000)
    splits = {"source": synth.make_split(synth.SOURCE, cfg.src_scenes, src_ids, seed),
              "target": synth.make_split(synth.TARGET, cfg.tgt_scenes, tgt_ids, derive(seed, "target")),
              "S_src": synth.make_split(synth.SOURCE, cfg.test_scenes, test_ids, derive(seed, "S_src")),
              "T_test": synth.make_split(synth.TARGET, cfg.test_scenes, test_ids, derive(seed, "T_test"))}
    for h in cfg.heights:  # the same seed at every height: the same scenes, only the person height changes
        splits[f"T{int(h)}"] = synth.make_split(synth.scale_sweep_domain(h), cfg.test_scenes, test_ids,
                                                derive(seed, "scale-sweep"))
    source = _cropset(splits["source"], cfg.input_hw, device)
    target = synth.crop_rois(splits["target"], cfg.input_hw, device=device)
    tests = {k: _cropset(v, cfg.input_hw, device) for k, v in splits.items() if k not in ("source", "target")}
    return Data(source, target, splits["target"].pids.copy(), tests, splits)


def _batches(n: int, batch: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """``steps`` batches of indices drawn epoch by epoch from fresh permutations (with fewer than ``batch`` items,
    batches run across consecutive permutations)."""
    if n < 1:
        raise ValueError("no samples to draw batches from (e.g. every pseudo-label is an outlier)")
    if n < batch:
        return np.concatenate([rng.permutation(n) for _ in range(-(-steps * batch // n))])[: steps * batch].reshape(
            steps, batch)
    per = n // batch
    perms = np.concatenate([rng.permutation(n)[: per * batch] for _ in range(-(-steps // per))])
    return perms[: steps * batch].reshape(steps, batch)


def _classes(pids: torch.Tensor) -> torch.Tensor:
    return torch.unique(pids, return_inverse=True)[1]


class SourceModel(nn.Module):
    """One backbone with two heads trained side by side on the source: ``plain`` (the baseline) and ``sdh`` (the
    same head with SDH); ``heads[kind]`` composed with the backbone is a complete re-ID model."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.backbone = Backbone(cfg.widths[:3])
        self.heads = nn.ModuleDict({k: Head(cfg.widths[2], cfg.widths[3], cfg.dim, w, cfg.sdh_channels)
                                    for k, w in (("plain", None), ("sdh", cfg.sdh_weight))})

    def model(self, kind: str) -> nn.Module:
        return nn.Sequential(self.backbone, self.heads[kind])


def train_source(data: Data, cfg: Config, seed: int) -> SourceModel:
    """Source training: the backbone and both heads, each head with its own cosine classifier (scale 16, label
    smoothing 0.1; the two cross-entropies summed), Adam with a cosine schedule (10 % warm-up), through
    :func:`repro.common.train.fit`. The model's initialisation is seeded by ``seed`` alone."""
    x, y = data.source.x, _classes(data.source.pids)
    torch.manual_seed(seed)
    net = SourceModel(cfg).to(x.device)
    clfs = nn.ModuleDict({k: CosineClassifier(cfg.dim, int(y.max()) + 1) for k in net.heads}).to(x.device)
    steps = max(1, cfg.src_epochs * len(x) // cfg.batch)
    idx = torch.as_tensor(_batches(len(x), cfg.batch, steps, np.random.default_rng([seed, 11])), device=x.device)

    def step_loss(i: int) -> torch.Tensor:
        b = idx[i]
        f = net.backbone(x[b])
        return sum(F.cross_entropy(clfs[k](h(f)), y[b], label_smoothing=0.1) for k, h in net.heads.items())

    fit(nn.ModuleList([net, clfs]), step_loss, steps, lr=cfg.src_lr, optimizer="adam", weight_decay=5e-4,
        schedule=lambda i: cosine_schedule(i, steps, max(1, steps // 10)))
    return net.eval()


@dataclass
class Maps:
    """Cached RoI maps: source-domain sets under source BN statistics; target-camera sets under both the source
    statistics (source-only model) and the target statistics (AdaBN on the unlabeled target crops)."""

    source: CropSet
    target: UnlabeledTarget
    src_bn: dict[str, CropSet]
    tgt_bn: dict[str, CropSet]
    src_backbone: Backbone
    tgt_backbone: Backbone


def cache_maps(backbone: Backbone, data: Data) -> Maps:
    """Run the frozen backbone once over every crop (see :class:`Maps`)."""
    src = copy.deepcopy(backbone).eval()
    src_bn = {k: CropSet(embed(src, v.x), v.boxes, v.pids, v.scenes) for k, v in data.tests.items()}
    source = CropSet(embed(src, data.source.x), data.source.boxes, data.source.pids, data.source.scenes)
    tgt = adabn(copy.deepcopy(backbone), data.target)
    target = UnlabeledTarget(embed(tgt, data.target))
    tgt_bn = {k: CropSet(embed(tgt, v.x), v.boxes, v.pids, v.scenes)
              for k, v in data.tests.items() if k.startswith("T")}
    return Maps(source, target, src_bn, tgt_bn, src, tgt)


def search(model: nn.Module, cs: CropSet) -> SearchResult:
    """Re-ID with oracle detection on one test set."""
    return oracle_search(embed(model, cs.x), cs.boxes.float(), cs.pids, cs.scenes)


def scale_sweep(model: nn.Module, sets: dict[str, CropSet], heights) -> dict[str, SearchResult]:
    """Source-only mAP on the source camera and on the target camera at each fixed person height."""
    out = {"S_src": search(model, sets["S_src"])}
    out.update({f"T{int(h)}": search(model, sets[f"T{int(h)}"]) for h in heights})
    return out


def sweep_stats(res: dict[str, SearchResult], heights) -> dict[str, float]:
    """Spearman ρ(height, mAP) and the points lost from the largest to the smallest height."""
    maps = [res[f"T{int(h)}"].mAP for h in heights]
    return {"rho": float(spearmanr(heights, maps).statistic), "drop": maps[0] - maps[-1],
            "drop_src": res["S_src"].mAP - maps[-1]}


# --------------------------------------------------------------------------------------------------- pseudo-labels
def pseudo_labels(feats: torch.Tensor, cfg: Config, bcr: bool, seed: int = 0,
                  stats: BCRStats | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(labels₀, labels)`` from target embeddings only: DBSCAN on the Jaccard distance, and with ``bcr`` the
    second, regularised clustering (else ``labels = labels₀``)."""
    if not isinstance(feats, torch.Tensor) or not feats.is_floating_point() or feats.ndim != 2:
        raise TypeError("the pseudo-labeller takes a float embedding matrix (n, d) and nothing else")
    dist = jaccard_distance(feats, cfg.k1, cfg.k2)
    if bcr:
        return bcr_labels(feats, cfg.eps, cfg.min_samples, dist=dist, seed=seed, stats=stats)
    labels0 = dbscan_labels(dist, cfg.eps, cfg.min_samples)
    return labels0, labels0


def label_quality(labels: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """ARI / NMI of pseudo-labels (outliers as singletons) against the hidden identities; clusters and outliers."""
    ids = pseudo_ids(labels)
    return {"ari": float(adjusted_rand_score(truth, ids)), "nmi": float(normalized_mutual_info_score(truth, ids)),
            "clusters": int(labels.max() + 1) if (labels >= 0).any() else 0, "outliers": float((labels < 0).mean())}


def _domain_head(head: Head, maps: torch.Tensor) -> Head:
    """A copy of ``head`` with BN statistics re-estimated on ``maps`` (domain-specific statistics)."""
    return adabn(copy.deepcopy(head), maps)


@dataclass
class RoundLog:
    labels0: np.ndarray
    labels: np.ndarray
    stats: BCRStats


def uda(head: Head, source: CropSet, target: UnlabeledTarget, cfg: Config, seed: int, *, bcr: bool,
        oracle_labels: np.ndarray | None = None) -> tuple[Head, list[RoundLog]]:
    """Head-only UDA rounds. Each round: target embeddings (target BN statistics) → pseudo-labels (outliers
    become singleton classes) → a :class:`ClusterMemory` of source class centroids (kept from round to round) and
    target cluster centroids → ``uda_iters`` steps of the memory loss on 32 source + 32 target maps (each domain
    through the head on its own, so BN sees one domain per batch). ``oracle_labels`` replaces the pseudo-labels by
    given identities (the target-supervised upper bound); otherwise nothing but ``target.maps`` is used."""
    if not isinstance(target, UnlabeledTarget):
        raise TypeError("uda() takes an UnlabeledTarget: target identities must not reach the pseudo-labeller")
    head = copy.deepcopy(head)
    y_src = _classes(source.pids)
    n_src = int(y_src.max()) + 1
    src_proxies = None
    logs = []
    rng = np.random.default_rng(derive(seed, "uda-batches"))
    half = cfg.batch // 2
    for r in range(cfg.uda_rounds):
        tgt_feats = embed(_domain_head(head, target.maps), target.maps)
        stats = BCRStats([], [], [], [])
        if oracle_labels is None:
            labels0, labels = pseudo_labels(tgt_feats, cfg, bcr, seed=derive(seed, "pseudo-labels", r, bits=32),
                                           stats=stats)  # 32 bits: scikit-learn's random_state
        else:
            labels0 = labels = np.unique(oracle_labels, return_inverse=True)[1]
        logs.append(RoundLog(labels0, labels, stats))
        ids = torch.as_tensor(pseudo_ids(labels), device=tgt_feats.device)
        pool = np.arange(len(ids)) if cfg.outliers == "singleton" else np.nonzero(labels >= 0)[0]
        tgt_centroids = F.normalize(F.one_hot(ids).float().T @ tgt_feats, dim=1)
        if src_proxies is None:
            src_feats = embed(_domain_head(head, source.x), source.x)
            src_proxies = F.normalize(F.one_hot(y_src).float().T @ src_feats, dim=1)
        memory = ClusterMemory(torch.cat([src_proxies, tgt_centroids]), temp=0.05, momentum=0.2)
        s_idx = torch.as_tensor(_batches(len(source.x), half, cfg.uda_iters, rng), device=tgt_feats.device)
        t_idx = torch.as_tensor(pool[_batches(len(pool), half, cfg.uda_iters, rng)], device=tgt_feats.device)

        def step_loss(i: int) -> torch.Tensor:
            es, et = head(source.x[s_idx[i]]), head(target.maps[t_idx[i]])  # noqa: B023
            targets = torch.cat([y_src[s_idx[i]], n_src + ids[t_idx[i]]])  # noqa: B023
            return memory(torch.cat([es, et]), targets)  # noqa: B023

        fit(head, step_loss, cfg.uda_iters, lr=cfg.uda_lr, optimizer="adam", weight_decay=5e-4)
        src_proxies = memory.proxies[:n_src].clone()
    return head.eval(), logs


@dataclass
class ArmResult:
    """mAP/top-1 of one arm on the target test set, the target camera at 120/20 px and the source camera."""

    name: str
    t_test: SearchResult
    t120: SearchResult
    t20: SearchResult
    s_src: SearchResult
    rounds: list[dict[str, float]] = field(default_factory=list)
    target_model: nn.Module | None = field(default=None, repr=False)
    bcr: list[BCRStats] = field(default_factory=list, repr=False)


def _score(name: str, head: Head, maps: Maps, tgt_head: Head, rounds=None, bcr=None) -> ArmResult:
    return ArmResult(name, search(tgt_head, maps.tgt_bn["T_test"]), search(tgt_head, maps.tgt_bn["T120"]),
                     search(tgt_head, maps.tgt_bn["T20"]), search(head, maps.src_bn["S_src"]), rounds or [],
                     nn.Sequential(maps.tgt_backbone, tgt_head), bcr or [])


def run_arms(net: SourceModel, maps: Maps, data: Data, cfg: Config, seed: int, arms: tuple[str, ...] = (
        "source-only", "AdaBN", "UDA", "UDA+BCR", "UDA+SDH", "UDA+SDH+BCR", "oracle")) -> dict[str, ArmResult]:
    """Every arm from the source model's heads (``plain``; ``sdh`` for the arms with SDH). Source-only keeps
    source BN statistics on target sets; every other arm uses target statistics on target sets and source
    statistics on ``S_src``."""
    out: dict[str, ArmResult] = {}
    tm = maps.target.maps
    for arm in arms:
        head = net.heads["sdh" if "SDH" in arm else "plain"]
        if arm in ("source-only", "source-only+SDH"):
            out[arm] = ArmResult(arm, search(head, maps.src_bn["T_test"]), search(head, maps.src_bn["T120"]),
                                 search(head, maps.src_bn["T20"]), search(head, maps.src_bn["S_src"]), [],
                                 nn.Sequential(maps.src_backbone, head))
            continue
        if arm in ("AdaBN", "AdaBN+SDH"):
            out[arm] = _score(arm, head, maps, _domain_head(head, tm))
            continue
        tuned, logs = uda(head, maps.source, maps.target, cfg, seed, bcr="BCR" in arm,
                          oracle_labels=data.target_truth if arm == "oracle" else None)
        rounds = [{**{f"{k}0": v for k, v in label_quality(lg.labels0, data.target_truth).items()},
                   **label_quality(lg.labels, data.target_truth),
                   "splits": len(lg.stats.split_am), "merges": len(lg.stats.merge_bm)} for lg in logs]
        out[arm] = _score(arm, _domain_head(tuned, maps.source.x), maps, _domain_head(tuned, tm), rounds,
                          [lg.stats for lg in logs])
    return out


ARMS = ("source-only", "AdaBN", "UDA", "UDA+BCR", "source-only+SDH", "AdaBN+SDH", "UDA+SDH", "UDA+SDH+BCR", "oracle")


@dataclass
class Prepared:
    """One seed's data, source model, scale sweeps of both heads, and cached RoI maps."""

    seed: int
    data: Data
    net: SourceModel
    sweep: dict[str, dict[str, SearchResult]]
    maps: Maps


@dataclass
class SeedRun:
    """Everything one seed produced: the scale sweeps of both source heads, every arm, and (full mode) person
    search with the tiny detector."""

    seed: int
    data: Data
    sweep: dict[str, dict[str, SearchResult]]
    arms: dict[str, ArmResult]
    detection: dict[str, SearchResult] = field(default_factory=dict)
    det_recall: float = float("nan")


def prepare(cfg: Config, seed: int, device: torch.device | str = "cpu") -> Prepared:
    """Data, source training, the scale sweeps (source-only, both heads) and the cached maps of one seed."""
    data = build_data(cfg, seed, device)
    net = train_source(data, cfg, seed)
    sweep = {k: scale_sweep(net.model(k), data.tests, cfg.heights) for k in net.heads}
    return Prepared(seed, data, net, sweep, cache_maps(net.backbone, data))


def run_seed(prep: Prepared, cfg: Config, arms: tuple[str, ...] = ARMS, detector_steps: int = 0,
             results: dict[str, ArmResult] | None = None) -> SeedRun:
    """Every arm of a prepared seed (or the given ``results`` of its arms); with ``detector_steps > 0`` also
    train the tiny detector on the source scenes and evaluate person search on ``T_test`` with detections."""
    res = run_arms(prep.net, prep.maps, prep.data, cfg, prep.seed, arms) if results is None else results
    run = SeedRun(prep.seed, prep.data, prep.sweep, res)
    if detector_steps:
        dev = prep.maps.source.x.device
        run.detection, run.det_recall = detector_search(prep.data, res, cfg, prep.seed, detector_steps, dev)
    return run





def run_seeds(cfg: Config, seeds: Sequence[int], device: torch.device | str = "cpu", arms: tuple[str, ...] = ARMS,
              detector_steps: int = 0, mapper: Mapper = serial_map) -> list[SeedRun]:
    """Every seed end to end: :func:`prepare` per seed, then each (seed, arm) on its own, then the detector (full
    mode). ``mapper(fn, items)`` must return ``[fn(x) for x in items]``; the notebook passes
    ``repro.runtime.Run.map``, which shares the items among the cores (one arm is a task, so the load balances).
    Every step is a pure function of ``(cfg, seed)``: each generator it uses is seeded from ``seed``."""
    prepared = mapper(lambda s: prepare(cfg, s, device), list(seeds))
    tasks = [(i, arm) for i in range(len(prepared)) for arm in arms]

    def one_arm(task: tuple[int, str]) -> ArmResult:
        p = prepared[task[0]]
        return run_arms(p.net, p.maps, p.data, cfg, p.seed, (task[1],))[task[1]]

    done = dict(zip(tasks, mapper(one_arm, tasks), strict=True))
    return [run_seed(p, cfg, arms, detector_steps, results={a: done[i, a] for a in arms})
            for i, p in enumerate(prepared)]


def detector_search(data: Data, arms: dict[str, ArmResult], cfg: Config, seed: int, steps: int,
                    device: torch.device | str = "cpu") -> tuple[dict[str, SearchResult], float]:
    """Person search on ``T_test`` with the tiny detector (trained on the source scenes): queries are ground-truth
    boxes (as in CUHK-SYSU), gallery detections are the detector's (score ≥ 0.5); returns each arm's result and the
    detector's recall at IoU 0.5."""
    from .detector import detect, detections_as_split, train_detector
    from .evaluate import box_iou, person_search_map

    det_net = train_detector(data.splits["source"], steps, seed=seed, device=device)
    split = data.splits["T_test"]
    det = detect(det_net, split, thresh=0.5)
    gt = data.tests["T_test"]
    if len(det.scores) == 0:  # nothing detected: every query fails
        zero = SearchResult(0.0, 0.0, np.zeros(len(gt.pids)), np.zeros(len(gt.pids)), len(gt.pids))
        return {name: zero for name in arms}, 0.0
    crops = synth.crop_rois(detections_as_split(split, det), cfg.input_hw, device=device)
    same = det.scenes[:, None] == gt.scenes[None, :]
    hit = (box_iou(det.boxes, gt.boxes.float()) * same).amax(0) >= 0.5 if len(det.scores) else torch.zeros(1)
    out = {}
    for name, arm in arms.items():
        q = embed(arm.target_model, gt.x)
        d = embed(arm.target_model, crops)
        out[name] = person_search_map(q, gt.pids, gt.scenes, d, det.boxes, det.scenes, gt.boxes.float(), gt.pids,
                                      gt.scenes)
    return out, float(hit.float().mean())


# ------------------------------------------------------------------------------------------------------ BCR studies
def planted_clusters(n_ids: int, per_id: int, dim: int, spread: float, rng: np.random.Generator, *,
                     glued: int = 0, glue: float = 0.5, bimodal: int = 0, sep: float = 0.8,
                     device: torch.device | str = "cpu") -> tuple[torch.Tensor, np.ndarray]:
    """L2-normalised features of ``n_ids`` identities × ``per_id`` points: ``normalize(c + spread·g/√dim)`` around
    random unit centres. The first ``glued`` pairs of identities have centres at Euclidean distance ``glue`` (two
    people who look alike); the next ``bimodal`` identities have two modes ``sep`` apart, half the points each (one
    person at two scales)."""
    if n_ids < 2 * glued + bimodal or per_id < 2 or spread < 0:
        raise ValueError("need n_ids >= 2·glued + bimodal, per_id >= 2 and spread >= 0")
    centres = rng.normal(size=(n_ids, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    modes = np.repeat(centres[:, None], 2, axis=1)

    def at_distance(c: np.ndarray, d: float) -> np.ndarray:  # a unit vector at chord distance d from c
        u = rng.normal(size=dim)
        u -= (u @ c) * c
        u /= np.linalg.norm(u)
        theta = 2 * np.arcsin(min(d, 2.0) / 2)
        return np.cos(theta) * c + np.sin(theta) * u

    for k in range(glued):
        modes[2 * k + 1] = at_distance(centres[2 * k], glue)
    for k in range(2 * glued, 2 * glued + bimodal):
        modes[k, 1] = at_distance(centres[k], sep)
    truth = np.repeat(np.arange(n_ids), per_id)
    which = np.tile(np.arange(per_id) % 2, n_ids)
    x = modes[truth, which] + spread * rng.normal(size=(n_ids * per_id, dim)) / np.sqrt(dim)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return torch.as_tensor(x, dtype=torch.float32, device=device), truth


def _ari(labels: np.ndarray, truth: np.ndarray) -> float:
    return float(adjusted_rand_score(truth, pseudo_ids(labels)))


REGIMES = ("plain", "look-alike pairs", "two-mode identities")


@dataclass
class PhaseDiagram:
    """ARI of DBSCAN's labels (``ari0``) and of BCR's (``ari1``) on planted clusters, per repetition: ``*_plain``
    is reps × spreads (no planted failure), ``*_glue`` reps × spreads × glue distances (look-alike pairs),
    ``*_bimodal`` reps × spreads × separations (two-mode identities)."""

    spreads: np.ndarray
    glues: np.ndarray
    seps: np.ndarray
    ari0: dict[str, np.ndarray]
    ari1: dict[str, np.ndarray]

    @property
    def d_glue(self) -> np.ndarray:
        """ΔARI (BCR − DBSCAN), mean over repetitions, spreads × glue distances."""
        return (self.ari1["look-alike pairs"] - self.ari0["look-alike pairs"]).mean(0)

    @property
    def d_bimodal(self) -> np.ndarray:
        """ΔARI (BCR − DBSCAN), mean over repetitions, spreads × separations."""
        return (self.ari1["two-mode identities"] - self.ari0["two-mode identities"]).mean(0)

    @property
    def d_plain(self) -> np.ndarray:
        """ΔARI (BCR − DBSCAN), mean over repetitions, per spread."""
        return (self.ari1["plain"] - self.ari0["plain"]).mean(0)

    def items(self, regime: str) -> tuple[np.ndarray, np.ndarray]:
        """BCR's and DBSCAN's ARI in one regime, one item per (repetition, cell): what a bootstrap resamples."""
        if regime not in REGIMES:
            raise ValueError(f"regime must be one of {REGIMES}, got {regime!r}")
        return self.ari1[regime].ravel(), self.ari0[regime].ravel()

    def helped_hurt(self, regime: str, tol: float = 0.02) -> tuple[float, float]:
        """Fractions of the regime's (repetition, cell) items where BCR raised / lowered the ARI by more than
        ``tol``."""
        bcr, dbscan = self.items(regime)
        return float(np.mean(bcr - dbscan > tol)), float(np.mean(bcr - dbscan < -tol))


def bcr_phase_diagram(spreads, glues, seps, reps: int, seed: int, *, n_ids: int = 16, per_id: int = 12,
                      dim: int = 32, glued: int = 4, bimodal: int = 4, k1: int = 12, k2: int = 4,
                      device: torch.device | str = "cpu") -> PhaseDiagram:
    """Where BCR's fixed thresholds help and where they hurt: DBSCAN's and BCR's ARI on planted clusters in three
    regimes, each point its own draw: no planted failure, ``glued`` look-alike pairs at each glue distance, and
    ``bimodal`` two-mode identities at each separation, over the cluster ``spreads``."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    grids = {"plain": [None], "look-alike pairs": list(glues), "two-mode identities": list(seps)}
    ari0 = {k: np.zeros((reps, len(spreads), len(v))) for k, v in grids.items()}
    ari1 = {k: np.zeros_like(a) for k, a in ari0.items()}
    for k, (regime, grid) in enumerate(grids.items()):
        for r in range(reps):
            for i, s in enumerate(spreads):
                for j, x in enumerate(grid):
                    kw = {} if x is None else dict(glued=glued, glue=x) if k == 1 else dict(bimodal=bimodal, sep=x)
                    f, t = planted_clusters(n_ids, per_id, dim, s, np.random.default_rng([seed, r, i, j, k]),
                                            device=device, **kw)
                    l0, l1 = bcr_labels(f, k1=k1, k2=k2, seed=seed)
                    ari0[regime][r, i, j], ari1[regime][r, i, j] = _ari(l0, t), _ari(l1, t)
    ari0["plain"], ari1["plain"] = ari0["plain"][..., 0], ari1["plain"][..., 0]
    return PhaseDiagram(np.asarray(spreads), np.asarray(glues), np.asarray(seps), ari0, ari1)


def two_groups(m1: int, m2: int, distance: float, spread: float, rng: np.random.Generator, *, n_bg: int = 10,
               bg_size: int = 12, dim: int = 32) -> tuple[torch.Tensor, np.ndarray]:
    """``n_bg`` tight background identities (``bg_size`` points, spread 0.2) plus two groups of ``m1`` and ``m2``
    points (spread ``spread``) whose centres are ``distance`` apart; returns features and group ids (the two
    special groups are ``n_bg`` and ``n_bg + 1``)."""
    c = rng.normal(size=(n_bg + 1, dim))
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    u = rng.normal(size=dim)
    u -= (u @ c[-1]) * c[-1]
    u /= np.linalg.norm(u)
    theta = 2 * np.arcsin(distance / 2)
    centres = np.vstack([c, np.cos(theta) * c[-1] + np.sin(theta) * u])
    sizes, spreads = [bg_size] * n_bg + [m1, m2], [0.2] * n_bg + [spread, spread]
    x = np.vstack([centres[k] + s * rng.normal(size=(n, dim)) / np.sqrt(dim)
                   for k, (n, s) in enumerate(zip(sizes, spreads, strict=True))])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return torch.as_tensor(x, dtype=torch.float32), np.repeat(np.arange(len(sizes)), sizes)


@dataclass
class Mechanics:
    """BCR on hand-built cases: each entry ``(ARI before, ARI after, what BCR did)``."""

    noop: tuple[float, float, bool]
    split: tuple[float, float, list[float]]
    split_boundary: tuple[float, float, list[float]]
    merge: tuple[float, float, list[float]]
    merge_boundary: tuple[float, float, list[float]]


def bcr_mechanics(seed: int = 0, k1: int = 12, k2: int = 4) -> Mechanics:
    """(a) tight, clean clusters: BCR must change nothing; (b) two look-alike people (6 + 6 points, 0.8 apart) that
    DBSCAN glues into one cluster with ``a_m ≥ 0.5``: BCR must split them, and must not at 0.6 apart
    (``a_m < 0.5``); (c) one person that DBSCAN cuts into 12 + 5 points (0.3 apart, ``b_m ≤ 0.4``): BCR must
    merge the fragment back, and must not at 0.45 apart (``b_m > 0.4``). ``split`` / ``merge`` list the ``a_m`` /
    ``b_m`` of the clusters BCR acted on."""

    def run(f: torch.Tensor, truth: np.ndarray):
        st = BCRStats([], [], [], [])
        l0, l1 = bcr_labels(f, k1=k1, k2=k2, seed=seed, stats=st)
        return _ari(l0, truth), _ari(l1, truth), st, l0, l1

    f, t = planted_clusters(16, 12, 32, 0.2, np.random.default_rng([seed, 0]))
    a0, a1, _, l0, l1 = run(f, t)
    noop = (a0, a1, bool(np.array_equal(l0, l1)))
    out = []
    for dist in (0.8, 0.6):
        f, t = two_groups(6, 6, dist, 0.2, np.random.default_rng([seed, 1]))
        a0, a1, st, _, _ = run(f, t)
        out.append((a0, a1, st.split_am))
    for dist in (0.3, 0.45):
        f, t = two_groups(12, 5, dist, 0.15, np.random.default_rng([seed, 2]))
        t = np.minimum(t, 10)  # the fragment is the same person as the main group
        a0, a1, st, _, _ = run(f, t)
        out.append((a0, a1, st.merge_bm))
    return Mechanics(noop, *out)


# ---------------------------------------------------------------------------------------------------- summaries
@dataclass
class Summary:
    """Per-seed numbers the notebook plots and claims use: ``table[arm][metric]`` is an array over seeds
    (metrics ``T_test``, ``top1``, ``T120``, ``T20``, ``S_src``); ``sweep[head]`` is seeds × (S_src, heights…)."""

    heights: tuple[float, ...]
    table: dict[str, dict[str, np.ndarray]]
    sweep: dict[str, np.ndarray]
    rho: np.ndarray
    drop: np.ndarray

    def gain(self, arm: str, base: str, metric: str = "T_test") -> tuple[float, float, np.ndarray]:
        """Mean and standard error over seeds of ``arm − base`` (SE is NaN with one seed), and the per-seed gains."""
        d = self.table[arm][metric] - self.table[base][metric]
        return float(d.mean()), book_stats.se(d), d


def summarize(runs: list[SeedRun], heights) -> Summary:
    """Collect the arms' mAP/top-1 and the scale sweeps over seeds."""
    arms = list(runs[0].arms)
    table = {a: {"T_test": np.array([r.arms[a].t_test.mAP for r in runs]),
                 "top1": np.array([r.arms[a].t_test.top1 for r in runs]),
                 "T120": np.array([r.arms[a].t120.mAP for r in runs]),
                 "T20": np.array([r.arms[a].t20.mAP for r in runs]),
                 "S_src": np.array([r.arms[a].s_src.mAP for r in runs])} for a in arms}
    keys = ["S_src"] + [f"T{int(h)}" for h in heights]
    sweep = {k: np.array([[r.sweep[k][n].mAP for n in keys] for r in runs]) for k in runs[0].sweep}
    stats = [sweep_stats(r.sweep["plain"], heights) for r in runs]
    return Summary(tuple(heights), table, sweep, np.array([s["rho"] for s in stats]),
                   np.array([s["drop"] for s in stats]))
