#!/usr/bin/env bash
# The GPU measurements of benchmarks/README.md, one stage per command (each well under 10 minutes on an H100/H200).
#   bash benchmarks/gpu.sh [--out DIR] attention|attention-374M|tests|attention-profile|134M|374M|cogs|midas [extra flags]
# Extra flags go to benchmarks/attention_check.py (attention*), pytest (tests) or `depthnb bench` (the others).
# benchmarks/gpu_plan.py runs these stages, then the `gpu` preset's science, under a job's deadline.
# Needs: fastcore (a wheel in .whl/ is installed into runs/bench-site where it is missing) and, for `cogs`,
# $COGS_TSV (default data/cache/bench/gen.tsv). Writes logs and JSON to the results folder DIR (default runs/bench),
# appends each run to benchmarks/RESULTS.md, then copies that file into DIR so that it travels with the results.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: gpu.sh [--out DIR] attention|attention-374M|tests|attention-profile|134M|374M|cogs|midas [flags]"
out=runs/bench
if [ "${1:-}" = --out ]; then out=${2:?$usage}; shift 2; fi
stage=${1:?$usage}; shift
mkdir -p "$out"
COGS_TSV=${COGS_TSV:-data/cache/bench/gen.tsv}
if ! python3 -c "import fastcore" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target runs/bench-site .whl/*.whl
  export PYTHONPATH=$PWD/runs/bench-site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
bench() { python3 -c 'import sys; from depthnb.cli.bench import cli_bench; sys.exit(cli_bench(sys.argv[1:]))' "$@"; }
if command -v nvidia-smi >/dev/null; then  # absent on the CPU (gpu_plan.py's rehearsal)
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$out/gpu_$stage.txt"
fi
rc=0
case $stage in
  attention)  # band attention at 134M: backends, values and gradients vs fp32, per-call time and memory,
              # then `depthnb bench` (with a profile) at 134M x 12 for the fastest correct band variant
    python3 benchmarks/attention_check.py --out "$out" --shapes 134M "$@" 2>&1 | tee "$out/attention.log" \
      || rc=$? ;;
  attention-374M)  # the check at 374M, then `depthnb bench` at 374M x 24 (paper batch) for its fastest correct variant
    python3 benchmarks/attention_check.py --out "$out" --shapes 374M "$@" 2>&1 | tee "$out/attention-374M.log" \
      || rc=$? ;;
  attention-profile)  # per-operator profiles of a training step for the variants earlier checks picked: needs
                      # --pick FILE,... (their attention_check.json)
    python3 benchmarks/attention_check.py --out "$out" --bench-parts profile "$@" 2>&1 \
      | tee "$out/attention-profile.log" || rc=$? ;;
  tests)  # the CUDA paths: band kernels, FlexAttention vs SDPA, compiled bf16 training, the CLI, FSDP2 bf16 over nccl
    python3 -m pytest -q -rs tests/test_band.py tests/test_bench.py tests/test_model.py tests/test_parallel.py "$@" \
      2>&1 | tee "$out/tests.log" || rc=$? ;;
  134M)   # Petty's 134M class at its base depth: MFU target 45%, ratio to the reference >= 1.0
    bench --device cuda --size-class 134M --layers 12 --n-ctx 1024 --batch 16 \
      --attn-impl band-cudnn-triton,sdpa --steps 10 --rounds 5 --record --json "$out/134M.json" "$@" \
      2>&1 | tee "$out/134M.log" || rc=$? ;;
  374M)   # 374M at 24 layers at the paper's batch (128 x 1024 by accumulation): MFU target 50%, memory < 80 GB
    bench --device cuda --size-class 374M --layers 24 --n-ctx 1024 --batch 16 --paper-batch --parts train \
      --attn-impl band-cudnn-triton,sdpa --steps 2 --warmup 2 --rounds 3 --record --json "$out/374M.json" "$@" \
      2>&1 | tee "$out/374M.log" || rc=$? ;;
  cogs)   # 41M class (deepest, 7 layers): all 21,000 COGS gen examples, greedy, batched; target <= 2 min
    bench --device cuda --size-class 41M --layers 7 --parts cogs --cogs-tsv "$COGS_TSV" --cogs-batch 512 \
      --record --json "$out/cogs.json" "$@" 2>&1 | tee "$out/cogs.log" || rc=$? ;;
  midas)  # the small preset's stacking study: 41M widths, 12 layers, b=3, Prop-1; wall vs FLOP speedup (>= 90%)
    bench --device cuda --size-class 41M --layers 12 --n-ctx 1024 --batch 16 --parts midas \
      --midas-block 3 --midas-steps 1500 --record --json "$out/midas.json" "$@" 2>&1 | tee "$out/midas.log" || rc=$? ;;
  *) echo "gpu.sh: unknown stage $stage; $usage" >&2; exit 2 ;;
esac
cp benchmarks/RESULTS.md "$out/RESULTS.md" 2>/dev/null || true
exit $rc
