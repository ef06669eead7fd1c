"""repro.contracts against independent references: brute-force best responses on grids, exact rational
arithmetic for ties, closed forms, and the exact binomial tail of a two-point instance."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import stats

from repro.papers import contracts as C


def brute_reward(R: torch.Tensor, c: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """R_{i*(α)} by explicit argmax over actions at each α, ties to the highest reward (types × alphas)."""
    value = alpha[None, None, :] * R[:, :, None] - c[:, :, None]  # (T, k, A)
    best = value.max(dim=1, keepdim=True).values
    tied = value == best
    return torch.where(tied, R[:, :, None], torch.tensor(-1.0, dtype=R.dtype)).max(dim=1).values


def exact_reward(R: list[Fraction], c: list[Fraction], alpha: Fraction) -> Fraction:
    """The same in exact rational arithmetic for one type."""
    values = [alpha * r - ci for r, ci in zip(R, c, strict=True)]
    top = max(values)
    return max(r for r, v in zip(R, values, strict=True) if v == top)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def test_envelope_matches_brute_force_on_grid(rng):
    R, c = C.random_types(300, 40, rng=rng)
    env = C.envelope(R, c)
    alpha = torch.linspace(0, 1, 4001, dtype=torch.float64)
    got, want = env.reward(alpha), brute_reward(R, c, alpha)
    near_break = (alpha[None, :] - env.breaks[:, :, None]).abs().min(dim=1).values < 1e-9
    assert torch.equal(got[~near_break], want[~near_break])
    assert near_break.float().mean() < 1e-3


def test_envelope_is_monotone_with_at_most_k_minus_1_breaks(rng):
    for k in (1, 2, 5, 64):
        R, c = C.random_types(100, k, rng=rng)
        env = C.envelope(R, c)
        assert env.breaks.shape == (100, k - 1)
        assert (env.n_breaks <= k - 1).all()
        assert (env.rewards[:, 1:] >= env.rewards[:, :-1]).all()
        finite = torch.isfinite(env.breaks)
        assert ((env.breaks[finite] >= 0) & (env.breaks[finite] <= 1)).all()


def test_ties_go_to_the_principal_exactly():
    # Three lines through the point (1/2, 1/8), plus the null action: at α = 1/2 they all tie and the highest
    # reward must win; with exact dyadic data the float envelope can be compared in exact arithmetic.
    Rs = [Fraction(0), Fraction(1, 4), Fraction(1, 2), Fraction(3, 4)]
    cs = [Fraction(0), Fraction(1, 2) * Fraction(1, 4) - Fraction(1, 8),
          Fraction(1, 2) * Fraction(1, 2) - Fraction(1, 8), Fraction(1, 2) * Fraction(3, 4) - Fraction(1, 8)]
    R = torch.tensor([[float(x) for x in Rs]], dtype=torch.float64)
    c = torch.tensor([[float(x) for x in cs]], dtype=torch.float64)
    env = C.envelope(R, c)
    for a in [Fraction(k, 64) for k in range(65)]:
        assert env.reward(torch.tensor([float(a)], dtype=torch.float64)).item() == exact_reward(Rs, cs, a)
    assert env.reward(torch.tensor([0.5], dtype=torch.float64)).item() == 0.75


def test_envelope_against_exact_rationals_with_many_ties(rng):
    # Dyadic rewards and costs on a coarse lattice make exact ties common.
    for _ in range(200):
        k = int(rng.integers(2, 7))
        Rs = [Fraction(0)] + [Fraction(int(x), 8) for x in rng.integers(0, 9, k - 1)]
        cs = [Fraction(0)] + [Fraction(int(x), 16) for x in rng.integers(0, 12, k - 1)]
        env = C.envelope(torch.tensor([[float(x) for x in Rs]], dtype=torch.float64),
                         torch.tensor([[float(x) for x in cs]], dtype=torch.float64))
        # Crossings are (m/16)/(j/8) = m/(2j): the dyadic ones lie on this grid and float division gets them
        # exactly, so ties happen at grid points; the others are at least 1/1536 away from every grid point.
        grid = [Fraction(j, 256) for j in range(257)]
        got = env.reward(torch.tensor([[float(a) for a in grid]], dtype=torch.float64))[0]
        assert [Fraction(g) for g in got.tolist()] == [exact_reward(Rs, cs, a) for a in grid]


def test_two_action_closed_form():
    # Null action plus one action (R, c) with R > c: the optimal linear contract is α* = c / R.
    R = torch.tensor([[0.0, 0.8]], dtype=torch.float64)
    c = torch.tensor([[0.0, 0.2]], dtype=torch.float64)
    curve = C.mean_reward(C.envelope(R, c))
    alpha, value = curve.eum()
    assert alpha.item() == pytest.approx(0.25, abs=1e-15)
    assert value.item() == pytest.approx(0.8 - 0.2, abs=1e-15)
    # When the action does not pay (R < c), the best contract pays nothing.
    curve = C.mean_reward(C.envelope(R, torch.tensor([[0.0, 0.9]], dtype=torch.float64)))
    assert curve.eum()[1].item() == 0.0


def _brute_empirical(R, c, alpha):
    return ((1 - alpha) * brute_reward(R, c, alpha)).mean(dim=0)


def test_eum_against_brute_force_grid(rng):
    G = 100_000
    alpha = torch.linspace(0, 1, G + 1, dtype=torch.float64)
    for _ in range(5):
        R, c = C.random_types(60, 12, rng=rng)
        a_hat, value = C.mean_reward(C.envelope(R, c)).eum()
        grid = _brute_empirical(R, c, alpha)
        # never worse than any grid point, and within the grid's resolution of the grid's best
        assert value.item() >= grid.max().item() - 1e-12
        assert value.item() <= grid.max().item() + 1.0 / G
        # the reported value is attained at the returned contract (right-continuity at a breakpoint)
        at = _brute_empirical(R, c, a_hat + 1e-13)
        assert at.item() == pytest.approx(value.item(), abs=1e-11)


def test_sup_deviation_is_exact(rng):
    pop = C.random_population(40, 10, rng=rng)
    w = pop.sample_weights(30, 4, rng)
    emp = pop.empirical(w)
    sup, where = C.sup_deviation(emp, pop.truth)
    # brute force: evaluate both curves type by type on a fine grid plus just right of every breakpoint
    breaks = pop.env.breaks[torch.isfinite(pop.env.breaks)]
    alpha = torch.sort(torch.cat([torch.linspace(0, 1, 20001, dtype=torch.float64), breaks + 1e-12,
                                  breaks])).values.clamp(0, 1)
    per_type = (1 - alpha) * brute_reward(pop.R, pop.c, alpha)  # (T, A)
    gap = (w @ per_type - pop.probs @ per_type).abs()  # (reps, A)
    assert torch.allclose(sup, gap.max(dim=1).values, atol=1e-10)
    assert (sup >= gap.max(dim=1).values - 1e-12).all()
    assert ((where >= 0) & (where <= 1)).all()


def test_eum_gap_is_at_most_twice_the_sup_deviation(rng):
    pop = C.random_population(100, 20, rng=rng)
    tr = C.run_trials(pop, 50, 300, rng)
    assert (tr.subopt >= -1e-12).all()
    assert (tr.subopt <= 2 * tr.sup_dev + 1e-12).all()


def test_two_point_instance_matches_the_exact_binomial_tail():
    eta, n, reps = 0.05, 90, 4000
    pop = C.two_point_population(eta)
    tr = C.run_trials(pop, n, reps, np.random.default_rng(7))
    wrong = (tr.alpha_hat != 0.25).double()
    assert torch.all((tr.subopt == 0) | (tr.subopt - 0.75 * eta).abs().lt(1e-12))
    p = 1 / 3 + eta
    exact = stats.binom.cdf(int(np.ceil(n / 3)) - 1, n, p)  # P(#A < n/3): EUM picks 3/4
    sd = np.sqrt(exact * (1 - exact) / reps)
    assert abs(wrong.mean().item() - exact) < 4 * sd
    assert tr.alpha_star == 0.25


def test_generator_is_not_degenerate(rng):
    env = C.envelope(*C.random_types(500, 50, rng=rng))
    assert env.n_breaks.min() >= 1
    assert env.n_breaks.double().mean() >= 2


def test_seeded_runs_are_identical():
    def once():
        rng = np.random.default_rng(3)
        pop = C.random_population(50, 10, rng=rng)
        return C.run_trials(pop, 40, 20, rng).sup_dev

    assert torch.equal(once(), once())


def test_float32_agrees_with_float64(rng):
    R, c = C.random_types(200, 30, rng=rng)
    e64 = C.envelope(R, c)
    e32 = C.envelope(R.float(), c.float())
    alpha = torch.linspace(0, 1, 101, dtype=torch.float64)
    agree = (e64.reward(alpha).float() == e32.reward(alpha.float())).double().mean()
    assert agree > 0.99


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runs_on_cuda(rng):
    pop = C.random_population(100, 20, rng=rng, device="cuda")
    tr = C.run_trials(pop, 50, 10, rng)
    assert tr.sup_dev.device.type == "cuda"


@pytest.mark.parametrize(
    "R, c, match",
    [
        (torch.ones(2, 3), torch.ones(2, 2), "shape"),
        (torch.full((1, 2), 1.5), torch.zeros(1, 2), r"\[0, 1\]"),
        (torch.ones(1, 2), -torch.ones(1, 2), "non-negative"),
        (torch.zeros(0, 2), torch.zeros(0, 2), "at least one"),
        (torch.tensor([[0.0, float("nan")]]), torch.zeros(1, 2), "finite"),
    ],
)
def test_bad_types_are_rejected(R, c, match):
    with pytest.raises(ValueError, match=match):
        C.envelope(R, c)


def test_bad_population_is_rejected():
    R, c = torch.ones(2, 2) * 0.5, torch.zeros(2, 2)
    with pytest.raises(ValueError, match="sum to 1"):
        C.Population(R=R, c=c, probs=torch.tensor([0.5, 0.6]))
    pop = C.Population(R=R, c=c, probs=torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="n >= 1"):
        pop.sample_weights(0, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="eta"):
        C.two_point_population(0.9)


# ------------------------------------------------------------------ the notebook's harness


def test_utility_polyline_has_gaps_at_jumps_and_exact_ends():
    x, y = C.utility_polyline(np.array([0.0, 0.5]), np.array([0.2, 0.6]))
    assert np.isnan(x[2]) and np.isnan(y[5])
    np.testing.assert_allclose(x[[0, 1, 3, 4]], [0, 0.5, 0.5, 1.0])
    np.testing.assert_allclose(y[[0, 1, 3, 4]], [0.2, 0.1, 0.3, 0.0])


def test_nested_weights_are_prefix_frequencies():
    draws = np.array([0, 2, 2, 1, 0])
    w = C.nested_weights(draws, 3, 4)
    assert w.shape == (1, 4) and torch.allclose(w, torch.tensor([[1 / 3, 0, 2 / 3, 0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="n="):
        C.nested_weights(draws, 6, 4)


def test_rate_in_n_is_the_per_n_mean_of_run_trials():
    pop = C.random_population(30, 6, rng=np.random.default_rng(0))
    res = C.rate_in_n(pop, [10, 40], 50, np.random.default_rng(1))
    rng = np.random.default_rng(1)
    by_hand = [float(C.run_trials(pop, n, 50, rng).sup_dev.mean()) for n in (10, 40)]
    np.testing.assert_allclose(res.sup_mean, by_hand)
    assert res.n_trials == 100 and res.violations == 0 and res.sup_band.shape == (2, 2)


def test_two_point_simulation_tracks_the_exact_binomial_tail():
    tp = C.two_point_errors(0.1, [0.5, 1.5], 4000, np.random.default_rng(0))
    assert (tp.ns % 3 == 0).all()
    assert np.abs(tp.wrong - tp.exact_at).max() < 0.03  # 4000 reps: 3 SE of a proportion is < 0.024


def test_staircase_types_switch_where_built(rng):
    for k in (2, 5, 40):
        R, c = C.staircase_types(50, k, rng=rng, concentration=0.7, spread=0.6)
        env = C.envelope(R, c)
        assert (env.n_breaks == k - 1).all()                        # every action is used
        assert torch.equal(env.actions, torch.arange(k).expand(50, k))
        np.testing.assert_allclose(R[:, -1].numpy(), 1.0)
        # the switch from i-1 to i is at b_i = (c_i - c_{i-1}) / (R_i - R_{i-1}), all inside [0, spread)
        b = (c[:, 1:] - c[:, :-1]) / (R[:, 1:] - R[:, :-1])
        torch.testing.assert_close(env.breaks, b, rtol=1e-9, atol=1e-12)
        assert (b >= 0).all() and (b < 0.6).all()
        alpha = torch.linspace(0, 1, 2001, dtype=torch.float64)
        near = (alpha[None, :] - env.breaks[:, :, None]).abs().min(dim=1).values < 1e-9
        assert torch.equal(env.reward(alpha)[~near], brute_reward(R, c, alpha)[~near])
    with pytest.raises(ValueError, match="n_actions"):
        C.staircase_types(3, 1, rng=rng)
    with pytest.raises(ValueError, match="spread"):
        C.staircase_types(3, 4, rng=rng, spread=1.5)


def test_adversarial_sweep_is_a_loop_of_run_trials():
    fams = [(0.5, 0.2), (None, 1.0)]
    sweep = C.adversarial_action_sweep([2, 6], fams, 20, 30, 40, np.random.default_rng(3))
    rng = np.random.default_rng(3)
    by_hand = []
    for k in (2, 6):
        for total, spread in fams:
            conc = 5.0 if total is None else total / (k - 1)
            pop = C.staircase_population(20, k, rng=rng, concentration=conc, spread=spread)
            by_hand.append(float(C.run_trials(pop, 30, 40, rng).sup_dev.mean()))
    np.testing.assert_allclose(sweep.dev.ravel(), by_hand)
    assert sweep.growth == pytest.approx(sweep.dev[1].max() / sweep.dev[0].max())


def test_delta_scaling_fits_one_constant():
    pop = C.random_population(30, 6, rng=np.random.default_rng(0))
    ds = C.delta_scaling(pop, [20, 80], [0.5, 0.1, 0.01], 300, np.random.default_rng(1))
    rng = np.random.default_rng(1)
    q = [np.quantile(C.run_trials(pop, n, 300, rng).sup_dev.numpy(), [0.5, 0.9, 0.99]) for n in (20, 80)]
    np.testing.assert_allclose(ds.q, q)
    x = np.sqrt(np.log(1 / np.array([0.5, 0.1, 0.01]))[None, :] / np.array([20, 80])[:, None])
    np.testing.assert_allclose(ds.x, x)
    assert np.log(ds.q / (ds.c * x)).mean() == pytest.approx(0, abs=1e-12)   # least squares in log space
    assert ds.max_rel_dev == pytest.approx(np.abs(ds.q / (ds.c * x) - 1).max())
    with pytest.raises(ValueError, match="deltas"):
        C.delta_scaling(pop, [20], [1.0], 10, rng)


def test_scaled_gap_and_its_growth():
    res = C.RateInN(Ns=np.array([25, 100, 400, 1600]), sup_mean=np.ones(4), sup_band=np.ones((4, 2)),
                    sub_mean=np.array([0.4, 0.1, 0.04, 0.02]), slope_sup=-0.5, slope_sub=-0.7, n_e2=np.ones(4),
                    violations=0, n_trials=4)
    np.testing.assert_allclose(res.scaled_gap, [2.0, 1.0, 0.8, 0.8])
    assert res.gap_growth == pytest.approx(0.8 / 2.0)     # upper half: N = 400, 1600


def test_alternating_control_is_not_monotone_and_its_sup_grows_with_k():
    rng = np.random.default_rng(5)
    pop = C.alternating_population(40, 6, rng=rng, spread=0.5)
    lv = pop.env.rewards
    assert set(lv.unique().tolist()) == {0.0, 1.0} and (lv[:, 1:] != lv[:, :-1]).all()  # flips at every switch
    assert (pop.env.breaks >= 0).all() and (pop.env.breaks < 0.5).all() and (pop.env.breaks.diff(dim=1) >= 0).all()
    # its mean reward is the population average, evaluated exactly like a contract population's
    alpha = torch.linspace(0, 1, 501, dtype=torch.float64)
    torch.testing.assert_close(pop.truth.reward_grid(alpha)[0], pop.env.reward(alpha[None, :]).mean(0))
    sweep = C.adversarial_action_sweep([2, 64], [(None, 0.1)], 100, 200, 100, np.random.default_rng(6),
                                       alternating=True)
    assert sweep.growth > 1.4  # without a monotone reward, more pieces give a larger sup (1.33 is already 64x)
    with pytest.raises(ValueError, match="n_actions"):
        C.alternating_population(3, 1, rng=rng)


def test_form_misfit_tells_a_log_tail_from_a_chebyshev_one():
    # S = sqrt(Exp(1)) has P(S > t) = exp(-t^2): its (1 - δ)-quantile is exactly sqrt(ln(1/δ))
    rng = np.random.default_rng(7)
    Ns, deltas = np.array([100, 400]), np.array([0.5, 0.2, 0.05, 0.01])
    trials = np.sqrt(rng.exponential(size=(200_000, 1))) / np.sqrt(Ns)[None, :]
    assert C.form_misfit(Ns, deltas, "log", trials) < 0.01
    assert C.form_misfit(Ns, deltas, "chebyshev", trials) > 0.4
    np.testing.assert_allclose(C.form_x(Ns, deltas, "chebyshev"), np.sqrt(1 / deltas[None, :] / Ns[:, None]))
    with pytest.raises(ValueError, match="form"):
        C.form_x(Ns, deltas, "linear")


def test_per_trial_statistics_by_hand():
    trials = np.array([[1.0, 2.0], [3.0, 2.0]])[:, :, None]            # (reps, k, population)
    assert C.flatness(trials) == pytest.approx(2.0 / 2.0)
    adv = np.zeros((2, 3, 2))
    adv[:, 0, :] = [[1.0, 2.0], [1.0, 2.0]]                             # k_min: worst family mean 2
    adv[:, 1, :] = [[3.0, 0.0], [1.0, 0.0]]                             # worst 2
    adv[:, 2, :] = [[0.0, 5.0], [0.0, 1.0]]                             # worst 3
    assert C.worst_growth(adv) == pytest.approx(1.5)
    hits = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])  # frequencies 0.5, 0
    assert C.two_point_misfit(np.array([0.5, 0.25]), hits) == pytest.approx(0.25 / (0.5 / 2))
    res = C.rate_in_n(C.random_population(30, 6, rng=np.random.default_rng(0)), [10, 40, 160], 60,
                      np.random.default_rng(1))
    est = res.estimates()
    assert est["slope"].value == pytest.approx(res.slope_sup) and est["gap_growth"].value == pytest.approx(
        res.gap_growth) and est["slope"].lo <= est["slope"].value <= est["slope"].hi
