"""The heterogeneous modular-sum task of notebook 15 (prompts, pools with stable ids, SFT data, rewards) and the
pool of known pass rates that notebook 15 uses to test Rollout-GDRO where sigma differs across bins.

A prompt asks for ``(a_1 + ... + a_K) mod p`` with ``K`` drawn from a heavy-tailed distribution (most prompts are
short, a few are long). The answer is a short chain of thought: the policy writes the running sums
``s_j = (a_1 + ... + a_j) mod p`` for ``j = 1..K`` and the reward is 1 when its last token ``s_K`` is the answer
(the verifiable reward of the paper's math setting, on a toy). Every step is the same two-term addition, so a
long prompt is not at chance: its pass rate is roughly the product of per-step accuracies, and the late steps are
under-trained because only the rare long prompts exercise them (the "long tail" that the paper's controllers target).

Layout (``k_max = 6``): ``a_1 .. a_K PAD .. PAD = s_1 .. s_K PAD ..``. The digits are left-aligned and ``=`` sits at
position ``k_max``, so the step that writes ``s_j`` (predicted at position ``k_max + j - 1``) reads ``a_j`` at a
constant offset ``k_max`` behind it, whatever ``K`` is. Tokens: digits ``0..p-1``, ``=`` (``p``), ``PAD``
(``p + 1``).

Paper: Panaganti et al., "Group Distributionally Robust Optimization-Driven Reinforcement Learning for LLM
Reasoning" (arXiv 2601.19280). Notebook: ``notebooks/15-grpo-gdro.ipynb``. The paper trains Qwen3-Base on DAPO
14.1k; this toy is our analogue (the spec's §3 suggests a modular sum; the chain of thought is ours, added so that
hard prompts are learnable rather than at chance, as issue 23 asks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["GROUPS", "HEAVY_TAIL", "ModSumTask", "PassRatePool", "Prompts"]

Tensor = torch.Tensor

# 70 % K <= 2, 25 % K in 3..4, 5 % K in 5..6 (the spec's heavy tail)
HEAVY_TAIL = (0.20, 0.50, 0.15, 0.10, 0.03, 0.02)
GROUPS = {"easy (K 1-2)": (1, 2), "mid (K 3-4)": (3, 4), "hard (K 5-6)": (5, 6)}


@dataclass(frozen=True)
class Prompts:
    """A batch of prompts: ``tokens`` ``(n, k_max + 1)`` (the digits and ``=``), ``k`` ``(n,)`` terms,
    ``answer`` ``(n,)`` and the running sums ``partial`` ``(n, k_max)`` (PAD beyond ``k``); ``uid`` ``(n,)`` are
    stable ids (positions in a pool) where the batch comes from one."""

    tokens: Tensor
    k: Tensor
    answer: Tensor
    partial: Tensor
    uid: Tensor

    def __len__(self) -> int:
        return int(self.k.shape[0])

    def take(self, index: Tensor) -> Prompts:
        """The sub-batch at ``index`` (a long tensor)."""
        return Prompts(self.tokens[index], self.k[index], self.answer[index], self.partial[index], self.uid[index])

    def sequences(self) -> Tensor:
        """Prompt and the correct chain of thought: ``(n, 2 k_max + 1)`` (the SFT targets)."""
        return torch.cat([self.tokens, self.partial], dim=1)


@dataclass(frozen=True)
class ModSumTask:
    """``(a_1 + ... + a_K) mod p`` with ``K ~ k_probs`` over ``1..len(k_probs)`` (see the module docstring)."""

    p: int = 7
    k_probs: tuple[float, ...] = HEAVY_TAIL

    def __post_init__(self) -> None:
        if self.p < 2:
            raise ValueError(f"modulus p must be >= 2, got {self.p}")
        probs = torch.tensor(self.k_probs, dtype=torch.float64)
        if probs.numel() < 1 or bool((probs < 0).any()) or not torch.isfinite(probs).all():
            raise ValueError(f"k_probs must be non-negative and finite, got {self.k_probs}")
        if abs(float(probs.sum()) - 1.0) > 1e-6:
            raise ValueError(f"k_probs must sum to 1, got {float(probs.sum())}")

    @property
    def k_max(self) -> int:
        return len(self.k_probs)

    @property
    def eq(self) -> int:
        return self.p

    @property
    def pad(self) -> int:
        return self.p + 1

    @property
    def vocab_size(self) -> int:
        return self.p + 2

    @property
    def prompt_len(self) -> int:
        return self.k_max + 1

    @property
    def seq_len(self) -> int:
        return 2 * self.k_max + 1

    def sample_k(self, n: int, generator: torch.Generator, probs: tuple[float, ...] | None = None) -> Tensor:
        """``n`` term counts from ``probs`` (default: the task's heavy tail), on the CPU."""
        w = torch.tensor(probs if probs is not None else self.k_probs, dtype=torch.float64)
        if w.numel() != self.k_max:
            raise ValueError(f"need {self.k_max} probabilities, got {w.numel()}")
        return torch.multinomial(w, n, replacement=True, generator=generator) + 1

    def make(self, k: Tensor, generator: torch.Generator, device: torch.device | str = "cpu") -> Prompts:
        """Fresh prompts with ``k[i]`` terms each (uniform digits); ``uid`` is ``0..n-1``."""
        k = torch.as_tensor(k, dtype=torch.long).cpu()
        if k.ndim != 1 or k.numel() == 0:
            raise ValueError("k must be a non-empty 1-d tensor of term counts")
        if int(k.min()) < 1 or int(k.max()) > self.k_max:
            raise ValueError(f"term counts must lie in 1..{self.k_max}, got {int(k.min())}..{int(k.max())}")
        n = k.numel()
        live = torch.arange(self.k_max)[None, :] < k[:, None]
        digits = torch.randint(0, self.p, (n, self.k_max), generator=generator) * live
        partial = torch.where(live, digits.cumsum(1) % self.p, self.pad)
        tokens = torch.cat([torch.where(live, digits, self.pad), torch.full((n, 1), self.eq)], dim=1)
        answer = partial.gather(1, (k - 1)[:, None])[:, 0]
        out = Prompts(tokens, k, answer, partial, torch.arange(n))
        return Prompts(*(t.to(device) for t in (out.tokens, out.k, out.answer, out.partial, out.uid)))

    def pool(self, n: int, generator: torch.Generator, device: torch.device | str = "cpu") -> Prompts:
        """A fixed training pool of ``n`` prompts from the heavy tail; ``uid`` = position in the pool."""
        return self.make(self.sample_k(n, generator), generator, device)

    def per_k(self, n_per_k: int, generator: torch.Generator, device: torch.device | str = "cpu") -> Prompts:
        """``n_per_k`` fresh prompts for every ``K = 1..k_max`` (the evaluation set), ordered by ``K``."""
        k = torch.arange(1, self.k_max + 1).repeat_interleave(n_per_k)
        return self.make(k, generator, device)

    def rewards(self, prompts_k: Tensor, answer: Tensor, chains: Tensor) -> Tensor:
        """1.0 where the chain's ``K``-th token (``chains[i, k_i - 1]``) equals the answer, else 0.0."""
        last = chains.gather(1, (prompts_k - 1)[:, None])[:, 0]
        return (last == answer).to(torch.float32)

    def chain_mask(self, k: Tensor) -> Tensor:
        """``(n, k_max)`` bool: which chain positions belong to the answer (``j < k``)."""
        return torch.arange(self.k_max, device=k.device)[None, :] < k[:, None]


@dataclass(frozen=True)
class PassRatePool:
    """A pool of ``n`` prompts with known pass rates, without a policy: the sigma-variant of notebook 15.

    In RL post-training data most prompts give all-equal groups (solved: every rollout correct; unsolved: none),
    so their rollout variance ``pi (1 - pi)`` is 0, while the prompts on the frontier have ``pi`` near 1/2. A
    share ``solved`` of the prompts has ``pi = 1``, a share ``unsolved`` has ``pi = 0`` and the rest draw ``pi``
    uniformly from ``frontier``. This is where the square-root rule of the paper (section 4) can gain: the modular-sum
    toy's bins have similar sigma, so no allocation gains much there. The shares are ours (chosen on seed 0 of
    notebook 15 so that the oracle allocation gains over 20 %); the paper gives no distribution of pass rates.
    """

    n: int = 512
    solved: float = 0.6
    unsolved: float = 0.2
    frontier: tuple[float, float] = (0.1, 0.9)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not (0 <= self.solved and 0 <= self.unsolved and self.solved + self.unsolved <= 1):
            raise ValueError(f"need shares solved, unsolved >= 0 with a sum <= 1, got {self.solved}, {self.unsolved}")
        lo, hi = self.frontier
        if not 0 <= lo <= hi <= 1:
            raise ValueError(f"frontier must be an interval inside [0, 1], got {self.frontier}")

    def sample(self, generator: torch.Generator) -> Tensor:
        """``(n,)`` float64 pass rates, drawn on the CPU from ``generator``."""
        u = torch.rand(self.n, generator=generator, dtype=torch.float64)
        lo, hi = self.frontier
        mid = lo + (hi - lo) * torch.rand(self.n, generator=generator, dtype=torch.float64)
        return torch.where(u < self.solved, 1.0, torch.where(u < self.solved + self.unsolved, 0.0, mid))
