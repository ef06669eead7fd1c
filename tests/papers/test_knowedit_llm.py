"""Tests of the SmolLM2 tier of paper 06 (``repro.papers.knowedit.llm``) against independent references: the llama
MLP written out by hand and transformers' own hidden states (the hooked keys), the exact ROME identity
``W' k* = v*`` on the real model, and the v* hook's prediction against the edited model's greedy answer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from repro.papers import knowedit as K
from repro.papers.knowedit import llm as KL


@pytest.fixture(scope="module")
def tiny_llama() -> LlamaForCausalLM:
    """A tiny random llama (float64): 3 layers, width 32, MLP 48, grouped-query attention."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).double().eval()
    for blk in model.model.layers:  # non-trivial norm weights, so the by-hand RMSNorm is tested too
        blk.post_attention_layernorm.weight.data.uniform_(0.5, 1.5)
    return model


def test_down_proj_keys_are_the_llama_mlp_input_by_hand(tiny_llama):
    """The hooked key equals silu(W_gate x) ⊙ (W_up x), x = RMSNorm(h_mid) by hand, where h_mid + W_down k is the
    residual stream transformers returns after the layer; the early-stopped passes leave no hook behind."""
    ids = torch.randint(0, 64, (3, 10), generator=torch.Generator().manual_seed(1))
    layer = 1
    blk = tiny_llama.model.layers[layer]
    hooks = lambda: sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in tiny_llama.modules())  # noqa: E731
    keys = KL.down_proj_keys(tiny_llama, layer, ids, batch=2)  # two passes, both stopped at the layer
    mid: list[torch.Tensor] = []
    h = blk.post_attention_layernorm.register_forward_pre_hook(lambda m, inp: mid.append(inp[0]))
    with torch.no_grad():
        out = tiny_llama(input_ids=ids, output_hidden_states=True)
    h.remove()
    hm = mid[0]
    norm = blk.post_attention_layernorm
    x = hm / torch.sqrt((hm * hm).mean(-1, keepdim=True) + norm.variance_epsilon) * norm.weight
    mlp = blk.mlp
    k_ref = F.silu(x @ mlp.gate_proj.weight.T) * (x @ mlp.up_proj.weight.T)
    tol = dict(rtol=1e-5, atol=1e-6)  # transformers' RMSNorm rounds through float32
    torch.testing.assert_close(keys, k_ref.reshape(-1, 48), **tol)
    torch.testing.assert_close(hm + k_ref @ mlp.down_proj.weight.T, out.hidden_states[layer + 1], **tol)
    at = KL.keys_at(KL.LogitsOf(tiny_llama), mlp.down_proj, ids, torch.tensor([0, 4, 9]))
    torch.testing.assert_close(at, keys.reshape(3, 10, 48)[[0, 1, 2], [0, 4, 9]], rtol=1e-12, atol=1e-12)
    n_hooks = hooks()  # transformers installs some of its own (output recorders)
    torch.testing.assert_close(KL.down_proj_keys(tiny_llama, layer, ids, batch=3), keys, rtol=0, atol=0)
    assert hooks() == n_hooks
    with pytest.raises(ValueError, match="layer"):
        KL.down_proj(tiny_llama, 3)


def test_facts_words_and_corpus():
    facts = KL.candidate_facts()
    assert len(facts) >= 300 and all(f.subject and f.objects and "{}" not in f.prompt for f in facts)
    assert {f.relation for f in facts} == set(KL.TEMPLATES)
    france = next(f for f in facts if f.relation == "capital" and f.subject == "France")
    assert france.prompt == "The capital of France is" and france.answers == {"paris"}
    assert KL.first_word(' "Paris," the city') == "paris"
    assert KL.first_word(" the Netherlands.") == "netherlands" and KL.first_word(" the") == "the"
    assert KL.first_word("\n 12\n") == "12" and KL.first_word("  ") == ""
    assert not set(KL.COV_MODULES) & set(KL.HELDOUT_MODULES)
    docs = KL.docstring_corpus(("textwrap", "bisect"))
    assert docs == KL.docstring_corpus(("textwrap", "bisect")) and len(docs) >= 3
    assert all(len(d) >= 80 for d in docs) and len(set(docs)) == len(docs)
    probe = KL.arithmetic_probe()
    assert len(probe) == 100 and all(p.endswith(" =") and int(a) == int(p[-7]) + int(p[-3]) for p, a in probe)


