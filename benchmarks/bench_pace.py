"""Benchmark of the PACE codec (paper 09, ``repro.papers.pace``): rate and encode/decode throughput per codec and
mode.

On the same synthetic 64-beam scans (``repro.papers.pace.lidar``) at octree depths 9 and 10: Draco (DracoPy,
``quantization_bits`` = depth, ``compression_level`` = 10), the parent-context count table, the ancestor MLP, and
one PACE checkpoint decoded fully parallel (``fp``), in 2 / 4 / 8 stages and autoregressively (``ar``). Every
stream is real (bytes out, bytes in; the octree codecs are checked bit-exact). The rows give the median decoding
time; ``extra`` holds bits per input point, encode/decode throughput (input points per second) and the rate
relative to the count table. Ratios are to the count table measured in the same run; the timings are
interleaved over rounds (all codecs once per round, median over rounds), so a load change hits all alike.

Roofline (issue 43 item 1): the peak is measured once per run (``repro.bench.measure_peak``: a float32 square
matmul and a streaming add, at the run's thread count); each codec's decode is read against it: the FLOPs of its
matrix products per decode (``repro.papers.pace.model.decode_flops``, counted analytically per level and checked
against torch's FLOP counter in ``tests/papers/test_pace_model.py``; 0 for the count table, unknown for Draco), the
achieved GFLOP/s and fraction of the peak, points and coded symbols per second through the decoder.

Breakdown (issue 43 item 4): the fully parallel decode at each depth is timed by phase
(``decode_quantized(..., timings=...)``: header checks, octree expansion, node contexts, network forward, pmf →
16-bit tables, constriction's ANS, the rest), medians over repeats; the network's share is read against the peak,
the coder's as symbols per second, and the goal (≥ 2 M points/s at depth 9 in ``fp`` mode, one thread) is printed
as True/False beside the best rate the measured phases allow with the network at 100 % of the peak.

The models are trained here as in the notebook's quick mode (12 scans, 200 steps; about half a minute).
Run: ``.venv/bin/python benchmarks/bench_pace.py`` (about a minute and a half on 2 CPU cores, one thread).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict

import DracoPy
import numpy as np
import torch

from repro import bench
from repro.papers.pace import codec as C
from repro.papers.pace import lidar as L
from repro.papers.pace import model as M
from repro.papers.pace import octree as O

DEPTHS = (9, 10)
TRAIN_DEPTH = 10
HALF_SIZE = 128.0


def train_models(n_train: int, steps: int, seed: int, device: torch.device) -> dict[str, object]:
    """The notebook's quick-mode recipe: PACE (random k per batch), the ancestor MLP and the count table."""
    grid = O.Grid.centred(HALF_SIZE, TRAIN_DEPTH)
    scans = L.make_scans(range(seed, seed + n_train))
    levels = [lv for p in scans for lv in O.octree_contexts(O.build_octree(O.quantize(p, grid), TRAIN_DEPTH))]
    data = M.WindowData.from_levels(levels, 256).to(device)
    torch.manual_seed(seed)
    pace = M.PACEModel(d=64, n_layers=2, n_heads=4, window=256).to(device)
    mlp = M.AncestorMLP(d=64, hidden=128, window=256).to(device)
    M.train(pace, data, steps=steps, batch=8, lr=4e-3, ks=(1, 2, 4, 8, 256), seed=seed)
    M.train(mlp, data, steps=steps, batch=8, lr=4e-3, seed=seed)
    return {"table": M.CountTable().fit(levels), "mlp": mlp, "pace": pace}


def codecs(models: dict[str, object], depth: int) -> dict[str, tuple[Callable, Callable]]:
    """name -> (encode(points) -> bytes, decode(bytes) -> points)."""
    out = {"Draco": (lambda p: DracoPy.encode(p, quantization_bits=depth, compression_level=10),
                     lambda b: np.asarray(DracoPy.decode(b).points))}
    table = [("count table", models["table"], "fp"), ("ancestor MLP", models["mlp"], "fp")]
    table += [(f"PACE {m}", models["pace"], m) for m in ("fp", "2s", "4s", "8s", "ar")]
    for name, model, mode in table:
        out[name] = (lambda p, model=model, mode=mode: C.encode(p, model, depth, mode),
                     lambda b, model=model: C.decode_quantized(b, model)[0])
    return out


def work(models: dict[str, object], tree: O.Octree) -> dict[str, int | None]:
    """FLOPs of the matrix products of one decode per codec (None: Draco, not counted)."""
    sizes = [len(c) for c in tree.codes[1:-1]]
    out: dict[str, int | None] = {"Draco": None, "count table": 0,
                                  "ancestor MLP": M.decode_flops(models["mlp"], sizes, "fp")}
    out |= {f"PACE {m}": M.decode_flops(models["pace"], sizes, m) for m in ("fp", "2s", "4s", "8s", "ar")}
    return out


