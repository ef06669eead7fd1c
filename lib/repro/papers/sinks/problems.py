"""Data of paper 10's notebook: a few short offline English texts (for the pretrained model) and the
Bigram-Backcopy task (for the small models trained from scratch).

* :data:`TEXTS`: six short paragraphs on unrelated topics, written for this book (no source, no licence
  attached). Short on purpose: one forward pass per text and condition keeps quick mode within its budget on a CPU.
* :func:`stdlib_docstrings`: a second, independent text set that ships with every Python, the module docstrings of
  the standard-library modules :data:`DOC_MODULES` (read from their source files with :mod:`ast`, nothing is
  imported or downloaded). None of them is one of the five docstrings the spec's prototype measured (``json.dumps``,
  ``collections.OrderedDict``, ``statistics.median``, ``os.path.join``, ``str.split``), on which the thresholds
  were set. Their wording can change between Python versions (3.11 here).
* :class:`BigramBackcopy` (after Guo et al. 2024, "Active-dormant attention heads", where a small transformer
  trained on it develops an attention sink on the first token, a small sink value and a massive residual
  activation): sequences start with a ``<bos>`` token; every next token follows a fixed random bigram table,
  except after a *trigger* token, where it copies the token just before the trigger. An attention head that
  does the copy is needed after triggers only, and must do nothing elsewhere: the pressure that makes sinks.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["DOC_MODULES", "TEXTS", "BigramBackcopy", "bigram_backcopy", "stdlib_docstrings"]

Tensor = torch.Tensor

TEXTS: tuple[str, ...] = (
    "The old stone bridge crosses the river where the valley narrows. It was built by farmers who needed a way "
    "to bring their grain to the market town, and for two hundred years carts and cattle have worn a groove into "
    "its paving. In spring the water rises almost to the arches, and children lean over the wall to watch it.",
    "To make a simple bread, mix flour, water, salt and a little yeast in a large bowl. Knead the dough for ten "
    "minutes until it is smooth, then cover it and let it rise in a warm place for an hour. Shape it into a loaf, "
    "bake it in a hot oven for forty minutes, and let it cool before you cut it.",
    "A function that sorts a list should not change the list it was given unless the caller asks for that. "
    "Returning a new sorted copy is safer, because other parts of the program may still hold a reference to the "
    "original order. Tests should check both the result and that the input was left alone.",
    "Dear Anna, thank you for the letter and the photographs from your trip to the coast. The weather here has "
    "been cold and grey for weeks, so your pictures of the sea and the bright houses made my whole day. I hope we "
    "can meet again before the summer ends. With love, your cousin Paul.",
    "Bees visit thousands of flowers in a single day. They carry pollen from one plant to the next, which allows "
    "many fruits and vegetables to grow. When a bee finds a good field, it returns to the hive and performs a "
    "short dance that tells the other bees the direction and the distance of the food.",
    "The committee met on Tuesday to discuss the new budget for the library. Most members agreed that the "
    "opening hours should be longer in the evening, when students have finished their classes. The final "
    "decision was postponed until the next meeting, after the costs have been checked.",
)

# Standard-library modules whose docstring is mostly prose of at least ~60 words (fixed before any run; sorted).
DOC_MODULES: tuple[str, ...] = (
    "cmd", "doctest", "gettext", "heapq", "inspect", "locale", "pydoc", "sched", "shelve", "sqlite3", "subprocess",
    "tempfile", "timeit", "typing", "unittest", "uuid",
)


def stdlib_docstrings(names: Sequence[str] = DOC_MODULES) -> tuple[str, ...]:
    """The module docstrings of the standard-library modules ``names``, whitespace collapsed to single spaces,
    read from each module's source file with :func:`ast.get_docstring` (the modules are not imported)."""
    out = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            raise ValueError(f"{name!r} is not a pure-Python standard-library module here")
        doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8")))
        if not doc:
            raise ValueError(f"module {name!r} has no docstring")
        out.append(" ".join(doc.split()))
    return tuple(out)