def test_rome_edit_of_smollm2_matches_the_v_star_hook():
    """On the real model: v* (δ added at the subject's last token) makes the counterfactual the next-token argmax;
    ROME writes it into ``down_proj`` exactly (W' k* = v*), and the edited model's greedy answer, without any hook,
    is the one the hook predicted; restoring W gives back the original answer."""
    from repro.common import assets

    try:
        model, tok = assets.load_smollm2()
    except assets.AssetMissingError as e:  # pragma: no cover
        pytest.skip(str(e))
    fact, layer = KL.Fact("capital", "France", ("Paris",)), 10
    assert KL.first_word(KL.greedy_continuations(model, tok, [fact.prompt])[0]) == "paris"
    rows, subj, ans, n = KL.edit_rows(tok, fact)
    assert tok.decode(rows[0, subj[0]]).strip() == "France" and n == len(KL.PREFIXES) + 1
    assert tok.decode(rows[n, subj[n]]).strip() == "France"  # the essence prompt's subject
    tid = KL.single_token_id(tok, "Rome")
    Kx, V = KL.edit_targets(model, tok, layer, [fact], [tid], v_steps=20)
    mod = KL.down_proj(model, layer)
    W0 = mod.weight.data.clone()
    delta = V[0] - W0 @ Kx[0]
    plain = rows[:1, : int(ans[0]) + 1]

    def add_delta(m, inp, out):
        out = out.clone()
        out[0, subj[0]] += delta
        return out

    h = mod.register_forward_hook(add_delta)
    with torch.no_grad():
        hooked = int(model(input_ids=plain).logits[0, -1].argmax())
    h.remove()
    assert hooked == tid  # the v* hook predicts the counterfactual
    docs = KL.token_chunks(tok, KL.docstring_corpus(("textwrap", "difflib")), 8, 64)
    keys = KL.down_proj_keys(model, layer, docs).double()
    C = K.key_covariance(keys, lam=1e-2 * float(torch.trace(K.key_covariance(keys))) / keys.shape[1])
    dW = K.rome_update(W0.double(), Kx[0].double(), V[0].double(), torch.linalg.inv(C))
    try:
        mod.weight.data += dW.float()
        got = mod.weight.data.double() @ Kx[0].double()
        torch.testing.assert_close(got, V[0].double(), rtol=1e-4, atol=1e-4 * float(V[0].abs().max()))
        with torch.no_grad():
            edited = int(model(input_ids=plain).logits[0, -1].argmax())
        assert edited == hooked
        assert KL.first_word(KL.greedy_continuations(model, tok, [fact.prompt])[0]) == "rome"
    finally:
        mod.weight.data.copy_(W0)
    assert KL.first_word(KL.greedy_continuations(model, tok, [fact.prompt])[0]) == "paris"


def test_bad_input_errors(tiny_llama):
    class Tok:
        def __call__(self, text, return_tensors=None):
            return type("E", (), {"input_ids": torch.zeros(1, 5, dtype=torch.long)})()

    with pytest.raises(ValueError, match="fewer than"):
        KL.token_chunks(Tok(), ["short"], 2, 4)
    with pytest.raises(ValueError, match="non-empty"):
        KL.greedy_continuations(tiny_llama, Tok(), [])
    with pytest.raises(ValueError, match="unknown editor"):
        KL.run_llm_parametric(tiny_llama, Tok(), None, "memit5", 2, [1], C=torch.eye(48))
    with pytest.raises(ValueError, match="last being the edited layer 2"):
        KL.run_llm_parametric(tiny_llama, Tok(), None, "memit_spread", 2, [1], C=torch.eye(48),
                              covs={0: torch.eye(48), 1: torch.eye(48)})


