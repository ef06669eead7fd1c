"""A real, lossless octree codec: points -> bytes -> points, entropy-coded with ANS (``constriction``).

Paper 09 (PACE, Zhu et al., ICML 2026): the stream layout, the stage schedule and the 16-bit frequency rule follow
the public code (``3dpcc/PACE``, ``utils/helper.py``); the ANS coder is ``constriction``'s ``AnsCoder`` rather than
the authors' C++ rANS. Notebook: ``notebooks/09-pace-lidar.ipynb``.

Stream = header + payload::

    magic "PACE" | version u8 | model kind u8 | mode 8 bytes | depth u8 | model fingerprint 8 bytes |
    grid origin 3×f64, size f64 | input points u32 | leaves u32 | coded symbols u32 | root byte u8 |
    payload words u32 | CRC-32 of all of the above and the payload u32 || payload: ANS words (u32, little-endian)

Levels 1..L−1 are coded in order; within a level the model's session fixes the steps (one for fully parallel
models, ``k`` for ``k`` stages, ``W`` for autoregressive decoding). The encoder computes every pmf exactly as the
decoder will (same calls, same inputs: the symbols known at that step, the pad symbol elsewhere), so the streams
decode bit-exactly. Each pmf is turned into integer frequencies by PACE's rule ``floor(p·(2^16 − 255)) + 1``
(every symbol ≥ 1); the leftover mass goes to the most likely symbol so the table sums to exactly 2^16.

The decoder pops each step's symbols in blocks of :data:`TABLE_ROWS` nodes (pmf → table → ANS, block after block:
the tables are per row, so the pops are those of one call per step); ``decode_quantized(..., timings=d)`` splits its
time by phase (:data:`PHASES`) for the benchmark's breakdown (``benchmarks/bench_pace.py``).

A damaged stream raises :class:`CorruptStream` (a ``ValueError``): wrong magic/version/lengths/CRC, a model that
does not match the stream's fingerprint (weights, configuration and dtype), counts beyond the limits or
inconsistent with the decoded tree, or ANS words left over. Decoding work is bounded by the header's symbol
count, itself capped by :data:`MAX_SYMBOLS`.
"""

from __future__ import annotations

import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import constriction
import numpy as np

from ...common.timing import sync
from .model import probabilities
from .octree import (
    MAX_DEPTH,
    N_SYMBOLS,
    PAD_SYMBOL,
    Grid,
    build_octree,
    dequantize,
    expand,
    level_context,
    morton_decode,
    quantize,
)

__all__ = [
    "CorruptStream", "Encoded", "decode", "decode_level", "decode_quantized", "encode", "encode_detailed",
    "encode_level", "pmf_to_freq",
]

MAGIC = b"PACE"
VERSION = 1
KINDS = {"pace": 1, "coupled": 2, "mlp": 3, "table": 4, "two-group": 5}
PRECISION = 16
TOTAL = 1 << PRECISION
MAX_SYMBOLS = 1 << 26
DEFAULT_HALF_SIZE = 128.0
_HEAD = struct.Struct("<4sBB8sB8s4dIIIBI")
_CRC = struct.Struct("<I")
HEADER_BYTES = _HEAD.size + _CRC.size


class CorruptStream(ValueError):
    """The byte stream is not a valid PACE stream for this model."""


def pmf_to_freq(pmf: np.ndarray) -> np.ndarray:
    """PACE's 16-bit frequency rule: ``floor(p · (2^16 − 255)) + 1`` per symbol (so every symbol has frequency
    ≥ 1), the leftover ``2^16 − Σ`` added to the most likely symbol; rows sum to exactly 2^16. (M, 255) int64.
    The codec applies the same rule (:func:`freq_table`) to the pmfs of its models, without these checks."""
    p = np.asarray(pmf, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] != N_SYMBOLS:
        raise ValueError(f"pmf must have shape (M, {N_SYMBOLS}), got {p.shape}")
    if not np.isfinite(p).all() or (p < 0).any():
        raise ValueError("pmf has negative or non-finite entries")
    if len(p) and np.abs(p.sum(1) - 1).max() > 1e-6:
        raise ValueError("pmf rows must sum to 1")
    return freq_table(p).astype(np.int64)


