"""repro.papers.action_sufficiency against independent references: a scalar re-statement of the Discrete Cube rules,
networkx shortest paths, brute-force grouping with scipy entropies and KL divergences, the public code's numbers
and quadrant counts, and Monte-Carlo rollouts against the exact success probability."""

from __future__ import annotations

from collections import defaultdict

import networkx as nx
import numpy as np
import pytest
import torch
from scipy import stats

from repro.papers import action_sufficiency as AS
from repro.papers.action_sufficiency.problems import HOLD_BLUE, HOLD_NONE, HOLD_RED, RED


@pytest.fixture(scope="module")
def env3() -> AS.DiscreteCube:
    return AS.DiscreteCube(3)


def _step(st: tuple[int, ...], a: int, n: int) -> tuple[int, ...]:
    """The Discrete Cube rules, one state and one action at a time (written from the paper's description)."""
    ax, ay, rx, ry, bx, by, h = st
    if a == 0:
        return (ax, min(ay + 1, n - 1), rx, ry, bx, by, h)
    if a == 1:
        return (ax, max(ay - 1, 0), rx, ry, bx, by, h)
    if a == 2:
        return (max(ax - 1, 0), ay, rx, ry, bx, by, h)
    if a == 3:
        return (min(ax + 1, n - 1), ay, rx, ry, bx, by, h)
    if a == 4 and h == HOLD_NONE:
        if (ax, ay) == (rx, ry):
            return (ax, ay, -1, -1, bx, by, HOLD_RED)
        if (ax, ay) == (bx, by):
            return (ax, ay, rx, ry, -1, -1, HOLD_BLUE)
    if a == 5 and h == HOLD_RED and (ax, ay) != (bx, by):
        return (ax, ay, ax, ay, bx, by, HOLD_NONE)
    if a == 5 and h == HOLD_BLUE and (ax, ay) != (rx, ry):
        return (ax, ay, rx, ry, ax, ay, HOLD_NONE)
    return st


def _solved(st: tuple[int, ...], goal: tuple[int, int, int]) -> bool:
    t, gx, gy = goal
    if t == RED:
        return st[6] != HOLD_RED and (st[2], st[3]) == (gx, gy)
    return st[6] != HOLD_BLUE and (st[4], st[5]) == (gx, gy)


# ------------------------------------------------------------------------------------------- the MDP
def test_sizes_match_the_paper(env3):
    assert (env3.num_states, env3.num_goals, int(env3.valid.sum())) == (810, 18, 11088)
    env4 = AS.DiscreteCube(4)
    assert (env4.num_states, env4.num_goals) == (4352, 32)
    assert len(set(map(tuple, env3.states.tolist()))) == 810  # no duplicates


def test_successors_follow_the_rules(env3):
    states = [tuple(s) for s in env3.states.tolist()]
    index = {s: i for i, s in enumerate(states)}
    want = torch.tensor([[index[_step(s, a, 3)] for a in range(6)] for s in states])
    assert torch.equal(env3.succ, want)


def test_success_and_valid_masks_by_brute_force(env3):
    goals = [tuple(g) for g in env3.goals.tolist()]
    for i, st in enumerate(env3.states.tolist()):
        for j, g in enumerate(goals):
            assert bool(env3.success[i, j]) == _solved(tuple(st), g)
            ax, ay, rx, ry, bx, by, h = st
            cell = (g[1], g[2])
            if h == HOLD_NONE:
                ok = len({(rx, ry), (bx, by), cell}) == 3
            else:
                floor = (bx, by) if h == HOLD_RED else (rx, ry)
                ok = len({(ax, ay), floor, cell}) == 3
            assert bool(env3.valid[i, j]) == ok


def test_distances_match_networkx_shortest_paths(env3):
    graph = nx.DiGraph()
    graph.add_edges_from((int(s), int(t)) for s, row in enumerate(env3.succ) for t in row)
    rev = graph.reverse()
    for j in range(env3.num_goals):
        rev_j = rev.copy()
        rev_j.add_edges_from(("goal", int(s)) for s in torch.nonzero(env3.success[:, j]).squeeze(1))
        lengths = nx.single_source_shortest_path_length(rev_j, "goal")
        want = torch.tensor([lengths.get(s, 0) - 1 for s in range(env3.num_states)])
        assert torch.equal(env3.dist[:, j], want)


def test_optimal_policy_reaches_every_goal_in_exactly_d_steps(env3):
    pi = env3.optimal_action_dist()
    assert torch.allclose(pi.sum(-1), torch.ones(1, dtype=pi.dtype))
    tasks = env3.sample_tasks(200, np.random.default_rng(3))
    hit = AS.first_hit_times(env3, pi, tasks, 20, torch.Generator().manual_seed(0))
    assert torch.equal(hit[0], env3.dist[tasks.state, tasks.goal][:, None].expand(-1, 20))


