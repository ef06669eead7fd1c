"""Data for paper 02: a pool of generated worked word problems (the CDS demo pool) and the toy in-context task.

* :func:`word_problems`: multi-step arithmetic word problems with worked chain-of-thought solutions, six templates
  (rate, percent, sums, rectangle perimeter/area, clock arithmetic, unit conversion) at three difficulty levels, each
  written as the repo's demo text ``"Problem:\\n{problem}\\nSolution:\\n{solution}"``. They stand in for the MATH
  subtasks of the paper (no dataset is downloaded); the templates give natural concept clusters.
* :func:`embed_texts`: L2-normalised sentence embeddings, all-MiniLM-L6-v2 (:func:`repro.common.assets.load_minilm`,
  the offline stand-in for the paper's bge-m3) or a TF-IDF + truncated-SVD fallback (scikit-learn).
* :func:`affine_tasks` / :func:`demo_tokens`: the toy learner's latent task ``y = (a x + b) mod p`` with hidden
  ``a, b``; a chain-of-thought demo is the tokens ``x t y ;`` with ``t = a x mod p``, a direct demo ``x y ;``.
* :func:`arithmetic_problems`: 1-2 digit arithmetic word problems (add, subtract, multiply, divide, add-then-subtract)
  with a one- or two-step chain of thought ending "The answer is N." (the SmolLM2 tier, :mod:`.llm`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "ARITH_OPS", "TEMPLATES", "ArithmeticSet", "ProblemPool", "ToyFormat", "affine_tasks", "arithmetic_problems",
    "demo_tokens", "embed_texts", "gaussian_pools", "word_problems",
]

Tensor = torch.Tensor
TEMPLATES = ("rate", "percent", "sums", "rectangle", "clock", "units")
NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun")
ITEMS = ("apples", "books", "marbles", "stamps", "cards", "shells")


def _rate(r: np.random.Generator, level: int) -> tuple[str, str]:
    v, h = int(r.integers(20, 90)), int(r.integers(2, 6 + 2 * level))
    extra = int(r.integers(5, 40)) * (level > 0)
    q = f"A train travels at {v} km per hour for {h} hours" + (f", then {extra} km more" if extra else "") + \
        ". How far does it travel in total?"
    steps = [f"Distance = speed x time = {v} x {h} = {v * h} km."]
    if extra:
        steps.append(f"Add the extra {extra} km: {v * h} + {extra} = {v * h + extra} km.")
    if level == 2:
        steps.append(f"Average speed over {h} hours is {(v * h + extra) / h:.1f} km per hour.")
    return q, " ".join(steps) + f" The answer is {v * h + extra}."


def _percent(r: np.random.Generator, level: int) -> tuple[str, str]:
    price, pct = int(r.integers(2, 30)) * 10, int(r.choice([10, 20, 25, 40, 50]))
    q = f"A jacket costs {price} dollars and is on sale for {pct}% off."
    off = price * pct // 100
    steps = [f"The discount is {pct}% of {price} = {off} dollars.", f"Sale price = {price} - {off} = {price - off}."]
    ans = price - off
    if level >= 1:
        tax = int(r.choice([5, 10]))
        q += f" A {tax}% tax is then added."
        ans = round((price - off) * (1 + tax / 100), 2)
        steps.append(f"With {tax}% tax: {price - off} x {1 + tax / 100:.2f} = {ans}.")
    if level == 2:
        steps.append(f"Compared with the full price this saves {price - ans:.2f} dollars.")
    return q + " What is the final price?", " ".join(steps) + f" The answer is {ans}."


def _sums(r: np.random.Generator, level: int) -> tuple[str, str]:
    name, item = NAMES[int(r.integers(len(NAMES)))], ITEMS[int(r.integers(len(ITEMS)))]
    xs = [int(v) for v in r.integers(3, 40, size=2 + level)]
    q = f"{name} collects {item}: " + ", then ".join(str(x) for x in xs) + f" {item} on successive days. " + \
        f"How many {item} does {name} have?"
    run, steps = xs[0], []
    for x in xs[1:]:
        steps.append(f"{run} + {x} = {run + x}.")
        run += x
    return q, "Add the daily amounts step by step: " + " ".join(steps) + f" The answer is {run}."


def _rectangle(r: np.random.Generator, level: int) -> tuple[str, str]:
    w, h = int(r.integers(2, 20)), int(r.integers(2, 20))
    q = f"A rectangle is {w} cm wide and {h} cm tall."
    steps = [f"Perimeter = 2 x ({w} + {h}) = {2 * (w + h)} cm."]
    ans = 2 * (w + h)
    if level >= 1:
        steps.append(f"Area = {w} x {h} = {w * h} square cm.")
        ans = w * h
    if level == 2:
        steps.append(f"The diagonal is sqrt({w}^2 + {h}^2) = {np.hypot(w, h):.2f} cm.")
    ask = ("perimeter", "area", "area")[level]
    return q + f" What is its {ask}?", " ".join(steps) + f" The answer is {ans}."


def _clock(r: np.random.Generator, level: int) -> tuple[str, str]:
    start, add = int(r.integers(1, 13)), int(r.integers(5, 30 + 40 * level))
    q = f"It is {start} o'clock now. What time will the clock show after {add} hours?"
    steps = [f"Add the hours: {start} + {add} = {start + add}.",
             f"Reduce modulo 12: {start + add} mod 12 = {(start + add) % 12}."]
    ans = (start + add) % 12 or 12
    if (start + add) % 12 == 0:
        steps.append("A remainder of 0 reads as 12 on the clock.")
    if level == 2:
        steps.append(f"That is {(start + add) // 12} full turns of the dial later.")
    return q, " ".join(steps) + f" The answer is {ans}."


def _units(r: np.random.Generator, level: int) -> tuple[str, str]:
    m = int(r.integers(2, 60))
    q = f"A rope is {m} meters long."
    steps = [f"One meter is 100 cm, so {m} m = {m} x 100 = {m * 100} cm."]
    ans = m * 100
    if level >= 1:
        cut = int(r.integers(10, 99))
        q += f" A piece of {cut} cm is cut off."
        steps.append(f"Remove the piece: {m * 100} - {cut} = {m * 100 - cut} cm.")
        ans = m * 100 - cut
    if level == 2:
        steps.append(f"In millimeters that is {ans} x 10 = {ans * 10} mm.")
        ans *= 10
    unit = ("centimeters", "centimeters", "millimeters")[level]
    return q + f" How long is the rest in {unit}?", " ".join(steps) + f" The answer is {ans}."


_MAKERS = dict(rate=_rate, percent=_percent, sums=_sums, rectangle=_rectangle, clock=_clock, units=_units)


@dataclass(frozen=True)
class ProblemPool:
    """Worked problems: ``texts[i]`` (``"Problem:...\\nSolution:..."``), ``template[i]`` (index into
    :data:`TEMPLATES`) and ``level[i]`` (0..2)."""

    texts: list[str]
    template: np.ndarray
    level: np.ndarray


def word_problems(per_cell: int, seed: int = 0) -> ProblemPool:
    """``per_cell`` problems for each of the 6 templates x 3 levels (so ``18 * per_cell`` in all), in a fixed
    order (template-major)."""
    if per_cell < 1:
        raise ValueError(f"per_cell must be >= 1, got {per_cell}")
    r = np.random.default_rng(seed)
    texts, tpl, lvl = [], [], []
    for ti, name in enumerate(TEMPLATES):
        for level in range(3):
            for _ in range(per_cell):
                q, a = _MAKERS[name](r, level)
                texts.append(f"Problem:\n{q}\nSolution:\n{a}")
                tpl.append(ti)
                lvl.append(level)
    return ProblemPool(texts, np.array(tpl), np.array(lvl))


def embed_texts(texts: list[str], backend: str = "minilm", dim: int = 64, seed: int = 0,
                device: str | torch.device = "cpu") -> Tensor:
    """L2-normalised embeddings ``(n, d)`` (float64): ``"minilm"`` (all-MiniLM-L6-v2, d = 384, offline wheel) or
    ``"tfidf"`` (sublinear TF-IDF, truncated SVD to ``dim``, scikit-learn)."""
    if not texts:
        raise ValueError("no texts to embed")
    if backend == "minilm":
        from repro.common.assets import load_minilm

        return load_minilm(device)(texts).to(torch.float64)
    if backend == "tfidf":
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfVectorizer

        X = TfidfVectorizer(sublinear_tf=True).fit_transform(texts)
        Z = TruncatedSVD(n_components=min(dim, X.shape[1] - 1), random_state=seed).fit_transform(X)
        Z = torch.as_tensor(Z, dtype=torch.float64, device=device)
        return Z / Z.norm(dim=1, keepdim=True).clamp_min(1e-12)
    raise ValueError(f"backend must be 'minilm' or 'tfidf', got {backend!r}")


def gaussian_pools(n_pools: int, n: int, d: int, seed: int = 0, device: str | torch.device = "cpu") -> Tensor:
    """Unclustered control: ``(n_pools, n, d)`` i.i.d. Gaussian points, L2-normalised."""
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(n_pools, n, d, generator=g, dtype=torch.float64).to(device)
    return Z / Z.norm(dim=-1, keepdim=True)


# ---------------------------------------------------------------------------------------------------------------
# The toy in-context task


@dataclass(frozen=True)
class ToyFormat:
    """Token layout of the toy task: residues ``0..p-1``, then ``SEP`` (``;``), ``Q`` (start of the query) and
    ``PAD``; a chain-of-thought demo is ``x t y ;``, a direct demo ``x y ;``."""

    p: int = 5
    cot: bool = True

    @property
    def sep(self) -> int:
        return self.p

    @property
    def vocab(self) -> int:
        return self.p + 3

    @property
    def width(self) -> int:
        """Tokens per demo."""
        return 4 if self.cot else 3


def affine_tasks(n_tasks: int, n_demos: int, p: int, gen: torch.Generator, device: str | torch.device = "cpu",
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """Latent tasks ``a ~ U{1..p-1}``, ``b ~ U{0..p-1}`` and i.i.d. inputs ``x`` ``(n_tasks, n_demos)``."""
    if p < 2 or n_tasks < 1 or n_demos < 1:
        raise ValueError(f"need p >= 2, n_tasks >= 1, n_demos >= 1; got p={p}, {n_tasks}, {n_demos}")
    a = torch.randint(1, p, (n_tasks, 1), generator=gen)
    b = torch.randint(0, p, (n_tasks, 1), generator=gen)
    x = torch.randint(0, p, (n_tasks, n_demos), generator=gen)
    return a.to(device), b.to(device), x.to(device)


def demo_tokens(fmt: ToyFormat, a: Tensor, b: Tensor, x: Tensor) -> Tensor:
    """Tokens ``(n_tasks, n_demos * width)`` of the demos: ``x t y ;`` (CoT, ``t = a x mod p``, ``y = (t + b) mod
    p``) or ``x y ;`` (direct)."""
    t = (a * x) % fmt.p
    y = (t + b) % fmt.p
    sep = torch.full_like(x, fmt.sep)
    parts = (x, t, y, sep) if fmt.cot else (x, y, sep)
    return torch.stack(parts, -1).flatten(-2)


# ---------------------------------------------------------------------------------------------------------------
# Simple arithmetic word problems for the SmolLM2 tier (full mode)

ARITH_OPS = ("add", "sub", "mul", "div", "two_step")


def _arith(r: np.random.Generator, op: str) -> tuple[str, str, int]:
    """One 1-2 digit arithmetic word problem of kind ``op``: (question, short CoT ending "The answer is N.", N)."""
    name, item = NAMES[int(r.integers(len(NAMES)))], ITEMS[int(r.integers(len(ITEMS)))]
    if op == "add":
        a, b = int(r.integers(10, 60)), int(r.integers(2, 40))
        q = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
        steps, ans = [f"{a} + {b} = {a + b}."], a + b
    elif op == "sub":
        a = int(r.integers(20, 99))
        b = int(r.integers(2, a))
        q = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
        steps, ans = [f"{a} - {b} = {a - b}."], a - b
    elif op == "mul":
        a, b = int(r.integers(2, 10)), int(r.integers(2, 13))
        q = f"{name} buys {a} boxes with {b} {item} in each box. How many {item} does {name} buy?"
        steps, ans = [f"{a} * {b} = {a * b}."], a * b
    elif op == "div":
        a, b = int(r.integers(2, 10)), int(r.integers(2, 12))  # a * b <= 99
        q = f"{name} shares {a * b} {item} equally among {a} friends. How many {item} does each friend get?"
        steps, ans = [f"{a * b} / {a} = {b}."], b
    elif op == "two_step":
        a, b = int(r.integers(10, 50)), int(r.integers(2, 30))
        c = int(r.integers(2, a + b))
        q = f"{name} has {a} {item}, gets {b} more and then gives away {c}. How many {item} are left?"
        steps, ans = [f"{a} + {b} = {a + b}.", f"{a + b} - {c} = {a + b - c}."], a + b - c
    else:
        raise ValueError(f"op must be one of {ARITH_OPS}, got {op!r}")
    return q, " ".join(steps) + f" The answer is {ans}.", ans


@dataclass(frozen=True)
class ArithmeticSet:
    """Arithmetic word problems: ``questions[i]``, its short chain of thought ``solutions[i]`` (ending "The answer
    is N."), the integer ``answers[i]`` and the kind ``op[i]`` (index into :data:`ARITH_OPS`)."""

    questions: list[str]
    solutions: list[str]
    answers: np.ndarray
    op: np.ndarray

    def __len__(self) -> int:
        return len(self.questions)

    @property
    def texts(self) -> list[str]:
        """The demos as the repo writes them, ``"Problem:\\n{problem}\\nSolution:\\n{solution}"`` (to embed)."""
        return [f"Problem:\n{q}\nSolution:\n{s}" for q, s in zip(self.questions, self.solutions, strict=True)]


def arithmetic_problems(n: int, seed: int = 0, exclude: ArithmeticSet | None = None) -> ArithmeticSet:
    """``n`` distinct 1-2 digit arithmetic word problems (add, subtract, multiply, divide, add-then-subtract; the
    kind drawn uniformly per problem), each with a one- or two-step chain of thought. Questions of ``exclude``
    (e.g. the demo pool, when drawing test questions) are never drawn."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    r = np.random.default_rng(seed)
    seen = set(exclude.questions) if exclude is not None else set()
    qs, ss, ans, ops = [], [], [], []
    for _ in range(100 * n):  # the template space holds > 10^5 questions, so this never runs dry for our sizes
        if len(qs) == n:
            break
        o = int(r.integers(len(ARITH_OPS)))
        q, s, a = _arith(r, ARITH_OPS[o])
        if q in seen:
            continue
        seen.add(q)
        qs.append(q)
        ss.append(s)
        ans.append(a)
        ops.append(o)
    if len(qs) < n:
        raise ValueError(f"could only draw {len(qs)} distinct problems of the {n} asked")
    return ArithmeticSet(qs, ss, np.array(ans), np.array(ops))
