"""Experiment harness of notebook 09 (PACE): the generated corpus, the four entropy models trained on it, the
rate–distortion sweep over depths (with Draco), the lossless and coder-limit checks, decoding latency per stage count
and on a slice of nodes, and the bits per octree level.

Training draws from torch's global generator (weights, in a fixed order) and from generators seeded by ``seed``;
everything else is deterministic, apart from the wall times, which depend on the machine.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import DracoPy
import numpy as np
import torch

from ...common.hooks import hooked
from ...common.mapping import Mapper, serial_map
from ...common.settings import dataclass_from
from . import codec, metrics
from .lidar import make_scans
from .model import (
    AncestorMLP,
    CountTable,
    CoupledCausalModel,
    PACEModel,
    TwoGroupModel,
    WindowData,
    pooled_rate,
    train,
    window_bits,
)
from .octree import Grid, Octree, build_octree, dequantize, level_context, morton_decode, octree_contexts, quantize

Codecs = Mapping[str, tuple[Any, str]]  # name -> (model, mode)


@dataclass(frozen=True)
class Recipe:
    """Model and training settings of notebook 09 (defaults: its quick mode). ``ks``: the stage counts PACE draws
    from, one per batch; ``coupled_steps = 0`` leaves the coupled baseline untrained (it is only timed)."""

    d: int = 64
    n_layers: int = 2
    n_heads: int = 4
    window: int = 256
    steps: int = 200
    batch: int = 8
    lr: float = 4e-3
    ks: Sequence[int] = (1, 2, 4, 8, 256)
    mlp_steps: int = 200
    coupled_steps: int = 0

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Recipe:
        """The recipe's fields taken from a notebook configuration (other keys are ignored)."""
        return dataclass_from(cls, cfg)


@dataclass
class Corpus:
    """Training and test scans, the training octrees at depth ``depth`` with their per-level contexts, the training
    windows, and the first test scan's octree."""

    train_scans: list[np.ndarray]
    test_scans: list[np.ndarray]
    trees: list[Octree]
    train_levels: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    data: WindowData
    test_tree: Octree


def make_corpus(train_seeds: Sequence[int], test_seeds: Sequence[int], grid: Grid, depth: int, window: int, *,
                n_beams: int = 64, n_az: int = 1024) -> Corpus:
    """Synthetic scans (one per seed), their octrees at ``depth`` on ``grid`` and every level cut into windows."""
    train_scans = make_scans(list(train_seeds), n_beams=n_beams, n_az=n_az)
    test_scans = make_scans(list(test_seeds), n_beams=n_beams, n_az=n_az)
    trees = [build_octree(quantize(p, grid), depth) for p in train_scans]
    train_levels = [lv for tree in trees for lv in octree_contexts(tree)]
    data = WindowData.from_levels(train_levels, window)
    test_tree = build_octree(quantize(test_scans[0], grid), depth)
    return Corpus(train_scans, test_scans, trees, train_levels, data, test_tree)


@dataclass
class Models:
    """The trained entropy models, their loss curves (bits/symbol per step), the count table's mean code length on
    its own training symbols, and the parameter counts."""

    pace: PACEModel
    mlp: AncestorMLP
    coupled: CoupledCausalModel
    table: CountTable
    pace_loss: list[float]
    mlp_loss: list[float]
    coupled_loss: list[float]
    table_bits: float
    n_params: dict[str, int]
    single: PACEModel | None = None  # with train_models(controls=True): PACE trained at k = 1 only
    single_loss: list[float] = field(default_factory=list)
    two_group: TwoGroupModel | None = None  # with train_models(controls=True): the EHEM-like baseline
    two_group_loss: list[float] = field(default_factory=list)