def test_tasks_follow_the_released_sampler(env3):
    tasks = env3.sample_tasks(600, np.random.default_rng(0))
    d = env3.dist[tasks.state, tasks.goal]
    assert (d > 0).all() and (env3.states[tasks.state, 6] == HOLD_NONE).all()
    assert torch.equal(tasks.horizon, torch.clamp(d + 6, max=30))
    # the sampler's first draws by hand: rng.choice over empty-handed states, then rng.integers over goals
    rng = np.random.default_rng(0)
    empty = torch.nonzero(env3.states[:, 6] == HOLD_NONE).squeeze(1).numpy()
    first = (int(rng.choice(empty)), int(rng.integers(0, 18)))
    while env3.dist[first] <= 0:
        first = (int(rng.choice(empty)), int(rng.integers(0, 18)))
    assert (int(tasks.state[0]), int(tasks.goal[0])) == first


# ------------------------------------------------------------------------------------------- information terms
def _brute_terms(action, values, state, z):
    """Every term by explicit dictionaries, scipy entropies and scipy KL divergences."""
    P = len(action)

    def groups(keys):
        out = defaultdict(list)
        for i, k in enumerate(keys):
            out[k].append(i)
        return out

    def h_grouped(keys):
        return sum(len(ix) / P * stats.entropy(action[ix].mean(0)) for ix in groups(keys).values())

    zk = [tuple(r) for r in z]
    sz = list(zip(state, zk, strict=True))
    sv = list(zip(state, values, strict=True))
    svz = list(zip(state, values, zk, strict=True))
    g_sz, g_sv, g_svz = groups(sz), groups(sv), groups(svz)
    h_v = 0.0
    for ix in g_sz.values():
        _, counts = np.unique(values[ix], return_counts=True)
        h_v += len(ix) / P * stats.entropy(counts / counts.sum())
    mean = {k: action[ix].mean(0) for k, ix in {**g_sz, **g_sv, **g_svz}.items()}
    d_a_kl = np.mean([stats.entropy(action[i], mean[sz[i]]) for i in range(P)])
    i_az = sum(len(ix) / P * stats.entropy(mean[k], mean[(k[0], k[1])]) for k, ix in g_svz.items())
    i_av = sum(len(ix) / P * stats.entropy(mean[k], mean[(k[0], k[2])]) for k, ix in g_svz.items())
    h_sg = np.mean([stats.entropy(a) for a in action])
    return {"H_A_SG": h_sg, "H_A_SZ": h_grouped(sz), "H_A_SV": h_grouped(sv), "H_A_SVZ": h_grouped(svz),
            "H_V_SZ": h_v, "Delta_A": h_grouped(sz) - h_sg, "Delta_A_kl": d_a_kl, "I_A_Z_given_SV_kl": i_az,
            "I_A_V_given_SZ_kl": i_av, "groups_sz": len(g_sz)}


def test_group_entropies_match_brute_force_with_scipy():
    rng = np.random.default_rng(0)
    P = 400
    support = rng.random((P, 6)) < 0.4
    support[np.arange(P), rng.integers(0, 6, P)] = True  # π*-like rows: uniform over a random support
    action = support / support.sum(1, keepdims=True)
    state, values = rng.integers(0, 12, P), -rng.integers(1, 5, P)
    z = rng.integers(0, 3, (P, 2))
    got = AS.group_entropies(torch.tensor(action), torch.tensor(values), torch.tensor(state), torch.tensor(z))
    want = _brute_terms(action, values, state, z)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=1e-12), k
    assert abs(got["identity_residual"]) < 1e-12
    assert got["I_A_Z_given_SV"] == pytest.approx(want["I_A_Z_given_SV_kl"], abs=1e-12)


def test_identity_representation_recovers_pi_star_and_constant_gives_i_a_g_given_s(env3):
    s, g = env3.valid_pairs()
    pi = env3.optimal_action_dist()
    V = env3.values()[s, g]
    ident = AS.group_entropies(pi[s, g], V, s, g)
    assert abs(ident["Delta_A"]) < 1e-12 and abs(ident["Delta_V"]) < 1e-12
    assert torch.allclose(AS.mixed_policy(env3, g), pi, atol=1e-15)
    const = AS.group_entropies(pi[s, g], V, s, torch.zeros_like(s))
    # I(A; G | S) = H(A | S) − H(A | S, G), brute force per state with scipy
    a = pi[s, g].numpy()
    h_as = sum((s == i).sum().item() / len(s) * stats.entropy(a[(s == i).numpy()].mean(0)) for i in s.unique())
    assert const["Delta_A"] == pytest.approx(h_as - stats.entropy(a.T).mean(), abs=1e-12)


