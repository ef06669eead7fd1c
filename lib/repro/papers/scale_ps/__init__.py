"""SCALE on a procedural person-search benchmark: the scale gap, pseudo-label UDA, SDH and BCR.

Paper: "SCALE: Scale-Aware Consistent Alignment Learning for UDA Person Search", ICML 2026 (OpenReview rrpMQ1BeOl).
Notebook: ``notebooks/14-scale-person-search.ipynb``.

Quick start::

    >>> import numpy as np
    >>> from repro.papers import scale_ps
    >>> feats, truth = scale_ps.planted_clusters(8, 6, 32, 0.2, np.random.default_rng(0), glued=1, glue=0.8)
    >>> # 8 identities × 6 re-ID features (unit vectors); identities 0 and 1 look alike (centres 0.8 apart)
    >>> first, bcr = scale_ps.bcr_labels(feats, k1=12, k2=4)  # DBSCAN on the Jaccard distance, then BCR + DBSCAN
    >>> print(len(set(first)), len(set(bcr)), np.array_equal(bcr, truth))  # BCR splits the glued pair
    7 8 True

SCALE adapts a person-search model (SeqNet-style detector + re-ID head, DAPS-style domain adaptation) from a labeled
source domain to an unlabeled target whose persons appear at another scale. It adds **SDH** (Scale-aware Domain
Harmonization: triplet attention + multi-scale convolutions + a SimAM-style refinement in the RoI head,
:mod:`.modules`) and **BCR** (Bidirectional Cluster Regularization: split and merge penalties on the k-reciprocal
Jaccard distance before a second DBSCAN, :mod:`.cluster`), with a cluster-proxy memory (:mod:`.memory`).

**Public code checked against:** github whbdmu/SCALE @ c024bd4 (the abstract's "whhbdmu" is a typo):
``models/resnet_scale.py`` (SDH, SIA, TA, MSC, SCR), ``utils/utils.py`` (split/merge matrices), ``train.py`` (the
clustering loop: Jaccard k1 = 30, k2 = 6; DBSCAN eps 0.5, min_samples 4, twice), ``models/cpm.py`` (memory),
``eval_func.py`` (the CUHK-SYSU/PRW protocol), and SpCL's ``faiss_rerank.py`` (Jaccard distance) as vendored by DAPS.

Deliberate deviations (CUHK-SYSU, PRW and ImageNet weights cannot be had offline):

* Data: a procedural benchmark (:mod:`.synth`): rendered persons on scikit-learn's two bundled photos; the target
  domain has small persons, a tilted camera, blur and noise. Identities of source, target and test are disjoint.
* Model: a small CNN (:mod:`.network`) instead of ResNet-50; re-ID with **oracle boxes** in quick mode (crops cut
  from the scenes RoIAlign-style); full mode adds a tiny CenterNet-style detector (:mod:`.detector`).
* Domain adaptation: no adversarial domain classifiers; domain-specific BN *statistics* (AdaBN on the target) with
  shared weights; UDA fine-tunes the RoI head (SDH, res5, embedding) on cached backbone maps (budget). Both heads
  (with and without SDH) share one backbone trained on the source.
* Clustering: Jaccard k1 = 12, k2 = 4 (the code's k1 = 30 exceeds an identity's 5-7 crops here); DBSCAN outliers
  are left out of the fine-tuning batches (the code keeps them as singleton classes; a pilot here did not gain from
  them); the spectral clustering in BCR is seeded.
* Memory: no hard-negative proxies (oracle boxes give no background proposals).

Layout: :mod:`.synth` (renderer, scenes, splits, RoI crops), :mod:`.modules` (SDH and parts), :mod:`.network`,
:mod:`.cluster` (Jaccard, DBSCAN, BCR), :mod:`.memory`, :mod:`.evaluate` (mAP/top-1), :mod:`.detector` (full mode),
:mod:`.experiment` (the notebook's harness).
"""

from . import cluster, detector, evaluate, experiment, memory, modules, network, synth
from .cluster import *
from .evaluate import *
from .experiment import *
from .memory import *
from .modules import *
from .network import *
from .synth import *

__all__ = [
    *cluster.__all__, *evaluate.__all__, *experiment.__all__, *memory.__all__, *modules.__all__, *network.__all__,
    *synth.__all__, "cluster", "detector", "evaluate", "experiment", "memory", "modules", "network", "synth",
]
