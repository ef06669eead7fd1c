"""Octree serialisation of repro.papers.pace (paper 09) against brute-force references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from repro.papers.pace import octree as O


def morton_loop(x: int, y: int, z: int, bits: int) -> int:
    code = 0
    for b in range(bits):
        code |= ((x >> b) & 1) << (3 * b + 2) | ((y >> b) & 1) << (3 * b + 1) | ((z >> b) & 1) << (3 * b)
    return code


def test_morton_matches_bit_loops_and_inverts():
    rng = np.random.default_rng(0)
    q = rng.integers(0, 2**21, size=(300, 3))
    codes = O.morton_encode(q)
    assert [int(c) for c in codes] == [morton_loop(*map(int, row), 21) for row in q]
    assert np.array_equal(O.morton_decode(codes), q)


def test_morton_rejects_out_of_range():
    with pytest.raises(ValueError):
        O.morton_encode(np.array([[0, 0, 2**21]]))
    with pytest.raises(ValueError):
        O.morton_encode(np.array([[-1, 0, 0]]))
    with pytest.raises(ValueError):
        O.morton_encode(np.zeros((3, 2), dtype=int))


clouds = st.integers(1, 8).flatmap(
    lambda depth: st.tuples(st.just(depth), arrays(np.int64, st.tuples(st.integers(1, 60), st.just(3)),
                                                   elements=st.integers(0, 2**depth - 1))))


@settings(max_examples=60, deadline=None)
@given(clouds)
def test_rebuild_equals_unique_cells(case):
    depth, q = case
    tree = O.build_octree(q, depth)
    rebuilt = O.rebuild(tree.occupancy, depth)
    unique = np.unique(q, axis=0)
    assert len(rebuilt) == len(unique)
    assert np.array_equal(np.unique(rebuilt, axis=0), unique)
    assert np.all(np.diff(O.morton_encode(rebuilt).astype(np.float64)) > 0)  # Morton order, no duplicates


@settings(max_examples=40, deadline=None)
@given(clouds)
def test_occupancy_bytes_match_a_dict_of_children(case):
    depth, q = case
    tree = O.build_octree(q, depth)
    for level in range(depth):
        children: dict[tuple[int, int, int], int] = {}
        shift = depth - level - 1
        for x, y, z in {tuple(map(int, r)) for r in q}:
            cx, cy, cz = x >> shift, y >> shift, z >> shift  # child cell at level + 1
            octant = (cx & 1) << 2 | (cy & 1) << 1 | (cz & 1)
            parent = (cx >> 1, cy >> 1, cz >> 1)
            children[parent] = children.get(parent, 0) | (1 << (7 - octant))
        nodes = O.morton_decode(tree.codes[level])
        expected = [children[tuple(map(int, n))] for n in nodes]
        assert tree.occupancy[level].tolist() == expected
        assert len(nodes) == len(children)


def test_level_context_matches_brute_force():
    rng = np.random.default_rng(1)
    depth = 7
    q = rng.integers(0, 2**depth, size=(400, 3))
    tree = O.build_octree(q, depth)
    index = [{int(c): i for i, c in enumerate(codes)} for codes in tree.codes]
    for level in range(1, depth):
        tokens, xyz = O.level_context(tree.codes, tree.occupancy, level)
        for row, code in zip(tokens, tree.codes[level], strict=True):
            code = int(code)
            for k in (1, 2, 3):
                a = level - k
                want = O.PAD_SYMBOL if a < 0 else int(tree.occupancy[a][index[a][code >> 3 * k]]) - 1
                assert row[k - 1] == want
            for k in (0, 1, 2):
                want = (code >> 3 * k) & 7 if level - k >= 1 else O.PAD_OCTANT
                assert row[3 + k] == want
            assert row[6] == level
        cells = O.morton_decode(tree.codes[level])
        assert np.allclose(xyz, (cells + 0.5) / 2**level * 2 - 1)
        assert xyz.min() > -1 and xyz.max() < 1


def test_quantize_dequantize_and_errors():
    grid = O.Grid.centred(128.0, 10)
    pts = np.array([[0.0, 0.0, 0.0], [-127.9, 5.5, 127.9], [3.14, -2.71, -1.73]])
    q = O.quantize(pts, grid)
    assert np.abs(O.dequantize(q, grid) - pts).max() <= grid.step / 2 * (1 + 1e-9)
    with pytest.raises(ValueError, match="outside"):
        O.quantize(np.array([[200.0, 0, 0]]), grid)
    with pytest.raises(ValueError, match="NaN"):
        O.quantize(np.array([[np.nan, 0, 0]]), grid)
    with pytest.raises(ValueError):
        O.build_octree(np.zeros((0, 3), dtype=int), 5)
    with pytest.raises(ValueError):
        O.build_octree(np.zeros((1, 3), dtype=int), 0)
    with pytest.raises(ValueError):
        O.Grid((0, 0, 0), -1.0, 5)


def test_coarser_trees_are_prefixes_of_finer_ones():
    """A fixed cube makes level d the same partition for every depth, so one model serves all depths."""
    rng = np.random.default_rng(2)
    pts = rng.uniform(-50, 50, size=(500, 3))
    fine = O.build_octree(O.quantize(pts, O.Grid.centred(64.0, 9)), 9)
    coarse = O.build_octree(O.quantize(pts, O.Grid.centred(64.0, 6)), 6)
    for level in range(6):
        assert np.array_equal(fine.occupancy[level], coarse.occupancy[level])


@pytest.mark.parametrize("half, depth, origin_shift", [(128.0, 10, 0.0), (100.0, 7, 0.0), (37.3, 12, 3.1)])
def test_points_just_below_the_upper_face_are_inside(half, depth, origin_shift):
    """A point inside the documented cube [o, o + size) but within rounding of its upper face must get the last
    cell (2^L − 1), not be refused: the division can round it up to 2^L. Points at or beyond the face still raise."""
    grid = O.Grid(tuple(np.array([-half, -half, -half]) + origin_shift), 2.0 * half, depth)
    hi = np.asarray(grid.origin) + grid.size
    below = np.nextafter(hi, -np.inf)  # the largest doubles strictly inside the cube
    assert (below < hi).all()
    q = O.quantize(below[None], grid)
    assert (q == 2**depth - 1).all()
    lo = np.asarray(grid.origin)
    assert (O.quantize(lo[None], grid) == 0).all()
    for bad in (hi, np.nextafter(lo, -np.inf)):
        with pytest.raises(ValueError, match="outside"):
            O.quantize(bad[None], grid)
