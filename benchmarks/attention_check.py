#!/usr/bin/env python3
"""The GPU check of band attention (nbs/01_model/00_band.ipynb), in one command.

    python3 benchmarks/attention_check.py                  # CUDA: the check, then `depthnb bench` at 134M and 374M
    python3 benchmarks/attention_check.py --device cpu --shrink --no-bench   # a rehearsal at small shapes
    python3 benchmarks/attention_check.py --pick A.json,B.json --bench-parts profile   # bench earlier checks' picks

For each attention variant at the 134M and 374M attention shapes (one layer's call, as the model makes it):
1. which kernel it runs (SDPA's backend choice, or the kernel a band variant names);
2. its values and the gradients of q, k, v and the bias table in bf16 against an fp32 dense reference on the same
   device, at each of --lengths (1,024, 1,000 and 500 tokens: whole blocks, a ragged end, lengths not a multiple of 8
   or of 128), each of the output and the q, k, v gradients compared per block of 128 tokens (relative error
   ‖a − b‖ / ‖b‖ of the block; the table's gradient whole), so that one wrong block is not averaged away; a variant
   is correct when every error is under --tolerance, and the worst block is named;
3. forward + backward time per call and its peak memory above the inputs.
And the band step alone at each shape (`band_bias_grad` eager, and on CUDA `band_bias_grad_triton`, with the launch
configuration Triton's autotuner chose, then each configuration it chooses among): how much of a band variant's time
is not its kernel. The `-triton` variants take the band step in Triton instead of PyTorch.
Then `depthnb bench` runs at 134M × 12 (16 × 1024 tokens) and 374M × 24 (the paper batch), each with a per-operator
profile of a training step, for the fastest correct band variant against the reference (`--bench-shapes`: which of the
two; `--bench-parts`: which of its parts), appending to the results file. The check's own tables are appended there
too and written as JSON to --out, after every row (with "complete": false until the check ends), so that a run cut
short leaves what it measured. `--pick` skips the check: each earlier check's JSON names its shapes and its fastest
correct variant, and `depthnb bench` runs those (the GPU plan profiles in a later stage what its first job picked).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's depthnb, also where it is not installed

from depthnb.attention.band import (BAND_COMPOSITION_ENV, BAND_STEP_CONFIGS, band_attention, band_bias_grad,  # noqa: E402
                          band_bias_grad_triton, band_step_autotuned, band_step_launch, band_variant, band_width)
from depthnb.config import ATTN_IMPLS, BAND_IMPLS  # noqa: E402
from depthnb.model import (RelativePositionBias, attend, attention_mask_bias, flex_mask, layer_mask,  # noqa: E402
                           relative_position_bucket, softmax_attention)
from depthnb.presets import SIZE_CLASSES  # noqa: E402

SHAPES = ("134M", "374M")  # Petty's classes whose bench records set the targets
BATCH, N_CTX = 16, 1024  # 134M: 16 × 1024 per step; 374M: the paper batch's micro-batch (128 = 8 × 16)
LENGTHS = (1024, 1000, 500)  # the values check: whole 128-token blocks; a ragged end; also not a multiple of 8
SHRUNK_LENGTHS = (256, 180)  # the rehearsal's: whole blocks; a ragged end, not a multiple of 8
BLOCK = 128  # the values check compares each block of this many tokens on its own
BASELINES = ("reference", "sdpa", "sdpa-nobiasgrad", "flex-nobiasgrad")  # the reference has no bias: the ceiling
VARIANTS = (*BASELINES, *BAND_IMPLS)  # the band variants of the registry (depthnb.config.ATTN_IMPLS)
BENCH = {  # `depthnb bench` flags per shape (as benchmarks/gpu.sh's stages)
    "134M": ["--size-class", "134M", "--layers", "12", "--n-ctx", "1024", "--batch", "16", "--steps", "10",
             "--rounds", "5", "--parts", "train,decode,profile"],
    "374M": ["--size-class", "374M", "--layers", "24", "--n-ctx", "1024", "--batch", "16", "--paper-batch",
             "--parts", "train,profile", "--steps", "2", "--warmup", "2", "--rounds", "3"],
}
# FlexAttention backward configurations to try, in order, where the default does not compile for a head width
# (Hopper's shared memory: 232,448 B per block). Constraints: BLOCK_N1 % BLOCK_M1 == 0, BLOCK_M2 % BLOCK_N2 == 0.
FLEX_FALLBACKS = ({"bwd_num_stages": 2},
                  {"bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 64, "bwd_num_warps": 4})
SHRUNK_BENCH = ["--size-class", "tiny", "--layers", "1", "--n-ctx", "32", "--batch", "2", "--steps", "1", "--warmup",
                "1", "--rounds", "1", "--no-compile"]
SHRUNK_PARTS = {"134M": "train,profile", "374M": "train,profile"}  # the parts of BENCH that the rehearsal runs


def model_view(size_class: str, impl: str, t: int, device) -> SimpleNamespace:
    "What the model's mask functions read of a `DecoderLM` (its bias table, band and attn_impl), at this class's heads."
    sc = SIZE_CLASSES[size_class]
    with torch.device(device):
        rel = RelativePositionBias(sc.n_heads)
    buckets = relative_position_bucket(torch.arange(t), rel.n_buckets, rel.max_distance)
    return SimpleNamespace(rel_bias=rel, band_width=band_width(buckets, rel.n_buckets) if impl in BAND_IMPLS else None,
                           cfg=SimpleNamespace(attn_impl=impl.removesuffix("-nobiasgrad")))


def registry_entry(name: str):
    "The `ATTN_IMPLS` entry of variant `name` (a \"-nobiasgrad\" one's: its name's without the suffix); None: the reference."
    return ATTN_IMPLS.get(name.removesuffix("-nobiasgrad"))


def runs_flex(name: str) -> bool:
    "Whether variant `name` runs FlexAttention on CUDA (compiled for each length; its registry entry says so)."
    impl = registry_entry(name)
    return impl is not None and (impl.mask == "flex" or impl.kernel == "flex")


def variant_call(name: str, view: SimpleNamespace, t: int, device, dtype, kernel_options: dict | None = None):
    """A function of (q, k, v) that attends as the model does under variant `name` (a name in `ATTN_IMPLS`, the
    "-nobiasgrad" ones with the bias table frozen), with the mask its entry names, and the bias table it trains (or None)."""
    pos = torch.arange(t, device=device)
    table = view.rel_bias.table.weight
    table.requires_grad_(not name.endswith("nobiasgrad") and name != "reference")
    if name == "reference":
        return (lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)), None

    kind = registry_entry(name).mask

    def call(q, k, v):  # the mask is built inside, once per call, as a forward pass builds it once for all layers
        mask = (flex_mask(view, t, device) if kind == "flex" else
                layer_mask(view, pos, pos, dtype=dtype) if kind == "band" else
                attention_mask_bias(view, pos, pos, dtype=dtype))
        if kernel_options:
            return band_attention(q, k, v, mask.band, mask.kernel, mask.block_mask, mask.step,
                                  kernel_options=kernel_options)
        return attend(q, k, v, mask)
    return call, (table if table.requires_grad else None)


def backend(name: str, q, k, v, view) -> str:
    "The kernel a variant runs: SDPA's own choice for the SDPA paths, the named kernel otherwise."
    if name in BAND_IMPLS:
        kernel, step = band_variant(name, q.device.type)
        fused = "cudnn" if q.device.type == "cuda" else "SDPA flash, CPU"
        kernel = {"split": f"split ({fused}: near with bias, far causal)", "cpu": "cpu (SDPA flash, CPU)"}.get(kernel,
                                                                                                          kernel)
        return f"{kernel} + band step ({'Triton' if step is band_bias_grad_triton else 'PyTorch'})"
    if name != "reference" and registry_entry(name).mask == "flex":
        return "flex"
    pos = torch.arange(q.shape[-2], device=q.device)
    mask = None if name == "reference" else attention_mask_bias(view, pos, pos, dtype=q.dtype)
    choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, name == "reference")
    return torch.nn.attention.SDPBackend(choice).name


def block_errors(mine: torch.Tensor, ref: torch.Tensor, block: int = BLOCK) -> list[float]:
    "Relative errors ‖a − b‖ / ‖b‖ of each block of `block` positions along dim 2 of (b, h, t, ·) tensors (the last may be short)."
    diff, ref = (x.float().split(block, dim=2) for x in (mine - ref, ref))
    return [(a.norm() / b.norm().clamp(min=1e-30)).item() for a, b in zip(diff, ref)]


def check_lengths(name: str, size_class: str, lengths, batch: int, device, dtype, kernel_options=None) -> dict:
    """`check_values` at each length: the worst error of each of out, dq, dk, dv (over lengths and blocks) and dtable
    (over lengths), the per-block errors by length (`blocks`) and where the worst one is (`worst`)."""
    errors, blocks, worst = {}, {}, (-1.0, None)
    for t in lengths:
        per = check_values(name, size_class, t, batch, device, dtype, kernel_options)
        blocks[str(t)] = {key: per[key] for key in ("out", "dq", "dk", "dv")}
        for key, value in per.items():
            errs = value if isinstance(value, list) else [value]
            if value is None:
                errors.setdefault(key, None)
                continue
            errors[key] = max(errors.get(key) or 0.0, *errs)
            for i, e in enumerate(errs):
                if e > worst[0]:
                    worst = (e, f"{key}, t {t}" + (f", block {i} (tokens {i * BLOCK}-{min((i + 1) * BLOCK, t) - 1})"
                                                     if isinstance(value, list) else ""))
    return dict(errors, blocks=blocks, worst=worst[1])


def check_values(name: str, size_class: str, t: int, batch: int, device, dtype, kernel_options=None) -> dict:
    """Relative errors of the output and of the q, k, v gradients per block of BLOCK tokens (lists) and of the table
    gradient (a number) against an fp32 dense path on `device`."""
    sc = SIZE_CLASSES[size_class]
    h, d = sc.n_heads, sc.d_attn // sc.n_heads
    torch.manual_seed(0)
    view = model_view(size_class, name, t, device)
    # q, k, v as the model lays them out: (b, t, h, d) memory seen as (b, h, t, d)
    q, k, v, d_out = (torch.randn(batch, t, h, d, device=device).transpose(1, 2) for _ in range(4))
    pos = torch.arange(t, device=device)
    results = {}
    for which in ("ref", "mine"):
        view.rel_bias.zero_grad()
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        if which == "ref":
            table = view.rel_bias.table.weight.requires_grad_(True)
            out = softmax_attention(*leaves, attention_mask_bias(view, pos, pos) if name != "reference" else
                                    torch.zeros(t, t, device=device).masked_fill(
                                        torch.ones(t, t, dtype=torch.bool, device=device).triu(1), float("-inf")))
        else:
            fn, table = variant_call(name, view, t, device, dtype, kernel_options)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                out = fn(*(x.to(dtype) for x in leaves))
        out.float().backward(d_out)
        grads = [x.grad for x in leaves] + ([view.rel_bias.table.weight.grad] if table is not None else [None])
        results[which] = [out.detach().float()] + [None if g is None else g.float() for g in grads]
    errors = {}
    for key, mine, ref in zip(("out", "dq", "dk", "dv", "dtable"), results["mine"], results["ref"]):
        errors[key] = None if mine is None or name == "reference" and key == "dtable" else \
            ((mine - ref).norm() / ref.norm().clamp(min=1e-30)).item() if key == "dtable" else block_errors(mine, ref)
    return errors


def time_call(name: str, size_class: str, t: int, batch: int, device, dtype, iters: int, kernel_options=None) -> dict:
    "Median forward + backward milliseconds per call and peak memory above the inputs (GB)."
    sc = SIZE_CLASSES[size_class]
    h, d = sc.n_heads, sc.d_attn // sc.n_heads
    view = model_view(size_class, name, t, device)
    fn, _ = variant_call(name, view, t, device, dtype, kernel_options)
    q, k, v, d_out = (torch.randn(batch, t, h, d, device=device, dtype=dtype).transpose(1, 2).requires_grad_(i < 3)
                      for i in range(4))  # the model's layout

    def step():
        out = fn(q, k, v)
        out.backward(d_out)
        q.grad = k.grad = v.grad = view.rel_bias.table.weight.grad = None

    return median_ms_and_peak(step, device, iters)


def median_ms_and_peak(step, device, iters: int, warmup: int = 3) -> dict:
    "Median milliseconds of `step()` over `iters` calls after `warmup` (which compiles flex kernels), and peak GB above what was allocated before."
    cuda = device.type == "cuda"
    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    for _ in range(iters):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    peak = (torch.cuda.max_memory_allocated() - base) / 1e9 if cuda else None
    return dict(ms=times[len(times) // 2], peak_gb=peak)


def time_band_step(size_class: str, t: int, batch: int, device, dtype, iters: int, step=band_bias_grad) -> dict:
    "Median milliseconds and peak memory (GB) of the band `step` alone (eager): what a band variant adds to its kernel."
    sc = SIZE_CLASSES[size_class]
    h, d = sc.n_heads, sc.d_attn // sc.n_heads
    view = model_view(size_class, "band-cudnn", t, device)
    w = view.band_width
    q, k, v, out, d_out = (torch.randn(batch, h, t, d, device=device, dtype=dtype) for _ in range(5))
    lse, band = torch.randn(batch, h, t, device=device).abs() + 5, torch.randn(h, w, device=device)
    return median_ms_and_peak(lambda: step(q, k, v, out, lse, d_out, w, d ** -0.5, band), device, iters, 1)


def autotuned_config() -> str:
    "The launch configuration Triton's autotuner chose for the band step's last call."
    best = band_step_autotuned().best_config
    kw = best.kwargs
    return f"{kw['BLOCK_M']}×{kw['BLOCK_N']}, {best.num_warps} warps{', unrolled' if kw['UNROLL'] else ''}"


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def cell(x):
        return "–" if x is None else f"{x:.3g}" if isinstance(x, float) else str(x)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_json(result: dict, out: Path) -> None:
    "The check's JSON in `out`, written atomically (a run cut short leaves the last whole version)."
    tmp = out / "attention_check.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out / "attention_check.json")


def run_check(args) -> dict:
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t, batch = (256, 1) if args.shrink else (N_CTX, BATCH)
    lengths = args.lengths or (SHRUNK_LENGTHS if args.shrink else LENGTHS)
    rows = []
    result = dict(device=torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
                  torch=torch.__version__, dtype=str(dtype).removeprefix("torch."), t=t, batch=batch,
                  lengths=list(lengths), block=BLOCK, rows=rows, complete=False)
    for size_class in args.shapes:
        for name in args.variants:
            row = dict(shape=size_class, variant=name)
            tries = (None, *FLEX_FALLBACKS) if name in BAND_IMPLS and runs_flex(name) and device.type == "cuda" else (None,)
            for options in tries:  # the default configuration first; a fallback only where it fails
                row = dict(shape=size_class, variant=name, kernel_options=options and json.dumps(options))
                try:
                    sc = SIZE_CLASSES[size_class]
                    view = model_view(size_class, name, t, device)
                    q = torch.randn(1, sc.n_heads, t, sc.d_attn // sc.n_heads, device=device, dtype=dtype)
                    row["backend"] = backend(name, q, q, q, view)
                    # flex compiles for each length (dynamic=False): on CUDA its check keeps to the first (the CUDA
                    # tests check it at 1,024 and 1,000)
                    these = lengths[:1] if runs_flex(name) and device.type == "cuda" else lengths
                    row.update(check_lengths(name, size_class, these, min(batch, 2), device, dtype, options))
                    errs = [row[k] for k in ("out", "dq", "dk", "dv", "dtable") if row.get(k) is not None]
                    row["correct"] = all(e < args.tolerance for e in errs)
                    row.update(time_call(name, size_class, t, batch, device, dtype, args.iters, options))
                    break
                except Exception as exc:  # a kernel that does not compile or run here is a result, not a stop
                    first = str(exc).splitlines()[0][:160] if str(exc) else ""
                    row["error"] = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
            print(json.dumps(row), flush=True)
            rows.append(row)
            write_json(result, Path(args.out))
        if any(name in BAND_IMPLS for name in args.variants):  # how much of a band variant's time is the band step
            steps = {"PyTorch (eager)": band_bias_grad, "Triton": band_bias_grad_triton,
                     **{f"Triton {c.block_m}×{c.block_n}, {c.warps} warps{', unrolled' if c.unroll else ''}":
                        functools.partial(band_step_launch, config=c) for c in BAND_STEP_CONFIGS}}
            for label, step in steps.items() if device.type == "cuda" else list(steps.items())[:1]:
                row = dict(shape=size_class, variant="band step alone", backend=label)
                try:
                    row.update(time_band_step(size_class, t, batch, device, dtype, args.iters, step))
                    if step is band_bias_grad_triton:
                        row["backend"] += f", autotuned: {autotuned_config()}"
                except Exception as exc:  # as for a variant: a result, not a stop
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                print(json.dumps(row), flush=True)
                rows.append(row)
                write_json(result, Path(args.out))
    for size_class in args.shapes:  # time ratios against the no-bias reference of the same shape, same run
        ref = next((r for r in rows if r["shape"] == size_class and r["variant"] == "reference" and "ms" in r), None)
        for r in rows:
            if r["shape"] == size_class and ref is not None and "ms" in r:
                r["speed_vs_reference"] = ref["ms"] / r["ms"]
    result["complete"] = True
    return result


def fastest_correct(result: dict) -> str | None:
    "The band variant with the lowest summed time over the shapes among those correct at every shape."
    totals = {}
    for name in BAND_IMPLS:
        rows = [r for r in result["rows"] if r["variant"] == name]
        if rows and all(r.get("correct") for r in rows):
            totals[name] = sum(r["ms"] for r in rows)
    return min(totals, key=totals.get) if totals else None


def record_check(result: dict, path: Path, best: str | None) -> None:
    columns = ["shape", "variant", "kernel_options", "backend", "out", "dq", "dk", "dv", "dtable", "worst", "correct",
               "ms", "speed_vs_reference", "peak_gb", "error"]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    text = (f"\n### {stamp} · {result['device']} · attention check (benchmarks/attention_check.py)\n\n"
            f"- one attention call as a layer makes it, forward + backward, {result['batch']} × {result['t']} tokens "
            f"timed, {result['dtype']} (errors at {', '.join(map(str, result['lengths']))} tokens: fp32 dense reference "
            f"on the same device, ‖a − b‖ / ‖b‖, the worst block of {result['block']} tokens for out, dq, dk, dv, "
            f"per-block errors in attention_check.json); torch "
            f"{result['torch']}; eager, flex kernels compiled\n- fastest correct band variant: {best or 'none'}\n\n"
            + markdown_table(result["rows"], columns) + "\n")
    path.write_text((path.read_text() if path.exists() else "") + text)


def run_bench(best: str, args, shapes=None) -> int:
    "`depthnb bench` at each shape (default --bench-shapes) for `best` against the reference, appended to the results file."
    rc = 0
    for size_class in shapes or args.bench_shapes:
        flags = [*SHRUNK_BENCH, "--parts", SHRUNK_PARTS[size_class]] if args.shrink else list(BENCH[size_class])
        if args.bench_parts:  # the parts asked for instead of the shape's own
            flags[flags.index("--parts") + 1] = args.bench_parts
        cmd = [sys.executable, "-c", "import sys; from depthnb.cli.bench import cli_bench; sys.exit(cli_bench(sys.argv[1:]))",
               "--device", args.device, *flags, "--attn-impl", best, "--record", str(args.record),
               "--json", str(Path(args.out) / f"bench_{size_class}.json"), "--note", f"attention check: {best}"]
        print("running:", " ".join(cmd[3:]), flush=True)
        rc = subprocess.run(cmd, cwd=ROOT).returncode or rc
    return rc


def bench_picks(args) -> int:
    "`--pick`: `depthnb bench` for each earlier check's fastest correct variant at its shapes; 1 where one has none."
    rc = 0
    for path in args.pick.split(","):
        try:
            result = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            print(f"attention_check.py: --pick {path}: {type(exc).__name__}: no check to bench", file=sys.stderr)
            rc = 1
            continue
        shapes = [s for s in dict.fromkeys(r["shape"] for r in result["rows"]) if s in SHAPES]
        best = result.get("fastest_correct")
        if best is None or not shapes:
            print(f"attention_check.py: --pick {path}: no correct band variant at {shapes}: nothing to bench",
                  file=sys.stderr)
            rc = 1
            continue
        print(f"{path}: fastest correct band variant at {', '.join(shapes)}: {best}", flush=True)
        rc = run_bench(best, args, shapes) or rc
    return rc


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="attention_check.py", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {list(SIZE_CLASSES)}")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {list(VARIANTS)}")
    ap.add_argument("--bench-shapes", help="comma-separated shapes to run `depthnb bench` at (default: --shapes)")
    ap.add_argument("--shrink", action="store_true", help="256 tokens, batch 1, tiny bench shapes (a CPU rehearsal)")
    ap.add_argument("--lengths", help=f"comma-separated lengths of the values check (default {LENGTHS}; "
                                      f"{SHRUNK_LENGTHS} with --shrink)")
    ap.add_argument("--tolerance", type=float, default=2e-2, help="largest relative error of a correct variant")
    ap.add_argument("--iters", type=int, default=10, help="timed calls per variant (median)")
    ap.add_argument("--record", default="benchmarks/RESULTS.md", help="results file to append to")
    ap.add_argument("--out", default="runs/bench", help="folder for attention_check.json and the bench JSON")
    ap.add_argument("--no-bench", dest="bench", action="store_false", help="skip `depthnb bench`")
    ap.add_argument("--bench-parts", help="`depthnb bench --parts` at every bench shape (default: each shape's own: "
                    + "; ".join(f"{k} {v[v.index('--parts') + 1]}" for k, v in BENCH.items()) + ")")
    ap.add_argument("--pick", help="comma-separated attention_check.json files of earlier checks: no check; "
                                   "`depthnb bench` at each one's shapes for its fastest correct variant")
    args = ap.parse_args(argv)
    args.shapes, args.variants = args.shapes.split(","), args.variants.split(",")
    args.bench_shapes = args.bench_shapes.split(",") if args.bench_shapes else args.shapes
    try:
        args.lengths = tuple(int(x) for x in args.lengths.split(",")) if args.lengths else None
    except ValueError:
        ap.error(f"--lengths: {args.lengths!r} is not a comma-separated list of integers")
    if args.lengths and min(args.lengths) < 1:
        ap.error("--lengths must be >= 1")
    for value, allowed, flag in ((args.shapes, SIZE_CLASSES, "--shapes"), (args.variants, VARIANTS, "--variants"),
                                 (args.bench_shapes, SHAPES, "--bench-shapes")):
        bad = [x for x in value if x not in allowed]
        if bad:
            ap.error(f"{flag}: {bad[0]!r} is not one of {list(allowed)}")
    if args.iters < 1 or not 0 < args.tolerance < 1:
        ap.error("--iters must be >= 1 and --tolerance in (0, 1)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: no CUDA device here (use --device cpu --shrink to rehearse)")
    return args


@contextlib.contextmanager
def compositions(device: str):
    "On the CPU, each band variant's CUDA composition with the CPU standing in (nbs/01_model/00_band.ipynb), for this check only."
    before = os.environ.get(BAND_COMPOSITION_ENV)
    if device == "cpu" and before is None:
        os.environ[BAND_COMPOSITION_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(BAND_COMPOSITION_ENV, None)


def main(argv=None) -> int:
    args = parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.pick:
        return bench_picks(args)
    with compositions(args.device):
        result = run_check(args)
    best = fastest_correct(result)
    result["fastest_correct"] = best
    write_json(result, Path(args.out))
    record_check(result, ROOT / args.record if not Path(args.record).is_absolute() else Path(args.record), best)
    print(f"fastest correct band variant: {best or 'none'}", flush=True)
    if not args.bench:
        return 0
    if best is None:
        print("attention_check.py: no band variant is correct at every shape: nothing to bench", file=sys.stderr)
        return 1
    return run_bench(best, args)


if __name__ == "__main__":
    sys.exit(main())
