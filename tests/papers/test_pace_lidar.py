"""The synthetic LiDAR of repro.papers.pace (paper 09): ray caster against analytic hits and ray marching."""

from __future__ import annotations

import numpy as np
import pytest

from repro.papers.pace import lidar as L

EMPTY = dict(boxes=np.zeros((0, 6)), cylinders=np.zeros((0, 5)), spheres=np.zeros((0, 4)))
NO_GROUND = np.array([-1e9, 0.0, 0.0])  # a ground plane far below: never the first hit


def scene(**kw) -> L.Scene:
    parts = {**EMPTY, **kw}
    return L.Scene(ground=parts.pop("ground", NO_GROUND), **parts)


def unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=float)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def test_analytic_hits():
    box = scene(boxes=np.array([[10.0, -1, -1, 12, 1, 1]]))
    cyl = scene(cylinders=np.array([[0.0, 20, 2.0, -5, 5]]))
    sph = scene(spheres=np.array([[-30.0, 0, 0, 3]]))
    ground = scene(ground=np.array([-1.73, 0.0, 0.0]))
    assert L.ray_cast(box, unit([[1, 0, 0]]))[0] == pytest.approx(10.0)
    assert L.ray_cast(cyl, unit([[0, 1, 0]]))[0] == pytest.approx(18.0)
    assert L.ray_cast(sph, unit([[-1, 0, 0]]))[0] == pytest.approx(27.0)
    down = unit([[1, 0, -np.tan(np.deg2rad(10))]])
    assert L.ray_cast(ground, down)[0] == pytest.approx(1.73 / np.sin(np.deg2rad(10)))
    assert np.isinf(L.ray_cast(box, unit([[-1, 0, 0]]))[0])  # pointing away
    assert np.isinf(L.ray_cast(ground, unit([[1, 0, 0.1]]))[0])  # upwards never meets the ground
    # the top cap of a short cylinder below the sensor
    stump = scene(cylinders=np.array([[5.0, 0, 1.0, -3, -1]]))
    assert L.ray_cast(stump, unit([[5, 0, -1]]))[0] == pytest.approx(np.sqrt(26))


def march(s: L.Scene, d: np.ndarray, step: float = 0.005, t_max: float = 40.0) -> float:
    """First sample along the ray inside any primitive (or below the ground), an independent reference."""
    t = np.arange(step, t_max, step)
    p = t[:, None] * d[None]
    inside = p[:, 2] < s.ground[0] + s.ground[1] * p[:, 0] + s.ground[2] * p[:, 1]
    for b in s.boxes:
        inside |= np.all((p >= b[:3]) & (p <= b[3:]), axis=1)
    for cx, cy, r, z0, z1 in s.cylinders:
        inside |= ((p[:, 0] - cx) ** 2 + (p[:, 1] - cy) ** 2 <= r**2) & (p[:, 2] >= z0) & (p[:, 2] <= z1)
    for cx, cy, cz, r in s.spheres:
        inside |= ((p - [cx, cy, cz]) ** 2).sum(1) <= r**2
    hit = np.flatnonzero(inside)
    return float(t[hit[0]]) if len(hit) else np.inf


def test_ray_cast_matches_ray_marching():
    rng = np.random.default_rng(0)
    s = scene(ground=np.array([-1.73, 0.01, -0.005]), boxes=np.array([[6.0, -3, -1.73, 9, 2, 3]]),
              cylinders=np.array([[-4.0, 5, 0.6, -1.73, 2]]), spheres=np.array([[2.0, -8, 1, 1.5]]))
    dirs = unit(rng.normal(size=(150, 3)) * [1, 1, 0.3])
    got = L.ray_cast(s, dirs)
    for d, t in zip(dirs, got, strict=True):
        ref = march(s, d)
        if np.isinf(ref):
            assert t > 40.0 - 0.01
        else:
            assert ref - 0.006 <= t <= ref + 1e-9


def test_sensor_turn_matches_generic_caster_and_is_seeded():
    s = L.make_scene(3)
    offset = 0.001
    d = L.beam_directions(16, 256, azimuth_offset=offset)
    fast = L._cast_grid(s, d.reshape(16, 256, 3), offset)
    assert np.allclose(fast, L.ray_cast(s, d), rtol=1e-9, atol=1e-9, equal_nan=False)
    a = L.spin_lidar(s, n_beams=16, n_az=256, rng=np.random.default_rng(5))
    b = L.spin_lidar(s, n_beams=16, n_az=256, rng=np.random.default_rng(5))
    assert np.array_equal(a, b) and a.dtype == np.float32
    r = np.linalg.norm(a, axis=1)
    assert 0.7 * 16 * 256 < len(a) <= 16 * 256 and r.min() >= 0.9 and r.max() <= 120.2


def test_bad_arguments():
    with pytest.raises(ValueError):
        L.make_scene(0, extent=5.0)
    with pytest.raises(ValueError):
        L.beam_directions(0, 10)
    with pytest.raises(ValueError):
        L.ray_cast(L.make_scene(0), np.zeros((4, 2)))
    with pytest.raises(ValueError):
        L.spin_lidar(L.make_scene(0), dropout=1.0)