def freq_table(p: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """:func:`pmf_to_freq`'s rule on float64 pmfs (M, 255), computed in float64: its integers are exact (< 2^17),
    so the table is the int64 one number for number, in the dtype constriction takes. ``out`` (e.g. ``p`` itself,
    when its pmfs are no longer needed) receives the table, else a new array. Row by row only (a row's table never
    depends on another row), so tables computed in blocks of rows are the same."""
    top = p.argmax(1)  # the first most likely symbol
    f = np.multiply(p, float(TOTAL - N_SYMBOLS), out=out)
    np.floor(f, out=f)
    f += 1
    leftover = TOTAL - f.sum(1)
    if not np.isfinite(leftover).all():
        raise ValueError("pmf has non-finite entries")
    f[np.arange(len(f)), top] += leftover
    return f


def _family() -> Any:
    return constriction.stream.model.Categorical(perfect=False)


@dataclass
class Encoded:
    """A stream and what it cost: ``bits_model`` is the model's cross-entropy of the coded symbols under the
    integer tables actually used (the physical limit for this model), ``bits_float`` under its float pmfs;
    ``level_bits[d]`` / ``level_symbols[d]`` per coded level ``d = 1..L−1``."""

    data: bytes
    n_points: int
    n_leaves: int
    n_symbols: int
    bits_model: float
    bits_float: float
    level_bits: dict[int, float] = field(default_factory=dict)
    level_symbols: dict[int, int] = field(default_factory=dict)

    @property
    def payload_bits(self) -> int:
        return 8 * (len(self.data) - HEADER_BYTES)

    @property
    def bpp(self) -> float:
        """Bits of the whole stream (header included) per input point."""
        return 8 * len(self.data) / self.n_points


def _kind(model: Any) -> int:
    kind = getattr(model, "kind", None)
    if kind not in KINDS:
        raise ValueError(f"not an entropy model of repro.papers.pace.model: {type(model).__name__}")
    return KINDS[kind]


def _mode_bytes(mode: str) -> bytes:
    if not isinstance(mode, str) or not mode.isascii() or not 0 < len(mode) <= 8:
        raise ValueError(f"mode must be a short ASCII string, got {mode!r}")
    return mode.encode().ljust(8, b"\0")


def encode_detailed(points: np.ndarray, model: Any, depth: int, mode: str = "fp", *,
                    grid: Grid | None = None) -> Encoded:
    """Encode ``points`` (N, 3) at ``depth`` with ``model`` in ``mode``; see :class:`Encoded`."""
    kind = _kind(model)
    mode_b = _mode_bytes(mode)
    grid = Grid.centred(DEFAULT_HALF_SIZE, depth) if grid is None else grid.at_depth(depth)
    pts = np.asarray(points)
    if pts.ndim != 2 or pts.shape[1] != 3 or len(pts) == 0:
        raise ValueError(f"points must be a non-empty (N, 3) array, got shape {pts.shape}")
    if len(pts) >= 2**32:
        raise ValueError("too many points for one stream")
    tree = build_octree(quantize(pts, grid), depth)
    if tree.n_symbols > MAX_SYMBOLS:
        raise ValueError(f"{tree.n_symbols} symbols exceed the stream limit {MAX_SYMBOLS}")
    chunks: list[tuple[np.ndarray, np.ndarray]] = []
    level_bits: dict[int, float] = {}
    level_symbols: dict[int, int] = {}
    bits_float = 0.0
    for level in range(1, depth):
        tokens, xyz = level_context(tree.codes, tree.occupancy, level)
        sym = tree.symbols(level)
        level_chunks, bits_q, bits_f = _model_level(model, tokens, xyz, sym, mode)
        chunks += level_chunks
        level_bits[level], level_symbols[level] = bits_q, len(sym)
        bits_float += bits_f
    payload = _push(chunks).astype("<u4").tobytes()
    head = _HEAD.pack(MAGIC, VERSION, kind, mode_b, depth, model.fingerprint(), *grid.origin, grid.size,
                      len(pts), len(tree.codes[-1]), tree.n_symbols, int(tree.occupancy[0][0]), len(payload) // 4)
    crc = zlib.crc32(payload, zlib.crc32(head))
    return Encoded(data=head + _CRC.pack(crc) + payload, n_points=len(pts), n_leaves=len(tree.codes[-1]),
                   n_symbols=tree.n_symbols, bits_model=float(sum(level_bits.values())), bits_float=bits_float,
                   level_bits=level_bits, level_symbols=level_symbols)


def encode(points: np.ndarray, model: Any, depth: int, mode: str = "fp", *, grid: Grid | None = None) -> bytes:
    """Encode a point cloud into bytes (see the module docstring for the stream layout)."""
    return encode_detailed(points, model, depth, mode, grid=grid).data


@dataclass(frozen=True)
class Header:
    kind: int
    mode: str
    depth: int
    fingerprint: bytes
    grid: Grid
    n_points: int
    n_leaves: int
    n_symbols: int
    root: int


def read_header(data: bytes) -> tuple[Header, np.ndarray]:
    """Parse and validate the header (lengths, magic, version, CRC, ranges); return it and the payload words."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < HEADER_BYTES:
        raise CorruptStream(f"truncated stream: {len(data)} bytes, the header alone has {HEADER_BYTES}")
    fields = _HEAD.unpack_from(data)
    magic, version, kind, mode_b, depth, fp = fields[:6]
    origin, size = fields[6:9], fields[9]
    n_points, n_leaves, n_symbols, root, n_words = fields[10:]
    if magic != MAGIC:
        raise CorruptStream("not a PACE stream (bad magic)")
    if version != VERSION:
        raise CorruptStream(f"unsupported stream version {version} (this decoder reads {VERSION})")
    if len(data) != HEADER_BYTES + 4 * n_words:
        raise CorruptStream(f"stream length {len(data)} does not match the header ({HEADER_BYTES + 4 * n_words}):"
                            " truncated or padded")
    (crc,) = _CRC.unpack_from(data, _HEAD.size)
    payload = data[HEADER_BYTES:]
    if zlib.crc32(payload, zlib.crc32(data[:_HEAD.size])) != crc:
        raise CorruptStream("CRC mismatch: the stream is corrupt")
    if kind not in KINDS.values():
        raise CorruptStream(f"unknown model kind {kind}")
    if not 1 <= depth <= MAX_DEPTH:
        raise CorruptStream(f"depth {depth} outside 1..{MAX_DEPTH}")
    if not 0 < root < 256 or n_symbols > MAX_SYMBOLS or n_leaves > 8 * (n_symbols + 1) or n_leaves < 1:
        raise CorruptStream("header counts out of range")
    if n_leaves > n_points:
        raise CorruptStream("more leaves than input points")
    try:
        mode = mode_b.rstrip(b"\0").decode("ascii")
        grid = Grid(tuple(origin), size, depth)
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptStream(f"bad header field: {e}") from e
    words = np.frombuffer(payload, dtype="<u4").astype(np.uint32)
    return Header(kind, mode, depth, fp, grid, n_points, n_leaves, n_symbols, root), words


PHASES = ("header", "octree", "context", "network", "quantise", "coder", "other")
TABLE_ROWS = 512
"""Rows per frequency-table block in the decoder: pmf → table → ANS pops, block by block (tables are per row, so
the same as whole steps), keeps the float64 temporaries near 1 MB, which the allocator reuses."""


class _Laps:
    """Seconds per decoding phase (:data:`PHASES`), accumulated into ``out`` at each call (the time since the
    previous call goes to the named phase); nothing at all when ``out`` is None. CUDA on ``device`` is synchronised
    at each lap, so that a phase's GPU work is counted in it."""

    def __init__(self, out: dict[str, float] | None, device: Any = None):
        self.out, self.device = out, device
        self.t = time.perf_counter()

    def __call__(self, phase: str) -> None:
        if self.out is None:
            return
        sync(self.device)
        t = time.perf_counter()
        self.out[phase] = self.out.get(phase, 0.0) + t - self.t
        self.t = t


def decode_quantized(data: bytes, model: Any, *, timings: dict[str, float] | None = None) -> tuple[np.ndarray, Grid]:
    """Decode a stream into its integer cells (N, 3) int64, Morton order, and the grid. ``timings``, if given,
    accumulates the seconds spent per phase (:data:`PHASES`: header checks, octree expansion, node contexts, model
    forward, pmf → frequency tables, ANS decoding, the rest) for a breakdown of the decoding time."""
    laps = _Laps(timings, getattr(model, "device", None))
    head, words = read_header(data)
    if head.kind != _kind(model):
        raise CorruptStream(f"stream was coded with a {_kind_name(head.kind)} model, got a {model.kind} model")
    if head.fingerprint != model.fingerprint():
        raise CorruptStream("stream was coded with a different model: weights, configuration or dtype "
                            "(fingerprint mismatch)")
    try:
        coder = constriction.stream.stack.AnsCoder(words)
    except Exception as e:  # constriction rejects e.g. a payload ending in a zero word
        raise CorruptStream(f"invalid ANS payload: {e}") from e
    family = _family()
    codes = [np.zeros(1, dtype=np.uint64)]
    occupancy = [np.array([head.root], dtype=np.uint8)]
    used = 0
    laps("header")
    for level in range(1, head.depth):
        codes.append(expand(codes[-1], occupancy[-1]))
        m = len(codes[-1])
        if used + m > head.n_symbols:
            raise CorruptStream(f"level {level} needs {m} symbols, only {head.n_symbols - used} declared")
        used += m
        laps("octree")
        tokens, xyz = level_context(codes, occupancy, level)
        laps("context")
        known = _decode_level(coder, family, model, tokens, xyz, head.mode, laps)
        occupancy.append((known + 1).astype(np.uint8))
        laps("other")
    leaves = expand(codes[-1], occupancy[-1])
    if used != head.n_symbols or len(leaves) != head.n_leaves:
        raise CorruptStream("decoded octree does not match the header counts")
    if not coder.is_empty():
        raise CorruptStream("ANS payload has data left over after the last symbol")
    cells = morton_decode(leaves)
    laps("octree")
    return cells, head.grid


def _model_level(model: Any, tokens: np.ndarray, xyz: np.ndarray, sym: np.ndarray,
                 mode: str) -> tuple[list[tuple[np.ndarray, np.ndarray]], float, float]:
    """The encoder's pass over one level: ``(symbols, frequency table)`` per decoding step, in decoding order,
    computed exactly as the decoder will; and the code length under the tables and under the float pmfs."""
    session = model.session(tokens, xyz, mode)
    known = np.full(len(sym), PAD_SYMBOL, dtype=np.int64)
    chunks, bits_q, bits_f = [], 0.0, 0.0
    for j, idx in enumerate(session.steps):
        if len(idx) == 0:
            continue
        pmf = probabilities(session.scores(j, known), session.is_logits).numpy()
        freq = freq_table(pmf)
        s = sym[idx]
        rows = np.arange(len(idx))
        bits_q += float(-np.log2(freq[rows, s] / TOTAL).sum())
        bits_f += float(-np.log2(np.maximum(pmf[rows, s], 1e-300)).sum())
        chunks.append((s.astype(np.int32), freq.astype(np.uint32)))
        known[idx] = s
    return chunks, bits_q, bits_f


def _push(chunks: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """ANS-encode the chunks so that they decode in order (ANS is a stack: push the last chunk first)."""
    coder = constriction.stream.stack.AnsCoder()
    family = _family()
    for s, freq in reversed(chunks):
        coder.encode_reverse(s, family, freq.astype(np.float64))
    return coder.get_compressed()


def _decode_level(coder: Any, family: Any, model: Any, tokens: np.ndarray, xyz: np.ndarray, mode: str,
                  laps: _Laps | None = None) -> np.ndarray:
    """The decoder's pass over one level: the same session steps, each step's symbols popped from ``coder`` in
    blocks of :data:`TABLE_ROWS` rows (in order, so the same pops as one call per step)."""
    laps = laps or _Laps(None)
    try:
        session = model.session(tokens, xyz, mode)
    except ValueError as e:
        raise CorruptStream(f"stream mode {mode!r} is not valid for this model: {e}") from e
    known = np.full(len(tokens), PAD_SYMBOL, dtype=np.int64)
    laps("network")
    for j, idx in enumerate(session.steps):
        if len(idx) == 0:
            continue
        scores = session.scores(j, known)
        laps("network")
        for a in range(0, len(idx), TABLE_ROWS):
            p = probabilities(scores[a:a + TABLE_ROWS], session.is_logits).numpy()
            freq = freq_table(p, out=p if session.is_logits else None)  # a softmax's own buffer, else a new one
            laps("quantise")
            known[idx[a:a + TABLE_ROWS]] = coder.decode(family, freq)
            laps("coder")
    return known


def encode_level(model: Any, tokens: np.ndarray, xyz: np.ndarray, sym: np.ndarray, mode: str) -> np.ndarray:
    """ANS words (uint32) of one level (or a slice of whole windows of one level) on its own, for timing a model's
    decoder on identical nodes; see :func:`decode_level`."""
    chunks, _, _ = _model_level(model, tokens, xyz, np.asarray(sym, dtype=np.int64), mode)
    return _push(chunks)


def decode_level(words: np.ndarray, model: Any, tokens: np.ndarray, xyz: np.ndarray, mode: str) -> np.ndarray:
    """Inverse of :func:`encode_level`: the level's symbols (int64)."""
    try:
        coder = constriction.stream.stack.AnsCoder(np.asarray(words, dtype=np.uint32))
    except Exception as e:
        raise CorruptStream(f"invalid ANS payload: {e}") from e
    sym = _decode_level(coder, _family(), model, tokens, xyz, mode)
    if not coder.is_empty():
        raise CorruptStream("ANS payload has data left over after the last symbol")
    return sym


def decode(data: bytes, model: Any) -> np.ndarray:
    """Decode a stream into points (N, 3) float64: the centres of the occupied cells, Morton order."""
    q, grid = decode_quantized(data, model)
    return dequantize(q, grid)


def _kind_name(kind: int) -> str:
    return next((k for k, v in KINDS.items() if v == kind), "?")
