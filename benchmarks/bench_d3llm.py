"""Benchmark of the dLLM decoders of paper 03 (d3LLM; ``repro.papers.d3llm``) on one small trained model.

Tokens per forward (TPF) and wall-clock tokens per second of vanilla decoding (one token per forward), Fast-dLLM's
single-block confidence threshold and d3LLM's entropy-based multi-block decoding at two entropy thresholds,
each multi-block setting with and without the KV-cache refresh, on the same model and the same prompts; printed
as ratios to vanilla and written to ``results/bench-d3llm.json``. Two cache settings: the paper's (a finished
block is cached 2 forwards later, full refresh every 3 forwards: ``d2/r3``), which on our 20-token answers of
about 8 forwards in blocks of 8 caches only part of the time, and ``d0/r3`` (cached as soon as finished, refresh
every 3).

The model: the teacher of the notebook's full-mode recipe (``Recipe()``: quick mode trains the same network
with batch 32), trained here from a fixed seed (autoregressive warm-up, then masked
diffusion on the chain task; about two minutes on one CPU thread; nothing is cached between runs). Two cases:
``batch 1`` decodes the prompts one at a time, as the paper's evaluation does (the only case with the KV cache,
which is per prompt); ``batched`` decodes all prompts in one batch (no cache). Timings are medians over
``--repeats`` runs of the whole prompt set. On a model this small the time per forward is mostly fixed overhead,
so the wall-clock speed-up follows the number of forwards, and a KV cache saves positions (compute) rather
than time; on a large model and long answers the cache saves time as well.

Roofline (issue 43 item 1): the peak is measured once per run (``repro.bench.measure_peak``: a square matmul and a
streaming add at the model's dtype, on the run's device and thread count); each decoder's work is the FLOPs of its
matrix products over the whole prompt set (torch's FLOP counter on one untimed run: linear layers, and attention's
two products, with a formula added for the CPU flash-attention kernel that torch does not count), printed with the
achieved GFLOP/s, its fraction of the peak, GFLOP per forward and tokens per second.

Run: ``.venv/bin/python benchmarks/bench_d3llm.py`` (about 4 minutes on 2 CPU cores; ``--device cuda`` on a GPU).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict

import torch
from torch.utils import flop_counter

from repro import bench
from repro.papers import d3llm as D

_CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
if _CPU_FLASH not in flop_counter.flop_registry:  # torch counts the CUDA attention kernels, not this one

    @flop_counter.register_flop_formula(_CPU_FLASH)
    def _cpu_flash_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)

TASK = D.ChainTask(n_operands=10, modulus=7, eos_pad=2)
BLOCK = 8
KV_SETTINGS = [(2, 3), (0, 3)]  # (cache delay, refresh interval): the paper's, and one that caches at once
MB = dict(mask_id=TASK.mask_id, eos_id=TASK.eos_id, early_stop=True, block_add_threshold=0.1,
          decoded_token_threshold=0.95)


def train_model(seed: int, device: torch.device) -> D.Denoiser:
    """The notebook's full-mode teacher (:func:`repro.papers.d3llm.train_teacher` with ``Recipe()``): 250
    autoregressive + 350 masked-diffusion steps, batch 64."""
    return D.train_teacher(TASK, D.Recipe(), seed, device)[0]


def decoders(model: D.Denoiser, thresholds: list[float]) -> dict[str, tuple[Callable, bool]]:
    """name -> (decode(prompts) -> Decoded, whether it decodes one prompt at a time only)."""
    g = TASK.answer_len
    out: dict[str, tuple[Callable, bool]] = {
        "vanilla": (lambda p: D.decode_vanilla(model, p, g, BLOCK, mask_id=TASK.mask_id), False),
        "Fast-dLLM conf 0.8": (lambda p: D.decode_multiblock(
            model, p, g, BLOCK, 0.8, mask_id=TASK.mask_id, eos_id=TASK.eos_id, early_stop=True,
            block_add_threshold=1.0, decoded_token_threshold=1.0, rule="confidence"), False),
    }
    for t in thresholds:
        out[f"multi-block H<={t}"] = (lambda p, t=t: D.decode_multiblock(model, p, g, BLOCK, t, **MB), False)
        for delay, refresh in KV_SETTINGS:
            out[f"multi-block H<={t} + KV d{delay}/r{refresh}"] = (lambda p, t=t, d=delay, r=refresh: (
                D.decode_multiblock_kvcache(model, p, g, BLOCK, t, cache_delay_iter=d, refresh_interval=r, **MB)), True)
    return out


def count_flops(run: Callable[[], object]) -> int:
    """FLOPs of the matrix products (linear layers, attention) of one call of ``run``, by torch's FLOP counter."""
    with flop_counter.FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()


