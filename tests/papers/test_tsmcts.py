"""repro.papers.tsmcts against independent references: exact dynamic programming (value iteration against a
linear solve, BFS shortest paths, K-step policy evaluation), the exact Plackett–Luce law, the defining property of
systematic resampling, and DeepMind's mctx (Sequential Halving schedule, completed-Q / σ transform, final choice)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from repro.papers import tsmcts as T


@pytest.fixture(scope="module")
def maze() -> T.Maze:
    return T.make_maze(6, 0.08, seed=3)


@pytest.fixture(scope="module")
def suite():
    s = T.make_maze_suite(6, n=6, roots_per_maze=2, min_distance=4, seed=5)
    V, Q = T.value_iteration(s.model)
    return s, V, Q


def policy_eval_k(model: T.TabularModel, net: T.Network, depth: int) -> np.ndarray:
    """Exact K-step Q of the prior policy bootstrapped on the network value, by backward recursion in NumPy:
    Q_1 = r + γ V(s'), Q_k = r + γ Σ_a' π(a'|s') Q_{k-1}(s', a')."""
    ns, r, g = model.next_state.numpy(), model.reward.numpy(), model.gamma
    pi = torch.softmax(net.logits.double(), -1).numpy()
    v = net.value.double().numpy()
    Q = r + g * v[ns]
    for _ in range(depth - 1):
        Q = r + g * (pi * Q).sum(-1)[ns]
    return Q


# --------------------------------------------------------------------------------------------------------- problems
def test_value_iteration_matches_linear_solve_and_shortest_paths(maze):
    V, Q = T.value_iteration(maze.model)
    # independent 1: evaluate the greedy policy exactly by a linear solve (I − γ P_π) V = r_π
    m = maze.model
    S = m.n_states
    a = Q.argmax(-1).numpy()
    P = np.zeros((S, S))
    P[np.arange(S), m.next_state.numpy()[np.arange(S), a]] = 1.0
    P[m.terminal.numpy()] = 0.0
    r = m.reward.numpy()[np.arange(S), a]
    V_pi = np.linalg.solve(np.eye(S) - m.gamma * P, r)
    np.testing.assert_allclose(V.numpy(), V_pi, atol=1e-10)
    # independent 2: from any cell d moves from the goal (BFS), V* = −c (1 − γ^{d−1}) / (1 − γ) + γ^{d−1}
    d = maze.distance.reshape(-1)
    ok = d > 0
    g = m.gamma
    closed = -0.01 * (1 - g ** (d[ok] - 1)) / (1 - g) + g ** (d[ok] - 1)
    np.testing.assert_allclose(V.numpy()[ok], closed, atol=1e-10)


def test_maze_terminals_absorb_and_rewards(maze):
    m = maze.model
    term = np.flatnonzero(m.terminal.numpy())
    assert len(term) >= 1
    assert (m.next_state[term] == torch.as_tensor(term)[:, None]).all() and (m.reward[term] == 0).all()
    assert set(np.unique(m.reward.numpy())) <= {-1.0, -0.01, 0.0, 1.0}


def test_network_noise_and_bad_input(suite):
    s, V, Q = suite
    net = T.make_network(s.model, V, Q, 0.3, seed=0)
    assert (net.value[s.model.terminal] == 0).all()
    assert 0.2 < float((net.value - V)[~s.model.terminal].std()) < 0.4
    with pytest.raises(ValueError, match="sigma_v"):
        T.make_network(s.model, V, Q, -1.0)
    with pytest.raises(ValueError, match="NaN"):
        T.Network(torch.full((2, 2), math.nan), torch.zeros(2))
    with pytest.raises(ValueError, match="gamma"):
        T.TabularModel(torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2), torch.zeros(2, dtype=bool), 1.0)


# ------------------------------------------------------------------------------------------- Gumbel MuZero pieces
def test_gumbel_top_k_is_plackett_luce():
    logits = torch.tensor([[1.0, 0.2, -0.5, 0.0]]).repeat(40_000, 1)
    _, top = T.gumbel_top_k(logits, 2, torch.Generator().manual_seed(0))
    p = torch.softmax(logits[0].double(), 0).numpy()
    pairs = [(i, j) for i in range(4) for j in range(4) if i != j]
    want = np.array([p[i] * p[j] / (1 - p[i]) for i, j in pairs])  # P(i first, then j) without replacement
    want /= want.sum()
    code = (top[:, 0] * 4 + top[:, 1]).numpy()
    got = np.array([(code == i * 4 + j).sum() for i, j in pairs])
    assert stats.chisquare(got, want * len(code)).pvalue > 0.01
    with pytest.raises(ValueError, match="k must"):
        T.gumbel_top_k(logits[:2], 5)


def test_sequential_halving_schedule_matches_mctx():
    seq_halving = pytest.importorskip("mctx._src.seq_halving")
    for m in range(1, 17):
        for budget in range(1, 90):
            visits, seq = [0] * m, []
            for phase in T.sequential_halving_schedule(m, budget):
                assert list(phase) == sorted(phase, reverse=True) and sum(phase) > 0
                for k in range(max(phase)):  # round-robin over the phase's actions, as mctx visits them
                    seq += [visits[i] for i in range(len(phase)) if phase[i] > k]
                    for i in range(len(phase)):
                        visits[i] += phase[i] > k
            assert tuple(seq) == seq_halving.get_sequence_of_considered_visits(m, budget), (m, budget)


def _mctx_root_tree(q, visits, logits, raw):
    import jax.numpy as jnp
    import mctx

    B, A = q.shape
    f = lambda x: jnp.asarray(np.asarray(x, dtype=np.float32))  # noqa: E731
    return mctx.Tree(node_visits=f(visits.sum(-1, keepdims=True)), raw_values=f(raw[:, None]),
                     node_values=f(raw[:, None]), parents=jnp.full((B, 1), -1), action_from_parent=jnp.full((B, 1), -1),
                     children_index=jnp.full((B, 1, A), -1), children_prior_logits=f(logits[:, None]),
                     children_visits=jnp.asarray(visits[:, None].astype(np.int32)), children_rewards=f(q[:, None]),
                     children_discounts=jnp.ones((B, 1, A)), children_values=jnp.zeros((B, 1, A)),
                     embeddings=jnp.zeros((B, 1)), root_invalid_actions=jnp.zeros((B, A)), extra_data=None)


def test_completed_q_and_sigma_match_mctx():
    pytest.importorskip("mctx")
    import jax
    import mctx

    rng = np.random.default_rng(0)
    B, A = 300, 6
    q = rng.normal(size=(B, A)).astype(np.float32)
    visits = rng.integers(0, 4, size=(B, A)) * (rng.random((B, A)) < 0.6)
    visits[0] = 0  # nothing visited: completed Q is the raw value everywhere
    logits, raw = rng.normal(size=(B, A)).astype(np.float32), rng.normal(size=B).astype(np.float32)
    tree = _mctx_root_tree(q, visits, logits, raw)
    want = np.asarray(jax.vmap(mctx.qtransform_completed_by_mix_value, in_axes=[0, None])(tree, 0))
    t = lambda x: torch.as_tensor(x, dtype=torch.float64)  # noqa: E731
    qv = torch.where(t(visits) > 0, t(q), torch.full((B, A), math.nan, dtype=torch.float64))  # NaN unvisited
    got = T.sigma_transform(T.completed_q(qv, t(visits), t(logits), t(raw)), t(visits))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def test_score_considered_matches_mctx():
    pytest.importorskip("mctx")
    import jax.numpy as jnp
    from mctx._src import seq_halving

    rng = np.random.default_rng(1)
    B, A = 500, 5
    g, logits, sq = (rng.normal(size=(B, A)).astype(np.float32) for _ in range(3))
    visits = rng.integers(0, 3, size=(B, A)).astype(np.float32)
    want = np.asarray(jnp.argmax(seq_halving.score_considered(jnp.max(visits, -1, keepdims=True), g, logits, sq,
                                                              visits), -1))
    got = T.score_considered(*(torch.as_tensor(x) for x in (g, logits, sq, visits)))
    np.testing.assert_array_equal(got.numpy(), want)


# ------------------------------------------------------------------------------------------------- SMC building blocks
@pytest.mark.parametrize("sizes", [(37,), (4, 4, 4, 4), (9, 1, 5, 12)])
def test_systematic_resampling_counts_are_floor_or_ceil(sizes):
    gen = torch.Generator().manual_seed(2)
    B, P = 400, sum(sizes)
    seg = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    w = torch.rand(B, P, generator=gen, dtype=torch.float64) ** 4
    w[:, 0] = 0.0  # a zero weight is never copied
    idx = T.systematic_resample(w, gen, None if len(sizes) == 1 else seg)
    assert (seg[idx] == seg).all(), "resampling must stay inside each particle's segment"
    counts = torch.zeros(B, P, dtype=torch.float64).scatter_add(1, idx, torch.ones(B, P, dtype=torch.float64))
    tot = torch.zeros(B, len(sizes), dtype=torch.float64).index_add(1, seg, w)
    expected = torch.tensor(sizes, dtype=torch.float64)[seg] * w / tot[:, seg]  # n_s · w̄
    assert (counts >= torch.floor(expected - 1e-9)).all() and (counts <= torch.ceil(expected + 1e-9)).all()
    assert (counts[:, 0] == 0).all()
    with pytest.raises(ValueError, match="non-negative"):
        T.systematic_resample(-w)


def test_ess_values():
    logw = torch.log(torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0], [3.0, 1.0, 0.0, 0.0]]))
    np.testing.assert_allclose(T.ess(logw)[:, 0].numpy(), [4.0, 1.0, 16 / 10], rtol=1e-6)
    np.testing.assert_allclose(T.ess(logw, torch.tensor([0, 0, 1, 1]))[2].numpy(), [1.6, math.nan], rtol=1e-6)
    with pytest.raises(ValueError, match="NaN"):
        T.ess(torch.tensor([[math.nan, 0.0]]))


# ---------------------------------------------------------------------------------------------------------- operators
def test_depth_one_with_exact_values_is_exact(suite):
    s, V, Q = suite
    exact = T.Network(T.make_network(s.model, V, Q, 0.0).logits, V)
    roots = s.roots.repeat(8)
    for fn in (T.tsmcts_search, T.smcts_search):
        res = fn(s.model, exact, roots, 16, 1, m=4, tau=0.1, generator=torch.Generator().manual_seed(0))
        seen = res.visits > 0
        torch.testing.assert_close(res.q[seen], Q[roots][seen], rtol=0, atol=1e-14)  # Q̂ = r + γV*(s') = Q*
    res = T.smc_search(s.model, exact, roots, 16, 1, tau=0.1, generator=torch.Generator().manual_seed(0))
    seen = res.policy > 0
    torch.testing.assert_close(res.q[seen], Q[roots][seen], rtol=0, atol=1e-14)


def test_no_twist_no_resampling_is_unbiased_k_step_evaluation(suite):
    s, V, Q = suite
    net = T.make_network(s.model, V, Q, 0.3, seed=4)
    depth, seeds, A = 5, 3000, s.model.n_actions
    Qk = policy_eval_k(s.model, net, depth)[s.roots.numpy()]
    roots = s.roots.repeat(seeds)
    res = T.smcts_search(s.model, net, roots, 2 * A, depth, m=A, tau=math.inf,
                         generator=torch.Generator().manual_seed(1))
    assert float(res.diagnostics.resamples.max()) == 0 and (res.visits == 2).all()
    est = res.q.view(seeds, -1, A).numpy()
    z = (est.mean(0) - Qk) / (est.std(0, ddof=1) / math.sqrt(seeds) + 1e-12)
    assert np.abs(z).max() < 4.5, np.abs(z).max()  # 48 estimates: |z| < 4.5 unless biased
    smc = T.smc_search(s.model, net, roots, 8, depth, tau=math.inf, generator=torch.Generator().manual_seed(2))
    pi = torch.softmax(net.logits[s.roots].double(), -1).numpy()
    v = smc.value.view(seeds, -1).numpy()
    z = (v.mean(0) - (pi * Qk).sum(-1)) / (v.std(0, ddof=1) / math.sqrt(seeds))
    assert np.abs(z).max() < 4.5


def test_matched_model_calls_resampling_and_round_zero_coverage(suite):
    s, V, Q = suite
    net = T.make_network(s.model, V, Q, 0.3, seed=4)
    roots = s.roots.repeat(16)
    out = {}
    for name, fn in [("smc", T.smc_search), ("smcts", T.smcts_search), ("tsmcts", T.tsmcts_search)]:
        out[name] = fn(s.model, net, roots, 32, 12, tau=0.05, generator=torch.Generator().manual_seed(3))
        assert out[name].diagnostics.model_calls == 32 * 12
        assert float(out[name].diagnostics.resamples.mean()) > 0, f"{name}: the twist must trigger resampling"
        torch.testing.assert_close(out[name].policy.sum(-1), torch.ones(len(roots), dtype=torch.float64))
    ts = out["tsmcts"]
    assert (ts.diagnostics.covered_round0 == 4).all() and (ts.diagnostics.unique_ancestors == 4).all()
    assert (ts.visits.sum(-1) == 32).all() and (ts.visits.max(-1).values == 4 + 8).all()  # schedule (4,4,4,4), (8,8)
    assert ts.visits.gather(1, ts.action[:, None]).squeeze(1).eq(12).all()  # acts among the most-visited
    assert float(out["smc"].diagnostics.unique_ancestors.float().mean()) < 2.5  # degeneracy at a sharp twist
    assert ts.diagnostics.ess_trace.shape == (len(roots), 2, 12)


def test_bad_input_is_rejected(suite):
    s, V, Q = suite
    net = T.make_network(s.model, V, Q, 0.3)
    with pytest.raises(ValueError, match="tau"):
        T.smc_search(s.model, net, s.roots, 8, 4, tau=0.0)
    with pytest.raises(ValueError, match="roots"):
        T.tsmcts_search(s.model, net, torch.tensor([10**6]), 8, 4)
    with pytest.raises(ValueError, match="n_particles"):
        T.tsmcts_search(s.model, net, s.roots, 0, 4)
    with pytest.raises(ValueError, match="ess_threshold"):
        T.smcts_search(s.model, net, s.roots, 8, 4, ess_threshold=2.0)


def test_gumbel_mcts_reference_through_mctx(suite):
    pytest.importorskip("mctx")
    s, V, Q = suite
    net = T.make_network(s.model, V, Q, 0.0)
    res = T.gumbel_mcts_reference(s.model, net, s.roots, 16, m=4, seed=0)
    assert res.diagnostics.model_calls == 16 and (res.visits.sum(-1) == 16).all()
    torch.testing.assert_close(res.policy.sum(-1), torch.ones(len(s.roots)), atol=1e-5, rtol=0)
    assert ((res.action >= 0) & (res.action < s.model.n_actions)).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runs_on_cuda(suite):
    s, V, Q = suite
    net = T.make_network(s.model, V, Q, 0.3)
    cpu = T.tsmcts_search(s.model, net, s.roots, 16, 6, generator=torch.Generator().manual_seed(0))
    dev = torch.device("cuda")
    res = T.tsmcts_search(s.model.to(dev), net.to(dev), s.roots.to(dev), 16, 6,
                          generator=torch.Generator(device=dev).manual_seed(0))
    assert res.action.device.type == "cuda" and res.diagnostics.model_calls == cpu.diagnostics.model_calls
    assert (res.visits.sum(-1) == 16).all()


def test_harness_matches_model_calls_and_scores_against_exact_q():
    p = T.make_problem(4, n=6, seed=7, sigma_v=0.3, min_distance=4, dtype=torch.float64)
    st = T.depth_study(p, ["SMC", "TSMCTS", "SH-MC"], [2, 3], 0.1, n_seeds=3, n_particles=8, m=4)
    for (_op, k), r in st.runs.items():
        assert r.model_calls == 8 * k and r.regret.shape == (p.n_roots, 3)
        assert (r.regret >= -1e-12).all() and 0.0 <= T.improved_fraction(r) <= 1.0
    # regrets are differences of exact Q* values: every one is a gap of the root's Q* table
    gaps = (p.Q[p.roots].max(-1, keepdim=True).values - p.Q[p.roots]).numpy()
    reg = st.runs[("TSMCTS", 3)].regret
    assert all(np.isclose(gaps[i], reg[i, j]).any() for i in range(p.n_roots) for j in range(3))
    with pytest.raises(ValueError, match="unknown operator"):
        T.run_operator(p, "MCTS", 2, 0.1, 1)


# ------------------------------------------------------------------------------------------------ evidence over roots
def _run(op: str, depth: int, regret: np.ndarray, value: np.ndarray) -> T.OperatorRun:
    z = np.zeros_like(regret)
    return T.OperatorRun(op, depth, 0.1, regret, value, z + 0.5, z + 2.0, z, None, np.zeros((1, depth)), 8 * depth,
                         0.0)


def test_per_root_pooled_and_depth_gain_by_hand():
    # two maze sets of two roots, three searches per root; every number below is worked by hand
    reg = {("A", 0): [[0.0, 0.3, 0.0], [0.1, 0.1, 0.1]], ("A", 1): [[0.6, 0.0, 0.0], [0.0, 0.0, 0.3]]}
    val = [[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]]  # spreads: sd(1, 2, 3) = 1, sd(5, 5, 5) = 0
    studies = []
    for s in (0, 1):
        shallow = _run("A", 4, np.array(reg[("A", s)]), np.array(val))
        deep = _run("A", 32, np.array(reg[("A", s)]) / 3, np.array(val) * 2)
        studies.append(T.DepthStudy(0.1, [4, 32], ["A"], {("A", 4): shallow, ("A", 32): deep}))
    np.testing.assert_allclose(T.per_root(studies[0].runs[("A", 4)], "regret"), [0.1, 0.1])
    np.testing.assert_allclose(T.per_root(studies[0].runs[("A", 4)], "spread"), [1.0, 0.0])
    np.testing.assert_allclose(T.pooled(studies, "A", 4, "regret"), [0.1, 0.1, 0.2, 0.1])
    np.testing.assert_allclose(T.pooled(studies, "A", 32, "spread"), [2.0, 0.0, 2.0, 0.0])
    np.testing.assert_allclose(T.per_set(studies, "A", 4, "regret"), [0.1, 0.15])
    np.testing.assert_allclose(T.depth_gain(studies, "A", 32, 4), [-0.2 / 3, -0.2 / 3, -0.4 / 3, -0.2 / 3])
    assert T.ratio_of_means(np.array([2.0, 0.0]), np.array([1.0, 3.0])) == 0.5
    np.testing.assert_allclose(T.z_score(np.array([1.0, 2.0, 3.0])), 2 * math.sqrt(3))  # mean 2, SE 1/sqrt(3)
    with pytest.raises(ValueError, match="field"):
        T.per_root(studies[0].runs[("A", 4)], "returns")
    pairs = [(4, studies[0].runs[("A", 4)]), (4, _run("B", 5, np.zeros((2, 3)), np.zeros((2, 3))))]
    assert T.distinct_call_counts(pairs) == 2 and T.distinct_call_counts(pairs[:1]) == 1


def test_mc_control_is_smc_without_twist():
    p = T.make_problem(4, n=6, seed=7, sigma_v=0.3, min_distance=4, dtype=torch.float64)
    mc = T.run_operator(p, "MC", 6, 0.1, n_seeds=4, n_particles=8)
    assert mc.model_calls == 8 * 6 and (mc.resamples == 0).all()
    # the same searches as smc_search at tau = inf with the harness's generator: identical root values
    roots = p.roots.repeat(4)
    gen = T.experiment._generator(roots.device, 0, p.seed, "MC", 6, 0.1, 8, p.sigma_v)
    ref = T.smc_search(p.suite.model, p.net, roots, 8, 6, tau=math.inf, generator=gen)
    np.testing.assert_array_equal(mc.value, ref.value.reshape(4, -1).T.numpy())
