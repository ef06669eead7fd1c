"""Named seed streams: every random draw of a run takes its seed from the run's seed and a name, never from an
offset such as ``seed + 1``.

An offset collides with the run's other seeds: seed ``s``'s ``s + 1`` stream is seed ``s + 1``'s own, so two
replicates share draws, and adding a stream can shift another. A named stream is a child of the run's seed in
NumPy's :class:`~numpy.random.SeedSequence` tree (its ``spawn_key`` is the name's CRC-32 and the indices), so
streams of one seed are independent of each other and of every other seed's, and a new name changes no existing
stream. The notebooks call it as ``run.seed_for("eval")`` (:meth:`repro.runtime.Run.seed_for`); the library as
``derive(seed, "eval")``.

Users: every paper module that draws more than one stream from one seed (``cds.llm``, ``d3llm.experiment``,
``gdro.experiment``, ``lmo.experiment``, ``meta_marl.experiment``, ``scale_ps.experiment``, ``spreading``,
``tsmcts.experiment``) and :class:`repro.runtime.Run`.
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["derive"]

_WORD = 2**32


def derive(seed: int, name: str, *index: int, bits: int = 63) -> int:
    """The seed of stream ``name`` (and, for a family of streams, ``index``) of the run seeded with ``seed``: a
    non-negative int below ``2**bits``. The default, 63 bits, suits ``torch.manual_seed``,
    ``torch.Generator.manual_seed`` and ``np.random.default_rng``; ``bits=32`` (the top 32 of the same 64-bit
    state) suits the APIs that take no more, scikit-learn's ``random_state`` and ``np.random.RandomState``.
    Deterministic across machines and Python versions (CRC-32 rather than the salted ``hash``);
    ``derive(s, "a", 0)`` differs from ``derive(s, "a")``, since the key's length counts."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if bits not in (32, 63):
        raise ValueError(f"stream {name!r}: bits must be 32 or 63, got {bits!r}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a seed stream needs a non-empty name, got {name!r}")
    bad = [i for i in index if isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < _WORD]
    if bad:
        raise ValueError(f"stream {name!r}: indices must be ints in [0, 2**32), got {bad}")
    key = (zlib.crc32(name.encode()), *(int(i) for i in index))
    state = np.random.SeedSequence(int(seed), spawn_key=key).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(64 - bits))
