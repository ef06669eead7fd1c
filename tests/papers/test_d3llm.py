"""Tests of ``repro.papers.d3llm`` against independent references: AUP against the paper's leaderboard numbers and
a hand-written formula, an oracle denoiser, reductions of multi-block decoding to sequential decoding, the KV-cache
decoder against the no-cache decoder, EOS early stopping, pseudo-trajectory masks worked by hand; the notebook's
harness (curves, AUP table, KV sweep, teacher and distillation) against the decoders and formulas it composes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from repro.common.nn import TransformerConfig
from repro.common.seeding import derive
from repro.papers import d3llm as D

TASK = D.ChainTask(n_operands=5, modulus=7, eos_pad=0)
TASK_EOS = D.ChainTask(n_operands=5, modulus=7, eos_pad=6)
Y_MAX = 74.98  # best GSM8K-CoT accuracy over all methods of the leaderboard (D2F at TPF 1)


# ---------------------------------------------------------------------------------------------- AUP


def reference_aup(points, y_max, alpha=3.0):
    """The AUP definition written out independently: unweighted first rectangle, weighted trapezoids."""
    pts = sorted(points)
    w = [min(math.exp(-alpha * (1 - y / y_max)), 1.0) for _, y in pts]
    area = pts[0][0] * pts[0][1]
    for i in range(1, len(pts)):
        area += (pts[i][0] - pts[i - 1][0]) * (pts[i][1] * w[i] + pts[i - 1][1] * w[i - 1]) / 2
    return area


@pytest.mark.parametrize("points, golden", [
    ([(1.0, 72.55)], 72.55),                                   # LLaDA
    ([(1.0, 74.79), (2.77, 74.68)], 205.78),                   # Fast-dLLM-LLaDA
    ([(1.0, 74.98), (2.88, 74.39)], 213.76),                   # D2F
    ([(1.0, 74.0), (5.14, 72.63)], 358.14),                    # dParallel-LLaDA
    ([(1.0, 74.02), (9.11, 73.09)], 637.65),                   # d3LLM-LLaDA
])
def test_aup_reproduces_the_leaderboard(points, golden):
    rho, y = zip(*points, strict=True)
    assert D.aup(rho, y, Y_MAX) == pytest.approx(golden, abs=1e-2)
    assert D.aup(rho, y, Y_MAX) == pytest.approx(reference_aup(points, Y_MAX), rel=1e-12)


def test_aup_basic_properties():
    assert D.aup([3.0], [50.0], 80.0) == pytest.approx(150.0)
    assert D.aup_weight(80.0, 80.0) == 1.0 and D.aup_weight(90.0, 80.0) == 1.0
    assert D.aup_weight(40.0, 80.0) == pytest.approx(math.exp(-1.5))
    # order of the points does not matter
    assert D.aup([4.0, 1.0, 2.0], [70.0, 72.0, 71.5], 72.0) == pytest.approx(D.aup([1, 2, 4], [72, 71.5, 70], 72.0))
    # a point more than 5 below the first is dropped (non-strict) or refused (strict, as the public code)
    assert D.aup([1, 2, 3], [80, 79, 60], 80, strict=False) == pytest.approx(D.aup([1, 2], [80, 79], 80))
    with pytest.raises(ValueError, match="drops"):
        D.aup([1, 2, 3], [80, 79, 60], 80)
    for bad in (([], [], 1.0), ([1.0], [1.0, 2.0], 1.0), ([0.0], [50.0], 60.0), ([1.0], [0.5 * 300], 60.0)):
        with pytest.raises(ValueError):
            D.aup(*bad)


def test_aup_against_a_common_reference_accuracy():
    """``y_ref`` moves the 5-point cut from the curve's own first point to a reference shared by several models."""
    rho, y = [1.0, 2.0, 3.0], [80.0, 79.0, 76.0]
    assert D.aup(rho, y, 82.0, strict=False) == pytest.approx(reference_aup(list(zip(rho, y, strict=True)), 82.0))
    assert D.aup(rho, y, 82.0, strict=False, y_ref=82.0) == pytest.approx(reference_aup([(1, 80), (2, 79)], 82.0))
    assert D.aup(rho, y, 82.0, strict=False, y_ref=80.0) == D.aup(rho, y, 82.0, strict=False)
    assert D.aup(rho, y, 82.0, strict=False, y_ref=95.0) == 0.0  # nothing within 5 points of the reference
    with pytest.raises(ValueError, match="drops"):
        D.aup(rho, y, 82.0, y_ref=82.0)
    with pytest.raises(ValueError):
        D.aup(rho, y, 82.0, y_ref=120.0)


# ---------------------------------------------------------------------------------------------- rules


def test_entropy_of_uniform_and_one_hot():
    for v in (2, 7, 1000):
        assert float(D.token_entropy(torch.zeros(v))) == pytest.approx(math.log(v), rel=1e-9)
    assert D.token_entropy(torch.zeros(3, 5)).dtype == torch.float64
    assert abs(float(D.token_entropy(torch.tensor([0.0, 80.0, 0.0])))) < 1e-9


