"""SynthSearch: a deterministic procedural person-search benchmark with a source/target scale gap.

CUHK-SYSU, PRW and ImageNet weights cannot be had offline, so the notebook builds its own data. A *person* is an
identity attribute vector (:func:`make_identities`) drawn as a 2-D sprite (:func:`render_person`): head, hair, torso,
arms, legs, shoes, plus the fine details that tell identities apart in the "fine" design: stripes (horizontal,
vertical, check; colour; period), a bag with a diagonal strap, a hat, a chest logo. Coarse colours are shared by many
identities, so re-identification needs details that vanish when a person is small.

A *scene* (:func:`make_scene`) pastes 3-6 persons on a crop of one of scikit-learn's two bundled photos
(``china.jpg`` for the source domain, ``flower.jpg`` for the target); a *split* (:func:`make_split`) is a set of scenes
whose persons come from a given identity pool. The domains (:data:`SOURCE`, :data:`TARGET`) differ as in UDA person
search: the source has large persons (70-130 px), the target small ones (20-45 px) seen by a tilted camera (vertical
squash 0.8), with blur, sensor noise and another background. :func:`scale_sweep_domain` fixes the person height.

Determinism: every scene and every person draws its randomness from its own NumPy generator seeded by
``(seed, scene index, slot)``; nothing touches torch's global generator (a prototype that drew render noise from it
moved results by ±3 mAP through the model's initialisation).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from scipy.ndimage import gaussian_filter

from repro.common.seeding import derive

__all__ = [
    "SOURCE", "TARGET", "DomainConfig", "Identity", "crop_rois", "make_identities", "make_scene", "make_split",
    "render_person", "sample_nuisance", "scale_sweep_domain",
]

CANVAS_H, CANVAS_W = 128, 64  # canonical body coordinates (rows, columns)
RASTER = 0.75  # the canvas is rasterised at 96×48 pixels (shapes stay defined in the 128×64 coordinates)
FEET_Y, HEAD_TOP = 124.0, 6.0

SHIRTS = np.array([[0.80, 0.15, 0.15], [0.15, 0.35, 0.80], [0.90, 0.85, 0.80], [0.20, 0.55, 0.25]], np.float32)
TROUSERS = np.array([[0.15, 0.15, 0.18], [0.25, 0.35, 0.60], [0.60, 0.52, 0.38]], np.float32)
SKINS = np.array([[0.93, 0.76, 0.62], [0.55, 0.38, 0.26]], np.float32)
HAIRS = np.array([[0.12, 0.08, 0.05], [0.75, 0.60, 0.30]], np.float32)
STRIPE_COLOURS = np.array([[0.98, 0.98, 0.95], [0.05, 0.05, 0.05], [0.95, 0.80, 0.10], [0.85, 0.30, 0.70]],
                          np.float32)
BAG_COLOURS = np.array([[0.45, 0.25, 0.10], [0.10, 0.10, 0.10], [0.90, 0.45, 0.10]], np.float32)
HAT_COLOURS = np.array([[0.10, 0.10, 0.35], [0.90, 0.90, 0.20]], np.float32)
LOGO_COLOURS = np.array([[0.98, 0.98, 0.98], [0.95, 0.60, 0.05]], np.float32)
COARSE_COLOURS = np.array([[0.80, 0.15, 0.15], [0.15, 0.35, 0.80], [0.90, 0.85, 0.80], [0.20, 0.55, 0.25],
                           [0.15, 0.15, 0.18], [0.95, 0.80, 0.10], [0.55, 0.25, 0.60], [0.45, 0.25, 0.10],
                           [0.50, 0.50, 0.50], [0.10, 0.60, 0.65], [0.95, 0.55, 0.65], [0.60, 0.52, 0.38]],
                          np.float32)
SHOES = np.array([0.08, 0.06, 0.05], np.float32)
STRIPE_PERIODS = (10, 14)  # canonical pixels: 4-6 px at a 64-px input, under 2 px at 20-px persons


@dataclass(frozen=True)
class Identity:
    """One person's attributes (colours as RGB in [0, 1]); the renderer draws them, nuisance aside, identically."""

    pid: int
    shirt: tuple[float, float, float]
    trouser: tuple[float, float, float]
    skin: tuple[float, float, float]
    hair: tuple[float, float, float]
    stripes: int = 0  # 0 none, 1 horizontal, 2 vertical, 3 check
    stripe_colour: tuple[float, float, float] = (1.0, 1.0, 1.0)
    stripe_period: int = 10
    bag: int = 0  # 0 none, 1 left, 2 right (with a strap over the opposite shoulder)
    bag_colour: tuple[float, float, float] = (0.0, 0.0, 0.0)
    hat: bool = False
    hat_colour: tuple[float, float, float] = (0.0, 0.0, 0.0)
    logo: bool = False
    logo_colour: tuple[float, float, float] = (1.0, 1.0, 1.0)
    leg_ratio: float = 0.48
    width_ratio: float = 1.0


