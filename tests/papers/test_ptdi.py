"""repro.papers.ptdi against independent references: brute-force counting for conformal p-values, their exact
law by simulation, statsmodels' fdr_bh for BH, scipy's exact binomial interval for the Beta boundary, the classic
jackknife identities, hand computations for Storey, FIR/power, Min-K% and zlib, and global-null simulations."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
from scipy import stats
from statsmodels.stats.multitest import multipletests

from repro.papers import ptdi as P

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- conformal p-values ----------------------------------------------------------------------------------------

def brute_pvalues(cal: np.ndarray, test: np.ndarray) -> np.ndarray:
    """(1 + #{c ≥ z}) / (n + 1) by explicit comparison of every pair."""
    return (1 + (cal[..., None, :] >= test[..., :, None]).sum(-1)) / (cal.shape[-1] + 1)


@pytest.mark.parametrize("device", DEVICES)
def test_pvalues_match_brute_force_with_ties_and_batches(rng, device):
    cal = rng.integers(0, 6, size=(4, 30)).astype(float)  # many ties on purpose
    test = rng.integers(-1, 8, size=(4, 25)).astype(float)
    got = P.conformal_pvalues(cal, test, device=device).cpu().numpy()
    np.testing.assert_allclose(got, brute_pvalues(cal, test), rtol=0, atol=1e-15)
    # a loss (lower = member-like): flipping the orientation is the same as negating the scores
    flip = P.conformal_pvalues(cal, test, higher_is_member=False, device=device).cpu().numpy()
    np.testing.assert_allclose(flip, brute_pvalues(-cal, -test), rtol=0, atol=1e-15)
    # one calibration set shared by every row
    shared = P.conformal_pvalues(cal[0], test, device=device).cpu().numpy()
    np.testing.assert_allclose(shared, brute_pvalues(np.broadcast_to(cal[0], (4, 30)), test), atol=1e-15)


def test_null_pvalues_are_uniform_on_the_grid():
    # exchangeable non-members, continuous scores: p is exactly uniform on {1/(n+1), ..., 1}
    n, reps = 9, 40_000
    g = gen(1)
    cal, test = torch.randn(reps, n, generator=g), torch.randn(reps, 1, generator=g)
    p = P.conformal_pvalues(cal, test)[:, 0]
    counts = torch.bincount(torch.round(p * (n + 1)).long(), minlength=n + 2)[1:].numpy()
    assert counts.sum() == reps
    assert stats.chisquare(counts).pvalue > 1e-3
    # super-uniform: P(p ≤ t) ≤ t for every t (within sampling error)
    t = np.linspace(0.01, 1, 100)
    cdf = (p.numpy()[:, None] <= t).mean(0)
    assert (cdf <= t + 3 * np.sqrt(t * (1 - t) / reps) + 1e-12).all()


def test_ties_keep_super_uniformity_and_random_tie_breaking_is_exactly_uniform():
    n, reps = 19, 40_000
    g = gen(2)
    cal = torch.randint(0, 4, (reps, n), generator=g).double()  # heavily discretised scores
    test = torch.randint(0, 4, (reps, 1), generator=g).double()
    det = P.conformal_pvalues(cal, test)[:, 0].numpy()
    t = np.linspace(0.01, 0.99, 99)
    assert ((det[:, None] <= t).mean(0) <= t + 3 * np.sqrt(t * (1 - t) / reps)).all()
    rnd = P.conformal_pvalues(cal, test, rng=gen(3))[:, 0].numpy()
    assert stats.kstest(rnd, "uniform").pvalue > 1e-3
    assert (rnd <= det + 1e-12).all()  # random tie-breaking only lowers p within the tie


# --- BH, Storey, scaled BH -------------------------------------------------------------------------------------

def random_pvalues(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform nulls mixed with small (signal) p-values, some rounded to create exact ties."""
    u = rng.uniform(size=shape)
    sig = rng.beta(0.2, 4.0, size=shape)
    p = np.where(rng.uniform(size=shape) < 0.4, sig, u)
    return np.where(rng.uniform(size=shape) < 0.3, np.round(p, 2), p)


@pytest.mark.parametrize("alpha", [0.01, 0.05, 0.1, 0.2, 0.5])
def test_bh_matches_statsmodels_fdr_bh(rng, alpha):
    for m in (1, 2, 7, 100, 1000):
        p = random_pvalues(rng, (20, m))
        ours = P.bh_select(torch.as_tensor(p), alpha).numpy()
        ref = np.stack([multipletests(row, alpha=alpha, method="fdr_bh")[0] for row in p])
        assert np.array_equal(ours, ref)


def test_bh_on_conformal_pvalues_matches_statsmodels(rng):
    cal, test = rng.normal(size=(10, 200)), rng.normal(size=(10, 300)) + 2.0 * (rng.uniform(size=(10, 300)) < 0.4)
    p = P.conformal_pvalues(cal, test)  # rational grid values: exact ties with α k / m are possible
    for alpha in (0.05, 0.1, 0.2):
        ref = np.stack([multipletests(row, alpha=alpha, method="fdr_bh")[0] for row in p.numpy()])
        assert np.array_equal(P.bh_select(p, alpha).numpy(), ref)


def test_scaled_bh_is_bh_at_level_alpha_over_pi0(rng):
    p = torch.as_tensor(random_pvalues(rng, (30, 400)))
    for alpha in (0.05, 0.1):
        pi0 = P.jkbb_pi0(p).clamp(min=0.3)  # α / π̂₀ stays below 1 so statsmodels accepts it
        ours = P.scaled_bh(p, pi0, alpha).numpy()
        ref = np.stack([multipletests(row, alpha=alpha / float(q), method="fdr_bh")[0]
                        for row, q in zip(p.numpy(), pi0, strict=True)])
        assert np.array_equal(ours, ref)


def test_ptdi_select_is_bh_on_scaled_conformal_pvalues(rng):
    cal = rng.normal(size=(5, 300))
    test = rng.normal(size=(5, 200)) + 2.5 * (np.arange(200) < 100)
    for method in ("jkbb", "storey", "bh", 0.5):
        sel = P.ptdi_select(cal, test, 0.1, pi0_method=method).numpy()
        p = P.conformal_pvalues(cal, test)
        pi0 = P.estimate_pi0(p, method).numpy()
        ref = np.stack([multipletests(q * row, alpha=0.1, method="fdr_bh")[0]
                        for row, q in zip(p.numpy(), pi0, strict=True)])
        assert np.array_equal(sel, ref)


def test_storey_by_hand():
    p = torch.tensor([0.1, 0.6, 0.7, 0.2, 0.9, 0.55])
    assert float(P.storey_pi0(p, 0.5)) == 1.0  # (1 + 4) / (6 · 0.5) = 5/3, clipped
    q = torch.tensor([0.01 * i for i in range(1, 17)] + [0.6, 0.7, 0.85, 0.95], dtype=torch.float64)
    assert float(P.storey_pi0(q, 0.5)) == pytest.approx((1 + 4) / (20 * 0.5))
    assert float(P.storey_pi0(q, 0.8)) == pytest.approx((1 + 2) / (20 * 0.2))
    assert float(P.storey_pi0(q, 0.9)) == pytest.approx((1 + 1) / (20 * 0.1))
    batch = P.storey_pi0(torch.stack([q, q.flip(0)]), 0.5)
    assert torch.allclose(batch, torch.full((2,), 0.5, dtype=torch.float64))


# --- the Beta boundary and the jackknife (JKBB reconstruction) --------------------------------------------------

def test_beta_boundary_is_the_exact_clopper_pearson_bound(rng):
    lams, delta = (0.5, 0.7, 0.9), 0.1
    for m in (5, 40, 333):
        p = random_pvalues(rng, (m,))
        want = min(stats.binomtest(int((p > lam).sum()), m).proportion_ci(
            confidence_level=1 - 2 * delta / len(lams), method="exact").high / (1 - lam) for lam in lams)
        got = float(P.beta_boundary_pi0(torch.as_tensor(p), delta, lams))
        assert got == pytest.approx(want, rel=1e-9)


def test_jackknife_identities():
    x = torch.rand(3, 17, generator=gen(4), dtype=torch.float64)
    # a linear statistic is its own jackknife; the plug-in variance jackknifes to the unbiased variance
    assert torch.allclose(P.jackknife_correct(lambda q: q.mean(-1), x), x.mean(-1))
    plug_in = lambda q: ((q - q.mean(-1, keepdim=True)) ** 2).mean(-1)  # noqa: E731
    assert torch.allclose(P.jackknife_correct(plug_in, x), x.var(-1, unbiased=True))


def test_jkbb_shortcut_equals_the_generic_jackknife(rng):
    lams, delta = P.DEFAULT_LAMS, 0.1
    for m in (2, 3, 10, 60, 150):
        p = torch.as_tensor(random_pvalues(rng, (4, m)))
        per_lambda = torch.stack([
            P.jackknife_correct(lambda q, lam=lam: P.beta_boundary_pi0(q, delta / len(lams), (lam,)), p)
            for lam in lams], dim=-1)
        want = per_lambda.amin(-1).clamp(0, 1)
        assert torch.allclose(P.jkbb_pi0(p, delta, lams), want, atol=1e-10)


def test_jkbb_is_monotone_and_a_proportion(rng):
    for _ in range(400):
        m = int(rng.integers(2, 300))
        p = random_pvalues(rng, (m,))
        q = p.copy()
        j = rng.choice(m, size=int(rng.integers(1, m + 1)), replace=False)
        q[j] = rng.uniform(p[j], 1.0)  # raise some p-values
        a, b = float(P.jkbb_pi0(torch.as_tensor(p))), float(P.jkbb_pi0(torch.as_tensor(q)))
        assert 0.0 <= a <= 1.0 and 0.0 <= b <= 1.0
        assert b >= a - 1e-12


def test_jkbb_is_conservative_on_average():
    cal, test, mem = P.draw_scores("gaussian", 0.3, 300, 1000, 1000, gen(5))
    pi0 = P.jkbb_pi0(P.conformal_pvalues(cal, test))
    assert float(pi0.mean()) >= 0.7 - 0.01


@pytest.mark.parametrize("method", ["jkbb", "storey", "bh"])
def test_global_null_fir_is_at_most_alpha(method):
    # π₁ = 0: every selection is false, so FIR = P(any selection) must be ≤ α (within 3 standard errors)
    alpha, trials = 0.1, 500
    cal, test, mem = P.draw_scores("student-t3", 0.0, trials, 200, 200, gen(6))
    fdp, _ = P.fir_power(P.ptdi_select(cal, test, alpha, pi0_method=method), mem)
    se = math.sqrt(alpha * (1 - alpha) / trials)
    assert float(fdp.mean()) <= alpha + 3 * se


def test_fir_control_with_members_by_simulation():
    alpha = 0.1
    cal, test, mem = P.draw_scores("gaussian", 0.5, 400, 300, 300, gen(7))
    fdp, power = P.fir_power(P.ptdi_select(cal, test, alpha), mem)
    assert float(fdp.mean()) <= alpha + 3 * float(fdp.std()) / math.sqrt(400)
    bh_power = P.fir_power(P.ptdi_select(cal, test, alpha, pi0_method="bh"), mem)[1]
    assert (power >= bh_power).all()  # π̂₀ ≤ 1: BH at α/π̂₀ selects a superset of BH at α


# --- metrics and scores ----------------------------------------------------------------------------------------

def test_fir_power_by_hand():
    sel = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    mem = torch.tensor([[1, 0, 1, 1, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    fdp, power = P.fir_power(sel, mem)
    assert fdp.tolist() == [pytest.approx(1 / 3), 0.0]
    assert power.tolist() == [pytest.approx(2 / 3), 0.0]


def test_min_k_prob_by_hand():
    lp = np.array([[-0.1, -2.0, -0.5, -3.0, -0.2], [-1.0, -1.0, -1.0, -1.0, -1.0]])
    assert np.allclose(P.min_k_prob(lp, 0.4).numpy(), [(-3.0 - 2.0) / 2, -1.0])
    assert np.allclose(P.min_k_prob(lp, 0.2).numpy(), [-3.0, -1.0])
    assert np.allclose(P.min_k_prob(lp, 1.0).numpy(), lp.mean(1))
    assert np.allclose(P.min_k_prob(lp, 0.3).numpy(), [-2.5, -1.0])  # ⌈0.3 · 5⌉ = 2 tokens


def test_zlib_ratio_by_hand():
    texts = ["the the the the the the", "a quick brown fox jumps over the lazy dog"]
    lp = torch.tensor([-12.0, -80.0], dtype=torch.float64)
    want = [lp[i].item() / len(zlib.compress(t.encode("utf-8"))) for i, t in enumerate(texts)]
    assert np.allclose(P.zlib_ratio(texts, lp).numpy(), want)
    assert float(P.zlib_ratio(texts[0], -12.0)) == pytest.approx(want[0])


# --- problems --------------------------------------------------------------------------------------------------

def test_score_laws():
    cal, test, mem = P.draw_scores("student-t3", 0.3, 4, 1000, 50, gen(8))
    assert cal.shape == (4, 50) and test.shape == (4, 1000) and int(mem[0].sum()) == 300
    z = P.score_law("student-t3").sample((20_000,), gen(9)).numpy()
    assert stats.kstest(z, stats.t(3).cdf).pvalue > 1e-3
    g = P.score_law("gaussian").sample((20_000,), gen(10)).numpy()
    assert stats.kstest(g, "norm").pvalue > 1e-3
    shift = (test[:, :300].mean() - test[:, 300:].mean()).item()
    assert shift == pytest.approx(2 * math.sqrt(3), abs=0.3)


def test_resampling_keeps_calibration_and_test_disjoint():
    member = torch.arange(100, dtype=torch.float64)
    nonmember = 1000 + torch.arange(300, dtype=torch.float64)
    cal, test, mem = P.resample_membership(member, nonmember, 0.25, 80, 150, 5, gen(11))
    for r in range(5):
        used = torch.cat([cal[r], test[r]])
        assert used.unique().numel() == 230  # no point used twice
        assert (test[r][mem[r]] < 1000).all() and (test[r][~mem[r]] >= 1000).all()
    with pytest.raises(ValueError, match="pools too small"):
        P.resample_membership(member, nonmember, 0.5, 300, 250, 1, gen(12))


def test_digits_pipeline_smoke():
    torch.manual_seed(0)
    s = P.digits_membership(gen(13), width=32, steps=80, lr=1e-2, member_share=0.2)
    assert s.member.numel() == 359 and s.nonmember.numel() == 1797 - 359
    assert (s.member <= 0).all() and (s.nonmember <= 0).all()  # minus a cross-entropy
    assert s.train_acc > 0.8 and 0.0 <= P.auc(s.member, s.nonmember) <= 1.0


def test_auc_by_hand():
    assert P.auc(torch.tensor([3.0, 1.0]), torch.tensor([2.0, 1.0])) == pytest.approx((1 + 1 + 0 + 0.5) / 4)


# --- devices and bad input -------------------------------------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    cal, test, mem = P.draw_scores("gaussian", 0.4, 8, 500, 400, gen(14))
    for method in ("jkbb", "storey"):
        cpu = P.ptdi_select(cal, test, 0.1, pi0_method=method)
        cuda = P.ptdi_select(cal.cuda(), test.cuda(), 0.1, pi0_method=method)
        assert cuda.is_cuda and torch.equal(cpu, cuda.cpu())


def test_bad_input_raises_clear_errors():
    cal, test = np.zeros(10), np.ones(5)
    with pytest.raises(ValueError, match="calibration set is empty"):
        P.conformal_pvalues(np.zeros(0), test)
    with pytest.raises(ValueError, match="NaN"):
        P.conformal_pvalues(np.array([0.0, np.nan]), test)
    with pytest.raises(ValueError, match="NaN"):
        P.ptdi_select(cal, np.array([1.0, np.nan]), 0.1)
    for alpha in (0.0, 1.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="alpha"):
            P.ptdi_select(cal, test, alpha)
        with pytest.raises(ValueError, match="alpha"):
            P.bh_select(torch.rand(5), alpha)
    with pytest.raises(ValueError, match="batch"):
        P.conformal_pvalues(np.zeros((2, 10)), np.zeros((3, 5)))
    with pytest.raises(ValueError, match="at least one p-value"):
        P.bh_select(torch.zeros(0), 0.1)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        P.storey_pi0(torch.tensor([0.5, 1.2]))
    with pytest.raises(ValueError, match="delta"):
        P.jkbb_pi0(torch.rand(10), delta=1.0)
    with pytest.raises(ValueError, match="λ"):
        P.beta_boundary_pi0(torch.rand(10), lams=(0.5, 1.0))
    with pytest.raises(ValueError, match="increasing"):
        P.jkbb_pi0(torch.rand(10), lams=(0.7, 0.5))
    with pytest.raises(ValueError, match="two p-values"):
        P.jkbb_pi0(torch.rand(1))
    with pytest.raises(ValueError, match="pi0_method"):
        P.ptdi_select(cal, test, 0.1, pi0_method="magic")
    with pytest.raises(ValueError, match="shape"):
        P.fir_power(torch.zeros(3, dtype=torch.bool), torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="k must"):
        P.min_k_prob(torch.zeros(2, 5), 0.0)
    with pytest.raises(ValueError, match="one log-likelihood per text"):
        P.zlib_ratio(["a", "b"], torch.zeros(3))
    with pytest.raises(ValueError, match="unknown score law"):
        P.draw_scores("cauchy", 0.1, 1, 10, 10, gen())
