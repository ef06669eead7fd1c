#!/usr/bin/env bash
# The prepared GPU check (issue 42): the first minutes on a machine with CUDA go to measuring, not preparing.
#
#   benchmarks/gpu_check.sh [--cap SECONDS] [--budget SECONDS] [--only 05,15] [--out DIR]
#
# In order, each step bounded by --cap seconds and the whole run by --budget seconds (steps that no longer fit
# are reported as "skipped (budget)"):
#   1. the device: what torch sees (CUDA or not, the GPU's name, torch and CUDA versions);
#   2. the device tests of the library (tests/papers, every test whose name says cuda or device): on CUDA they
#      run, without it they skip;
#   3. the benchmarks with a GPU goal: NS5 vs SVD up to 4096² in bfloat16 (bench_lmo), POGO (bench_pogo), the
#      spreading engine vs EoN (bench_spreading), the PACE codec (bench_pace, CPU only);
#   4. the full mode of the notebooks (--only, default all nineteen in book order), each killed after --cap
#      seconds; a finished one writes results/full/NN-slug.json (the committed quick results are never touched).
# Everything it prints goes to DIR (default results/gpu-check/): one log per step, summary.tsv (step, status,
# seconds) and the JSON files this run's benchmarks wrote (the committed results/bench-*.json are put back).
# Exit status: 0 when nothing failed (a timeout or a skip is not a failure), 1 otherwise. Run it with the
# project's venv (`.venv/bin/python`, or $PYTHON); on a CPU, a tiny cap (`--cap 20 --budget 240`) shows the path.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
CAP=300 BUDGET=840 ONLY="" OUT=results/gpu-check
while [ $# -gt 0 ]; do
  case "$1" in
    --cap) CAP=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n 2,18p "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$CAP" "$BUDGET"; do
  case "$v" in ''|*[!0-9]*) echo "gpu_check.sh: --cap and --budget take whole seconds, got '$v'" >&2; exit 2 ;; esac
done
[ -x "$PY" ] || { echo "gpu_check.sh: no Python at $PY (build the venv, or set PYTHON)" >&2; exit 2; }
mkdir -p "$OUT"
START=$(date +%s) FAILED=0
printf 'step\tstatus\tseconds\n' > "$OUT/summary.tsv"

# step NAME COMMAND...: run COMMAND with the per-step cap (or what is left of the budget), log it, record it
step() {
  local name=$1; shift
  local left=$(( BUDGET - ($(date +%s) - START) ))
  local cap=$(( left < CAP ? left : CAP ))
  if [ "$cap" -lt 5 ]; then
    printf '%s\tskipped (budget)\t0\n' "$name" >> "$OUT/summary.tsv"; echo "$name: skipped (budget)"; return
  fi
  local t0=$(date +%s) status rc
  timeout --kill-after=10 "$cap" "$@" > "$OUT/$name.log" 2>&1; rc=$?
  case $rc in
    0) status=ok ;;
    124|137) status="timeout (${cap} s)" ;;
    *) status="failed (exit $rc)"; FAILED=1 ;;
  esac
  printf '%s\t%s\t%s\n' "$name" "$status" $(( $(date +%s) - t0 )) >> "$OUT/summary.tsv"
  echo "$name: $status, $(( $(date +%s) - t0 )) s (log: $OUT/$name.log)"
}

step device "$PY" -c '
import torch
print("torch", torch.__version__, "cuda build", torch.version.cuda, "cuda available", torch.cuda.is_available())
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"gpu {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB, capability {p.major}.{p.minor}")'
DEV=$("$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")' 2>/dev/null || echo cpu)
echo "device: $DEV"

# the benchmarks write results/bench-*.json: this run's copies go to DIR, and the files there before are put back
KEEP=$(mktemp -d); cp results/bench-*.json "$KEEP/" 2>/dev/null; touch "$KEEP/.start"
step device-tests "$PY" -m pytest -q -rs -p no:cacheprovider tests/papers -k "cuda or device"
if [ "$DEV" = cuda ]; then
  step bench-lmo "$PY" benchmarks/bench_lmo.py --device cuda --dtype bfloat16 --big
else
  step bench-lmo "$PY" benchmarks/bench_lmo.py
fi
step bench-pogo "$PY" benchmarks/bench_pogo.py --device "$DEV"
step bench-spreading "$PY" benchmarks/bench_spreading.py --device "$DEV"
step bench-pace "$PY" benchmarks/bench_pace.py
for f in results/bench-*.json; do
  [ -e "$f" ] || continue
  [ "$f" -nt "$KEEP/.start" ] && cp "$f" "$OUT/"
  [ -e "$KEEP/${f##*/}" ] && cp "$KEEP/${f##*/}" "$f" || rm "$f"
done
rm -r "$KEEP"

if [ -z "$ONLY" ]; then
  ONLY=$(ls notebooks/[0-9][0-9]-*.ipynb | sed 's|notebooks/\(..\).*|\1|' | paste -sd, -)
fi
for nn in ${ONLY//,/ }; do
  step "full-$nn" "$PY" -m repro run --mode full --only "$nn" --no-progress
done
ls results/full/*.json > "$OUT/full-results.txt" 2>/dev/null
echo "summary: $OUT/summary.tsv; full-mode results: $(wc -l < "$OUT/full-results.txt" 2>/dev/null || echo 0) file(s)"
exit $FAILED