@dataclass(frozen=True)
class Nuisance:
    """Per-instance nuisance: shear and limb angles (radians), lighting gain and per-channel gains, occlusion
    (``occ_side`` 0 none, 1 bottom, 2 left, 3 right; ``occ_frac`` of the box covered by a flat block)."""

    shear: float = 0.0
    leg_spread: float = 0.0
    arm_swing: float = 0.0
    gain: float = 1.0
    channel: tuple[float, float, float] = (1.0, 1.0, 1.0)
    occ_side: int = 0
    occ_frac: float = 0.0
    occ_colour: tuple[float, float, float] = (0.4, 0.4, 0.4)


@dataclass(frozen=True)
class DomainConfig:
    """A camera/domain: scene size, person heights, vertical squash (tilt), blur and noise, background photo."""

    name: str
    scene_hw: tuple[int, int]
    height_range: tuple[float, float]
    squash: float = 1.0
    blur: float = 0.0
    noise: float = 0.0
    background: str = "china.jpg"
    bg_gain: float = 1.0
    bg_offset: float = 0.0
    persons: tuple[int, int] = (3, 6)


SOURCE = DomainConfig("S", (160, 320), (70.0, 130.0))
TARGET = DomainConfig("T", (112, 192), (20.0, 45.0), squash=0.8, blur=0.8, noise=0.02, background="flower.jpg",
                      bg_gain=0.8, bg_offset=0.1)


def scale_sweep_domain(height: float) -> DomainConfig:
    """The target camera (squash, blur, noise, background) with every person exactly ``height`` px tall."""
    rows = int(max(TARGET.scene_hw[0], math.ceil(height * 1.25)))
    cols = int(max(TARGET.scene_hw[1], math.ceil(height * 2.6)))
    return replace(TARGET, name=f"T{int(height)}", scene_hw=(rows, cols), height_range=(height, height))


def _rgb(a: np.ndarray) -> tuple[float, float, float]:
    return (float(a[0]), float(a[1]), float(a[2]))


def make_identities(n: int, seed: int, design: str = "fine", first_pid: int = 0) -> list[Identity]:
    """``n`` identities with pids ``first_pid ..``. ``design="fine"``: few coarse colour combinations (4 shirts ×
    3 trousers × 2 skins × 2 hairs), identities differ in stripes, bag, hat and logo; ``"coarse"``: 12-colour
    shirts and trousers, no details."""
    if n < 1:
        raise ValueError(f"need n >= 1 identities, got {n}")
    if design not in ("fine", "coarse"):
        raise ValueError(f"design must be 'fine' or 'coarse', got {design!r}")
    rng = np.random.default_rng(derive(seed, "identities"))
    out = []
    for k in range(n):
        leg, width = float(rng.uniform(0.44, 0.52)), float(rng.uniform(0.85, 1.1))
        if design == "coarse":
            out.append(Identity(first_pid + k, _rgb(COARSE_COLOURS[rng.integers(12)]),
                                _rgb(COARSE_COLOURS[rng.integers(12)]), _rgb(SKINS[rng.integers(2)]),
                                _rgb(HAIRS[rng.integers(2)]), leg_ratio=leg, width_ratio=width))
            continue
        out.append(Identity(
            first_pid + k, _rgb(SHIRTS[rng.integers(4)]), _rgb(TROUSERS[rng.integers(3)]),
            _rgb(SKINS[rng.integers(2)]), _rgb(HAIRS[rng.integers(2)]), stripes=int(rng.integers(4)),
            stripe_colour=_rgb(STRIPE_COLOURS[rng.integers(4)]),
            stripe_period=int(STRIPE_PERIODS[rng.integers(2)]), bag=int(rng.integers(3)) if rng.random() < 0.6 else 0,
            bag_colour=_rgb(BAG_COLOURS[rng.integers(3)]), hat=bool(rng.random() < 0.4),
            hat_colour=_rgb(HAT_COLOURS[rng.integers(2)]), logo=bool(rng.random() < 0.4),
            logo_colour=_rgb(LOGO_COLOURS[rng.integers(2)]), leg_ratio=leg, width_ratio=width))
    return out


