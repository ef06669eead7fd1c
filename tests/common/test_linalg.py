"""repro.common.linalg: Muon's Newton–Schulz iteration and the exact polar factor (users: papers 01 and 19)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

from repro.common.linalg import NS5_COEFFS, newton_schulz5, polar


@pytest.mark.parametrize("shape", [(64, 32), (32, 64), (48, 48)])
def test_ns5_band_and_direction(shape):
    g = torch.Generator().manual_seed(0)
    G = torch.randn(*shape, generator=g, dtype=torch.float64)
    X = newton_schulz5(G)
    s = torch.linalg.svdvals(X)
    assert s.min() >= 0.5 and s.max() <= 1.5  # Muon's documented band, not exactly 1
    U = scipy.linalg.polar(G.numpy())[0] if shape[0] >= shape[1] else scipy.linalg.polar(G.numpy().T)[0].T
    cos = float((X.numpy() * U).sum() / (np.linalg.norm(X.numpy()) * np.linalg.norm(U)))
    assert cos >= 0.9


def test_ns5_is_batched_and_keeps_dtype():
    G = torch.randn(7, 16, 24, dtype=torch.float32)
    X = newton_schulz5(G)
    assert X.shape == G.shape and X.dtype == torch.float32
    for i in range(7):
        torch.testing.assert_close(X[i], newton_schulz5(G[i]), rtol=1e-5, atol=1e-5)
    assert newton_schulz5(G, dtype=torch.bfloat16).dtype == torch.float32


def test_public_coefficients_and_bad_input():
    assert NS5_COEFFS == (3.4445, -4.7750, 2.0315)
    with pytest.raises(ValueError, match="matrix"):
        newton_schulz5(torch.ones(3))


def test_polar_matches_scipy_and_is_batched():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    P = polar(X)
    for i in range(3):
        ref, _ = scipy.linalg.polar(X[i].numpy())
        torch.testing.assert_close(P[i], torch.from_numpy(ref))
    with pytest.raises(ValueError, match="matrix"):
        polar(torch.ones(3))
