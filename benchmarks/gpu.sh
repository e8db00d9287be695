#!/usr/bin/env bash
# The GPU measurements of benchmarks/README.md, one stage per device-tool call (each well under 10 min).
#   bash benchmarks/gpu.sh tests|134M|374M|cogs|midas [extra `depthnb bench` flags; for tests: pytest flags]
# benchmarks/gpu_plan.py chains these stages with the `gpu` preset's science in one device window.
# Needs: .whl/ (fastcore wheel; the GPU image lacks it) and, for `cogs`, $COGS_TSV (default
# data/cache/bench/gen.tsv). Writes logs and JSON to $OUT (default runs/bench) and appends each run to
# benchmarks/RESULTS.md, then copies that file to $OUT so it comes back from the device.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:?usage: gpu.sh tests|134M|374M|cogs|midas [flags]}; shift
OUT=${OUT:-runs/bench}; mkdir -p "$OUT"
COGS_TSV=${COGS_TSV:-data/cache/bench/gen.tsv}
if ! python3 -c "import fastcore" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
bench() { python3 -c 'import sys; from depthnb.bench import cli_bench; sys.exit(cli_bench(sys.argv[1:]))' "$@"; }
if command -v nvidia-smi >/dev/null; then  # absent on the CPU (gpu_plan.py's rehearsal)
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/gpu_$stage.txt"
fi
rc=0
case $stage in
  tests)  # the CUDA paths: FlexAttention vs SDPA, compiled bf16 training, the CLI, FSDP2 bf16 over nccl
    python3 -m pytest -q -rs tests/test_bench.py tests/test_model.py tests/test_parallel.py "$@" 2>&1 | tee "$OUT/tests.log" || rc=$? ;;
  134M)   # Petty's 134M class at its base depth: MFU target 45%, ratio to the reference >= 1.0
    bench --device cuda --size-class 134M --layers 12 --n-ctx 1024 --batch 16 \
      --attn-impl sdpa,flex,flex-nobiasgrad --steps 10 --rounds 5 --record --json "$OUT/134M.json" "$@" \
      2>&1 | tee "$OUT/134M.log" || rc=$? ;;
  374M)   # 374M at 24 layers at the paper's batch (128 x 1024 by accumulation): MFU target 50%, memory < 80 GB
    bench --device cuda --size-class 374M --layers 24 --n-ctx 1024 --batch 16 --paper-batch --parts train \
      --attn-impl sdpa,flex --steps 2 --warmup 2 --rounds 3 --record --json "$OUT/374M.json" "$@" \
      2>&1 | tee "$OUT/374M.log" || rc=$? ;;
  cogs)   # 41M class (deepest, 7 layers): all 21,000 COGS gen examples, greedy, batched; target <= 2 min
    bench --device cuda --size-class 41M --layers 7 --parts cogs --cogs-tsv "$COGS_TSV" --cogs-batch 512 \
      --record --json "$OUT/cogs.json" "$@" 2>&1 | tee "$OUT/cogs.log" || rc=$? ;;
  midas)  # the small preset's stacking study: 41M widths, 12 layers, b=3, Prop-1; wall vs FLOP speedup (>= 90%)
    bench --device cuda --size-class 41M --layers 12 --n-ctx 1024 --batch 16 --parts midas --attn-impl sdpa \
      --midas-block 3 --midas-steps 1500 --record --json "$OUT/midas.json" "$@" 2>&1 | tee "$OUT/midas.log" || rc=$? ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
cp benchmarks/RESULTS.md "$OUT/RESULTS.md" 2>/dev/null || true
exit $rc
