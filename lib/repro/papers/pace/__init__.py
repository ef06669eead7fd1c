"""PACE: a real, lossless learned octree codec for LiDAR scans, with stage-scalable decoding.

Paper: J. Zhu, K. You, D. Ding, Z. Ma, "PACE: Post-Causal Entropy Modeling for Learned LiDAR Point Cloud
Compression", ICML 2026 (arXiv 2605.01320; code github.com/3dpcc/PACE). Notebook: ``notebooks/09-pace-lidar.ipynb``.

* :mod:`repro.pace.lidar`: procedural street scenes and a spinning 64-beam sensor, ray-cast analytically
  (KITTI cannot be downloaded here).
* :mod:`repro.pace.octree`: quantisation, Morton order, occupancy bytes per level, ancestor contexts, rebuild.
* :mod:`repro.pace.model`: PACE (non-causal backbone once per window + stage-scalable causal predictor), the
  coupled causal-backbone baseline (with and without KV cache), an ancestors-only MLP and a count table.
* :mod:`repro.pace.codec`: ``encode(points, model, depth, mode) -> bytes`` / ``decode(bytes, model) -> points``
  with ``constriction``'s ANS coder; damaged streams raise :class:`~repro.pace.codec.CorruptStream`.
* :mod:`repro.pace.metrics`: bits per input point, D1 PSNR, BD-rate.
"""

from .codec import (
    CorruptStream,
    Encoded,
    decode,
    decode_level,
    decode_quantized,
    encode,
    encode_detailed,
    encode_level,
    pmf_to_freq,
)
from .lidar import Scene, make_scans, make_scene, ray_cast, spin_lidar
from .metrics import bd_rate, bits_per_point, d1_mse, d1_psnr
from .model import (
    AncestorMLP,
    CountTable,
    CoupledCausalModel,
    PACEModel,
    WindowData,
    cross_entropy_bits,
    stage_prev,
    train,
)
from .octree import Grid, Octree, build_octree, dequantize, level_context, octree_contexts, quantize, rebuild

__all__ = [
    "AncestorMLP", "CorruptStream", "CountTable", "CoupledCausalModel", "Encoded", "Grid", "Octree", "PACEModel",
    "Scene", "WindowData", "bd_rate", "bits_per_point", "build_octree", "cross_entropy_bits", "d1_mse", "d1_psnr",
    "decode", "decode_level", "decode_quantized", "dequantize", "encode", "encode_detailed", "encode_level",
    "level_context", "make_scans", "make_scene", "octree_contexts", "pmf_to_freq", "quantize", "ray_cast", "rebuild",
    "spin_lidar", "stage_prev", "train",
]