def train_single_stage(corpus: Corpus, recipe: Recipe, seed: int, k: int = 1,
                       device: torch.device | str = "cpu") -> tuple[PACEModel, list[float]]:
    """The control of stage scalability: a PACE model of the recipe's size and steps trained with the single stage
    count ``k`` (default 1, fully parallel) instead of a random ``k`` per batch, initialised from torch's generator
    at ``seed``. Decoded with more stages, it sees earlier symbols it was never trained on."""
    model = _single_stage_init(recipe, seed, device)
    loss = train(model, corpus.data.to(device), steps=recipe.steps, ks=[k], batch=recipe.batch, lr=recipe.lr,
                 seed=seed)
    return model, loss


def _single_stage_init(recipe: Recipe, seed: int, device: torch.device | str) -> PACEModel:
    torch.manual_seed(seed)
    return PACEModel(d=recipe.d, n_layers=recipe.n_layers, n_heads=recipe.n_heads, window=recipe.window).to(device)


def train_two_group(corpus: Corpus, recipe: Recipe, seed: int, device: torch.device | str = "cpu"
                    ) -> tuple[TwoGroupModel, list[float]]:
    """The EHEM-like two-group baseline (:class:`~repro.papers.pace.model.TwoGroupModel`) of the recipe's size and
    PACE's step count, initialised from torch's generator at ``seed``: the lineage's step before PACE, whose
    backbone runs twice per window. (:func:`train_models` with ``controls=True`` trains it beside the others.)"""
    model = _two_group_init(recipe, seed, device)
    loss = train(model, corpus.data.to(device), steps=recipe.steps, batch=recipe.batch, lr=recipe.lr, seed=seed)
    return model.eval(), loss


def _two_group_init(recipe: Recipe, seed: int, device: torch.device | str) -> TwoGroupModel:
    torch.manual_seed(seed)
    return TwoGroupModel(d=recipe.d, n_layers=recipe.n_layers, n_heads=recipe.n_heads, window=recipe.window).to(device)




def train_models(corpus: Corpus, recipe: Recipe, seed: int, device: torch.device | str = "cpu", *,
                 controls: bool = False, mapper: Mapper | None = None) -> Models:
    """Initialise PACE, the ancestor MLP and the coupled baseline from torch's generator at ``seed`` (in that order;
    with ``controls``, also the single-stage control and the two-group baseline, each as :func:`train_single_stage`
    and :func:`train_two_group` do), train them on the corpus' windows (:func:`repro.papers.pace.model.train`; the
    coupled one only if ``recipe.coupled_steps``), and count the table.

    Every model is initialised here, and each training draws its batches from a generator of its own
    (``seed``), so the trainings are independent jobs: ``mapper`` (``run.map`` in the notebook: both cores in quick
    mode) runs them in parallel with the numbers of the plain loop."""
    torch.manual_seed(seed)
    arch = dict(d=recipe.d, n_layers=recipe.n_layers, n_heads=recipe.n_heads, window=recipe.window)
    pace = PACEModel(**arch).to(device)
    mlp = AncestorMLP(d=recipe.d, hidden=2 * recipe.d, window=recipe.window).to(device)
    coupled = CoupledCausalModel(**arch).to(device).eval()
    single = _single_stage_init(recipe, seed, device) if controls else None
    two = _two_group_init(recipe, seed, device) if controls else None
    data = corpus.data.to(device)
    opts = dict(batch=recipe.batch, lr=recipe.lr, seed=seed)
    jobs = {"two_group": (two, dict(steps=recipe.steps))} if controls else {}  # costliest first (two backbones)
    jobs["pace"] = (pace, dict(steps=recipe.steps, ks=recipe.ks))
    if recipe.coupled_steps:
        jobs["coupled"] = (coupled, dict(steps=recipe.coupled_steps, ks=[recipe.window]))
    if controls:
        jobs["single"] = (single, dict(steps=recipe.steps, ks=[1]))
    jobs["mlp"] = (mlp, dict(steps=recipe.mlp_steps))

    def job(name: str) -> tuple[dict[str, torch.Tensor], list[float]]:
        model, kw = jobs[name]
        loss = train(model, data, **kw, **opts)
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}, loss

    losses = {}
    for name, (state, loss) in zip(jobs, (mapper or serial_map)(job, list(jobs)), strict=True):
        jobs[name][0].load_state_dict(state)
        losses[name] = loss
    table = CountTable().fit(corpus.train_levels)
    n_sym = sum(len(s) for _, _, s in corpus.train_levels)
    table_bits = sum(-np.log2(table.probs(t)[np.arange(len(s)), s]).sum() for t, _, s in corpus.train_levels) / n_sym
    n_params = {name: sum(p.numel() for p in m.parameters())
                for name, m in [("PACE", pace), ("coupled", coupled), ("ancestor MLP", mlp)]}
    return Models(pace, mlp, coupled, table, losses["pace"], losses["mlp"], losses.get("coupled", []),
                  float(table_bits), n_params, single, losses.get("single", []),
                  None if two is None else two.eval(), losses.get("two_group", []))



