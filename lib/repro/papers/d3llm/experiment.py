"""Experiment harness of notebook 03 (d3LLM): the teacher's recipe, pseudo-trajectory distillation, the decoders'
accuracy–TPF curves, AUP per model and decoder, and the KV-cache sweep.

Each function draws its randomness from generators seeded by its ``seed`` argument (and :func:`new_model` reseeds
torch's global generator before initialising the weights), in the order the notebook has always used, so a
notebook that calls them reproduces its numbers exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...common import stats
from ...common.nn import TransformerConfig
from ...common.seeding import derive
from ...common.settings import dataclass_from
from ...common.timing import Timer
from .method import (
    Decoded,
    Denoiser,
    Tensor,
    aup,
    decode_multiblock,
    decode_multiblock_kvcache,
    decode_vanilla,
    train_autoregressive,
    train_d3llm,
    train_diffusion,
)
from .problems import ChainTask

__all__ = [
    "AUP_CUT", "CURVE_KINDS", "ENTROPY_DECODING", "FAST_DLLM", "KV_SETTINGS", "Curves", "EvalSet", "Gain", "MatchedTPF",
    "Recipe", "accuracy", "aup_table", "bootstrap_gain", "curves", "distill", "kv_sweep", "matched_tpf", "new_model",
    "resampled_aups", "resampled_gains", "resampled_points", "seed_gain", "tpf_at_accuracy", "train_pair",
    "train_teacher",
]

ENTROPY_DECODING: dict[str, Any] = dict(block_add_threshold=0.1, decoded_token_threshold=0.95)
"""d3LLM's multi-block settings in the paper's evaluation harness (a block is added at 10 % progress of the last
one and fully activated at 95 % progress of its predecessor)."""
FAST_DLLM: dict[str, Any] = dict(block_add_threshold=1.0, decoded_token_threshold=1.0, rule="confidence")
"""Fast-dLLM's single-block confidence threshold, as a special case of :func:`decode_multiblock`."""
KV_SETTINGS: dict[str, tuple[int, int]] = {
    "no cache": (0, 1), "delay 2, refresh 3 (paper)": (2, 3), "delay 1, refresh 3": (1, 3),
    "delay 0, refresh 3": (0, 3), "delay 0, no refresh": (0, 10**9)}
"""Name -> (``cache_delay_iter``, ``refresh_interval``) of the KV-cache sweep; refreshing at every forward is the
cache-free decoder."""
CURVE_KINDS = ("vanilla", "entropy", "confidence")
"""The curves that enter AUP; ``"fixed"`` (the fixed-count parallel decoder, the control of notebook 03's C3) is
kept beside them."""
AUP_CUT = 5.0
"""How far below the reference accuracy a point may fall and still count (the paper's ``get_aup``); also the
accuracy at which :func:`matched_tpf` compares curves."""


@dataclass(frozen=True)
class Recipe:
    """Model, teacher-training and distillation settings of notebook 03 (the notebook passes its configuration;
    the defaults are the earlier quick mode with blocks of 4, the full mode's teacher, used by the benchmark).

    ``block`` is the decoding block size, used for the teacher's one-token-per-forward trajectories as well."""

    d_model: int = 128
    n_layers: int = 3
    n_heads: int = 4
    ar_steps: int = 250
    diff_steps: int = 350
    batch: int = 64
    lr: float = 1e-3
    traj_prompts: int = 1024
    student_steps: int = 400
    student_batch: int = 32
    student_lr: float = 1e-4
    block_sizes: Sequence[int] = (2, 2, 3, 3, 4, 4)
    block: int = 4

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Recipe:
        """The recipe's fields taken from a notebook configuration (other keys are ignored)."""
        return dataclass_from(cls, cfg)


@dataclass
class EvalSet:
    """Fixed evaluation problems and the decoder settings every model is evaluated with."""

    task: ChainTask
    prompt: Tensor
    answer: Tensor
    block: int
    thresholds: Sequence[float]
    conf_thresholds: Sequence[float]
    fixed_counts: Sequence[int] = ()

    @classmethod
    def sample(cls, task: ChainTask, n: int, seed: int, *, block: int, thresholds: Sequence[float],
               conf_thresholds: Sequence[float], fixed_counts: Sequence[int] = (),
               device: torch.device | str = "cpu") -> EvalSet:
        """``n`` problems from a generator seeded with ``seed``; ``fixed_counts``: the tokens per forward of the
        fixed-count parallel decoder (``decode_vanilla(per_forward=k)``), none by default."""
        prompt, answer = task.sample(n, torch.Generator().manual_seed(seed), device)
        return cls(task, prompt, answer, block, list(thresholds), list(conf_thresholds), list(fixed_counts))

    @property
    def stop_at_eos(self) -> dict[str, Any]:
        """Arguments of the parallel decoders: the task's mask and EOS, early stop at the first EOS."""
        return dict(mask_id=self.task.mask_id, eos_id=self.task.eos_id, early_stop=True)