def sample_nuisance(rng: np.random.Generator, occlusion: float = 0.3) -> Nuisance:
    """Shear ±5°, leg spread 0-8°, arm swing ±10°, gain U(0.7, 1.25), channel gains N(1, 0.05), and with
    probability ``occlusion`` a flat block over 15-35 % of the box from the bottom or one side."""
    side, frac = 0, 0.0
    if rng.random() < occlusion:
        side, frac = int(rng.integers(1, 4)), float(rng.uniform(0.15, 0.35))
    return Nuisance(shear=float(np.deg2rad(rng.uniform(-5, 5))), leg_spread=float(np.deg2rad(rng.uniform(0, 8))),
                    arm_swing=float(np.deg2rad(rng.uniform(-10, 10))), gain=float(rng.uniform(0.7, 1.25)),
                    channel=_rgb(rng.normal(1.0, 0.05, 3)), occ_side=side, occ_frac=frac,
                    occ_colour=_rgb(rng.uniform(0.2, 0.7, 3)))


def _paint(img: np.ndarray, alpha: np.ndarray, mask: np.ndarray, colour) -> None:
    np.copyto(img, np.asarray(colour, np.float32), where=mask[..., None])
    np.copyto(alpha, np.float32(1.0), where=mask)


def _canonical(idt: Identity, nz: Nuisance) -> tuple[np.ndarray, np.ndarray]:
    """Draw on the canvas: every shape is a mask over the (sheared) pixel grid, painted back to front."""
    rows, cols = int(CANVAS_H * RASTER), int(CANVAS_W * RASTER)
    yy, xx = (np.mgrid[0:rows, 0:cols].astype(np.float32) + 0.5) / RASTER
    x = xx - math.tan(nz.shear) * (yy - CANVAS_H / 2)  # shear: evaluate the shapes on a slanted grid
    img = np.zeros((rows, cols, 3), np.float32)
    alpha = np.zeros((rows, cols), np.float32)
    cx, wr = CANVAS_W / 2, idt.width_ratio
    hip = FEET_Y - idt.leg_ratio * (FEET_Y - 27.0)
    half = 11.0 * wr
    # legs (spread apart by the leg angle) and shoes
    for sgn in (-1.0, 1.0):
        centre = cx + sgn * (5.0 * wr + (yy - hip) * math.tan(nz.leg_spread))
        leg = (np.abs(x - centre) < 4.5 * wr) & (yy >= hip - 1) & (yy < FEET_Y)
        _paint(img, alpha, leg, idt.trouser)
        _paint(img, alpha, leg & (yy >= FEET_Y - 5), SHOES)
    # arms swing about the shoulder; hands are skin
    for sgn in (-1.0, 1.0):
        centre = cx + sgn * (half + 3.0) + (yy - 29.0) * math.tan(sgn * nz.arm_swing)
        arm = (np.abs(x - centre) < 3.0) & (yy >= 29) & (yy < hip + 4)
        _paint(img, alpha, arm, idt.shirt)
        _paint(img, alpha, arm & (yy >= hip), idt.skin)
    # torso with its pattern and logo
    torso = (np.abs(x - cx) < half) & (yy >= 26) & (yy < hip)
    _paint(img, alpha, torso, idt.shirt)
    p = idt.stripe_period / 2.0
    hstripe, vstripe = (np.floor((yy - 26) / p) % 2) == 1, (np.floor((x - cx + half) / p) % 2) == 1
    pattern = {0: np.zeros_like(torso), 1: hstripe, 2: vstripe, 3: hstripe ^ vstripe}[idt.stripes]
    _paint(img, alpha, torso & pattern, idt.stripe_colour)
    if idt.logo:
        _paint(img, alpha, torso & (np.abs(x - cx) < 5) & (yy >= 33) & (yy < 43), idt.logo_colour)
    # bag at the hip with a strap across the torso from the opposite shoulder
    if idt.bag:
        sgn = -1.0 if idt.bag == 1 else 1.0
        bx = cx + sgn * (half + 4.0)
        _paint(img, alpha, (np.abs(x - bx) < 6.0) & (yy >= hip - 20) & (yy < hip - 4), idt.bag_colour)
        x0, y0, x1, y1 = cx - sgn * half, 27.0, bx, hip - 20
        dist = np.abs((y1 - y0) * (x - x0) - (x1 - x0) * (yy - y0)) / math.hypot(x1 - x0, y1 - y0)
        _paint(img, alpha, (dist < 1.6) & (yy >= y0) & (yy <= y1), idt.bag_colour)
    # head, hair, hat
    head = ((x - cx) / 8.0) ** 2 + ((yy - 16.0) / 10.0) ** 2 <= 1.0
    _paint(img, alpha, head, idt.skin)
    _paint(img, alpha, (((x - cx) / 8.5) ** 2 + ((yy - 15.0) / 10.0) ** 2 <= 1.0) & (yy < 12), idt.hair)
    if idt.hat:
        _paint(img, alpha, (np.abs(x - cx) < 8.5) & (yy >= 1) & (yy < 10), idt.hat_colour)
        _paint(img, alpha, (np.abs(x - cx) < 12.0) & (yy >= 8) & (yy < 11), idt.hat_colour)
    return img, alpha


