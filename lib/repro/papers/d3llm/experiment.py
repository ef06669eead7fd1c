"""Experiment harness of notebook 03 (d3LLM): the teacher's recipe, pseudo-trajectory distillation, the decoders'
accuracy–TPF curves, AUP per model and decoder, and the KV-cache sweep.

Each function draws its randomness from generators seeded by its ``seed`` argument (and :func:`new_model` reseeds
torch's global generator before initialising the weights), in the order the notebook has always used, so a
notebook that calls them reproduces its numbers exactly.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from ...common.nn import TransformerConfig
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


@dataclass(frozen=True)
class Recipe:
    """Model, teacher-training and distillation settings of notebook 03 (defaults: its quick mode).

    ``block`` is the decoding block size, used for the teacher's one-token-per-forward trajectories as well."""

    d_model: int = 128
    layers: int = 3
    heads: int = 4
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
        return cls(**{f.name: cfg[f.name] for f in fields(cls) if f.name in cfg})


@dataclass
class EvalSet:
    """Fixed evaluation problems and the decoder settings every model is evaluated with."""

    task: ChainTask
    prompt: Tensor
    answer: Tensor
    block: int
    thresholds: Sequence[float]
    conf_thresholds: Sequence[float]

    @classmethod
    def sample(cls, task: ChainTask, n: int, seed: int, *, block: int, thresholds: Sequence[float],
               conf_thresholds: Sequence[float], device: torch.device | str = "cpu") -> EvalSet:
        """``n`` problems from a generator seeded with ``seed``."""
        prompt, answer = task.sample(n, torch.Generator().manual_seed(seed), device)
        return cls(task, prompt, answer, block, list(thresholds), list(conf_thresholds))

    @property
    def stop_at_eos(self) -> dict[str, Any]:
        """Arguments of the parallel decoders: the task's mask and EOS, early stop at the first EOS."""
        return dict(mask_id=self.task.mask_id, eos_id=self.task.eos_id, early_stop=True)


@dataclass
class Curves:
    """(TPF, exact-answer accuracy %) points of one model: vanilla (one point), entropy multi-block per threshold,
    Fast-dLLM per confidence threshold; ``outputs`` keeps the decoders' outputs (``"vanilla"`` and each entropy
    threshold) for the timeline plots."""

    vanilla: list[tuple[float, float]]
    entropy: list[tuple[float, float]] = field(default_factory=list)
    confidence: list[tuple[float, float]] = field(default_factory=list)
    outputs: dict[Any, Decoded] = field(default_factory=dict)

    def rounded(self) -> dict[str, list[list[float]]]:
        """The points for the results file: TPF to 4 decimals, accuracy to 2."""
        return {k: [[round(r, 4), round(y, 2)] for r, y in getattr(self, k)] for k in CURVE_KINDS}


