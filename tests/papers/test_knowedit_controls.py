"""Tests of the controls and claim statistics of repro.papers.knowedit (paper 06): the random perturbations have
the norms they claim, the R_k null behaves as the definition of R_k predicts, the bootstrap statistics agree with
SciPy or a hand computation, and the per-item values the claims resample agree with the traces' means."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from test_knowedit import _bag_of_words  # the gate tests' embedder (pytest puts this folder on sys.path)

from repro.papers import knowedit as K
from repro.papers.knowedit import problems as P


@pytest.mark.parametrize("rank_one", [False, True])
def test_random_matrix_has_the_norm_and_rank(rank_one):
    gen = torch.Generator().manual_seed(3)
    G = K.random_matrix((7, 11), 2.5, gen, rank_one=rank_one)
    assert G.shape == (7, 11) and G.dtype == torch.float64
    assert float(torch.linalg.matrix_norm(G)) == pytest.approx(2.5, rel=1e-12)
    assert int(torch.linalg.matrix_rank(G)) == (1 if rank_one else 7)


def test_isotropic_perturbation_puts_the_largest_R_k_at_the_smallest_sigma():
    """The null of C5/C6: for a perturbation not aligned with H, R_k ∝ 1/σ_k, so Spearman(R_k, σ_k) is near −1
    and the top R_k fall in the lowest-σ decile; a perturbation along the top direction moves that one most."""
    rng = np.random.default_rng(0)
    n, d = 400, 40
    U, _ = np.linalg.qr(rng.standard_normal((n, d)))
    V, _ = np.linalg.qr(rng.standard_normal((d, d)))
    sig = np.geomspace(100.0, 1.0, d)
    H = torch.as_tensor(U * sig @ V.T)
    S, R = K.relative_change_rates(H, torch.as_tensor(1e-2 * rng.standard_normal((n, d))))
    S, R = S.numpy(), R.numpy()
    assert K.spearman_rs(R, S) < -0.95 and K.top_ratio(R, S) >= 8
    _, R_top = K.relative_change_rates(H, torch.as_tensor(np.outer(U[:, 0], V[:, 0])))
    assert int(np.argmax(R_top.numpy())) == 0


def test_statistics_by_hand():
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 5, 30).astype(float), rng.standard_normal(30)  # ties in a
    assert K.spearman_rs(a, b) == pytest.approx(spearmanr(a, b)[0], abs=1e-12)
    sigma = np.linspace(20.0, 1.0, 20)
    assert K.top_ratio(1 / sigma, sigma) == pytest.approx(10.0) and K.top_ratio(sigma, sigma) == 0.0
    Ts = [1, 4, 16]
    R = np.stack([T / sigma for T in Ts], 1)  # directions × checkpoints
    assert K.median_slope(Ts)(R) == pytest.approx(1.0) and K.max_slope(Ts)(np.sqrt(R)) == pytest.approx(0.5)
    assert K.ratio_of_means(np.array([1.0, 0.0]), np.array([1.0, 1.0])) == 0.5
    assert np.isnan(K.ratio_of_means(np.ones(2), np.zeros(2)))


def test_cached_embedder_embeds_each_text_once():
    calls = []

    def embed(texts):
        calls.append(list(texts))
        return _bag_of_words(texts)

    E = K.CachedEmbedder(embed)
    E.warm(["b c", "a", "a"])
    out = E(["a", "d", "b c", "d"])
    assert calls == [["a", "b c"], ["d"]]
    torch.testing.assert_close(out, _bag_of_words(["a", "d", "b c", "d"]))


@pytest.fixture(scope="module")
def tiny():
    cfg = dict(subjects=14, steps=80, d_model=32, n_layers=2, n_heads=2, d_ff=64, edits=4, layer=0,
               checkpoints=[1, 2, 4], short=[1, 4], threshold=0.5, alpha_tol=1e-3, memit_weight=1.0, v_steps=4,
               cov_batches=2, reasoning=500, contexts=200)
    return K.toy_run(cfg, np.random.default_rng(3), _bag_of_words)


def test_items_agree_with_the_traces_and_the_controls_with_their_norms(tiny):
    for name, t in tiny.traces.items():
        for items, met in zip(t.items, t.metrics, strict=True):
            for key in ("rel", "loc", "reasoning"):
                if items[key].size:
                    assert items[key].mean() == pytest.approx(met[key])
        if name != "retrieval":
            assert len(t.dW_total) == len(t.Ts) - 1
        if name != "rome_call":  # the control has no single setting
            assert t.single_hits.size == 4 and t.single_hits.mean() == pytest.approx(t.single)
    rome = tiny.traces["rome"]
    assert len(rome.dW_norms) == 4 and all(n > 0 for n in rome.dW_norms)  # one update per ROME edit
    null = tiny.null
    assert null.R_accum.shape == (32, 3) and null.R_iso.shape == (32,) and null.cond >= 1
    np.testing.assert_allclose(null.sigma, rome.sigma[-1][0])  # the same unedited H
    D = K.claim_data(tiny.traces, null, 0)
    base = tiny.traces["rome"].items[0]["reasoning"]
    assert D.drop["rome"].mean() == pytest.approx(100 * (base.mean() - rome.metrics[-1]["reasoning"]))
    assert D.best in ("rome", "memit", "alphaedit")
    assert D.rel[D.best].mean() == max(D.rel[n].mean() for n in ("rome", "memit", "alphaedit"))
    assert D.Rmat["rome"].shape == D.Rmat["accum"].shape == (32, 3)


def test_random_controls_are_deterministic_and_leave_the_model(tiny):
    before = [q.clone() for q in tiny.model.parameters()]
    a, b = (K.random_controls(tiny.model, tiny.suite, 0, tiny.traces, np.random.default_rng(9)) for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(before, tiny.model.parameters(), strict=True))
    np.testing.assert_equal((a.R_iso, a.R_accum, a.reasoning), (b.R_iso, b.R_accum, b.reasoning))


def test_gated_queries_are_the_prewarmed_texts(tiny):
    """The texts compare_editors embeds ahead are exactly those the retrieval gate asks about (nothing embedded
    twice or late)."""
    calls = []

    def embed(texts):
        calls.append(len(texts))
        return _bag_of_words(texts)

    E = K.CachedEmbedder(embed)
    from repro.papers.knowedit.experiment import _texts
    E.warm(_texts(tiny.suite))
    K.run_retrieval(tiny.model, tiny.suite, K.RetrievalEditor(E, 0.5), [1, 4])
    assert len(calls) == 1
    w = tiny.suite.world
    assert P.render(w, tiny.suite.reasoning[0, :9].tolist()) in E._rows