def render_person(identity: Identity, height: float, nuisance: Nuisance | None = None, *,
                  squash: float = 1.0) -> np.ndarray:
    """The person as a premultiplied RGBA sprite ``(h, w, 4)`` (float32) whose alpha box is exactly ``height`` rows
    tall; ``squash < 1`` widens it relative to its height (a tilted camera). ``nuisance=None`` is the canonical
    rendering. Deterministic: the same arguments give the same array."""
    if not (math.isfinite(height) and height >= 4):
        raise ValueError(f"person height must be a finite number >= 4 px, got {height}")
    if not 0.3 <= squash <= 1.5:
        raise ValueError(f"squash must be in [0.3, 1.5], got {squash}")
    nz = nuisance or Nuisance()
    img, alpha = _canonical(identity, nz)
    img = np.clip(img * nz.gain * np.asarray(nz.channel, np.float32), 0.0, 1.0)
    rows, cols = np.nonzero(alpha.any(1))[0], np.nonzero(alpha.any(0))[0]
    r0, r1, c0, c1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
    img, alpha = img[r0:r1, c0:c1], alpha[r0:r1, c0:c1]
    if nz.occ_side:  # an opaque occluder over part of the box (bottom, left or right)
        hh, ww = alpha.shape
        block = np.zeros_like(alpha, dtype=bool)
        if nz.occ_side == 1:
            block[int(round(hh * (1 - nz.occ_frac))):] = True
        elif nz.occ_side == 2:
            block[:, : int(round(ww * nz.occ_frac))] = True
        else:
            block[:, ww - int(round(ww * nz.occ_frac)):] = True
        img[block], alpha[block] = nz.occ_colour, 1.0
    rgba = np.concatenate([img * alpha[..., None], alpha[..., None]], axis=2)
    out_h = int(round(height))
    out_w = max(2, int(round(rgba.shape[1] * height / rgba.shape[0] / squash)))
    t = torch.from_numpy(np.ascontiguousarray(rgba.transpose(2, 0, 1)))[None]
    t = F.interpolate(t, size=(out_h, out_w), mode="bilinear", antialias=True, align_corners=False)
    return t[0].permute(1, 2, 0).clamp(0.0, 1.0).numpy()