def run_depth(scan: np.ndarray, models: dict[str, object], depth: int, rounds: int) -> list[bench.Row]:
    fns = codecs(models, depth)
    blobs = {name: enc(scan) for name, (enc, _) in fns.items()}  # also the warm-up
    tree = O.build_octree(O.quantize(scan, O.Grid.centred(HALF_SIZE, depth)), depth)
    cells = O.morton_decode(tree.codes[-1])
    for name, (_, dec) in fns.items():
        if name != "Draco" and not np.array_equal(dec(blobs[name]), cells):
            raise AssertionError(f"{name} did not decode bit-exactly")
    enc_s: dict[str, list[float]] = {n: [] for n in fns}
    dec_s: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(rounds):
        for name, (enc, dec) in fns.items():
            enc_s[name].append(bench.time_call(lambda enc=enc: enc(scan), repeats=1, warmup=0))
            dec_s[name].append(bench.time_call(lambda dec=dec, b=blobs[name]: dec(b), repeats=1, warmup=0))
    n = len(scan)
    table_bpp = 8 * len(blobs["count table"]) / n
    flops = work(models, tree)
    rows = []
    for name in fns:
        e, d = statistics.median(enc_s[name]), statistics.median(dec_s[name])
        bpp = 8 * len(blobs[name]) / n
        extra = {"bpp": bpp, "bpp_vs_table": bpp / table_bpp, "encode_pts_per_s": n / e, "decode_pts_per_s": n / d,
                 "encode_s": e, "symbols": tree.n_symbols}
        if flops[name] is not None:
            extra["decode_flops"] = flops[name]
        rows.append(bench.Row(f"depth {depth}, {n} points", name, d, extra))
    return rows


def rooflines(rows: list[bench.Row], peak: bench.Peak) -> tuple[dict[str, dict[str, float]], list[str]]:
    """One roofline per codec and depth, and its printed line: the work per decode, the achieved rate, the fraction
    of the peak; points and coded symbols per second."""
    out, lines = {}, [f"roofline of the decoders against the {peak.describe()}"]
    for r in rows:
        flops = r.extra.get("decode_flops")
        line = bench.roofline(r.seconds, peak, flops=flops or None, count=r.extra["decode_pts_per_s"] * r.seconds,
                              unit="points")
        line["symbols_per_s"] = r.extra["symbols"] / r.seconds
        work = ("work not counted" if flops is None else "no matrix products" if flops == 0 else
                f"{flops / 1e9:.3f} GFLOP/decode, {flops / r.extra['symbols'] / 1e3:.0f} kFLOP/symbol")
        lines.append(f"  {r.case.split(',')[0]}: " + bench.roofline_line(f"{r.method} ({work})", line))
        out[f"{r.case} | {r.method}"] = line
    return out, lines


def breakdown(scan: np.ndarray, model: M.PACEModel, depth: int, repeats: int, peak: bench.Peak
              ) -> dict[str, float]:
    """Where the time of the fully parallel decode goes: median seconds per phase over ``repeats`` decodes, printed
    with the network's rate against the peak and the coder's symbols per second."""
    data = C.encode(scan, model, depth, "fp")
    tree = O.build_octree(O.quantize(scan, O.Grid.centred(HALF_SIZE, depth)), depth)
    runs = []
    for _ in range(repeats + 1):  # the first is a warm-up
        t: dict[str, float] = {}
        start = time.perf_counter()
        C.decode_quantized(data, model, timings=t)
        runs.append(t | {"total": time.perf_counter() - start})
    med = {k: statistics.median(r[k] for r in runs[1:]) for k in (*C.PHASES, "total")}
    flops = M.decode_flops(model, [len(c) for c in tree.codes[1:-1]], "fp")
    print(f"\nPACE fp decode at depth {depth}, {len(scan)} points, {tree.n_symbols} coded symbols: "
          f"{med['total'] * 1e3:.1f} ms = {len(scan) / med['total'] / 1e6:.3f} M points/s (median of {repeats})")
    for k in C.PHASES:
        print(f"  {k:<9} {med[k] * 1e3:8.2f} ms  {100 * med[k] / med['total']:5.1f} %")
    net = bench.roofline(med["network"], peak, flops=flops)
    at_peak = flops / peak.flops
    rest = med["total"] - med["network"]
    bound = len(scan) / (at_peak + rest)
    print(f"  network: {flops / 1e9:.3f} GFLOP at {net['gflop_per_s']:.1f} GFLOP/s = {100 * net['of_peak_flops']:.1f} "
          f"% of peak (at 100 % of peak: {at_peak * 1e3:.1f} ms); coder: {tree.n_symbols / med['coder'] / 1e6:.2f} M "
          f"symbols/s; with the network at peak and the other phases as measured ({rest * 1e3:.1f} ms) the decode "
          f"would reach {bound / 1e6:.2f} M points/s")
    ops = op_split(model, tree, peak)
    return {**{f"{k}_s": v for k, v in med.items()}, "network_gflop": flops / 1e9,
            "network_of_peak_flops": net["of_peak_flops"], "coder_symbols_per_s": tree.n_symbols / med["coder"],
            "points_per_s": len(scan) / med["total"], "points_per_s_bound_network_at_peak": bound, "ops": ops}


