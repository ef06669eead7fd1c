"""The notebook harness of repro.papers.pace (paper 09) against what it composes: the octree, the models' own
training and parameter counts, real streams (sizes, decoding, per-level bits), and small hand-made inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repro.papers import pace as P
from repro.papers.pace import codec as C
from repro.papers.pace import metrics as X
from repro.papers.pace import octree as O

W = 16
DEPTH = 6


@pytest.fixture(scope="module")
def corpus() -> P.Corpus:
    grid = O.Grid.centred(128.0, DEPTH)
    return P.make_corpus([1, 2], [7], grid, DEPTH, W, n_beams=8, n_az=128)


@pytest.fixture(scope="module")
def models(corpus) -> P.Models:
    recipe = P.Recipe(d=16, n_layers=1, n_heads=2, window=W, steps=3, batch=4, ks=(1, 2, W), mlp_steps=2)
    return P.train_models(corpus, recipe, 0)


def test_moving_average_and_order_inversions_by_hand():
    steps, avg = P.moving_average([1.0, 2.0, 3.0, 4.0, 5.0], n=2)
    assert steps.tolist() == [2, 3, 4, 5] and avg.tolist() == [1.5, 2.5, 3.5, 4.5]
    steps, avg = P.moving_average([2.0, 4.0], n=20)  # a window longer than the curve: one mean
    assert steps.tolist() == [2] and avg.tolist() == [3.0]
    with pytest.raises(ValueError):
        P.moving_average([])
    assert P.order_inversions([1.0, 2.0, 3.0]) == 0
    assert P.order_inversions([1.0, 1.0, 0.5, 2.0]) == 2


def test_corpus_is_the_octrees_of_the_scans(corpus):
    grid = O.Grid.centred(128.0, DEPTH)
    assert len(corpus.train_scans) == 2 and len(corpus.test_scans) == 1
    tree = O.build_octree(O.quantize(corpus.test_scans[0], grid), DEPTH)
    assert all(np.array_equal(a, b) for a, b in zip(tree.codes, corpus.test_tree.codes, strict=True))
    assert len(corpus.train_levels) == 2 * (DEPTH - 1)
    assert len(corpus.data) == sum(-(-len(s) // W) for _, _, s in corpus.train_levels)
    assert int(corpus.data.valid.sum()) == sum(t.n_symbols for t in corpus.trees)


def test_train_models_counts_and_seeds(corpus, models):
    assert len(models.pace_loss) == 3 and len(models.mlp_loss) == 2 and models.coupled_loss == []
    assert models.n_params["PACE"] == sum(p.numel() for p in models.pace.parameters())
    # the count table's code length on its own training symbols, summed symbol by symbol
    bits = [-np.log2(models.table.probs(t[i:i + 1])[0, s[i]]) for t, _, s in corpus.train_levels for i in range(len(s))]
    assert models.table_bits == pytest.approx(np.mean(bits), rel=1e-10)
    again = P.train_models(corpus, P.Recipe(d=16, n_layers=1, n_heads=2, window=W, steps=3, batch=4, ks=(1, 2, W),
                                            mlp_steps=2), 0)
    assert again.pace_loss == models.pace_loss
    assert all(torch.equal(a, b) for a, b in zip(again.pace.parameters(), models.pace.parameters(), strict=True))


def test_the_trainings_are_independent_jobs(corpus, models):
    """In two processes (the notebook's run.map) every model, the two controls included, comes out as from the
    plain loop, and the controls as from train_single_stage and train_two_group alone."""
    from repro.runtime import parallel_map

    recipe = P.Recipe(d=16, n_layers=1, n_heads=2, window=W, steps=3, batch=4, ks=(1, 2, W), mlp_steps=2,
                      coupled_steps=2)
    loop = P.train_models(corpus, recipe, 0, controls=True)
    par = P.train_models(corpus, recipe, 0, controls=True, mapper=lambda f, xs: parallel_map(f, xs, 2))
    for name in ("pace", "mlp", "coupled", "single", "two_group"):
        a, b = getattr(loop, name).state_dict(), getattr(par, name).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), name
    assert (loop.pace_loss, loop.coupled_loss, loop.two_group_loss) == (par.pace_loss, par.coupled_loss,
                                                                          par.two_group_loss)
    assert loop.pace_loss == models.pace_loss  # the coupled and two-group jobs do not move PACE's numbers
    alone, alone_loss = P.train_two_group(corpus, recipe, 0)
    assert alone_loss == loop.two_group_loss
    assert all(torch.equal(a, b) for a, b in zip(alone.state_dict().values(), loop.two_group.state_dict().values(),
                                                 strict=True))
    alone, alone_loss = P.train_single_stage(corpus, recipe, 0)
    assert alone_loss == loop.single_loss
    assert all(torch.equal(a, b) for a, b in zip(alone.state_dict().values(), loop.single.state_dict().values(),
                                                 strict=True))


def test_rate_distortion_streams_decode_and_add_up(corpus, models):
    grid = O.Grid.centred(128.0, DEPTH)
    codecs = {"count table": (models.table, "fp"), "PACE fp": (models.pace, "fp")}
    stages = {"PACE fp": (models.pace, "fp"), "PACE 2s": (models.pace, "2s"), "PACE ar": (models.pace, "ar")}
    scans = corpus.test_scans
    rd = P.rate_distortion(scans, grid, [DEPTH - 1, DEPTH], codecs, stages)
    assert set(rd.streams) == {(0, n) for n in (*codecs, *stages)} | {(0, n, DEPTH - 1) for n in codecs}
    for j, depth in enumerate(rd.depths):
        key = (0, "count table") if depth == DEPTH else (0, "count table", depth)
        assert rd.bpp["count table"][0, j] == 8 * len(rd.streams[key].data) / len(scans[0])
        g = grid.at_depth(depth)
        assert rd.psnr["octree"][0, j] == X.d1_psnr(scans[0], O.dequantize(np.unique(O.quantize(scans[0], g), axis=0),
                                                                             g))
        assert rd.bpp["Draco"][0, j] > 0 and np.isfinite(rd.psnr["Draco"][0, j])
    assert P.count_lossless_failures(rd, scans, grid, {**stages, **codecs}) == (0, 4)
    # a stream decoded with other weights is refused, so a lossless check cannot pass by accident
    with pytest.raises(C.CorruptStream):
        C.decode_quantized(rd.streams[0, "PACE fp"].data, models.mlp)
    overhead, gap = P.coder_overhead({k: rd.streams[k] for k in [(0, "PACE fp"), (0, "PACE ar")]})
    assert len(overhead) == 2 and all(0.9 < o < 1.01 for o in overhead) and all(g > -1e-9 for g in gap)
    bits, symbols = P.level_bits(rd, ["count table", "PACE ar"], 1)
    for name in bits:
        assert bits[name].sum() == pytest.approx(rd.streams[0, name].bits_model, rel=1e-12)
    assert symbols.sum() == corpus.test_tree.n_symbols
    times = P.decode_times(rd, stages, 2)
    assert set(times) == set(stages) and all(len(v) == 2 and min(v) > 0 for v in times.values())


def test_latency_slice_decodes_the_same_nodes_exactly(corpus, models):
    level = DEPTH - 1
    sl = P.latency_slice(corpus.test_tree, level, 2, W, {"PACE ar": (models.pace, "ar"),
                                                         "coupled + KV cache": (models.coupled, "ar-kv")}, 2)
    assert sl.n_nodes == min(2 * W, len(corpus.test_tree.symbols(level))) and sl.exact
    assert all(len(v) == 2 for v in sl.seconds.values())
    assert sl.us_per_node["PACE ar"] == pytest.approx(1e6 * np.median(sl.seconds["PACE ar"]) / sl.n_nodes)
    # the slice's rate: the size of the ANS words each model coded it into
    tokens, xyz = O.level_context(corpus.test_tree.codes, corpus.test_tree.occupancy, level)
    n = sl.n_nodes
    words = C.encode_level(models.pace, tokens[:n], xyz[:n], corpus.test_tree.symbols(level)[:n], "ar")
    assert sl.bits_per_node["PACE ar"] == 32.0 * len(words) / n


def test_scan_bits_is_the_teacher_forced_code_length_of_the_real_streams(corpus, models):
    """The teacher-forced rate equals the model's cross-entropy under its float pmfs, which the codec also computes
    for the streams it writes (``bits_float``), for every coded level of the test scan."""
    got = P.scan_bits(corpus.test_tree, W, {"PACE ar": (models.pace, W), "PACE fp": (models.pace, 1)})
    grid = O.Grid.centred(128.0, DEPTH)
    for name, mode in (("PACE ar", "ar"), ("PACE fp", "fp")):
        enc = C.encode_detailed(corpus.test_scans[0], models.pace, DEPTH, mode, grid=grid)
        assert got[name] == pytest.approx(enc.bits_float / enc.n_symbols, rel=1e-4)
    coupled = P.scan_bits(corpus.test_tree, W, {"coupled": (models.coupled, W)})["coupled"]
    assert np.isfinite(coupled) and coupled > 0


def test_window_bits_are_each_window_coded_alone(corpus, models):
    """Per-window code lengths: each equals the cross-entropy of that window taken alone, and their total is the
    scan's teacher-forced rate."""
    data = P.WindowData.from_levels(O.octree_contexts(corpus.test_tree), W)
    bits, count = P.window_bits(models.pace, data, 2)
    assert bits.shape == count.shape == (len(data),) and count.sum() == corpus.test_tree.n_symbols
    for i in (0, len(data) // 2, len(data) - 1):
        one = P.WindowData(*(a[i:i + 1] for a in (data.tokens, data.xyz, data.sym, data.valid)))
        assert bits[i] == pytest.approx(P.cross_entropy_bits(models.pace, one, 2) * count[i], rel=1e-9)
    per = P.scan_window_bits(corpus.test_tree, W, {"PACE 2s": (models.pace, 2)})["PACE 2s"]
    assert np.allclose(per[0], bits) and P.scan_bits(corpus.test_tree, W, {"x": (models.pace, 2)})["x"] == (
        pytest.approx(bits.sum() / count.sum(), rel=1e-12))
    assert P.pooled_rate(np.array([3.0, 5.0]), np.array([1.0, 3.0])) == 2.0


def test_stage_rates_and_their_largest_rise(corpus, models):
    assert P.largest_stage_rise(np.array([[2.0, 1.5, 1.5], [1.0, 1.1, 0.9]])) == pytest.approx(0.1)
    assert P.largest_stage_rise(np.array([[3.0, 2.0, 1.0]])) == pytest.approx(-1 / 3)
    with pytest.raises(ValueError, match="modes"):
        P.largest_stage_rise(np.array([1.0, 2.0]))
    grid = O.Grid.centred(128.0, DEPTH)
    got = P.stage_bpp(corpus.test_scans, grid, DEPTH, models.pace, ["fp", "ar"])
    for j, mode in enumerate(["fp", "ar"]):
        assert got[0, j] == C.encode_detailed(corpus.test_scans[0], models.pace, DEPTH, mode, grid=grid).bpp


def test_single_stage_control_trains_with_one_stage_count(corpus):
    recipe = P.Recipe(d=16, n_layers=1, n_heads=2, window=W, steps=3, batch=4, ks=(1, 2, W), mlp_steps=2)
    model, loss = P.train_single_stage(corpus, recipe, 0)
    assert isinstance(model, P.PACEModel) and len(loss) == 3
    torch.manual_seed(0)
    ref = P.PACEModel(d=16, n_layers=1, n_heads=2, window=W)
    P.train(ref, corpus.data, steps=3, ks=[1], batch=4, lr=recipe.lr, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values(), strict=True))


def test_two_group_baseline_trains_like_its_reference_and_runs_its_backbone_twice(corpus):
    recipe = P.Recipe(d=16, n_layers=1, n_heads=2, window=W, steps=3, batch=4, mlp_steps=2)
    model, loss = P.train_two_group(corpus, recipe, 0)
    assert isinstance(model, P.TwoGroupModel) and len(loss) == 3 and not model.training
    torch.manual_seed(0)
    ref = P.TwoGroupModel(d=16, n_layers=1, n_heads=2, window=W)
    P.train(ref, corpus.data, steps=3, batch=4, lr=recipe.lr, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values(), strict=True))
    got = P.backbone_calls(corpus.test_tree, DEPTH - 1, 2, W, {"two groups": (model, "2g")})
    assert got == {"two groups": 2}  # one pass per group over the slice's windows (one chunk)


def test_backbone_calls_counts_the_real_decoder(corpus, models):
    """PACE runs its backbone once for the slice (every window in one chunk); the coupled model once per position
    of a window, re-running or cached: W calls for a slice of full windows."""
    level = DEPTH - 1
    n = min(2 * W, len(corpus.test_tree.symbols(level)))
    got = P.backbone_calls(corpus.test_tree, level, 2, W, {
        "PACE ar": (models.pace, "ar"), "PACE fp": (models.pace, "fp"), "coupled": (models.coupled, "ar"),
        "coupled + KV": (models.coupled, "ar-kv")})
    assert got == {"PACE ar": 1, "PACE fp": 1, "coupled": min(W, n), "coupled + KV": min(W, n)}
    assert "step" not in vars(models.coupled.blocks[0])  # the counter is removed afterwards
