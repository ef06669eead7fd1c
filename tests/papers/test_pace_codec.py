"""The PACE codec (paper 09): frequency tables, bit-exact round trips in every mode, corrupt-stream fuzzing."""

from __future__ import annotations

import struct
import time
import zlib

import constriction
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from repro.papers.pace import codec as C
from repro.papers.pace import model as M
from repro.papers.pace import octree as O

DEPTH = 6
W = 16


@pytest.fixture(scope="module")
def cloud() -> np.ndarray:
    rng = np.random.default_rng(0)
    ground = rng.uniform(-40, 40, (700, 3)) * [1, 1, 0] + [0, 0, -1.7]
    wall = rng.uniform(0, 1, (300, 3)) * [0, 20, 5] + [15, -10, -1.7]
    return np.concatenate([ground, wall])


@pytest.fixture(scope="module")
def models(cloud) -> dict[str, object]:
    torch.manual_seed(0)
    tree = O.build_octree(O.quantize(cloud, O.Grid.centred(C.DEFAULT_HALF_SIZE, DEPTH)), DEPTH)
    return {"pace": M.PACEModel(d=16, n_layers=1, n_heads=2, window=W).eval(),
            "coupled": M.CoupledCausalModel(d=16, n_layers=1, n_heads=2, window=W).eval(),
            "two-group": M.TwoGroupModel(d=16, n_layers=1, n_heads=2, window=W).eval(),
            "mlp": M.AncestorMLP(d=16, hidden=32).eval(),
            "table": M.CountTable().fit(O.octree_contexts(tree))}


@settings(max_examples=80, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 5), st.just(255)),
              elements=st.one_of(st.just(0.0), st.floats(1e-12, 1.0), st.floats(1e-300, 1e-200))))
def test_freq_tables_sum_to_2_16_with_every_symbol_at_least_1(raw):
    raw[:, 0] += 1e-3  # a valid pmf needs some mass
    pmf = raw / raw.sum(1, keepdims=True)
    freq = C.pmf_to_freq(pmf)
    assert freq.dtype == np.int64 and (freq >= 1).all() and (freq.sum(1) == 2**16).all()
    assert np.abs(freq - pmf * (2**16 - 255)).max() <= 256  # only the leftover moved


def test_freq_rule_rejects_bad_pmfs():
    for bad in (np.full((1, 255), np.nan), -np.ones((1, 255)) / 255, np.ones((1, 255)), np.ones((2, 3)) / 3):
        with pytest.raises(ValueError):
            C.pmf_to_freq(bad)


def test_constriction_round_trip_on_random_tables():
    rng = np.random.default_rng(0)
    pmf = rng.dirichlet(np.full(255, 0.05), size=3000)
    sym = np.array([rng.choice(255, p=p) for p in pmf], dtype=np.int32)
    freq = C.pmf_to_freq(pmf).astype(np.float64)
    family = constriction.stream.model.Categorical(perfect=False)
    coder = constriction.stream.stack.AnsCoder()
    coder.encode_reverse(sym, family, freq)
    ce = -np.log2(freq[np.arange(len(sym)), sym] / 2**16).sum()
    assert coder.num_bits() <= ce * 1.005 + 64
    back = constriction.stream.stack.AnsCoder(coder.get_compressed()).decode(family, freq)
    assert np.array_equal(back, sym)


@pytest.mark.parametrize("kind,mode", [("pace", "fp"), ("pace", "2s"), ("pace", "4s"), ("pace", "8s"),
                                       ("pace", "16s"), ("pace", "ar"), ("coupled", "ar"), ("coupled", "ar-kv"),
                                       ("two-group", "2g"), ("mlp", "fp"), ("table", "fp")])
def test_round_trip_is_bit_exact(cloud, models, kind, mode):
    model = models[kind]
    enc = C.encode_detailed(cloud, model, DEPTH, mode)
    grid = O.Grid.centred(C.DEFAULT_HALF_SIZE, DEPTH)
    q, g = C.decode_quantized(enc.data, model)
    truth = O.quantize(cloud, grid)
    assert g == grid
    assert np.array_equal(q, O.morton_decode(np.unique(O.morton_encode(truth))))
    assert np.array_equal(C.decode(enc.data, model), O.dequantize(q, grid))
    assert C.encode(cloud, model, DEPTH, mode) == enc.data  # deterministic
    assert enc.payload_bits <= enc.bits_model * 1.005 + 64  # ANS sits at the model's cross-entropy
    assert enc.n_symbols == sum(enc.level_symbols.values()) and enc.n_leaves == len(q)
    assert enc.bpp == pytest.approx(8 * len(enc.data) / len(cloud))


