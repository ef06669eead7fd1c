"""repro.papers.gbi against independent references: the analytic Gaussian power posterior, importance
reweighting of ordinary simulations (an independent route to the tempered joint), numerical quadrature, scipy's
densities and ODE solver, emcee/grid references checked against each other (with mode jumps, the exact 50/50
split between two moons' mirror-image crescents), numpy's weighted quantiles, and the hand-written training loop
that repro.common.train.fit replaced."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from repro.papers import gbi
from repro.papers.gbi import npe


@pytest.fixture
def g() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


# -- tempered joint ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("beta", [0.25, 2.0])
def test_gaussian_tempered_joint_conditional_is_the_analytic_power_posterior(g, beta):
    task = gbi.GaussianLinear(dim=3, dtype=torch.float64)
    theta, x = task.sample_tempered_joint(200_000, beta, g)
    for k in range(3):  # least squares of θ_k on x_k: slope β/(1+β) and residual variance 0.1/(1+β)
        slope = float((theta[:, k] * x[:, k]).mean() / (x[:, k] ** 2).mean())
        resid = theta[:, k] - slope * x[:, k]
        assert slope == pytest.approx(beta / (1 + beta), abs=0.01)
        assert float(resid.var()) == pytest.approx(0.1 / (1 + beta), rel=0.02)
    mean, std = task.analytic_power_posterior(torch.ones(3, dtype=torch.float64), beta)
    assert torch.allclose(mean, torch.full((3,), beta / (1 + beta), dtype=torch.float64))
    assert float(std) == pytest.approx(math.sqrt(0.1 / (1 + beta)))


def _features(theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.cat([theta, theta**2, x, x**2, (theta[:, :1] * x[:, :1])], 1)


@pytest.mark.parametrize(("name", "beta"), [("two_moons", 0.8), ("two_moons", 1.5), ("slcp", 0.8), ("slcp", 1.1),
                                            ("gaussian_linear", 0.8)])
def test_tempered_joint_sampler_matches_reweighted_simulations(g, name, beta):
    # f_β ∝ f_1 · p(x|θ)^(β−1): moments from the exact sampler must match SNIS-reweighted β = 1 simulations,
    # which only use the simulator and log_likelihood (an independent path through the code)
    task = gbi.make_task(name, dtype=torch.float64, **({"dim": 2} if name == "gaussian_linear" else {}))
    n = 200_000
    th_t, x_t = task.sample_tempered_joint(n, beta, g)
    th_b, x_b = task.sample_tempered_joint(n, 1.0, g)
    w = gbi.snis_weights(task.log_likelihood(th_b, x_b), beta)
    assert float(gbi.ess(w)) > 0.05 * n  # enough effective samples for the comparison to mean something
    f_t, f_b = _features(th_t, x_t), _features(th_b, x_b)
    m_t, m_b = f_t.mean(0), (w[:, None] * f_b).sum(0)
    se = torch.sqrt(f_t.var(0) / n + (w[:, None] ** 2 * (f_b - m_b) ** 2).sum(0))
    z = ((m_t - m_b) / se).abs()
    assert float(z.max()) < 4.5, z


def test_two_moons_tempered_radius_has_the_derived_density(g):
    task = gbi.TwoMoons(dtype=torch.float64)
    for beta in (0.1, 0.5, 1.0, 1.9):
        r = task._sample_tempered_radius(torch.full((20_000,), beta, dtype=torch.float64), g).numpy()
        s = 0.01 / math.sqrt(beta)
        grid = np.linspace(1e-9, 0.1 + 14 * s, 200_001)
        dens = stats.norm.pdf(grid, 0.1, s) * grid ** (1 - beta)
        cdf = integrate.cumulative_trapezoid(dens, grid, initial=0)
        cdf /= cdf[-1]
        assert stats.kstest(r, lambda t, grid=grid, cdf=cdf: np.interp(t, grid, cdf)).pvalue > 1e-3


def test_two_moons_likelihood_integrates_to_one_and_matches_simulations(g):
    task = gbi.TwoMoons(dtype=torch.float64)
    for theta in ([0.3, -0.5], [-0.9, 0.2]):
        th = torch.tensor(theta, dtype=torch.float64)
        centre = task._shift(th) + torch.tensor([0.25, 0.0], dtype=torch.float64)
        h = 0.0005  # the crescent lies within 0.2 of its centre
        u0 = torch.arange(-0.2, 0.2, h, dtype=torch.float64) + h / 2
        a, b = torch.meshgrid(u0, u0, indexing="ij")
        xs = torch.stack([a.reshape(-1), b.reshape(-1)], 1) + centre
        dens = task.log_likelihood(th, xs).exp()
        assert float(dens.sum() * h * h) == pytest.approx(1.0, abs=2e-3)
        sims = task.simulate(th.expand(200_000, 2), g) - centre  # histogram of simulations vs the density
        edges = np.linspace(-0.2, 0.2, 41)
        hist, _, _ = np.histogram2d(sims[:, 0].numpy(), sims[:, 1].numpy(), bins=[edges, edges])
        cell_prob = dens.reshape(len(u0), len(u0)).unfold(0, 20, 20).unfold(1, 20, 20).sum((-1, -2)) * h * h
        expected = 200_000 * cell_prob.numpy()
        big = expected > 200
        assert np.abs(hist[big] - expected[big]).max() < 5 * np.sqrt(expected[big]).max()


def test_slcp_likelihood_matches_scipy(g):
    task = gbi.SLCP(dtype=torch.float64)
    theta = task.sample_prior(5, g)
    x = task.simulate(theta, g)
    m, S = task.mean_cov(theta)
    for i in range(5):
        want = sum(stats.multivariate_normal(m[i].numpy(), S[i].numpy()).logpdf(x[i].reshape(4, 2)[j].numpy())
                   for j in range(4))
        assert float(task.log_likelihood(theta[i], x[i])) == pytest.approx(want, rel=1e-9)
    assert task.log_likelihood(theta[:, None, :], x[None, :, :]).shape == (5, 5)  # broadcasting


def test_slcp_tempered_theta_marginal_has_the_derived_density(g):
    # θ₂ under f_β has density ∝ (θ₂⁴ + ε)^(2(1−β)) times a factor from ρ, checked via importance weights on
    # prior draws: E[θ₂²] under the sampler against Σ w θ₂² with w ∝ |S_jit(θ)|^(2(1−β))
    task = gbi.SLCP(dtype=torch.float64)
    for beta in (0.3, 1.1):
        th = task.sample_tempered_theta(100_000, torch.tensor(beta, dtype=torch.float64), g)
        prior = task.sample_prior(400_000, g)
        _, S = task.mean_cov(prior)
        w = torch.softmax(2 * (1 - beta) * torch.log(torch.linalg.det(S)), 0)
        for f in (lambda t: t[:, 2] ** 2, lambda t: t[:, 3].abs(), lambda t: torch.tanh(t[:, 4]) ** 2):
            want = float((w * f(prior)).sum())
            se = float(f(th).std()) / math.sqrt(100_000) + math.sqrt(float((w**2 * (f(prior) - want) ** 2).sum()))
            assert float(f(th).mean()) == pytest.approx(want, abs=5 * se)


def test_improper_temperatures_are_refused(g):
    with pytest.raises(ValueError, match="improper"):
        gbi.SLCP().sample_tempered_joint(10, 1.2, g)
    with pytest.raises(ValueError, match="improper"):
        gbi.SLCP().sample_tempered_joint(3, torch.tensor([0.5, 1.0, 1.13]), g)
    with pytest.raises(ValueError, match="improper"):
        gbi.TwoMoons().log_power_posterior_unnorm(torch.zeros(2), torch.zeros(2), 2.0)
    gbi.SLCP().sample_tempered_joint(10, 1.12, g)  # just below the limit is fine
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="beta"):
            gbi.GaussianLinear(dim=2).sample_tempered_joint(5, bad, g)
    with pytest.raises(ValueError):
        gbi.GaussianLinear(dim=2).sample_tempered_joint(5, torch.ones(4), g)
    with pytest.raises(ValueError):
        gbi.GaussianLinear(dim=2).log_likelihood(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="unknown task"):
        gbi.make_task("lorenz63")


# -- SNIS -----------------------------------------------------------------------------------------------------

def test_snis_weights_are_normalised_and_stable():
    ll = torch.tensor([-1e4, -1e4 + 1.0, -3e4, 2.0], dtype=torch.float64)
    for beta in (0.1, 0.5, 1.0, 3.0):
        w = gbi.snis_weights(ll, beta)
        assert torch.isfinite(w).all() and float(w.sum()) == pytest.approx(1.0)
    w = gbi.snis_weights(ll[:2], 0.5)  # w ∝ exp(−0.5 ℓ): the pair's ratio is exp(0.5)
    assert float(w[0] / w[1]) == pytest.approx(math.exp(0.5))
    assert torch.equal(gbi.snis_weights(ll, 1.0), torch.full((4,), 0.25, dtype=torch.float64))
    w = gbi.snis_weights(ll[None, :], torch.tensor([[0.5], [2.0]], dtype=torch.float64))
    assert w.shape == (2, 4) and torch.allclose(w.sum(1), torch.ones(2, dtype=torch.float64))
    assert float(gbi.snis_weights(torch.tensor([-math.inf, 0.0]), 2.0)[0]) == 0.0
    with pytest.raises(ValueError):
        gbi.snis_weights(torch.tensor([-math.inf, 0.0]), 0.5)
    with pytest.raises(ValueError):
        gbi.snis_weights(torch.tensor([float("nan")]), 0.5)
    with pytest.raises(ValueError):
        gbi.snis_weights(ll, 0.0)


def test_ess_limits_and_the_gaussian_formula(g):
    assert float(gbi.ess(torch.full((50,), 0.02))) == pytest.approx(50)
    assert float(gbi.ess(torch.tensor([1.0, 0.0, 0.0]))) == pytest.approx(1)
    with pytest.raises(ValueError):
        gbi.ess(torch.tensor([0.5, 0.6]))
    task = gbi.GaussianLinear(dim=5, dtype=torch.float64)
    th, x = task.sample_tempered_joint(400_000, 1.0, g)
    ll = task.log_likelihood(th, x)
    for beta in (0.75, 2.0):
        frac = float(gbi.ess(gbi.snis_weights(ll, beta))) / 400_000
        assert frac == pytest.approx(float(gbi.gaussian_ess_fraction(beta, 5)), abs=0.03)
    assert gbi.gaussian_ess_fraction(np.array([0.1, 0.5, 1.0]), 5).tolist() == [0.0, 0.0, 1.0]


def test_snis_weighted_mean_in_an_x_bin_is_the_power_posterior_mean(g):
    task = gbi.GaussianLinear(dim=1, dtype=torch.float64)
    th, x = task.sample_tempered_joint(2_000_000, 1.0, g)
    inbin = (x[:, 0] - 0.3).abs() < 0.01
    for beta in (0.75, 2.0):
        w = gbi.snis_weights(task.log_likelihood(th[inbin], x[inbin]), beta)
        assert float((w * th[inbin, 0]).sum()) == pytest.approx(beta / (1 + beta) * 0.3, abs=0.01)


# -- training -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("route", ["synth", "snis"])
def test_trained_estimator_uses_beta(g, route):
    torch.manual_seed(0)
    task = gbi.GaussianLinear(dim=2)
    res = gbi.train_tempered_npe(task, route, beta_range=(0.5, 2.0), n_sims=5000, steps=500, batch=128, lr=3e-3,
                                 kind="maf", transforms=1, hidden=(32,), generator=g)
    assert np.isfinite(res.losses).all() and res.n_sims == 5000 and res.seconds > 0
    x = torch.tensor([0.2, -0.1])
    spreads = []
    for beta in (0.5, 1.0, 2.0):
        q = res.posterior.sample(x, beta, 4000)
        mean, std = task.analytic_power_posterior(x, beta)
        assert torch.allclose(q.std(0), std.expand(2), rtol=0.25)
        assert torch.allclose(q.mean(0), mean, atol=0.5 * float(std))
        spreads.append(float(q.var(0).sum()))
    assert spreads[0] > spreads[1] > spreads[2]
    lq = res.posterior.log_prob(q[:5], x.expand(5, 2), torch.full((5,), 2.0))
    assert lq.shape == (5,) and torch.isfinite(lq).all()


@pytest.mark.parametrize(("route", "step_loss"), [("synth", npe._synth_loss), ("snis", npe._snis_resample_loss)])
def test_training_on_fit_is_bit_identical_to_the_hand_written_loop(route, step_loss):
    # the loop train_tempered_npe had before it moved onto repro.common.train.fit: Adam, torch's cosine
    # annealing over all steps, zero_grad(set_to_none) -> backward -> clip 5 -> step -> schedule step
    task, lo_hi, steps = gbi.GaussianLinear(dim=2), (0.5, 2.0), 25
    torch.manual_seed(0)
    res = gbi.train_tempered_npe(task, route, beta_range=lo_hi, n_sims=500, steps=steps, batch=64, lr=3e-3,
                                 kind="maf", transforms=1, hidden=(16,), generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(5)
    theta, x, aux = npe._training_set(task, route, 500, lo_hi, gen)
    flow = gbi.make_flow(2, 3, "maf", 1, (16,))
    post = gbi.AmortizedPosterior(task, flow, theta.mean(0), theta.std(0), x.mean(0), x.std(0), lo_hi)
    opt = torch.optim.Adam(flow.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    losses = []
    for _ in range(steps):
        loss = step_loss(post, theta, x, aux, 64, 8, lo_hi, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(flow.parameters(), 5.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    assert res.losses.tolist() == losses
    assert all(torch.equal(a, b) for a, b in zip(res.posterior.parameters(), post.parameters(), strict=True))
    assert not res.posterior.training


def test_training_and_sampling_validate_their_inputs(g):
    task = gbi.TwoMoons()
    with pytest.raises(ValueError, match="route"):
        gbi.train_tempered_npe(task, "mcmc", generator=g)
    with pytest.raises(ValueError, match="improper"):
        gbi.train_tempered_npe(task, beta_range=(0.1, 3.0), generator=g)
    with pytest.raises(ValueError, match="beta_range"):
        gbi.train_tempered_npe(task, beta_range=(2.0, 1.0), generator=g)
    with pytest.raises(ValueError, match="steps"):
        gbi.train_tempered_npe(task, steps=0, generator=g)
    with pytest.raises(ValueError, match="kind"):
        gbi.make_flow(2, 3, kind="realnvp")
    with pytest.raises(ValueError, match="snis"):
        gbi.train_tempered_npe(task, "snis", snis="global", generator=g)
    with pytest.raises(ValueError, match="multiple"):
        gbi.train_tempered_npe(task, "snis", beta_range=(0.5, 1.5), batch=30, betas_per_step=8, generator=g)
    batch_snis = gbi.train_tempered_npe(task, "snis", snis="batch", n_sims=500, steps=5, batch=32, betas_per_step=4,
                                        beta_range=(0.5, 1.5), generator=g)
    assert np.isfinite(batch_snis.losses).all()
    res = gbi.train_tempered_npe(task, n_sims=500, steps=5, batch=32, beta_range=(0.5, 1.0), generator=g)
    q = res.posterior.sample(torch.tensor([0.0, 0.1]), 0.7, 300)
    assert q.shape == (300, 2) and bool(task.in_support(q).all())
    with pytest.raises(ValueError):
        res.posterior.sample(torch.zeros(3, 2), 0.7, 10)


# -- references and metrics -----------------------------------------------------------------------------------

def test_mcmc_reproduces_the_analytic_power_posterior():
    task = gbi.GaussianLinear(dim=2, dtype=torch.float64)
    x = torch.tensor([0.4, -0.2], dtype=torch.float64)
    for beta in (0.5, 2.0):
        res = gbi.mcmc_power_posterior(task, x, beta, 4000, walkers=16, burn=300, thin=10, seed=3)
        mean, std = task.analytic_power_posterior(x, beta)
        assert res.samples.shape == (4000, 2) and 0.2 < res.acceptance < 0.9
        assert torch.allclose(res.samples.mean(0), mean, atol=0.1 * float(std))
        assert torch.allclose(res.samples.std(0), std.expand(2), rtol=0.08)
    with pytest.raises(ValueError):
        gbi.mcmc_power_posterior(task, x, 1.0, 10, walkers=3)


def test_mcmc_starts_when_the_posterior_is_much_narrower_than_the_prior():
    task = gbi.GaussianLinear(dim=2, noise_var=1e-6, dtype=torch.float64)  # posterior std ≈ 1e-3, prior std 0.3
    x = torch.tensor([0.1, 0.2], dtype=torch.float64)
    res = gbi.mcmc_power_posterior(task, x, 1.0, 2000, walkers=16, burn=1000, thin=5, init_pool=64, seed=0)
    mean, std = task.analytic_power_posterior(x, 1.0)
    assert torch.allclose(res.samples.mean(0), mean, atol=0.2 * float(std))
    assert torch.allclose(res.samples.std(0), std.expand(2), rtol=0.15)


def test_grid_reference_matches_importance_sampling_and_mcmc(g):
    task = gbi.TwoMoons(dtype=torch.float64)
    x = task.simulate(torch.tensor([[0.3, 0.4]], dtype=torch.float64), g)[0]
    grid = gbi.GridPosterior(task, x, resolution=800)
    prior = task.sample_prior(2_000_000, g)
    ll = task.log_likelihood(prior, x)
    for beta in (0.5, 1.0):
        w = torch.softmax(beta * ll, 0)
        mean, cov = grid.moments(beta)
        assert torch.allclose(mean, (w[:, None] * prior).sum(0), atol=0.01)
        assert float(torch.trace(cov)) == pytest.approx(float((w[:, None] * (prior - mean) ** 2).sum()), rel=0.03)
        s = grid.sample(beta, 20_000, g)
        assert torch.allclose(s.mean(0), mean, atol=0.01) and bool(task.in_support(s).all())
        assert float(grid.density(beta).sum() * grid.cell.prod()) == pytest.approx(1.0)
    mc = gbi.mcmc_power_posterior(task, x, 1.0, 2000, burn=300, thin=10, seed=0)
    assert gbi.c2st(grid.sample(1.0, 2000, g), mc.samples) < 0.6
    with pytest.raises(ValueError):
        gbi.GridPosterior(gbi.SLCP(), torch.zeros(8))


@pytest.mark.parametrize("name", ["two_moons", "slcp"])
def test_symmetries_leave_prior_and_likelihood_invariant(g, name):
    task = gbi.make_task(name, dtype=torch.float64)
    theta = task.sample_prior(500, g)
    x = task.simulate(task.sample_prior(7, g), g)
    maps = task.symmetries()
    assert len(maps) == {"two_moons": 1, "slcp": 3}[name]
    ll = task.log_likelihood(theta[:, None, :], x[None])  # every θ against every x
    for sym in maps:
        th = sym(theta)
        assert not torch.allclose(th, theta)
        torch.testing.assert_close(task.log_likelihood(th[:, None, :], x[None]), ll, rtol=1e-12, atol=1e-9)
        torch.testing.assert_close(task.prior_log_prob(th), task.prior_log_prob(theta))
        torch.testing.assert_close(th.norm(dim=-1), theta.norm(dim=-1))  # an isometry: volume-preserving
        torch.testing.assert_close(sym(th), theta)  # an involution: the set is closed under inverses
    assert gbi.GaussianLinear().symmetries() == []


def test_mcmc_mode_jumps_balance_symmetric_modes(g):
    # two moons: the posterior puts exactly half its mass on each crescent (z₀ > 0 and z₀ < 0), SLCP on each sign
    # of θ₂ and θ₃; with mode jumps emcee's samples do too, and the grid reference confirms the two moons case
    task = gbi.TwoMoons(dtype=torch.float64)
    x = task.simulate(torch.tensor([[0.3, 0.4]], dtype=torch.float64), g)[0]
    side = gbi.GridPosterior(task, x, 800).sample(1.0, 20_000, g).sum(-1) > 0
    assert float(side.double().mean()) == pytest.approx(0.5, abs=0.015)
    res = gbi.mcmc_power_posterior(task, x, 1.0, 4000, walkers=32, burn=300, thin=10, seed=1)
    assert float((res.samples.sum(-1) > 0).double().mean()) == pytest.approx(0.5, abs=0.04)
    slcp = gbi.SLCP(dtype=torch.float64)
    xs = slcp.simulate(torch.tensor([[0.7, -2.9, -1.0, -0.9, 0.6]], dtype=torch.float64), g)[0]
    res = gbi.mcmc_power_posterior(slcp, xs, 1.0, 4000, walkers=32, burn=500, thin=10, seed=2)
    for k in (2, 3):
        assert float((res.samples[:, k] > 0).double().mean()) == pytest.approx(0.5, abs=0.06)
    with pytest.raises(ValueError, match="jump"):
        gbi.mcmc_power_posterior(task, x, 1.0, 100, jump=1.0)


def test_c2st_and_mmd_separate_laws(g):
    a = torch.randn(1000, 3, generator=g)
    b = torch.randn(1000, 3, generator=g)
    far = torch.randn(1000, 3, generator=g) + torch.tensor([8.0, 0.0, 0.0])  # Bayes accuracy Φ(4) = 0.99997
    assert 0.44 < gbi.c2st(a, b) < 0.56
    assert gbi.c2st(a, far) > 0.98  # early stopping ends training near 0.99 on separable data
    assert abs(gbi.mmd2(a, b)) < 0.01 and gbi.mmd2(a, far) > 0.5
    assert gbi.c2st(a, 1.2 * b) > gbi.c2st(a, b)  # sensitive to a 20 % scale change
    with pytest.raises(ValueError):
        gbi.c2st(a, b[:, :2])
    with pytest.raises(ValueError):
        gbi.mmd2(a[:5], b[:5])
    with pytest.raises(ValueError):
        gbi.mmd2(a, b, bandwidth=0.0)


# -- Lorenz-96 ------------------------------------------------------------------------------------------------

def test_lorenz96_rk4_matches_solve_ivp():
    # over 0.2 time units (8 steps of the benchmark's dt = 0.025) RK4 agrees with a tight adaptive solver, and
    # halving dt divides the error by about 2⁴ (fourth order)
    K, F = 40, 10.0
    theta = torch.tensor([[1.5, 0.1]], dtype=torch.float64)
    y0 = F + torch.sin(torch.arange(K, dtype=torch.float64))

    def rhs(_t, y):
        return gbi.lorenz96_rhs(torch.as_tensor(y)[None], theta, F)[0].numpy()

    errors = []
    for steps in (8, 16, 32):
        traj = gbi.lorenz96_trajectory(theta, y0, steps=steps + 1, duration=0.2 * (steps + 1) / steps, forcing=F)
        t = np.arange(steps + 1) * 0.2 / steps
        sol = integrate.solve_ivp(rhs, (0, 0.2), y0.numpy(), method="DOP853", rtol=1e-12, atol=1e-12, t_eval=t)
        errors.append(np.abs(traj[0].numpy() - sol.y.T).max())
    assert errors[0] < 1e-2 and errors[2] < 1e-4
    assert 10 < errors[0] / errors[1] < 22 and 10 < errors[1] / errors[2] < 22
    noisy = gbi.lorenz96_trajectory(theta, y0, steps=10, phi=0.984, generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(noisy, gbi.lorenz96_trajectory(theta, y0, steps=10))
    with pytest.raises(ValueError):
        gbi.lorenz96_trajectory(theta, y0, phi=1.0)


def test_lorenz96_toy_noise_model(g):
    task = gbi.Lorenz96Toy(dtype=torch.float64)
    theta = task.sample_prior(4, g)
    s = task.summaries(theta)
    assert s.shape == (4, 6) and torch.isfinite(s).all()
    x = task.simulate_tempered(theta.repeat(500, 1), torch.tensor(0.25, dtype=torch.float64), g)
    resid = (x - s.repeat(500, 1)) / task.noise_std
    assert float(resid.std()) == pytest.approx(2.0, rel=0.03)  # σ / √β with β = 1/4
    want = stats.norm(s[0].numpy(), task.noise_std.numpy()).logpdf(x[0].numpy()).sum()
    assert float(task.log_likelihood(theta[0], x[0])) == pytest.approx(want, rel=1e-9)


# -- the notebook's harness (repro.papers.gbi.experiment) ------------------------------------------------------

class ExactGaussianPosterior:
    """Stands in for a perfectly trained flow: draws the analytic power posterior (the harness is under test)."""

    def __init__(self, task: gbi.GaussianLinear, seed: int):
        self.task, self.gen = task, torch.Generator().manual_seed(seed)

    def sample(self, x, beta, n):
        return self.task.sample_power_posterior(x, beta, n, self.gen)


def _exact_gaussian_setup(g, n_obs=2):
    task = gbi.GaussianLinear(dim=2)
    obs = task.simulate(task.sample_prior(n_obs, g), g)
    fit = gbi.TrainResult(ExactGaussianPosterior(task, 7), "synth", 0, 1.0, 2.0, np.zeros(1))
    spec = dict(n_obs=n_obs, betas=[0.1, 0.5, 2.0], reference="analytic", routes={"synth": (0.5, 2.0)},
                mcmc_betas=[1.0], mcmc_obs=1)
    trained = gbi.Trained({"gaussian_linear": task}, {"gaussian_linear": obs}, {("gaussian_linear", "synth"): fit})
    refs = gbi.References(trained, {"gaussian_linear": spec}, n=500, grid=10,
                          mcmc=dict(walkers=8, burn=100, thin=2), generator=g)
    return task, trained, refs, {"gaussian_linear": spec}


def test_accuracy_baselines_and_amortization_with_an_exact_posterior(g):
    task, trained, refs, specs = _exact_gaussian_setup(g)
    acc, samples = gbi.accuracy_table(trained, refs, specs)
    assert len(acc) == 4 and sorted(set(acc.beta)) == [0.5, 2.0]  # β = 0.1 is outside the route's range
    assert (acc.c2st < 0.6).all() and (acc.mmd2.abs() < 0.02).all()  # indistinguishable from the reference
    for r in acc.itertuples():
        assert np.abs(r.std_ratio - 1).max() < 0.15
        assert r.trace == pytest.approx(0.1 * 2 / (1 + r.beta), rel=0.2)  # tr Cov = 0.1 d / (1 + β)
        assert samples["gaussian_linear", "synth", r.obs, r.beta].shape == (500, 2)
    assert refs.draw("gaussian_linear", 0, 0.5) is refs.draw("gaussian_linear", 0, 0.5)  # cached
    floor, mcmc = gbi.baselines(refs, specs)
    assert floor.beta.tolist() == [0.1, 2.0] and (floor.c2st < 0.6).all()
    assert mcmc[["obs", "beta"]].values.tolist() == [[0, 1.0]] and (mcmc.c2st < 0.65).all()
    timing, pairs = gbi.amortization(trained, acc, refs)
    assert pairs.empty  # the emcee run (β = 1) has no flow query at the same (x, β)
    acc2 = acc.copy()
    acc2.loc[len(acc2)] = dict(task="gaussian_linear", route="synth", obs=0, beta=1.0, seconds=0.001)
    timing, pairs = gbi.amortization(trained, acc2, refs)
    t = timing["gaussian_linear"]
    assert pairs[["obs", "beta"]].values.tolist() == [[0, 1.0]] and t["one_off_s"] == 3.0
    assert t["mcmc_per_query_s"] == refs.runs["gaussian_linear", 0, 1.0, 0][1]
    assert t["speedup_per_query"] == pytest.approx(t["mcmc_per_query_s"] / t["flow_per_query_s"])
    q_star = t["break_even_queries"]  # one-off + Q* t_q = Q* t_MCMC (an emcee run takes far more than 1 ms)
    assert np.isfinite(q_star) and 3.0 + q_star * t["flow_per_query_s"] == pytest.approx(q_star * t["mcmc_per_query_s"])
    with pytest.raises(ValueError, match="n >= 10"):
        gbi.References(trained, specs, n=5, grid=10, mcmc={}, generator=g)


def test_ess_curves_follow_the_gaussian_formula(g):
    task = gbi.GaussianLinear(dim=5, dtype=torch.float64)
    curve, at = gbi.ess_curves({"gaussian_linear": task}, 100_000, [0.75, 1.0, 1.5], g, points=12)
    assert len(curve) == 12 and curve.beta.iloc[0] == pytest.approx(0.1) and curve.beta.iloc[-1] == pytest.approx(2)
    assert at["gaussian_linear"][1] == pytest.approx(1.0)  # β = 1: equal weights
    for b, frac in zip([0.75, 1.5], at["gaussian_linear"][::2], strict=True):
        assert frac == pytest.approx(float(gbi.gaussian_ess_fraction(b, 5)), abs=0.04)


def test_weighted_iqr_matches_numpy_weighted_quantiles(g):
    values = torch.rand(500, generator=g, dtype=torch.float64)
    weights = torch.softmax(3 * torch.randn(500, generator=g, dtype=torch.float64), 0)
    q25, q75 = np.quantile(values.numpy(), [0.25, 0.75], weights=weights.numpy(), method="inverted_cdf")
    assert gbi.weighted_iqr(values, weights) == pytest.approx(q75 - q25, abs=1e-12)


def test_mass_levels_are_the_gaussian_credible_region_levels():
    # standard bivariate normal: the region {p ≥ ℓ} holds mass m when ℓ = (1 − m) / (2π)
    t = np.linspace(-7, 7, 1401)
    a, b = np.meshgrid(t, t)
    dens = np.exp(-0.5 * (a**2 + b**2)) / (2 * np.pi)
    levels = gbi.mass_levels(dens, (0.9, 0.5))
    assert levels == pytest.approx([0.1 / (2 * np.pi), 0.5 / (2 * np.pi)], rel=0.01)
    with pytest.raises(ValueError):
        gbi.mass_levels(np.zeros((3, 3)))
    with pytest.raises(ValueError):
        gbi.mass_levels(dens, (1.0,))


def test_crescent_widths_of_exact_draws_are_exact(g):
    task = gbi.TwoMoons(dtype=torch.float64)
    obs = task.simulate(task.sample_prior(1, g), g)
    spec = {"two_moons": dict(n_obs=1, reference="grid")}
    trained = gbi.Trained({"two_moons": task}, {"two_moons": obs}, {})
    refs = gbi.References(trained, spec, n=3000, grid=600, mcmc={}, generator=g)
    samples = {("two_moons", "synth", 0, b): refs.draw("two_moons", 0, b) for b in (0.5, 1.0)}
    widths = gbi.crescent_widths(refs, samples, "two_moons", [0.5, 1.0])
    assert widths.ratio.tolist() == pytest.approx([1.0, 1.0], abs=0.1)
    assert widths.iqr_ratio.tolist() == pytest.approx([1.0, 1.0], abs=0.1)
    assert widths.exact.iloc[0] > widths.exact.iloc[1]  # the crescent sharpens as β grows
    dens = refs.radius_density("two_moons", 0, 1.0)
    assert float((dens * np.diff(gbi.RADIUS_EDGES)).sum()) == pytest.approx(1.0)


class GridSampler:
    """Stands in for a perfectly trained flow on two moons: exact grid draws (the explorer's harness is tested)."""

    def __init__(self, grid: gbi.GridPosterior, seed: int):
        self.grid, self.gen = grid, torch.Generator().manual_seed(seed)

    def sample(self, x, beta, n):
        return self.grid.sample(beta, n, self.gen)


def test_explorer_frames_of_exact_draws(g):
    task = gbi.TwoMoons(dtype=torch.float64)
    obs = task.simulate(task.sample_prior(1, g), g)
    trained = gbi.Trained({"two_moons": task}, {"two_moons": obs}, {})
    refs = gbi.References(trained, {"two_moons": dict(n_obs=1, reference="grid")}, n=4000, grid=600, mcmc={},
                          generator=g)
    trained.fits["two_moons", "synth"] = gbi.TrainResult(GridSampler(refs.grid("two_moons", 0), 3), "synth", 0,
                                                         0.0, 0.0, np.zeros(1))
    ex = gbi.explorer_frames(trained, refs, "two_moons", [0.25, 1.0], contour_grid=50)
    assert ex.betas == [0.25, 1.0] and ex.grid.resolution == 50 and ex.ymax > 0
    for b in ex.betas:
        assert ex.q[b].shape == (4000, 2) and ex.r[b].shape == (4000,)
        hist = np.histogram(ex.r[b], bins=ex.edges, density=True)[0]  # exact draws: their radii follow the law
        assert np.abs(hist - ex.exact[b]).sum() * np.diff(ex.edges)[0] < 0.1  # total variation-like distance


def test_mcmc_references_time_the_reference_runs(g):
    # full mode's SLCP and Lorenz toy: the reference *is* emcee (seed 1000 + rep), and those runs are the timed
    # baseline of the amortization comparison
    task, trained, _, specs = _exact_gaussian_setup(g, n_obs=1)
    specs["gaussian_linear"].update(reference="mcmc", mcmc_obs=0, betas=[0.5, 2.0])
    refs = gbi.References(trained, specs, n=200, grid=10, mcmc=dict(walkers=8, burn=100, thin=2), generator=g)
    acc, _ = gbi.accuracy_table(trained, refs, specs)
    floor, mcmc = gbi.baselines(refs, specs)
    assert mcmc.empty and sorted(refs.runs) == [("gaussian_linear", 0, 0.5, 1000), ("gaussian_linear", 0, 0.5, 1001),
                                                 ("gaussian_linear", 0, 2.0, 1000)]
    assert (acc.c2st < 0.65).all() and "std_ratio" not in acc
    timing, pairs = gbi.amortization(trained, acc, refs)
    assert pairs[["obs", "beta"]].values.tolist() == [[0, 0.5], [0, 2.0]]
    assert timing["gaussian_linear"]["mcmc_per_query_s"] == pytest.approx(np.median(pairs.mcmc))
    with pytest.raises(ValueError, match="unknown reference"):
        specs["gaussian_linear"]["reference"] = "mystery"
        refs.draw("gaussian_linear", 0, 1.0)


# -- the claims' C2ST outcomes, β-blind control and bootstrap statistics ----------------------------------------

def test_c2st_outcomes_are_the_cross_validated_predictions(g):
    from sklearn.model_selection import KFold, cross_val_score
    from sklearn.neural_network import MLPClassifier

    a, b = torch.randn(500, 3, generator=g), 1.3 * torch.randn(500, 3, generator=g)
    out = gbi.c2st_outcomes(a, b)
    assert out.shape == (500, 2) and set(np.unique(out)) <= {0.0, 1.0}  # one row per draw pair
    za, zb = gbi.metrics._pair(a, b)  # sklearn's own cross-validation of the same classifier: the same score
    clf = MLPClassifier(activation="relu", hidden_layer_sizes=(30, 30), max_iter=10_000, random_state=1,
                        early_stopping=True)
    ref = np.mean(cross_val_score(clf, torch.cat([za, zb]).numpy(), np.r_[np.zeros(500), np.ones(500)],
                                  cv=KFold(5, shuffle=True, random_state=1), scoring="accuracy"))
    assert gbi.c2st(a, b) == ref == gbi.c2st_score(out) and out.mean() == pytest.approx(ref)  # equal folds
    uneven = gbi.c2st_outcomes(a[:333], b)
    assert uneven.shape == (833,) and gbi.c2st_score(uneven) == gbi.c2st(a[:333], b)


def test_blind_control_is_the_beta_one_posterior_scored_like_the_flow(g):
    task, trained, refs, specs = _exact_gaussian_setup(g)
    outcomes = {}
    acc, _ = gbi.accuracy_table(trained, refs, specs, outcomes)
    floor, mcmc = gbi.baselines(refs, specs, outcomes)
    assert sorted(outcomes) == sorted([("gaussian_linear", "synth", r.obs, r.beta) for r in acc.itertuples()]
                                      + [("gaussian_linear", "mcmc", 0, 1.0)])
    for r in acc.itertuples():  # the table's C2ST is the score of the kept outcomes
        assert r.c2st == gbi.c2st_score(outcomes["gaussian_linear", "synth", r.obs, r.beta])
    cases = [(0, 0.1), (0, 2.0), (1, 2.0)]
    blind = gbi.controls.blind_draws(trained, refs, "gaussian_linear", cases, torch.Generator().manual_seed(5))
    x = trained.obs["gaussian_linear"][0]
    mean1, sd1 = task.analytic_power_posterior(x, 1.0)
    assert torch.allclose(blind[0, 0.1].mean(0), mean1, atol=4 * float(sd1) / math.sqrt(500))  # β = 1, whatever β
    assert not torch.equal(blind[0, 0.1], blind[0, 2.0])  # drawn afresh for every (x, β)
    scored = gbi.controls.scores(refs, "gaussian_linear", blind)
    assert all(o.shape == (500, 2) for o in scored.values())
    sd01 = float(task.analytic_power_posterior(x, 0.1)[1])  # β = 0.1 is far from β = 1: the control fails there
    assert gbi.controls.std_deviation([sd01])(*gbi.controls.as_numpy(blind, [(0, 0.1)])) > 0.15
    assert gbi.c2st_score(scored[0, 0.1]) > max(acc.c2st)
    with pytest.raises(ValueError, match="exact reference"):
        specs["gaussian_linear"]["reference"] = "mcmc"
        gbi.controls.blind_draws(trained, refs, "gaussian_linear", cases, g)


def test_claim_statistics_on_known_draws(g):
    c = gbi.controls
    rng = np.random.default_rng(0)
    assert c.max_accuracy(np.ones((4, 2)), np.zeros((4, 2))) == 1.0
    assert c.max_accuracy_gap(np.full((4, 2), 0.5), np.ones((4, 2)), np.zeros((4, 2)), np.ones((4, 2))) == 0.5
    with pytest.raises(ValueError):
        c.max_accuracy_gap(np.ones((4, 2)))
    d = [rng.normal(0, s, size=(200_000, 3)) for s in (1.0, 2.0)]
    assert c.std_deviation([1.0, 1.0])(*d) == pytest.approx(1.0, abs=0.01)  # the second case is twice as wide
    assert c.std_deviation([1.0, 2.0])(*d) < 0.01
    spreads = [rng.normal(0, s, size=(200_000, 2)) for s in (1.0, 0.9, 0.5, 1.0, 1.1)]  # tr Cov ∝ s²
    fall = c.smallest_fall([3, 2])(*spreads)
    assert fall == pytest.approx(1 - 1.1**2, abs=0.01)  # the second observation's spread grew
    assert c.smallest_fall([3])(*spreads[:3]) == pytest.approx(1 - 0.81, abs=0.01)
    with pytest.raises(ValueError):
        c.smallest_fall([1])
    r = [rng.normal(0.1, s, size=50_000) for s in (0.01, 0.03)]
    assert c.width_deviation([0.01, 0.01])(*r) == pytest.approx(2.0, abs=0.05)
    count = c.failing_cases([0.01, 0.01], c2st_max=0.7, width_tol=0.15)
    assert count(np.full((10, 2), 0.5), np.full((10, 2), 0.8), *r) == 1.0  # case 2 fails both ways, counted once
    assert count(np.full((10, 2), 0.5), np.full((10, 2), 0.5), r[0], r[0]) == 0.0
    with pytest.raises(ValueError):
        count(r[0])
