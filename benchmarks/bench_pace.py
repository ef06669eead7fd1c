"""Benchmark of the PACE codec (paper 09, ``repro.papers.pace``): rate and encode/decode throughput per codec and
mode.

On the same synthetic 64-beam scans (``repro.papers.pace.lidar``) at octree depths 9 and 10: Draco (DracoPy,
``quantization_bits`` = depth, ``compression_level`` = 10), the parent-context count table, the ancestor MLP, and
one PACE checkpoint decoded fully parallel (``fp``), in 2 / 4 / 8 stages and autoregressively (``ar``). Every
stream is real (bytes out, bytes in; the octree codecs are checked bit-exact). The rows give the median decoding
time; ``extra`` holds bits per input point, encode/decode throughput (input points per second) and the rate
relative to the count table. Ratios are to the count table measured in the same run; the timings are
interleaved over rounds (all codecs once per round, median over rounds), so a load change hits all alike.

The models are trained here as in the notebook's quick mode (12 scans, 200 steps; about half a minute).
Run: ``.venv/bin/python benchmarks/pace.py`` (about two minutes on 2 CPU cores, one thread).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

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
    pace = M.PACEModel(d=64, layers=2, heads=4, window=256).to(device)
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


def run_depth(scan: np.ndarray, models: dict[str, object], depth: int, rounds: int) -> list[bench.Row]:
    fns = codecs(models, depth)
    blobs = {name: enc(scan) for name, (enc, _) in fns.items()}  # also the warm-up
    cells = O.morton_decode(O.build_octree(O.quantize(scan, O.Grid.centred(HALF_SIZE, depth)), depth).codes[-1])
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
    rows = []
    for name in fns:
        e, d = statistics.median(enc_s[name]), statistics.median(dec_s[name])
        bpp = 8 * len(blobs[name]) / n
        rows.append(bench.Row(f"depth {depth}, {n} points", name, d, {
            "bpp": bpp, "bpp_vs_table": bpp / table_bpp, "encode_pts_per_s": n / e, "decode_pts_per_s": n / d,
            "encode_s": e}))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200, help="training steps of PACE and the MLP")
    ap.add_argument("--train-scans", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    t0 = time.perf_counter()
    models = train_models(args.train_scans, args.steps, args.seed, torch.device("cpu"))
    train_s = time.perf_counter() - t0
    scan = L.make_scans([args.seed + 50_000])[0]
    rows = [r for depth in DEPTHS for r in run_depth(scan, models, depth, args.rounds)]
    notes = {"threads": args.threads, "rounds": args.rounds, "train_steps": args.steps,
             "train_scans": args.train_scans, "train_seconds": round(train_s, 1),
             "seconds": "median decoding time of one scan", "scan": "64 beams x 1024 azimuths, synthetic"}
    bench.publish("pace", rows, baseline="count table", notes=notes)


if __name__ == "__main__":
    main()