def test_level_slices_round_trip(cloud, models):
    tree = O.build_octree(O.quantize(cloud, O.Grid.centred(C.DEFAULT_HALF_SIZE, DEPTH)), DEPTH)
    tokens, xyz = O.level_context(tree.codes, tree.occupancy, DEPTH - 1)
    sym = tree.symbols(DEPTH - 1)
    for kind, mode in (("pace", "ar"), ("coupled", "ar"), ("coupled", "ar-kv"), ("pace", "4s")):
        words = C.encode_level(models[kind], tokens, xyz, sym, mode)
        assert np.array_equal(C.decode_level(words, models[kind], tokens, xyz, mode), sym)


def test_bad_inputs(cloud, models):
    with pytest.raises(ValueError):
        C.encode(np.zeros((0, 3)), models["pace"], DEPTH)
    with pytest.raises(ValueError):
        C.encode(cloud, models["pace"], DEPTH, "3x")
    with pytest.raises(ValueError):
        C.encode(cloud, models["mlp"], DEPTH, "ar")
    with pytest.raises(ValueError):
        C.encode(cloud, object(), DEPTH)
    with pytest.raises(ValueError, match="outside"):
        C.encode(cloud * 10, models["table"], DEPTH)
    with pytest.raises(TypeError):
        C.decode("not bytes", models["table"])


def test_wrong_model_is_refused(cloud, models):
    data = C.encode(cloud, models["pace"], DEPTH, "ar")
    with pytest.raises(C.CorruptStream, match="pace model"):
        C.decode(data, models["mlp"])
    torch.manual_seed(1)
    other = M.PACEModel(d=16, n_layers=1, n_heads=2, window=W).eval()
    with pytest.raises(C.CorruptStream, match="fingerprint"):
        C.decode(data, other)