def new_model(task: ChainTask, recipe: Recipe, seed: int, device: torch.device | str = "cpu") -> Denoiser:
    """A fresh bidirectional denoiser with Dream's shifted logits, initialised from torch's generator at ``seed``."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=task.vocab_size, max_len=task.prompt_len + task.answer_len,
                            d_model=recipe.d_model, n_layers=recipe.layers, n_heads=recipe.heads)
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


def distill(teacher: Denoiser, task: ChainTask, recipe: Recipe, seed: int, device: torch.device | str = "cpu"
            ) -> tuple[Denoiser, list[dict[str, float]], float]:
    """Teacher trajectories on fresh prompts (one token per forward; kept where the teacher is right), then the
    d3LLM student, fine-tuned from a copy of the teacher. Returns the student, its loss history and the fraction of
    trajectory prompts the teacher got right. Generator seeded with ``seed + 1``."""
    g = torch.Generator().manual_seed(seed + 1)
    prompt, answer = task.sample(recipe.traj_prompts, g, device)
    traj = decode_vanilla(teacher, prompt, task.answer_len, recipe.block, mask_id=task.mask_id)
    ok = task.correct(traj.tokens, answer)
    student = copy.deepcopy(teacher)
    hist = train_d3llm(student, prompt[ok], answer[ok], traj.timeline[ok], steps=recipe.student_steps,
                       batch=recipe.student_batch, block_sizes=recipe.block_sizes, lr=recipe.student_lr, generator=g)
    return student, hist, float(ok.double().mean())


def accuracy(out: Decoded, answer: Tensor, task: ChainTask) -> float:
    """Exact answers in percent."""
    return 100.0 * float(task.correct(out.tokens, answer).double().mean())


def curves(model: Denoiser, ev: EvalSet) -> Curves:
    """(TPF, accuracy %) of every decoder on the evaluation problems: vanilla, entropy multi-block at each threshold,
    Fast-dLLM at each confidence threshold (both parallel decoders stop at the first EOS)."""
    g = ev.task.answer_len
    van = decode_vanilla(model, ev.prompt, g, ev.block, mask_id=ev.task.mask_id)
    res = Curves(vanilla=[(van.tpf, accuracy(van, ev.answer, ev.task))], outputs={"vanilla": van})
    for t in ev.thresholds:
        out = decode_multiblock(model, ev.prompt, g, ev.block, t, **ev.stop_at_eos, **ENTROPY_DECODING)
        res.entropy.append((out.tpf, accuracy(out, ev.answer, ev.task)))
        res.outputs[t] = out
    for t in ev.conf_thresholds:
        out = decode_multiblock(model, ev.prompt, g, ev.block, t, **ev.stop_at_eos, **FAST_DLLM)
        res.confidence.append((out.tpf, accuracy(out, ev.answer, ev.task)))
    return res


def aup_table(teacher: Curves, student: Curves) -> tuple[dict[str, float], float]:
    """AUP of each model and decoder, and ``y_max``, the best accuracy of any model and decoder. Each parallel
    decoder's curve includes the model's one-token-per-forward point; points more than 5 below it are left out."""
    y_max = max(y for res in (teacher, student) for k in CURVE_KINDS for _, y in getattr(res, k))
    out = {}
    for res, name in ((teacher, "teacher"), (student, "student")):
        for k in ("entropy", "confidence"):
            out[f"{name} / {k}"] = aup(*zip(*(res.vanilla + getattr(res, k)), strict=True), y_max, strict=False)
        out[f"{name} / vanilla"] = aup(*zip(*res.vanilla, strict=True), y_max)
    return out, y_max


def seed_gain(task: ChainTask, recipe: Recipe, seed: int, ev: EvalSet, device: torch.device | str = "cpu") -> float:
    """Student-minus-teacher AUP (entropy multi-block) of a teacher–student pair trained from ``seed``."""
    teacher = train_teacher(task, recipe, seed, device)[0]
    student = distill(teacher, task, recipe, seed, device)[0]
    table, _ = aup_table(curves(teacher, ev), curves(student, ev))
    return table["student / entropy"] - table["teacher / entropy"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kv_sweep(model: Denoiser, ev: EvalSet, n: int, threshold: float,
             settings: Mapping[str, tuple[int, int]] = KV_SETTINGS) -> dict[str, dict[str, float]]:
    """Entropy multi-block decoding of the first ``n`` evaluation problems, one at a time, with each KV-cache
    setting ``(cache_delay_iter, refresh_interval)``: accuracy (%), forwards and positions fed per answer, and
    wall milliseconds per answer (``ms``, machine-dependent)."""
    prompt, answer = ev.prompt[:n], ev.answer[:n]
    dev = prompt.device
    rows = {}
    for name, (delay, refresh) in settings.items():
        _sync(dev)
        t0 = time.perf_counter()
        out = decode_multiblock_kvcache(model, prompt, ev.task.answer_len, ev.block, threshold, **ev.stop_at_eos,
                                        **ENTROPY_DECODING, cache_delay_iter=delay, refresh_interval=refresh)
        _sync(dev)
        seconds = time.perf_counter() - t0
        rows[name] = {"acc": accuracy(out, answer, ev.task), "nfe": float(out.nfe.double().mean()),
                      "positions": float(out.positions.double().mean()), "ms": 1e3 * seconds / n}
    return rows
