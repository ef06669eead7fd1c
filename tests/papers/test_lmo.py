"""repro.papers.lmo against independent references: numpy/scipy norms and scipy's polar decomposition for the LMOs,
exhaustive enumeration of all τ-subsets for the τ-nice identities, a hand-written numpy loop for the optimizer,
autograd for the least-squares gradients, brute force for the bound proxy."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.linalg import polar

from repro.common.seeding import derive
from repro.papers import lmo as L


def polar_factor(G: np.ndarray) -> np.ndarray:
    """U Vᵀ of G (any shape) from scipy's polar decomposition."""
    return polar(G)[0] if G.shape[0] >= G.shape[1] else polar(G.T)[0].T


# ------------------------------------------------------------------ the LMOs

DUAL = {"l2": lambda m: np.linalg.norm(m.ravel()), "sign": lambda m: np.abs(m).sum(),
        "spectral": lambda m: np.linalg.norm(m, "nuc")}
PRIMAL = {"l2": lambda d: np.linalg.norm(d.ravel()), "sign": lambda d: np.abs(d).max(),
          "spectral": lambda d: np.linalg.norm(d, 2)}


@pytest.mark.parametrize("name", ["l2", "sign", "spectral"])
@pytest.mark.parametrize("shape", [(6, 9), (9, 6), (7, 7)])
def test_lmo_attains_minus_dual_norm_on_unit_sphere(name, shape):
    m = np.random.default_rng(1).standard_normal(shape)
    d = L.get_lmo(name)(torch.from_numpy(m)).numpy()
    assert np.isclose((m * d).sum(), -DUAL[name](m), rtol=1e-10)
    assert np.isclose(PRIMAL[name](d), 1.0, rtol=1e-10)
    assert np.isclose(float(L.dual_norm(torch.from_numpy(m), name)), DUAL[name](m), rtol=1e-10)


@pytest.mark.parametrize("name", ["l2", "sign", "spectral"])
def test_lmo_beats_random_feasible_directions(name):
    # the LMO is the argmin of <m, d> over the unit ball: no feasible direction does better
    rng = np.random.default_rng(2)
    m = rng.standard_normal((5, 4))
    best = float((m * L.get_lmo(name)(torch.from_numpy(m)).numpy()).sum())
    for _ in range(200):
        d = rng.standard_normal((5, 4))
        d /= PRIMAL[name](d)
        assert (m * d).sum() >= best - 1e-12


def test_spectral_svd_is_minus_polar_factor_and_ns5_is_close():
    rng = np.random.default_rng(3)
    for shape in [(12, 5), (5, 12), (8, 8)]:
        m = rng.standard_normal(shape)
        exact = L.lmo_spectral(torch.from_numpy(m), method="svd").numpy()
        np.testing.assert_allclose(exact, -polar_factor(m), atol=1e-10)
        approx = L.lmo_spectral(torch.from_numpy(m), method="ns5").numpy()
        cos = (approx * exact).sum() / (np.linalg.norm(approx) * np.linalg.norm(exact))
        assert cos >= 0.9


