"""The generated task of notebook 03 (d3LLM, ICML 2026): multi-step modular arithmetic with worked steps, a chain
of running sums that cannot all be decoded in parallel (a stand-in for GSM8K-CoT, which cannot be had offline).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ChainTask"]

Tensor = torch.Tensor


@dataclass(frozen=True)
class ChainTask:
    """``BOS a_1 .. a_K =`` -> ``a_2 s_2 a_3 s_3 .. a_K s_K`` (+ ``eos_pad`` EOS), ``s_k = (a_1 + .. + a_k) mod p``.

    The copied operands can be decoded in parallel; each running sum needs the one before it (the sequential
    chain). Vocabulary: digits ``0..p-1``, then BOS, ``=``, EOS, MASK.
    """

    n_operands: int = 6
    modulus: int = 7
    eos_pad: int = 0

    def __post_init__(self) -> None:
        if self.n_operands < 2 or self.modulus < 2 or self.eos_pad < 0:
            raise ValueError("need n_operands >= 2, modulus >= 2 and eos_pad >= 0")

    @property
    def bos_id(self) -> int:
        return self.modulus

    @property
    def eq_id(self) -> int:
        return self.modulus + 1

    @property
    def eos_id(self) -> int:
        return self.modulus + 2

    @property
    def mask_id(self) -> int:
        return self.modulus + 3

    @property
    def vocab_size(self) -> int:
        return self.modulus + 4

    @property
    def prompt_len(self) -> int:
        return self.n_operands + 2

    @property
    def answer_len(self) -> int:
        return 2 * (self.n_operands - 1) + self.eos_pad

    def sample(self, n: int, generator: torch.Generator | None = None, device: torch.device | str = "cpu"
               ) -> tuple[Tensor, Tensor]:
        """``n`` random problems: prompts ``(n, K + 2)`` and answers ``(n, 2 (K - 1) + eos_pad)``."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        a = torch.randint(0, self.modulus, (n, self.n_operands), generator=generator)
        s = a.cumsum(1) % self.modulus
        steps = torch.stack([a[:, 1:], s[:, 1:]], 2).reshape(n, -1)
        answer = torch.cat([steps, torch.full((n, self.eos_pad), self.eos_id)], 1)
        prompt = torch.cat([torch.full((n, 1), self.bos_id), a, torch.full((n, 1), self.eq_id)], 1)
        return prompt.to(device), answer.to(device)

    def correct(self, decoded: Tensor, answer: Tensor) -> Tensor:
        """Per problem: is the whole decoded answer exactly right?"""
        return (decoded == answer).all(1)
