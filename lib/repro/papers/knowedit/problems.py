"""The toy world of paper 06: subject–relation–object facts, modular chain-of-thought sums and in-context
overrides, as token sequences for ``repro.common.nn.Transformer`` and as text for the retrieval embedder.

Sequences (loss on the answer tokens only):

* fact: ``BOS Q s r -> o EOS``;
* reasoning: ``BOS a + b + c + d = p1 p2 p3 EOS`` (mod 10, ``p_i`` the running sums: a chain of thought);
* context: ``BOS CTX s' r' o' ; Q s r -> ans EOS``; relevant (same ``s, r``, answer ``o'``) or irrelevant (another
  subject, or the same subject with the other relation; answer the stored fact).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["World", "make_world", "render"]

Tensor = torch.Tensor
SPECIAL = ("PAD", "BOS", "EOS", "Q", "CTX", ";", "->", "+", "=")
RELATIONS = ("likes", "owns")
OBJECT_WORDS = ("amber", "bronze", "cedar", "denim", "ebony", "flint", "garnet", "hazel", "indigo", "jade", "khaki",
                "lilac", "maple", "nickel", "olive", "pearl", "quartz", "ruby", "sable", "teal", "umber", "velvet",
                "walnut", "xenon", "yarrow", "zinc", "cobalt", "coral", "ivory", "onyx", "saffron", "topaz")
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u")
MAX_LEN = 18


@dataclass(frozen=True)
class World:
    """Vocabulary and the stored facts ``facts[s, r] = o`` (object indices)."""

    n_subjects: int
    facts: np.ndarray  # (n_subjects, 2) object indices
    names: tuple[str, ...]  # one made-up name per subject (for the text rendering)

    @property
    def n_objects(self) -> int:
        return len(OBJECT_WORDS)

    # token ids
    def sp(self, name: str) -> int:
        return SPECIAL.index(name)

    def rel(self, r: int | np.ndarray) -> int | np.ndarray:
        return len(SPECIAL) + r

    def digit(self, x: int | np.ndarray) -> int | np.ndarray:
        return len(SPECIAL) + 2 + x

    def obj(self, o: int | np.ndarray) -> int | np.ndarray:
        return len(SPECIAL) + 12 + o

    def subj(self, s: int | np.ndarray) -> int | np.ndarray:
        return len(SPECIAL) + 12 + self.n_objects + s

    @property
    def vocab_size(self) -> int:
        return len(SPECIAL) + 12 + self.n_objects + self.n_subjects


def make_world(n_subjects: int, rng: np.random.Generator) -> World:
    """``n_subjects`` subjects with distinct made-up names and random objects for both relations."""
    if n_subjects < 2:
        raise ValueError(f"need at least 2 subjects, got {n_subjects}")
    names: list[str] = []
    while len(names) < n_subjects:
        n = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(3)).capitalize()
        if n not in names:
            names.append(n)
    facts = rng.integers(0, len(OBJECT_WORDS), size=(n_subjects, 2))
    return World(n_subjects, facts, tuple(names))


def _pad(rows: np.ndarray) -> np.ndarray:
    out = np.zeros((rows.shape[0], MAX_LEN), dtype=np.int64)
    out[:, : rows.shape[1]] = rows
    return out


def fact_seqs(w: World, s: np.ndarray, r: np.ndarray, o: np.ndarray) -> tuple[np.ndarray, int]:
    """``BOS Q s r -> o EOS`` rows and the index where the answer starts (5)."""
    n = len(s)
    col = lambda v: np.full(n, v) if np.isscalar(v) else v  # noqa: E731
    rows = np.stack([col(w.sp("BOS")), col(w.sp("Q")), w.subj(s), w.rel(r), col(w.sp("->")), w.obj(o),
                     col(w.sp("EOS"))], 1)
    return rows, 5


def context_seqs(w: World, cs: np.ndarray, cr: np.ndarray, co: np.ndarray, s: np.ndarray, r: np.ndarray,
                 ans: np.ndarray) -> tuple[np.ndarray, int]:
    """``BOS CTX s' r' o' ; Q s r -> ans EOS`` rows and the answer index (10)."""
    n = len(s)
    c = lambda v: np.full(n, v)  # noqa: E731
    rows = np.stack([c(w.sp("BOS")), c(w.sp("CTX")), w.subj(cs), w.rel(cr), w.obj(co), c(w.sp(";")), c(w.sp("Q")),
                     w.subj(s), w.rel(r), c(w.sp("->")), w.obj(ans), c(w.sp("EOS"))], 1)
    return rows, 10