@pytest.mark.parametrize("name", L.LMO_NAMES)
def test_lmo_batched_equals_one_by_one_and_is_scale_free(name):
    m = torch.randn(3, 4, 6, 5, dtype=torch.float64)
    fn = L.get_lmo(name)
    out = fn(m, batch_dims=2)
    for i, j in itertools.product(range(3), range(4)):
        torch.testing.assert_close(out[i, j], fn(m[i, j]), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(fn(7.5 * m, batch_dims=2), out, rtol=1e-6, atol=1e-6)


def test_lmo_of_zero_is_zero_and_unit_lengths():
    z = torch.zeros(4, 3)
    assert torch.equal(L.lmo_l2(z), z) and torch.equal(L.lmo_sign(z), z)
    m = torch.randn(6, 4, dtype=torch.float64)
    for name in ("l2", "sign", "spectral"):
        d = L.get_lmo(name)(m)
        assert math.isclose(float(torch.linalg.vector_norm(d)), L.unit_length(name, (6, 4)), rel_tol=1e-9)


def test_exact_spectral_lmo_of_zero_and_rank_deficient_gradients():
    """D9: the exact spectral LMO is −U_r V_rᵀ over the nonzero singular values. A zero gradient gives 0 (the full
    polar factor gave −[I; 0]); a rank-r gradient built from known orthonormal factors gives exactly −Σ u_i v_iᵀ
    (no null-space directions). Reference: the constructed factors, and scipy's polar for the full-rank case."""
    assert torch.equal(L.lmo_spectral(torch.zeros(4, 3)), torch.zeros(4, 3))
    assert torch.equal(L.lmo_spectral(torch.zeros(2, 3, 5), batch_dims=1), torch.zeros(2, 3, 5))
    rng = np.random.default_rng(8)
    for (rows, cols), r in [((6, 4), 1), ((6, 4), 2), ((4, 6), 3), ((5, 5), 4)]:
        U = np.linalg.qr(rng.standard_normal((rows, r)))[0]
        V = np.linalg.qr(rng.standard_normal((cols, r)))[0]
        m = U @ np.diag(rng.uniform(0.5, 3.0, r)) @ V.T
        d = L.lmo_spectral(torch.from_numpy(m)).numpy()
        np.testing.assert_allclose(d, -U @ V.T, atol=1e-10)
        np.testing.assert_allclose(np.linalg.svd(d, compute_uv=False)[:r], 1.0, atol=1e-10)
        assert np.linalg.matrix_rank(d) == r and np.isclose((m * d).sum(), -np.linalg.norm(m, "nuc"))
    full = rng.standard_normal((6, 4))
    np.testing.assert_allclose(L.lmo_spectral(torch.from_numpy(full)).numpy(), -polar_factor(full), atol=1e-10)
    # the optimizer leaves a parameter with a zero gradient where it is
    p = torch.nn.Parameter(torch.ones(4, 3))
    opt = L.LMOMomentum([p], lr=0.1, lmo="spectral")
    p.grad = torch.zeros(4, 3)
    opt.step()
    assert torch.equal(p.detach(), torch.ones(4, 3))


def test_lmo_bad_input():
    with pytest.raises(ValueError, match="unknown LMO"):
        L.get_lmo("l1")
    with pytest.raises(ValueError, match="matrices"):
        L.lmo_spectral(torch.ones(3, 4, 5), batch_dims=2)
    with pytest.raises(ValueError, match="batch_dims"):
        L.lmo_l2(torch.ones(3), batch_dims=1)
    with pytest.raises(ValueError, match="method"):
        L.lmo_spectral(torch.ones(3, 3), method="qr")
    with pytest.raises(ValueError, match="unknown LMO"):
        L.dual_norm(torch.ones(3), "linf")


@pytest.mark.parametrize("dtype, scales", [(torch.float32, (1e-24, 1e-37, 1e25, 3e38)),
                                            (torch.float64, (1e-200, 1e-305, 1e200, 1e307))])
def test_lmo_holds_its_length_at_extreme_scales(dtype, scales):
    # issue 12: squaring 1e-24 underflows in float32 (the step came out ~1e13 long) and 1e25 overflows (length 0)
    base = torch.randn(3, 8, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    base = base / base.abs().amax()                                   # entries in [-1, 1]
    for scale in scales:
        m = (base * scale).to(dtype)
        assert torch.isfinite(m).all() and (m != 0).all()
        for name in ("l2", "spectral", "spectral-ns5"):
            d = L.get_lmo(name)(m, batch_dims=1)
            ref = L.get_lmo(name)(base.to(dtype), batch_dims=1)            # the same direction at scale 1
            torch.testing.assert_close(d, ref, rtol=1e-4, atol=1e-4)
        length = torch.linalg.vector_norm(L.lmo_l2(m, batch_dims=1), dim=(1, 2))
        torch.testing.assert_close(length, torch.ones(3, dtype=dtype), rtol=1e-6, atol=0)


@pytest.mark.parametrize("scale", [1e-24, 1e30, 3e38])
def test_optimizer_l2_step_has_length_lr_at_extreme_gradient_scales(scale):
    x = torch.zeros(10, requires_grad=True)
    opt = L.LMOMomentum([x], lr=0.01, alpha=0.5, lmo="l2", nesterov=True)
    direction = torch.linspace(-1, 1, 10)
    for k in range(4):                                         # alternating signs: the momentum's worst case
        before = x.detach().clone()
        x.grad = (-1) ** k * scale * direction
        opt.step()
        step = x.detach() - before
        assert torch.isfinite(step).all()
        assert float(torch.linalg.vector_norm(step)) == pytest.approx(0.01, rel=1e-5)


# ------------------------------------------------------------------ the optimizer

def numpy_lmo_momentum(x0, grads_fn, steps, lr, alpha, nesterov=False):
    """Hand-written reference: m0 = g0, m <- (1 - alpha) m + alpha g, x <- x - lr * d/||d||."""
    x, m = x0.copy(), None
    for k in range(steps):
        g = grads_fn(x, k)
        m = g.copy() if m is None else (1 - alpha) * m + alpha * g
        d = (1 - alpha) * m + alpha * g if nesterov and k > 0 else m
        x = x - lr * d / np.linalg.norm(d)
    return x


@pytest.mark.parametrize("nesterov", [False, True])
def test_optimizer_l2_matches_numpy_loop(nesterov):
    rng = np.random.default_rng(4)
    A, b = rng.standard_normal((30, 5)), rng.standard_normal(30)
    batches = [rng.choice(30, 4, replace=False) for _ in range(25)]

    def grad_np(x, k):
        S = batches[k]
        return A[S].T @ (A[S] @ x - b[S]) / len(S)

    want = numpy_lmo_momentum(np.zeros(5), grad_np, 25, lr=0.05, alpha=0.3, nesterov=nesterov)
    x = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    opt = L.LMOMomentum([x], lr=0.05, alpha=0.3, lmo="l2", nesterov=nesterov)
    At, bt = torch.from_numpy(A), torch.from_numpy(b)
    for S in batches:
        opt.zero_grad()
        (0.5 * (At[S] @ x - bt[S]).square().mean()).backward()
        opt.step()
    np.testing.assert_allclose(x.detach().numpy(), want, rtol=1e-10, atol=1e-12)


def test_alpha_one_is_memoryless_normalized_sgd():
    torch.manual_seed(0)
    x = torch.randn(4, 3, requires_grad=True)
    opt = L.LMOMomentum([x], lr=0.1, alpha=1.0, lmo="l2")
    for _ in range(5):
        target = torch.randn(4, 3)
        before = x.detach().clone()
        opt.zero_grad()
        (x - target).square().sum().backward()
        g = x.grad.detach().clone()
        opt.step()
        torch.testing.assert_close(x.detach(), before - 0.1 * g / g.norm())


def test_optimizer_spectral_flattens_conv_weights_and_rejects_vectors():
    w = torch.randn(4, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    C = torch.randn(4, 2, 3, 3, dtype=torch.float64)
    opt = L.LMOMomentum([w], lr=0.5, alpha=0.5, lmo="spectral")
    (w * C).sum().backward()             # gradient C, flattened to 4 x 18 as Muon does
    before = w.detach().clone()
    opt.step()
    step = (w.detach() - before).reshape(4, 18).numpy()
    np.testing.assert_allclose(step, -0.5 * polar_factor(C.reshape(4, 18).numpy()), atol=1e-10)
    with pytest.raises(ValueError, match="matrix parameters"):
        L.LMOMomentum([torch.zeros(5, requires_grad=True)], lmo="spectral-ns5")


def test_optimizer_bad_hyperparameters_mention_beta():
    p = [torch.zeros(3, requires_grad=True)]
    with pytest.raises(ValueError, match="beta = 1 - alpha"):
        L.LMOMomentum(p, alpha=0.0)
    with pytest.raises(ValueError, match="beta = 1 - alpha"):
        L.LMOMomentum(p, alpha=1.5)
    with pytest.raises(ValueError, match="lr"):
        L.LMOMomentum(p, lr=0.0)
    with pytest.raises(ValueError, match="unknown LMO"):
        L.LMOMomentum(p, lmo="nuclear")


# ------------------------------------------------------------------ τ-nice sampling and the ABC constants

def subset_moments(grads: np.ndarray, tau: int) -> tuple[np.ndarray, float]:
    """E[g] and E||g||^2 of the tau-nice mean by enumerating every tau-subset."""
    n = grads.shape[0]
    means = np.array([grads[list(S)].mean(0) for S in itertools.combinations(range(n), tau)])
    return means.mean(0), float((means**2).sum(1).mean())


def quadratic_finite_sum(rng, n=8, d=3):
    A, b = rng.standard_normal((n, d)), rng.standard_normal(n)
    return A, b


def test_tau_nice_second_moment_identity_exhaustive():
    rng = np.random.default_rng(5)
    A, b = quadratic_finite_sum(rng)
    x = rng.standard_normal(3)
    grads = A * (A @ x - b)[:, None]             # ∇f_i(x) for f_i = ½(a_iᵀx − b_i)²
    for tau in range(1, 9):
        mean, second = subset_moments(grads, tau)
        np.testing.assert_allclose(mean, grads.mean(0), atol=1e-12)   # unbiased
        assert abs(second - float(L.tau_nice_second_moment(torch.from_numpy(grads), tau))) < 1e-10
        B = L.tau_nice_abc(np.ones(8), np.zeros(8), 0.0, tau).B
        v = L.tau_nice_variance_factor(8, tau)
        assert abs(second - (B * (grads.mean(0) ** 2).sum() + v * (grads**2).sum(1).mean())) < 1e-10


def test_abc_inequality_holds_at_random_points():
    rng = np.random.default_rng(6)
    A, b = quadratic_finite_sum(rng)
    prob = L.LeastSquares.from_data(torch.from_numpy(A), torch.from_numpy(b), (3,))
    for tau in (1, 3, 5, 8):
        c = prob.abc(tau)
        for _ in range(50):
            x = 3 * rng.standard_normal(3)
            grads = A * (A @ x - b)[:, None]
            _, second = subset_moments(grads, tau)
            f_gap = float(prob.excess(torch.from_numpy(x)))
            rhs = 2 * c.A * f_gap + c.B * (grads.mean(0) ** 2).sum() + c.C
            assert second <= rhs * (1 + 1e-12) + 1e-12


def test_abc_endpoints():
    L_i, f_i = np.array([1.0, 2.0, 5.0, 3.0]), np.zeros(4)
    full = L.tau_nice_abc(L_i, f_i, 0.7, 4)
    assert full.A == 0 and full.C == 0 and full.B == 1
    one = L.tau_nice_abc(L_i, f_i, 0.7, 1)
    assert one.B == 0 and one.A == 5.0 and math.isclose(one.C, 2 * 5.0 * 0.7)
    with pytest.raises(ValueError, match="tau"):
        L.tau_nice_abc(L_i, f_i, 0.7, 5)
    with pytest.raises(ValueError, match="f_inf"):
        L.tau_nice_abc(L_i, np.ones(4), 0.0, 2)


def test_tau_nice_indices_are_uniform_subsets():
    gen = torch.Generator().manual_seed(0)
    idx = L.tau_nice_indices(10, 4, (20000,), gen)
    assert idx.shape == (20000, 4) and idx.min() >= 0 and idx.max() < 10
    assert all(len(set(r)) == 4 for r in idx[:500].tolist())
    freq = torch.bincount(idx.reshape(-1), minlength=10).double() / (20000 * 4)
    assert torch.allclose(freq, torch.full((10,), 0.1, dtype=torch.float64), atol=0.01)
    pairs = torch.zeros(10, 10)
    for r in idx[:20000].tolist():
        for i, j in itertools.combinations(sorted(r), 2):
            pairs[i, j] += 1
    p = pairs[torch.triu(torch.ones(10, 10), 1).bool()] / 20000   # every pair equally likely: 4·3/(10·9)
    assert torch.allclose(p, torch.full_like(p, 12 / 90), atol=0.02)
    again = L.tau_nice_indices(10, 4, (20000,), torch.Generator().manual_seed(0))
    assert torch.equal(idx, again)


# ------------------------------------------------------------------ least squares and the grid runner

def test_least_squares_gradient_excess_and_optimum():
    prob = L.matrix_regression(50, 3, 4, 2, noise=0.5, seed=1, dtype=torch.float64)
    X = torch.randn(2, 3, 3, 4, dtype=torch.float64, requires_grad=True)
    f = 0.5 * ((X.reshape(2, 3, 12) @ prob.a.mT - prob.b).square().mean(-1))
    f.sum().backward()
    torch.testing.assert_close(prob.grad(X.detach()), X.grad)
    torch.testing.assert_close(prob.excess(X.detach()), f.detach() - prob.f_star)
    idx = torch.tensor([[0, 5, 7], [1, 2, 3]])
    g = prob.grad(X.detach(), idx)
    for s in range(2):
        a, b = prob.a[idx[s]], prob.b[idx[s]]
        want = ((X.detach()[s].reshape(3, 12) @ a.mT - b) @ a / 3).reshape(3, 3, 4)
        torch.testing.assert_close(g[s], want)
    assert float(prob.grad(prob.x_star.reshape(1, 1, 3, 4)).abs().max()) < 1e-10
    a = prob.a.numpy()
    assert math.isclose(prob.L, np.linalg.eigvalsh(a.T @ a / 50).max(), rel_tol=1e-10)
    np.testing.assert_allclose(prob.row_L, (a**2).sum(1))
    c = prob.proxy_constants()
    assert math.isclose(c.delta0, 0.5 * (prob.b.numpy() ** 2).mean() - prob.f_star, rel_tol=1e-10)


def test_run_grid_matches_sequential_optimizer():
    prob = L.linear_regression(64, 5, noise=1.0, seed=2, dtype=torch.float64)
    taus, alphas = [1, 4], [1.0, 0.25]
    lrs = L.lr_grid(0.05, taus, alphas, 2)
    res = L.run_grid(prob, "l2", taus, alphas, lrs, budget=32, n_seeds=2, checkpoints=4, seed=3)
    assert res.loss.shape == (2, 2, 2, 2, 4) and list(res.samples) == [8, 16, 24, 32]
    for t_i, tau in enumerate(taus):
        gen = torch.Generator().manual_seed(derive(3, "tau", tau))
        idx = L.tau_nice_indices(64, tau, (32 // tau, 2), gen)
        for s, a_i, l_i in itertools.product(range(2), range(2), range(2)):
            x = torch.zeros(5, dtype=torch.float64, requires_grad=True)
            opt = L.LMOMomentum([x], lr=float(lrs[t_i, a_i, l_i]), alpha=alphas[a_i], lmo="l2")
            for k in range(32 // tau):
                S = idx[k, s]
                opt.zero_grad()
                (0.5 * (prob.a[S] @ x - prob.b[S]).square().mean()).backward()
                opt.step()
            assert math.isclose(float(prob.excess(x.detach())), res.loss[t_i, s, a_i, l_i, -1], rel_tol=1e-9)


def test_run_grid_spectral_runs_and_rejects_bad_grids():
    prob = L.matrix_regression(32, 3, 3, 1, noise=0.1, seed=0)
    lrs = L.lr_grid(0.05, [2], [0.5], 1)
    res = L.run_grid(prob, "spectral-ns5", [2], [0.5], lrs, budget=16, n_seeds=1, checkpoints=2)
    assert np.isfinite(res.loss).all() and res.final.shape == (1, 1, 1, 1)
    with pytest.raises(ValueError, match="divide"):
        L.run_grid(prob, "l2", [3], [0.5], L.lr_grid(0.05, [3], [0.5], 1), budget=16, n_seeds=1, checkpoints=2)
    with pytest.raises(ValueError, match="alphas"):
        L.run_grid(prob, "l2", [2], [0.0], L.lr_grid(0.05, [2], [1.0], 1), budget=16, n_seeds=1, checkpoints=2)
    with pytest.raises(ValueError, match="lrs"):
        L.run_grid(prob, "l2", [2], [0.5], np.ones((1, 1)), budget=16, n_seeds=1, checkpoints=2)


def test_grid_readers_on_a_synthetic_result():
    alphas = np.array([1.0, 0.5, 0.25])
    loss = np.ones((2, 2, 3, 2, 3))
    loss[0, :, 2, 1, :] = [1e-1, 1e-2, 1e-3]    # τ=1: α=1/4 with lr 1 is best, reaches 1e-2 at sample 20
    loss[1, :, 0, 0, :] = [1e-2, 1e-2, 1e-4]    # τ=2: α=1 with lr 0 is best, reaches 1e-2 at sample 10
    res = L.GridResult(lmo="l2", taus=np.array([1, 2]), alphas=alphas, lrs=np.ones((2, 3, 2)),
                       samples=np.array([10, 20, 30]), loss=loss)
    best, j = L.best_over_lr(res)
    assert best[0, 2] == -3 and j[0, 2] == 1 and best[1, 0] == -4 and j[1, 0] == 0
    np.testing.assert_allclose(L.alpha_hat(res, 1e-3), [0.25, 1.0])
    np.testing.assert_allclose(L.alpha_hat(res, 1e-3, per_seed=True), [[0.25, 1.0]] * 2)
    np.testing.assert_allclose(L.samples_to_target(res, -2.0), [20, 10])
    assert np.isinf(L.samples_to_target(res, -5.0)).all()
    assert math.isclose(float(L.soft_argmin(np.array([0.0, 1e9]), np.array([5.0, 7.0]), 1.0)), 5.0)
    assert math.isclose(float(L.soft_argmin(np.array([0.0, 0.0]), np.array([5.0, 7.0]), 1.0)), 6.0)


# ------------------------------------------------------------------ the bound proxy

CONSTS = L.ProxyConstants(delta0=30.0, L=1.5, L_max=100.0, delta_inf=0.5, n=1024)


def test_proxy_minimum_matches_brute_force():
    K, sigma = 500.0, 7.0
    val, a_star = L.proxy_best(K, sigma, CONSTS.delta0, CONSTS.L)
    eta, alpha = np.meshgrid(np.logspace(-4, 1, 1500), np.logspace(-4, 0, 1500), indexing="ij")
    brute = L.bound_proxy(eta, alpha, K, sigma, CONSTS.delta0, CONSTS.L)
    assert abs(float(val) - brute.min()) / brute.min() < 1e-3
    i = np.unravel_index(brute.argmin(), brute.shape)
    assert abs(math.log(float(a_star) / alpha[i])) < 0.05


def test_theory_alpha_non_decreasing_and_capped():
    taus = np.arange(1, 1025)
    a = L.optimal_alpha_theory(taus, 4096, CONSTS)
    assert (np.diff(a) >= 0).all() and a[-1] == 1.0 and a[0] < 0.1
    assert math.isclose(float(CONSTS.sigma(1024)), 0.0) and math.isclose(
        float(CONSTS.sigma(1)) ** 2, 2 * CONSTS.L_max * (CONSTS.delta0 + CONSTS.delta_inf))


def test_theory_sample_cost_is_the_least_sufficient_k():
    taus = np.array([1, 16, 256, 1024])
    eps = 3.0
    N = L.theory_sample_cost(taus, eps, CONSTS)
    K = N / taus
    sig = CONSTS.sigma(taus)
    assert (L.proxy_best(K, sig, CONSTS.delta0, CONSTS.L)[0] <= eps).all()
    assert (L.proxy_best(K - 1, sig, CONSTS.delta0, CONSTS.L)[0] > eps).all()


def test_proxy_bad_input():
    with pytest.raises(ValueError, match="alpha"):
        L.bound_proxy(0.1, 1.5, 10, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="tau"):
        CONSTS.sigma(2000)
    with pytest.raises(ValueError, match="eps"):
        L.theory_sample_cost([1], 0.0, CONSTS)
    with pytest.raises(ValueError, match="center"):
        L.lr_grid(-1.0, [1], [1.0], 3)


def test_lr_edge_fraction_and_best_curves():
    loss = np.ones((1, 1, 2, 3, 2))
    loss[0, 0, 0, 1] = [0.5, 0.1]      # α0: middle lr best
    loss[0, 0, 1, 2] = [0.2, 0.01]     # α1: largest lr best (on the edge)
    res = L.GridResult(lmo="l2", taus=np.array([1]), alphas=np.array([1.0, 0.5]), lrs=np.ones((1, 2, 3)),
                       samples=np.array([5, 10]), loss=loss)
    assert L.lr_edge_fraction(res) == 0.5
    np.testing.assert_allclose(L.best_lr_curves(res), np.log10([[[0.5, 0.1], [0.2, 0.01]]]))


def test_proxy_step_is_the_closed_form_minimiser():
    eta = np.logspace(-4, 1, 20001)
    for tau, alpha in [(1, 0.05), (16, 0.5), (64, 1.0)]:
        K = 4096 / tau
        vals = L.bound_proxy(eta, alpha, K, 3.0, CONSTS.delta0, CONSTS.L)
        assert abs(math.log(eta[vals.argmin()] / float(CONSTS.step(tau, alpha, 4096)))) < 1e-3


# ------------------------------------------------------------------ the notebook's harness

def test_run_landscape_centres_the_lr_grid_on_the_proxy_step():
    # the middle learning rate of each (τ, α) cell is the bound proxy's optimal step (ProxyConstants.step, its
    # exact closed form) up to its small-α approximation, divided by the LMO's Euclidean step length √d for sign
    probs = {"lin": L.linear_regression(64, 4, noise=0.5, seed=0, dtype=torch.float64)}
    taus, alphas, N = [1, 4], [1 / 64, 1 / 128], 64
    res = L.run_landscape(probs, [("lin", "l2"), ("lin", "sign")], taus, alphas, N, n_seeds=1, checkpoints=2,
                          lr_count=3, lr_ratio=2.0, seed=1)
    c = probs["lin"].proxy_constants()
    for (_, lmo), r in res.items():
        scale = 1.0 if lmo == "l2" else 2.0
        for t_i, a_i in itertools.product(range(2), range(2)):
            want = float(c.step(taus[t_i], alphas[a_i], N)) / scale
            assert abs(r.lrs[t_i, a_i, 1] / want - 1) < 0.01
            np.testing.assert_allclose(r.lrs[t_i, a_i], r.lrs[t_i, a_i, 1] * np.array([0.5, 1, 2]))
    direct = L.run_grid(probs["lin"], "sign", taus, alphas, res["lin", "sign"].lrs, N, 1, 2, seed=1)
    np.testing.assert_array_equal(direct.loss, res["lin", "sign"].loss)


def test_grid_offset_study_is_run_landscape_at_shifted_grids():
    probs = {"lin": L.linear_regression(64, 4, noise=0.5, seed=0, dtype=torch.float64)}
    taus, N = [1, 2, 4], 64
    grids = [L.LRGrid("a", 2.0, 3, (1.0, 0.5, 0.25)), L.LRGrid("b", 2**0.5, 2, (1.0, 0.5))]
    study = L.grid_offset_study(probs, ("lin", "l2"), taus, grids, [0.0, 0.5], N, n_seeds=2, checkpoints=2,
                                temperature=0.1, seed=3)
    assert study.slopes.shape == (2, 2) and study.median == pytest.approx(np.median(study.slopes))
    for i, g in enumerate(grids):
        base = L.run_landscape(probs, [("lin", "l2")], taus, g.alphas, N, 2, 2, g.count, g.ratio, seed=3)
        half = L.run_landscape(probs, [("lin", "l2")], taus, g.alphas, N, 2, 2, g.count, g.ratio, seed=3,
                               lr_offset=0.5)
        np.testing.assert_allclose(half["lin", "l2"].lrs, base["lin", "l2"].lrs * g.ratio**0.5)
        for j, res in enumerate((base, half)):
            assert study.slopes[i, j] == L.summarize(res["lin", "l2"], 0.1).slope


def test_offset_study_seed_medians_and_with_run_join_the_main_run():
    probs = {"lin": L.linear_regression(64, 4, noise=0.5, seed=0, dtype=torch.float64)}
    taus, N, g = [1, 2, 4], 64, L.LRGrid("a", 2.0, 3, (1.0, 0.5, 0.25))
    both = L.grid_offset_study(probs, ("lin", "l2"), taus, [g], [0.0, 0.5], N, n_seeds=3, checkpoints=2,
                               temperature=0.1, seed=3)
    np.testing.assert_allclose(both.seed_medians, np.median(both.seed_slopes[0], axis=0))
    half = L.grid_offset_study(probs, ("lin", "l2"), taus, [g], [0.5], N, n_seeds=3, checkpoints=2,
                               temperature=0.1, seed=3)
    main = L.run_landscape(probs, [("lin", "l2")], taus, g.alphas, N, 3, 2, g.count, g.ratio, seed=3)
    joined = half.with_run(L.summarize(main["lin", "l2"], 0.1))
    assert joined.offsets == [0.0, 0.5]
    np.testing.assert_allclose(joined.slopes, both.slopes)
    np.testing.assert_allclose(joined.seed_slopes, both.seed_slopes)
    with pytest.raises(ValueError, match="one learning-rate grid"):
        L.grid_offset_study(probs, ("lin", "l2"), taus, [g, g], [0.5], N, 1, 2, 0.1).with_run(
            L.summarize(main["lin", "l2"], 0.1))


def test_exact_grad_runs_full_gradient_steps_at_the_batch_step_count():
    prob = L.linear_regression(32, 3, noise=0.5, seed=1, dtype=torch.float64)
    lrs = np.full((2, 1, 1), 0.05)
    res = L.run_grid(prob, "l2", [1, 4], [0.5], lrs, 16, n_seeds=2, checkpoints=1, exact_grad=True)
    np.testing.assert_array_equal(res.loss[:, 0], res.loss[:, 1])  # no sampling noise: every seed alike
    for t_i, tau in enumerate((1, 4)):                               # a hand-written loop of 16/τ full steps
        x, m = torch.zeros(3, dtype=torch.float64), None
        for _ in range(16 // tau):
            g = (prob.a.T @ (prob.a @ x - prob.b)) / prob.n
            m = g if m is None else 0.5 * m + 0.5 * g
            x = x - 0.05 * m / m.norm()
        assert res.loss[t_i, 0, 0, 0, -1] == pytest.approx(float(prob.excess(x)), rel=1e-9)


def test_summarize_recovers_a_known_diagonal_shift():
    # synthetic landscape whose best α is 2^-6 · τ exactly (slope 1) and whose best lr is the middle one
    taus, alphas = np.array([1, 2, 4, 8]), 2.0 ** -np.arange(7)
    la, lt = np.log2(alphas), np.log2(taus)
    final = (la[None, :] - (lt[:, None] - 6)) ** 2                     # (τ, α), minimum at log2 α = log2 τ − 6
    lr_pen = np.array([1.0, 0.0, 2.0])
    log10 = final[:, None, :, None, None] + lr_pen[None, None, None, :, None] + np.zeros((4, 3, 7, 3, 2)) - 5
    res = L.GridResult(lmo="l2", taus=taus, alphas=alphas, lrs=np.ones((4, 7, 3)), samples=np.array([1, 2]),
                       loss=10.0 ** log10)
    s = L.summarize(res, temperature=0.01)
    np.testing.assert_allclose(s.alpha_hat, 2.0 ** (lt - 6), rtol=1e-6)
    assert math.isclose(s.slope, 1.0, rel_tol=1e-6) and math.isclose(s.ratio, 8.0, rel_tol=1e-6)
    np.testing.assert_allclose(s.seed_slopes, [1.0] * 3, rtol=1e-6)
    assert s.edge == 0.0


def test_measured_sample_cost_against_a_loop():
    rng = np.random.default_rng(0)
    loss = 10.0 ** -np.cumsum(rng.uniform(0, 0.5, (4, 2, 3, 2, 8)), axis=-1)
    res = L.GridResult(lmo="l2", taus=np.array([1, 2, 4, 8]), alphas=np.array([1.0, 0.5, 0.25]),
                       lrs=np.ones((4, 3, 2)), samples=np.arange(1, 9) * 16, loss=loss)
    m = L.measured_sample_cost(res, 0.3)
    mean = np.log10(loss).mean(axis=1)                                # (τ, α, lr, ckpt)
    best = np.array([min(mean[t, a, j, -1] for a in range(3) for j in range(2)) for t in range(4)])
    np.testing.assert_allclose(m.best_final, best)
    assert math.isclose(m.target, best.max() + 0.3)
    for t in range(4):
        first = next(k for k in range(8) if any(mean[t, a, j, k] <= m.target for a in range(3) for j in range(2)))
        assert m.samples[t] == res.samples[first]
    assert m.interior == bool(m.samples[1:-1].min() < min(m.samples[0], m.samples[-1]))


def test_proxy_sample_cost_and_abc_rows():
    prob = L.linear_regression(128, 3, noise=1.0, seed=4, dtype=torch.float64)
    pc = L.proxy_sample_cost(prob, [0.3, 0.1], 0.1, points=50)
    a, b = prob.a.numpy(), prob.b.numpy()
    assert math.isclose(pc.grad0, np.linalg.norm(a.T @ b / 128), rel_tol=1e-10)    # ∇f(0) = −aᵀb/n
    assert pc.taus[0] == 1 and pc.taus[-1] == 128 and (np.diff(pc.taus) > 0).all()
    assert pc.tau_star == pc.taus[pc.cost[0.1].argmin()] and (pc.cost[0.1] >= pc.cost[0.3]).all()
    with pytest.raises(ValueError, match="eps_main"):
        L.proxy_sample_cost(prob, [0.3], 0.1)
    rows = L.abc_rows({"p": prob}, [1, 8, 128], 1024)
    v = np.array([(128 - t) / (t * 127) for t in (1, 8, 128)])
    np.testing.assert_allclose([r["A"] for r in rows], v * (a**2).sum(1).max())
    np.testing.assert_allclose([r["B"] for r in rows], 1 - v)
    assert rows[-1]["A"] == 0 and rows[-1]["C"] == 0 and rows[-1]["σ_τ (proxy)"] == 0


def test_proxy_alpha_min_step_against_a_per_tau_loop():
    consts = L.ProxyConstants(delta0=10.0, L=2.0, L_max=40.0, delta_inf=0.3, n=32)
    per_tau = [float(L.proxy_best(256 / t, consts.sigma(t), consts.delta0, consts.L)[1]) for t in range(1, 33)]
    assert math.isclose(L.proxy_alpha_min_step(consts, 32, 256), float(np.diff(np.log2(per_tau)).min()))


def test_ns5_inexactness():
    r = L.ns5_inexactness(6, 4, count=50, seed=0, points=100)
    assert math.isclose(float((r.sv_in**2).sum()), 1.0, rel_tol=1e-12)      # input scaled to unit Frobenius norm
    assert r.sv_out.shape == (100,) and r.cosine.shape == (50,) and r.sv_random.shape == (200,)
    assert 0.5 < r.sv_out[-1] < 1.5 and r.sv_out[0] < 0.1                     # tiny singular values stay short
    assert (r.cosine > 0.8).all() and (r.cosine <= 1 + 1e-12).all()
    assert 0.3 < r.sv_random.min() and r.sv_random.max() < 1.5
