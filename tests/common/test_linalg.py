"""repro.common.linalg: Muon's Newton–Schulz iteration and the exact polar factor (users: papers 01 and 19)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.linalg
import torch

from repro.common.linalg import NS5_COEFFS, newton_schulz5, polar


def _quintic5(x: np.ndarray) -> np.ndarray:
    """NS5 on one singular value: x = σ/‖G‖_F through p(x) = a x + b x³ + c x⁵, five times."""
    a, b, c = NS5_COEFFS
    for _ in range(5):
        x = a * x + b * x**3 + c * x**5
    return x


@pytest.mark.parametrize("shape", [(64, 32), (32, 64), (48, 48), (256, 256)])
def test_ns5_acts_on_each_singular_value_by_the_quintic(shape):
    g = torch.Generator().manual_seed(0)
    G = torch.randn(*shape, generator=g, dtype=torch.float64)
    X = newton_schulz5(G)
    s_in = torch.linalg.svdvals(G) / (torch.linalg.matrix_norm(G) + 1e-7)   # NS5's own normalisation
    want = np.sort(_quintic5(s_in.numpy()))[::-1]          # the quintic is not monotone: compare sorted
    np.testing.assert_allclose(torch.linalg.svdvals(X).numpy(), want, rtol=1e-7, atol=1e-9)
    s = torch.linalg.svdvals(X)
    assert s.max() <= 1.21
    if shape[0] != shape[1]:
        assert s.min() >= 0.68                       # tall and wide Gaussian matrices stay in the band
    if shape == (256, 256):
        assert s.min() < 0.5                         # a square one does not: its smallest singular values are tiny
    U = scipy.linalg.polar(G.numpy())[0] if shape[0] >= shape[1] else scipy.linalg.polar(G.numpy().T)[0].T
    cos = float((X.numpy() * U).sum() / (np.linalg.norm(X.numpy()) * np.linalg.norm(U)))
    assert cos >= 0.9


def test_ns5_docstring_states_the_real_singular_value_band():
    # issue 12: the docstring must state the band NS5 actually maps singular values into, and where it holds
    doc = " ".join((newton_schulz5.__doc__ or "").split())
    band = re.search(r"lies in \[(\d\.\d+), (\d\.\d+)\] for σ/‖G‖_F ≥ ([\d.]+e-\d+)", doc)
    assert band, "the NS5 docstring must state its singular-value band"
    lo, hi, x_min = (float(v) for v in band.groups())
    x = np.logspace(np.log10(x_min), 0, 200_001)
    y = _quintic5(x)
    assert y.min() >= lo and y.max() <= hi
    assert _quintic5(np.logspace(-8, 0, 200_001)).max() <= hi          # never above the band, at any input
    assert _quintic5(np.array([x_min / 1.6])) < lo                      # and below x_min it falls short
    top = re.search(r"never exceeds (\d\.\d+)", doc)
    assert top and float(top.group(1)) == hi


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
