"""Octree serialisation of a quantised point cloud, as in the PACE / OctAttention line of work.

Paper 09 (PACE, Zhu et al., ICML 2026), Sec. 3 (octree context). Notebook: ``notebooks/09-pace-lidar.ipynb``.

* Quantise: a fixed cube (``Grid``: origin, side, depth ``L``) is split into ``2^L`` cells per axis; a point maps to
  the integer cell ``q = floor((p − origin) / step)`` with ``step = side / 2^L`` (a point of ``[origin, origin + side)``
  that rounds up to ``2^L`` gets the last cell; points outside the cube raise). Dequantising returns cell centres.
  Because the cube is fixed, level ``d`` of a depth-``L`` tree is the same spatial partition for every ``L``.
* Morton order: ``code = Σ_b x_b·2^(3b+2) + y_b·2^(3b+1) + z_b·2^(3b)``; the unique codes are sorted. A level-``d``
  node is ``code >> 3(L − d)``; the nodes of a level are in Morton order, which is breadth-first order with
  siblings grouped under their parent.
* Occupancy: node ``n`` at level ``d < L`` has the byte ``Σ_{child octant o} 2^(7 − o)`` (octant = child code & 7,
  so bit 7 is octant 0). Coded symbols are ``occupancy − 1 ∈ {0..254}``; the root byte is stored raw.
* Context of a level-``d`` node (the node whose occupancy is coded): the occupancy symbols of its parent,
  grandparent and great-grandparent (255 = does not exist), its own octant and those of its parent and
  grandparent (8 = does not exist), its level, and its cell centre normalised to [−1, 1].
* Rebuild: expand the occupancy bytes level by level from the root; this is what the decoder does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Grid", "Octree", "build_octree", "dequantize", "level_context", "octree_contexts", "quantize", "rebuild"]

MAX_DEPTH = 21  # 3 · 21 = 63 bits of Morton code
PAD_SYMBOL = 255  # "occupancy unknown / ancestor does not exist" in the 256-entry occupancy embedding
PAD_OCTANT = 8
N_SYMBOLS = 255
CTX_COLUMNS = ("sym_parent", "sym_grandparent", "sym_great_grandparent", "octant", "octant_parent",
               "octant_grandparent", "level")


def _check_depth(depth: int) -> int:
    if not isinstance(depth, int | np.integer) or not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"depth must be an int in [1, {MAX_DEPTH}], got {depth!r}")
    return int(depth)


def _spread(v: np.ndarray) -> np.ndarray:
    """Insert two zero bits between the bits of 21-bit integers (magic-number bit interleaving)."""
    v = v.astype(np.uint64) & np.uint64(0x1FFFFF)
    v = (v | (v << np.uint64(32))) & np.uint64(0x1F00000000FFFF)
    v = (v | (v << np.uint64(16))) & np.uint64(0x1F0000FF0000FF)
    v = (v | (v << np.uint64(8))) & np.uint64(0x100F00F00F00F00F)
    v = (v | (v << np.uint64(4))) & np.uint64(0x10C30C30C30C30C3)
    v = (v | (v << np.uint64(2))) & np.uint64(0x1249249249249249)
    return v


def _compact(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.uint64) & np.uint64(0x1249249249249249)
    v = (v | (v >> np.uint64(2))) & np.uint64(0x10C30C30C30C30C3)
    v = (v | (v >> np.uint64(4))) & np.uint64(0x100F00F00F00F00F)
    v = (v | (v >> np.uint64(8))) & np.uint64(0x1F0000FF0000FF)
    v = (v | (v >> np.uint64(16))) & np.uint64(0x1F00000000FFFF)
    v = (v | (v >> np.uint64(32))) & np.uint64(0x1FFFFF)
    return v


def morton_encode(q: np.ndarray) -> np.ndarray:
    """Morton codes (uint64) of non-negative integer coordinates ``q`` (N, 3), each < 2^21; x is the most
    significant of each bit triple."""
    q = np.asarray(q)
    if q.ndim != 2 or q.shape[1] != 3:
        raise ValueError(f"coordinates must have shape (N, 3), got {q.shape}")
    if len(q) and (q.min() < 0 or q.max() >= 1 << MAX_DEPTH):
        raise ValueError(f"coordinates must lie in [0, 2^{MAX_DEPTH})")
    return (_spread(q[:, 0]) << np.uint64(2)) | (_spread(q[:, 1]) << np.uint64(1)) | _spread(q[:, 2])


def morton_decode(codes: np.ndarray) -> np.ndarray:
    """Inverse of :func:`morton_encode`: (N, 3) int64 coordinates."""
    c = np.asarray(codes, dtype=np.uint64)
    return np.stack([_compact(c >> np.uint64(2)), _compact(c >> np.uint64(1)), _compact(c)], -1).astype(np.int64)


@dataclass(frozen=True)
class Grid:
    """The quantisation cube: corner ``origin`` (3,), edge length ``size`` (metres) and depth ``L``."""

    origin: tuple[float, float, float]
    size: float
    depth: int

    def __post_init__(self) -> None:
        _check_depth(self.depth)
        if not (np.isfinite(self.size) and self.size > 0 and np.all(np.isfinite(self.origin))):
            raise ValueError("grid size must be positive and origin finite")

    @property
    def step(self) -> float:
        return self.size / 2**self.depth

    @classmethod
    def centred(cls, half_size: float, depth: int) -> Grid:
        """The cube ``[−half_size, half_size)^3`` around the sensor."""
        return cls((-half_size, -half_size, -half_size), 2.0 * half_size, depth)

    def at_depth(self, depth: int) -> Grid:
        return Grid(self.origin, self.size, depth)


def quantize(points: np.ndarray, grid: Grid) -> np.ndarray:
    """Integer cell of every point, (N, 3) int64 (duplicates kept). Points outside the cube
    ``[origin, origin + size)`` raise; a point inside it but within rounding of the upper face gets the last cell."""
    p = np.asarray(points, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] != 3:
        raise ValueError(f"points must have shape (N, 3), got {p.shape}")
    if not np.isfinite(p).all():
        raise ValueError("points contain NaN or inf")
    lo = np.asarray(grid.origin, dtype=np.float64)
    if len(p) and ((p < lo) | (p >= lo + grid.size)).any():
        raise ValueError("points lie outside the quantisation cube [origin, origin + size); enlarge Grid.size")
    # a point just below the upper face can round up to cell 2^L in the division: it belongs to the last cell
    q = np.floor((p - lo) / grid.step).astype(np.int64)
    return np.minimum(q, 2**grid.depth - 1)


def dequantize(q: np.ndarray, grid: Grid) -> np.ndarray:
    """Cell centres (N, 3) float64 of integer cells."""
    return np.asarray(grid.origin) + (np.asarray(q, dtype=np.float64) + 0.5) * grid.step


@dataclass
class Octree:
    """Per level ``d = 0..L``: sorted node codes ``codes[d]``; per level ``d < L``: occupancy bytes ``occupancy[d]``."""

    depth: int
    codes: list[np.ndarray]
    occupancy: list[np.ndarray]

    @property
    def n_symbols(self) -> int:
        """Coded symbols: every node of levels 1..L−1 (the root byte is stored raw)."""
        return int(sum(len(o) for o in self.occupancy[1:]))

    def symbols(self, level: int) -> np.ndarray:
        """The coded symbols ``occupancy − 1`` of a level (int64)."""
        return self.occupancy[level].astype(np.int64) - 1


def build_octree(q: np.ndarray, depth: int) -> Octree:
    """Octree of integer cells ``q`` (duplicates allowed) at ``depth``; the leaves are the unique cells."""
    depth = _check_depth(depth)
    if len(q) == 0:
        raise ValueError("cannot build an octree of an empty point cloud")
    codes = np.unique(morton_encode(q))
    levels = [codes]
    occ = []
    for _ in range(depth):
        child = levels[0]
        parent_of = child >> np.uint64(3)
        starts = np.flatnonzero(np.r_[True, parent_of[1:] != parent_of[:-1]])
        bits = (np.uint8(1) << (np.uint8(7) - (child & np.uint64(7)).astype(np.uint8))).astype(np.uint8)
        occ.insert(0, np.bitwise_or.reduceat(bits, starts).astype(np.uint8))
        levels.insert(0, parent_of[starts])
    return Octree(depth=depth, codes=levels, occupancy=occ)


def expand(codes: np.ndarray, occupancy: np.ndarray) -> np.ndarray:
    """Children codes (sorted) of nodes ``codes`` with occupancy bytes ``occupancy``: one decoder step."""
    if len(codes) != len(occupancy):
        raise ValueError("codes and occupancy must have the same length")
    bits = np.unpackbits(np.asarray(occupancy, dtype=np.uint8)[:, None], axis=1).astype(bool)  # MSB = octant 0
    kids = (np.asarray(codes, dtype=np.uint64)[:, None] << np.uint64(3)) | np.arange(8, dtype=np.uint64)[None]
    return kids[bits]


def rebuild(occupancy: list[np.ndarray], depth: int) -> np.ndarray:
    """Leaf cells (N, 3) int64 in Morton order from the occupancy bytes of levels 0..L−1."""
    depth = _check_depth(depth)
    if len(occupancy) != depth:
        raise ValueError(f"need {depth} occupancy levels, got {len(occupancy)}")
    codes = np.zeros(1, dtype=np.uint64)
    for occ in occupancy:
        codes = expand(codes, occ)
    return morton_decode(codes)


def popcount(occupancy: np.ndarray) -> np.ndarray:
    """Number of set bits of each byte (children per node)."""
    return np.unpackbits(np.asarray(occupancy, dtype=np.uint8)[:, None], axis=1).sum(1)


def level_context(codes: list[np.ndarray], occupancy: list[np.ndarray], level: int) -> tuple[np.ndarray, np.ndarray]:
    """Context of every node of ``level`` (1 ≤ level < L): ``tokens`` (M, 7) int64 with columns
    :data:`CTX_COLUMNS` and ``xyz`` (M, 3) float32 cell centres in [−1, 1]. Needs the codes of levels
    ``level−3 .. level`` and the occupancy of levels ``level−3 .. level−1`` (all that a decoder has)."""
    if level < 1:
        raise ValueError("level must be >= 1 (the root is stored raw)")
    c = codes[level]
    m = len(c)
    tokens = np.empty((m, len(CTX_COLUMNS)), dtype=np.int64)
    for k in (1, 2, 3):  # parent, grandparent, great-grandparent occupancy symbols
        a = level - k
        if a < 0:
            tokens[:, k - 1] = PAD_SYMBOL
            continue
        anc = c >> np.uint64(3 * k)
        idx = np.searchsorted(codes[a], anc)
        tokens[:, k - 1] = occupancy[a][idx].astype(np.int64) - 1
    for k in (0, 1, 2):  # own octant and those of the parent and grandparent
        tokens[:, 3 + k] = (c >> np.uint64(3 * k)) & np.uint64(7) if level - k >= 1 else PAD_OCTANT
    tokens[:, 6] = level
    xyz = (morton_decode(c).astype(np.float32) + 0.5) * np.float32(2.0 / 2**level) - 1.0
    return tokens, xyz.astype(np.float32)


def octree_contexts(tree: Octree,
                    levels: range | list[int] | None = None) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(tokens, xyz, symbols)`` for each coded level (default 1..L−1) of a known tree (training data)."""
    levels = range(1, tree.depth) if levels is None else levels
    return [(*level_context(tree.codes, tree.occupancy, d), tree.symbols(d)) for d in levels]
