"""Tests of the shared small transformer ``repro.nn`` against independent references: causality by
perturbation, the prefix KV cache against the full forward, RoPE's relative-position property, a hand-written
attention, and clear errors on bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from repro.common.nn import KVCache, Transformer, TransformerConfig, apply_rotary, rotary_tables


def model(causal: bool, positions: str = "learned", seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=11, max_len=24, d_model=32, n_layers=2, n_heads=4, causal=causal,
                            positions=positions, **kw)
    return Transformer(cfg).eval().double()


def tokens(b: int = 3, t: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 11, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_causal_model_ignores_the_future_and_bidirectional_does_not(positions):
    x = tokens()
    y = x.clone()
    y[:, 8] = (y[:, 8] + 1) % 11  # change one token at position 8
    causal, bidir = model(True, positions), model(False, positions)
    with torch.no_grad():
        a, b = causal(x), causal(y)
        torch.testing.assert_close(a[:, :8], b[:, :8], rtol=0, atol=1e-12)
        assert (a[:, 8:] - b[:, 8:]).abs().max() > 1e-4
        c, d = bidir(x), bidir(y)
        assert (c[:, :8] - d[:, :8]).abs().max() > 1e-4


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_prefix_cache_reproduces_the_full_forward(causal, positions):
    """Keys/values of a prefix taken from the full forward, then the suffix fed alone with them: identical
    logits (for both attention kinds, since the prefix keys are exactly the ones of the full pass)."""
    m, x = model(causal, positions), tokens()
    with torch.no_grad():
        full, cache = m(x, return_cache=True)
        assert cache.length == x.shape[1]
        for n in (1, 5, 11):
            suffix = m(x[:, n:], cache=cache.prefix(n))
            torch.testing.assert_close(suffix, full[:, n:], rtol=1e-10, atol=1e-10)


def test_incremental_causal_decoding_with_cache_matches_full_forward():
    m, x = model(True, "rotary"), tokens(2, 10)
    with torch.no_grad():
        full = m(x)
        logits, cache = m(x[:, :1], return_cache=True)
        steps = [logits]
        for i in range(1, x.shape[1]):
            logits, cache = m(x[:, i:i + 1], cache=cache, return_cache=True)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)


def test_attention_matches_a_hand_written_reference():
    """One layer, no MLP contribution checked separately: recompute the block by hand."""
    m = model(False)
    blk = m.blocks[0]
    x = torch.randn(2, 7, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    h = F.layer_norm(x, (32,), blk.ln1.weight, blk.ln1.bias)
    q, k, v = (h @ blk.qkv.weight.T + blk.qkv.bias).split(32, dim=-1)
    heads = [slice(i * 8, (i + 1) * 8) for i in range(4)]
    outs = []
    for s in heads:
        w = torch.softmax(q[..., s] @ k[..., s].transpose(1, 2) / math.sqrt(8), dim=-1)
        outs.append(w @ v[..., s])
    att = torch.cat(outs, -1) @ blk.proj.weight.T + blk.proj.bias
    y = x + att
    y = y + blk.mlp(F.layer_norm(y, (32,), blk.ln2.weight, blk.ln2.bias))
    with torch.no_grad():
        got, _, _ = blk(x, None, None, None, False)
    torch.testing.assert_close(got, y, rtol=1e-10, atol=1e-10)


def test_rotary_scores_depend_only_on_relative_position():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, generator=g, dtype=torch.float64), torch.randn(1, 1, 1, 16, generator=g,
                                                                                   dtype=torch.float64)

    def score(i: int, j: int) -> float:
        ci, si = rotary_tables(torch.tensor([i]), 16, dtype=torch.float64)
        cj, sj = rotary_tables(torch.tensor([j]), 16, dtype=torch.float64)
        return float((apply_rotary(q, ci, si) * apply_rotary(k, cj, sj)).sum())

    assert score(5, 2) == pytest.approx(score(13, 10), abs=1e-10)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-6)
    c, s = rotary_tables(torch.tensor([7]), 16, dtype=torch.float64)
    assert float(apply_rotary(q, c, s).norm()) == pytest.approx(float(q.norm()), rel=1e-12)  # a rotation


def test_attn_mask_restricts_attention():
    """A block-diagonal mask makes the two halves independent."""
    m, x = model(False), tokens(2, 8)
    mask = torch.zeros(8, 8, dtype=torch.bool)
    mask[:4, :4] = mask[4:, 4:] = True
    y = x.clone()
    y[:, 6] = (y[:, 6] + 3) % 11
    with torch.no_grad():
        torch.testing.assert_close(m(x, attn_mask=mask)[:, :4], m(y, attn_mask=mask)[:, :4], rtol=0, atol=1e-12)


def test_kvcache_helpers():
    m, x = model(False), tokens(3, 6)
    with torch.no_grad():
        _, cache = m(x, return_cache=True)
    assert isinstance(cache, KVCache) and cache.prefix(2).length == 2
    assert cache.rows(torch.tensor([0, 2])).keys[0].shape[0] == 2
    with pytest.raises(ValueError):
        cache.prefix(7)


def test_training_a_causal_model_learns_to_copy():
    """Smoke test that gradients flow: a causal model learns 'repeat the previous token'."""
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(vocab_size=8, max_len=16, d_model=32, n_layers=1, n_heads=2, causal=True))
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(150):
        x = torch.randint(0, 8, (32, 1), generator=g).repeat(1, 8)
        loss = F.cross_entropy(m(x)[:, :-1].reshape(-1, 8), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


def test_bad_input_raises():
    with pytest.raises(ValueError, match="divisible"):
        TransformerConfig(vocab_size=5, max_len=8, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="positions"):
        TransformerConfig(vocab_size=5, max_len=8, positions="alibi")
    with pytest.raises(ValueError, match="vocab_size"):
        TransformerConfig(vocab_size=0, max_len=8)
    m = model(False)
    with pytest.raises(ValueError, match="max_len"):
        m(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match="batch, length"):
        m(torch.zeros(25, dtype=torch.long))
    with pytest.raises(ValueError, match="attn_mask"):
        m(torch.zeros(1, 4, dtype=torch.long), attn_mask=torch.ones(4, 5, dtype=torch.bool))