def one_at_a_time(fn: Callable, prompts: torch.Tensor) -> D.Decoded:
    outs = [fn(prompts[i:i + 1]) for i in range(len(prompts))]
    return D.Decoded(*(torch.cat([getattr(o, f) for o in outs]) for f in
                       ("tokens", "nfe", "timeline", "filled", "positions")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.3, 1.0])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = train_model(args.seed, device).eval()
    peak = bench.measure_peak(next(model.parameters()).dtype, device, repeats=20)  # best of 20: busy moments read low
    prompts, answers = TASK.sample(args.prompts, torch.Generator().manual_seed(10_000 + args.seed), device)
    rows: list[bench.Row] = []
    tokens = args.prompts * TASK.answer_len
    with torch.no_grad():
        for case in ("batch 1", "batched"):
            for name, (fn, per_prompt) in decoders(model, args.thresholds).items():
                if case == "batched" and per_prompt:
                    continue
                run = (lambda fn=fn: one_at_a_time(fn, prompts)) if case == "batch 1" else (lambda fn=fn: fn(prompts))
                out = run()
                flops = count_flops(run)  # an untimed run: decoding is deterministic, so the same work
                secs = bench.time_call(run, repeats=args.repeats, warmup=0, device=device)
                acc = float(TASK.correct(out.tokens, answers).double().mean())
                forwards = float(out.nfe.double().sum()) if case == "batch 1" else float(out.nfe.max())
                rows.append(bench.Row(f"{case}, {args.prompts} prompts", name, secs, {
                    "tpf": out.tpf, "tokens_per_s": tokens / secs, "accuracy": acc,
                    "positions_per_answer": float(out.positions.double().mean()), "flops": flops,
                    "forwards": forwards}))
    summary = {}
    for r in rows:
        base = next(b for b in rows if b.case == r.case and b.method == "vanilla")
        summary[f"{r.case} | {r.method}"] = {
            "tpf_ratio": round(r.extra["tpf"] / base.extra["tpf"], 3),
            "tokens_per_s_ratio": round(r.extra["tokens_per_s"] / base.extra["tokens_per_s"], 3),
            "positions_ratio": round(r.extra["positions_per_answer"] / base.extra["positions_per_answer"], 3),
            "accuracy": round(r.extra["accuracy"], 3)}
    roof = {f"{r.case} | {r.method}": bench.roofline(r.seconds, peak, flops=r.extra["flops"], count=tokens,
                                                     unit="tokens") for r in rows}
    notes = {"model": "full-mode teacher recipe of notebooks/03-d3llm.ipynb, trained in this run (seed "
                      f"{args.seed}): 3 layers, d=128, 250 AR + 350 diffusion steps",
             "task": "ChainTask(10 operands, mod 7, 2 EOS), 20 answer tokens, blocks of 8",
             "kv": "dD/rR: cache_delay_iter=D, refresh_interval=R", "threads": args.threads, "device": str(device),
             "repeats": args.repeats, "ratios_to_vanilla": summary, "peak": asdict(peak), "roofline": roof}
    bench.publish("d3llm", rows, baseline="vanilla", notes=notes)
    print("\nratios to vanilla (TPF, tokens/s, positions fed) and accuracy:")
    for k, v in summary.items():
        print(f"  {k:<55} TPF x{v['tpf_ratio']:<6} tokens/s x{v['tokens_per_s_ratio']:<6} "
              f"positions x{v['positions_ratio']:<6} acc {v['accuracy']:.3f}")
    print(f"\nroofline against the {peak.describe()}:")
    for r in rows:
        work = f"{r.extra['flops'] / 1e9:.2f} GFLOP, {r.extra['flops'] / r.extra['forwards'] / 1e6:.1f} MFLOP/forward"
        line = bench.roofline_line(f"{r.method} ({work})", roof[f"{r.case} | {r.method}"])
        print(f"  {r.case.split(',')[0]}: {line}")


if __name__ == "__main__":
    main()
