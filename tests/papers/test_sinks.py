"""repro.papers.sinks against independent references.

References: closed-form softmax values of a hand-set key bias (sink scores); a NumPy re-implementation of
causal attention with a KV-bias slot, output gate, QK-norm and rotary positions (TinyLM's attention); the exact
identity "zeroing v_0 removes A_{i0} v_0 from every head's attention output", read off the input of ``o_proj`` of a
tiny random Hugging Face Llama with grouped-query attention (which also pins the GQA head mapping); the clipping
rule recomputed in NumPy on that model's hidden state; vectors with
one planted massive entry; the Bigram-Backcopy copy rule checked token by token; and one load of SmolLM2.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from repro.papers import sinks as S

# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def tiny_llama() -> LlamaForCausalLM:
    """A tiny random Llama (float64, eager attention): 3 layers, width 32, 4 query heads sharing 2 key/value heads
    of 8 (grouped-query attention)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                      attn_implementation="eager")
    return LlamaForCausalLM(cfg).double().eval()


@pytest.fixture
def ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))


def _hook_count(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


# ------------------------------------------------------------------------------------------------ metrics


def test_sink_scores_equal_hand_computed_softmax_of_a_key_bias():
    # logits 0 everywhere except a key bias b_h on position 0: softmax row i gives e^b / (e^b + i)
    T, bias = 10, torch.tensor([[0.0, 1.0, 3.0], [2.0, -1.0, 5.0]])  # (layers, heads)
    logits = torch.zeros(2, 1, 3, T, T)
    logits[..., 0] = bias[:, None, :, None]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    probs = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
    got = S.sink_scores(list(probs), first=0, min_query=4)
    want = torch.tensor([[np.mean([math.exp(b) / (math.exp(b) + i) for i in range(4, T)]) for b in row]
                         for row in bias.tolist()])
    torch.testing.assert_close(got, want.float())
    assert S.sink_fraction(got, eps=0.3) == pytest.approx(float((want > 0.3).float().mean()))


def test_sink_scores_rejects_bad_input():
    a = torch.softmax(torch.randn(1, 2, 6, 6), dim=-1)
    with pytest.raises(ValueError, match="min_query"):
        S.sink_scores([a], first=0, min_query=6)
    with pytest.raises(ValueError, match="NaN"):
        S.sink_scores([a * float("nan")])
    with pytest.raises(ValueError, match="no layers"):
        S.sink_scores([])


def test_massive_ratio_finds_a_planted_entry():
    h = torch.ones(1, 10, 16)
    h[0, 3, 5] = -1000.0
    h2 = torch.ones(1, 10, 16) * 2
    assert S.massive_ratio([h, h2]).tolist() == [1000.0, 1.0]
    vals, pos, ch = S.top_activations([h], k=1)
    assert (vals.item(), pos.item(), ch.item()) == (1000.0, 3, 5)
    with pytest.raises(ValueError, match="median"):
        S.massive_ratio([torch.zeros(1, 3, 4)])


def test_value_norms_cut_by_head_dim_and_sink_ratio():
    v = torch.zeros(1, 3, 6)  # 3 tokens, 2 value heads of 3
    v[0, 0] = torch.tensor([3.0, 4.0, 0.0, 0.0, 0.0, 1.0])
    v[0, 1] = torch.tensor([0.0, 0.0, 2.0, 0.0, 2.0, 0.0])
    v[0, 2] = torch.tensor([6.0, 8.0, 0.0, 1.0, 0.0, 0.0])
    torch.testing.assert_close(S.value_norms(v, 3), torch.tensor([[[5.0, 2.0, 10.0], [1.0, 2.0, 1.0]]]))
    torch.testing.assert_close(S.sink_value_ratio(v, 3), torch.tensor([5.0 / 6.0, 1.0 / 1.5]))
    with pytest.raises(ValueError, match="head_dim"):
        S.value_norms(v, 4)


def test_sink_share_and_token_similarity_by_hand():
    # one head, three keys: A = (0.5, 0.25, 0.25) for query 2; ||v|| = (1, 2, 4) -> share 0.5 / (0.5 + 0.5 + 1)
    attn = torch.zeros(1, 1, 3, 3)
    attn[0, 0, 2] = torch.tensor([0.5, 0.25, 0.25])
    v = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [4.0, 0.0]]])
    assert S.sink_share(attn, v, head_dim=2, min_query=2).item() == pytest.approx(0.25)
    same = torch.ones(1, 4, 3)
    orth = torch.cat([torch.ones(1, 1, 3), torch.eye(3)[None]], dim=1)
    assert S.token_similarity(same).item() == pytest.approx(1.0)
    assert S.token_similarity(orth).item() == pytest.approx(0.0)
    assert S.kv_head_of(9, 3).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]


