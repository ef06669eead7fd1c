"""Tests of the SmolLM2 tier of repro.papers.cds (paper 02, full mode) against independent references: the arithmetic
of every generated chain of thought re-evaluated with Python's operators, hand-computed accuracy statistics, CDS
orders recomputed with ``cds_order``, and -- on the real SmolLM2-135M -- the cached, padded, batched greedy decoder
against one plain uncached forward pass of transformers over each question's whole text."""

from __future__ import annotations

import operator
import re

import numpy as np
import pytest
import torch

from repro.papers.cds import (
    ARITH_OPS,
    QUERY,
    LLMStudy,
    arithmetic_problems,
    cds_order,
    demo_orders,
    demo_prompt,
    encode,
    finished,
    greedy_after_prefix,
    llm_order_study,
    parse_answer,
    prefix_cache,
)

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
STEP = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)\.")


def test_arithmetic_problems_are_correct_distinct_and_disjoint():
    pool = arithmetic_problems(200, seed=0)
    assert len(pool) == 200 and len(set(pool.questions)) == 200
    assert set(pool.op.tolist()) == set(range(len(ARITH_OPS)))
    for q, s, a, o in zip(pool.questions, pool.solutions, pool.answers, pool.op, strict=True):
        steps = STEP.findall(s)
        assert len(steps) == (2 if ARITH_OPS[o] == "two_step" else 1)
        for x, op, y, z in steps:  # every step of the chain of thought is true arithmetic
            assert OPS[op](int(x), int(y)) == int(z)
        assert int(steps[-1][3]) == a and parse_answer(s) == a and a >= 0
        assert all(int(v) < 100 for v in re.findall(r"\d+", q))  # 1-2 digit operands
    test = arithmetic_problems(100, seed=1, exclude=pool)
    assert not set(test.questions) & set(pool.questions)
    again = arithmetic_problems(200, seed=0)
    assert again.questions == pool.questions  # deterministic
    assert pool.texts[0] == f"Problem:\n{pool.questions[0]}\nSolution:\n{pool.solutions[0]}"
    with pytest.raises(ValueError, match="n must be"):
        arithmetic_problems(0)


def test_prompt_parse_and_stop_rule():
    pool = arithmetic_problems(5, seed=3)
    p = demo_prompt(pool, [2, 0])
    assert p == (f"Problem:\n{pool.questions[2]}\nSolution:\n{pool.solutions[2]}\n\n"
                 f"Problem:\n{pool.questions[0]}\nSolution:\n{pool.solutions[0]}\n\n")
    assert parse_answer("12 + 3 = 15. The answer is 15.\n\nProblem: The answer is 9") == 15.0
    assert parse_answer("The answer is -4.5 apples") == -4.5
    assert parse_answer("no number here\n\nThe answer is 3.") is None  # only the first block counts
    assert finished("7 * 3 = 21. The answer is 21.\n") and finished("blah\n\n")
    assert not finished("7 * 3 = 21. The answer is 21.") and not finished("7 * 3 = 21.\n")
    with pytest.raises(ValueError, match="indices"):
        demo_prompt(pool, [5])
    with pytest.raises(ValueError, match="at least one"):
        demo_prompt(pool, [])


def test_demo_orders_are_permutations_and_cds_is_cds_order():
    E = torch.nn.functional.normalize(torch.randn(16, 8, generator=torch.Generator().manual_seed(0),
                                                  dtype=torch.float64), dim=1)
    o = demo_orders(E, [4, 16], n_random=3, n_starts=5, seed=7)
    assert list(o) == ["random0", "random1", "random2", "cds", "high_curvature"]
    for name, per_k in o.items():
        for k, order in zip([4, 16], per_k, strict=True):
            assert sorted(order.tolist()) == list(range(k)), name
    assert o["cds"][1].tolist() == cds_order(E, "cds", 5)[0].tolist()
    assert o["high_curvature"][0].tolist() == cds_order(E[:4], "high_curvature", 5)[0].tolist()
    assert len({tuple(o[f"random{r}"][1].tolist()) for r in range(3)}) == 3
    with pytest.raises(ValueError, match="shots"):
        demo_orders(E, [2], 1)
    with pytest.raises(ValueError, match="shots"):
        demo_orders(E, [17], 1)


