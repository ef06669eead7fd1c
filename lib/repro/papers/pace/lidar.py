"""Synthetic LiDAR scans: procedural street scenes and a spinning multi-beam sensor, ray-cast analytically.

Paper 09 (PACE, Zhu et al., ICML 2026) evaluates on SemanticKITTI / Ford / nuScenes scans, which cannot be
downloaded here. We generate scans with the same acquisition geometry instead: a 64-beam spinning sensor
(HDL-64E-like: elevations evenly spaced from +2° down to −24.8°, ``n_az`` azimuth steps per turn, mounted
1.73 m above the ground, 120 m range, 2 cm range noise, 5 % random dropout) ray-cast against a street scene
made of a gently sloped ground plane, kerbs, buildings and cars (axis-aligned boxes), poles and trunks
(vertical cylinders) and tree crowns (spheres). All intersections are closed-form and vectorised over rays ×
primitives (:func:`ray_cast`). The sensor sits at the origin; the ground is at ``z ≈ −1.73``.

Notebook: ``notebooks/09-pace-lidar.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Scene", "make_scans", "make_scene", "ray_cast", "spin_lidar"]

SENSOR_HEIGHT = 1.73
_CHUNK = 8192  # rays per vectorised block (bounds the rays × primitives temporaries)


@dataclass(frozen=True)
class Scene:
    """A procedural scene in the sensor frame (metres).

    ``ground``: (3,) coefficients of the ground plane ``z = g0 + g1 x + g2 y``; ``boxes``: (B, 6) rows
    ``xmin, ymin, zmin, xmax, ymax, zmax``; ``cylinders``: (C, 5) vertical cylinders ``cx, cy, r, zmin, zmax``;
    ``spheres``: (S, 4) rows ``cx, cy, cz, r``.
    """

    ground: np.ndarray
    boxes: np.ndarray
    cylinders: np.ndarray
    spheres: np.ndarray


def _empty(cols: int) -> np.ndarray:
    return np.zeros((0, cols))


def make_scene(seed: int, *, extent: float = 100.0, road_half_width: float = 5.0, pavement: float = 3.0,
               parked: float = 0.6, n_moving: int = 4, tree_spacing: float = 14.0, pole_spacing: float = 25.0,
               lot_gap: float = 0.2) -> Scene:
    """A random street scene in the sensor frame: a road along x (half-width ``road_half_width``, kerbs, pavements
    of width ``pavement``; for half the seeds a cross street along y), rows of buildings on both sides (façades 8–25 m
    long, 6–15 m deep, 3–20 m high, set back 0–6 m; a ``lot_gap`` fraction of lots left empty), cars parked along
    both kerbs (occupancy ``parked``) and ``n_moving`` in the lanes, poles and trees (trunk + crown) on the
    pavements. ``extent`` is the half-length of the populated street."""
    if extent <= 2 * (road_half_width + pavement) or road_half_width < 2.5:
        raise ValueError(f"need road_half_width >= 2.5 and extent > 2·(road + pavement), got {extent}")
    rng = np.random.default_rng(seed)
    g0 = -SENSOR_HEIGHT
    slope = rng.uniform(-0.01, 0.01, size=2)
    cross = rng.uniform(-0.6, 0.6) * extent if rng.random() < 0.5 else None
    edge = road_half_width + pavement  # where the building lots start

    def z_at(x: float, y: float) -> float:
        return float(g0 + slope[0] * x + slope[1] * y)

    def in_cross(x0: float, x1: float, margin: float) -> bool:
        return cross is not None and x1 > cross - edge - margin and x0 < cross + edge + margin

    boxes, cyl, sph = [], [], []
    for side in (-1, 1):
        x = -extent + rng.uniform(0, 10)
        while x < extent:  # a row of buildings along this side of the road
            length, depth = rng.uniform(8, 25), rng.uniform(6, 15)
            if rng.random() >= lot_gap and not in_cross(x, x + length, 1.0):
                y_near = side * (edge + rng.uniform(0, 6))
                y_far = y_near + side * depth
                z0 = z_at(x + length / 2, y_near) - 0.3
                boxes.append([x, min(y_near, y_far), z0, x + length, max(y_near, y_far), z0 + 0.3 + rng.uniform(3, 20)])
            x += length + rng.uniform(0, 6)
        y_kerb = side * road_half_width  # the kerb: a 15 cm step along the road
        boxes.append([-extent, min(y_kerb, y_kerb + side * 0.3), g0 - 0.2, extent, max(y_kerb, y_kerb + side * 0.3),
                      g0 + 0.15])
        x = -extent + rng.uniform(0, 6)
        while x < extent:  # parked cars along the kerb
            length = rng.uniform(3.8, 5.0)
            if rng.random() < parked and not in_cross(x, x + length, 0.0) and not -3 < x + length / 2 < 3:
                yc = side * (road_half_width - rng.uniform(1.1, 1.4))
                w = rng.uniform(1.6, 2.0)
                z0 = z_at(x, yc) + 0.15
                boxes.append([x, yc - w / 2, z0, x + length, yc + w / 2, z0 + rng.uniform(1.3, 1.8)])
            x += length + rng.uniform(0.8, 4.0)
        for px in np.arange(-extent + rng.uniform(0, pole_spacing), extent, pole_spacing):  # poles
            py = side * (road_half_width + rng.uniform(0.4, 0.8))
            cyl.append([px, py, rng.uniform(0.08, 0.15), z_at(px, py), z_at(px, py) + rng.uniform(4, 8)])
        for tx in np.arange(-extent + rng.uniform(0, tree_spacing), extent, tree_spacing):  # trees
            if rng.random() < 0.3 or in_cross(tx, tx, 0.0):
                continue
            tx += rng.uniform(-2, 2)
            ty = side * (road_half_width + rng.uniform(1.2, pavement - 0.3))
            r, top = rng.uniform(1.5, 3.0), z_at(tx, ty) + rng.uniform(2.5, 4.0)
            cyl.append([tx, ty, rng.uniform(0.15, 0.3), top - 4.5, top + 0.5 * r])
            sph.append([tx, ty, top + 0.8 * r, r])
    for _ in range(n_moving):  # cars in the lanes, away from the sensor
        along_x = cross is None or rng.random() < 0.7
        lane = rng.choice([-1, 1]) * rng.uniform(0.9, road_half_width - 2.8 if road_half_width > 3.8 else 1.0)
        pos = rng.uniform(6, 0.8 * extent) * rng.choice([-1, 1])
        x, y = (pos, lane) if along_x else (cross + lane, pos)
        length, width = rng.uniform(3.8, 5.0), rng.uniform(1.6, 2.0)
        hx, hy = (length / 2, width / 2) if along_x else (width / 2, length / 2)
        z0 = z_at(x, y) + 0.15
        boxes.append([x - hx, y - hy, z0, x + hx, y + hy, z0 + rng.uniform(1.3, 1.8)])
    return Scene(ground=np.array([g0, *slope]), boxes=np.asarray(boxes, dtype=np.float64).reshape(-1, 6),
                 cylinders=np.asarray(cyl, dtype=np.float64).reshape(-1, 5),
                 spheres=np.asarray(sph, dtype=np.float64).reshape(-1, 4))


def beam_directions(n_beams: int = 64, n_az: int = 1024, *, elev_top: float = 2.0, elev_bottom: float = -24.8,
                    azimuth_offset: float = 0.0) -> np.ndarray:
    """Unit ray directions of one sensor turn, (n_beams · n_az, 3), beam-major. Elevations (degrees) are evenly
    spaced from ``elev_top`` to ``elev_bottom``; azimuths evenly spaced over 2π starting at ``azimuth_offset``."""
    if n_beams < 1 or n_az < 1:
        raise ValueError("n_beams and n_az must be positive")
    el = np.deg2rad(np.linspace(elev_top, elev_bottom, n_beams))
    az = azimuth_offset + 2 * np.pi * np.arange(n_az) / n_az
    el, az = np.meshgrid(el, az, indexing="ij")
    return np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], -1).reshape(-1, 3)


def _hit_ground(d: np.ndarray, g: np.ndarray) -> np.ndarray:
    denom = d[:, 2] - g[1] * d[:, 0] - g[2] * d[:, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = g[0] / denom
    return np.where(np.isfinite(t) & (t > 0), t, np.inf)


def _hit_boxes(d: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    if len(boxes) == 0:
        return np.full(len(d), np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / d  # +-inf on axis-parallel rays: the slab test below stays correct
        t1 = boxes[None, :, :3] * inv[:, None, :]
        t2 = boxes[None, :, 3:] * inv[:, None, :]
    t1 = np.where(np.isnan(t1), -np.inf, t1)  # 0 * inf: the ray lies in the slab's plane
    t2 = np.where(np.isnan(t2), np.inf, t2)
    near = np.minimum(t1, t2).max(-1)
    far = np.maximum(t1, t2).min(-1)
    hit = (near <= far) & (near > 0)
    return np.where(hit, near, np.inf).min(-1)


def _hit_cylinders(d: np.ndarray, cyl: np.ndarray) -> np.ndarray:
    if len(cyl) == 0:
        return np.full(len(d), np.inf)
    cx, cy, r, z0, z1 = (cyl[None, :, i] for i in range(5))
    dx, dy, dz = d[:, 0:1], d[:, 1:2], d[:, 2:3]
    a = dx**2 + dy**2
    b = -2 * (dx * cx + dy * cy)
    c = cx**2 + cy**2 - r**2
    disc = b**2 - 4 * a * c
    with np.errstate(divide="ignore", invalid="ignore"):
        t_side = (-b - np.sqrt(np.maximum(disc, 0))) / (2 * a)
        z = t_side * dz
        side = (disc >= 0) & (t_side > 0) & (z >= z0) & (z <= z1)
        best = np.where(side, t_side, np.inf)
        for zc in (z0, z1):  # the caps
            t_cap = zc / dz
            px, py = t_cap * dx - cx, t_cap * dy - cy
            cap = (t_cap > 0) & (px**2 + py**2 <= r**2)
            best = np.minimum(best, np.where(cap, t_cap, np.inf))
    return best.min(-1)


def _hit_spheres(d: np.ndarray, sph: np.ndarray) -> np.ndarray:
    if len(sph) == 0:
        return np.full(len(d), np.inf)
    b = d @ sph[:, :3].T  # d · c  (|d| = 1, origin 0)
    c = (sph[:, :3] ** 2).sum(-1) - sph[:, 3] ** 2
    disc = b**2 - c[None]
    t = b - np.sqrt(np.maximum(disc, 0))
    return np.where((disc >= 0) & (t > 0), t, np.inf).min(-1)


def ray_cast(scene: Scene, directions: np.ndarray) -> np.ndarray:
    """Distance along each unit ray from the origin to the first surface of ``scene`` (``inf`` on a miss)."""
    d = np.asarray(directions, dtype=np.float64)
    if d.ndim != 2 or d.shape[1] != 3:
        raise ValueError(f"directions must have shape (N, 3), got {d.shape}")
    out = np.empty(len(d))
    for s in range(0, len(d), _CHUNK):
        dc = d[s:s + _CHUNK]
        t = np.minimum(_hit_ground(dc, scene.ground), _hit_boxes(dc, scene.boxes))
        t = np.minimum(t, _hit_cylinders(dc, scene.cylinders))
        out[s:s + _CHUNK] = np.minimum(t, _hit_spheres(dc, scene.spheres))
    return out


def _footprint_arc(prim: np.ndarray, kind: str) -> tuple[float, float] | None:
    """Azimuth interval [a0, a1] (radians, a1 - a0 < 2π) covering a primitive's xy footprint seen from the
    origin, or ``None`` when the footprint surrounds the origin (every azimuth may hit)."""
    if kind == "box":
        x0, y0, _, x1, y1, _ = prim
        if x0 <= 0 <= x1 and y0 <= 0 <= y1:
            return None
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        ref = np.arctan2(cy, cx)
        ang = np.arctan2([y0, y0, y1, y1], [x0, x1, x0, x1])
        delta = (ang - ref + np.pi) % (2 * np.pi) - np.pi
        return ref + delta.min(), ref + delta.max()
    cx, cy, r = prim[0], prim[1], prim[2] if kind == "cylinder" else prim[3]
    dist = np.hypot(cx, cy)
    if dist <= r:
        return None
    ref, half = np.arctan2(cy, cx), np.arcsin(r / dist)
    return ref - half, ref + half


def _cast_grid(scene: Scene, d: np.ndarray, azimuth_offset: float) -> np.ndarray:
    """:func:`ray_cast` for a sensor turn ``d`` of shape (n_beams, n_az, 3): each primitive is only tested against
    the azimuth columns its footprint covers (same closed forms, so the same distances, much less work)."""
    n_beams, n_az, _ = d.shape
    t = _hit_ground(d.reshape(-1, 3), scene.ground).reshape(n_beams, n_az)
    step = 2 * np.pi / n_az
    for kind, prims, hit in (("box", scene.boxes, _hit_boxes), ("cylinder", scene.cylinders, _hit_cylinders),
                             ("sphere", scene.spheres, _hit_spheres)):
        for prim in prims:
            arc = _footprint_arc(prim, kind)
            if arc is None:
                cols = np.arange(n_az)
            else:
                j0 = int(np.floor((arc[0] - azimuth_offset) / step)) - 1
                j1 = int(np.ceil((arc[1] - azimuth_offset) / step)) + 1
                cols = np.arange(j0, j1 + 1) % n_az
                cols = np.unique(cols) if j1 - j0 + 1 >= n_az else cols
            sub = hit(d[:, cols].reshape(-1, 3), prim[None]).reshape(n_beams, len(cols))
            t[:, cols] = np.minimum(t[:, cols], sub)
    return t.reshape(-1)


def spin_lidar(scene: Scene, *, n_beams: int = 64, n_az: int = 1024, max_range: float = 120.0,
               min_range: float = 1.0, range_noise: float = 0.02, dropout: float = 0.05,
               rng: np.random.Generator | None = None) -> np.ndarray:
    """One turn of the spinning sensor: ray-cast every beam × azimuth, keep hits within
    ``[min_range, max_range]``, add Gaussian range noise, drop a random ``dropout`` fraction. Returns (N, 3) float32
    points in metres (sensor frame). The azimuth offset of the turn is random."""
    if not 0 <= dropout < 1 or range_noise < 0 or max_range <= min_range:
        raise ValueError("need 0 <= dropout < 1, range_noise >= 0 and max_range > min_range")
    rng = rng if rng is not None else np.random.default_rng(0)
    offset = rng.uniform(0, 2 * np.pi / n_az)
    d = beam_directions(n_beams, n_az, azimuth_offset=offset)
    t = _cast_grid(scene, d.reshape(n_beams, n_az, 3), offset)
    keep = (t >= min_range) & (t <= max_range) & (rng.random(len(t)) >= dropout)
    t = t[keep] + rng.normal(0.0, range_noise, size=int(keep.sum()))
    return (d[keep] * t[:, None]).astype(np.float32)


def make_scans(seeds: list[int] | range, *, n_beams: int = 64, n_az: int = 1024, **scene_kw) -> list[np.ndarray]:
    """One scan per seed (scene and sensor noise both seeded by it)."""
    return [spin_lidar(make_scene(int(s), **scene_kw), n_beams=n_beams, n_az=n_az,
                       rng=np.random.default_rng([int(s), 1])) for s in seeds]
