"""PACE's models (paper 09): stage masks, causality, the step path, the KV cache, training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repro.papers.pace import model as M
from repro.papers.pace import octree as O

W = 16


def small_pace(dtype=torch.float64) -> M.PACEModel:
    torch.manual_seed(0)
    return M.PACEModel(d=16, n_layers=1, n_heads=2, window=W).to(dtype).eval()


def random_windows(b: int = 3, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.stack([torch.randint(0, 255, (b, W), generator=g), torch.randint(0, 255, (b, W), generator=g),
                          torch.randint(0, 256, (b, W), generator=g), torch.randint(0, 8, (b, W), generator=g),
                          torch.randint(0, 9, (b, W), generator=g), torch.randint(0, 9, (b, W), generator=g),
                          torch.randint(1, 12, (b, W), generator=g)], -1)
    xyz = torch.rand(b, W, 3, generator=g, dtype=dtype) * 2 - 1
    sym = torch.randint(0, 255, (b, W), generator=g)
    return tokens, xyz, torch.ones(b, W, dtype=torch.bool), sym


def test_stage_masks_show_exactly_the_earlier_phases():
    sym = torch.arange(2 * W).reshape(2, W) % 255
    for k in (1, 2, 3, 4, 8, W):
        for r in range(k):
            prev = M.stage_prev(sym, k, r)
            for b in range(2):
                for j in range(W):
                    allowed = j >= 1 and ((j - 1) % W) % k < r
                    assert int(prev[b, j]) == (int(sym[b, j - 1]) if allowed else O.PAD_SYMBOL)
    with pytest.raises(ValueError):
        M.stage_prev(sym, 2, 2)


def test_stage_outputs_never_see_the_current_or_later_phases():
    """Changing the symbols a node may not know (its own phase or later, or anything after it) must not change
    its pmf; changing one it may know must be able to."""
    model = small_pace()
    tokens, xyz, valid, sym = random_windows()
    feats = model.backbone(tokens, xyz, valid)
    for k in (1, 2, 4, W):
        base = model.predict_stages(feats, sym, k)
        ph = torch.arange(W) % k
        for i in (3, 9, W - 1):
            other = sym.clone()
            hidden = [j for j in range(W) if j >= i or ph[j] >= ph[i]]
            other[:, hidden] = (other[:, hidden] + 7) % 255
            assert torch.allclose(model.predict_stages(feats, other, k)[:, i], base[:, i], atol=1e-12)
            visible = [j for j in range(i) if ph[j] < ph[i]]
            if visible:
                other = sym.clone()
                other[:, visible] = (other[:, visible] + 7) % 255
                assert not torch.allclose(model.predict_stages(feats, other, k)[:, i], base[:, i])


def test_fully_parallel_mode_ignores_all_siblings():
    model = small_pace()
    tokens, xyz, valid, sym = random_windows()
    feats = model.backbone(tokens, xyz, valid)
    assert torch.allclose(model.predict_stages(feats, sym, 1), model.predict_stages(feats, sym.flip(1), 1))


def test_k_equals_window_matches_the_step_by_step_path():
    model = small_pace()
    tokens, xyz, valid, sym = random_windows()
    feats = model.backbone(tokens, xyz, valid)
    parallel = model.predict_stages(feats, sym, W)
    staged = None  # the generic k-stage loop with k = W, one pass per position
    ph = torch.arange(W)
    for r in range(W):
        out = model.predictor(feats, M.stage_prev(sym, W, r))
        staged = out if staged is None else torch.where((ph == r)[None, :, None], out, staged)
    prev = M.shift_prev(sym)
    h, steps = None, []
    for t in range(W):
        logits, h = model.predictor.step(feats[:, t], prev[:, t], h)
        steps.append(logits)
    assert torch.allclose(parallel, staged, atol=1e-9)
    assert torch.allclose(parallel, torch.stack(steps, 1), atol=1e-6)


def test_backbone_is_non_causal_within_a_window_and_local_to_it():
    model = small_pace()
    tokens, xyz, valid, _ = random_windows()
    base = model.backbone(tokens, xyz, valid)
    t2 = tokens.clone()
    t2[1, -1, 0] = (t2[1, -1, 0] + 1) % 255  # the last node of window 1
    out = model.backbone(t2, xyz, valid)
    assert not torch.allclose(out[1, 0], base[1, 0])  # earlier nodes of the same window see it
    assert torch.allclose(out[[0, 2]], base[[0, 2]])  # other windows do not
    v2 = valid.clone()
    v2[0, -4:] = False  # padding: what sits in padded positions is ignored
    t3 = tokens.clone()
    t3[0, -4:] = 0
    assert torch.allclose(model.backbone(tokens, xyz, v2)[0, :-4], model.backbone(t3, xyz, v2)[0, :-4])


def test_coupled_kv_cache_matches_recomputation_and_is_causal():
    torch.manual_seed(0)
    model = M.CoupledCausalModel(d=16, n_layers=2, n_heads=2, window=W).double().eval()
    tokens, xyz, valid, sym = random_windows()
    full = model(tokens, xyz, valid, sym)
    other = sym.clone()
    other[:, 10:] = (other[:, 10:] + 3) % 255
    assert torch.allclose(model(tokens, xyz, valid, other)[:, :11], full[:, :11])  # sees sym[j] only for j < i
    static = model.embed(tokens, xyz)
    prev = M.shift_prev(sym)
    buf, caches, outs = [], [{} for _ in model.blocks], []
    for t in range(W):
        h = model.conv.step(static[:, t] + model.occ(prev[:, t]), buf)
        for blk, cache in zip(model.blocks, caches, strict=True):
            h = blk.step(h, cache)
        outs.append(model.head(h))
    assert torch.allclose(torch.stack(outs, 1), full, atol=1e-9)


def test_sessions_give_the_same_pmfs_as_teacher_forcing():
    model = small_pace(torch.float64)
    rng = np.random.default_rng(0)
    m = 2 * W + 5
    tokens = np.stack([rng.integers(0, 255, m), rng.integers(0, 255, m), rng.integers(0, 255, m),
                       rng.integers(0, 8, m), rng.integers(0, 8, m), rng.integers(0, 8, m), np.full(m, 5)], 1)
    xyz = rng.uniform(-1, 1, (m, 3)).astype(np.float32)
    sym = rng.integers(0, 255, m)
    t = torch.as_tensor(tokens)
    x = torch.as_tensor(xyz).double()
    tw, xw = M.to_windows(t, W), M.to_windows(x, W)
    vw = M.to_windows(torch.ones(m, dtype=torch.bool), W, False)
    sw = M.to_windows(torch.as_tensor(sym), W, O.PAD_SYMBOL)
    for mode, k in (("fp", 1), ("4s", 4), ("ar", W)):
        ref = torch.softmax(model(tw, xw, vw, sw, k).detach(), -1).reshape(-1, 255)[:m].numpy()
        session = model.session(tokens, xyz, mode)
        known = np.full(m, O.PAD_SYMBOL)
        seen = np.zeros(m, dtype=bool)
        for j, idx in enumerate(session.steps):
            assert not seen[idx].any()
            seen[idx] = True
            assert np.allclose(session.pmf(j, known), ref[idx], atol=1e-8)
            known[idx] = sym[idx]
        assert seen.all()


def small_two_group() -> M.TwoGroupModel:
    torch.manual_seed(0)
    return M.TwoGroupModel(d=16, n_layers=1, n_heads=2, window=W).double().eval()


def test_two_group_model_sees_group_1_only_in_its_second_pass():
    """EHEM-like grouping: a group-1 node (even phase) sees no symbol of its window; a group-2 node sees every
    group-1 symbol and no group-2 symbol (its own included)."""
    model = small_two_group()
    tokens, xyz, valid, sym = random_windows()
    base = model(tokens, xyz, valid, sym)
    group2 = torch.arange(W) % 2 == 1
    other = sym.clone()
    other[:, group2] = (other[:, group2] + 7) % 255  # group-2 symbols change: no output may move
    assert torch.allclose(model(tokens, xyz, valid, other), base, atol=1e-12)
    other = sym.clone()
    other[:, ~group2] = (other[:, ~group2] + 7) % 255  # group-1 symbols change: group 1 stays, group 2 moves
    out = model(tokens, xyz, valid, other)
    assert torch.allclose(out[:, ~group2], base[:, ~group2], atol=1e-12)
    assert not torch.allclose(out[:, group2], base[:, group2])
    with pytest.raises(ValueError, match="two-group"):
        model.session(np.zeros((4, 7), dtype=np.int64), np.zeros((4, 3), dtype=np.float32), "ar")


def test_two_group_sessions_give_the_teacher_forced_pmfs_in_two_steps():
    model = small_two_group()
    rng = np.random.default_rng(1)
    m = 2 * W + 5
    tokens = np.stack([rng.integers(0, 255, m), rng.integers(0, 255, m), rng.integers(0, 255, m),
                       rng.integers(0, 8, m), rng.integers(0, 8, m), rng.integers(0, 8, m), np.full(m, 5)], 1)
    xyz = rng.uniform(-1, 1, (m, 3)).astype(np.float32)
    sym = rng.integers(0, 255, m)
    tw, xw = M.to_windows(torch.as_tensor(tokens), W), M.to_windows(torch.as_tensor(xyz).double(), W)
    vw = M.to_windows(torch.ones(m, dtype=torch.bool), W, False)
    ref = torch.softmax(model(tw, xw, vw, M.to_windows(torch.as_tensor(sym), W, O.PAD_SYMBOL)).detach(), -1)
    ref = ref.reshape(-1, 255)[:m].numpy()
    session = model.session(tokens, xyz, "2g")
    assert len(session.steps) == 2 and np.array_equal(np.sort(np.concatenate(session.steps)), np.arange(m))
    known = np.full(m, O.PAD_SYMBOL)
    for j, idx in enumerate(session.steps):
        assert np.array_equal(idx % W % 2, np.full(len(idx), j))
        assert np.allclose(session.pmf(j, known), ref[idx], atol=1e-8)
        known[idx] = sym[idx]


def test_modes_and_count_table():
    assert M.parse_mode("fp", 256) == 1 and M.parse_mode("8s", 256) == 8 and M.parse_mode("ar", 256) == 0
    for bad in ("", "0s", "300s", "xs", "AR"):
        with pytest.raises(ValueError):
            M.parse_mode(bad, 256)
    tokens = np.array([[3, 0, 0, 1, 0, 0, 2], [3, 0, 0, 1, 0, 0, 2], [4, 0, 0, 2, 0, 0, 2]])
    table = M.CountTable(alpha=0.5).fit([(tokens, None, np.array([7, 7, 9]))])
    p = table.probs(tokens[:1])
    assert p.shape == (1, 255) and p[0, 7] == pytest.approx(2.5 / (2 + 0.5 * 255))
    with pytest.raises(ValueError):
        M.CountTable(alpha=0)


def test_training_lowers_the_code_length():
    rng = np.random.default_rng(0)
    pts = np.concatenate([rng.uniform(-30, 30, (1500, 3)) * [1, 1, 0.02], rng.normal(0, 3, (500, 3)) + [10, 0, 0]])
    tree = O.build_octree(O.quantize(pts, O.Grid.centred(32.0, 7)), 7)
    data = M.WindowData.from_levels(O.octree_contexts(tree), W)
    torch.manual_seed(0)
    model = M.PACEModel(d=16, n_layers=1, n_heads=2, window=W)
    before = M.cross_entropy_bits(model, data, W)
    M.train(model, data, steps=60, batch=8, lr=5e-3, ks=(1, 2, W))
    after = M.cross_entropy_bits(model, data, W)
    assert after < before - 1.0


def test_matmul_flops_match_the_flop_counter():
    """The analytic count of a session's matrix products (the benchmark's roofline work) equals torch's FLOP counter
    on a real decode, every level, in each kind of mode (attention on the math kernel, whose two products the
    counter sees; the CPU flash kernel does the same products but is not counted by torch)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from repro.papers.pace import codec as C

    rng = np.random.default_rng(0)
    cloud = np.concatenate([rng.uniform(-40, 40, (700, 3)) * [1, 1, 0] + [0, 0, -1.7],
                            rng.uniform(0, 1, (300, 3)) * [0, 20, 5] + [15, -10, -1.7]])
    depth = 6
    tree = O.build_octree(O.quantize(cloud, O.Grid.centred(C.DEFAULT_HALF_SIZE, depth)), depth)
    sizes = [len(c) for c in tree.codes[1:-1]]
    w = 8
    assert max(sizes) > 2 * M.STAGE_CHUNK * w  # several windows, several backbone chunks
    torch.manual_seed(0)
    pace = M.PACEModel(d=16, n_layers=2, n_heads=2, window=w).eval()
    mlp = M.AncestorMLP(d=16, hidden=32, window=w).eval()
    for model, mode in ((pace, "fp"), (pace, "4s"), (pace, "ar"), (mlp, "fp")):
        data = C.encode(cloud, model, depth, mode)
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            C.decode_quantized(data, model)
        assert counter.get_total_flops() == M.decode_flops(model, sizes, mode), (type(model).__name__, mode)
    assert M.decode_flops(M.CountTable(), sizes, "fp") == 0
    # by hand, fp on one full window: embedding 80->d and 3->d, conv 2 d^2 + 5 d, per block 3d^2 + d^2 + 2 f d + f d
    # and attention 4 W^2 d, predictor 3 d^2, head (d^2 + 255 d) per node
    d, f = 16, 8 * 16 // 3
    per_pos = 80 * d + 3 * d + 2 * d * d + 5 * d + 2 * (4 * d * d + 3 * f * d) + 3 * d * d + d * d + 255 * d
    assert pace.matmul_flops(w, "fp") == 2 * w * per_pos + 2 * 4 * w * w * d