@dataclass
class Curves:
    """(TPF, exact-answer accuracy %) points of one model: vanilla (one point), entropy multi-block per threshold,
    Fast-dLLM per confidence threshold, the fixed-count decoder per count (``fixed``); ``outputs`` keeps the
    decoders' outputs (``"vanilla"`` and each entropy threshold) for the timeline plots; ``samples[kind]`` holds,
    per point, each problem's exact-answer flag and forwards (CPU tensors), from which :func:`bootstrap_gain` and
    :func:`matched_tpf` resample the points; ``answer_len`` is the number of answer tokens per problem."""

    vanilla: list[tuple[float, float]]
    entropy: list[tuple[float, float]] = field(default_factory=list)
    confidence: list[tuple[float, float]] = field(default_factory=list)
    fixed: list[tuple[float, float]] = field(default_factory=list)
    outputs: dict[Any, Decoded] = field(default_factory=dict)
    samples: dict[str, list[tuple[Tensor, Tensor]]] = field(default_factory=dict)
    answer_len: int = 0

    def add(self, kind: str, out: Decoded, answer: Tensor, task: ChainTask) -> tuple[float, float]:
        """Append the point of decoder output ``out`` to the curve ``kind`` and keep its per-problem samples."""
        point = (out.tpf, accuracy(out, answer, task))
        getattr(self, kind).append(point)
        self.samples.setdefault(kind, []).append((task.correct(out.tokens, answer).cpu(), out.nfe.cpu()))
        self.answer_len = out.tokens.shape[1]
        return point

    def rounded(self) -> dict[str, list[list[float]]]:
        """The points for the results file: TPF to 4 decimals, accuracy to 2."""
        return {k: [[round(r, 4), round(y, 2)] for r, y in getattr(self, k)] for k in (*CURVE_KINDS, "fixed")
                if getattr(self, k)}


