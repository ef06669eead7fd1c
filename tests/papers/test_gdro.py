"""repro.papers.gdro against independent references: scipy.optimize for the entropic-GDRO maximiser and the
square-root allocation, brute-force enumeration for the arm-selection DP and pass@k, explicit loops for the GRPO
advantages, hand-built sequences for the EMA debiasing and the hysteresis of the difficulty bins, and hand-worked
cases for the sigma-variant (the two-bin square-root plan, the learning rule at pi = 1/2, exact sigma at a fixed pass
rate) and the size-only control of Prompt-GDRO."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from repro.papers import gdro as G


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20260127)


# ------------------------------------------------------------------------------------------- GRPO


def test_advantages_match_a_loop_and_sum_to_zero_per_group(rng):
    sizes = rng.integers(1, 9, size=30)
    gid = np.repeat(np.arange(30), sizes)
    r = rng.integers(0, 2, size=gid.size).astype(float)
    r[gid == 3] = 1.0  # an all-equal group
    got = G.grpo_advantages(torch.tensor(r), torch.tensor(gid)).numpy()
    for g in range(30):
        x = r[gid == g]
        want = (x - x.mean()) / (x.std() + 1e-6)  # population std, as verl
        np.testing.assert_allclose(got[gid == g], want, rtol=0, atol=1e-12)
        assert abs(got[gid == g].sum()) < 1e-9
    assert np.all(got[gid == 3] == 0)


def test_ratio_one_grpo_surrogate_is_zero_per_prompt(rng):
    # the degeneracy that forces the 1 - mean-reward signal: sum_j A_ij * 1 = 0 for every prompt
    gid = torch.arange(50).repeat_interleave(4)
    r = torch.tensor(rng.integers(0, 2, size=200), dtype=torch.float64)
    a = G.grpo_advantages(r, gid)
    per_prompt = torch.zeros(50, dtype=torch.float64).index_add_(0, gid, a)
    assert per_prompt.abs().max() < 1e-9


def test_advantages_reject_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        G.grpo_advantages(torch.tensor([0.0, math.nan]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="equal-length"):
        G.grpo_advantages(torch.tensor([0.0, 1.0]), torch.tensor([0]))
    with pytest.raises(ValueError, match="empty"):
        G.grpo_advantages(torch.tensor([]), torch.tensor([], dtype=torch.long))


# ------------------------------------------------------------------------------------------ theory


def _budget_min(q: np.ndarray, v: np.ndarray, n_bar: float, lo: float, hi: float | None):
    """scipy SLSQP minimum of the variance proxy sum q v / n subject to sum q n = n_bar and lo <= n <= hi."""
    return minimize(lambda x: (q * v / x).sum(), np.full(q.size, n_bar), jac=lambda x: -q * v / x**2,
                    method="SLSQP", bounds=[(lo, hi)] * q.size, options={"ftol": 1e-15, "maxiter": 1000},
                    constraints=[{"type": "eq", "fun": lambda x: (q * x).sum() - n_bar, "jac": lambda x: q}])


def _simplex_max(objective, n: int) -> tuple[np.ndarray, float]:
    """scipy SLSQP maximum of ``objective`` over the probability simplex."""
    res = minimize(lambda q: -objective(q), np.full(n, 1.0 / n), method="SLSQP", bounds=[(1e-12, 1.0)] * n,
                   constraints=[{"type": "eq", "fun": lambda q: q.sum() - 1.0}],
                   options={"ftol": 1e-15, "maxiter": 500})
    return res.x, -res.fun


@pytest.mark.parametrize("eta", [0.3, 0.65, 2.0])
def test_entropic_gdro_maximiser_matches_scipy(rng, eta):
    for _ in range(5):
        L = rng.uniform(-1, 2, size=int(rng.integers(2, 8)))
        value, q = G.entropic_gdro(torch.tensor(L), eta)
        q_ref, v_ref = _simplex_max(lambda p, L=L: p @ L - (p * np.log(p)).sum() / eta, L.size)
        assert abs(float(value) - v_ref) < 1e-6
        np.testing.assert_allclose(q.numpy(), q_ref, atol=1e-5)
        # Lemma 4.1 bounds
        assert L.max() - 1e-12 <= float(value) <= L.max() + math.log(L.size) / eta + 1e-12


def test_sqrt_allocation_matches_slsqp_and_meets_the_budget(rng):
    for _ in range(10):
        B = int(rng.integers(2, 8))
        q = rng.dirichlet(np.ones(B))
        v = rng.uniform(0.01, 0.25, size=B)
        n = G.sqrt_allocation(torch.tensor(q), torch.tensor(v), 4.0).numpy()
        assert abs((q * n).sum() - 4.0) < 1e-12  # exact budget
        res = _budget_min(q, v, 4.0, 1e-6, None)
        np.testing.assert_allclose(n, res.x, rtol=1e-5)
        assert (q * v / n).sum() <= res.fun + 1e-12
        assert (q * v / n).sum() <= (q * v / 4.0).sum() + 1e-12  # never worse than uniform


def test_shadow_price_equals_sqrt_rule_and_handles_bounds(rng):
    for _ in range(10):
        B = int(rng.integers(2, 8))
        q = torch.tensor(rng.dirichlet(np.ones(B)))
        v = torch.tensor(rng.uniform(0.001, 0.25, size=B))
        n_free, mu = G.shadow_price_allocation(q, v, 4.0)
        torch.testing.assert_close(n_free, G.sqrt_allocation(q, v, 4.0), rtol=1e-8, atol=1e-8)
        torch.testing.assert_close(n_free, (v / mu).sqrt(), rtol=1e-8, atol=1e-8)
        n_box, _ = G.shadow_price_allocation(q, v, 4.0, 2.0, 12.0)
        res = _budget_min(q.numpy(), v.numpy(), 4.0, 2.0, 12.0)
        assert abs(float((q * n_box).sum()) - 4.0) < 1e-8
        assert float((q * v / n_box).sum()) <= res.fun + 1e-9
        np.testing.assert_allclose(n_box.numpy(), res.x, atol=2e-3)


def test_wse_by_hand():
    q, s, n = torch.tensor([0.5, 0.5]), torch.tensor([0.4, 0.2]), torch.tensor([4.0, 16.0])
    assert abs(float(G.wse(q, s, n)) - (0.5 * 0.4 / 2 + 0.5 * 0.2 / 4)) < 1e-7
    with pytest.raises(ValueError, match="positive"):
        G.wse(q, s, torch.tensor([0.0, 1.0]))


def test_theory_rejects_bad_input():
    with pytest.raises(ValueError, match="eta"):
        G.entropic_gdro(torch.tensor([1.0, 2.0]), 0.0)
    with pytest.raises(ValueError, match="zero variance"):
        G.sqrt_allocation(torch.tensor([0.5, 0.5]), torch.tensor([0.0, 0.0]), 4.0)
    with pytest.raises(ValueError, match="NaN"):
        G.sqrt_allocation(torch.tensor([0.5, 0.5]), torch.tensor([math.nan, 0.1]), 4.0)


# --------------------------------------------------------------------------------------------- DP


def _brute(counts, arms, util, budget):
    live = [b for b in range(len(counts)) if counts[b] > 0]
    best = {}
    for combo in itertools.product(range(len(arms)), repeat=len(live)):
        s = sum(counts[b] * arms[k] for b, k in zip(live, combo, strict=True))
        u = sum(util[b, k] for b, k in zip(live, combo, strict=True))
        if s not in best or u > best[s][0]:
            best[s] = (u, combo)
    return best


@pytest.mark.parametrize("arms", [tuple(range(2, 13)), (2, 6, 10)])
def test_dp_matches_brute_force(rng, arms):
    for _ in range(15):
        B = int(rng.integers(1, 5))
        counts = rng.integers(0, 12, size=B)
        counts[rng.integers(B)] += 1
        util = rng.normal(size=(B, len(arms)))
        budget = 4 * int(counts.sum())
        idx, total = G.allocate_arms(torch.tensor(counts), arms, torch.tensor(util), budget)
        best = _brute(counts, arms, util, budget)
        if budget in best:
            assert total == budget
        else:
            dist = min(abs(s - budget) for s in best)
            assert abs(total - budget) == dist
        live = counts > 0
        assert (idx.numpy()[~live] == -1).all()
        assert sum(counts[b] * arms[idx[b]] for b in np.nonzero(live)[0]) == total
        u = sum(util[b, idx[b]] for b in np.nonzero(live)[0])
        assert abs(u - best[total][0]) < 1e-9  # optimal utility at that total


def test_dp_direction_picks_the_side_when_the_budget_is_unreachable():
    counts = torch.tensor([20, 12])  # with arms {2, 6, 10} no split gives 4 * 32 = 128
    util = torch.zeros(2, 3)
    _, below = G.allocate_arms(counts, (2, 6, 10), util, 128, direction=-1)
    _, above = G.allocate_arms(counts, (2, 6, 10), util, 128, direction=1)
    assert below < 128 < above
    best = _brute([20, 12], (2, 6, 10), np.zeros((2, 3)), 128)
    assert below == max(s for s in best if s < 128) and above == min(s for s in best if s > 128)


def test_dp_rejects_bad_input():
    with pytest.raises(ValueError, match="shape"):
        G.allocate_arms(torch.tensor([1, 2]), (2, 4), torch.zeros(3, 2), 8)
    with pytest.raises(ValueError, match="at least one"):
        G.allocate_arms(torch.tensor([0, 0]), (2, 4), torch.zeros(2, 2), 8)


# ------------------------------------------------------------------------------------ adversaries


def test_ema_score_is_free_of_presence_frequency_bias():
    # bin 0 present every step, bin 1 every other step, same loss 0.5: the EMA scores agree, the repo's
    # un-debiased cumulative score favours the frequent bin
    ema, cum = G.PromptGDRO(2), G.PromptGDRO(2, score="cumulative", clip=1e9)
    for t in range(40):
        bins = torch.tensor([0, 0, 1, 1]) if t % 2 == 0 else torch.tensor([0, 0, 0, 0])
        for c in (ema, cum):
            c.update(bins, torch.full((4,), 0.5))
    q_ema, q_cum = ema.q(), cum.q()
    assert abs(float(q_ema[0] - q_ema[1])) < 1e-12
    assert float(q_cum[0]) > 0.99


def test_ema_weights_invariant_to_duplicating_a_bins_prompts():
    a, b = G.PromptGDRO(3), G.PromptGDRO(3)
    bins = torch.tensor([0, 1, 2, 2])
    loss = torch.tensor([0.9, 0.4, 0.1, 0.1])
    for _ in range(10):
        a.update(bins, loss)
        b.update(torch.cat([bins, torch.tensor([0, 0, 0])]), torch.cat([loss, torch.tensor([0.9, 0.9, 0.9])]))
    torch.testing.assert_close(a.q(), b.q())
    # with share normalisation the duplication changes the score (the loss is divided by the batch share)
    c, d = G.PromptGDRO(3, norm_by_share=True), G.PromptGDRO(3, norm_by_share=True)
    c.update(bins, loss)
    d.update(torch.cat([bins, torch.tensor([0, 0, 0])]), torch.cat([loss, torch.tensor([0.9, 0.9, 0.9])]))
    assert not torch.allclose(c.q(), d.q())


def test_prompt_gdro_q_and_weights(rng):
    pg = G.PromptGDRO(7, gamma=0.05)
    for _ in range(5):
        b = torch.tensor(rng.integers(0, 7, size=32))
        pg.update(b, torch.tensor(rng.uniform(size=32)))
    present = torch.zeros(7, dtype=torch.bool)
    present[[0, 3, 5]] = True
    q = pg.q(present)
    assert abs(float(q.sum()) - 1) < 1e-12 and float(q[present].min()) >= 0.05 / 3 - 1e-12
    assert float(q[~present].abs().max()) == 0
    b = torch.tensor([0, 0, 3, 5, 5, 5])
    w = pg.weights(b)
    qq = pg.q(present)[b]
    torch.testing.assert_close(w, qq * 6 / qq.sum())  # mean 1
    # softmax order follows the scores
    assert (torch.argsort(pg.score[present]) == torch.argsort(q[present])).all()
    capped = G.PromptGDRO(2, w_max=1.2, eta=10.0)
    capped.update(torch.tensor([0, 1, 1, 1]), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert float(capped.weights(torch.tensor([0, 1, 1, 1])).max()) <= 1.2


def test_rollout_gdro_budget_credit_and_dual():
    rg = G.RolloutGDRO(3, arms=range(2, 13), n_bar=4, dual_lr=0.5)
    counts = torch.tensor([5, 0, 27])
    n = rg.choose(counts)
    assert int((counts * n).sum()) == 4 * 32 and int(n[1]) == 0
    before = rg.scores.clone()
    realised = rg.update(torch.tensor([0.8, math.nan, 0.1], dtype=torch.float64))
    assert realised == 4.0 and rg.mu == 0.0
    changed = (rg.scores != before).nonzero().tolist()
    arms = list(rg.arms)
    assert changed == [[0, arms.index(int(n[0]))], [2, arms.index(int(n[2]))]]  # only the chosen arms
    assert abs(float(rg.scores[0, arms.index(int(n[0]))]) - 0.8) < 1e-12  # score += loss (mu = 0)
    # an unreachable budget: the dual price moves with the realised overspend and flips the rounding side
    coarse = G.RolloutGDRO(2, arms=(2, 6, 10), n_bar=4, dual_lr=0.05)
    dev = []
    for _ in range(200):
        coarse.choose(torch.tensor([20, 12]))
        dev.append(coarse.update(torch.tensor([0.5, 0.5])) - 4)
    assert min(dev) < 0 < max(dev)
    assert abs(np.mean(dev)) < 0.05
    with pytest.raises(ValueError, match="outside"):
        G.RolloutGDRO(3, arms=(2, 3), n_bar=4)


def test_hysteresis_blocks_oscillation_and_allows_real_moves():
    bins = G.OnlineDifficultyBins(1, edges=(0.4, 0.75), history=1, hysteresis=0.03)
    uid = torch.tensor([0])
    seen = []
    for t in range(20):
        bins.update(uid, torch.tensor([0.39 if t % 2 == 0 else 0.41]))
        seen.append(int(bins.bins(uid)))
    assert len(set(seen)) == 1 and seen[0] == 0
    bins.update(uid, torch.tensor([0.45]))  # beyond the edge by more than delta
    assert int(bins.bins(uid)) == 1
    bins.update(uid, torch.tensor([0.38]))  # 0.02 below the edge: stays
    assert int(bins.bins(uid)) == 1
    bins.update(uid, torch.tensor([0.36]))
    assert int(bins.bins(uid)) == 0
    bins.update(uid, torch.tensor([0.95]))  # a jump over two bins
    assert int(bins.bins(uid)) == 2
    free = G.OnlineDifficultyBins(1, edges=(0.4, 0.75), history=1, hysteresis=0.0)
    flips = []
    for t in range(6):
        free.update(uid, torch.tensor([0.39 if t % 2 == 0 else 0.41]))
        flips.append(int(free.bins(uid)))
    assert flips == [0, 1, 0, 1, 0, 1]


def test_bins_window_unseen_and_validation():
    bins = G.OnlineDifficultyBins(3, edges=(0.1, 0.2, 0.4, 0.6, 0.8, 0.9), history=4)
    assert bins.num_bins == 7
    uid = torch.tensor([0, 1])
    for v in (1.0, 1.0, 0.0, 0.0, 0.0):  # the window keeps the last 4
        bins.update(uid, torch.tensor([v, 1.0]))
    torch.testing.assert_close(bins.accuracy(torch.tensor([0, 1, 2])), torch.tensor([0.25, 1.0, 0.0],
                                                                                 dtype=torch.float64))
    assert bins.bins(torch.tensor([0, 1, 2])).tolist() == [2, 6, 0]  # unseen -> hardest bin (repo)
    with pytest.raises(ValueError, match="inside"):
        G.OnlineDifficultyBins(3, edges=(0.0, 0.5))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        bins.update(torch.tensor([0]), torch.tensor([1.5]))


# ------------------------------------------------------------------------------------ task, pass@k


def test_pass_at_k_matches_enumeration():
    for m, k in ((8, 8), (16, 8), (10, 3), (5, 1)):
        for c in range(m + 1):
            subsets = list(itertools.combinations(range(m), k))
            want = sum(any(i < c for i in s) for s in subsets) / len(subsets)
            got = float(G.pass_at_k(torch.tensor([c]), m, k)[0])
            assert abs(got - want) < 1e-12


def test_task_chains_and_rewards():
    task = G.ModSumTask()
    gen = torch.Generator().manual_seed(0)
    pr = task.per_k(20, gen)
    tok = pr.tokens.numpy()
    for i in range(len(pr)):
        k = int(pr.k[i])
        digits = tok[i, :k]
        assert (tok[i, k:task.k_max] == task.pad).all() and tok[i, task.k_max] == task.eq
        np.testing.assert_array_equal(pr.partial[i, :k].numpy(), np.cumsum(digits) % task.p)
        assert int(pr.answer[i]) == digits.sum() % task.p
    assert task.rewards(pr.k, pr.answer, pr.partial).eq(1).all()
    wrong = pr.partial.clone()
    wrong[torch.arange(len(pr)), pr.k - 1] = (pr.answer + 1) % task.p
    assert task.rewards(pr.k, pr.answer, wrong).eq(0).all()
    with pytest.raises(ValueError, match="1..6"):
        task.make(torch.tensor([7]), gen)
    with pytest.raises(ValueError, match="sum to 1"):
        G.ModSumTask(k_probs=(0.5, 0.2))


def test_grpo_loop_smoke_every_arm():
    task = G.ModSumTask()
    setup = G.prepare(task, 0, sft_steps=3, sft_batch=16, sft_lr=3e-3, sft_probs=None, label_smoothing=0.1,
                      d_model=16, n_layers=1, n_heads=2, pool_size=24, eval_per_k=2, final_per_k=3, eval_samples=8)
    cfg = G.GRPOConfig(steps=6, batch=8, eval_every=3, eval_samples=8, final_samples=8, sigma_every=1,
                       sigma_samples=4)
    runs = G.run_arms(setup, task, cfg)
    for log in runs.values():
        assert log.warmup == 3 and log.eval_steps == [0, 3, 6]
        assert np.all(log.counts.sum(1) == 8)
        np.testing.assert_array_equal((log.counts * log.n_bins).sum(1), 32)  # exact budget every step
        np.testing.assert_allclose(np.nansum(log.mass[3:], 1), 1.0, rtol=1e-5)
        assert np.isfinite(log.loss).all() and len(log.final.k) == 18 and len(log.evals[1].k) == 12
    assert runs["grpo"].evals[0] is runs["prompt"].evals[0] is setup.initial  # the shared step-0 evaluation
    assert np.isfinite(runs["prompt"].q[3:]).any() and np.isnan(runs["grpo"].q).all()
    assert np.isfinite(runs["rollout"].true_sigma[3:]).any()
    shadows = runs["prompt"].shadow_mass
    assert set(shadows) == {"unnormalised", G.SIZE_ONLY}
    for m in shadows.values():
        np.testing.assert_allclose(np.nansum(m[3:], 1), 1.0, rtol=1e-5)
    assert G.hardest_bin_mass_ratio(runs["prompt"], G.SIZE_ONLY).shape == (3,)
    assert G.per_seed([runs], "grpo", "pass1").tolist() == [runs["grpo"].final.overall["pass1"]]


def test_size_only_shadow_upweights_the_rare_bin_whatever_its_loss():
    # the size-only control: share-normalised Prompt-GDRO fed the batch's mean loss favours the rarer bin, the same
    # controller fed the real losses (the rare bin is the easy one here) favours the hard bin less than that
    size_only, real = G.PromptGDRO(2, norm_by_share=True), G.PromptGDRO(2, norm_by_share=True)
    bins = torch.tensor([0] * 28 + [1] * 4)
    loss = torch.cat([torch.full((28,), 0.6), torch.full((4,), 0.1)])
    for _ in range(20):
        size_only.update(bins, loss.mean().expand_as(loss))
        real.update(bins, loss)
    w_size, w_real = size_only.weights(bins), real.weights(bins)
    assert float(w_size[-1]) > float(w_size[0])  # rarity alone upweights bin 1
    assert float(w_real[-1] / w_real[0]) < float(w_size[-1] / w_size[0])


# ------------------------------------------------------------------------------ the sigma-variant


def test_pass_rate_pool_shares_and_validation():
    pool = G.PassRatePool(n=20000, solved=0.6, unsolved=0.2, frontier=(0.1, 0.9))
    pi = pool.sample(torch.Generator().manual_seed(0)).numpy()
    assert abs((pi == 1).mean() - 0.6) < 0.02 and abs((pi == 0).mean() - 0.2) < 0.02
    mid = pi[(pi > 0) & (pi < 1)]
    assert mid.min() >= 0.1 and mid.max() <= 0.9 and abs(mid.mean() - 0.5) < 0.02
    with pytest.raises(ValueError, match="sum"):
        G.PassRatePool(solved=0.8, unsolved=0.3)
    with pytest.raises(ValueError, match="frontier"):
        G.PassRatePool(frontier=(0.6, 0.4))


def test_neyman_plan_hand_worked_two_bins():
    # 24 prompts with sigma 0 and 8 with sigma 0.5, budget 4 * 32 = 128: the variance-free bin drops to the lowest
    # arm (2) and the other takes the rest, (128 - 48) / 8 = 10; WSE falls from 0.25 * 0.5 / 2 to 0.25 * 0.5 / sqrt(10)
    counts = np.array([24, 8])
    n = G.neyman_plan(counts, np.array([0.0, 0.5]), tuple(range(2, 13)), 4)
    assert n.tolist() == [2, 10]
    q = torch.tensor(counts / 32.0)
    sig = torch.tensor([0.0, 0.5], dtype=torch.float64)
    ratio = float(G.wse(q, sig, torch.tensor(n, dtype=torch.float64))) / \
        float(G.wse(q, sig, torch.full((2,), 4.0, dtype=torch.float64)))
    assert abs(ratio - 2 / math.sqrt(10)) < 1e-12
    # equal sigma everywhere: the square-root rule is uniform
    assert G.neyman_plan(np.array([5, 20, 7]), np.full(3, 0.3), tuple(range(2, 13)), 4).tolist() == [4, 4, 4]


def test_allocation_stream_budget_and_warmup():
    cfg = G.GRPOConfig(batch=8)
    pool = G.PassRatePool(n=32, solved=0.25, unsolved=0.25)
    log = G.allocation_stream(pool, cfg, seed=3, steps=40, kappa=0.2)
    assert log.warmup == 4 and np.all(log.counts.sum(1) == 8)
    np.testing.assert_array_equal((log.counts * log.n_bins).sum(1), 32)  # exact budget every step
    np.testing.assert_array_equal(log.n_bins[:4][log.counts[:4] > 0], 4)  # uniform during the warm-up
    assert np.isnan(log.true_sigma[:4]).all() and np.isfinite(log.true_sigma[4:]).any(axis=1).all()
    assert log.pass_rate[-1] >= log.pass_rate[0]  # the frontier only rises
    with pytest.raises(ValueError, match="warm-up"):
        G.allocation_stream(pool, cfg, seed=0, steps=4)


def test_allocation_stream_learning_rule_by_hand():
    # a frontier-only pool at pi = 1/2: in the warm-up epoch every prompt is visited once with 4 rollouts, and a
    # prompt moves to sigmoid(kappa) exactly when its group is mixed (probability 1 - 2 / 2^4 = 7/8)
    cfg, kappa = G.GRPOConfig(batch=16), 0.3
    pool = G.PassRatePool(n=256, solved=0.0, unsolved=0.0, frontier=(0.5, 0.5))
    log = G.allocation_stream(pool, cfg, seed=5, steps=17, kappa=kappa)
    raised = (log.pass_rate[16] - 0.5) * 256 / (1 / (1 + math.exp(-kappa)) - 0.5)
    assert abs(raised - round(raised)) < 1e-6 and abs(raised / 256 - 7 / 8) < 0.08
    # solved and unsolved prompts never move and have no variance: nothing to score against uniform
    still = G.allocation_stream(G.PassRatePool(n=32, solved=0.5, unsolved=0.5), G.GRPOConfig(batch=8), 0, 12)
    np.testing.assert_allclose(still.pass_rate, still.pass_rate[0])
    assert G.wse_report(still, G.GRPOConfig().arms, 4).steps.size == 0


def test_allocation_stream_exact_sigma_at_a_fixed_pass_rate():
    # every prompt on the frontier at a fixed pi (kappa 0: no learning): the exact sigma of every bin present is
    # sqrt(pi (1 - pi)), and WSE changes are computed against uniform on the same steps
    cfg = G.GRPOConfig(batch=8)
    pool = G.PassRatePool(n=16, solved=0.0, unsolved=0.0, frontier=(0.3, 0.3))
    log = G.allocation_stream(pool, cfg, seed=1, steps=12, kappa=0.0)
    live = log.counts[log.warmup:] > 0
    np.testing.assert_allclose(log.true_sigma[log.warmup:][live], math.sqrt(0.3 * 0.7), rtol=1e-12)
    assert np.isnan(log.true_sigma[log.warmup:][~live]).all()
    np.testing.assert_allclose(log.pass_rate, 0.3)
    rep = G.wse_report(log, cfg.arms, cfg.n_bar)
    ch = rep.changes()
    want = 100 * np.mean(rep.run / rep.uniform - 1)
    assert ch["run"] == pytest.approx(want) and ch["oracle"] == pytest.approx(0.0, abs=1e-9)  # equal sigma: no gain


def test_per_bin_mean_skips_empty_steps():
    values = np.array([[2.0, np.nan, 5.0], [4.0, np.nan, 0.0]])
    counts = np.array([[1, 0, 3], [2, 0, 0]])
    out = G.per_bin_mean(values, counts)
    assert out[0] == 3.0 and np.isnan(out[1]) and out[2] == 5.0
