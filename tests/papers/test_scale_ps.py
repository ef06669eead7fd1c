"""Tests of repro.papers.scale_ps (paper 14, SCALE) against independent references: numpy formulas, a slow
brute-force k-reciprocal Jaccard, hand-built clusters with closed-form penalties, scikit-learn's
average_precision_score with a literal per-query loop of the CUHK-SYSU protocol, a per-sample memory loop, and
CenterNet's focal loss written out per pixel."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import adjusted_rand_score, average_precision_score

from repro.papers.scale_ps import cluster, evaluate, experiment, memory, modules, synth

# ----------------------------------------------------------------------------------------------------- modules


def test_scr_matches_numpy_formula():
    x = torch.randn(3, 5, 4, 6, dtype=torch.float64)
    got = modules.SCR(lam=1e-4)(x).numpy()
    a = x.numpy()
    mu = a.mean(axis=(2, 3), keepdims=True)
    var = ((a - mu) ** 2).sum(axis=(2, 3), keepdims=True) / (4 * 6 - 1)
    y = (a - mu) ** 2 / (4 * (var + 1e-4)) + 0.5
    np.testing.assert_allclose(got, a / (1 + np.exp(-y)), rtol=1e-12)


def test_attention_and_msc_shapes_and_sdh_weight_zero_is_identity():
    torch.manual_seed(0)
    x = torch.randn(4, 8, 12, 6)
    assert modules.TripletAttention()(x).shape == x.shape
    assert modules.TripletAttention(no_spatial=True)(x).shape == x.shape
    assert modules.MultiScaleConv(8, 8)(x).shape == x.shape
    sdh0 = modules.SDH(8, weight=0.0)
    for mode in (sdh0.train, sdh0.eval):
        mode()
        assert torch.equal(sdh0(x), x)
    sdh1 = modules.SDH(8, weight=1.0)
    assert sdh1(x).shape == x.shape and not torch.allclose(sdh1(x), x)


def test_triplet_attention_matches_gates_written_out():
    """Each gate: Z-pool (max, mean) over one axis → 7×7 conv → BN → sigmoid, broadcast back along that axis."""
    torch.manual_seed(0)
    ta = modules.TripletAttention().eval()
    for g in (ta.cw, ta.hc, ta.hw):  # non-trivial BN statistics
        g.bn.running_mean.fill_(0.3)
        g.bn.running_var.fill_(2.0)
    x = torch.randn(2, 5, 9, 4)

    def gate(gm, z):  # z: (B, 2, P, Q) → (B, P, Q)
        return torch.sigmoid(gm.bn(gm.conv(z)))[:, 0]

    zpool = lambda t, d: torch.stack([t.amax(d), t.mean(d)], 1)  # noqa: E731
    g_cw = gate(ta.cw, zpool(x, 2))  # pool over H: (B, C, W)
    g_hc = gate(ta.hc, zpool(x, 3).transpose(2, 3))  # pool over W: plane (H, C)
    g_hw = gate(ta.hw, zpool(x, 1))  # pool over C: (B, H, W)
    ref = (x * g_cw[:, :, None, :] + x * g_hc.transpose(1, 2)[:, :, :, None] + x * g_hw[:, None]) / 3
    assert torch.allclose(ta(x), ref, atol=1e-6)


# ----------------------------------------------------------------------------------------------------- jaccard


def _brute_jaccard(f: np.ndarray, k1: int, k2: int) -> np.ndarray:
    """k-reciprocal encoding written out with Python sets (Zhong et al. 2017 / SpCL), dense min/max sums."""
    f = f / np.linalg.norm(f, axis=1, keepdims=True)
    n = len(f)
    d = ((f[:, None] - f[None]) ** 2).sum(-1)
    rank = np.argsort(d - 2 * np.eye(n), axis=1, kind="stable")[:, :k1]

    def recip(i, k):
        return [j for j in rank[i, : k + 1] if i in rank[j, : k + 1]]

    half = int(np.around(k1 / 2))
    v = np.zeros((n, n))
    for i in range(n):
        r = recip(i, k1)
        expanded = set(r)
        for c in r:
            rc = recip(c, half)
            if len(set(rc) & set(r)) > 2 / 3 * len(rc):
                expanded |= set(rc)
        e = sorted(expanded)
        w = np.exp(-(2 - 2 * f[i] @ f[e].T))
        v[i, e] = w / w.sum()
    if k2 != 1:
        v = np.stack([v[rank[i, :k2]].mean(0) for i in range(n)])
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            out[i, j] = 1 - np.minimum(v[i], v[j]).sum() / np.maximum(v[i], v[j]).sum()
    return out


@pytest.mark.parametrize(("k1", "k2"), [(10, 4), (6, 1), (20, 6)])
def test_jaccard_matches_brute_force_on_40_points(k1, k2):
    rng = np.random.default_rng(k1)
    f = rng.normal(size=(40, 8)) + np.repeat(rng.normal(size=(5, 8)) * 2, 8, axis=0)
    got = cluster.jaccard_distance(torch.tensor(f, dtype=torch.float64), k1, k2).numpy()
    np.testing.assert_allclose(got, _brute_jaccard(f, k1, k2), atol=1e-10)
    assert np.array_equal(got, got.T) and np.all(np.diag(got) == 0) and got.min() >= 0


def test_jaccard_rejects_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        cluster.jaccard_distance(torch.tensor([[0.0, 1.0], [float("nan"), 1.0], [1.0, 0.0]]), 2, 1)
    with pytest.raises(ValueError, match="k1"):
        cluster.jaccard_distance(torch.randn(5, 3), 10, 2)
    with pytest.raises(TypeError, match="floating"):
        cluster.jaccard_distance(torch.arange(12).view(6, 2), 3, 1)


# ------------------------------------------------------------------------------------------- BCR split / merge


def _toy(seed=0):
    """Cluster A: 12 points in two far modes (a_m ≈ 0.84); B: 24 tight points (a_m < 0.5, too big to vote);
    C: a 5-point fragment next to B (b_m < 0.4). Labels 0, 1, 2."""
    rng = np.random.default_rng(seed)
    e = np.eye(8)
    a = np.vstack([e[0] + 0.05 * rng.normal(size=(6, 8)), e[1] + 0.05 * rng.normal(size=(6, 8))])
    b = e[2] + 0.05 * rng.normal(size=(24, 8))
    c = (e[2] + 0.25 * e[3]) + 0.05 * rng.normal(size=(5, 8))
    f = np.vstack([a, b, c])
    f /= np.linalg.norm(f, axis=1, keepdims=True)
    labels = np.repeat([0, 1, 2], [12, 24, 5])
    return torch.tensor(f, dtype=torch.float32), labels, np.repeat([0, 1], 6)


def test_split_matrix_closed_form_and_support():
    f, labels, mode = _toy()
    x = f.numpy().astype(np.float64)
    d = np.linalg.norm(x[:, None] - x[None], axis=-1)
    a_m = (d[:12, :12].sum(1) / 11).mean()
    assert a_m > 0.5 and (d[12:36, 12:36].sum(1) / 23).mean() < 0.5 and 0.4 / 0.5 * 0.5**a_m < 0.5
    ms = cluster.split_matrix(f, labels, penalty_eps=0.4, lam=0.5).numpy()
    expect = np.zeros_like(ms)
    cross = mode[:, None] != mode[None, :]
    expect[:12, :12][cross] = min(0.4 / 0.5 * 0.5**a_m, 0.5)
    np.testing.assert_allclose(ms, expect, atol=1e-6)
    clipped = cluster.split_matrix(f, labels, penalty_eps=2.0, lam=0.5).numpy()
    assert np.allclose(clipped[:12, :12][cross], 0.5) and np.all(clipped[12:] == 0)


def test_merge_matrix_closed_form_and_support():
    f, labels, _ = _toy()
    x = f.numpy().astype(np.float64)
    d = np.linalg.norm(x[:, None] - x[None], axis=-1)
    b_m = d[36:, 12:36].mean(1).mean()  # the fragment's members all vote for B
    assert b_m < 0.4
    mm = cluster.merge_matrix(f, labels, penalty_eps=0.2, lam=0.5).numpy()
    expect = np.zeros_like(mm)
    val = -min(0.2 / 0.5 * 0.5 ** (1 - b_m), 0.5)
    expect[36:, 12:36] = val
    expect[12:36, 36:] = val
    np.testing.assert_allclose(mm, expect, atol=1e-6)
    assert np.allclose(cluster.merge_matrix(f, labels)[36:, 12:36].numpy(), -0.5)  # default ε = λ: clipped


def test_corrected_distance_is_symmetric_clipped_zero_diagonal():
    d = torch.rand(6, 6)
    d = (d + d.T) / 2
    m = torch.zeros(6, 6)
    m[0, 1] = -2.0
    out = cluster.corrected_distance(d, m, torch.zeros(6, 6))
    assert torch.equal(out, out.T) and torch.all(out.diagonal() == 0) and out.min() >= 0
    assert out[0, 1] == max(0.0, float(d[0, 1]) - 1.0)


def test_bcr_recovers_planted_clusters_and_acts_only_in_its_regimes():
    f, t = experiment.planted_clusters(10, 10, 32, 0.2, np.random.default_rng(0))
    l0, l1 = cluster.bcr_labels(f, k1=10, k2=4)
    assert adjusted_rand_score(t, l1) == 1.0 and np.array_equal(l0, l1)
    mech = experiment.bcr_mechanics(0)
    assert mech.noop[2]
    assert mech.split[1] > mech.split[0] and len(mech.split[2]) == 1 and mech.split[2][0] >= 0.5
    assert mech.split_boundary[0] == mech.split_boundary[1] and not mech.split_boundary[2]
    assert mech.merge[1] > mech.merge[0] and all(b <= 0.4 for b in mech.merge[2])
    assert mech.merge_boundary[0] == mech.merge_boundary[1] and not mech.merge_boundary[2]


def test_phase_diagram_cells_are_independent_draws_recomputed_directly():
    spreads, glues, seps = [0.2, 0.5], [0.3, 0.7], [0.4]
    P = experiment.bcr_phase_diagram(spreads, glues, seps, reps=2, seed=3)
    assert P.ari0["plain"].shape == (2, 2) and P.ari1["look-alike pairs"].shape == (2, 2, 2)
    assert P.ari0["two-mode identities"].shape == (2, 2, 1)
    # one cell of each regime, written out: its own generator, DBSCAN and BCR labels, ARI against the truth
    for regime, k, kw, (r, i, j) in [("plain", 0, {}, (1, 1, 0)),
                                     ("look-alike pairs", 1, dict(glued=4, glue=0.7), (0, 1, 1)),
                                     ("two-mode identities", 2, dict(bimodal=4, sep=0.4), (1, 0, 0))]:
        f, t = experiment.planted_clusters(16, 12, 32, spreads[i], np.random.default_rng([3, r, i, j, k]), **kw)
        l0, l1 = cluster.bcr_labels(f, k1=12, k2=4, seed=3)
        cell = (r, i) if regime == "plain" else (r, i, j)
        assert P.ari0[regime][cell] == adjusted_rand_score(t, cluster.pseudo_ids(l0))
        assert P.ari1[regime][cell] == adjusted_rand_score(t, cluster.pseudo_ids(l1))
    d = P.ari1["look-alike pairs"] - P.ari0["look-alike pairs"]
    np.testing.assert_allclose(P.d_glue, d.mean(0))
    bcr, dbscan = P.items("look-alike pairs")
    assert bcr.size == 8 and np.array_equal(bcr - dbscan, d.ravel())
    assert P.helped_hurt("look-alike pairs") == (np.mean(d > 0.02), np.mean(d < -0.02))
    with pytest.raises(ValueError, match="regime"):
        P.items("glued")
    with pytest.raises(ValueError, match="reps"):
        experiment.bcr_phase_diagram(spreads, glues, seps, reps=0, seed=0)


def test_pseudo_ids_give_outliers_their_own_ids():
    assert cluster.pseudo_ids(np.array([1, -1, 0, -1, 1])).tolist() == [1, 2, 0, 3, 1]


# ------------------------------------------------------------------------------------------------- evaluation


def _slow_search(qf, qp, qs, df, db, ds, gb, gp, gs):
    """The CUHK-SYSU loop, literally: per query, per gallery scene, the first det (by similarity) over the IoU
    threshold is the true positive; AP from scikit-learn times the recall rate."""
    aps, tops = [], []
    for i in range(len(qf)):
        y_true, y_score, count_gt, count_tp = [], [], 0, 0
        for s in np.unique(np.concatenate([ds, gs])):
            if s == qs[i]:
                continue
            gt = gb[(gs == s) & (gp == qp[i])]
            count_gt += len(gt) > 0
            sel = ds == s
            if not sel.any():
                continue
            sim = df[sel] @ qf[i]
            label = np.zeros(len(sim), int)
            if len(gt):
                w, h = gt[0, 2] - gt[0, 0], gt[0, 3] - gt[0, 1]
                thr = min(0.5, w * h / ((w + 10) * (h + 10)))
                for j in np.argsort(-sim, kind="stable"):
                    if synth._iou(db[sel][j][None], gt[:1])[0, 0] >= thr:
                        label[j] = 1
                        count_tp += 1
                        break
            y_true += list(label)
            y_score += list(sim)
        if count_gt == 0:
            continue
        rec = count_tp / count_gt
        aps.append(0.0 if count_tp == 0 else average_precision_score(y_true, y_score) * rec)
        tops.append(np.asarray(y_true)[np.argmax(y_score)])
    return 100 * np.mean(aps), 100 * np.mean(tops), np.array(aps)


def test_person_search_map_matches_sklearn_loop_with_recall_factor():
    rng = np.random.default_rng(0)
    n_scenes, dim = 12, 6
    gb, gp, gs = [], [], []
    for s in range(n_scenes):
        for p in rng.choice(8, size=3, replace=False):
            x, y = rng.uniform(0, 200), rng.uniform(0, 100)
            w, h = rng.uniform(8, 40), rng.uniform(20, 90)
            gb.append([x, y, x + w, y + h])
            gp.append(p)
            gs.append(s)
    gb, gp, gs = np.array(gb, np.float32), np.array(gp), np.array(gs)
    keep = rng.random(len(gb)) > 0.2  # missed detections lower the recall factor
    jitter = rng.normal(0, 3, size=(int(keep.sum()), 4)).astype(np.float32)
    fp = np.array([[10, 10, 30, 60]] * 5, np.float32)  # false positives
    db = np.vstack([gb[keep] + jitter, fp])
    ds = np.concatenate([gs[keep], rng.integers(0, n_scenes, 5)])
    dets_pid = np.concatenate([gp[keep], rng.integers(0, 8, 5)])
    centres = rng.normal(size=(8, dim))
    df = centres[dets_pid] + 0.9 * rng.normal(size=(len(db), dim))
    df /= np.linalg.norm(df, axis=1, keepdims=True)
    qf = centres[gp] + 0.9 * rng.normal(size=(len(gp), dim))
    qf /= np.linalg.norm(qf, axis=1, keepdims=True)
    ref_map, ref_top, ref_ap = _slow_search(qf, gp, gs, df, db, ds, gb, gp, gs)
    t = lambda a: torch.as_tensor(a)  # noqa: E731
    got = evaluate.person_search_map(t(qf), t(gp), t(gs), t(df), t(db), t(ds), t(gb), t(gp), t(gs), chunk=7)
    assert got.recall.min() < 1.0
    np.testing.assert_allclose(got.ap, ref_ap, atol=1e-9)
    assert got.mAP == pytest.approx(ref_map, abs=1e-9) and got.top1 == pytest.approx(ref_top, abs=1e-9)


def test_average_precision_with_ties_matches_sklearn():
    rng = np.random.default_rng(1)
    s = rng.integers(0, 4, size=(5, 25)).astype(np.float64)
    y = rng.random((5, 25)) < 0.3
    y[:, 0] = True
    got = evaluate.average_precision(torch.tensor(s), torch.tensor(y)).numpy()
    np.testing.assert_allclose(got, [average_precision_score(y[i], s[i]) for i in range(5)], atol=1e-12)


# ----------------------------------------------------------------------------------------------------- memory


def test_cluster_memory_loss_and_sequential_update():
    torch.manual_seed(0)
    p = torch.randn(6, 4)
    mem = memory.ClusterMemory(p, temp=0.05, momentum=0.3)
    x = F.normalize(torch.randn(9, 4), dim=1).requires_grad_()
    t = torch.tensor([1, 2, 1, 1, 0, 2, 5, 1, 3])
    ref = F.normalize(p, dim=1)
    loss = mem(x, t)
    assert loss.item() == pytest.approx(F.cross_entropy(x.detach() @ ref.T / 0.05, t).item(), rel=1e-6)
    loss.backward()  # the gradient used the proxies as they were before the update
    x2 = x.detach().clone().requires_grad_()
    F.cross_entropy(x2 @ ref.T / 0.05, t).backward()
    assert torch.allclose(x.grad, x2.grad)
    seq = ref.clone()
    for xi, yi in zip(x.detach(), t, strict=True):
        seq[yi] = 0.3 * seq[yi] + 0.7 * xi
        seq[yi] /= seq[yi].norm()
    assert torch.allclose(mem.proxies, seq, atol=1e-6)
    with pytest.raises(ValueError, match="targets"):
        mem(x.detach(), torch.tensor([6] * 9))


# ------------------------------------------------------------------------------------------------------ synth


def test_renderer_is_deterministic_and_box_is_tight():
    ids = synth.make_identities(5, 3)
    assert ids == synth.make_identities(5, 3) and ids != synth.make_identities(5, 4)
    nz = synth.sample_nuisance(np.random.default_rng(0))
    a = synth.render_person(ids[0], 50, nz, squash=0.8)
    assert np.array_equal(a, synth.render_person(ids[0], 50, nz, squash=0.8))
    alpha = a[..., 3]
    assert a.shape[0] == 50 and alpha[0].max() > 0 and alpha[-1].max() > 0
    assert alpha[:, 0].max() > 0 and alpha[:, -1].max() > 0
    with pytest.raises(ValueError, match="height"):
        synth.render_person(ids[0], 2.0)


def test_split_is_deterministic_and_independent_of_global_generators():
    ids = synth.make_identities(12, 0)
    torch.manual_seed(1)
    np.random.seed(1)  # noqa: NPY002 (checks that the legacy global state is not used)
    a = synth.make_split(synth.TARGET, 4, ids, seed=7)
    torch.manual_seed(2)
    np.random.seed(2)  # noqa: NPY002
    torch.rand(10)
    b = synth.make_split(synth.TARGET, 4, ids, seed=7)
    for field in ("images", "boxes", "pids", "scene"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    c = synth.make_split(synth.TARGET, 4, ids, seed=8)
    assert not np.array_equal(a.images, c.images)
    rows, cols = synth.TARGET.scene_hw
    h = a.boxes[:, 3] - a.boxes[:, 1]
    assert a.images.shape[1:3] == (rows, cols)
    assert (a.boxes[:, :2] >= 0).all() and (a.boxes[:, 2] <= cols).all() and (a.boxes[:, 3] <= rows).all()
    assert (h >= 20 - 1).all() and (h <= 45 + 1).all()
    for s in range(4):  # each identity at most once per scene
        p = a.pids[a.scene == s]
        assert len(p) == len(set(p.tolist()))
    with pytest.raises(ValueError, match="identities"):
        synth.make_split(synth.TARGET, 2, ids[:3], seed=0)


def test_crop_rois_matches_direct_resampling():
    ids = synth.make_identities(8, 1)
    sp = synth.make_split(synth.SOURCE, 3, ids, seed=0)
    crops = synth.crop_rois(sp, (16, 8), sampling=1)
    k = 2
    img = torch.as_tensor(sp.images[sp.scene[k]]).permute(2, 0, 1).float()[None] / 255
    x1, y1, x2, y2 = sp.boxes[k]
    ys = y1 + (np.arange(16) + 0.5) / 16 * (y2 - y1)  # sample centres in pixels, bilinear
    xs = x1 + (np.arange(8) + 0.5) / 8 * (x2 - x1)
    ref = np.zeros((3, 16, 8))
    im = img[0].numpy()
    for i, yy in enumerate(ys):
        for j, xx in enumerate(xs):
            y0, x0 = np.clip(np.floor(yy - 0.5), 0, im.shape[1] - 1), np.clip(np.floor(xx - 0.5), 0, im.shape[2] - 1)
            y1_, x1_ = min(y0 + 1, im.shape[1] - 1), min(x0 + 1, im.shape[2] - 1)
            wy, wx = np.clip(yy - 0.5 - y0, 0, 1), np.clip(xx - 0.5 - x0, 0, 1)
            y0, x0, y1_, x1_ = int(y0), int(x0), int(y1_), int(x1_)
            ref[:, i, j] = ((1 - wy) * (1 - wx) * im[:, y0, x0] + (1 - wy) * wx * im[:, y0, x1_]
                            + wy * (1 - wx) * im[:, y1_, x0] + wy * wx * im[:, y1_, x1_])
    np.testing.assert_allclose(crops[k].numpy(), ref, atol=1e-5)


# ------------------------------------------------------------------------------- no target identity in UDA


def _tiny_cfg():
    return experiment.Config(src_ids=12, src_scenes=10, tgt_ids=10, tgt_scenes=10, test_ids=8, test_scenes=6,
                             heights=(120, 20), src_epochs=1, batch=16, uda_rounds=1, uda_iters=3, k1=6, k2=2,
                             widths=(4, 8, 8, 8), dim=8, sdh_channels=4)


def test_target_identities_never_reach_the_pseudo_labeller():
    cfg = _tiny_cfg()
    data = experiment.build_data(cfg, 0)
    net = experiment.train_source(data, cfg, 0)
    maps = experiment.cache_maps(net.backbone, data)
    with pytest.raises(TypeError, match="UnlabeledTarget"):
        experiment.uda(net.heads["plain"], maps.source, maps.source, cfg, 0, bcr=False)
    with pytest.raises(TypeError, match="float"):
        experiment.pseudo_labels(torch.as_tensor(data.target_truth)[:, None], cfg, bcr=False)
    arms = ("UDA", "UDA+BCR")
    a = experiment.run_arms(net, maps, data, cfg, 0, arms)
    scrambled = dataclasses.replace(data, target_truth=np.random.default_rng(0).permutation(data.target_truth) + 7)
    b = experiment.run_arms(net, maps, scrambled, cfg, 0, arms)
    for arm in arms:  # the hidden identities change the logged ARI only, never the training
        assert a[arm].t_test.mAP == b[arm].t_test.mAP and a[arm].s_src.mAP == b[arm].s_src.mAP
        assert [r["clusters"] for r in a[arm].rounds] == [r["clusters"] for r in b[arm].rounds]


def test_batches_cycle_permutations_and_reject_empty():
    rng = np.random.default_rng(0)
    big = experiment._batches(10, 4, 5, rng)  # 2 full batches per permutation, the tail of each dropped
    assert big.shape == (5, 4) and all(len(set(big[i:i + 2].ravel())) == 8 for i in (0, 2))
    small = experiment._batches(3, 4, 3, rng)  # fewer items than a batch: consecutive permutations
    assert small.shape == (3, 4)
    assert all(sorted(small.ravel()[i:i + 3]) == [0, 1, 2] for i in (0, 3, 6, 9))
    with pytest.raises(ValueError, match="no samples"):
        experiment._batches(0, 4, 1, rng)


# ----------------------------------------------------------------------------------------------------- detector
def test_detector_focal_loss_and_targets_match_centernet_formulas():
    from repro.papers.scale_ps import detector

    boxes = [np.array([[8.0, 4.0, 24.0, 36.0]], np.float32), np.zeros((0, 4), np.float32)]
    heat, size, mask = detector._targets(boxes, (12, 10), "cpu")
    # one centre per box at ((x1 + x2) / 8, (y1 + y2) / 8) on the stride-4 grid, log width / height there
    assert mask.sum() == 1 and mask[0, 5, 4] and heat[0, 5, 4] == 1 and heat[1].abs().sum() == 0
    assert torch.allclose(size[0, :, 5, 4], torch.tensor([np.log(16.0), np.log(32.0)], dtype=torch.float32))
    logits = torch.randn(2, 12, 10, generator=torch.Generator().manual_seed(0))
    p = np.clip(1 / (1 + np.exp(-logits.double().numpy())), 1e-4, 1 - 1e-4)
    h = heat.double().numpy()
    loss = 0.0
    for idx in np.ndindex(*h.shape):  # Zhou et al. 2019, Eq. 1, written out per pixel
        if h[idx] == 1:
            loss += -((1 - p[idx]) ** 2) * np.log(p[idx])
        else:
            loss += -((1 - h[idx]) ** 4) * p[idx] ** 2 * np.log(1 - p[idx])
    assert detector.focal_loss(logits, heat).item() == pytest.approx(loss, rel=1e-5)  # one centre


def test_run_seeds_does_not_depend_on_the_global_generators_or_the_arm_order():
    """The notebook runs seeds in parallel processes (runtime.Run.map); that gives a loop's numbers only if a
    seed's run uses no generator it does not seed itself."""
    cfg, arms = _tiny_cfg(), ("source-only", "UDA+BCR")
    results = []
    for scramble in (1, 2):
        torch.manual_seed(scramble)
        np.random.seed(scramble)  # noqa: NPY002 (the global state is what is scrambled)
        r = experiment.run_seeds(cfg, [3], "cpu", arms)[0]
        results.append([(a.t_test.mAP, a.s_src.mAP, [q["clusters"] for q in a.rounds]) for a in r.arms.values()])
    assert results[0] == results[1]
    whole = experiment.run_seed(experiment.prepare(cfg, 3), cfg, arms)  # all arms in one call, as before
    assert [(a.t_test.mAP, a.s_src.mAP, [q["clusters"] for q in a.rounds]) for a in whole.arms.values()] == results[0]