def test_anchors_match_the_public_codes_numbers(env3):
    # the released pipeline at n = 3 (numbers printed to 3 decimals, 4 for the smallest)
    s, g = env3.valid_pairs()
    pi, V = env3.optimal_action_dist()[s, g], env3.values()[s, g]
    want = {"value_only": (0.240, 0.0), "distances": (0.112, 0.0), "actor_like": (0.0, 0.0),
            "signs": (0.0008, 0.545), "dx_sign": (0.023, 0.896)}
    for phi in AS.anchor_representations(env3):
        t = AS.group_entropies(pi, V, s, phi.z)
        assert t["H_A_SG"] == pytest.approx(0.340, abs=6e-4)
        assert (t["Delta_A"], t["Delta_V"]) == pytest.approx(want[phi.name], abs=6e-4), phi.name


def test_random_family_reproduces_the_released_quadrant_counts(env3):
    phis = AS.random_phi_family(env3, 300, 0)
    assert len(phis) == 305 and [p.name for p in phis[:5]] == list(AS.ANCHORS)
    s, g = env3.valid_pairs()
    pi, V = env3.optimal_action_dist()[s, g], env3.values()[s, g]
    terms = [AS.group_entropies(pi, V, s, p.z) for p in phis]
    vs = np.array([abs(t["Delta_V"]) <= 1e-9 for t in terms])
    acs = np.array([abs(t["Delta_A"]) <= 1e-9 for t in terms])
    # released sweep, n = 3, 300 random phis, seed 0: 8 / 63 / 14 / 220
    assert [int((vs & acs).sum()), int((vs & ~acs).sum()), int((~vs & acs).sum()), int((~vs & ~acs).sum())] == \
        [8, 63, 14, 220]
    assert max(abs(t["identity_residual"]) for t in terms) < 1e-12


def test_group_ids_match_numpy_unique_rows():
    rng = np.random.default_rng(1)
    a = rng.integers(-5, 5, (500, 3))
    b = rng.integers(0, 2**40, 500)  # sparse hash-like codes
    ids, k = AS.group_ids(torch.tensor(a), torch.tensor(b))
    rows = np.concatenate([a, b[:, None]], 1)
    _, want = np.unique(rows, axis=0, return_inverse=True)
    assert k == len(np.unique(rows, axis=0))
    # same partition: ids and numpy's inverse determine each other
    pairs = set(zip(ids.tolist(), want.ravel().tolist(), strict=True))
    assert len(pairs) == k


# ------------------------------------------------------------------------------------------- control success
def test_exact_success_agrees_with_monte_carlo_rollouts(env3):
    tasks = env3.sample_tasks(150, np.random.default_rng(1))
    phis = AS.anchor_representations(env3)
    pol = torch.stack([AS.mixed_policy(env3, p.z) for p in phis[:2]])  # value_only, distances
    exact, own = AS.success_probability(env3, pol, tasks)
    hit = AS.first_hit_times(env3, pol, tasks, 400, torch.Generator().manual_seed(5))
    for mc, ex in ((AS.success_rate(hit, tasks), exact), (AS.success_rate(hit, tasks, True), own)):
        se = torch.sqrt((ex * (1 - ex)).sum(1) / 400) / len(tasks)  # rollouts are independent given the task
        assert ((mc - ex.mean(1)).abs() <= 4 * se + 1e-12).all()
    assert (exact >= own - 1e-12).all()  # a longer horizon never hurts


def test_rollouts_are_reproducible_and_use_common_random_numbers(env3):
    tasks = env3.sample_tasks(50, np.random.default_rng(2))
    pol = AS.mixed_policy(env3, AS.anchor_representations(env3)[0].z)
    one = AS.first_hit_times(env3, pol, tasks, 10, torch.Generator().manual_seed(9))
    two = AS.first_hit_times(env3, torch.stack([pol, pol]), tasks, 10, torch.Generator().manual_seed(9))
    assert torch.equal(one[0], two[0]) and torch.equal(two[0], two[1])
    assert float(AS.rollout_success(env3, pol, tasks, 10, torch.Generator().manual_seed(9))) == \
        float(AS.success_rate(one, tasks)[0])


def test_value_collapse_example_is_a_real_witness(env3):
    c = AS.value_collapse_example(env3)
    si = int(env3.index_of(c.state[None])[0])
    gi = [int(torch.nonzero((env3.goals == g).all(1))[0]) for g in c.goals]
    assert [int(env3.values()[si, j]) for j in gi] == [c.value, c.value]
    assert not set(c.actions[0]) & set(c.actions[1])
    mixed = AS.mixed_policy(env3, AS.anchor_representations(env3)[0].z)[si, gi[0]]
    assert all(mixed[a] > 0 for a in c.actions[0] + c.actions[1])