# ------------------------------------------------------------------------------------------------ hooks


def test_hooks_leave_no_trace_also_after_an_exception(tiny_llama, ids):
    before = _hook_count(tiny_llama)
    with torch.no_grad():
        base = tiny_llama(ids).logits
        with S.zero_sink_value(tiny_llama, [1, 2]), S.clamp_channels(tiny_llama, [3, 7], [0, 1]):
            changed = tiny_llama(ids).logits
        assert not torch.allclose(changed, base)
        with pytest.raises(RuntimeError, match="boom"):
            with S.zero_sink_value(tiny_llama, [0]), S.clamp_channels(tiny_llama, [1], [2]), \
                    S.record_values(tiny_llama):
                raise RuntimeError("boom")
        assert _hook_count(tiny_llama) == before
        torch.testing.assert_close(tiny_llama(ids).logits, base, rtol=0, atol=0)
    with pytest.raises(ValueError, match="outside"):
        with S.zero_sink_value(tiny_llama, [3]):
            pass
    assert _hook_count(tiny_llama) == before


def test_zero_sink_value_removes_exactly_a_i0_v_0_per_head(tiny_llama, ids):
    """Analytic effect on layer 0: the o_proj input changes by -A[h, i, 0] * v_0 of value head h // 2 (GQA), and
    the attention probabilities do not change."""
    attn_mod = tiny_llama.model.layers[0].self_attn
    seen = {}
    handle = attn_mod.o_proj.register_forward_pre_hook(lambda m, inp: seen.__setitem__("x", inp[0].clone()))
    try:
        with torch.no_grad(), S.record_values(tiny_llama, [0]) as vals:
            out = tiny_llama(ids, output_attentions=True)
            base_o, v = seen["x"], vals[0]
            with S.zero_sink_value(tiny_llama, [0]):
                out0 = tiny_llama(ids, output_attentions=True)
            zero_o = seen["x"]
    finally:
        handle.remove()
    torch.testing.assert_close(out0.attentions[0], out.attentions[0])
    a = out.attentions[0]  # (B, 4, T, T)
    v0 = v[:, 0].reshape(ids.shape[0], 2, 8)  # two value heads of 8
    want = torch.stack([a[:, h, :, 0, None] * v0[:, h // 2, None, :] for h in range(4)], dim=2)  # (B, T, 4, 8)
    torch.testing.assert_close(base_o - zero_o, want.reshape(ids.shape[0], ids.shape[1], 32))
    # the same identity in norms is sink_share's numerator: A_i0 ||v_0|| with the GQA head map
    delta = (base_o - zero_o).reshape(ids.shape[0], ids.shape[1], 4, 8).norm(dim=-1).transpose(1, 2)
    norms = S.value_norms(v, 8)[:, S.kv_head_of(4, 2)]  # (B, 4, T)
    torch.testing.assert_close(delta, a[..., 0] * norms[..., :1])


def test_clamp_channels_sets_the_others_mean_whatever_the_hook_order(tiny_llama, ids):
    with torch.no_grad():
        base = tiny_llama(ids, output_hidden_states=True).hidden_states  # HF installs its recorder hooks now
        with S.clamp_channels(tiny_llama, [4, 9], [1], token=0):
            got = tiny_llama(ids, output_hidden_states=True).hidden_states
    h = base[2]  # the output of layer 1, as it would have been
    want = h.clone()
    want[:, 0, [4, 9]] = h[:, 1:, [4, 9]].mean(dim=1)
    torch.testing.assert_close(got[2], want)
    torch.testing.assert_close(got[1], base[1])  # earlier layers untouched
    with pytest.raises(ValueError, match="channels"):
        with torch.no_grad(), S.clamp_channels(tiny_llama, [99], [0]):
            tiny_llama(ids)


def _lower_median(x: np.ndarray, axis=None) -> np.ndarray:
    """torch.median's convention: the lower of the two middle values for an even count."""
    x = np.sort(x.reshape(-1) if axis is None else x, axis=0 if axis is None else axis)
    n = x.shape[0 if axis is None else axis]
    return np.take(x, (n - 1) // 2, axis=0 if axis is None else axis)


def test_clip_massive_replaces_every_entry_above_factor_times_median(tiny_llama, ids):
    with torch.no_grad():
        base = tiny_llama(ids, output_hidden_states=True).hidden_states
        with S.clip_massive(tiny_llama, [1], factor=2.5):
            got = tiny_llama(ids, output_hidden_states=True).hidden_states
    h = base[2].numpy()  # the output of layer 1, as it would have been
    want, n_clipped = h.copy(), 0
    for b in range(h.shape[0]):  # by hand, one text at a time, in NumPy
        big = np.abs(h[b]) > 2.5 * _lower_median(np.abs(h[b]))
        typical = _lower_median(h[b], axis=0)  # each channel's median over the tokens
        want[b][big] = np.broadcast_to(typical, h[b].shape)[big]
        n_clipped += int(big.sum())
    assert n_clipped > 5
    np.testing.assert_allclose(got[2].numpy(), want, rtol=0, atol=0)
    torch.testing.assert_close(got[1], base[1])  # earlier layers untouched
    with pytest.raises(ValueError, match="factor"):
        with S.clip_massive(tiny_llama, [0], factor=1.0):
            pass


# ------------------------------------------------------------------------------------------------ TinyLM


def _rope_np(x: np.ndarray, base: float = 10_000.0) -> np.ndarray:
    """Rotary embedding, rotate-half convention, for (H, T, d)."""
    _, t, d = x.shape
    inv = base ** (-np.arange(0, d, 2) / d)
    ang = np.arange(t)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
    return x * cos + rot * sin


def _attention_np(att: S.tinylm.SinkAttention, x: np.ndarray, cfg: S.TinyLMConfig):
    """Reference: softmax over [k'; K] with causal mask, mixing [v'; V], sigmoid gate, QK RMSNorm."""
    w = {n: p.detach().double().numpy() for n, p in att.named_parameters()}
    t, h, hd = x.shape[0], cfg.n_heads, cfg.head_dim
    q, k, v = (x @ w[f"{n}_proj.weight"].T for n in "qkv")
    q, k, v = (a.reshape(t, h, hd).transpose(1, 0, 2) for a in (q, k, v))
    if cfg.qk_norm:
        def rms(a, g):
            return a / np.sqrt((a ** 2).mean(-1, keepdims=True) + cfg.eps) * g
        q, k = rms(q, w["q_norm.weight"]), rms(k, w["k_norm.weight"])
    q, k = _rope_np(q), _rope_np(k)
    logits = np.einsum("hid,hjd->hij", q, k) / math.sqrt(hd)
    logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
    if cfg.kv_bias:
        bias_logit = np.einsum("hid,hd->hi", q, w["k_bias"]) / math.sqrt(hd)
        full = np.concatenate([bias_logit[..., None], logits], axis=-1)
        p = np.exp(full - full.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out = np.einsum("hij,hjd->hid", p[..., 1:], v) + p[..., :1] * w["v_bias"][:, None, :]
        probs = p[..., 1:]
    else:
        p = np.exp(logits - logits.max(-1, keepdims=True))
        probs = p / p.sum(-1, keepdims=True)
        out = np.einsum("hij,hjd->hid", probs, v)
    out = out.transpose(1, 0, 2).reshape(t, h * hd)
    if cfg.out_gate:
        out = out / (1 + np.exp(-(x @ w["g_proj.weight"].T)))
    return out @ w["o_proj.weight"].T, probs


@pytest.mark.parametrize("switches", [{}, {"kv_bias": True}, {"kv_bias": True, "out_gate": True, "qk_norm": True}])
def test_tinylm_attention_matches_numpy_reference(switches):
    torch.manual_seed(3)
    cfg = S.TinyLMConfig(vocab_size=16, max_len=9, d_model=16, n_heads=2, **switches)
    att = S.tinylm.SinkAttention(cfg).double()
    if cfg.kv_bias:
        with torch.no_grad():
            att.v_bias.normal_()
    x = torch.randn(1, 9, 16, dtype=torch.float64)
    from repro.common.nn import rotary_tables
    out, probs, bias_p = att(x, rotary_tables(torch.arange(9), 8, dtype=torch.float64))
    want_out, want_probs = _attention_np(att, x[0].numpy(), cfg)
    np.testing.assert_allclose(out[0].detach().numpy(), want_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(probs[0].detach().numpy(), want_probs, rtol=1e-10, atol=1e-12)
    total = probs.sum(-1) + (bias_p if bias_p is not None else 0)
    torch.testing.assert_close(total, torch.ones_like(total))


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_tinylm_hooks_outputs_and_bad_input(norm):
    torch.manual_seed(0)
    cfg = S.TinyLMConfig(vocab_size=16, max_len=10, d_model=16, n_layers=2, n_heads=2, kv_bias=True, norm=norm)
    model = S.TinyLM(cfg).eval()
    x = torch.randint(0, 16, (3, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(x, output_attentions=True, output_hidden_states=True)
        assert out.logits.shape == (3, 10, 16) and len(out.hidden_states) == 3
        assert S.sink_scores(out.attentions).shape == (2, 2) and len(out.bias_attention) == 2
        with S.clamp_channels(model, [2], [0]):
            clamped = model(x, output_hidden_states=True).hidden_states[1]
        h = out.hidden_states[1]
        torch.testing.assert_close(clamped[:, 0, 2], h[:, 1:, 2].mean(dim=1))
        with S.zero_sink_value(model, [0, 1]):
            assert not torch.allclose(model(x).logits, out.logits)
        torch.testing.assert_close(model(x).logits, out.logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="token ids"):
        model(torch.full((1, 4), 16))
    with pytest.raises(ValueError, match="sequence length"):
        model(torch.zeros(1, 11, dtype=torch.long))
    with pytest.raises(ValueError, match="norm"):
        S.TinyLMConfig(vocab_size=4, max_len=4, norm="sandwich")


def test_bigram_backcopy_follows_its_rule_and_variant_study_runs():
    task = S.bigram_backcopy(vocab=12, n_triggers=2, trigger_prob=0.3, rng=np.random.default_rng(0))
    seqs = task.sample(64, 20, torch.Generator().manual_seed(0))
    assert (seqs[:, 0] == 0).all() and (seqs[:, 1:] != 0).all()
    prev, back, nxt = seqs[:, 1:-1], seqs[:, :-2], seqs[:, 2:]
    copy = task.is_trigger(prev) & (back != 0)
    assert copy.sum() > 20 and (nxt[copy] == back[copy]).all()
    # optimal NLL by hand on one sequence
    s = seqs[:1]
    terms = [-math.log(task.transition[0, s[0, 1]])]
    for t in range(2, 20):
        is_copy = 1 <= int(s[0, t - 1]) <= 2 and int(s[0, t - 2]) != 0
        terms.append(0.0 if is_copy else -math.log(task.transition[s[0, t - 1], s[0, t]]))
    assert task.optimal_nll(s) == pytest.approx(np.mean(terms), rel=1e-6)
    res = S.variant_study([{}, {"out_gate": True}], steps=4, batch=4, length=12, d_model=16, n_layers=1,
                          n_heads=2, vocab=12)
    assert [r.label for r in res] == ["pre", "pre+gate"]
    assert all(np.isfinite(r.val_nll) and 0 <= r.sink <= 1 and len(r.losses) == 4 for r in res)


# ------------------------------------------------------------------------------------------------ SmolLM2


def test_smollm2_sink_and_massive_channel():
    """The real model: 30 layers with GQA value heads of 64; a sink on the first token in the middle layers and
    a massive activation in one channel (507) of the first token; hooks work on it."""
    from repro.common import assets

    try:
        model, tok = assets.load_smollm2()
    except assets.AssetMissingError as e:  # pragma: no cover
        pytest.skip(str(e))
    ids = S.encode(tok, S.TEXTS[:2], 16)
    base = S.measure(model, ids)
    assert len(S.decoder_layers(model)) == 30 and base.value_ratio.shape == (30, 3)
    assert float(base.sink[12:28].mean()) > 0.3
    assert base.ratio.max() > 1000 and set(base.top_channel[:, 12:28].flatten().tolist()) == {507}
    clamped = S.measure(model, ids, clamp_layers=range(4, 30), channels=S.massive_channels(base))
    assert clamped.ratio[12:].max() < 0.1 * base.ratio[12:].max() and clamped.nll > base.nll
    sweep = S.suppression_sweep(model, ids, [1000.0], from_layer=4)  # every massive activation removed
    assert sweep.max_ratio.shape == (1, 2) and float(sweep.max_ratio.max()) < 1100
    assert sweep.sink.shape == (1, 2, 30) and torch.isfinite(sweep.nll).all()


# ----------------------------------------------------------------------------------------- per-text values, nulls


def test_uniform_attention_scores_the_harmonic_mean_and_per_row_pools():
    """Uniform causal attention puts 1/(i+1) on position 0; the per-row sink scores average to the pooled ones."""
    t = 12
    got = S.sink_scores([S.uniform_attention(2, 3, t)], min_query=4)
    assert got.shape == (1, 3)
    np.testing.assert_allclose(got.numpy(), np.mean([1 / (i + 1) for i in range(4, t)]), rtol=1e-12)
    gen = torch.Generator().manual_seed(0)
    attn = [torch.softmax(torch.randn(3, 2, t, t, generator=gen), dim=-1) for _ in range(2)]
    rows = S.sink_scores(attn, per_row=True)
    assert rows.shape == (2, 3, 2)
    torch.testing.assert_close(rows.mean(dim=1), S.sink_scores(attn))
    torch.testing.assert_close(rows[:, 1], S.sink_scores([a[1:2] for a in attn]))
    v = torch.randn(3, t, 4, generator=gen)
    per = S.sink_share(attn[0], v, head_dim=2, per_row=True)
    assert per.shape == (3, 2)
    torch.testing.assert_close(per.mean(dim=0), S.sink_share(attn[0], v, head_dim=2))


def test_small_value_share_by_hand():
    # one text, 4 layers, 1 value head, 3 tokens: token 0's ratio to the others' mean is 0.25, 1, 0.5, 0.6
    norms = torch.tensor([[[1.0, 4.0, 4.0]], [[2.0, 2.0, 2.0]], [[1.0, 2.0, 2.0]], [[3.0, 4.0, 6.0]]])[None]
    assert S.small_value_share(norms, 0, first_layer=0).tolist() == [0.5]  # layers 0 and 2 are <= 0.5
    assert S.small_value_share(norms, 0, first_layer=1).item() == pytest.approx(1 / 3)
    assert S.small_value_share(norms, 0, first_layer=0, threshold=0.6).item() == pytest.approx(0.75)
    with pytest.raises(ValueError, match="first_layer"):
        S.small_value_share(norms, 0, first_layer=4)


def test_recovered_share_and_group_means_by_hand():
    clamped, repaired, base = np.array([10.0, 14.0]), np.array([4.0, 6.0]), np.array([2.0, 4.0])
    assert S.recovered_share(clamped, repaired, base) == pytest.approx((12 - 5) / (12 - 3))
    assert S.group_means([1.0, 2.0, 6.0], ["a", "a", "b"]) == {"a": 1.5, "b": 6.0, "all": 3.0}
    with pytest.raises(ValueError, match="labels"):
        S.group_means([1.0], ["a", "b"])


def test_stdlib_docstrings_are_read_without_importing():
    docs = S.stdlib_docstrings()
    assert len(docs) == len(S.DOC_MODULES) == 16 and all(len(d.split()) >= 50 for d in docs)
    assert all("  " not in d and "\n" not in d for d in docs)
    import doctest
    assert docs[S.DOC_MODULES.index("doctest")] == " ".join(doctest.__doc__.split())
    with pytest.raises(ValueError, match="pure-Python"):
        S.stdlib_docstrings(["math"])


def test_measure_keeps_per_text_values_that_pool_to_the_totals(tiny_llama, ids):
    m = S.measure(tiny_llama, ids)
    assert m.nll_text.shape == (2,) and m.nll == pytest.approx(float(m.nll_text.mean()))
    torch.testing.assert_close(m.sink_text.mean(dim=0), m.sink)
    torch.testing.assert_close(m.share_text.mean(dim=0), m.share)
    torch.testing.assert_close(m.similarity_text.mean(dim=0), m.similarity)
    one = S.measure(tiny_llama, ids[1:])
    assert float(m.nll_text[1]) == pytest.approx(one.nll, rel=1e-9)
    torch.testing.assert_close(m.sink_text[1], one.sink)
    assert m.value_norm.shape == (2, 3, 2, 12) and (m.channel_peak_rest <= m.channel_peak).all()
    ranked = S.ranked_channels(m)
    assert sorted(ranked) == list(range(32)) and S.massive_channels(m, 2) == ranked[:2]
    assert S.ordinary_channels(m, 2) == ranked[16:18]
    # zeroing another token's value: changes the output, and is not the sink-value hook
    z1 = S.measure(tiny_llama, ids, zero_layers=[1, 2], zero_token=1)
    z0 = S.measure(tiny_llama, ids, zero_layers=[1, 2])
    assert z1.nll != m.nll and z1.nll != z0.nll
    torch.testing.assert_close(z1.value_norm[:, 1:, :, 1], torch.zeros(2, 2, 2, dtype=z1.value_norm.dtype))


def test_suppression_sweep_keeps_per_text_sinks(tiny_llama, ids):
    sw = S.suppression_sweep(tiny_llama, ids, [5.0, 2.0], from_layer=1)
    assert sw.sink_text.shape == (2, 2, 2, 3)
    torch.testing.assert_close(sw.sink_text.mean(dim=2), sw.sink)
    assert sw.sink_mid_text(slice(1, 3)).shape == (2, 2, 2)