def moving_average(x: Sequence[float], n: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """``n``-step moving average of a loss curve and the steps it is plotted at (each window's last step)."""
    x = np.asarray(x)
    n = min(n, len(x))
    if n < 1:
        raise ValueError("moving_average needs a non-empty curve")
    return np.arange(n, len(x) + 1), np.convolve(x, np.ones(n) / n, mode="valid")


@dataclass
class RateDistortion:
    """Per codec, bits per input point ``(scans, depths)``; D1 PSNR of the octree quantisation and of Draco; every
    stream: ``streams[scan, name]`` at the main depth, ``streams[scan, name, depth]`` at the other depths."""

    depths: list[int]
    bpp: dict[str, np.ndarray]
    psnr: dict[str, np.ndarray]
    streams: dict[tuple, codec.Encoded]

    def mean_bpp(self) -> dict[str, np.ndarray]:
        return {k: v.mean(0) for k, v in self.bpp.items()}

    def bd_rates(self, anchor: str, names: Sequence[str]) -> dict[str, float]:
        """BD-rate (%) of each octree codec in ``names`` against the octree codec ``anchor`` (same D1 PSNR)."""
        mean, q = self.mean_bpp(), self.psnr["octree"].mean(0)
        return {name: metrics.bd_rate(mean[anchor], q, mean[name], q) for name in names}

    def bd_rate_vs_draco(self, name: str) -> float:
        """BD-rate (%) of the octree codec ``name`` against Draco, each on its own D1 PSNR."""
        mean = self.mean_bpp()
        return metrics.bd_rate(mean["Draco"], self.psnr["Draco"].mean(0), mean[name], self.psnr["octree"].mean(0))


def rate_distortion(scans: Sequence[np.ndarray], grid: Grid, depths: Sequence[int], codecs: Codecs,
                    stages: Codecs) -> RateDistortion:
    """Encode every scan at every depth with every codec (and, at the last depth, in every stage mode of
    ``stages``); Draco (DracoPy, ``quantization_bits`` = depth, compression level 10) alongside. Rates are real
    stream sizes over the number of input points."""
    depths = list(depths)
    main = depths[-1]
    nd, nt = len(depths), len(scans)
    bpp = {name: np.zeros((nt, nd)) for name in ["Draco", *codecs]}
    psnr = {"octree": np.zeros((nt, nd)), "Draco": np.zeros((nt, nd))}
    streams: dict[tuple, codec.Encoded] = {}
    for i, p in enumerate(scans):
        for j, depth in enumerate(depths):
            g = grid.at_depth(depth)
            psnr["octree"][i, j] = metrics.d1_psnr(p, dequantize(np.unique(quantize(p, g), axis=0), g))
            blob = DracoPy.encode(p, quantization_bits=depth, compression_level=10)
            bpp["Draco"][i, j] = metrics.bits_per_point(len(blob), len(p))
            psnr["Draco"][i, j] = metrics.d1_psnr(p, np.asarray(DracoPy.decode(blob).points))
            todo = {**codecs, **stages} if depth == main else codecs
            for name, (model, mode) in todo.items():
                enc = codec.encode_detailed(p, model, depth, mode)
                if name in bpp:
                    bpp[name][i, j] = enc.bpp
                streams[(i, name) if depth == main else (i, name, depth)] = enc
    return RateDistortion(depths, bpp, psnr, streams)


def count_lossless_failures(rd: RateDistortion, scans: Sequence[np.ndarray], grid: Grid,
                            codecs: Codecs) -> tuple[int, int]:
    """Decode every main-depth stream of ``codecs`` and compare it cell by cell with the quantised input: (streams
    that differ, streams checked)."""
    main = rd.depths[-1]
    truth = [morton_decode(build_octree(quantize(p, grid), main).codes[-1]) for p in scans]
    failures, checked = 0, 0
    for i in range(len(scans)):
        for name, (model, _) in codecs.items():
            q, _ = codec.decode_quantized(rd.streams[i, name].data, model)
            checked += 1
            failures += not np.array_equal(q, truth[i])
    return failures, checked


def coder_overhead(streams: Mapping[Any, codec.Encoded]) -> tuple[list[float], list[float]]:
    """Per stream: (payload bits − 64) / the model's cross-entropy under the integer tables (≤ 1 + ε at the coder's
    limit), and the tables' cost over the float pmfs (relative)."""
    overhead = [(e.payload_bits - 64) / e.bits_model for e in streams.values()]
    float_gap = [e.bits_model / e.bits_float - 1 for e in streams.values()]
    return overhead, float_gap


def decode_times(rd: RateDistortion, stages: Codecs, repeats: int, scan: int = 0) -> dict[str, list[float]]:
    """Wall seconds to decode scan ``scan``'s main-depth stream in each stage mode, the modes interleaved within
    each of ``repeats`` rounds (machine-dependent; decode once beforehand as a warm-up)."""
    times: dict[str, list[float]] = {name: [] for name in stages}
    for _ in range(repeats):
        for name, (model, _) in stages.items():
            t0 = time.perf_counter()
            codec.decode_quantized(rd.streams[scan, name].data, model)
            times[name].append(time.perf_counter() - t0)
    return times


def order_inversions(values: Sequence[float]) -> int:
    """How many successive pairs fail to increase strictly (0 for a strictly increasing sequence)."""
    return sum(b <= a for a, b in zip(values, values[1:], strict=False))


@dataclass
class LatencySlice:
    """Decoding of the same ``n_nodes`` nodes by several models / modes: per-node microseconds (median of the
    repeats), all repeats' seconds, the coded size in bits per node (the ANS words of the slice), and whether every
    decoding was bit-exact."""

    n_nodes: int
    us_per_node: dict[str, float]
    seconds: dict[str, list[float]]
    exact: bool
    bits_per_node: dict[str, float]


def _slice(tree: Octree, level: int, n_windows: int, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Contexts, positions and symbols of the first ``n_windows`` windows of ``level`` of ``tree``."""
    tokens, xyz = level_context(tree.codes, tree.occupancy, level)
    n = min(len(tokens), n_windows * window)
    return tokens[:n], xyz[:n], tree.symbols(level)[:n]


def latency_slice(tree: Octree, level: int, n_windows: int, window: int, models: Codecs,
                  repeats: int) -> LatencySlice:
    """The first ``n_windows`` windows of ``level`` of ``tree``: each model encodes them once (a warm-up), then
    decodes them ``repeats`` times, the models interleaved within each round (machine-dependent timings)."""
    tok, pos, sym = _slice(tree, level, n_windows, window)
    n = len(sym)
    words = {k: codec.encode_level(m, tok, pos, sym, mode) for k, (m, mode) in models.items()}
    seconds: dict[str, list[float]] = {k: [] for k in models}
    exact = True
    for _ in range(repeats):
        for k, (m, mode) in models.items():
            t0 = time.perf_counter()
            out = codec.decode_level(words[k], m, tok, pos, mode)
            seconds[k].append(time.perf_counter() - t0)
            exact &= bool(np.array_equal(out, sym))
    per_node = {k: 1e6 * float(np.median(v)) / n for k, v in seconds.items()}
    bits = {k: 32.0 * len(w) / n for k, w in words.items()}
    return LatencySlice(n, per_node, seconds, exact, bits)


def scan_window_bits(tree: Octree, window: int,
                     models: Mapping[str, tuple[Any, int]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per ``(model, k)``: the teacher-forced code length of every window of every coded level of ``tree`` (bits
    per window, symbols per window; :func:`repro.papers.pace.model.window_bits`), the items of a bootstrap over
    windows."""
    data = WindowData.from_levels(octree_contexts(tree), window)
    return {name: window_bits(model, data.to(model.device), k) for name, (model, k) in models.items()}


def scan_bits(tree: Octree, window: int, models: Mapping[str, tuple[Any, int]]) -> dict[str, float]:
    """Teacher-forced code length (bits per coded symbol) of each ``(model, k)`` on every coded level of ``tree``:
    the rate a model's stream would have (the coder reaches it within a fraction of a percent), cheap to compute
    for a coupled model whose real stream would take minutes to encode."""
    return {name: pooled_rate(bits, count) for name, (bits, count) in scan_window_bits(tree, window, models).items()}


def stage_bpp(scans: Sequence[np.ndarray], grid: Grid, depth: int, model: Any, modes: Sequence[str]) -> np.ndarray:
    """Bits per input point of real streams of every scan (rows) in every stage mode (columns) at ``depth``."""
    return np.array([[codec.encode_detailed(p, model, depth, mode, grid=grid.at_depth(depth)).bpp for mode in modes]
                     for p in scans])


def largest_stage_rise(bpp: np.ndarray) -> float:
    """The largest relative rise of the rate from one stage count to the next, over scans: ``max bpp[:, j + 1] /
    bpp[:, j] − 1`` for ``bpp`` of shape (scans, modes in increasing k); ≤ 0 when every added stage lowers it."""
    bpp = np.asarray(bpp, dtype=float)
    if bpp.ndim != 2 or bpp.shape[1] < 2:
        raise ValueError(f"largest_stage_rise needs (scans, >= 2 modes) rates, got shape {bpp.shape}")
    return float((bpp[:, 1:] / bpp[:, :-1] - 1).max())


def backbone_calls(tree: Octree, level: int, n_windows: int, window: int, models: Codecs) -> dict[str, int]:
    """How often each model runs its backbone (a call of its first transformer block, as a layer pass over a batch
    of windows or as one cached step) while decoding the latency slice of :func:`latency_slice` once. Counted on
    the real decoder, independent of the clock: the paper's "eliminating repetitive backbone executions" is one
    call per window chunk for PACE against one per position for a coupled model, cached or not."""
    tok, pos, sym = _slice(tree, level, n_windows, window)
    calls: dict[str, int] = {}
    for name, (model, mode) in models.items():
        words = codec.encode_level(model, tok, pos, sym, mode)
        with _count_calls(model.blocks[0]) as counter:
            codec.decode_level(words, model, tok, pos, mode)
        calls[name] = counter[0]
    return calls


@contextlib.contextmanager
def _count_calls(block: torch.nn.Module) -> Iterator[list[int]]:
    """Count ``block``'s forward passes and cached ``step`` calls inside the ``with`` (a one-element list)."""
    counter = [0]

    def bump(*_: Any) -> None:
        counter[0] += 1

    step = block.step
    with hooked([block], bump, pre=True):
        block.step = lambda *a, **kw: (bump(), step(*a, **kw))[1]  # type: ignore[method-assign]
        try:
            yield counter
        finally:
            del block.step  # back to the class's method


def level_bits(rd: RateDistortion, names: Sequence[str], n_scans: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Bits spent on each coded level ``1..L−1`` of the main-depth streams, summed over the first ``n_scans`` scans,
    per codec, and the coded symbols per level (the same for every codec)."""
    levels = range(1, rd.depths[-1])
    bits = {n: np.array([sum(rd.streams[i, n].level_bits[d] for i in range(n_scans)) for d in levels])
            for n in names}
    symbols = np.array([sum(rd.streams[i, names[-1]].level_symbols[d] for i in range(n_scans)) for d in levels])
    return bits, symbols