@pytest.mark.parametrize("kind, change", [
    ("pace", dict(n_heads=4)), ("pace", dict(window=2 * W)),
    ("coupled", dict(n_heads=4)), ("coupled", dict(window=W // 2)), ("pace", "double"), ("mlp", "double")])
def test_same_weights_other_configuration_is_refused_by_the_header(cloud, models, kind, change):
    """The fingerprint covers the configuration and dtype, not the weights alone: the same state dict in a model with
    another head count, window or dtype would compute other pmfs, so its stream must be refused up front."""
    model = models[kind]
    data = C.encode(cloud, model, DEPTH, "fp" if kind == "mlp" else "ar")
    if change == "double":
        other = type(model)(**model.config).double().eval()
        other.load_state_dict(model.state_dict())
    else:
        other = type(model)(**{**model.config, **change}).eval()
        other.load_state_dict(model.state_dict())  # same parameter shapes: only the configuration differs
    assert all(torch.equal(a, b.to(a.dtype)) for a, b in zip(model.state_dict().values(),
                                                              other.state_dict().values(), strict=True))
    with pytest.raises(C.CorruptStream, match="fingerprint"):
        C.decode(data, other)
    twin = type(model)(**model.config).eval()
    twin.load_state_dict(model.state_dict())
    assert np.array_equal(C.decode(data, twin), C.decode(data, model))  # an identical model still decodes


def _reseal(data: bytes, **fields) -> bytes:
    """Rewrite header fields and recompute the CRC (a crafted stream that passes the checksum)."""
    names = ["magic", "version", "kind", "mode", "depth", "fp", "ox", "oy", "oz", "size", "n_points", "n_leaves",
             "n_symbols", "root", "n_words"]
    values = dict(zip(names, C._HEAD.unpack_from(data), strict=True))
    values.update(fields)
    head = C._HEAD.pack(*(values[n] for n in names))
    payload = data[C.HEADER_BYTES:]
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload


def _rejects(data: bytes, model) -> float:
    t = time.perf_counter()
    with pytest.raises(C.CorruptStream):
        C.decode(data, model)
    return time.perf_counter() - t


def test_fuzzed_corrupt_streams_are_all_rejected_quickly(cloud, models):
    rng = np.random.default_rng(0)
    cases = 0
    worst = 0.0
    for kind, mode in (("pace", "ar"), ("pace", "4s"), ("table", "fp")):
        model = models[kind]
        good = C.encode(cloud, model, DEPTH, mode)
        n = len(good)
        for _ in range(40):  # random bit flips anywhere
            b = bytearray(good)
            for pos in rng.choice(n, size=rng.integers(1, 4), replace=False):
                b[pos] ^= 1 << int(rng.integers(8))
            worst = max(worst, _rejects(bytes(b), model))
            cases += 1
        for cut in rng.choice(n, size=20, replace=False):  # truncations
            worst = max(worst, _rejects(good[:cut], model))
            cases += 1
        for extra in range(1, 6):  # trailing garbage
            worst = max(worst, _rejects(good + rng.bytes(extra), model))
            cases += 1
        crafted = [dict(magic=b"PACF"), dict(version=2), dict(kind=9), dict(kind=C.KINDS["mlp"]), dict(depth=0),
                   dict(depth=40), dict(depth=DEPTH + 1), dict(depth=DEPTH - 1), dict(root=0), dict(root=1),
                   dict(n_symbols=C.MAX_SYMBOLS + 1), dict(n_symbols=3), dict(n_leaves=0), dict(n_leaves=10**9),
                   dict(n_points=1), dict(size=float("nan")), dict(size=-5.0), dict(fp=b"\0" * 8),
                   dict(mode=b"ar\0\0\0\0\0\0" if mode != "ar" else b"2s\0\0\0\0\0\0"), dict(mode=b"\xff" * 8),
                   dict(mode=b"999s\0\0\0\0"), dict(n_words=0)]
        for fields in crafted:  # header edits that keep the checksum valid
            worst = max(worst, _rejects(_reseal(good, **fields), model))
            cases += 1
    for _ in range(10):  # noise
        worst = max(worst, _rejects(rng.bytes(int(rng.integers(0, 200))), models["mlp"]))
        cases += 1
    assert cases >= 200
    assert worst < 5.0


def test_resealed_payload_damage_never_hangs(cloud, models):
    """With a recomputed CRC a damaged payload may decode to another valid-looking tree; the decoder must still
    finish in bounded time (raise, or return a cloud)."""
    rng = np.random.default_rng(1)
    model = models["pace"]
    good = C.encode(cloud, model, DEPTH, "ar")
    rejected = 0
    for _ in range(20):
        b = bytearray(good)
        pos = int(rng.integers(C.HEADER_BYTES, len(b)))
        b[pos] ^= 1 << int(rng.integers(8))
        b = _reseal(bytes(b))
        t = time.perf_counter()
        try:
            C.decode(b, model)
        except C.CorruptStream:
            rejected += 1
        assert time.perf_counter() - t < 5.0
    assert rejected >= 15  # the count and end-of-stream checks catch most such damage


def _freq_reference(pmf: np.ndarray) -> np.ndarray:
    """The 16-bit rule as the codec computed it before the float64 tables (int64 throughout)."""
    freq = np.floor(pmf * (2**16 - 255)).astype(np.int64) + 1
    freq[np.arange(len(pmf)), pmf.argmax(1)] += 2**16 - freq.sum(1)
    return freq


def test_float64_tables_equal_the_int64_rule_in_any_row_blocks():
    rng = np.random.default_rng(0)
    pmf = np.concatenate([rng.dirichlet(np.full(255, a), size=400) for a in (0.01, 0.3, 5.0)])
    tie = np.full((2, 255), 1e-4)
    tie[:, [7, 200]] = (1 - 253e-4) / 2  # two most likely symbols: the first one gets the leftover
    pmf = np.concatenate([pmf, tie, np.full((1, 255), 1 / 255)])
    ref = _freq_reference(pmf)
    assert np.array_equal(C.pmf_to_freq(pmf), ref)
    blocks = np.concatenate([C.freq_table(pmf[a:a + 97].copy(), out=None) for a in range(0, len(pmf), 97)])
    assert blocks.dtype == np.float64 and np.array_equal(blocks, ref)
    assert np.array_equal(C.freq_table(pmf.copy(), out=pmf.copy()), ref)
    assert ref[-3, 7] > ref[-3, 200]
    with pytest.raises(ValueError, match="non-finite"):
        C.freq_table(np.full((1, 255), np.nan))


def _reference_level(model: M.PACEModel, tokens: np.ndarray, xyz: np.ndarray, sym: np.ndarray,
                     mode: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """One level coded the way the codec did before its decoding speed-up, written out without the sessions: the
    backbone over the whole level in one pass of ``model.chunk`` windows, the predictor per stage (``fp``, ``<k>s``)
    or its recurrent step per position (``ar``), the head on the step's nodes, a float64 softmax, the int64
    16-bit rule, and constriction's ANS pushing the steps in reverse. Returns the ANS words and each step's pmfs."""
    w, m = model.window, len(sym)
    t = M.to_windows(torch.as_tensor(tokens), w, 0)
    x = M.to_windows(torch.as_tensor(xyz), w, 0.0)
    v = M.to_windows(torch.ones(m, dtype=torch.bool), w, False)
    s = M.to_windows(torch.as_tensor(sym), w, O.PAD_SYMBOL)
    flat = np.arange(m)
    chunks = []
    with torch.no_grad():
        feats = model.backbone(t, x, v)
        k = M.parse_mode(mode, w)
        if k == 0:
            h, prev = None, torch.full((len(feats),), O.PAD_SYMBOL)
            for j in range(min(w, m)):
                idx = flat[flat % w == j]
                logits, h = model.predictor.step(feats[:, j], prev, h)
                chunks.append((idx, logits[: len(idx)]))
                prev = s[:, j].clone()
        else:
            kern = model.predictor.kernel(w)
            for r in range(k):
                idx = flat[(flat % w) % k == r]
                y = model.predictor.features(feats, M.stage_prev(s, k, r), kern).reshape(-1, feats.shape[-1])
                chunks.append((idx, model.predictor.head(y[torch.as_tensor(idx)])))
    pmfs = [torch.softmax(logits.to(torch.float64), -1).numpy() for _, logits in chunks]
    coder = constriction.stream.stack.AnsCoder()
    family = constriction.stream.model.Categorical(perfect=False)
    for (idx, _), pmf in zip(reversed(chunks), reversed(pmfs), strict=True):
        coder.encode_reverse(sym[idx].astype(np.int32), family, _freq_reference(pmf).astype(np.float64))
    return coder.get_compressed(), pmfs


@pytest.mark.parametrize("mode", ["fp", "4s", "ar"])
def test_streams_are_byte_equal_to_the_reference_coder(cloud, mode):
    """The codec's streams did not change with its speed-ups: on every level of a float32 model with several
    backbone chunks per level, each step's pmfs equal the reference's bit for bit, the ANS words equal the
    reference's, and the decoder reads the reference's words back exactly."""
    torch.manual_seed(0)
    model = M.PACEModel(d=16, n_layers=2, n_heads=2, window=8).eval()
    tree = O.build_octree(O.quantize(cloud, O.Grid.centred(C.DEFAULT_HALF_SIZE, DEPTH)), DEPTH)
    assert len(tree.codes[DEPTH - 1]) > 2 * M.STAGE_CHUNK * 8
    for level in range(1, DEPTH):
        tokens, xyz = O.level_context(tree.codes, tree.occupancy, level)
        sym = tree.symbols(level)
        ref, pmfs = _reference_level(model, tokens, xyz, sym, mode)
        session, known = model.session(tokens, xyz, mode), np.full(len(sym), O.PAD_SYMBOL)
        for j, idx in enumerate(session.steps):
            assert np.array_equal(session.pmf(j, known), pmfs[j]), (level, j)
            known[idx] = sym[idx]
        assert np.array_equal(C.encode_level(model, tokens, xyz, sym, mode), ref), level
        assert np.array_equal(C.decode_level(ref, model, tokens, xyz, mode), sym), level


def test_decode_timings_cover_every_phase(cloud, models):
    data = C.encode(cloud, models["pace"], DEPTH, "fp")
    timings: dict[str, float] = {}
    t = time.perf_counter()
    q, _ = C.decode_quantized(data, models["pace"], timings=timings)
    wall = time.perf_counter() - t
    assert set(timings) == set(C.PHASES) and all(v >= 0 for v in timings.values())
    assert 0.5 * wall < sum(timings.values()) <= wall
    assert np.array_equal(q, C.decode_quantized(data, models["pace"])[0])
