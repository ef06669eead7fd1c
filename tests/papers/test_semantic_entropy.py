"""repro.semantic_entropy against independent references: scipy densities, Monte Carlo, exact quadrature,
Tweedie's formula, and limits that hold for any data (one-hot at no noise, the prior at full noise)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import logsumexp

from repro.papers import semantic_entropy as se

VP, VE = se.VP(), se.VE()


def gmm(d: int = 3, K: int = 3, seed: int = 0) -> se.GaussianMixture:
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(K, d, generator=g, dtype=torch.float64) * 2
    A = torch.randn(K, d, d, generator=g, dtype=torch.float64)
    covs = A @ A.mT / d + 0.3 * torch.eye(d, dtype=torch.float64)
    w = torch.rand(K, generator=g, dtype=torch.float64) + 0.2
    return se.GaussianMixture(means, covs, w / w.sum())


@pytest.mark.parametrize("sched, t", [(VP, 0.3), (VP, 1.7), (VE, 0.5), (VE, 3.0)])
def test_schedule_snr_round_trip(sched, t):
    t = torch.tensor(t, dtype=torch.float64)
    assert torch.isclose(sched.t_of_snr(sched.snr(t)), t, rtol=1e-12)


@pytest.mark.parametrize("sched", [VP, VE])
def test_posterior_matches_scipy(sched):
    m = gmm()
    t = torch.tensor(0.8, dtype=torch.float64)
    x = torch.randn(20, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 2
    a, s = float(sched.alpha(t)), float(sched.sigma(t))
    logl = np.stack([stats.multivariate_normal(a * mu, a**2 * C + s**2 * np.eye(3)).logpdf(x.numpy())
                     for mu, C in zip(m.means.numpy(), m.covs.numpy(), strict=True)], 1) + np.log(m.weights.numpy())
    want = logl - logsumexp(logl, axis=1, keepdims=True)
    np.testing.assert_allclose(m.log_posterior(x, t, sched).numpy(), want, atol=1e-10)


def test_tweedie_relates_denoiser_and_score():
    m = gmm()
    x = torch.randn(50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for t in (0.2, 1.0, 2.5):
        t = torch.tensor(t, dtype=torch.float64)
        a, s = VP.alpha(t), VP.sigma(t)
        torch.testing.assert_close(m.denoiser(x, t, VP), (x + s**2 * m.score(x, t, VP)) / a)
        y = torch.randint(3, (50,), generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(m.denoiser(x, t, VP, y), (x + s**2 * m.score(x, t, VP, y)) / a)


def test_score_matches_finite_differences():
    m = gmm()
    x = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    t = torch.tensor(0.7, dtype=torch.float64)

    def logp(z):
        return torch.logsumexp(m.log_likelihood(z, t, VP) + m.weights.log(), dim=1)

    h = 1e-6
    fd = torch.stack([(logp(x + h * e) - logp(x - h * e)) / (2 * h) for e in torch.eye(3, dtype=torch.float64)], 1)
    torch.testing.assert_close(m.score(x, t, VP), fd, atol=1e-6, rtol=1e-6)


def test_two_class_quadrature_against_monte_carlo():
    d = 16
    mu = torch.zeros(d, dtype=torch.float64)
    mu[0] = math.sqrt(d)
    m = se.GaussianMixture.isotropic(torch.stack([mu, -mu]), 1.0)
    g = torch.Generator().manual_seed(0)
    x0, _ = m.sample(200_000, g)
    ts = torch.tensor([0.5, 1.0, 1.5, 2.5], dtype=torch.float64)
    mc = se.conditional_entropy_mc(lambda x, t: m.log_posterior(x, t, VP), x0, ts, VP, g)
    exact = se.entropy_two_class(se.two_class_snr_statistic(ts, VP, float(d)))
    assert (mc - exact).abs().max() < 3e-3
    assert torch.isclose(se.entropy_two_class(torch.tensor(0.0)), torch.tensor(math.log(2), dtype=torch.float64))


@pytest.mark.parametrize("form", ["squared", "difference"])
def test_mmse_gap_reproduces_the_exact_entropy(form):
    d = 16
    mu = torch.zeros(d, dtype=torch.float64)
    mu[0] = math.sqrt(d)
    m = se.GaussianMixture.isotropic(torch.stack([mu, -mu]), 1.0)
    g = torch.Generator().manual_seed(0)
    x0, y = m.sample(20_000, g)
    grid = torch.linspace(0.02, 12, 300, dtype=torch.float64)
    H = se.mmse_gap_entropy(lambda x, t, lab: m.denoiser(x, t, VP, lab), x0, y, grid, VP, m.prior_entropy, g,
                            form=form)
    exact = se.entropy_two_class(se.two_class_snr_statistic(grid, VP, float(d)))
    check = (grid > 0.4) & (grid < 4)
    assert (H[check] - exact[check]).abs().max() < 0.01


def test_entropy_is_non_decreasing_and_partitions_lose_information():
    m = gmm(d=4, K=4)
    g = torch.Generator().manual_seed(5)
    x0, _ = m.sample(20_000, g)
    ts = torch.linspace(0.05, 4, 25, dtype=torch.float64)
    part = torch.tensor([0, 0, 1, 1])
    fine = se.conditional_entropy_mc(lambda x, t: m.log_posterior(x, t, VP), x0, ts, VP,
                                     torch.Generator().manual_seed(6))
    coarse = se.conditional_entropy_mc(lambda x, t: m.log_posterior(x, t, VP, part), x0, ts, VP,
                                       torch.Generator().manual_seed(6))
    ident = se.conditional_entropy_mc(lambda x, t: m.log_posterior(x, t, VP, torch.arange(4)), x0, ts, VP,
                                      torch.Generator().manual_seed(6))
    assert (torch.diff(fine) > -2e-3).all()  # non-decreasing up to Monte-Carlo noise (common random numbers)
    assert (coarse <= fine + 1e-12).all()
    torch.testing.assert_close(ident, fine)
    assert fine[-1] <= m.prior_entropy + 1e-9


def test_empirical_posterior_limits():
    g = torch.Generator().manual_seed(7)
    X = torch.randn(60, 5, dtype=torch.float64, generator=g)
    y = torch.arange(60) % 3
    prior = math.log(3)
    ts = torch.tensor([1e-3, 12.0], dtype=torch.float64)
    H = se.conditional_entropy_mc(lambda x, t: se.empirical_log_posterior(X, y, x, t, VP, 3), X, ts, VP, g)
    assert H[0] < 1e-6  # no noise: every training point identifies its own label
    assert abs(H[1] - prior) < 1e-6  # full noise: the prior
    loo = se.empirical_log_posterior(X, y, VP.noise(X, ts[0], 0 * X), ts[0], VP, 3, exclude_self=True)
    assert torch.isfinite(loo).any(dim=1).all()
    with pytest.raises(ValueError, match="exclude_self"):
        se.empirical_log_posterior(X, y, X[:5], ts[0], VP, 3, exclude_self=True)


def test_peak_width_and_crossing_of_a_known_curve():
    t = torch.linspace(0, 10, 2001, dtype=torch.float64)
    rate = torch.exp(-0.5 * ((t - 4.2) / 0.7) ** 2)
    assert se.peak_time(t, rate) == pytest.approx(4.2, abs=1e-4)
    assert se.fwhm(t, rate) == pytest.approx(2 * math.sqrt(2 * math.log(2)) * 0.7, abs=1e-3)
    H = torch.tanh(t - 3)
    assert se.crossing_time(t, H, 0.0) == pytest.approx(3.0, abs=1e-6)


def test_guidance_without_weight_samples_the_class():
    mu = torch.tensor([[3.0, 0.0], [-3.0, 0.0]], dtype=torch.float64)
    m = se.GaussianMixture.isotropic(mu, 0.25)
    y = torch.zeros(2000, dtype=torch.long)
    states, H = se.guided_trajectories(m, y, 0.0, torch.linspace(6, 1e-3, 300, dtype=torch.float64),
                                       torch.Generator().manual_seed(8))
    final = states[-1]
    assert torch.allclose(final.mean(0), mu[0], atol=0.1)
    assert abs(final[:, 0].std() - 0.5) < 0.05
    assert H[0] > 0.6 and H[-1] < 1e-3


def test_bad_input():
    with pytest.raises(ValueError, match="probability"):
        se.GaussianMixture.isotropic(torch.zeros(2, 2), 1.0, weights=torch.tensor([0.5, 0.6]))
    with pytest.raises(ValueError, match="partition"):
        gmm().log_posterior(torch.zeros(1, 3, dtype=torch.float64), torch.tensor(1.0), VP, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="form"):
        se.mmse_gap_entropy(lambda *a: a[0], torch.zeros(2, 2), torch.zeros(2), torch.ones(3), VP, 0.0, form="x")
    with pytest.raises(ValueError, match="decreasing"):
        se.guided_trajectories(gmm(), torch.zeros(2, dtype=torch.long), 1.0, torch.linspace(0.1, 1, 5))
