"""PACE: a real, lossless learned octree codec for LiDAR scans, with stage-scalable decoding.

Paper: J. Zhu, K. You, D. Ding, Z. Ma, "PACE: Post-Causal Entropy Modeling for Learned LiDAR Point Cloud
Compression", ICML 2026 (arXiv 2605.01320). Notebook: ``notebooks/09-pace-lidar.ipynb``. Public code checked
against: github.com/3dpcc/PACE (the stream layout, the stage schedule and the 16-bit frequency rule of
``utils/helper.py``); the implementation is ours.

Quick start::

    >>> import numpy as np, torch
    >>> from repro.papers import pace
    >>> scan = pace.make_scans([0], n_beams=16, n_az=256)[0]  # one ray-cast street scan: (N, 3) points, metres
    >>> _ = torch.manual_seed(0); model = pace.PACEModel(d=16, n_layers=1, n_heads=2, window=16).eval()  # untrained
    >>> data = pace.encode(scan, model, depth=10)  # octree occupancy, ANS-coded: bytes
    >>> voxels, grid = pace.decode_quantized(data, model)  # pace.decode: metres
    >>> same = np.array_equal(np.unique(voxels, axis=0), np.unique(pace.quantize(scan, grid), axis=0))
    >>> print(len(scan) > 3000, same, 8 * len(data) / len(voxels) < 10)  # lossless; < 10 bits per voxel (raw 30)
    True True True

* :mod:`repro.papers.pace.lidar`: procedural street scenes and a spinning 64-beam sensor, ray-cast analytically
  (KITTI cannot be downloaded here).
* :mod:`repro.papers.pace.octree`: quantisation, Morton order, occupancy bytes per level, ancestor contexts, rebuild.
* :mod:`repro.papers.pace.model`: PACE (non-causal backbone once per window + stage-scalable causal predictor), the
  coupled causal-backbone baseline (with and without KV cache), an ancestors-only MLP, a count table, and
  :func:`~repro.papers.pace.model.train` (on :func:`repro.common.train.fit`).
* :mod:`repro.papers.pace.codec`: ``encode(points, model, depth, mode) -> bytes`` / ``decode(bytes, model) -> points``
  with ``constriction``'s ANS coder; damaged streams raise :class:`~repro.papers.pace.codec.CorruptStream`.
* :mod:`repro.papers.pace.metrics`: bits per input point, D1 PSNR, BD-rate.
* :mod:`repro.papers.pace.experiment`: the notebook's harness (corpus, training, rate–distortion sweep, lossless
  and coder-limit checks, decoding latency, bits per level).

Deliberate deviations from the paper and its code:

* data: generated scans (procedural streets, an HDL-64E-like sensor), not KITTI / Ford / nuScenes; Cartesian
  quantisation in a fixed 256 m cube (no spherical quantiser, no multi-level range split);
* model: the public code's structure at a tiny size, a 1-D convolution along the Morton order instead of the kNN
  EdgeConv, and a diagonal linear state-space layer instead of the Mamba block (``mamba-ssm`` needs CUDA);
* training (the paper's code is unreleased): a random stage count per batch with the decoder's own stage masks;
* coder: ``constriction``'s ANS instead of the authors' C++ rANS; the 16-bit rule's leftover mass goes to the most
  likely symbol so that every table sums to exactly 2^16;
* baselines: the coupled causal model shares PACE's embedding, convolution and blocks; G-PCC has no Python binding
  here, Draco (DracoPy) is the real codec compared with.
"""

from repro.papers import lazy_exports

from .codec import *
from .lidar import *
from .metrics import *
from .model import *
from .octree import *

# The harness and what it compares with import their dependencies on first use (repro.papers.lazy_exports).
_LAZY = {
    "experiment": [
        "Corpus", "LatencySlice", "Models", "RateDistortion", "Recipe", "coder_overhead", "count_lossless_failures",
        "backbone_calls", "decode_times", "largest_stage_rise", "latency_slice", "level_bits", "make_corpus",
        "moving_average", "order_inversions", "rate_distortion", "scan_bits", "scan_window_bits",
        "stage_bpp", "train_models", "train_single_stage", "train_two_group",
    ],
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)

__all__ = [
    *codec.__all__, *lidar.__all__, *metrics.__all__, *model.__all__, *octree.__all__, *_LAZY["experiment"],
]
