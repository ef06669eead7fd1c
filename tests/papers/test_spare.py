"""repro.papers.spare against independent references: scikit-learn's dictionary learning on a planted sparse
dictionary, brute-force set logic for the concept rules, numpy for the decoded vectors, an unedited model
teacher-forced on the generated tokens for the hooks, RDKit called directly for the properties, and SELFIES round
trips checked on canonical SMILES."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from rdkit import Chem
from rdkit.Chem import QED, Crippen, rdMolDescriptors
from sklearn.decomposition import DictionaryLearning
from torch import nn

from repro.common.nn import Transformer, TransformerConfig
from repro.papers import spare as S
from repro.papers.spare import experiment as X
from repro.papers.spare import molecules as mol


# ------------------------------------------------------------------------------------------------------------ SAE
def planted(n: int, d: int, m: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """z = s D with D's m rows random unit atoms and s k-sparse, non-negative, of unit norm (what an L2-normalised
    code can represent exactly)."""
    g = np.random.default_rng(seed)
    D = g.normal(size=(m, d))
    D /= np.linalg.norm(D, axis=1, keepdims=True)
    codes = np.zeros((n, m))
    for i in range(n):
        codes[i, g.choice(m, k, replace=False)] = g.uniform(0.5, 1.5, k)
    codes /= np.linalg.norm(codes, axis=1, keepdims=True)
    return codes @ D, D


def recovered(D: np.ndarray, atoms: np.ndarray, cos: float = 0.9) -> float:
    """Share of true atoms with a learned atom at |cosine| >= cos."""
    atoms = atoms / np.linalg.norm(atoms, axis=1, keepdims=True)
    return float((np.abs(D @ atoms.T).max(1) >= cos).mean())


def test_sae_recovers_a_planted_dictionary_like_sklearn():
    Z, D = planted(4000, 32, 32, 2, seed=0)
    sae = S.train_sae(torch.tensor(Z, dtype=torch.float32), expansion=4, l1=0.5, epochs=30, batch_size=256, lr=1e-2,
                      seed=0)
    ours = recovered(D, sae.atoms.detach().numpy())
    ref = DictionaryLearning(n_components=32, alpha=0.05, max_iter=30, positive_code=True, fit_algorithm="cd",
                             transform_algorithm="lasso_cd", random_state=0).fit(Z[:500])
    theirs = recovered(D, ref.components_)
    assert theirs >= 0.8, "the reference should find the planted atoms (the task is identifiable)"
    assert ours >= 0.8 and ours >= theirs - 0.1
    fvu, l0 = sae.fvu_l0(torch.tensor(Z, dtype=torch.float32))
    assert fvu < 0.05 and 1.5 <= l0 <= 3.5  # two atoms per sample


def test_sae_codes_and_loss_by_hand():
    sae = S.SparseAutoencoder(3, expansion=1, l1=0.1, normalization="l2")
    with torch.no_grad():
        sae.encoder.weight.copy_(torch.eye(3))
        sae.encoder.bias.zero_()
        sae.decoder.weight.copy_(2 * torch.eye(3))
        sae.decoder.bias.fill_(1.0)
    z = torch.tensor([[3.0, -1.0, 4.0], [-1.0, -2.0, -3.0]])
    h = sae.encode(z)
    assert torch.allclose(h[0], torch.tensor([0.6, 0.0, 0.8]))  # ReLU, then divided by its L2 norm 5
    assert torch.equal(h[1], torch.zeros(3))  # an all-zero code stays zero
    z_hat = torch.tensor([[2.2, 1.0, 2.6], [1.0, 1.0, 1.0]])
    expected = ((z - z_hat) ** 2).mean() + 0.1 * torch.tensor([0.6, 0.0, 0.8, 0, 0, 0]).abs().mean()
    assert torch.allclose(sae.loss(z), expected)
    sae.normalization = "max"
    assert torch.allclose(sae.encode(z)[0], torch.tensor([0.75, 0.0, 1.0]))
    codes = S.SparseAutoencoder(8, expansion=5).encode(torch.randn(50, 8))
    nz = codes.abs().sum(1) > 0
    assert torch.allclose(codes[nz].norm(dim=1), torch.ones(int(nz.sum())))


def test_sae_rejects_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        S.train_sae(torch.tensor([[0.0, float("nan")]]), epochs=1)
    with pytest.raises(ValueError, match="non-empty"):
        S.train_sae(torch.zeros(0, 4), epochs=1)
    with pytest.raises(ValueError, match="normalization"):
        S.SparseAutoencoder(4, normalization="l1")
    with pytest.raises(ValueError, match="width"):
        S.SparseAutoencoder(4).code_stats(torch.zeros(3, 5))


# -------------------------------------------------------------------------------------------------- concept rules
def identity_sae(d: int, seed: int = 0) -> S.SparseAutoencoder:
    """An SAE whose codes are ReLU(z) (identity encoder, no normalisation) and a random decoder."""
    sae = S.SparseAutoencoder(d, expansion=1, normalization="none")
    with torch.no_grad():
        sae.encoder.weight.copy_(torch.eye(d))
        sae.encoder.bias.zero_()
        sae.decoder.weight.copy_(torch.randn(d, d, generator=torch.Generator().manual_seed(seed)))
    return sae


def brute_local(codes: np.ndarray, thr: float, min_fraction: float) -> list[int]:
    out = []
    for j in range(codes.shape[1]):
        hits = sum(1 for r in range(codes.shape[0]) if codes[r, j] >= thr)
        if hits / codes.shape[0] >= min_fraction:
            out.append(j)
    return out


def brute_global(pos: np.ndarray, neg: np.ndarray, thr: float) -> list[int]:
    return [j for j in range(pos.shape[1]) if all(pos[:, j] >= thr) and all(neg[:, j] < thr)]


def concept_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = np.random.default_rng(seed)
    pos, neg = g.uniform(0, 1, (40, 12)), g.uniform(0, 1, (30, 12))
    pos[:, [1, 4, 7]] = g.uniform(0.5, 1, (40, 3))  # planted: always on in positives...
    neg[:, [1, 4]] = g.uniform(0, 0.49, (30, 2))  # ...and off in negatives for 1 and 4 only
    pos[:, 9] = g.uniform(0.5, 1, 40)
    pos[3, 9] = 0.5  # on the threshold: counts as active (>=)
    neg[:, 9] = g.uniform(0, 0.49, 30)
    return torch.tensor(pos, dtype=torch.float32), torch.tensor(neg, dtype=torch.float32)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_global_concept_matches_brute_force(seed):
    pos, neg = concept_data(seed)
    sae = identity_sae(12, seed)
    v, ids, mode = S.global_concept(sae, pos, neg, threshold=0.5)
    expected = brute_global(pos.numpy(), neg.numpy(), 0.5)
    assert ids.tolist() == expected and {1, 4, 9} <= set(expected) and mode == "thresholded_decoder_difference"
    delta = np.zeros(12)
    delta[expected] = pos.numpy()[:, expected].mean(0) - neg.numpy()[:, expected].mean(0)
    np.testing.assert_allclose(v.numpy(), sae.decoder.weight.detach().numpy() @ delta, rtol=1e-5, atol=1e-6)


def test_global_concept_with_no_feature_raises_unless_fallback_is_asked():
    g = np.random.default_rng(3)
    pos = torch.tensor(g.uniform(0, 1, (40, 12)), dtype=torch.float32)
    neg = torch.tensor(g.uniform(0, 1, (30, 12)), dtype=torch.float32)
    sae = identity_sae(12)
    assert brute_global(pos.numpy(), neg.numpy(), 0.5) == []
    with pytest.raises(ValueError, match="global concept is empty"):
        S.global_concept(sae, pos, neg)
    v, ids, mode = S.global_concept(sae, pos, neg, fallback=True)
    assert ids.numel() == 0 and mode == "mean_decoder_difference"
    delta = pos.numpy().mean(0) - neg.numpy().mean(0)  # codes = ReLU(z) = z here (all positive)
    np.testing.assert_allclose(v.numpy(), sae.decoder.weight.detach().numpy() @ delta, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("min_fraction", [1.0, 0.6, 0.25])
def test_local_concept_matches_brute_force(min_fraction):
    pos, _ = concept_data(4)
    sae = identity_sae(12, 4)
    expected = brute_local(pos.numpy(), 0.5, min_fraction)
    v, ids = S.local_concept(sae, pos, threshold=0.5, min_fraction=min_fraction)
    assert ids.tolist() == expected and len(expected) >= 3
    np.testing.assert_allclose(v.numpy(), sae.decoder.weight.detach().numpy()[:, expected].mean(1), rtol=1e-5)


def test_local_concept_with_no_feature_raises():
    sae = identity_sae(6)
    acts = torch.full((10, 6), 0.2)
    acts[0, 2] = 0.9  # one row only: 10 % of the exemplars
    with pytest.raises(ValueError, match="local concept is empty"):
        S.local_concept(sae, acts)
    _, ids = S.local_concept(sae, acts, min_fraction=0.1)
    assert ids.tolist() == [2]
    with pytest.raises(ValueError, match="min_fraction"):
        S.local_concept(sae, acts, min_fraction=0.0)


def test_ranked_concept_is_the_top_k_code_difference():
    pos, neg = concept_data(5)
    sae = identity_sae(12, 5)
    delta = pos.numpy().mean(0) - neg.numpy().mean(0)
    top = sorted(np.argsort(-delta)[:3].tolist())
    v, ids = S.ranked_concept(sae, pos, neg, 3)
    assert ids.tolist() == top
    np.testing.assert_allclose(v.numpy(), sae.decoder.weight.detach().numpy()[:, top] @ delta[top], rtol=1e-5,
                               atol=1e-6)


# --------------------------------------------------------------------------------------------------------- hooks
class Ident(nn.Module):
    def __init__(self, as_tuple: bool):
        super().__init__()
        self.as_tuple = as_tuple

    def forward(self, x):
        return (x, "k", "v") if self.as_tuple else x


class Stack(nn.Module):
    def __init__(self, as_tuple: bool):
        super().__init__()
        self.blocks = nn.ModuleList([Ident(as_tuple), Ident(as_tuple)])

    def forward(self, x):
        for b in self.blocks:
            out = b(x)
            x = out[0] if isinstance(out, tuple) else out
        return x


@pytest.mark.parametrize("as_tuple", [False, True])
def test_editor_changes_only_the_requested_positions(as_tuple):
    model, x, v = Stack(as_tuple), torch.zeros(2, 5, 4), torch.arange(4.0)
    with S.ActivationEditor(model, [S.Edit(1, v, 2.0)]):
        y = model(x)
    assert torch.equal(y[:, :-1], torch.zeros(2, 4, 4)) and torch.equal(y[:, -1], (2 * v).expand(2, 4))
    with S.ActivationEditor(model, [S.Edit(0, v, 1.0, positions=(1, -2)), S.Edit(1, v, -1.0, positions="all")]):
        y = model(x)
    expected = -v.expand(2, 5, 4).clone()
    expected[:, [1, 3]] += v
    assert torch.equal(y, expected)
    assert torch.equal(model(x), x)  # hooks gone


def test_editor_removes_hooks_on_exceptions():
    model = Stack(False)
    with pytest.raises(RuntimeError, match="boom"), S.ActivationEditor(model, [S.Edit(0, torch.ones(4))]):
        assert len(model.blocks[0]._forward_hooks) == 1
        raise RuntimeError("boom")
    assert not model.blocks[0]._forward_hooks
    with pytest.raises(ValueError, match="does not match"), S.ActivationEditor(model, [S.Edit(0, torch.ones(3))]):
        model(torch.zeros(1, 2, 4))
    assert not model.blocks[0]._forward_hooks
    with pytest.raises(IndexError), S.ActivationEditor(model, [S.Edit(0, torch.ones(4)), S.Edit(7, torch.ones(4))]):
        pass  # registration fails at layer 7: the hook already placed on layer 0 is taken off again
    assert not model.blocks[0]._forward_hooks


def tiny_lm(seed: int = 0, dtype=torch.float64) -> Transformer:
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=9, max_len=16, d_model=16, n_layers=2, n_heads=2, causal=True)
    return Transformer(cfg).to(dtype).eval()


def teacher_forced(model: Transformer, tokens: torch.Tensor, bos: int) -> torch.Tensor:
    seq = torch.cat([torch.full((len(tokens), 1), bos), tokens], 1)
    with torch.no_grad():
        return torch.softmax(model(seq[:, :-1]), -1)


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("recompute", [False, True])
def test_local_edit_acts_only_at_its_step(layer, recompute):
    model, v = tiny_lm(), torch.randn(16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    g = S.generate_with_edits(model, [S.Edit(layer, v, 3.0, step=4)], n=32, max_new_tokens=10, bos=0, eos=8,
                              top_p=1.0, seed=5, recompute=recompute, return_probs=True)
    ref = teacher_forced(model, g.tokens, bos=0)  # the unedited model on the same tokens
    differs = (g.probs - ref).abs().amax(dim=(0, 2)) > 1e-9
    assert differs.tolist() == [k == 4 for k in range(10)]


@pytest.mark.parametrize("layer", [0, 1])
def test_cached_generation_equals_the_public_recompute_loop(layer):
    model, v = tiny_lm(2), torch.randn(16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    edits = [S.Edit(layer, v, 1.5), S.Edit(1 - layer, -v, 2.0, step=2)]
    a = S.generate_with_edits(model, edits, n=24, max_new_tokens=12, bos=0, eos=8, seed=9, return_probs=True)
    b = S.generate_with_edits(model, edits, n=24, max_new_tokens=12, bos=0, eos=8, seed=9, recompute=True,
                              return_probs=True)
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(a.probs, b.probs, rtol=0, atol=1e-10)
    # a global edit at the last block equals the public loop's edit at every position (nothing reads it later)
    c = S.generate_with_edits(model, [S.Edit(1, v, 1.5, positions="all")], n=24, max_new_tokens=12, bos=0, eos=8,
                              seed=9, recompute=True, return_probs=True)
    d = S.generate_with_edits(model, [S.Edit(1, v, 1.5)], n=24, max_new_tokens=12, bos=0, eos=8, seed=9,
                              return_probs=True)
    torch.testing.assert_close(c.probs, d.probs, rtol=0, atol=1e-10)


def test_generation_stops_with_eos_and_rejects_bad_layers():
    model = tiny_lm(1)
    g = S.generate_with_edits(model, [], n=64, max_new_tokens=15, bos=0, eos=8, seed=0)
    after = torch.cumsum((g.tokens == 8).int(), 1) > 0
    assert bool((g.tokens[after] == 8).all()) and g.tokens.shape == (64, 15)
    with pytest.raises(ValueError, match="layer"):
        S.generate_with_edits(model, [S.Edit(2, torch.zeros(16))], n=2, max_new_tokens=3, bos=0, eos=8)


def test_top_p_filter_by_brute_force():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(20, 7, generator=g)
    out = S.filter_top_k_top_p(logits, top_k=5, top_p=0.7)
    for row, kept in zip(logits, torch.isfinite(out), strict=True):
        order = sorted(range(7), key=lambda i: -float(row[i]))[:5]
        p = torch.softmax(row[order], 0)
        keep, mass = set(), 0.0
        for i, pi in zip(order, p.tolist(), strict=True):
            if mass > 0.7:
                break
            keep.add(i)
            mass += pi
        assert set(torch.nonzero(kept).flatten().tolist()) == keep


def test_token_nll_by_hand():
    model = tiny_lm(3)
    tokens = torch.tensor([[3, 4, 8, 8], [5, 6, 7, 2]])
    p = teacher_forced(model, tokens, bos=0)
    lp = torch.log(p.gather(-1, tokens[..., None]).squeeze(-1))
    expected = torch.stack([-lp[0, :3].mean(), -lp[1].mean()])
    torch.testing.assert_close(X.token_nll(model, tokens, bos=0, eos=8), expected)


# ------------------------------------------------------------------------------------------------------ molecules
@pytest.fixture(scope="module")
def moses_test() -> list[str]:
    return mol.load_moses("test", 60, seed=1)


def test_selfies_round_trip_and_vocab(moses_test):
    sfs = mol.to_selfies(moses_test)
    for smi, back in zip(moses_test, mol.from_selfies(sfs), strict=True):
        assert Chem.MolToSmiles(Chem.MolFromSmiles(back)) == Chem.MolToSmiles(Chem.MolFromSmiles(smi))
    vocab = mol.Vocab.build(sfs)
    ids = vocab.encode(sfs, 80)
    assert (ids[:, 0] == vocab.BOS).all() and vocab.decode(ids[:, 1:]) == sfs
    with pytest.raises(ValueError, match="max_len"):
        vocab.encode(sfs, 5)
    with pytest.raises(KeyError, match="not in the vocabulary"):
        vocab.index("[Xx]")


def test_load_moses_is_a_seeded_sample():
    a, b = mol.load_moses("test", 5, seed=3), mol.load_moses("test", 5, seed=3)
    assert a == b and len(set(a)) == 5 and a != mol.load_moses("test", 5, seed=4)
    with pytest.raises(ValueError, match="split"):
        mol.load_moses("valid", 5)
    with pytest.raises(ValueError, match="n must"):
        mol.load_moses("test", 0)


def test_props_against_rdkit(moses_test):
    smiles = [*moses_test[:20], "C1CC", ""]
    got = mol.props(smiles)
    for i, s in enumerate(smiles[:20]):
        m = Chem.MolFromSmiles(s)
        assert got["logP"][i] == pytest.approx(Crippen.MolLogP(m))
        assert got["TPSA"][i] == pytest.approx(rdMolDescriptors.CalcTPSA(m))
        assert got["QED"][i] == pytest.approx(QED.qed(m))
        assert got["heavy_atoms"][i] == m.GetNumHeavyAtoms()
    assert all(np.isnan(got[k][20:]).all() for k in mol.PROPERTIES)
    with pytest.raises(ValueError, match="unknown properties"):
        mol.props(["C"], which=["MW"])


def test_generation_metrics_by_hand():
    m = mol.generation_metrics(["CCO", "OCC", "C1CC", "c1ccccc1"], reference={"CCO"})
    assert m == pytest.approx({"validity": 0.75, "uniqueness": 2 / 3, "novelty": 0.5})


def test_exemplar_sets_are_length_matched():
    g = np.random.default_rng(0)
    size = g.integers(10, 20, 2000)
    value = 0.2 * size + g.normal(size=2000)
    pos, neg = X.exemplar_molecules(value, 0.2, strata=size)
    assert np.array_equal(np.bincount(size[pos], minlength=20), np.bincount(size[neg], minlength=20))
    assert value[pos].mean() > value[neg].mean() and not (pos & neg).any()
    pos, neg = X.exemplar_molecules(value, 0.2)
    assert pos.sum() == neg.sum() == 400 and value[pos].min() > value[neg].max()


# ---------------------------------------------------------------------------------------------------- harness
def test_collect_activations_reads_the_block_outputs_the_head_sees():
    model = tiny_lm(4, dtype=torch.float32)
    vocab = mol.Vocab(("<pad>", "<bos>", "<eos>", *(f"[T{i}]" for i in range(6))))
    g = torch.Generator().manual_seed(0)
    ids = torch.zeros(5, 12, dtype=torch.long)
    for r, n in enumerate([3, 7, 10, 1, 5]):  # <bos> n tokens <eos> <pad>...
        ids[r, : n + 2] = torch.cat([torch.tensor([1]), torch.randint(3, 9, (n,), generator=g), torch.tensor([2])])
    data = X.MoleculeData([""] * 5, [""] * 5, vocab, ids, {}, set())
    a1 = X.collect_activations(model, data, 1, 4)
    a0, b1 = X.collect_activations(model, data, [0, 1], 4)
    assert len(a1.z) == 3 + 7 + 10 + 1 + 4  # one row per position that predicts a real token (first 4 molecules)
    torch.testing.assert_close(a1.z, b1.z)
    assert a0.layer == 0 and a0.z.shape == a1.z.shape and not torch.allclose(a0.z, a1.z)
    assert torch.equal(ids[a1.mol, a1.pos], a1.cur) and torch.equal(ids[a1.mol, a1.pos + 1], a1.nxt)
    with torch.no_grad():  # the last block's rows, read by the head, give the model's logits at those positions
        logits = model(ids[:4, :-1])[a1.mol, a1.pos]
        torch.testing.assert_close(model.head(model.ln_f(a1.z)), logits)
    with pytest.raises(ValueError, match="n_mol"):
        X.collect_activations(model, data, 1, 6)


def test_sae_summary_by_numpy():
    z = torch.randn(300, 6, generator=torch.Generator().manual_seed(1))
    sae = S.SparseAutoencoder(6, expansion=3, l1=0.1)
    summary, top = X.sae_summary(sae, z, batch=64)
    zn = z.numpy().astype(np.float64)
    with torch.no_grad():
        h = sae.encode(z).numpy().astype(np.float64)
        zh = sae.decode(sae.encode(z)).numpy().astype(np.float64)
    fvu = ((zn - zh) ** 2).sum() / ((zn - zn.mean(0)) ** 2).sum()
    assert summary["fvu"] == pytest.approx(fvu, rel=1e-5)
    assert summary["l0"] == pytest.approx((h > 0).sum(1).mean())
    np.testing.assert_allclose(top, h.max(1), rtol=1e-6)
    assert summary["rows_with_code_ge_thr"] == pytest.approx((h.max(1) >= 0.5).mean())
    assert (summary["fvu"], summary["l0"]) == pytest.approx(sae.fvu_l0(z, batch=64))


# ------------------------------------------------------------------------------- the claims' items and statistics
def test_concept_rule_selftest_passes_and_catches_a_silent_fallback(monkeypatch):
    assert all(X.concept_rule_selftest().values())
    real = S.method.global_concept

    def silent(sae, pos, neg, threshold=0.5, fallback=False):  # the public code: no error, a fallback
        return real(sae, pos, neg, threshold, fallback=True)

    monkeypatch.setattr(S.method, "global_concept", silent)
    cases = X.concept_rule_selftest()
    assert not cases["an empty global concept raises"] and sum(cases.values()) == len(cases) - 1


def test_rule_counts_by_brute_force():
    pos, neg = concept_data(1)
    sae = identity_sae(12)
    loc = pos.clone()
    loc[:, 5] = 0.7
    got = X.rule_counts(sae, pos, neg, loc)
    frac = [sum(1 for r in loc.numpy() if r[j] >= 0.5) / len(loc) for j in range(12)]
    assert got["global"] == len(brute_global(pos.numpy(), neg.numpy(), 0.5))
    assert got["local"] == len(brute_local(loc.numpy(), 0.5, 1.0)) and got["best_fraction"] == pytest.approx(max(frac))
    gap = max(float((pos[:, j] >= 0.5).float().mean() - (neg[:, j] >= 0.5).float().mean()) for j in range(12))
    assert got["best_gap"] == pytest.approx(gap)


def test_group_statistics_by_hand():
    g = np.random.default_rng(0)
    a, b, c = (g.normal(m, 1, 50) for m in (0.0, 1.0, 3.0))
    a[3] = np.nan  # left out of the mean
    ma, mb, mc = np.nanmean(a), b.mean(), c.mean()
    np.testing.assert_allclose(X.group_means([a, b, c, a], 2), [[ma, mb], [mc, ma]])
    rho = X.over_groups(X.spearman_rows([-1, 0, 1]), 3, 0.5)
    assert rho(a, b, c) == pytest.approx(1.0) and rho(c, b, a) == pytest.approx(-1.0)
    assert rho(a, c, b) == pytest.approx(0.5)  # ranks 1, 3, 2 against 1, 2, 3
    assert rho(a, a, a) == 0.0  # no order at all
    from scipy.stats import spearmanr
    m = g.normal(size=(20, 5))
    np.testing.assert_allclose(X.spearman_rows(range(5))(m), [spearmanr(range(5), r).statistic for r in m])
    shift = X.over_groups(X.shift_rows, 2, 0.5)
    assert shift(a, b) == pytest.approx(mb - ma)  # one group: its value
    assert shift(a, b, a, c, b, a) == pytest.approx(np.median([mb - ma, mc - ma, ma - mb]))
    with pytest.raises(ValueError):
        shift(a, b, c)
    assert X.over_groups(X.max_rows, 3, 0.9)(a, b, c) == pytest.approx(mc)
    base = [np.array([0.1, np.nan, 0.3]), np.array([0.2, 0.2, 0.2])]
    edit = [np.array([0.5, np.nan, 0.9]), np.array([0.4, 0.3, 0.5])]
    assert X.over_groups(X.gain_rows, 4, 0.9)(*base, *edit) == pytest.approx(min(0.7 - 0.2, 0.4 - 0.2))


def test_expected_best_of_n_against_simulation():
    x = np.random.default_rng(1).normal(size=40)
    exact = X.expected_best_of(x, [1, 2, 8])
    assert exact[0] == pytest.approx(x.mean())
    draws = np.random.default_rng(2).choice(x, size=(200_000, 8))
    assert exact[1] == pytest.approx(draws[:, :2].max(1).mean(), abs=0.01)
    assert exact[2] == pytest.approx(draws.max(1).mean(), abs=0.01)
    assert X.in_range(np.array([0.0, 1.0, 2.0, np.nan]), 0.5, 2.0) == 0.5


def test_null_items_pair_each_direction_with_its_opposite():
    vals = {("unedited", 0.0): {"logP": np.zeros(3)}}
    for s in (-2.0, 2.0):
        vals[("g", s)] = {"logP": np.full(3, s)}
    sw = X.Sweep(pd.DataFrame(), vals)
    items = X.null_items(sw, ["g"], [0, 2])
    assert [float(a[0]) for a in items] == [0.0, 2.0, 0.0, -2.0]
    loc = {("unedited", 0.0, 2): np.zeros(2), ("g", 2.0, 2): np.ones(2), ("g", -2.0, 2): -np.ones(2)}
    assert [float(a[0]) for a in X.local_null_items(loc, ["g"], 2.0, [2])] == [0.0, 1.0, 0.0, -1.0]


def test_local_probe_items_are_the_table_per_sample():
    model, v = tiny_lm(4), torch.randn(16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    table, items = X.local_probe(model, {"v": v}, 1, 3, [2, 5], [-1.0, 2.0], n=40, seed=1, eos=8, bos=0, items=True)
    assert set(items) == {("unedited", 0.0, 2), ("unedited", 0.0, 5), ("v", -1.0, 2), ("v", 2.0, 2), ("v", -1.0, 5),
                          ("v", 2.0, 5)}
    for r in table.itertuples():
        p = items[(r.vector, r.strength, r.step)]
        assert p.shape == (40,) and np.nanmean(p) == pytest.approx(r.p_target)
        assert np.array_equal(np.isnan(p), np.isnan(items[("unedited", 0.0, r.step)]))  # the same samples