# ------------------------------------------------------------------------------------------- learned representations
def test_seeds_trained_together_equal_seeds_trained_alone(env3):
    both = AS.train_goal_rep(env3, "value", 4, 15, [3, 4], batch=64)
    alone = AS.train_goal_rep(env3, "value", 4, 15, 4, batch=64)
    assert torch.allclose(both.policy[1], alone.policy[0], atol=1e-5)
    assert torch.allclose(both.value_losses[1], alone.value_losses[0], atol=1e-5)


def test_actor_log_loss_training_lowers_the_excess_log_loss(env3):
    short = AS.train_goal_rep(env3, "actor", 4, 5, 0, batch=128)
    longer = AS.train_goal_rep(env3, "actor", 4, 300, 0, batch=128)
    assert (short.excess_logloss >= 0).all() and (longer.excess_logloss >= 0).all()  # upper bounds on Δ_A ≥ 0
    assert float(longer.excess_logloss[0]) < 0.5 * float(short.excess_logloss[0])
    assert longer.policy.shape == (1, env3.num_states, env3.num_goals, 6)
    assert torch.allclose(longer.policy.sum(-1), torch.ones(1, dtype=longer.policy.dtype))


# ------------------------------------------------------------------------------------------- bad input, devices
def test_bad_input_is_rejected(env3):
    s, g = env3.valid_pairs()
    pi, V = env3.optimal_action_dist()[s, g], env3.values()[s, g]
    with pytest.raises(ValueError, match="n must be"):
        AS.DiscreteCube(1)
    with pytest.raises(ValueError, match="integer keys"):
        AS.group_entropies(pi, V, s, torch.rand(len(s)))
    with pytest.raises(ValueError, match="rows"):
        AS.group_entropies(pi, V[:-1], s, g)
    bad = pi.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        AS.group_entropies(bad, V, s, g)
    with pytest.raises(ValueError, match="sum to 1"):
        AS.group_entropies(pi * 2, V, s, g)
    with pytest.raises(ValueError, match="non-empty"):
        AS.group_entropies(pi[:0], V[:0], s[:0], g[:0])
    with pytest.raises(ValueError, match="valid pairs"):
        AS.mixed_policy(env3, g[:-1])
    tasks = env3.sample_tasks(3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="shape"):
        AS.success_probability(env3, torch.ones(2, 3, 6), tasks)
    with pytest.raises(ValueError, match="n_rollouts"):
        AS.rollout_success(env3, env3.optimal_action_dist(), tasks, 0, torch.Generator())
    with pytest.raises(ValueError, match="kind"):
        AS.train_goal_rep(env3, "critic", 4, 10, 0)
    with pytest.raises(ValueError, match="at least one task"):
        env3.sample_tasks(0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="not a state"):
        env3.index_of(torch.tensor([[0, 0, 0, 0, 0, 0, 0]]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runs_on_cuda(env3):
    gpu = AS.DiscreteCube(3, device="cuda")
    assert torch.equal(gpu.dist.cpu(), env3.dist)
    s, g = gpu.valid_pairs()
    z = AS.anchor_representations(gpu)[0].z
    t = AS.group_entropies(gpu.optimal_action_dist()[s, g], gpu.values()[s, g], s, z)
    assert t["Delta_A"] == pytest.approx(0.2404, abs=1e-4)
    tasks = gpu.sample_tasks(20, np.random.default_rng(0))
    exact, _ = AS.success_probability(gpu, AS.mixed_policy(gpu, z), tasks)
    assert exact.device.type == "cuda"
    tr = AS.train_goal_rep(gpu, "actor", 4, 5, 0, batch=32)
    assert tr.policy.device.type == "cuda"


def test_partial_spearman_matches_the_precision_matrix_of_the_ranks():
    """Reference: the partial correlation from the inverse correlation matrix of the ranks, −P_xy / √(P_xx P_yy)."""
    from scipy.stats import rankdata

    rng = np.random.default_rng(3)
    g = rng.normal(size=400)
    x, y = g + rng.normal(size=400), -g + 0.5 * rng.normal(size=400)
    P = np.linalg.inv(np.corrcoef(np.stack([rankdata(v) for v in (x, y, g)])))
    assert AS.partial_spearman(x, y, g) == pytest.approx(-P[0, 1] / np.sqrt(P[0, 0] * P[1, 1]), abs=1e-12)
    assert AS.spearman(x, y) < -0.3 and abs(AS.partial_spearman(x, y, g)) < 0.15  # the shared factor removed


def test_group_counts_of_the_anchors():
    env = AS.DiscreteCube(3)
    counts = AS.group_counts(env, AS.anchor_representations(env))
    s, g = env.valid_pairs()
    full = dict(zip(AS.ANCHORS, counts, strict=True))["actor_like"]
    assert full == len(s)  # the goal-keeping anchor merges no two valid pairs
    assert counts.min() >= int(torch.unique(s).numel())  # at least one group per state