@functools.lru_cache(maxsize=16)
def _photos(name: str, rows: int, cols: int) -> tuple[np.ndarray, ...]:
    """The bundled photo downsampled once (antialiased) to four zooms, each at least ``rows × cols``: a scene's
    background is then a plain crop, with no per-scene resampling."""
    from sklearn.datasets import load_sample_image  # bundled in the scikit-learn wheel (no download)

    photo = torch.from_numpy(np.asarray(load_sample_image(name), np.float32) / 255.0).permute(2, 0, 1)[None]
    out = []
    for frac in (0.5, 0.65, 0.8, 0.95):  # the crop covers this fraction of the photo's height (when wide enough)
        scale = min(1.0, max(rows / frac / photo.shape[2], cols / (photo.shape[3] - 1)))
        size = (max(rows, int(round(photo.shape[2] * scale))), max(cols, int(round(photo.shape[3] * scale))))
        small = F.interpolate(photo, size=size, mode="bilinear", antialias=True, align_corners=False)[0]
        out.append(np.ascontiguousarray(small.permute(1, 2, 0).numpy()))
    return tuple(out)


def _background(cfg: DomainConfig, rng: np.random.Generator) -> np.ndarray:
    """A random ``rows × cols`` crop of the domain's photo at one of four zooms, times gain plus offset."""
    rows, cols = cfg.scene_hw
    photo = _photos(cfg.background, rows, cols)[int(rng.integers(4))]
    r, c = int(rng.integers(0, photo.shape[0] - rows + 1)), int(rng.integers(0, photo.shape[1] - cols + 1))
    return photo[r:r + rows, c:c + cols] * cfg.bg_gain + cfg.bg_offset


@dataclass
class Scene:
    """One image ``(H, W, 3)`` in [0, 1], its person boxes ``(n, 4)`` as ``x1, y1, x2, y2`` and their pids."""

    image: np.ndarray
    boxes: np.ndarray
    pids: np.ndarray


def make_scene(ids: list[Identity], domain_cfg: DomainConfig, rng: np.random.Generator) -> Scene:
    """Paste one rendered instance of each identity on a background crop, far persons first, then apply the
    domain's camera (blur, noise). Persons stand on the lower part of the image; boxes are the sprites' extents."""
    if not ids:
        raise ValueError("a scene needs at least one identity")
    rows, cols = domain_cfg.scene_hw
    img = _background(domain_cfg, rng)
    placed: list[tuple[np.ndarray, int, int]] = []
    boxes = []
    for idt in ids:
        h = float(rng.uniform(*domain_cfg.height_range))
        sprite = render_person(idt, min(h, rows - 2), sample_nuisance(rng), squash=domain_cfg.squash)
        sh, sw = sprite.shape[:2]
        for _ in range(20):  # a few tries for a place that does not hide much of an earlier person
            x0 = int(rng.integers(0, max(1, cols - sw)))
            y0 = int(rng.integers(max(0, int(0.55 * rows) - sh), rows - sh + 1))
            box = np.array([x0, y0, x0 + sw, y0 + sh], np.float32)
            if not boxes or _iou(box[None], np.stack(boxes)).max() < 0.3:
                break
        placed.append((sprite, x0, y0))
        boxes.append(box)
    for k in np.argsort([y0 + s.shape[0] for s, _, y0 in placed], kind="stable"):  # far (higher feet) first
        sprite, x0, y0 = placed[k]
        sh, sw = sprite.shape[:2]
        region = img[y0:y0 + sh, x0:x0 + sw]
        img[y0:y0 + sh, x0:x0 + sw] = sprite[..., :3] + (1.0 - sprite[..., 3:]) * region
    if domain_cfg.blur > 0:
        img = gaussian_filter(img, sigma=(domain_cfg.blur, domain_cfg.blur, 0.0), mode="nearest")
    if domain_cfg.noise > 0:
        img = img + rng.normal(0.0, domain_cfg.noise, img.shape).astype(np.float32)
    return Scene(np.clip(img, 0.0, 1.0).astype(np.float32), np.stack(boxes),
                 np.array([i.pid for i in ids], np.int64))


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU between every box of ``a (n, 4)`` and ``b (m, 4)``."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area = lambda z: (z[:, 2] - z[:, 0]) * (z[:, 3] - z[:, 1])  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None, :] - inter)


@dataclass
class Split:
    """Scenes of one domain: images ``(S, H, W, 3)`` uint8 and, per person, box, pid and scene index."""

    domain: str
    images: np.ndarray
    boxes: np.ndarray
    pids: np.ndarray
    scene: np.ndarray

    def __len__(self) -> int:
        return len(self.pids)