def reasoning_seqs(w: World, ops: np.ndarray) -> tuple[np.ndarray, int]:
    """``BOS a + b + c + d = p1 p2 p3 EOS`` rows (running sums mod 10) and the answer index (9)."""
    n = ops.shape[0]
    c = lambda v: np.full(n, v)  # noqa: E731
    sums = np.cumsum(ops, 1)[:, 1:] % 10
    rows = np.stack([c(w.sp("BOS")), w.digit(ops[:, 0]), c(w.sp("+")), w.digit(ops[:, 1]), c(w.sp("+")),
                     w.digit(ops[:, 2]), c(w.sp("+")), w.digit(ops[:, 3]), c(w.sp("=")), w.digit(sums[:, 0]),
                     w.digit(sums[:, 1]), w.digit(sums[:, 2]), c(w.sp("EOS"))], 1)
    return rows, 9


def random_contexts(w: World, n: int, rng: np.random.Generator, facts: np.ndarray | None = None,
                    relevant: bool | None = None) -> np.ndarray:
    """Context sequences: half relevant (new object ≠ stored), half irrelevant (1/3 same subject, other relation;
    2/3 another subject); ``relevant`` forces one kind. ``facts`` overrides the stored facts (after edits)."""
    facts = w.facts if facts is None else facts
    s, r = rng.integers(0, w.n_subjects, n), rng.integers(0, 2, n)
    rel = rng.random(n) < 0.5 if relevant is None else np.full(n, relevant)
    same = rng.random(n) < 1 / 3
    other = (s + rng.integers(1, w.n_subjects, n)) % w.n_subjects
    cs = np.where(rel | same, s, other)
    cr = np.where(rel, r, np.where(same, 1 - r, rng.integers(0, 2, n)))
    new = (facts[s, r] + rng.integers(1, w.n_objects, n)) % w.n_objects
    co = np.where(rel, new, facts[cs, cr])
    ans = np.where(rel, new, facts[s, r])
    return context_seqs(w, cs, cr, co, s, r, ans)[0]


def training_batch(w: World, n: int, mix: tuple[float, float, float], rng: np.random.Generator,
                   device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """A padded batch (``(n, MAX_LEN)`` tokens) and its loss mask (True on answer-and-EOS targets, aligned with
    the *input* position that predicts them), with fixed counts of facts / reasoning / context."""
    counts = np.floor(np.asarray(mix) / np.sum(mix) * n).astype(int)
    counts[1] += n - counts.sum()
    parts, masks = [], []
    s, r = rng.integers(0, w.n_subjects, counts[0]), rng.integers(0, 2, counts[0])
    f, fa = fact_seqs(w, s, r, w.facts[s, r])
    g, ga = reasoning_seqs(w, rng.integers(0, 10, (counts[1], 4)))
    c = random_contexts(w, counts[2], rng)
    for rows, a in ((f, fa), (g, ga), (c, 10)):
        parts.append(_pad(rows))
        m = np.zeros((rows.shape[0], MAX_LEN), dtype=bool)
        m[:, a - 1: rows.shape[1] - 1] = True  # position t predicts token t+1
        masks.append(m)
    tok = torch.as_tensor(np.concatenate(parts), device=device)
    return tok, torch.as_tensor(np.concatenate(masks), device=device)


def covariance_batch(w: World, n: int, rng: np.random.Generator, with_reasoning: bool,
                     device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Text for the key statistics C: the training mix (``with_reasoning``) or facts and contexts only (the
    analogue of ROME's generic-text statistics, which do not cover the tested skill). Returns tokens and a
    non-pad mask."""
    mix = (0.3, 0.45, 0.25) if with_reasoning else (0.55, 0.0, 0.45)
    tok, _ = training_batch(w, n, mix, rng, device)
    return tok, tok != w.sp("PAD")


@torch.no_grad()
def greedy(model: torch.nn.Module, prompts: Tensor, n_new: int) -> Tensor:
    """Greedy decoding of ``n_new`` tokens after equal-length prompts ``(B, L)``."""
    x = prompts
    for _ in range(n_new):
        nxt = model(x)[:, -1].argmax(-1, keepdim=True)
        x = torch.cat([x, nxt], 1)
    return x[:, prompts.shape[1]:]


def render(w: World, row: np.ndarray | list[int]) -> str:
    """Text of a token row (names and words), for the retrieval embedder."""
    words = []
    for t in row:
        t = int(t)
        if t < len(SPECIAL):
            if SPECIAL[t] in ("PAD", "BOS", "EOS", "Q", "CTX", "->"):
                continue
            words.append(SPECIAL[t])
        elif t < len(SPECIAL) + 2:
            words.append(RELATIONS[t - len(SPECIAL)])
        elif t < len(SPECIAL) + 12:
            words.append(str(t - len(SPECIAL) - 2))
        elif t < len(SPECIAL) + 12 + w.n_objects:
            words.append(OBJECT_WORDS[t - len(SPECIAL) - 12])
        else:
            words.append(w.names[t - len(SPECIAL) - 12 - w.n_objects])
    return " ".join(words)
