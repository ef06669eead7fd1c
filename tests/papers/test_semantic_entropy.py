"""repro.papers.semantic_entropy against independent references: scipy densities, Monte Carlo, exact quadrature,
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


# ------------------------------------------------------------------ training on repro.common.train.fit

def _reference_training(X, y, seed):
    """The hand-written loops the models were trained with before fit(): Adam, cosine annealing for the denoiser,
    draws in the order index, log-SNR, noise (, label drop)."""
    torch.manual_seed(seed)
    model = se.ConditionalDenoiser(X.shape[1], 3, width=32)
    gen = torch.Generator().manual_seed(seed + 1)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 30)
    den = []
    for _ in range(30):
        idx = torch.randint(len(X), (16,), generator=gen)
        x0, lab = X[idx], y[idx].clone()
        lam = -9 + 18 * torch.rand(16, generator=gen, dtype=X.dtype)
        t = VP.t_of_snr(lam.exp())
        eps = torch.randn(x0.shape, generator=gen, dtype=X.dtype)
        a, s = VP.alpha(t)[:, None], VP.sigma(t)[:, None]
        lab[torch.rand(16, generator=gen) < 0.5] = 3
        loss = ((model(a * x0 + s * eps, lam, lab) - (a * eps - s * x0)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        den.append(loss.item())
    clf = se.NoisyClassifier(X.shape[1], 3, width=16)
    opt = torch.optim.Adam(clf.parameters(), lr=2e-3)
    cls = []
    for _ in range(20):
        idx = torch.randint(len(X), (16,), generator=gen)
        lam = -9 + 18 * torch.rand(16, generator=gen, dtype=X.dtype)
        t = VP.t_of_snr(lam.exp())
        eps = torch.randn(X[idx].shape, generator=gen, dtype=X.dtype)
        loss = torch.nn.functional.cross_entropy(clf(VP.alpha(t)[:, None] * X[idx] + VP.sigma(t)[:, None] * eps,
                                                     lam), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        cls.append(loss.item())
    return den, cls, list(model.parameters()) + list(clf.parameters())


def test_training_on_fit_is_bit_identical_to_the_hand_written_loops():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(50, 4, generator=g), torch.arange(50) % 3
    den_ref, cls_ref, params_ref = _reference_training(X, y, seed=2)
    torch.manual_seed(2)
    model = se.ConditionalDenoiser(4, 3, width=32)
    gen = torch.Generator().manual_seed(3)
    den = se.train_denoiser(model, X, y, VP, 30, batch=16, generator=gen)
    clf = se.NoisyClassifier(4, 3, width=16)
    cls = se.train_classifier(clf, X, y, VP, 20, batch=16, generator=gen)
    assert den == den_ref and cls == cls_ref
    for p, q in zip(list(model.parameters()) + list(clf.parameters()), params_ref, strict=True):
        assert torch.equal(p, q)
    with pytest.raises(ValueError, match="VP"):
        se.train_denoiser(model, X, y, VE, 1)
    with pytest.raises(ValueError, match="NaN"):
        se.train_classifier(clf, X * float("nan"), y, VP, 1)
    with pytest.raises(ValueError, match="non-empty"):
        se.train_classifier(clf, X[:0], y[:0], VP, 1)


# ------------------------------------------------------------------ the notebook's harness

def test_speciation_shift_is_half_log_d_and_ve_width_grows_like_sqrt_d():
    # σ₀ = 1 under VP: S = 2 d e^{-2t}, so H depends on t − ½ ln d only (an exact shift, constant width)
    sp = se.speciation_vp([16, 256, 4096], [1.0, 2.0], points=1500)
    assert abs(sp.slopes[1.0] - 0.5) < 1e-3 and sp.width_spread[1.0] < 1e-2
    assert sp.peaks[1.0, 4096] - sp.peaks[1.0, 16] == pytest.approx(0.5 * math.log(256), abs=5e-3)
    assert sp.min_step >= -1e-12
    # VE with σ ≫ 1: S ≈ 2d/σ², a function of σ/√d, so the FWHM in σ scales like √d
    ve = se.ve_windows([1024, 16384], points=4000)
    assert ve.sqrt_prediction == 4.0 and abs(ve.growth / 4.0 - 1) < 0.02


def test_mmse_gap_check_with_exact_denoisers():
    r = se.mmse_gap_check(16, 5000, 150, [0.5, 1.0, 2.0], torch.Generator().manual_seed(0))
    assert r.idx == [int(torch.argmin((r.t - lv).abs())) for lv in (0.5, 1.0, 2.0)]
    assert r.error < 0.03
    assert se.two_class_mixture(9).means[0].square().sum() == pytest.approx(9.0)


def test_coarse_before_fine_and_guidance_on_the_hierarchical_mixture():
    gmm4, coarse = se.hierarchical_mixture()
    cf = se.coarse_vs_fine(gmm4, coarse, 4000, 30, torch.Generator().manual_seed(1))
    assert (cf.H_coarse <= cf.H_fine + 1e-12).all() and (cf.H_within >= -1e-12).all()
    assert cf.t_coarse > cf.t_fine
    # one posterior per time for both curves: the same numbers as two Monte-Carlo runs on the same draws
    g = torch.Generator().manual_seed(1)
    x0, _ = gmm4.sample(4000, g)
    seed = int(torch.randint(2**31, (1,), generator=g))
    ts = torch.linspace(0.02, 4, 30, dtype=torch.float64)
    for part, H in ((None, cf.H_fine), (coarse, cf.H_coarse)):
        mc = se.conditional_entropy_mc(lambda x, t, part=part: gmm4.log_posterior(x, t, VP, part), x0, ts, VP,
                                       torch.Generator().manual_seed(seed))
        torch.testing.assert_close(H, mc, rtol=0, atol=1e-12)
    gs = se.guidance_sweep(gmm4, [0.0, 3.0], n=200, steps=100, seed=2)
    assert abs(float(gs.entropy[0.0][0]) - math.log(4)) < 0.05 and float(gs.entropy[0.0][-1]) < 0.5 * math.log(4)
    assert gs.order_violations == 0 and 0 < gs.decision[0.0] <= gs.decision[3.0] < 4


def test_entropy_per_point_averages_to_the_monte_carlo_entropy():
    m = gmm(d=3, K=3)
    x0, _ = m.sample(500, torch.Generator().manual_seed(3))
    ts = torch.linspace(0.1, 2, 5, dtype=torch.float64)
    per = se.entropy_per_point(lambda x, t: m.log_posterior(x, t, VP), x0, ts, seed=4)
    mc = se.conditional_entropy_mc(lambda x, t: m.log_posterior(x, t, VP), x0, ts, VP, torch.Generator().manual_seed(4))
    assert per.shape == (5, 500)
    torch.testing.assert_close(per.mean(1), mc)


def _toy_digits() -> se.Digits:
    # four classes in two well-separated pairs: {0, 1} around +4 e₁, {2, 3} around −4 e₁, ±1 e₂ within a pair
    g = torch.Generator().manual_seed(5)
    centres = torch.tensor([[4.0, 1, 0, 0], [4, -1, 0, 0], [-4, 1, 0, 0], [-4, -1, 0, 0]])
    y = torch.arange(80) % 4
    X = centres[y] + 0.1 * torch.randn(80, 4, generator=g)
    return se.Digits(X=X, y=y, prior_entropy=math.log(4))


def test_digits_references_models_and_groups_on_a_toy_set():
    data = _toy_digits()
    ref = se.digits_reference(data, 16, torch.Generator().manual_seed(6))
    assert float(ref.H_emp[0]) < 1e-3 and abs(float(ref.H_emp[-1]) - math.log(4)) < 0.02   # one-hot → prior
    assert ref.window.any() and ref.tolerance >= round(ref.memorisation_gap, 3)
    groups = se.digit_groups(data, ref, n_groups=2, points=40, boot=200)
    assert groups.groups[0] == groups.groups[1] != groups.groups[2] == groups.groups[3]
    assert groups.t_coarse > groups.t_fine and all(0 < t < float(ref.t[-1]) for t in groups.decision.values())
    assert groups.ci[0] > 0 and groups.ci[0] <= groups.t_coarse - groups.t_fine <= groups.ci[1]
    assert groups.boot.shape == (200,) and len(groups.t) == 40 and (torch.diff(groups.t) > 0).all()
    assert (groups.H_coarse <= groups.H_fine + 1e-12).all()
    assert groups.delta.value == pytest.approx(groups.t_coarse - groups.t_fine, abs=1e-9)
    assert (groups.delta.lo, groups.delta.hi) == pytest.approx(groups.ci)          # the same resamples
    assert sorted(groups.random_groups) == sorted(groups.groups)                   # same sizes, labels permuted
    state = torch.get_rng_state()
    kw = dict(denoiser_steps=5, denoiser_width=16, clf_steps=5)
    a = se.digits_model(data, ref, torch.Generator().manual_seed(7), 0, **kw)
    b = se.digits_model(data, ref, torch.Generator().manual_seed(7), 0, **kw)
    assert torch.equal(torch.get_rng_state(), state)              # torch's global generator is left as it was
    assert a.losses == b.losses and torch.equal(a.H_model, b.H_model) and torch.equal(a.ce, b.ce)
    assert a.bound_slack == pytest.approx(float((a.ce.double() - ref.H_emp).min()))
    assert a.untrained_gap == b.untrained_gap and math.isfinite(a.untrained_gap)
    fit = se.digits_gmm(data, ref, n=2000)
    for c in range(4):                          # one Gaussian per class: its mean and (ridged) covariance
        Xc = ref.X64[data.y == c].numpy()
        assert fit.mixture.means[c].numpy() == pytest.approx(Xc.mean(0))
        assert fit.mixture.covs[c].numpy() == pytest.approx(np.cov(Xc.T, bias=True) + 1e-3 * np.eye(Xc.shape[1]))
    assert float(fit.H[0]) < 0.05 and abs(float(fit.H[-1]) - math.log(4)) < 0.05   # decided → the prior
    assert 0 < fit.t_peak < float(ref.t[-1]) and math.isfinite(fit.t_speciation)


def test_crossing_times_match_crossing_time_row_by_row_and_nan_without_a_crossing():
    t = np.linspace(0, 10, 301)
    H = np.stack([np.tanh(t - c) for c in (2.0, 4.5, 7.25)] + [np.full_like(t, -1.0)])
    got = se.crossing_times(t, H, 0.1)
    want = [se.crossing_time(torch.as_tensor(t), torch.as_tensor(h), 0.1) for h in H[:3]]
    assert got[:3] == pytest.approx(want, abs=1e-12) and math.isnan(got[3])


def test_peak_delta_and_smallest_decision_step_on_curves_with_known_shifts():
    rng = np.random.default_rng(0)
    t = np.linspace(0, 6, 241)
    noise = lambda: 0.02 * rng.standard_normal((len(t), 400))   # noqa: E731 - items around a known mean curve
    a = np.tanh(2 * (t - 3.5))[:, None] + noise()               # rate peak at 3.5
    b = np.tanh(2 * (t - 2.0))[:, None] + noise()               # rate peak at 2.0
    d = se.peak_delta(t, a, b, n_boot=300)
    assert d.value == pytest.approx(1.5, abs=0.02) and d.lo <= d.value <= d.hi and d.hi - d.lo < 0.2
    curves = [np.tanh(t - c)[:, None] + noise() for c in (1.0, 2.0, 2.5)]   # decision times 1, 2, 2.5 at level 0
    s = se.smallest_decision_step(t, curves, 0.0, n_boot=300)
    assert s.value == pytest.approx(0.5, abs=0.02) and s.lo <= s.value <= s.hi and s.lo > 0.4


def test_ve_windows_are_one_width_in_log_sigma():
    ve = se.ve_windows([256, 4096])        # in σ the window widens like √d; in ln σ it keeps one width
    assert ve.growth == pytest.approx(ve.sqrt_prediction, rel=0.05) and ve.log_width_spread < 0.01


def test_load_digits():
    d = se.load_digits()
    assert d.X.shape == (1797, 64) and d.X.dtype == torch.float32 and d.n_classes == 10
    assert float(d.X.min()) == -1.0 and float(d.X.max()) == 1.0
    assert abs(d.prior_entropy - math.log(10)) < 1e-3


def test_hierarchical_mixture_default_and_reversed_control():
    gmm4, part = se.hierarchical_mixture(4)
    assert torch.equal(gmm4.means[:, :2], torch.tensor([[3.0, 1], [3, -1], [-3, 1], [-3, -1]], dtype=torch.float64))
    assert part.tolist() == [0, 0, 1, 1]
    rev, part_rev = se.hierarchical_mixture(4, coarse_sep=2.0, fine_sep=6.0)
    assert torch.equal(rev.means[:, :2], torch.tensor([[1.0, 3], [1, -3], [-1, 3], [-1, -3]], dtype=torch.float64))
    # the groups are now the close split: decided last, so the order of coarse-before-fine flips
    cf = se.coarse_vs_fine(rev, part_rev, 4000, 30, torch.Generator().manual_seed(1))
    assert cf.t_coarse < cf.t_fine
    with pytest.raises(ValueError, match="separations"):
        se.hierarchical_mixture(4, coarse_sep=0.0)


def test_guided_flow_is_guided_trajectories_and_skips_the_unconditional_score_at_w0():
    m = gmm(d=2, K=2)
    y = torch.zeros(50, dtype=torch.long)
    tg = torch.linspace(3, 1e-2, 40, dtype=torch.float64)
    states, H = se.guided_trajectories(m, y, 2.0, tg, torch.Generator().manual_seed(3))
    x0 = torch.randn(50, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    s2, H2 = se.guided_flow(lambda x, t: m.score(x, t, VP, y), lambda x, t: m.score(x, t, VP), x0, 2.0, tg,
                            lambda x, t: se.entropy(m.log_posterior(x, t, VP)).mean())
    assert torch.equal(states, s2) and torch.equal(H, H2)

    def never(x, t):
        raise AssertionError("the unconditional score is not needed at w = 0")

    s0, _ = se.guided_flow(lambda x, t: m.score(x, t, VP, y), never, x0, 0.0, tg, lambda x, t: x.sum())
    assert torch.equal(s0, se.guided_trajectories(m, y, 0.0, tg, torch.Generator().manual_seed(3))[0])


def test_peak_times_match_peak_time_row_by_row():
    t = torch.linspace(0, 3, 80, dtype=torch.float64)
    g = torch.Generator().manual_seed(4)
    centres = 0.2 + 2.6 * torch.rand(20, generator=g, dtype=torch.float64)
    rates = torch.exp(-((t[None] - centres[:, None]) / 0.4) ** 2) + 0.01 * torch.rand(20, 80, generator=g)
    rates[0] = -t  # maximum at the left end: the grid point itself
    got = se.peak_times(t.numpy(), rates.numpy())
    want = [se.peak_time(t, r) for r in rates]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


class _IdealDenoiser:
    """The exact denoiser of a finite labelled set (Diracs): E[x0 | x_t(, y)] by softmax weights on the points."""

    def __init__(self, X, y):
        self.X, self.y, self.n_classes = X, y, int(y.max()) + 1

    def denoise(self, x, t, sched, y):
        a, s = sched.alpha(t), sched.sigma(t)
        logk = -0.5 * torch.cdist(x, a * self.X) ** 2 / s**2
        if y is not None:
            logk = logk.masked_fill(self.y[None, :] != y[:, None], float("-inf"))
        return torch.softmax(logk, 1) @ self.X


def test_digits_guidance_with_the_ideal_denoiser_lands_on_the_class():
    data = _toy_digits()
    ref = se.digits_reference(data, 16, torch.Generator().manual_seed(6))
    ideal = _IdealDenoiser(data.X, data.y)
    res = se.digits_guidance(ideal, data, ref, [0.0, 2.0], per_class=5, steps=60, seed=1)
    for w in (0.0, 2.0):
        assert abs(float(res.entropy[w][0]) - math.log(4)) < 0.05      # pure noise: the prior
        assert float(res.entropy[w][-1]) < 1e-3                       # decided at the end
    assert res.order_violations == 0 and res.decision[0.0] <= res.decision[2.0]
    again = se.digits_guidance(ideal, data, ref, [0.0, 2.0], per_class=5, steps=60, seed=1)
    assert torch.equal(again.entropy[2.0], res.entropy[2.0])


def test_empirical_posterior_against_scipy_brute_force():
    g = torch.Generator().manual_seed(11)
    X = torch.randn(40, 3, dtype=torch.float64, generator=g)
    y = torch.arange(40) % 4
    y[y == 3] = 2                                              # class 3 has no training point
    t = torch.tensor(0.3, dtype=torch.float64)
    x = VP.noise(X, t, torch.randn(X.shape, dtype=torch.float64, generator=g))
    a, s = float(VP.alpha(t)), float(VP.sigma(t))
    for loo in (False, True):
        got = se.empirical_log_posterior(X, y, x, t, VP, 4, exclude_self=loo).numpy()
        logk = np.stack([stats.multivariate_normal(a * Xi, s**2 * np.eye(3)).logpdf(x.numpy()) for Xi in X.numpy()], 1)
        if loo:
            np.fill_diagonal(logk, -np.inf)
        want = np.stack([logsumexp(logk[:, y.numpy() == k], axis=1) if (y == k).any() else np.full(40, -np.inf)
                         for k in range(4)], 1)
        want = want - logsumexp(want, axis=1, keepdims=True)
        np.testing.assert_allclose(got[:, :3], want[:, :3], rtol=1e-9, atol=1e-9)
        assert np.isneginf(got[:, 3]).all()
    with pytest.raises(ValueError, match="label"):
        se.empirical_log_posterior(X, y, x, t, VP, 2)