def _spread_setup(tiny_llama):
    import copy

    model = copy.deepcopy(tiny_llama)  # the fixture is shared: edit a copy
    g = torch.Generator().manual_seed(3)
    prompts = [(torch.randint(0, 64, (1, 8), generator=g), torch.tensor([p])) for p in (3, 6)]
    ids = torch.randint(0, 64, (16, 12), generator=g)
    covs = {m: K.key_covariance(KL.down_proj_keys(model, m, ids).double()) for m in range(3)}
    deltas = 0.5 * torch.randn(2, 32, generator=g, dtype=torch.float64)
    return model, prompts, covs, deltas


def test_memit_spread_reaches_its_targets_layer_by_layer(tiny_llama):
    """MEMIT over layers 0, 1, 2 with a vanishing prior weight: the residual stream after the last layer reaches
    z = h + δ at both edits' subject positions, and the first layer wrote exactly a third of δ into its own output
    (nothing had moved before it; its keys come before its down_proj, so they do not move)."""
    model, prompts, covs, deltas = _spread_setup(tiny_llama)
    lm = KL.LogitsOf(model)
    h = torch.cat([KL.layer_output_at(model, 2, t, p) for t, p in prompts])
    k0 = torch.cat([KL.keys_at(lm, KL.down_proj(model, 0), t, p) for t, p in prompts])
    W0 = KL.down_proj(model, 0).weight.data.clone()
    KL.memit_spread(model, [0, 1, 2], prompts, deltas, covs, weight=1e-9)
    after = torch.cat([KL.layer_output_at(model, 2, t, p) for t, p in prompts])
    torch.testing.assert_close(after, h + deltas, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k0 @ (KL.down_proj(model, 0).weight.data - W0).T, deltas / 3, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="increasing"):
        KL.memit_spread(model, [2, 1], prompts, deltas, covs, 1.0)
    with pytest.raises(ValueError, match="prompts for"):
        KL.memit_spread(model, [2], prompts[:1], deltas, covs, 1.0)


def test_memit_spread_over_one_layer_is_memit(tiny_llama):
    """With one layer the spread is MEMIT's one-layer update ``memit_update(W, K, K Wᵀ + δ, λC)``, and with
    MEMIT's prior weight it writes only part of δ (the reason a one-layer MEMIT barely edits SmolLM2)."""
    model, prompts, covs, deltas = _spread_setup(tiny_llama)
    mod = KL.down_proj(model, 2)
    W = mod.weight.data.clone()
    Kk = torch.cat([KL.keys_at(KL.LogitsOf(model), mod, t, p) for t, p in prompts])
    ref = W + K.memit_update(W, Kk, Kk @ W.T + deltas, 15000.0 * covs[2])
    h = torch.cat([KL.layer_output_at(model, 2, t, p) for t, p in prompts])
    KL.memit_spread(model, [2], prompts, deltas, covs, weight=15000.0)
    torch.testing.assert_close(mod.weight.data, ref, rtol=1e-12, atol=1e-12)
    moved = torch.cat([KL.layer_output_at(model, 2, t, p) for t, p in prompts]) - h
    share = (moved * deltas).sum(1) / (deltas * deltas).sum(1)
    assert (share > 0).all() and (share < 0.5).all()


def test_spread_and_the_smaller_probes():
    """The smoke tier's smaller sets: ``spread`` keeps the first and last items and is the identity at full size, so
    full mode screens every fact and asks every sum, in the order it always did."""
    assert KL.spread(range(10), 3) == [0, 4, 9] and KL.spread(range(10), None) == list(range(10))
    assert KL.spread(range(10), 10) == KL.spread(range(10), 99) == list(range(10))
    with pytest.raises(ValueError, match="n must be"):
        KL.spread(range(10), 0)
    assert KL.arithmetic_probe(100) == KL.arithmetic_probe()
    few = KL.arithmetic_probe(3)
    assert [a for _, a in few] == ["0", "5", "18"] and few[0][0].endswith("0 + 0 =")
    assert [w for _, w in KL.copy_probe(np.random.default_rng(0), 2)] == \
        [w for _, w in KL.copy_probe(np.random.default_rng(0))][:2]