def make_split(domain: DomainConfig, n_scenes: int, id_pool: list[Identity], seed: int) -> Split:
    """``n_scenes`` scenes of ``domain`` whose persons cycle through a shuffled ``id_pool`` (each identity at most
    once per scene, all identities about equally often). Scene ``i`` draws from ``default_rng((seed, i))`` only,
    so a scene does not depend on the others or on any global generator."""
    lo, hi = domain.persons
    if n_scenes < 1 or len(id_pool) < hi:
        raise ValueError(f"need n_scenes >= 1 and at least {hi} identities, got {n_scenes} and {len(id_pool)}")
    order = np.random.default_rng([seed, 104729]).permutation(len(id_pool))
    images, boxes, pids, scene_of = [], [], [], []
    cursor = 0
    for i in range(n_scenes):
        rng = np.random.default_rng([seed, i])
        k = int(rng.integers(lo, hi + 1))
        members = [id_pool[order[(cursor + t) % len(id_pool)]] for t in range(k)]
        cursor += k
        sc = make_scene(members, domain, rng)
        images.append(np.round(sc.image * 255).astype(np.uint8))
        boxes.append(sc.boxes)
        pids.append(sc.pids)
        scene_of.append(np.full(k, i, np.int64))
    return Split(domain.name, np.stack(images), np.concatenate(boxes), np.concatenate(pids),
                 np.concatenate(scene_of))


def crop_rois(split: Split, out_hw: tuple[int, int] = (64, 32), *, index: np.ndarray | None = None,
              device: torch.device | str = "cpu", sampling: int = 2, chunk: int = 32) -> torch.Tensor:
    """Oracle-box crops ``(n, 3, h, w)`` in [0, 1], in the order of ``index`` (default: every person). Each box is
    cut from its scene and resized RoIAlign-style: bilinear samples on a ``sampling``× finer grid, averaged per
    output pixel. Batched with one ``grid_sample`` per chunk of scenes (each scene's boxes stacked in its grid)."""
    idx = np.arange(len(split)) if index is None else np.asarray(index, np.int64)
    if idx.size == 0:
        raise ValueError("no boxes to crop")
    oh, ow = out_hw[0] * sampling, out_hw[1] * sampling
    rows, cols = split.images.shape[1:3]
    scenes, slot = np.unique(split.scene[idx], return_inverse=True)
    rank = np.zeros(len(idx), np.int64)  # position of each box among the selected boxes of its scene
    order = np.argsort(slot, kind="stable")
    starts = np.searchsorted(slot[order], np.arange(len(scenes)))
    rank[order] = np.arange(len(idx)) - starts[slot[order]]
    per = int(rank.max()) + 1
    ty = (torch.arange(oh, device=device, dtype=torch.float32) + 0.5) / oh
    tx = (torch.arange(ow, device=device, dtype=torch.float32) + 0.5) / ow
    out = torch.empty(len(idx), 3, *out_hw, device=device)
    for c0 in range(0, len(scenes), chunk):
        sel = np.nonzero((slot >= c0) & (slot < c0 + chunk))[0]
        imgs = torch.as_tensor(split.images[scenes[c0:c0 + chunk]], device=device).permute(0, 3, 1, 2).float() / 255
        b = torch.as_tensor(split.boxes[idx[sel]], device=device, dtype=torch.float32)
        ys = b[:, 1, None] + ty[None] * (b[:, 3] - b[:, 1])[:, None]  # sample positions in pixels
        xs = b[:, 0, None] + tx[None] * (b[:, 2] - b[:, 0])[:, None]
        grid = torch.zeros(len(imgs), per, oh, ow, 2, device=device)
        s_loc, r_loc = torch.as_tensor(slot[sel] - c0, device=device), torch.as_tensor(rank[sel], device=device)
        grid[s_loc, r_loc, ..., 0] = (2 * xs / cols - 1)[:, None, :].expand(-1, oh, -1)
        grid[s_loc, r_loc, ..., 1] = (2 * ys / rows - 1)[:, :, None].expand(-1, -1, ow)
        fine = F.grid_sample(imgs, grid.view(len(imgs), per * oh, ow, 2), mode="bilinear", padding_mode="border",
                             align_corners=False).view(len(imgs), 3, per, oh, ow)
        out[torch.as_tensor(sel, device=device)] = F.avg_pool2d(fine[s_loc, :, r_loc], sampling)
    return out