def test_llm_study_statistics_by_hand():
    correct = {"random0": np.array([[1, 0, 1, 0]]), "random1": np.array([[1, 1, 0, 0]]),
               "cds": np.array([[1, 1, 1, 0]]), "high_curvature": np.array([[0, 0, 1, 0]])}
    st = LLMStudy([8], {k: v.astype(bool) for k, v in correct.items()})
    assert st.accuracy("random")[0] == pytest.approx(0.5) and st.accuracy("cds")[0] == pytest.approx(0.75)
    assert st.random_spread[0] == pytest.approx(0.0)
    d, se = st.diff("cds")
    per_q = np.array([0.0, 0.5, 0.5, 0.0])  # cds minus the random orders' mean, question by question
    assert d[0] == pytest.approx(0.25)
    assert se[0] == pytest.approx(per_q.std(ddof=1) / 2)
    d, se = st.diff("cds", "high_curvature")
    assert d[0] == pytest.approx(0.5) and se[0] == pytest.approx(np.array([1, 1, 0, 0]).std(ddof=1) / 2)
    two = LLMStudy([4, 16], {"random0": np.array([[0, 0, 1, 0], [1, 1, 1, 0]], bool),
                             "random1": np.array([[0, 1, 1, 0], [1, 1, 0, 0]], bool)})
    acc4, acc16 = np.array([0.25, 0.5]), np.array([0.75, 0.5])  # per random order
    assert np.allclose(two.random_spread, [acc4.std(ddof=1), acc16.std(ddof=1)])
    g, se = two.gain(4, 16)
    per_q = np.array([1.0, 0.5, -0.5, 0.0])  # random-mean correctness at 16 minus at 4, question by question
    assert g == pytest.approx(0.25)
    assert se == pytest.approx(np.sqrt(per_q.var(ddof=1) / 4 + (acc4.var(ddof=1) + acc16.var(ddof=1)) / 2))
    with pytest.raises(ValueError, match="among"):
        two.gain(4, 64)


# ------------------------------------------------------------------------------------------------ SmolLM2


@pytest.fixture(scope="module")
def smollm2():
    from repro.common import assets

    try:
        return assets.load_smollm2()
    except assets.AssetMissingError as e:  # pragma: no cover
        pytest.skip(str(e))


def test_cached_batched_greedy_equals_plain_forward(smollm2):
    """Two demos as the cached prefix, three questions of different lengths padded into one batch, one row leaving
    the batch early: every step's logits equal those of one uncached forward pass of prefix + question + generated
    tokens (no padding, batch 1), and every generated token is that pass's argmax."""
    model, tok = smollm2
    pool = arithmetic_problems(5, seed=11)
    prefix = encode(tok, demo_prompt(pool, [0, 1]))
    qs = [encode(tok, QUERY.format(q=q)) for q in pool.questions[2:5]]
    assert len({q.numel() for q in qs}) > 1  # the batch really is padded
    cache = prefix_cache(model, prefix)
    calls: list[int] = []

    def done(t: list[int]) -> bool:  # the second row in call order stops after its first token
        calls.append(len(t))
        return len(calls) == 2

    gen = greedy_after_prefix(model, cache, qs, max_new=6, done=done, pad_id=0, keep_logits=True)
    assert [len(t) for t in gen.tokens] == [6, 1, 6]
    for q, toks, lg in zip(qs, gen.tokens, gen.logits, strict=True):
        full = torch.cat([prefix, q, torch.tensor(toks[:-1], dtype=torch.long)])
        with torch.no_grad():
            ref = model(input_ids=full[None]).logits[0, -len(toks):]
        assert float((lg - ref).abs().max()) < 1e-4
        assert ref.argmax(-1).tolist() == toks
    again = greedy_after_prefix(model, cache, qs[:1], max_new=6)  # the prefix cache was not changed
    assert again.tokens[0] == gen.tokens[0]


def test_llm_order_study_end_to_end(smollm2):
    """A tiny run of the whole harness: shapes, and that the greedy answers are scored against the truth."""
    model, tok = smollm2
    pool = arithmetic_problems(4, seed=5)
    test = arithmetic_problems(2, seed=6, exclude=pool)
    E = torch.nn.functional.normalize(torch.randn(4, 6, generator=torch.Generator().manual_seed(1),
                                                  dtype=torch.float64), dim=1)
    st = llm_order_study(model, tok, pool, E, test, shots=[3], n_random=1, n_starts=3, batch=2, max_new=12)
    assert set(st.correct) == {"random0", "cds", "high_curvature"}
    assert all(v.shape == (1, 2) and v.dtype == bool for v in st.correct.values())
    assert len(st.prefix_tokens) == 1 and st.prefix_tokens[0] > 30 and len(st.examples) == 2
    for text, truth, ok in zip(st.examples, test.answers, st.correct["cds"][0], strict=True):
        assert ok == (parse_answer(text) == truth)
