"""Tests of repro.papers.meta_marl (paper 12, D²TR): losses against independent formulas, MPE physics by hand,
the behaviour policy against scipy's assignment solver, data determinism, labellers, decentralization, and the
statistics the claims read (probe items, the leakage statistic, the raw-transition control, seed margins and the
paired return gaps) against hand-worked cases."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from repro.common.seeding import derive
from repro.papers.meta_marl import (
    BC,
    D2TR,
    ORACLE,
    RAW,
    TASK_EMBEDDING,
    AgentTrajectories,
    ConditionedPolicy,
    CoopNavEnv,
    D2TRConfig,
    TrajEncoder,
    collect_dataset,
    distill_loss,
    evaluate,
    hsic,
    info_nce,
    kmeans_roles,
    make_tasks,
    probe_accuracy,
    probe_correct,
    raw_role_features,
    return_study,
    role_study,
    sample_contexts,
    scripted_policy,
    scripted_role_labeller,
    scripted_variant,
    seed_study,
    train_d2tr_lite,
    train_representations,
)
from repro.papers.meta_marl.experiment import Leakage, ReturnStudy, SeedStudy
from repro.papers.meta_marl.method import Actor, trajectory_summaries
from repro.papers.meta_marl.problems import N_ACTIONS, Physics, scripted_step

torch.set_default_dtype(torch.float32)


# ------------------------------------------------------------------ losses
def test_info_nce_is_cross_entropy_on_similarity_logits():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 7, 5, generator=g), torch.randn(3, 7, 5, generator=g)
    tau = 0.3
    ref = torch.stack([F.cross_entropy(torch.einsum("id,jd->ij", q[s], k[s]) / tau, torch.arange(7))
                       for s in range(3)]).mean()
    assert torch.allclose(info_nce(q, k, tau), ref, atol=1e-6)


def test_info_nce_is_log_batch_for_unrelated_embeddings_and_bounds_mi():
    g = torch.Generator().manual_seed(1)
    B = 64
    q = F.normalize(torch.randn(B, 16, generator=g), dim=-1)
    k = F.normalize(torch.randn(B, 16, generator=g), dim=-1)
    loss = float(info_nce(q, k, temperature=100.0))  # random init: every logit ~ equal
    assert abs(loss - math.log(B)) < 1e-3
    perfect = float(info_nce(q, q, temperature=0.01))
    assert 0 <= perfect < 1e-3  # the MI bound log B − loss never exceeds log B
    assert math.log(B) - perfect <= math.log(B) + 1e-9


def test_distill_loss_moves_only_the_student():
    g = torch.Generator().manual_seed(2)
    zl = F.normalize(torch.randn(8, 4, generator=g), dim=-1).requires_grad_()
    zc = F.normalize(torch.randn(8, 4, generator=g), dim=-1).requires_grad_()
    loss = distill_loss(zl, zc, 0.2)
    ref = info_nce(zl, zc.detach(), 0.2) + (1 - F.cosine_similarity(zl, zc, dim=-1)).mean()
    assert torch.allclose(loss, ref)
    loss.backward()
    assert zl.grad is not None and zc.grad is None


def _naive_hsic(x: np.ndarray, y: np.ndarray, sx: float, sy: float) -> float:
    """Gretton et al. (2005), the biased estimator as explicit O(n²)/O(n³) sums."""
    n = len(x)
    K = np.array([[math.exp(-np.sum((x[i] - x[j]) ** 2) / (2 * sx * sx)) for j in range(n)] for i in range(n)])
    L = np.array([[math.exp(-np.sum((y[i] - y[j]) ** 2) / (2 * sy * sy)) for j in range(n)] for i in range(n)])
    t1 = sum(K[i, j] * L[i, j] for i in range(n) for j in range(n))
    t2 = sum(K[i, j] * L[i, q] for i in range(n) for j in range(n) for q in range(n))
    t3 = K.sum() * L.sum()
    return (t1 - 2 * t2 / n + t3 / n**2) / (n - 1) ** 2


def test_hsic_matches_the_naive_formula():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(12, 3, generator=g, dtype=torch.float64)
    y = x[:, :2] ** 2 + 0.3 * torch.randn(12, 2, generator=g, dtype=torch.float64)
    got = float(hsic(x, y, sigma_x=1.3, sigma_y=0.7))
    assert got == pytest.approx(_naive_hsic(x.numpy(), y.numpy(), 1.3, 0.7), rel=1e-10)


def test_hsic_near_zero_for_independent_and_large_for_identical_samples():
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(400, 4, generator=g), torch.randn(400, 4, generator=g)
    indep, same = float(hsic(x, y)), float(hsic(x, x))
    assert indep < 2e-3 and same > 0.02 and same > 20 * indep


def test_losses_reject_bad_input():
    with pytest.raises(ValueError):
        info_nce(torch.zeros(3, 4), torch.zeros(2, 4))
    with pytest.raises(ValueError):
        info_nce(torch.zeros(3, 4), torch.zeros(3, 4), temperature=0)
    with pytest.raises(ValueError):
        hsic(torch.full((5, 2), float("nan")), torch.zeros(5, 2))


# ------------------------------------------------------------------ physics
def test_one_euler_step_by_hand():
    env = CoopNavEnv(2, 3, (0.3, -0.4), 1)
    pos = torch.tensor([[[0.0, 0.0], [1.0, 1.0]]])  # far apart: no contact
    vel = torch.tensor([[[0.2, -0.1], [0.0, 0.5]]])
    lm = torch.tensor([[[0.5, 0.5], [-1.0, 0.0], [1.0, 1.0]]])
    env.set_state(pos, vel, lm)
    _, r = env.step(torch.tensor([[1, 4]]))  # agent 0 +x, agent 1 −y
    u = np.array([[1.0, 0.0], [0.0, -1.0]])
    v = vel[0].numpy() * 0.75 + (5.0 * u + np.array([0.3, -0.4])) * 0.1
    p = pos[0].numpy() + 0.1 * v
    assert np.allclose(env.vel[0].numpy(), v, atol=1e-6) and np.allclose(env.pos[0].numpy(), p, atol=1e-6)
    d = np.linalg.norm(p[:, None, :] - lm[0].numpy()[None], axis=-1)
    assert float(r) == pytest.approx(-d.min(0).sum(), abs=1e-5)


def test_contact_force_is_mpes_and_conserves_momentum():
    phys = Physics(damping=0.0, max_speed=None)
    env = CoopNavEnv(3, 4, (0.0, 0.0), 2, physics=phys, dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    pos = 0.2 * torch.randn(2, 3, 2, generator=g, dtype=torch.float64)  # overlapping agents
    vel = torch.randn(2, 3, 2, generator=g, dtype=torch.float64)
    env.set_state(pos, vel, torch.zeros(2, 4, 2, dtype=torch.float64))
    f = env.contact_forces()
    for b, a in itertools.product(range(2), range(3)):  # MPE get_collision_force, pair by pair
        ref = np.zeros(2)
        for c in range(3):
            if c != a:
                dp = (pos[b, a] - pos[b, c]).numpy()
                dist = np.linalg.norm(dp)
                pen = np.logaddexp(0, -(dist - 0.3) / 1e-3) * 1e-3
                ref += 100.0 * dp / dist * pen
        assert np.allclose(f[b, a].numpy(), ref, atol=1e-9)
    env.step(torch.zeros(2, 3, dtype=torch.long))
    assert torch.allclose(env.vel.sum(1), vel.sum(1), atol=1e-9)  # contacts are internal forces
    assert float(f.norm(dim=-1).max()) > 0.1


def test_speed_cap_and_far_agents_feel_no_contact():
    env = CoopNavEnv(2, 3, (0.0, 0.0), 1)
    env.set_state(torch.tensor([[[0.0, 0.0], [3.0, 0.0]]]), torch.zeros(1, 2, 2), torch.zeros(1, 3, 2))
    assert float(env.contact_forces().abs().max()) == 0.0
    for _ in range(40):
        env.step(torch.tensor([[1, 3]]))
        assert float(env.vel.norm(dim=-1).max()) <= 1.5 + 1e-5
    assert float(env.vel.norm(dim=-1).min()) == pytest.approx(1.5, abs=1e-4)  # saturated at the cap


def test_observation_and_sight():
    env = CoopNavEnv(3, 4, (0.0, 0.0), 1, sight=0.5)
    pos = torch.tensor([[[0.0, 0.0], [0.3, 0.0], [2.0, 0.0]]])
    obs = env.set_state(pos, torch.zeros(1, 3, 2), torch.ones(1, 4, 2))
    assert obs.shape == (1, 3, env.obs_dim)
    o0 = obs[0, 0]
    assert torch.allclose(o0[4:12], (torch.ones(4, 2) - pos[0, 0]).reshape(-1))
    assert torch.allclose(o0[12:16], torch.tensor([0.3, 0.0, 0.0, 0.0]))  # agent 1 seen, agent 2 hidden
    assert torch.allclose(o0[16:18], torch.tensor([1.0, 0.0]))


def test_env_rejects_bad_input():
    with pytest.raises(ValueError):
        CoopNavEnv(3, 4, (float("nan"), 0.0), 2)
    env = CoopNavEnv(3, 4, (0.0, 0.0), 2)
    env.reset()
    with pytest.raises(ValueError):
        env.step(torch.full((2, 3), N_ACTIONS))
    with pytest.raises(ValueError):
        CoopNavEnv(3, 4, (0.0, 0.0), 2, decoy=torch.tensor([0, 9]))


def test_scripted_policy_uses_the_optimal_assignment():
    from scipy.optimize import linear_sum_assignment

    tasks = make_tasks([0.0], 4)
    env = CoopNavEnv(3, 4, tasks.wind.repeat(8, 1)[:8], 8, decoy=torch.arange(8) % 4)
    g = torch.Generator().manual_seed(6)
    env.reset(g)
    a = scripted_policy(env, 0.0, g, rule="assignment")
    for b in range(8):
        paying = [j for j in range(4) if j != b % 4]
        cost = torch.cdist(env.pos[b], env.landmarks[b, paying]).numpy()
        rows, cols = linear_sum_assignment(cost)
        for i, c in zip(rows, cols, strict=True):
            des = env.landmarks[b, paying[c]] - env.pos[b, i]  # velocity is zero after reset
            ax = int(des.abs().argmax())
            assert int(a[b, i]) == 1 + 2 * ax + int(des[ax] < 0)


# ------------------------------------------------------------------ data
def test_dataset_is_deterministic_and_shaped():
    tasks = make_tasks([30.0, 120.0], 4)
    a = collect_dataset(tasks, 3, 6, seed=7)
    b = collect_dataset(tasks, 3, 6, seed=7)
    c = collect_dataset(tasks, 3, 6, seed=8)
    assert torch.equal(a.obs, b.obs) and torch.equal(a.act, b.act) and torch.equal(a.rew, b.rew)
    assert not torch.equal(a.obs, c.obs)
    assert a.obs.shape == (8, 3, 7, 3, 4 + 8 + 6) and a.act.shape == (8, 3, 6, 3)
    assert a.transitions().shape == (8, 3, 6, 3, 18 + N_ACTIONS + 1 + 18 + 4)


@pytest.mark.parametrize("rule,cover", [("assignment", 0.8), ("local", 0.5)])
def test_the_behaviour_covers_the_paying_landmarks(rule, cover):
    tasks = make_tasks([60.0], 4, magnitude=0.0)
    ds = collect_dataset(tasks, 20, 25, eps_levels=(0.0,), rule=rule, seed=9)
    traj = AgentTrajectories.of(ds)
    d = traj.landmark_rel[..., -1, :, :].norm(dim=-1)  # (T, E, N, L)
    covered = (d.min(2).values < 0.2).float().mean((1,))  # per task, per landmark
    for t in range(4):
        assert float(covered[t, t]) < 0.2  # the decoy is left alone (up to landmarks placed next to it)
        assert float(torch.cat([covered[t, :t], covered[t, t + 1:]]).min()) > cover
    assert (ds.target != ds.tasks.decoy[:, None, None, None]).all()


def test_local_rule_uses_only_what_the_agent_sees():
    env = CoopNavEnv(3, 4, (0.0, 0.0), 1, decoy=torch.tensor([3]), sight=0.5)
    lm = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.1, 0.1]]])
    g = torch.Generator().manual_seed(0)
    # agent 0 at (0.2, 0): nearest paying landmark 0; agent 1 at (0.05, 0) is visible and closer to it
    env.set_state(torch.tensor([[[0.2, 0.0], [0.05, 0.0], [3.0, 3.0]]]), torch.zeros(1, 3, 2), lm)
    _, tgt = scripted_step(env, 0.0, g)
    assert tgt[0].tolist()[:2] == [1, 0]  # agent 0 yields landmark 0 to agent 1; nobody picks the decoy 3
    env.set_state(torch.tensor([[[0.2, 0.0], [0.05, 0.0], [-2.0, 2.5]]]), torch.zeros(1, 3, 2), lm)
    assert scripted_step(env, 0.0, g)[1][0, :2].tolist() == [1, 0]  # moving an unseen agent changes nothing


def test_contexts_are_distinct_episodes_and_glob_is_the_team_view():
    tasks = make_tasks([0.0], 4)
    ds = collect_dataset(tasks, 6, 5, seed=10)
    trans = ds.transitions()
    g = torch.Generator().manual_seed(11)
    ctx = sample_contexts(trans, torch.tensor([[1, 2]]), torch.tensor([[3, 5]]), 5, g)
    assert ctx.local.shape == (1, 2, 3, 5, trans.shape[-1]) and ctx.glob.shape == (1, 2, 15, trans.shape[-1])
    assert ctx.mask[0, 0].tolist() == [True] * 3 + [False] * 2
    assert torch.equal(ctx.glob[0, 0].reshape(5, 3, -1), ctx.local[0, 0].permute(1, 0, 2))
    flat = trans[1].reshape(-1, 3, trans.shape[-1])
    rows = [int(torch.nonzero((flat == ctx.glob[0, 0].reshape(5, 3, -1)[j]).all(-1).all(-1))[0]) // 5
            for j in range(5)]
    assert len(set(rows)) == 5  # five different episodes
    with pytest.raises(ValueError):
        sample_contexts(trans, torch.tensor([0]), 9, 9, g)


# ------------------------------------------------------------------ encoders and roles
def test_prefix_embeddings_match_the_encoder_on_each_prefix():
    torch.manual_seed(0)
    enc = TrajEncoder(6, 16, 4)
    x = torch.randn(2, 5, 6)
    pre = enc.prefix(x)
    for t in range(1, 6):
        assert torch.allclose(pre[:, t], enc(x[:, :t]), atol=1e-6)
    mask = torch.tensor([[True, True, False, False, False]] * 2)
    assert torch.allclose(enc(x, mask), pre[:, 2], atol=1e-6)
    with pytest.raises(ValueError):
        enc(x, torch.zeros(2, 5, dtype=torch.bool))


def _canned() -> AgentTrajectories:
    S = 5
    lm = torch.tensor([[0.0, 0.0], [2.0, 2.0]])
    starts = torch.tensor([[0.5, 0.0], [1.2, 0.0], [0.0, 0.9]])
    ends = torch.tensor([[0.05, 0.0], [0.1, 0.0], [0.0, 0.6]])  # near-coverer, far-coverer, idle
    w = torch.linspace(0, 1, S)[None, :, None]
    pos = starts[:, None] * (1 - w) + ends[:, None] * w
    return AgentTrajectories(pos, lm[None, None] - pos[:, :, None, :])


def test_scripted_labeller_rules_and_determinism():
    traj = _canned()
    lab = scripted_role_labeller(traj)
    assert lab.tolist() == [0, 1, 2]
    assert torch.equal(lab, scripted_role_labeller(_canned()))
    perm = torch.tensor([2, 0, 1])
    assert scripted_role_labeller(AgentTrajectories(traj.pos[perm], traj.landmark_rel[perm])).tolist() == [2, 0, 1]
    assert trajectory_summaries(traj)[0].startswith("ends 0.05 from landmark 0")


def test_kmeans_roles_recovers_separated_clusters():
    from sklearn.metrics import adjusted_rand_score

    g = torch.Generator().manual_seed(12)
    centres = torch.tensor([[0.0, 0.0, 0.0], [5.0, 0.0, 0.0], [0.0, 5.0, 5.0]])
    truth = torch.arange(3).repeat_interleave(30)
    x = centres[truth] + 0.1 * torch.randn(90, 3, generator=g)
    lab = kmeans_roles(x, 3, seed=0)
    assert adjusted_rand_score(truth.numpy(), lab.numpy()) == 1.0
    assert torch.equal(lab, kmeans_roles(x, 3, seed=0))


# ------------------------------------------------------------------ decentralization
def _tiny():
    tasks = make_tasks([30.0, 210.0], 4)
    ds = collect_dataset(tasks, 8, 8, seed=13)
    cfg = D2TRConfig(teacher_steps=3, student_steps=3, role_steps=3, policy_steps=3, k_max=4, hidden=16,
                     hsic_samples=16)
    return tasks, ds, train_d2tr_lite(ds, cfg)


class _Spy(TrajEncoder):
    def __init__(self, inner: TrajEncoder):
        super().__init__(inner.mu.shape[0], 16, 16)
        self.load_state_dict(inner.state_dict())
        self.seen: list[tuple[int, ...]] = []

    def forward(self, x, mask=None):
        self.seen.append(tuple(x.shape))
        return super().forward(x, mask)


def test_decentralized_encoder_never_sees_global_context():
    tasks, ds, out = _tiny()
    pol = out["policy"]
    g = torch.Generator().manual_seed(14)
    ctx = sample_contexts(ds.transitions(), torch.tensor([0, 5]), 4, 4, g)
    z = pol.task_embedding(ctx.local, ctx.mask)
    poisoned = torch.full_like(ctx.glob, float("nan"))
    assert torch.equal(z, pol.task_embedding(ctx.local, ctx.mask, poisoned))  # global context is never read
    other = ctx.local.clone()
    other[:, 1:] = torch.randn_like(other[:, 1:])  # change the other agents' views
    assert torch.equal(pol.task_embedding(other, ctx.mask)[:, 0], z[:, 0])
    spy = _Spy(out["student"])
    res = evaluate(ConditionedPolicy(pol.actor, spy, pol.role_encoder, name="spy"), tasks, 3, episodes=2, steps=4)
    assert spy.seen == [(len(tasks) * 2, 3, 3, ds.transitions().shape[-1])]  # (worlds, agents, own K, F)
    assert res.returns.shape == (len(tasks), 2) and np.isfinite(res.returns).all()


def test_oracle_needs_the_global_context_and_bc_ignores_context():
    tasks, ds, out = _tiny()
    oracle = ConditionedPolicy(out["policy"].actor, out["teacher"], centralized=True)
    ctx = sample_contexts(ds.transitions(), torch.tensor([0]), 4, 4, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError):
        oracle.task_embedding(ctx.local, ctx.mask)
    bc = ConditionedPolicy(Actor(ds.obs.shape[-1], 0, 4, 8), name="bc")
    assert evaluate(bc, tasks, 1, episodes=2, steps=3).returns.shape == (len(tasks), 2)


# ------------------------------------------------------------------ what the claims read
def test_probe_items_are_per_point_and_average_to_the_accuracy():
    g = torch.Generator().manual_seed(3)
    y = torch.arange(2).repeat_interleave(40)
    x = torch.randn(80, 2, generator=g) + 6.0 * y[:, None]  # two blobs 6 apart: every test point is named
    right = probe_correct(x[::2], y[::2], x[1::2], y[1::2])
    assert right.dtype == bool and right.shape == (40,) and right.all()
    wrong = probe_correct(x[::2], y[::2], x[1::2], 1 - y[1::2])  # the test labels swapped: every point missed
    assert not wrong.any()
    noisy = torch.randint(0, 2, (40,), generator=g)
    assert probe_accuracy(x[::2], y[::2], x[1::2], noisy) == probe_correct(x[::2], y[::2], x[1::2], noisy).mean()


def test_leakage_statistic_is_the_largest_excess_over_chance():
    leak = Leakage(0.0, 0.0, 0.0, 0.1, 0.5, 0.25)
    joint, wind, decoy = np.array([1, 0, 0, 0]), np.array([1, 1, 0, 0]), np.array([1, 1, 0, 0])
    # excesses 0.25 − 0.1 = 0.15, 0.5 − 0.5 = 0, 0.5 − 0.25 = 0.25: the decoy's counts
    assert leak.max_excess(joint, wind, decoy) == pytest.approx(0.25)
    assert leak.max_excess(np.ones(4), wind, decoy) == pytest.approx(0.9)


def test_raw_role_features_put_transitions_in_time_order_with_their_clock():
    x = torch.tensor([[[20.0, 21.0], [0.0, 1.0], [10.0, 11.0]]])  # steps 2, 0, 1
    ts = torch.tensor([[2, 0, 1]])
    expected = torch.tensor([[0.0, 1.0, 0.0, 10.0, 11.0, 0.25, 20.0, 21.0, 0.5]])
    assert torch.equal(raw_role_features(x, ts, horizon=4), expected)


def test_seed_study_margin_and_gap_by_hand():
    acc = {"distilled": {"wind": np.array([[0.7, 0.9], [0.85, 0.84]])},
           "local-only": {"wind": np.array([[0.9, 1.0], [0.9, 1.0]])}}
    st = SeedStudy([0, 1], [1, 8], acc, np.zeros((2, 2)))
    # seed 0: 0.9 − max(0.8, 0.7) = 0.1; seed 1: 0.84 − max(0.8, 0.85) = −0.01 (worse than one transition)
    assert np.allclose(st.margin("distilled", "wind", 0.8), [0.1, -0.01])
    assert np.allclose(st.gap("wind"), [(0.7 + 0.9 - 1.9) / 2, (0.85 + 0.84 - 1.9) / 2])


def test_return_gaps_are_paired_by_world():
    rng = np.random.default_rng(0)
    base = rng.normal(-40, 5, size=(3, 1, 6, 4))  # (seeds, policy seeds, tasks, episodes): worlds vary a lot
    shift = np.array([1.0, 2.0, 3.0])[:, None, None, None]
    other = base + shift + 0.01 * rng.normal(size=base.shape)
    rs = ReturnStudy(["a", "b"], [0, 1, 2], np.stack([other, base], 2))
    assert np.allclose(rs.gap("a", "b"), [1, 2, 3], atol=0.02)
    per_task = (other - base).mean((1, 3))
    se_by_hand = per_task.std(1, ddof=1) / math.sqrt(6)
    assert np.allclose(rs.paired_se("a", "b"), se_by_hand)
    a_task, b_task = other.mean((1, 3)), base.mean((1, 3))
    unpaired = np.hypot(a_task.std(1, ddof=1), b_task.std(1, ddof=1)) / math.sqrt(6)
    assert np.allclose(rs.unpaired_se("a", "b"), unpaired)
    assert (rs.paired_se("a", "b") < 0.05).all() and (rs.unpaired_se("a", "b") > 0.5).all()


def _study():
    tasks = make_tasks([30.0, 210.0], 4)
    ds = collect_dataset(tasks, 8, 8, seed=21)
    train, held = ds.episodes(slice(0, 6)), ds.episodes(slice(6, None))
    cfg = D2TRConfig(teacher_steps=3, student_steps=3, role_steps=3, policy_steps=3, k_max=4, hidden=16,
                     hsic_samples=16, hsic_weight=0.5)
    runs = [train_representations(train, held, D2TRConfig(**{**vars(cfg), "seed": s}), [1, 2], n_centroid=4,
                                  n_query=2) for s in (0, 1)]
    roles = role_study(train, held, runs[0].student, cfg, hsic_weights=[0.0, 0.5], n_probe=40)
    return train, held, cfg, runs, roles


def test_role_study_probes_every_representation_on_the_same_points():
    _, held, cfg, runs, roles = _study()
    names = [scripted_variant(0.0), scripted_variant(0.5), "KMeans", "random", TASK_EMBEDDING, RAW]
    assert list(roles.probes) == names
    sizes = {len(roles.correct[n][p]) for n in names for p in ("role", "task")}
    assert sizes == {len(roles.held_role)} and len(roles.held_role) == min(40, 8 * 2 * 3)
    for n in names:
        assert roles.probes[n]["role_probe"] == pytest.approx(roles.correct[n]["role"].mean())
    assert roles.majority == pytest.approx(np.bincount(roles.held_role).max() / len(roles.held_role))
    assert roles.maps[scripted_variant(0.5)].shape == (len(roles.held_role), 2)
    st = seed_study(runs, [0, 1])
    assert st.cos_local.shape == st.cos.shape == (2, 2) and (np.abs(st.cos_local) <= 1 + 1e-6).all()


def test_return_study_evaluates_every_policy_in_its_seeds_worlds():
    train, _, cfg, runs, roles = _study()
    ood = make_tasks([120.0], 4)
    rs = return_study(train, ood, runs, [0, 1], roles, cfg, context=2, episodes=2, steps=4, eval_seed=5)
    assert rs.returns.shape == (2, 1, 5, 4, 2) and rs.names[0] == BC and rs.names[-1] == ORACLE
    for name in (BC, D2TR, ORACLE):  # the first seed's worlds are evaluate's at eval_seed, for every policy
        again = evaluate(rs.policies[name], ood, 2, episodes=2, steps=4, seed=derive(5, "worlds", 0)).returns
        assert np.array_equal(again, rs.returns[0, 0, rs.names.index(name)])
    assert np.array_equal(rs.gap(BC, BC), np.zeros(2))
    with pytest.raises(ValueError):
        return_study(train, ood, runs[:1], [0, 1], roles, cfg)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_runs_on_cuda():
    tasks = make_tasks([30.0], 4, device="cuda")
    ds = collect_dataset(tasks, 8, 6, seed=0, device="cuda")
    cpu = collect_dataset(make_tasks([30.0], 4), 8, 6, seed=0)
    assert torch.allclose(ds.obs.cpu(), cpu.obs, atol=1e-4)
    out = train_d2tr_lite(ds, D2TRConfig(teacher_steps=2, student_steps=2, role_steps=2, policy_steps=2, k_max=4,
                                         hsic_samples=16))
    assert evaluate(out["policy"], tasks, 2, episodes=2, steps=3, device="cuda").returns.shape == (4, 2)