def test_transfer_rule_always_takes_the_lowest_entropy_candidate():
    logits = torch.tensor([[[0.0, 0.0, 0.0], [3.0, 0.0, 0.0], [9.0, 0.0, 0.0], [0.0, 5.0, 0.0]]])
    h = D.token_entropy(logits)[0]
    cand = torch.tensor([[True, True, False, True]])
    tokens, accept = D.transfer_rule(logits, cand, threshold=-1.0)  # nothing passes the threshold
    assert accept.tolist() == [[False, False, False, True]]  # position 2 is the lowest but not a candidate
    _, accept = D.transfer_rule(logits, cand, threshold=float(h[1]) + 1e-9)
    assert accept.tolist() == [[False, True, False, True]]
    assert tokens.tolist() == [[0, 0, 0, 1]]
    _, none = D.transfer_rule(logits, torch.zeros_like(cand), threshold=10.0)
    assert not none.any()
    _, conf = D.transfer_rule(logits, cand, threshold=0.95, rule="confidence")  # p = 0.909, 0.987
    assert conf.tolist() == [[False, False, False, True]]


# ---------------------------------------------------------------------------------------------- decoders


def oracle(task: D.ChainTask):
    """A perfect denoiser: one-hot logits of the true answer, computed from the prompt in the input."""
    p = task.prompt_len

    def fn(x: torch.Tensor) -> torch.Tensor:
        a = x[:, 1:p - 1]
        s = a.cumsum(1) % task.modulus
        ans = torch.stack([a[:, 1:], s[:, 1:]], 2).reshape(len(x), -1)
        ans = torch.cat([ans, torch.full((len(x), task.eos_pad), task.eos_id)], 1)
        full = torch.cat([x[:, :p], ans], 1)
        return 30.0 * torch.nn.functional.one_hot(full, task.vocab_size).double()

    return fn


def random_denoiser(task: D.ChainTask, shift: bool = True, seed: int = 0) -> D.Denoiser:
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=task.vocab_size, max_len=task.prompt_len + task.answer_len, d_model=32,
                            n_layers=2, n_heads=4)
    return D.Denoiser(cfg, task.mask_id, shift=shift).eval().double()