OPS = {"matrix products": ("aten::addmm", "aten::mm", "aten::bmm"),
       "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",),
       "FFT": ("aten::_fft_r2c", "aten::_fft_c2r"), "copies": ("aten::copy_",)}


def op_split(model: M.PACEModel, tree: O.Octree, peak: bench.Peak, repeats: int = 5) -> dict[str, float]:
    """The network phase of the fp decode on its own (every level's session and its one step, on the tree's own
    contexts): its wall time, its torch operators by kind (self CPU time under torch.profiler), the matrix products
    and attention read against the peak with their analytic FLOPs, and the rest of the wall time: Python and
    operator dispatch."""
    from torch.profiler import ProfilerActivity, profile

    levels = [(t, x, np.full(len(t), O.PAD_SYMBOL, dtype=np.int64)) for t, x, _ in O.octree_contexts(tree)]

    def network() -> None:
        for tokens, xyz, known in levels:
            model.session(tokens, xyz, "fp").scores(0, known)

    wall = bench.time_call(network, repeats=repeats)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            network()
    self_s = {e.key: e.self_cpu_time_total / 1e6 / repeats for e in prof.key_averages()}
    split = {k: sum(self_s.get(op, 0.0) for op in names) for k, names in OPS.items()}
    split["other operators (norms, activations, ...)"] = sum(self_s.values()) - sum(split.values())
    split["Python and dispatch (wall - operators)"] = wall - sum(self_s.values())
    w, d, layers = model.window, model.config["d"], model.config["layers"]
    windows = sum(M.n_windows(len(c), w) for c in tree.codes[1:-1])
    attn = 4 * windows * w * w * d * layers
    gemm = M.decode_flops(model, [len(c) for c in tree.codes[1:-1]], "fp") - attn
    gemm -= 2 * windows * w * model.conv.dw.weight.numel()  # the depthwise convolution is not a matrix product
    print(f"  the network phase alone: {wall * 1e3:.1f} ms; its torch operators (self time under the profiler):")
    for k, v in split.items():
        flops = {"matrix products": gemm, "attention": attn}.get(k)
        tail = "" if flops is None else f"  {flops / 1e9:.3f} GFLOP = {100 * flops / v / peak.flops:.0f} % of peak"
        print(f"    {k:<40} {v * 1e3:7.2f} ms{tail}")
    return {"wall_s": wall} | {f"{k}_s": v for k, v in split.items()} | {
        "matrix_products_gflop": gemm / 1e9, "attention_gflop": attn / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200, help="training steps of PACE and the MLP")
    ap.add_argument("--train-scans", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--breakdown-repeats", type=int, default=7, help="decodes timed by phase per depth")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    peak = bench.measure_peak(torch.float32, "cpu", repeats=20)  # the best of 20: a busy moment reads low
    t0 = time.perf_counter()
    models = train_models(args.train_scans, args.steps, args.seed, torch.device("cpu"))
    train_s = time.perf_counter() - t0
    scan = L.make_scans([args.seed + 50_000])[0]
    rows = [r for depth in DEPTHS for r in run_depth(scan, models, depth, args.rounds)]  # raises unless bit-exact
    parts = {depth: breakdown(scan, models["pace"], depth, args.breakdown_repeats, peak) for depth in DEPTHS}
    roof, roof_lines = rooflines(rows, peak)
    by = {(r.case.split(",")[0], r.method): r for r in rows}
    fp9, draco9 = by["depth 9", "PACE fp"], by["depth 9", "Draco"]
    goals = {"PACE fp decodes >= 2 M points/s at depth 9 (one thread)": fp9.extra["decode_pts_per_s"] >= 2e6,
             "every octree stream round-trips bit-exactly (both depths, all codecs and modes)": True}
    notes = {"threads": args.threads, "rounds": args.rounds, "train_steps": args.steps,
             "train_scans": args.train_scans, "train_seconds": round(train_s, 1),
             "seconds": "median decoding time of one scan", "scan": "64 beams x 1024 azimuths, synthetic",
             "peak": asdict(peak), "roofline": roof, "fp_breakdown": {f"depth {d}": v for d, v in parts.items()},
             "goals": goals}
    bench.publish("pace", rows, baseline="count table", notes=notes)
    print("\n" + "\n".join(roof_lines))
    print(f"\nDraco at depth 9 decodes x{fp9.seconds / draco9.seconds:.1f} faster than PACE fp at "
          f"x{draco9.extra['bpp'] / fp9.extra['bpp']:.2f} its rate; PACE fp: "
          f"{fp9.extra['decode_pts_per_s'] / 1e6:.3f} M points/s")
    print("goals:")
    for k, v in goals.items():
        print(f"  {k}: {v}")


if __name__ == "__main__":
    main()