def new_model(task: ChainTask, recipe: Recipe, seed: int, device: torch.device | str = "cpu") -> Denoiser:
    """A fresh bidirectional denoiser with Dream's shifted logits, initialised from torch's generator at ``seed``."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=task.vocab_size, max_len=task.prompt_len + task.answer_len,
                            d_model=recipe.d_model, n_layers=recipe.n_layers, n_heads=recipe.n_heads)
    return Denoiser(cfg, task.mask_id, shift=True).to(device)


def train_teacher(task: ChainTask, recipe: Recipe, seed: int, device: torch.device | str = "cpu"
                  ) -> tuple[Denoiser, list[float], list[float]]:
    """The teacher: autoregressive warm-up, then masked-diffusion training (one generator for both, seeded with
    ``seed``). Returns the model and the two loss curves."""
    g = torch.Generator().manual_seed(seed)
    model = new_model(task, recipe, seed, device)
    ar = train_autoregressive(model, task, steps=recipe.ar_steps, batch=recipe.batch, lr=recipe.lr, generator=g)
    diff = train_diffusion(model, task, steps=recipe.diff_steps, batch=recipe.batch, lr=recipe.lr, generator=g)
    return model, ar, diff


def distill(teacher: Denoiser, task: ChainTask, recipe: Recipe, seed: int, device: torch.device | str = "cpu",
            order: str = "teacher") -> tuple[Denoiser, list[dict[str, float]], float]:
    """Teacher trajectories on fresh prompts (one token per forward; kept where the teacher is right), then the
    d3LLM student, fine-tuned from a copy of the teacher. Returns the student, its loss history and the fraction of
    trajectory prompts the teacher got right. Generator seeded from the stream ``derive(seed, "trajectories")``.

    ``order="random"`` is the ablation the README's "+18 % TPF" of pseudo-trajectory extraction is measured against
    ("instead of random masking"): the same training with each kept trajectory's decoding order replaced by a
    random permutation (drawn from the stream ``derive(seed, "random-order")``), so the masks are random subsets of the
    block at the same ratios."""
    if order not in ("teacher", "random"):
        raise ValueError(f"order must be 'teacher' or 'random', got {order!r}")
    g = torch.Generator().manual_seed(derive(seed, "trajectories"))
    prompt, answer = task.sample(recipe.traj_prompts, g, device)
    traj = decode_vanilla(teacher, prompt, task.answer_len, recipe.block, mask_id=task.mask_id)
    ok = task.correct(traj.tokens, answer)
    student = copy.deepcopy(teacher)
    timeline = traj.timeline[ok]
    if order == "random":
        perm = torch.Generator().manual_seed(derive(seed, "random-order"))
        timeline = torch.stack([torch.randperm(timeline.shape[1], generator=perm) + 1 for _ in timeline]).to(device)
    hist = train_d3llm(student, prompt[ok], answer[ok], timeline, steps=recipe.student_steps,
                       batch=recipe.student_batch, block_sizes=recipe.block_sizes, lr=recipe.student_lr, generator=g)
    return student, hist, float(ok.double().mean())


def accuracy(out: Decoded, answer: Tensor, task: ChainTask) -> float:
    """Exact answers in percent."""
    return 100.0 * float(task.correct(out.tokens, answer).double().mean())


def curves(model: Denoiser, ev: EvalSet) -> Curves:
    """(TPF, accuracy %) of every decoder on the evaluation problems: vanilla, entropy multi-block at each threshold,
    Fast-dLLM at each confidence threshold (both stop at the first EOS), the fixed-count decoder at each count."""
    g = ev.task.answer_len
    van = decode_vanilla(model, ev.prompt, g, ev.block, mask_id=ev.task.mask_id)
    res = Curves(vanilla=[], outputs={"vanilla": van})
    res.add("vanilla", van, ev.answer, ev.task)
    for t in ev.thresholds:
        out = decode_multiblock(model, ev.prompt, g, ev.block, t, **ev.stop_at_eos, **ENTROPY_DECODING)
        res.add("entropy", out, ev.answer, ev.task)
        res.outputs[t] = out
    for t in ev.conf_thresholds:
        out = decode_multiblock(model, ev.prompt, g, ev.block, t, **ev.stop_at_eos, **FAST_DLLM)
        res.add("confidence", out, ev.answer, ev.task)
    for k in ev.fixed_counts:
        res.add("fixed", decode_vanilla(model, ev.prompt, g, ev.block, mask_id=ev.task.mask_id, per_forward=k),
                ev.answer, ev.task)
    return res


def aup_table(teacher: Curves, student: Curves) -> tuple[dict[str, float], float]:
    """AUP of each model and decoder, and ``y_max``, the best accuracy of any model and decoder. Both models are
    scored against one reference accuracy, the teacher's one-token-per-forward accuracy: each parallel decoder's
    curve includes the model's own one-token-per-forward point, and points more than 5 below the reference are left
    out."""
    return _aup_table(teacher.vanilla, teacher.entropy, teacher.confidence, student.vanilla, student.entropy,
                      student.confidence)


def _aup_table(*curves: list[tuple[float, float]]) -> tuple[dict[str, float], float]:
    """:func:`aup_table` on point lists ``(teacher vanilla, entropy, confidence, student vanilla, entropy,
    confidence)``."""
    y_max = max(y for pts in curves for _, y in pts)
    y_ref = curves[0][0][1]
    out = {}
    for name, (van, ent, conf) in (("teacher", curves[:3]), ("student", curves[3:])):
        for k, pts in (("entropy", ent), ("confidence", conf)):
            out[f"{name} / {k}"] = aup(*zip(*(van + pts), strict=True), y_max, strict=False, y_ref=y_ref)
        out[f"{name} / vanilla"] = aup(*zip(*van, strict=True), y_max, strict=False, y_ref=y_ref)
    return out, y_max


@dataclass(frozen=True)
class Gain:
    """Student-minus-teacher AUP (entropy multi-block) on the evaluation problems, its ``level`` bootstrap
    interval ``[lo, hi]`` over those problems, the resampled gains (``draws``), and the teacher's AUP with its
    interval over the same resamples (``teacher``, the control's; its draws in ``teacher_draws``)."""

    point: float
    lo: float
    hi: float
    level: float
    draws: np.ndarray = field(default_factory=lambda: np.zeros(0), compare=False, repr=False)
    teacher_draws: np.ndarray = field(default_factory=lambda: np.zeros(0), compare=False, repr=False)
    teacher: stats.Estimate | None = field(default=None, compare=False, repr=False)

    def estimate(self, n: int) -> stats.Estimate:
        """The gain as a bootstrap :class:`~repro.common.stats.Estimate` over ``n`` evaluation problems."""
        return stats.Estimate(self.point, self.lo, self.hi, n, "bootstrap", self.level)


def resampled_points(res: Curves, kind: str, counts: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (TPF, accuracy %) points of curve ``kind`` with the evaluation problems reweighted: ``counts`` (B, N)
    holds how often each of the N problems is drawn in each of B resamples; one pair of (B,) arrays per point."""
    counts = np.asarray(counts, dtype=np.float64)
    out = []
    for correct, nfe in res.samples.get(kind, []):
        if len(correct) != counts.shape[1]:
            raise ValueError(f"counts cover {counts.shape[1]} problems, the curves {len(correct)}")
        acc = 100.0 * (counts @ correct.double().numpy()) / counts.sum(1)
        tpf = res.answer_len * counts.sum(1) / (counts @ nfe.double().numpy())
        out.append((tpf, acc))
    return out


def resampled_aups(teacher: Curves, student: Curves, counts: np.ndarray) -> dict[str, np.ndarray]:
    """Every entry of :func:`aup_table` with the evaluation problems reweighted by ``counts`` (B, N): each point's
    accuracy and TPF, ``y_max`` and the reference accuracy are recomputed from the resampled problems (a row of
    ones gives :func:`aup_table`'s numbers). Name -> (B,) array."""
    curves = [resampled_points(res, k, counts) for res in (teacher, student) for k in CURVE_KINDS]
    rows = [_aup_table(*([(float(r[b]), float(y[b])) for r, y in pts] for pts in curves))[0]
            for b in range(len(counts))]
    return {name: np.array([row[name] for row in rows]) for name in rows[0]}


def resampled_gains(teacher: Curves, student: Curves, counts: np.ndarray) -> np.ndarray:
    """Student-minus-teacher AUP (entropy multi-block) with the evaluation problems reweighted by ``counts``
    (:func:`resampled_aups`)."""
    aups = resampled_aups(teacher, student, counts)
    return aups["student / entropy"] - aups["teacher / entropy"]


def tpf_at_accuracy(points: Sequence[tuple[Any, Any]], y: Any) -> np.ndarray:
    """Where a curve, drawn through its (TPF, accuracy) points in order (the one-token-per-forward point first,
    then rising parallelism), first falls below accuracy ``y``: the TPF interpolated linearly between the last
    point at or above ``y`` and the first below it; the last point's TPF if none falls below (the curve ends above
    ``y``), NaN if the first point is already below. Points and ``y`` may be (B,) arrays (one curve per resample)."""
    tpf = np.stack([np.atleast_1d(np.asarray(r, dtype=float)) for r, _ in points])
    acc = np.stack([np.atleast_1d(np.asarray(a, dtype=float)) for _, a in points])
    y = np.broadcast_to(np.asarray(y, dtype=float), acc.shape[1:])
    out = np.where(acc[0] < y, np.nan, tpf[-1])
    settled = acc[0] < y
    for i in range(1, len(tpf)):
        fall = ~settled & (acc[i] < y)
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = (acc[i - 1] - y) / (acc[i - 1] - acc[i])
            out = np.where(fall, tpf[i - 1] + frac * (tpf[i] - tpf[i - 1]), out)
        settled |= fall
    return out


@dataclass(frozen=True)
class MatchedTPF:
    """Tokens per forward at matched accuracy (:func:`matched_tpf`), each a bootstrap
    :class:`~repro.common.stats.Estimate` over the evaluation problems: the student's entropy multi-block curve
    (``student``), the same student's fixed-count decoder (``fixed``), the teacher's entropy curve (``teacher``),
    the paired ratios ``over_fixed`` (student / fixed) and ``over_teacher`` (student / teacher), and, when an
    ablated student was given, its entropy curve (``ablation``) and ``over_ablation`` (student / ablation)."""

    student: stats.Estimate
    fixed: stats.Estimate
    teacher: stats.Estimate
    over_fixed: stats.Estimate
    over_teacher: stats.Estimate
    cut: float
    ablation: stats.Estimate | None = None
    over_ablation: stats.Estimate | None = None


def matched_tpf(teacher: Curves, student: Curves, n_boot: int = 2000, seed: int = 0, level: float = 0.95,
                ablation: Curves | None = None) -> MatchedTPF:
    """TPF of each curve where it falls to the AUP cut, :data:`AUP_CUT` points below the teacher's
    one-token-per-forward accuracy (:func:`tpf_at_accuracy`; each curve starts at its model's
    one-token-per-forward point), with paired percentile intervals from ``n_boot`` resamples of the evaluation
    problems (the draws of :func:`bootstrap_gain` with the same ``seed``; the cut is recomputed in each).
    ``ablation``: another student on the same problems (e.g. distilled with random masks), compared the same way."""
    n = len(teacher.samples["vanilla"][0][0])
    counts = np.vstack([np.ones((1, n)), stats.resample_counts(n, n_boot, seed)])
    cut = resampled_points(teacher, "vanilla", counts)[0][1] - AUP_CUT

    def crossing(res: Curves, kind: str) -> np.ndarray:
        return tpf_at_accuracy(resampled_points(res, "vanilla", counts) + resampled_points(res, kind, counts), cut)

    def est(v: np.ndarray) -> stats.Estimate:
        return stats.from_replicates(v[0], v[1:], n, level)

    s, f, t = crossing(student, "entropy"), crossing(student, "fixed"), crossing(teacher, "entropy")
    a = None if ablation is None else crossing(ablation, "entropy")
    with np.errstate(divide="ignore", invalid="ignore"):
        extra = {} if a is None else {"ablation": est(a), "over_ablation": est(s / a)}
        return MatchedTPF(est(s), est(f), est(t), est(s / f), est(s / t), cut=float(cut[0]), **extra)


def bootstrap_gain(teacher: Curves, student: Curves, n_boot: int = 2000, seed: int = 0, level: float = 0.95
                   ) -> Gain:
    """Student-minus-teacher AUP and its paired percentile bootstrap interval: ``n_boot`` resamples of the
    evaluation problems (with replacement, the same draws for both models and every decoder setting), drawn from
    a generator seeded with ``seed``. The interval covers the evaluation sample, not the training randomness."""
    if n_boot < 1 or not 0 < level < 1:
        raise ValueError("need n_boot >= 1 and 0 < level < 1")
    n = len(teacher.samples["vanilla"][0][0])
    aups = resampled_aups(teacher, student, stats.resample_counts(n, n_boot, seed))
    gains = aups["student / entropy"] - aups["teacher / entropy"]
    table, _ = aup_table(teacher, student)
    lo, hi = stats.percentile_interval(gains, level)
    teacher_aup = stats.from_replicates(table["teacher / entropy"], aups["teacher / entropy"], n, level)
    return Gain(table["student / entropy"] - table["teacher / entropy"], float(lo), float(hi), level, gains,
                aups["teacher / entropy"], teacher_aup)


def train_pair(task: ChainTask, recipe: Recipe, seed: int, ev: EvalSet, device: torch.device | str = "cpu"
               ) -> tuple[Curves, Curves]:
    """The curves of a teacher–student pair trained from ``seed`` (:func:`train_teacher`, :func:`distill`)."""
    teacher = train_teacher(task, recipe, seed, device)[0]
    student = distill(teacher, task, recipe, seed, device)[0]
    return curves(teacher, ev), curves(student, ev)


def seed_gain(task: ChainTask, recipe: Recipe, seed: int, ev: EvalSet, device: torch.device | str = "cpu",
              n_boot: int = 2000) -> Gain:
    """Student-minus-teacher AUP (entropy multi-block) of a teacher–student pair trained from ``seed``, with its
    bootstrap interval over the evaluation problems."""
    return bootstrap_gain(*train_pair(task, recipe, seed, ev, device), n_boot=n_boot, seed=seed)


def kv_sweep(model: Denoiser, ev: EvalSet, n: int, threshold: float,
             settings: Mapping[str, tuple[int, int]] = KV_SETTINGS
             ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, np.ndarray]]]:
    """Entropy multi-block decoding of the first ``n`` evaluation problems, one at a time, with each KV-cache
    setting ``(cache_delay_iter, refresh_interval)``. Returns, per setting, the means (accuracy %, forwards and
    positions fed per answer, wall milliseconds per answer: ``ms``, machine-dependent) and the per-problem values
    (``correct`` as 0/1 and ``positions``, arrays of length ``n``) that a bootstrap resamples."""
    prompt, answer = ev.prompt[:n], ev.answer[:n]
    dev = prompt.device
    rows: dict[str, dict[str, float]] = {}
    per_problem: dict[str, dict[str, np.ndarray]] = {}
    for name, (delay, refresh) in settings.items():
        with Timer(dev) as timer:
            out = decode_multiblock_kvcache(model, prompt, ev.task.answer_len, ev.block, threshold, **ev.stop_at_eos,
                                            **ENTROPY_DECODING, cache_delay_iter=delay, refresh_interval=refresh)
        seconds = timer.seconds
        rows[name] = {"acc": accuracy(out, answer, ev.task), "nfe": float(out.nfe.double().mean()),
                      "positions": float(out.positions.double().mean()), "ms": 1e3 * seconds / n}
        per_problem[name] = {"correct": ev.task.correct(out.tokens, answer).double().cpu().numpy(),
                             "positions": out.positions.double().cpu().numpy()}
    return rows, per_problem