def problems(task: D.ChainTask, n: int = 6, seed: int = 0):
    return task.sample(n, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("block, add, act", [(4, 0.5, 0.5), (4, 0.1, 0.95), (3, 1.0, 1.0), (8, 0.1, 0.95)])
def test_oracle_decodes_exactly_in_at_most_blocks_plus_one_forwards(block, add, act):
    prompt, answer = problems(TASK)
    out = D.decode_multiblock(oracle(TASK), prompt, TASK.answer_len, block, threshold=0.5, mask_id=TASK.mask_id,
                              block_add_threshold=add, decoded_token_threshold=act)
    n_blocks = -(-TASK.answer_len // block)
    assert torch.equal(out.tokens, answer)
    assert int(out.nfe.max()) <= n_blocks + 1
    assert out.tpf >= TASK.answer_len / (n_blocks + 1)


def test_sequential_thresholds_reduce_to_vanilla_decoding():
    prompt, _ = problems(TASK, 5)
    model = random_denoiser(TASK)
    van = D.decode_vanilla(model, prompt, TASK.answer_len, 4, mask_id=TASK.mask_id, rank="entropy")
    seq = D.decode_multiblock(model, prompt, TASK.answer_len, 4, threshold=0.0, mask_id=TASK.mask_id,
                              block_add_threshold=1.0, decoded_token_threshold=1.0)
    assert torch.equal(seq.tokens, van.tokens) and torch.equal(seq.timeline, van.timeline)
    assert torch.equal(seq.nfe, van.nfe) and int(seq.nfe[0]) == TASK.answer_len
    van_c = D.decode_vanilla(model, prompt, TASK.answer_len, 4, mask_id=TASK.mask_id)
    seq_c = D.decode_multiblock(model, prompt, TASK.answer_len, 4, threshold=2.0, mask_id=TASK.mask_id,
                                block_add_threshold=1.0, decoded_token_threshold=1.0, rule="confidence")
    assert torch.equal(seq_c.tokens, van_c.tokens) and torch.equal(seq_c.timeline, van_c.timeline)


def reference_fixed_count(model, prompt_row, gen_len, block, k, mask_id):
    """LLaDA with k tokens per forward written out for one prompt: per block, while masked positions remain, one
    forward and the k most confident masked positions of the block (ties: the first), one Python loop."""
    x = torch.cat([prompt_row, torch.full((gen_len,), mask_id, dtype=prompt_row.dtype)])
    p, order, forwards = len(prompt_row), [0] * gen_len, 0
    for lo in range(0, gen_len, block):
        hi = min(lo + block, gen_len)
        while any(int(x[p + j]) == mask_id for j in range(lo, hi)):
            forwards += 1
            logits = model(x[None].clone())[0, p + lo: p + hi].detach().double()
            logits[:, mask_id] = -torch.inf  # the mask token is never predicted
            probs = torch.softmax(logits, -1)
            masked = [j for j in range(hi - lo) if int(x[p + lo + j]) == mask_id]
            for j in sorted(masked, key=lambda j: (-float(probs[j].max()), j))[:k]:
                x[p + lo + j] = int(probs[j].argmax())
                order[lo + j] = forwards
    return x[p:], order, forwards


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_fixed_count_decoder_against_a_written_out_loop(k):
    prompt, _ = problems(TASK, 4)
    model = random_denoiser(TASK)
    out = D.decode_vanilla(model, prompt, TASK.answer_len, 4, mask_id=TASK.mask_id, per_forward=k)
    for i in range(len(prompt)):
        tokens, order, forwards = reference_fixed_count(model, prompt[i], TASK.answer_len, 4, k, TASK.mask_id)
        assert torch.equal(out.tokens[i], tokens) and out.timeline[i].tolist() == order
        assert int(out.nfe[i]) == forwards == sum(-(-min(4, TASK.answer_len - lo) // k)
                                                  for lo in range(0, TASK.answer_len, 4))
    with pytest.raises(ValueError, match="per_forward"):
        D.decode_vanilla(model, prompt, TASK.answer_len, 4, mask_id=TASK.mask_id, per_forward=0)


def test_multiblock_invariants_and_overlapping_blocks():
    prompt, _ = problems(TASK, 8)
    model = random_denoiser(TASK)
    out = D.decode_multiblock(model, prompt, TASK.answer_len, 2, threshold=1.6, mask_id=TASK.mask_id,
                              block_add_threshold=0.1, decoded_token_threshold=0.95)
    assert (out.tokens != TASK.mask_id).all()
    assert ((out.timeline >= 1) & (out.timeline <= out.nfe[:, None])).all()
    for r in range(len(prompt)):  # every forward decodes at least one token
        assert set(out.timeline[r].tolist()) == set(range(1, int(out.nfe[r]) + 1))
    blocks = torch.arange(TASK.answer_len) // 2
    spans = [{int(blocks[j]) for j in range(TASK.answer_len) if out.timeline[r, j] == t}
             for r in range(len(prompt)) for t in range(1, int(out.nfe[r]) + 1)]
    assert any(len(s) >= 2 for s in spans), "no forward decoded tokens of two blocks: not multi-block"
    # batched decoding = row-by-row decoding
    one = [D.decode_multiblock(model, prompt[i:i + 1], TASK.answer_len, 2, threshold=1.6, mask_id=TASK.mask_id,
                               block_add_threshold=0.1, decoded_token_threshold=0.95) for i in range(len(prompt))]
    assert torch.equal(torch.cat([o.tokens for o in one]), out.tokens)
    assert torch.equal(torch.cat([o.nfe for o in one]), out.nfe)


def test_tpf_grows_with_the_entropy_threshold_on_a_random_model():
    prompt, _ = problems(TASK, 16)
    model = random_denoiser(TASK)
    tpf = [D.decode_multiblock(model, prompt, TASK.answer_len, 4, t, mask_id=TASK.mask_id).tpf
           for t in (0.0, 1.5, 2.0, 3.0)]
    # at threshold 0 only the always-accepted and the forced tokens: one or two per forward
    assert 1.0 <= tpf[0] < 2.0 and tpf[-1] > 3.0
    assert all(b >= a for a, b in zip(tpf, tpf[1:], strict=False))


def test_forced_progress_in_a_stalled_activated_block():
    """A denoiser that is most certain about a later block: the first active block still advances."""
    g = TASK.answer_len
    p = TASK.prompt_len

    def fn(x):
        logits = torch.zeros(len(x), x.shape[1], TASK.vocab_size, dtype=torch.float64)
        logits[:, p + g // 2:, 0] = 50.0  # confident about the second half only
        logits[:, p:p + g // 2, 0] = torch.linspace(0.5, 0.1, g // 2, dtype=torch.float64)
        return logits

    prompt, _ = problems(TASK, 2)
    out = D.decode_multiblock(fn, prompt, g, 2, threshold=0.01, mask_id=TASK.mask_id, block_add_threshold=0.0,
                              decoded_token_threshold=1.0)
    assert (out.timeline[:, 0] <= 2).all() or (out.timeline[:, 1] <= 2).all()
    assert (out.tokens != TASK.mask_id).all()


@pytest.mark.parametrize("shift", [True, False])
@pytest.mark.parametrize("delay", [0, 2])
def test_kv_refresh_every_forward_equals_the_no_cache_decoder(shift, delay):
    prompt, _ = problems(TASK_EOS, 4)
    model = random_denoiser(TASK_EOS, shift=shift)
    kw = dict(mask_id=TASK_EOS.mask_id, block_add_threshold=0.1, decoded_token_threshold=0.95,
              eos_id=TASK_EOS.eos_id, early_stop=True)
    ref = [D.decode_multiblock(model, prompt[i:i + 1], TASK_EOS.answer_len, 4, 1.2, **kw) for i in range(4)]
    got = D.decode_multiblock_kvcache(model, prompt, TASK_EOS.answer_len, 4, 1.2, cache_delay_iter=delay,
                                      refresh_interval=1, **kw)
    assert torch.equal(got.tokens, torch.cat([r.tokens for r in ref]))
    assert torch.equal(got.nfe, torch.cat([r.nfe for r in ref]))
    assert torch.equal(got.timeline, torch.cat([r.timeline for r in ref]))


@pytest.mark.parametrize("shift", [True, False])
def test_cached_forward_uses_the_cache_and_matches_full_forward(shift):
    model = random_denoiser(TASK, shift=shift)
    prompt, answer = problems(TASK, 2)
    x = torch.cat([prompt, answer], 1)
    with torch.no_grad():
        full, cache_all = model.forward_from(x, 0, None)
        torch.testing.assert_close(full, model(x), rtol=0, atol=0)
        for start in (3, TASK.prompt_len, x.shape[1] - 1):
            part, _ = model.forward_from(x, start, model.prefix_cache(cache_all, start))
            torch.testing.assert_close(part, full[:, start:], rtol=1e-10, atol=1e-10)


def test_kv_cache_decoder_with_an_oracle_and_fewer_positions():
    """With caching and rare refreshes the oracle still decodes exactly, feeding fewer positions."""
    prompt, answer = problems(TASK_EOS, 3)
    fn = oracle(TASK_EOS)
    model = random_denoiser(TASK_EOS)
    kw = dict(mask_id=TASK_EOS.mask_id, block_add_threshold=0.1, decoded_token_threshold=0.95)
    slow = D.decode_multiblock(model, prompt, TASK_EOS.answer_len, 2, 0.3, **kw)
    fast = D.decode_multiblock_kvcache(model, prompt, TASK_EOS.answer_len, 2, 0.3, cache_delay_iter=1,
                                       refresh_interval=1000, **kw)
    assert (fast.tokens != TASK_EOS.mask_id).all()
    assert int(fast.positions.sum()) < int(slow.positions.sum())
    assert torch.equal(D.decode_multiblock(fn, prompt, TASK_EOS.answer_len, 2, 0.3, **kw).tokens, answer)


def test_early_stop_fills_eos_and_saves_forwards():
    prompt, answer = problems(TASK_EOS, 4)
    kw = dict(mask_id=TASK_EOS.mask_id, block_add_threshold=1.0, decoded_token_threshold=1.0)
    full = D.decode_multiblock(oracle(TASK_EOS), prompt, TASK_EOS.answer_len, 4, 0.5, **kw)
    stop = D.decode_multiblock(oracle(TASK_EOS), prompt, TASK_EOS.answer_len, 4, 0.5, eos_id=TASK_EOS.eos_id,
                               early_stop=True, **kw)
    assert torch.equal(full.tokens, answer) and torch.equal(stop.tokens, answer)
    assert (full.nfe == 4).all() and (stop.nfe == 3).all()  # the all-EOS fourth block is never run
    assert stop.filled[:, 12:].all() and not stop.filled[:, :11].any()


def test_early_stop_overwrites_everything_after_the_first_eos():
    g, p, eos = TASK.answer_len, TASK.prompt_len, TASK.eos_id

    def fn(x):
        logits = torch.zeros(len(x), x.shape[1], TASK.vocab_size, dtype=torch.float64)
        logits[..., 3] = 20.0
        logits[:, p + 2, eos] = 40.0  # an EOS at answer position 2
        return logits

    prompt, _ = problems(TASK, 3)
    out = D.decode_multiblock(fn, prompt, g, 4, threshold=0.1, mask_id=TASK.mask_id, eos_id=eos, early_stop=True)
    assert (out.tokens[:, :2] == 3).all() and (out.tokens[:, 2:] == eos).all()
    assert out.filled[:, 4:].all()
    no_stop = D.decode_multiblock(fn, prompt, g, 4, threshold=0.1, mask_id=TASK.mask_id)
    assert (no_stop.tokens[:, 3:] == 3).all() and int(no_stop.nfe[0]) > int(out.nfe[0])


def eos_in_the_last_forward(task: D.ChainTask, eos_at: int):
    """A denoiser certain of every answer token at once (token 3), with an EOS at answer position ``eos_at``: a
    single forward decodes the whole answer, EOS included, and nothing is masked afterwards."""
    p = task.prompt_len

    def fn(x):
        logits = torch.zeros(len(x), x.shape[1], task.vocab_size, dtype=torch.float64)
        logits[..., 3] = 40.0
        logits[:, p + eos_at, task.eos_id] = 80.0
        return logits

    return fn


@pytest.mark.parametrize("block", [TASK.answer_len, 4])
@pytest.mark.parametrize("cached", [False, True])
def test_early_stop_fill_holds_when_the_eos_comes_in_the_last_forward(block, cached):
    """Everything after the first EOS is EOS even when the forward that decoded the EOS also decoded the last masked
    position (the public code checks for completion before applying the early stop, and keeps the tokens)."""
    g, eos = TASK.answer_len, TASK.eos_id
    fn = eos_in_the_last_forward(TASK, 2)
    prompt, _ = problems(TASK, 3)
    kw = dict(mask_id=TASK.mask_id, eos_id=eos, early_stop=True, block_add_threshold=0.0, decoded_token_threshold=0.0)
    if cached:
        model = random_denoiser(TASK)
        model.forward = fn  # the cached decoder calls forward_from: route both through the same logits
        model.forward_from = lambda x, start, cache: (fn(x)[:, start:], None)
        model.prefix_cache = lambda full, prefix: None
        out = D.decode_multiblock_kvcache(model, prompt, g, block, 1.0, refresh_interval=1, **kw)
    else:
        out = D.decode_multiblock(fn, prompt, g, block, 1.0, **kw)
    assert (out.tokens[:, :2] == 3).all()
    assert (out.tokens[:, 2:] == eos).all(), out.tokens
    assert int(out.nfe.max()) <= -(-g // block)


def test_decoder_input_errors():
    prompt, _ = problems(TASK, 2)
    fn = oracle(TASK)
    with pytest.raises(ValueError, match="prompt"):
        D.decode_multiblock(fn, prompt[0], 10, 4, 0.5, mask_id=TASK.mask_id)
    with pytest.raises(ValueError, match="mask token"):
        D.decode_vanilla(fn, torch.full((1, 3), TASK.mask_id), 10, 4, mask_id=TASK.mask_id)
    with pytest.raises(ValueError, match="block_add_threshold"):
        D.decode_multiblock(fn, prompt, 10, 4, 0.5, mask_id=TASK.mask_id, block_add_threshold=1.5)
    with pytest.raises(ValueError, match="rule"):
        D.decode_multiblock(fn, prompt, 10, 4, 0.5, mask_id=TASK.mask_id, rule="margin")
    with pytest.raises(ValueError, match="refresh_interval"):
        D.decode_multiblock_kvcache(random_denoiser(TASK), prompt, 10, 4, 0.5, mask_id=TASK.mask_id,
                                    refresh_interval=0)
    with pytest.raises(ValueError, match="gen_len"):
        D.decode_vanilla(fn, prompt, 0, 4, mask_id=TASK.mask_id)
    with pytest.raises(ValueError, match="bidirectional"):
        D.Denoiser(TransformerConfig(vocab_size=11, max_len=8, causal=True), mask_id=10)


# ---------------------------------------------------------------------------------------------- training


def test_task_follows_its_rule():
    task = D.ChainTask(n_operands=4, modulus=5, eos_pad=2)
    prompt, answer = task.sample(50, torch.Generator().manual_seed(1))
    assert prompt.shape == (50, 6) and answer.shape == (50, 8)
    for pr, an in zip(prompt.tolist(), answer.tolist(), strict=True):
        a = pr[1:5]
        assert pr[0] == task.bos_id and pr[-1] == task.eq_id
        assert an == [a[1], (a[0] + a[1]) % 5, a[2], sum(a[:3]) % 5, a[3], sum(a) % 5, task.eos_id, task.eos_id]
    assert task.correct(answer, answer).all() and not task.correct((answer + 1) % 5, answer).any()
    with pytest.raises(ValueError):
        D.ChainTask(n_operands=1)


def test_pseudo_trajectory_mask_by_hand():
    order = torch.tensor([[3, 1, 4, 2, 5, 8, 6, 7]])
    s, e = torch.tensor([0]), torch.tensor([4])
    # after 0 + floor(0.5 * 4) = 2 teacher steps, positions 1 and 3 are decoded
    assert D.pseudo_trajectory_mask(order, s, e, 0.5).int().tolist() == [[1, 0, 1, 0, 1, 1, 1, 1]]
    assert D.pseudo_trajectory_mask(order, s, e, 0.0).int().tolist() == [[0, 0, 0, 0, 1, 1, 1, 1]]
    assert D.pseudo_trajectory_mask(order, s, e, 1.0).int().tolist() == [[1, 1, 1, 1, 1, 1, 1, 1]]
    # second block at ratio 0.25: state 4 + 3 = 7, only the position decoded 8th stays masked
    s2, e2 = torch.tensor([4]), torch.tensor([8])
    assert D.pseudo_trajectory_mask(order, s2, e2, 0.25).int().tolist() == [[0, 0, 0, 0, 0, 1, 0, 0]]
    with pytest.raises(ValueError):
        D.pseudo_trajectory_mask(order, s, e, 1.5)
    with pytest.raises(ValueError):
        D.pseudo_trajectory_mask(order, e, s, 0.5)


def test_d3llm_loss_parts_match_a_direct_computation():
    model = random_denoiser(TASK)
    prompt, answer = problems(TASK, 4)
    order = torch.stack([torch.randperm(TASK.answer_len, generator=torch.Generator().manual_seed(i)) + 1
                         for i in range(4)])
    start, end = torch.tensor([0, 2, 4, 6]), torch.tensor([4, 6, 8, 8])
    loss, parts = D.d3llm_loss(model, prompt, answer, order, start, end, 0.5)
    assert loss.item() == pytest.approx((parts["ce"] + parts["ce_rev"] + 2 * parts["entropy"]) / 4, rel=1e-10)
    # direct CE on the masked positions inside the blocks
    mask = D.pseudo_trajectory_mask(order, start, end, 0.5)
    x = torch.cat([prompt, torch.where(mask, TASK.mask_id, answer)], 1)
    with torch.no_grad():
        logits = model(x)[:, TASK.prompt_len:]
    pos = torch.arange(TASK.answer_len)
    inside = (pos >= start[:, None]) & (pos < end[:, None])
    sel = mask & inside
    ce = -torch.log_softmax(logits, -1).gather(-1, answer[..., None])[..., 0][sel].mean()
    assert parts["ce"] == pytest.approx(float(ce), rel=1e-9)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_curriculum_block_size():
    sizes = [16, 16, 24, 24, 32, 32]
    assert D.curriculum_block_size(0.0, sizes) == 16
    assert D.curriculum_block_size(1.5 / 6, sizes) == 20
    assert D.curriculum_block_size(5.5 / 6, sizes) == 32
    assert D.curriculum_block_size(1.0, sizes) == 32
    with pytest.raises(ValueError):
        D.curriculum_block_size(0.5, [])


def test_autoregressive_mode_does_not_see_the_predicted_token():
    """Causal mask + shifted logits = next-token prediction: the logits at j ignore tokens j, j+1, ..."""
    model = random_denoiser(TASK)
    prompt, answer = problems(TASK, 2)
    x = torch.cat([prompt, answer], 1)
    n = x.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    j = TASK.prompt_len + 3
    y = x.clone()
    y[:, j:] = (y[:, j:] + 1) % TASK.modulus
    with torch.no_grad():
        torch.testing.assert_close(model(x, attn_mask=causal)[:, :j + 1], model(y, attn_mask=causal)[:, :j + 1],
                                   rtol=0, atol=1e-12)
        assert (model(x)[:, :j] - model(y)[:, :j]).abs().max() > 1e-6  # bidirectional: it does see them
    with pytest.raises(ValueError, match="shift"):
        D.train_autoregressive(random_denoiser(TASK, shift=False), TASK, steps=1, batch=2)


def test_training_loops_run_and_lower_the_loss():
    task = D.ChainTask(n_operands=3, modulus=3)
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=task.vocab_size, max_len=task.prompt_len + task.answer_len, d_model=32,
                            n_layers=1, n_heads=2)
    model = D.Denoiser(cfg, task.mask_id)
    g = torch.Generator().manual_seed(0)
    ar = D.train_autoregressive(model, task, steps=60, batch=32, lr=3e-3, warmup=5, generator=g)
    assert sum(ar[-10:]) / 10 < sum(ar[:10]) / 10
    losses = D.train_diffusion(model, task, steps=120, batch=32, lr=3e-3, warmup=5, generator=g)
    assert sum(losses[-20:]) / 20 < sum(losses[:20]) / 20
    prompt, answer = task.sample(32, g)
    order = D.decode_vanilla(model, prompt, task.answer_len, 2, mask_id=task.mask_id).timeline
    hist = D.train_d3llm(model, prompt, answer, order, steps=3, batch=8, block_sizes=[2], generator=g)
    assert len(hist) == 3 and all(math.isfinite(h["loss"]) for h in hist)
    assert not model.training


def test_train_d3llm_refuses_an_empty_trajectory_set():
    model = random_denoiser(TASK)
    empty = torch.zeros(0, TASK.answer_len, dtype=torch.long)
    with pytest.raises(ValueError, match="no trajectories"):
        D.train_d3llm(model, torch.zeros(0, TASK.prompt_len, dtype=torch.long), empty, empty, steps=1, batch=2,
                      block_sizes=[2])


# ---------------------------------------------------------------------------------------------- harness


def test_recipe_takes_only_its_fields_from_a_config():
    cfg = {"d_model": 32, "n_layers": 1, "block_sizes": [2, 3], "thresholds": [0.1], "n_seeds": 3}
    r = D.Recipe.from_config(cfg)
    assert (r.d_model, r.n_layers, list(r.block_sizes)) == (32, 1, [2, 3])
    assert r.n_heads == D.Recipe().n_heads and not hasattr(r, "thresholds")


def test_curves_of_the_oracle_match_the_decoders():
    ev = D.EvalSet.sample(TASK_EOS, 8, 3, block=4, thresholds=[0.1, 0.5], conf_thresholds=[0.9])
    assert torch.equal(ev.prompt, TASK_EOS.sample(8, torch.Generator().manual_seed(3))[0])
    fn = oracle(TASK_EOS)
    res = D.curves(fn, ev)
    assert res.vanilla == [(1.0, 100.0)] and set(res.outputs) == {"vanilla", 0.1, 0.5}
    for t, (tpf, acc) in zip(ev.thresholds, res.entropy, strict=True):
        ref = D.decode_multiblock(fn, ev.prompt, TASK_EOS.answer_len, 4, t, mask_id=TASK_EOS.mask_id,
                                  eos_id=TASK_EOS.eos_id, early_stop=True, block_add_threshold=0.1,
                                  decoded_token_threshold=0.95)
        assert tpf == ref.tpf > 1.0 and acc == 100.0
    ref = D.decode_multiblock(fn, ev.prompt, TASK_EOS.answer_len, 4, 0.9, mask_id=TASK_EOS.mask_id,
                              eos_id=TASK_EOS.eos_id, early_stop=True, block_add_threshold=1.0,
                              decoded_token_threshold=1.0, rule="confidence")
    assert res.confidence == [(ref.tpf, 100.0)]
    assert res.rounded()["entropy"] == [[round(r, 4), 100.0] for r, _ in res.entropy]
    wrong = D.Decoded((ev.answer + 1) % TASK_EOS.modulus, *(getattr(ref, f) for f in ("nfe", "timeline", "filled",
                                                                                       "positions")))
    assert D.accuracy(wrong, ev.answer, TASK_EOS) == 0.0


def test_aup_table_scores_both_models_against_the_teacher_reference():
    """The student's points are cut at the teacher's one-token-per-forward accuracy minus 5, not at its own."""
    teacher = D.Curves(vanilla=[(1.0, 90.0)], entropy=[(2.0, 88.0)], confidence=[])
    student = D.Curves(vanilla=[(1.0, 99.0)], entropy=[(2.0, 92.0), (3.0, 86.0), (4.0, 84.0)], confidence=[])
    table, y_max = D.aup_table(teacher, student)
    assert y_max == 99.0
    # own reference 99 would keep only (1, 99); the teacher's 90 keeps everything down to 85
    want = reference_aup([(1.0, 99.0), (2.0, 92.0), (3.0, 86.0)], 99.0)
    assert table["student / entropy"] == pytest.approx(want, rel=1e-12)


def noisy_oracle(task: D.ChainTask, scale: float, noise: float):
    """The oracle's logits scaled down plus a deterministic pseudo-random term of the input: right on some problems
    and decoder settings, wrong on others."""
    base = oracle(task)

    def fn(x: torch.Tensor) -> torch.Tensor:
        v = torch.arange(task.vocab_size, dtype=torch.float64)
        pos = torch.arange(x.shape[1], dtype=torch.float64)
        phase = 1.3 * v[None, None, :] * (x.double()[..., None] + 1.3) + 0.7 * pos[None, :, None]
        return base(x) / 30.0 * scale + noise * torch.sin(phase + x.double().sum(1)[:, None, None])

    return fn


def evaluated_pair(n: int = 40, seed: int = 0):
    """Teacher and student curves of two noisy oracles on ``n`` problems (accuracies between 0 and 100 that differ
    from point to point and from model to model)."""
    ev = D.EvalSet.sample(TASK_EOS, n, seed, block=4, thresholds=[0.5, 1.5, 2.5], conf_thresholds=[0.5])
    teacher, student = (D.curves(noisy_oracle(TASK_EOS, 3.0, z), ev) for z in (2.0, 1.8))
    accs = [y for res in (teacher, student) for _, y in res.vanilla + res.entropy]
    assert 0 < min(accs) < max(accs) < 100 and teacher.entropy != student.entropy
    return ev, teacher, student


def test_resampled_gains_against_curves_rebuilt_from_the_drawn_problems():
    ev, teacher, student = evaluated_pair()
    table, _ = D.aup_table(teacher, student)
    n = len(ev.prompt)
    ones = D.resampled_gains(teacher, student, np.ones((1, n)))
    assert ones[0] == pytest.approx(table["student / entropy"] - table["teacher / entropy"], rel=1e-9, abs=1e-9)
    rng = np.random.default_rng(5)
    idx = rng.integers(0, n, (4, n))
    counts = np.stack([np.bincount(i, minlength=n) for i in idx])
    got = D.resampled_gains(teacher, student, counts)
    g = TASK_EOS.answer_len

    def rebuilt(res: D.Curves, i: np.ndarray) -> D.Curves:  # the points recomputed from the drawn problems
        pts = {k: [(len(i) * g / float(nfe[i].sum()), 100.0 * float(ok[i].double().mean()))
                   for ok, nfe in res.samples[k]] for k in D.CURVE_KINDS}
        return D.Curves(**pts)

    for b in range(4):
        table_b = D.aup_table(rebuilt(teacher, idx[b]), rebuilt(student, idx[b]))[0]
        want = table_b["student / entropy"] - table_b["teacher / entropy"]
        assert got[b] == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_bootstrap_gain_of_a_model_against_itself_is_zero_and_seeded():
    ev, teacher, student = evaluated_pair()
    same = D.bootstrap_gain(teacher, teacher, n_boot=50)
    assert (same.point, same.lo, same.hi) == (0.0, 0.0, 0.0)
    a = D.bootstrap_gain(teacher, student, n_boot=200, seed=3)
    assert a == D.bootstrap_gain(teacher, student, n_boot=200, seed=3)
    assert a.lo <= a.hi and a.level == 0.95
    with pytest.raises(ValueError):
        D.bootstrap_gain(teacher, student, n_boot=0)


def test_tpf_at_accuracy_worked_by_hand():
    pts = [(1.0, 100.0), (2.0, 98.0), (2.5, 90.0), (3.0, 60.0)]
    assert D.tpf_at_accuracy(pts, 94.0)[0] == pytest.approx(2.25)   # halfway from 98 to 90
    assert D.tpf_at_accuracy(pts, 98.0)[0] == pytest.approx(2.0)    # at or above counts
    assert D.tpf_at_accuracy(pts, 50.0)[0] == 3.0                   # never falls below: the last point
    assert np.isnan(D.tpf_at_accuracy(pts, 100.5)[0])               # the first point is already below
    rising_again = [(1.0, 100.0), (2.0, 80.0), (3.0, 99.0)]          # the first fall counts
    assert D.tpf_at_accuracy(rising_again, 90.0)[0] == pytest.approx(1.5)
    per_draw = D.tpf_at_accuracy([(np.array([1.0, 1.0]), np.array([100.0, 100.0])),
                                  (np.array([2.0, 3.0]), np.array([90.0, 96.0]))], np.array([95.0, 95.0]))
    assert per_draw == pytest.approx([1.5, 3.0])


def test_matched_tpf_against_the_curves_and_against_itself():
    ev = D.EvalSet.sample(TASK_EOS, 40, 0, block=4, thresholds=[0.5, 1.5, 2.5], conf_thresholds=[],
                          fixed_counts=[2, 3])
    teacher, student = (D.curves(noisy_oracle(TASK_EOS, 3.0, z), ev) for z in (2.0, 1.8))
    g = TASK_EOS.answer_len  # LLaDA with 2 and 3 tokens per forward: ceil(block / k) forwards a block, no early stop
    want = [g / sum(-(-min(4, g - lo) // k) for lo in range(0, g, 4)) for k in (2, 3)]
    assert [r for r, _ in student.fixed] == pytest.approx(want)
    m = D.matched_tpf(teacher, student, n_boot=100, seed=1)
    cut = teacher.vanilla[0][1] - D.AUP_CUT
    assert m.cut == cut
    assert m.student.value == pytest.approx(D.tpf_at_accuracy(student.vanilla + student.entropy, cut)[0])
    assert m.fixed.value == pytest.approx(D.tpf_at_accuracy(student.vanilla + student.fixed, cut)[0])
    assert m.over_fixed.value == pytest.approx(m.student.value / m.fixed.value)
    assert m.student.lo <= m.student.value <= m.student.hi and m.student.n == 40
    same = D.matched_tpf(teacher, teacher, n_boot=50, ablation=teacher)
    assert (same.over_teacher.value, same.over_teacher.lo, same.over_teacher.hi) == (1.0, 1.0, 1.0)
    assert same.over_ablation == same.over_teacher and m.ablation is None
    gain = D.bootstrap_gain(teacher, student, n_boot=100, seed=1)
    aups = D.resampled_aups(teacher, student, np.ones((1, 40)))
    assert aups["teacher / entropy"][0] == pytest.approx(D.aup_table(teacher, student)[0]["teacher / entropy"])
    assert len(gain.teacher_draws) == 100 and gain.estimate(40).value == gain.point
    assert gain.teacher.value == pytest.approx(aups["teacher / entropy"][0]) and gain.teacher.n == 40


def test_aup_table_against_the_written_out_formula():
    teacher = D.Curves(vanilla=[(1.0, 90.0)], entropy=[(2.0, 89.0), (3.0, 80.0)], confidence=[(1.5, 90.0)])
    student = D.Curves(vanilla=[(1.0, 92.0)], entropy=[(2.5, 91.0)], confidence=[(2.0, 88.0)])
    table, y_max = D.aup_table(teacher, student)
    assert y_max == 92.0
    # points more than 5 below the one-token-per-forward accuracy are left out (80 < 90 - 5)
    assert table["teacher / entropy"] == pytest.approx(reference_aup([(1.0, 90.0), (2.0, 89.0)], 92.0), rel=1e-12)
    assert table["teacher / confidence"] == pytest.approx(reference_aup([(1.0, 90.0), (1.5, 90.0)], 92.0))
    assert table["student / entropy"] == pytest.approx(reference_aup([(1.0, 92.0), (2.5, 91.0)], 92.0))
    assert table["student / confidence"] == pytest.approx(reference_aup([(1.0, 92.0), (2.0, 88.0)], 92.0))
    assert (table["teacher / vanilla"], table["student / vanilla"]) == (90.0, 92.0)


def test_kv_sweep_matches_the_decoders_one_prompt_at_a_time():
    model = random_denoiser(TASK_EOS)
    ev = D.EvalSet.sample(TASK_EOS, 5, 1, block=4, thresholds=[1.2], conf_thresholds=[])
    rows, per = D.kv_sweep(model, ev, 3, 1.2, settings={"no cache": (0, 1), "delay 0, no refresh": (0, 10**9)})
    kw = dict(mask_id=TASK_EOS.mask_id, eos_id=TASK_EOS.eos_id, early_stop=True, block_add_threshold=0.1,
              decoded_token_threshold=0.95)
    ref = [D.decode_multiblock(model, ev.prompt[i:i + 1], TASK_EOS.answer_len, 4, 1.2, **kw) for i in range(3)]
    tokens = torch.cat([r.tokens for r in ref])
    base = rows["no cache"]
    assert base["nfe"] == pytest.approx(sum(float(r.nfe) for r in ref) / 3)
    assert base["acc"] == 100.0 * float(TASK_EOS.correct(tokens, ev.answer[:3]).double().mean())
    assert base["positions"] == pytest.approx(sum(float(r.positions) for r in ref) / 3)
    assert rows["delay 0, no refresh"]["positions"] < base["positions"] and base["ms"] > 0
    for name, row in rows.items():  # the per-problem values behind each mean
        assert 100.0 * per[name]["correct"].mean() == pytest.approx(row["acc"])
        assert per[name]["positions"].mean() == pytest.approx(row["positions"])
        assert len(per[name]["correct"]) == 3


def tiny_recipe(**kw) -> D.Recipe:
    return D.Recipe(d_model=32, n_layers=1, n_heads=2, ar_steps=60, diff_steps=60, batch=32, lr=3e-3, traj_prompts=64,
                    student_steps=3, student_batch=8, block_sizes=(2,), block=2, **kw)


def test_teacher_and_distillation_are_seeded_and_leave_the_teacher_alone():
    task = D.ChainTask(n_operands=3, modulus=3)
    recipe = tiny_recipe()
    teacher, ar, diff = D.train_teacher(task, recipe, 0)
    assert len(ar) == recipe.ar_steps and len(diff) == recipe.diff_steps
    assert D.train_teacher(task, recipe, 0)[1:] == (ar, diff)  # seeded: the same losses again
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student, hist, ok = D.distill(teacher, task, recipe, 0)
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in before.items())
    assert any(not torch.equal(v, student.state_dict()[k]) for k, v in before.items())
    # the fraction of trajectory prompts the teacher decodes right, recomputed from the same stream
    prompt, answer = task.sample(recipe.traj_prompts, torch.Generator().manual_seed(derive(0, "trajectories")))
    traj = D.decode_vanilla(teacher, prompt, task.answer_len, recipe.block, mask_id=task.mask_id)
    assert 0.0 < ok == float(task.correct(traj.tokens, answer).double().mean())
    assert len(hist) == recipe.student_steps
    # the random-masking ablation: the same prompts and steps, other masks, so another student
    rand, hist_r, ok_r = D.distill(teacher, task, recipe, 0, order="random")
    assert ok_r == ok and len(hist_r) == len(hist) and hist_r != hist
    assert D.distill(teacher, task, recipe, 0, order="random")[1] == hist_r  # seeded
    with pytest.raises(ValueError, match="order"):
        D.distill(teacher, task, recipe, 0, order="reversed")

