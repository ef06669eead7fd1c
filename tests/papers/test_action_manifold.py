"""Tests of repro.papers.action_manifold (paper 13, GAM) against independent references: scipy's matrix exponential
and logarithm, analytic arc lengths, exact polyline identities and a brute-force discrete Fréchet recursion."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import scipy.linalg
import torch

from repro.papers import action_manifold as G

F64 = dict(dtype=torch.float64)


def algebra_matrix(xi: np.ndarray) -> np.ndarray:
    rx, ry, th, lam = xi
    return np.array([[lam, -th, rx], [th, lam, ry], [0.0, 0.0, 0.0]])


def random_xi(rng: np.random.Generator, count: int) -> np.ndarray:
    xi = np.c_[rng.normal(0, 2, (count, 2)), rng.uniform(-3.1, 3.1, count), rng.normal(0, 1, count)]
    xi[:5, 2:] = rng.normal(0, 1e-4, (5, 2))   # |w| below the series radius
    xi[5:8, 2:] = 0.0                          # pure translation
    xi[8, 2], xi[9, 2] = math.pi - 1e-9, -math.pi + 1e-9
    return xi


def random_sim2(rng: np.random.Generator, count: int) -> torch.Tensor:
    rot = torch.polar(torch.as_tensor(np.exp(rng.uniform(-2, 2, count)), **F64),
                      torch.as_tensor(rng.uniform(-np.pi, np.pi, count), **F64))
    t = torch.as_tensor(rng.uniform(-50, 50, (count, 2)), **F64)
    return G.sim2_matrix(rot, torch.complex(t[:, 0], t[:, 1]))


# ---------------------------------------------------------------------------------------------- Sim(2)
def test_exp_matches_scipy_expm():
    xi = random_xi(np.random.default_rng(0), 60)
    ours = G.sim2_exp(torch.as_tensor(xi, **F64)).numpy()
    for k in range(len(xi)):
        np.testing.assert_allclose(ours[k], scipy.linalg.expm(algebra_matrix(xi[k])), atol=1e-11, rtol=1e-11)


def test_log_matches_scipy_logm_and_round_trips():
    xi = random_xi(np.random.default_rng(1), 60)
    Gm = G.sim2_exp(torch.as_tensor(xi, **F64))
    back = G.sim2_log(Gm).numpy()
    np.testing.assert_allclose(back, xi, atol=1e-10)
    for k in range(10, len(xi)):  # scipy's principal logarithm (away from θ = ±π where it is ill-conditioned)
        np.testing.assert_allclose(algebra_matrix(back[k]), scipy.linalg.logm(Gm[k].numpy()).real, atol=1e-9)
    g = random_sim2(np.random.default_rng(2), 50)
    np.testing.assert_allclose(G.sim2_exp(G.sim2_log(g)).numpy(), g.numpy(), atol=1e-9, rtol=1e-12)


def test_act_inverse_and_composition():
    rng = np.random.default_rng(3)
    g, h = random_sim2(rng, 20), random_sim2(rng, 20)
    pts = torch.as_tensor(rng.normal(size=(20, 7, 2)), **F64)
    np.testing.assert_allclose(G.sim2_act(G.sim2_inv(g), G.sim2_act(g, pts)).numpy(), pts.numpy(), atol=1e-9)
    np.testing.assert_allclose(G.sim2_act(g @ h, pts).numpy(), G.sim2_act(g, G.sim2_act(h, pts)).numpy(), atol=1e-8)


def test_sim2_rejects_bad_input():
    with pytest.raises(ValueError, match="not a Sim"):
        G.sim2_log(torch.eye(3, **F64) + torch.tensor([[0, 1.0, 0], [0, 0, 0], [0, 0, 0]], **F64))
    with pytest.raises(ValueError, match="NaN"):
        G.sim2_exp(torch.tensor([0.0, 0.0, float("nan"), 0.0]))
    with pytest.raises(ValueError, match=r"\[\.\.\., 4\]"):
        G.sim2_exp(torch.zeros(3))


# ---------------------------------------------------------------------------------------------- arc length
def test_circle_arc_length_and_equal_spacing():
    r, T, n = 1.7, 4001, 64
    a = torch.linspace(0, 2 * math.pi, T, **F64)
    x = r * torch.stack([a.cos(), a.sin()], -1)
    P, L, u = G.arclength_resample(x, n)
    assert abs(float(L) - 2 * math.pi * r) < 1e-4
    ang = torch.linspace(0, 2 * math.pi, n, **F64)
    np.testing.assert_allclose(P.numpy(), (r * torch.stack([ang.cos(), ang.sin()], -1)).numpy(), atol=1e-5)
    np.testing.assert_allclose(u.numpy(), (a / (2 * math.pi)).numpy(), atol=1e-9)


def test_time_warp_invariance_smooth_curve():
    paths = G.skill_paths(skills=("arc", "S", "loop"))
    rng = np.random.default_rng(4)
    plain = G.arclength_resample(G.retime(paths, torch.linspace(0, 1, 2000, **F64)), 64)[0]
    for fam in ("beta", "stopgo", "softplus"):
        u = torch.as_tensor(G.time_warps(fam, 3 * 10, 2000, rng), **F64).view(3, 10, 2000)
        P = G.arclength_resample(G.retime(paths[:, None].expand(-1, 10, -1, -1), u), 64)[0]
        assert float((P - plain[:, None]).norm(dim=-1).max()) < 1e-3, fam


def test_warp_of_a_straight_line_is_exact():
    x0 = torch.stack([torch.linspace(0, 3, 50, **F64), torch.zeros(50, **F64)], -1)
    u = torch.as_tensor(G.time_warps("beta", 5, 50, np.random.default_rng(5)), **F64)
    warped = torch.stack([3 * u, torch.zeros_like(u)], -1)
    np.testing.assert_allclose(G.arclength_resample(warped, 17)[0].numpy(),
                               G.arclength_resample(x0, 17)[0].expand(5, -1, -1).numpy(), atol=1e-12)


def test_pauses_are_skipped():
    rng = np.random.default_rng(6)
    x = torch.as_tensor(np.cumsum(rng.normal(size=(30, 2)), 0), **F64)
    paused = torch.cat([x[:10], x[9:10].expand(30, -1), x[10:], x[-1:].expand(5, -1)])  # stops, incl. at the end
    P0, L0, _ = G.arclength_resample(x, 40)
    P1, L1, u1 = G.arclength_resample(paused, 40)
    np.testing.assert_allclose(P1.numpy(), P0.numpy(), atol=1e-12)
    assert abs(float(L1 - L0)) < 1e-12 and bool((u1.diff() >= 0).all())


def test_arclength_rejects_bad_input():
    with pytest.raises(ValueError, match="zero arc length"):
        G.arclength_resample(torch.ones(10, 2), 8)
    with pytest.raises(ValueError, match="NaN"):
        G.arclength_resample(torch.tensor([[0.0, 0.0], [float("nan"), 1.0]]), 8)
    with pytest.raises(ValueError, match="at least 2"):
        G.arclength_resample(torch.rand(10, 2), 1)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        G.retime(torch.rand(5, 2), torch.tensor([0.0, 1.5]))


def test_retime_reads_the_knots():
    P = torch.as_tensor(np.random.default_rng(7).normal(size=(3, 9, 2)), **F64)
    np.testing.assert_allclose(G.retime(P, torch.linspace(0, 1, 9, **F64)).numpy(), P.numpy(), atol=1e-14)
    mid = G.retime(P, torch.tensor([1 / 16], **F64))  # halfway between knots 0 and 1
    np.testing.assert_allclose(mid[:, 0].numpy(), ((P[:, 0] + P[:, 1]) / 2).numpy(), atol=1e-14)
    many = G.retime(P[0], torch.tensor([[0.0, 1 / 16], [1.0, 0.5]], **F64))  # one path, a batch of timings
    np.testing.assert_allclose(many.numpy(), np.stack([[P[0, 0], (P[0, 0] + P[0, 1]) / 2], [P[0, -1], P[0, 4]]]),
                               atol=1e-14)


# ---------------------------------------------------------------------------------------------- factorization
def test_schema_is_sim2_invariant_and_canonical():
    data = G.make_skill_dataset(5, rng=8, dtype=torch.float64)
    g = random_sim2(np.random.default_rng(9), len(data))
    W, xi, u, L = G.factorize(data.x, 32)
    W2, xi2, u2, L2 = G.factorize(G.sim2_act(g, data.x), 32)
    assert float((W2 - W).abs().max()) < 1e-9
    np.testing.assert_allclose(u2.numpy(), u.numpy(), atol=1e-12)
    np.testing.assert_allclose(W[:, 0].numpy(), 0.0, atol=1e-12)
    np.testing.assert_allclose(W[:, -1].numpy(), np.tile([1.0, 0.0], (len(W), 1)), atol=1e-12)
    s = g[:, :2, 0].norm(dim=-1)  # |e^w| of g: lengths scale with it
    np.testing.assert_allclose(L2.numpy(), (s * L).numpy(), rtol=1e-12)


def test_moment_frame_for_closed_paths():
    a = torch.linspace(0, 2 * math.pi, 300, **F64)
    closed = torch.stack([2 * a.cos() + 0.3 * a.sin() ** 2, a.sin()], -1)
    with pytest.raises(ValueError, match="closed path"):
        G.canonical_frame(closed, "chord")
    g = random_sim2(np.random.default_rng(10), 20)
    W = G.factorize(closed, 64, "moment")[0]
    W2 = G.factorize(G.sim2_act(g, closed.expand(20, -1, -1)), 64, "moment")[0]
    assert float((W2 - W).abs().max()) < 1e-9
    np.testing.assert_allclose(W.norm(dim=-1).pow(2).mean().numpy(), 1.0, atol=1e-12)  # unit RMS radius


def test_round_trip():
    data = G.make_skill_dataset(5, rng=11, dtype=torch.float64)
    P = G.arclength_resample(data.x, 32)[0]
    W, xi, u, _ = G.factorize(data.x, 32)
    assert float((G.sim2_act(G.sim2_exp(xi), W) - P).abs().max()) < 1e-9      # the Sim(2) part is exact
    steps = np.random.default_rng(21).uniform(0, 2 * np.pi, (4, 31))            # an equilateral polyline: its knots
    eq = torch.as_tensor(np.cumsum(np.stack([np.cos(steps), np.sin(steps)], -1), 1), **F64)  # are at σ_j = j/31
    eq = torch.cat([torch.zeros(4, 1, 2, **F64), eq], 1)
    W, xi, u, _ = G.factorize(eq, 32)
    np.testing.assert_allclose(u.numpy(), np.tile(np.linspace(0, 1, 32), (4, 1)), atol=1e-12)
    assert float((G.compose(W, xi, u) - eq).abs().max()) < 1e-9                # → the whole round trip is exact
    err = {n: float((G.compose(*G.factorize(data.x, n)[:3]) - data.x).norm(dim=-1).max()) for n in (32, 256)}
    assert err[256] < err[32] < 0.05   # a coarse polyline cuts the demo's knots: not exact, shrinks with n


# ---------------------------------------------------------------------------------------------- Fréchet
def brute_frechet(P: np.ndarray, Q: np.ndarray) -> float:
    d = np.linalg.norm(P[:, None] - Q[None], axis=-1)

    @functools.cache
    def c(i: int, j: int) -> float:
        if i == 0 and j == 0:
            return d[0, 0]
        prev = [c(a, b) for a, b in ((i - 1, j), (i - 1, j - 1), (i, j - 1)) if a >= 0 and b >= 0]
        return max(d[i, j], min(prev))

    return float(c(len(P) - 1, len(Q) - 1))


def test_frechet_against_brute_force():
    rng = np.random.default_rng(12)
    P, Q = rng.normal(size=(6, 7, 2)), rng.normal(size=(6, 11, 2))
    ours = G.frechet(torch.as_tensor(P, **F64), torch.as_tensor(Q, **F64)).numpy()
    np.testing.assert_allclose(ours, [brute_frechet(p, q) for p, q in zip(P, Q, strict=True)], atol=1e-12)


def test_frechet_identical_and_shifted():
    t = torch.linspace(0, 1, 40, **F64)
    line = torch.stack([t, 2 * t], -1)
    assert float(G.frechet(line, line)) == 0.0
    shift = torch.tensor([0.3, -0.4], **F64)
    assert abs(float(G.frechet(line, line + shift)) - 0.5) < 1e-12


def test_path_error_ignores_timing():
    paths = G.skill_paths(skills=("arc",))
    u = torch.as_tensor(G.time_warps("beta", 4, 400, np.random.default_rng(13)), **F64)
    x = G.retime(paths.expand(4, -1, -1), u)
    assert float(G.path_error(x, G.retime(paths, torch.linspace(0, 1, 400, **F64)).expand(4, -1, -1)).max()) < 1e-3


# ---------------------------------------------------------------------------------------------- data and models
@pytest.mark.parametrize("family", G.WARPS)
def test_time_warps_are_monotone_maps_of_the_unit_interval(family):
    u = G.time_warps(family, 50, 60, np.random.default_rng(14))
    assert np.all(np.diff(u, axis=1) >= 0)
    np.testing.assert_allclose(u[:, [0, -1]], np.tile([0.0, 1.0], (50, 1)), atol=1e-12)


def test_dataset_geometry():
    d = G.make_skill_dataset(3, theta_deg=(90, 90), scale=(2, 2), noise=0.0, rng=15, dtype=torch.float64,
                             skills=("straight", "arc"))
    np.testing.assert_allclose((d.goal - d.start).numpy(), np.tile([0.0, 2.0], (len(d), 1)), atol=1e-12)
    np.testing.assert_allclose(d.x.numpy(), d.clean_timed.numpy())
    seg = d.clean_path.diff(dim=1).norm(dim=-1)     # smooth skills: the clean path's chords are (nearly) equal
    assert float((seg / seg.mean(1, keepdim=True) - 1).abs().max()) < 0.01
    assert bool(((d.shape >= 0) & (d.shape <= 1)).all()) and float(d.shape.std()) > 0.05
    with pytest.raises(ValueError):
        G.make_skill_dataset(0)
    with pytest.raises(ValueError, match="shape"):
        G.make_skill_dataset(2, shape=(0.2, 1.5))


def test_shape_parameter_sets_the_height_analytically():
    a = np.array([0.0, 0.3, 1.0])
    for name in ("arc", "zigzag", "L"):   # the peak height of these curves is the shape value itself
        k = G.SKILLS.index(name)
        P = G.shaped_paths(np.full(3, k), a)
        # within the corner cut of 2001 arc-length knots (O(h), h ≈ 1e-3)
        np.testing.assert_allclose(P[..., 1].amax(1).numpy(), G.shape_value(name, a), atol=5e-4)
    k = G.SKILLS.index("straight")        # no shape: the parameter is ignored
    P = G.shaped_paths(np.full(3, k), a)
    np.testing.assert_allclose(P.numpy(), P[:1].expand(3, -1, -1).numpy(), atol=0)
    # a = 0.5 is the fixed canonical shape (computed on a different dense grid)
    ref = G.skill_paths(2001)
    P = G.shaped_paths(np.arange(len(G.SKILLS)), np.full(len(G.SKILLS), 0.5))
    assert float((P - ref).abs().max()) < 1e-6


def test_warped_sets_share_poses_and_shapes():
    a = G.make_skill_dataset(4, warp="beta", rng=31, dtype=torch.float64)
    b = G.make_skill_dataset(4, warp="stopgo", rng=31, dtype=torch.float64)
    for f in ("shape", "start", "goal", "clean_path"):
        np.testing.assert_allclose(getattr(a, f).numpy(), getattr(b, f).numpy(), atol=1e-12)
    assert float((a.u - b.u).abs().max()) > 0.01


def test_lookup_against_brute_force():
    d = G.make_skill_dataset(5, rng=32, dtype=torch.float64)
    W = G.factorize(d.x, 16)[0].numpy()
    q = G.make_skill_dataset(3, rng=33, dtype=torch.float64)
    mean = G.SchemaLookup(d, 16, "mean")
    near = G.SchemaLookup(d, 16, "nearest")
    skill, shape = d.skill.numpy(), d.shape.numpy()
    for i in range(len(q)):
        k, a = int(q.skill[i]), float(q.shape[i])
        own = np.nonzero(skill == k)[0]
        np.testing.assert_allclose(mean.schema(q.skill[i:i + 1], q.shape[i:i + 1])[0].numpy(), W[own].mean(0),
                                   atol=1e-12)
        j = own[np.argmin(np.abs(shape[own] - a))]
        np.testing.assert_allclose(near.schema(q.skill[i:i + 1], q.shape[i:i + 1])[0].numpy(), W[j], atol=0)
    out = mean(q.skill, q.shape, q.start, q.goal)[0]    # placed with the chord frame of the query
    np.testing.assert_allclose(out[:, 0].numpy(), q.start.numpy(), atol=1e-12)
    np.testing.assert_allclose(out[:, -1].numpy(), q.goal.numpy(), atol=1e-12)


def test_gam_lite_is_sim2_equivariant_by_construction():
    torch.manual_seed(0)
    d = G.make_skill_dataset(2, rng=16, dtype=torch.float64)
    g = random_sim2(np.random.default_rng(17), len(d))
    for model in (G.GAMLite(6, 32, 50, arclength=True, members=2).double(), G.GAMEq(6, 32, members=2).double()):
        out = model(d.skill, d.shape, d.start, d.goal)
        moved = model(d.skill, d.shape, G.sim2_act(g, d.start[:, None])[:, 0], G.sim2_act(g, d.goal[:, None])[:, 0])
        np.testing.assert_allclose(moved.detach().numpy(), G.sim2_act(g, out).detach().numpy(), atol=1e-8)


def test_learned_frame_formula_by_hand():
    """GAM-eq with V = the straight schema and c₁ = 0, c₂ = 1 is the chord start → goal; with c₁ = i the schema is
    shifted by a quarter turn of the chord."""
    model = G.GAMEq(2, 5).double()
    last = model.net[-1]
    sigma = torch.linspace(0, 1, 5, **F64)
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.cat([torch.stack([sigma, 0 * sigma], -1).reshape(-1),
                                   torch.tensor([0.0, 0.0, 1.0, 0.0], **F64)]).view(1, 1, -1))
        start, goal = torch.tensor([[1.0, 2.0]], **F64), torch.tensor([[1.0, 4.0]], **F64)
        out = model(torch.tensor([1]), torch.tensor([0.3], **F64), start, goal)[0, 0].numpy()
        np.testing.assert_allclose(out, np.stack([np.ones(5), 2 + 2 * sigma.numpy()], -1), atol=1e-12)
        last.bias[0, 0, -4:] = torch.tensor([0.0, 1.0, 1.0, 0.0], **F64)    # c₁ = i: + i·d = (−2, 0)
        out = model(torch.tensor([1]), torch.tensor([0.3], **F64), start, goal)[0, 0].numpy()
        np.testing.assert_allclose(out, np.stack([-np.ones(5), 2 + 2 * sigma.numpy()], -1), atol=1e-12)


def test_a_stack_member_trains_as_it_would_alone():
    data = [G.make_skill_dataset(2, rng=18), G.make_skill_dataset(3, rng=19)]
    torch.manual_seed(0)
    stack = G.AbsoluteMLP(6, 50, arclength=False, members=2)
    alone = G.AbsoluteMLP(6, 50, arclength=False, members=1)
    alone.load_state_dict({k: v[:1].clone() for k, v in stack.state_dict().items()})
    G.train(stack, data, steps=30, augment=[False, True])   # member 1's augmentation must not leak into member 0
    G.train(alone, data[0], steps=30)
    d = data[0]
    np.testing.assert_allclose(stack(d.skill, d.shape, d.start, d.goal)[0].detach().numpy(),
                               alone(d.skill, d.shape, d.start, d.goal)[0].detach().numpy(), atol=1e-5)


def test_training_fits_the_schema():
    torch.manual_seed(0)
    data = G.make_skill_dataset(4, rng=20)
    model = G.GAMLite(6, 32, 50, arclength=True)
    losses = G.train(model, data, steps=200, lr=3e-3)
    assert losses[-1] < 0.05 * losses[0]
    with torch.no_grad():
        err = G.path_error(model(data.skill, data.shape, data.start, data.goal)[0], data.clean_path).mean()
    assert float(err) < 0.03
    with pytest.raises(ValueError, match="equivariant"):
        G.train(model, data, steps=1, augment=True)


def test_learned_schema_interpolates_shapes_the_mean_lookup_cannot():
    """Trained on arcs of varying height, GAM-lite's error on unseen heights is far below the per-skill mean's; on one
    fixed height it converges to that mean (the lookup a token-only head is)."""
    kw = dict(skills=("arc",), noise=0.0, rng=22)
    train_set = G.make_skill_dataset(24, **kw)
    test = G.make_skill_dataset(40, **{**kw, "rng": 23})
    torch.manual_seed(0)
    model = G.GAMLite(1, 32, 50, arclength=True)
    G.train(model, train_set, steps=600, lr=3e-3)
    lookup = G.SchemaLookup(train_set, 32, "mean")
    with torch.no_grad():
        err = G.path_error(model(test.skill, test.shape, test.start, test.goal)[0], test.clean_path).mean()
    base = G.path_error(lookup(test.skill, test.shape, test.start, test.goal)[0], test.clean_path).mean()
    assert float(err) < 0.3 * float(base)
    fixed = G.make_skill_dataset(8, shape=(0.5, 0.5), **kw)
    torch.manual_seed(0)
    model = G.GAMLite(1, 32, 50, arclength=True)
    G.train(model, fixed, steps=600, lr=3e-3)
    with torch.no_grad():
        W = model.schema(fixed.skill[:1], fixed.shape[:1])[0, 0]
    assert float((W - G.SchemaLookup(fixed, 32).mean[0].float()).abs().max()) < 5e-3


def test_exact_checks_run_with_fewer_draws_than_scipy_comparisons():
    """The smoke tier's size: fewer random group elements (n_g) than the 200 scipy comparisons used to index past
    them; the checks still hold to float64 precision."""
    checks = G.exact_checks(G.skill_paths(), n_g=40, warps_per=2, seed=0)
    assert checks.schema_invariance < 1e-9 and checks.exp_log < 1e-9 and checks.vs_scipy < 1e-9
    assert checks.roundtrip_sim2 < 1e-12 and checks.warp.shape == (len(G.SKILLS), 4)