@dataclass(frozen=True)
class BigramBackcopy:
    """A Bigram-Backcopy source: ``vocab`` tokens, of which ``0`` is ``<bos>`` (only ever first), the ids
    ``1..n_triggers`` are triggers, and ``transition[a]`` is the next-token distribution after a normal token
    ``a`` (never ``<bos>``)."""

    transition: Tensor  # (vocab, vocab) rows sum to 1, column 0 is 0
    n_triggers: int

    @property
    def vocab(self) -> int:
        return int(self.transition.shape[0])

    @property
    def bos(self) -> int:
        return 0

    def is_trigger(self, tokens: Tensor) -> Tensor:
        """Which tokens are triggers."""
        return (tokens >= 1) & (tokens <= self.n_triggers)

    def sample(self, batch: int, length: int, generator: torch.Generator) -> Tensor:
        """``(batch, length)`` token ids: ``<bos>``, a first token drawn from the bigram row of ``<bos>``, then
        for each position the copy rule after a trigger (unless the trigger follows ``<bos>``), the bigram table
        otherwise (batched over rows; the loop runs over positions only)."""
        if batch < 1 or length < 3:
            raise ValueError(f"need batch >= 1 and length >= 3, got batch={batch}, length={length}")
        dev = self.transition.device
        out = torch.empty(batch, length, dtype=torch.long, device=dev)
        out[:, 0] = self.bos
        out[:, 1] = torch.multinomial(self.transition[self.bos].expand(batch, -1), 1, generator=generator)[:, 0]
        for t in range(2, length):
            prev = out[:, t - 1]
            bigram = torch.multinomial(self.transition[prev], 1, generator=generator)[:, 0]
            back = out[:, t - 2]
            copy = self.is_trigger(prev) & (back != self.bos)  # after a trigger: copy the token before it
            out[:, t] = torch.where(copy, back, bigram)
        return out


    def optimal_nll(self, seqs: Tensor) -> float:
        """The mean next-token NLL of the true source on ``seqs`` (targets ``seqs[:, 1:]``): 0 at a copy, the
        bigram surprisal elsewhere. A model has learnt the copy when its loss approaches this."""
        prev, back, nxt = seqs[:, 1:-1], seqs[:, :-2], seqs[:, 2:]
        copy = self.is_trigger(prev) & (back != self.bos)
        p = self.transition[prev, nxt].double()
        first = -torch.log(self.transition[self.bos, seqs[:, 1]].double())
        nll = torch.where(copy, torch.zeros_like(p), -torch.log(p))
        return float(torch.cat([first[:, None], nll], dim=1).mean())


def bigram_backcopy(vocab: int = 32, n_triggers: int = 4, concentration: float = 0.2, trigger_prob: float = 0.2,
                    *, rng: np.random.Generator, device: torch.device | str = "cpu") -> BigramBackcopy:
    """A random Bigram-Backcopy source: after any token, the next is a trigger with probability ``trigger_prob``
    (uniform over the triggers; frequent triggers make the copy matter, as Guo et al.'s triggers are frequent
    tokens), else a normal token drawn from a row that is Dirichlet(``concentration``) over the normal tokens
    (small concentration: peaked rows, so the bigram part is learnable). The table is drawn
    from ``rng``; sequences are drawn later with a torch generator (:meth:`BigramBackcopy.sample`)."""
    if vocab < n_triggers + 3 or n_triggers < 1 or concentration <= 0 or not 0 <= trigger_prob < 1:
        raise ValueError(f"need vocab >= n_triggers + 3, n_triggers >= 1, concentration > 0, trigger_prob in "
                         f"[0, 1); got {vocab}, {n_triggers}, {concentration}, {trigger_prob}")
    normal = rng.dirichlet(np.full(vocab - 1 - n_triggers, float(concentration)), size=vocab)
    trig = np.full((vocab, n_triggers), trigger_prob / n_triggers)  # triggers: frequent, uniform
    rows = torch.as_tensor(np.concatenate([trig, (1 - trigger_prob) * normal], axis=1))
    transition = torch.cat([torch.zeros(vocab, 1, dtype=torch.float64), rows], dim=1).float()
    return BigramBackcopy(transition=transition.to(device), n_triggers=n_triggers)
