"""Data of paper 16: the Gaussian mixtures of the notebook's exact experiments (two symmetric classes, a
hierarchical four-class mixture) and scikit-learn's bundled handwritten digits (shipped inside the wheel, no
download), scaled to ``[-1, 1]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .method import GaussianMixture, Tensor

__all__ = ["Digits", "hierarchical_mixture", "load_digits", "two_class_mixture"]


def two_class_mixture(d: int, *, device: torch.device | str = "cpu",
                      dtype: torch.dtype = torch.float64) -> GaussianMixture:
    """Two equiprobable classes ``±m`` with ``m = √d e₁`` (so ``‖m‖² = d``) and unit covariance."""
    if d < 1:
        raise ValueError(f"need d >= 1, got {d}")
    mu = torch.zeros(d, dtype=dtype, device=device)
    mu[0] = math.sqrt(d)
    return GaussianMixture.isotropic(torch.stack([mu, -mu]), 1.0)


def hierarchical_mixture(d: int = 32, coarse_sep: float = 6.0, fine_sep: float = 2.0, *,
                         device: torch.device | str = "cpu",
                         dtype: torch.dtype = torch.float64) -> tuple[GaussianMixture, Tensor]:
    """Four unit-covariance classes in two groups: group centres ``±(coarse_sep/2) e₁``, classes within a group
    ``±(fine_sep/2) e₂``. Returns the mixture and the partition ``[0, 0, 1, 1]`` into the two groups. The default
    (6 apart, 2 apart) is a hierarchy: the groups are far apart. ``coarse_sep < fine_sep`` reverses the geometry:
    the groups are then the *close* split, the control for coarse-before-fine."""
    if d < 2:
        raise ValueError(f"need d >= 2, got {d}")
    if not (coarse_sep > 0 and fine_sep > 0):
        raise ValueError(f"separations must be positive, got {coarse_sep}, {fine_sep}")
    centres = torch.zeros(4, d, dtype=dtype, device=device)
    centres[:, 0] = torch.tensor([1.0, 1.0, -1.0, -1.0]) * coarse_sep / 2
    centres[:, 1] = torch.tensor([1.0, -1.0, 1.0, -1.0]) * fine_sep / 2
    return GaussianMixture.isotropic(centres, 1.0), torch.tensor([0, 0, 1, 1], device=device)


@dataclass
class Digits:
    """scikit-learn's 1797 handwritten 8×8 digits: ``X`` (float32, pixels scaled to ``[-1, 1]``), labels ``y``
    and the entropy of the label frequencies ``prior_entropy`` (nats)."""

    X: Tensor
    y: Tensor
    prior_entropy: float

    @property
    def n_classes(self) -> int:
        return int(self.y.max()) + 1


def load_digits(device: torch.device | str = "cpu") -> Digits:
    """The digits from ``sklearn.datasets.load_digits`` (bundled with scikit-learn; nothing is downloaded)."""
    from sklearn.datasets import load_digits as sk_load_digits

    digits = sk_load_digits()
    X = torch.as_tensor(digits.data / 8.0 - 1.0, dtype=torch.float32, device=device)
    y = torch.as_tensor(digits.target, device=device)
    counts = torch.bincount(y).double()
    prior = float(-(counts / counts.sum() * torch.log(counts / counts.sum())).sum())
    return Digits(X=X, y=y, prior_entropy=prior)