def test_backbone_chunks_give_the_same_bits():
    """The staged sessions run the backbone in chunks of :data:`STAGE_CHUNK` windows, the teacher-forced path in
    chunks of ``model.chunk``: the per-window result must be the same bit for bit (the codec's streams depend on
    it), padded tail included."""
    torch.manual_seed(0)
    model = M.PACEModel(d=16, n_layers=2, n_heads=2, window=W).eval()
    tokens, xyz, valid, _ = random_windows(b=11, dtype=torch.float32)
    valid[-1, 5:] = False
    with torch.no_grad():
        ref = model.backbone(tokens, xyz, valid)
        for chunk in (1, 2, M.STAGE_CHUNK, 5):
            assert torch.equal(model.backbone(tokens, xyz, valid, chunk=chunk), ref), chunk


def test_fingerprint_cache_follows_every_change_of_the_state():
    """The cached digest is returned only for a state equal bit for bit: in-place updates (also through ``.data``,
    which bypasses the version counter), a 0.0 turned −0.0, a loaded state dict and a dtype change all recompute it,
    and it always equals the digest of a fresh model with the same state."""
    torch.manual_seed(0)
    model = M.PACEModel(d=16, n_layers=1, n_heads=2, window=W).eval()

    def fresh() -> bytes:
        twin = M.PACEModel(**model.config).to(model.dtype).eval()
        twin.load_state_dict(model.state_dict())
        return twin.fingerprint()

    first = model.fingerprint()
    assert model.fingerprint() == first == fresh()
    seen = {first}
    w = model.predictor.u.weight
    for change in (lambda: w.data.add_(1e-3), lambda: w.data.__setitem__((0, 0), 0.0),
                   lambda: w.data.__setitem__((0, 0), -0.0), lambda: model.load_state_dict(
                       {k: v + 1 for k, v in model.state_dict().items()}), lambda: model.double()):
        with torch.no_grad():
            change()
        digest = model.fingerprint()
        assert digest == fresh() and digest not in seen
        seen.add(digest)
