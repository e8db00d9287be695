#!/usr/bin/env python3
"""The GPU plan of issue 17: benchmarks and the `gpu` preset's science in 15-minute device windows.

    python3 benchmarks/gpu_plan.py budget                 # the per-stage budget table and what each window runs
    python3 benchmarks/gpu_plan.py prepare [--stages S]   # CPU: data + wheels + plan.json into .gpu/ (carried)
    python3 benchmarks/gpu_plan.py device --budget 540    # on the device: stages back to back, results to $OUT
    python3 benchmarks/gpu_plan.py assemble DIR [DIR...]  # CPU: returned $OUT folders -> figures/<preset>/, RESULTS.md
    python3 benchmarks/gpu_plan.py rehearse               # CPU: the whole plan at shrunk shapes, two calls, a cut

Every stage runs as a subprocess under a deadline; stages are resumable (bench stages are short and start only
when they fit; science stages resume from their checkpoints), so the device command can be repeated call after
call while the machine is warm. benchmarks/README.md ("The GPU plan") explains the order and the budget.
"""
from __future__ import annotations

import configparser
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLAN_DIR = ".gpu"  # carried folder (git-ignored): plan.json, data.tar.xz, whl/
STATE_DIR = Path("runs") / "gpu-plan"  # on the device: state, logs, figures, bench outputs (ignored: kept warm)
SITE_DIR = STATE_DIR / "site"  # on the device: the carried wheels, installed once per machine


def use_carried_wheels(root: Path = ROOT) -> Path | None:
    """Install the wheels carried in .gpu/whl (what depthnb needs that the GPU image lacks: fastcore, papermill, ...)
    into runs/gpu-plan/site, once per machine, and put that folder first on sys.path and on PYTHONPATH, which every
    stage inherits. Returns the folder, or None where no wheels were carried."""
    wheels = sorted((root / PLAN_DIR / "whl").glob("*.whl"))
    if not wheels:
        return None
    site = root / SITE_DIR
    stamp, names = site / ".wheels", "\n".join(w.name for w in wheels)
    if not stamp.exists() or stamp.read_text() != names:
        shutil.rmtree(site, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--target", str(site), *map(str, wheels)], check=True)
        stamp.write_text(names)
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return site


if __name__ == "__main__" and sys.argv[1:2] == ["device"]:
    use_carried_wheels()  # before depthnb is imported below: its model module needs fastcore, which the image lacks

sys.path.insert(0, str(ROOT))  # the checkout's depthnb, also where it is not installed (the device)

from packaging.requirements import Requirement  # noqa: E402

from depthnb.commands import CommandParser, UsageError, preset_from_args  # noqa: E402
from depthnb.config import STACK_METHODS, STACK_RUNS  # noqa: E402
from depthnb.presets import load_preset, preset_depths, preset_size_class, resolve_size_class  # noqa: E402
from depthnb.data import meta_path, prepare_pretraining  # noqa: E402
from depthnb.sources import cache_dir, data_path, default_mirror, registry  # noqa: E402
from depthnb.schedules import speedup, stack_config  # noqa: E402
from depthnb.solver import flops_per_token, model_config  # noqa: E402

# --- the device tool's limits (/work/.library/device/README.md, read 2026-11-26), and what the plan leaves for itself ---
DEVICE_SECONDS = 15 * 60  # device time of one session (a window): the start, the calls and the idle time between
CALL_SECONDS = 10 * 60  # one command at most (its timeout_s)
START_SECONDS = 120  # a cold machine's start, counted against the session ("1-2 min"; 2026-11-26: about 60 s)
CALL_BUDGET = 540  # the window's first call: --budget 540 with timeout_s 600 (the rest: wheel install, transfers)
SECOND_CALL_MARGIN = 40  # the second call's --budget is budget_left_s less this: the gap, transfers, give_back
SETUP_SECONDS = 15  # of each call's budget before its first stage: leftovers, data unpack, the environment probe
RESERVE_SECONDS = 20  # kept at the end of a call to pack $OUT
CARRY_BYTES = 64 * 2**20  # the working tree plus carried paths
OUT_FILES, OUT_FILE_BYTES = 8, 16 * 2**20  # files back from $OUT, and each one's size
MIN_SCIENCE_SECONDS = 60  # a resumable stage is started only with this much time left
MAX_FAILURES = 2  # a science stage that failed this often is not started again (a benchmark: once)

PEAK_FLOPS = 989e12  # H100 SXM / H200 dense bf16 (devices.PEAK_FLOPS)
PRETRAIN_MFU = 0.20  # assumed: eager bf16 at d_model 512 (the trainer's compiled runs may do better)
FINETUNE_MFU = 0.05  # assumed: short task sequences, small batches, eager
DECODE_STEP_SECONDS = 0.004  # assumed: one greedy KV-cache step of a batch of a 41M-class model, eager
NOTEBOOK_SECONDS = 15  # papermill kernel start, imports, tables and figures of one experiment notebook
TASK_TOKENS = {"cogs": 60, "cogs_vf": 45, "geoquery": 30, "passivization": 25}  # assumed tokens per example
TASK_DATASETS = ("cogs", "cogs_vf", "geoquery", "passivization")  # registry datasets carried (tasks.TASKS)
# Saunshi's downstream sets in the local mirror (downstream_tasks), carried for the `downstream` stage.
DOWNSTREAM_DATASETS = ("gsm8k", "svamp", "asdiv", "mawps", "nq_open", "webquestions")
DOWNSTREAM_LIMIT = 100  # midas_downstream's examples per task at `gpu` (its AUTO_LIMIT)
# one scoring pass at that limit: NQ, WebQuestions; six math word problem sets and GSM8k, each without and with calculator
DOWNSTREAM_PASS_EXAMPLES = 2 * DOWNSTREAM_LIMIT + 2 * 6 * DOWNSTREAM_LIMIT + 2 * DOWNSTREAM_LIMIT
DOWNSTREAM_NEW_TOKENS = 64  # assumed mean greedy tokens per answer (stop sequences end most answers early)

MARKER = "DEPTHNB_GPU_PLAN"  # set on every stage process: leftovers of a killed call are found by it


@dataclass(frozen=True)
class Stage:
    "One step of the plan: a `gpu.sh` benchmark or some experiment notebooks run by `depthnb reproduce`."
    name: str
    kind: str  # "bench" (not resumable: starts only when its estimate fits) or "science" (resumes)
    what: str
    bench: str = ""  # gpu.sh stage
    experiments: tuple[str, ...] = ()
    after: tuple[str, ...] = ()  # stages that must be done first, on the same machine


# Most valuable first, and grouped so that what one window (a fresh machine) can finish comes together: the
# benchmarks and the CUDA tests first (the MFU targets are what only a GPU can show), then the science, the Petty
# chain (pretrain -> finetune -> controls) before the MIDAS one (stacking -> primitives, downstream).
STAGES = (
    Stage("bench-134M", "bench", "134M class at its base depth: MFU >= 45%, ratio >= 1.0", bench="134M"),
    Stage("cuda-tests", "bench", "FlexAttention vs SDPA, compiled bf16 training, CLI, FSDP2 bf16 (nccl) on CUDA",
          bench="tests"),
    Stage("bench-374M", "bench", "374M at the paper's batch: MFU >= 50%, fits 80 GB", bench="374M"),
    Stage("bench-midas", "bench", "MIDAS wall clock >= 90% of its FLOP speedup, both runs warmed up",
          bench="midas"),
    Stage("bench-cogs", "bench", "21,000 COGS gen examples decoded by a 41M model: <= 2 min", bench="cogs"),
    Stage("data", "science", "Table 1-2, Fig. 1, carried tokens and tasks checked",
          experiments=("petty_shapes", "petty_data")),
    Stage("pretrain", "science", "the 41M depth family (Figs. 2-3)", experiments=("petty_pretrain",), after=("data",)),
    Stage("finetune", "science", "four tasks x seven depths (Figs. 4-5, Table 3)", experiments=("petty_finetune",),
          after=("pretrain",)),
    Stage("controls", "science", "equal perplexity, equal loss, rank, latency (Figs. 6-9)",
          experiments=("petty_equal_ppl", "petty_equal_loss", "petty_rank", "petty_latency"),
          after=("finetune",)),
    Stage("stacking", "science", "MIDAS, GradStack, baseline, looped (Saunshi Table 1, Figs. 2, 4)",
          experiments=("midas_stacking",), after=("data",)),
    Stage("primitives", "science", "reasoning primitives, MIDAS on COGS (Saunshi Tables 6-7)",
          experiments=("midas_primitives", "midas_cogs"), after=("stacking",)),
    Stage("downstream", "science", "Saunshi Tables 1-5, Figs. 3-4: the stacking runs on the mirrored downstream tasks",
          experiments=("midas_downstream",), after=("stacking",)),
)
# REPORT.md and the fidelity summary need no GPU: `assemble` runs the report notebook here on the returned tables.
STAGE_NAMES = tuple(s.name for s in STAGES)
STAGE_BY_NAME = {s.name: s for s in STAGES}

# gpu.sh stages as measured on an H200 on 2026-11-26 (figures/gpu/gpu_plan/PLAN_STATUS.md), on a cold machine: 134M
# 87 s with its flex variant failing to compile (a flex that compiles adds its timed rounds), the CUDA tests 92 s
# (the FSDP test failed early then), 374M 274 s. COGS was cut after 221 s with nothing printed: it decodes with
# both depthnb and the reference, so 300 s is a lower bound. MIDAS is not measured yet (two compiled stacking runs).
# The 134M stage now also times the two frozen-bias diagnostics (about 20 s of compilation each, warm).
BENCH_SECONDS = {"134M": 115, "tests": 100, "374M": 275, "cogs": 300, "midas": 180}
# What the plan adds to gpu.sh's stages on the device: the 134M run with both frozen-bias diagnostics in place of
# flex (whose backward found no kernel configuration that fits an H200's shared memory: it would fail again), to
# tell how much of the gap to the reference is the bias gradient; and only the CUDA tests (the CPU ones ran in CI).
DEVICE_BENCH_FLAGS = {"134M": ["--attn-impl", "sdpa,sdpa-nobiasgrad,flex-nobiasgrad"], "tests": ["-m", "gpu"]}


# ------------------------------------------------------------------------------------------- the budget
def science_seconds(preset) -> dict[str, float]:
    "Estimated GPU seconds of each science stage of `preset`, from FLOPs at the assumed MFUs."
    sc = preset_size_class(preset)
    pc, fc = preset.pretrain, preset.finetune
    flops = {n: flops_per_token(replace(model_config(sc, n, base=pc.model), n_vocab=pc.data.vocab_size)).train
             for n in preset_depths(preset, sc)}
    seeds = len(preset.seeds)
    pre_tokens = pc.steps * pc.batch_size * pc.model.n_ctx
    pretrain = seeds * sum(pre_tokens * f for f in flops.values()) / (PEAK_FLOPS * PRETRAIN_MFU)
    ft_seeds = min(seeds, preset.finetune_seeds or seeds)
    ft_train = gen = 0.0
    for task in preset.tasks:
        steps = preset.task_steps.get(task, fc.steps)
        ft_train += ft_seeds * sum(steps * fc.batch_size * TASK_TOKENS.get(task, 60) * f for f in flops.values())
        gen += ft_seeds * len(flops) * math.ceil((fc.gen_limit or 21_000) / fc.eval_batch_size) \
            * 2 * TASK_TOKENS.get(task, 60) * DECODE_STEP_SECONDS
    finetune = ft_train / (PEAK_FLOPS * FINETUNE_MFU) + gen
    st = preset.stack
    stack_cfg = replace(stack_config(resolve_size_class(preset.stack_size_class), preset.stack_layers, base=pc.model),
                        n_vocab=pc.data.vocab_size)
    runs = 2.0  # baseline and looped, then each growth method at its full-FLOP cost relative to the baseline
    for op in STACK_METHODS[1:]:
        try:
            runs += 1 / speedup(preset.stack_layers, st.block_size, st.alpha, st.schedule, op=op, flops="full",
                                cfg=stack_cfg, n_ctx=pc.model.n_ctx)
        except ValueError:  # a method this depth and block size cannot grow (the study leaves it out too)
            pass
    stacking = runs * pre_tokens * flops_per_token(stack_cfg).train / (PEAK_FLOPS * PRETRAIN_MFU)
    one_ft = finetune / max(1, len(preset.tasks) * len(flops))
    return {"data": 2 * NOTEBOOK_SECONDS + 15,
            "pretrain": NOTEBOOK_SECONDS + pretrain * 1.15,  # + evaluations, snapshots and checkpoints
            "finetune": NOTEBOOK_SECONDS + finetune,
            "stacking": NOTEBOOK_SECONDS + stacking * 1.15,
            "primitives": 2 * NOTEBOOK_SECONDS + 0.25 * stacking + 4 * one_ft,
            "controls": 4 * NOTEBOOK_SECONDS + 2 * len(flops) * one_ft + 20,
            # a scoring pass per stacking run and per isoplot snapshot (baseline, MIDAS), batched greedy decoding,
            # and GSM8k fine-tuning of two runs
            "downstream": NOTEBOOK_SECONDS + 2 * one_ft + (len(STACK_RUNS) + 2 * pc.n_snapshots)
            * math.ceil(DOWNSTREAM_PASS_EXAMPLES / fc.eval_batch_size) * DOWNSTREAM_NEW_TOKENS * DECODE_STEP_SECONDS}


def stage_seconds(preset) -> dict[str, float]:
    "Estimated GPU seconds of every stage: the benchmarks as measured, the science from FLOPs."
    science = science_seconds(preset)
    return {s.name: BENCH_SECONDS[s.bench] if s.kind == "bench" else science[s.name] for s in STAGES}


def call_budgets(start: float = START_SECONDS) -> tuple[float, float]:
    """--budget of a window's two calls: the first right after the machine's start; the second at once on the warm
    machine (it is given back 30 s after a call) with what is left: budget_left_s less SECOND_CALL_MARGIN."""
    left_after_first = DEVICE_SECONDS - start - CALL_SECONDS
    return CALL_BUDGET, left_after_first - SECOND_CALL_MARGIN


def window_calls(start: float = START_SECONDS) -> list[float]:
    "Stage seconds of a window's calls: each budget less the call's setup and the reserve kept to pack $OUT."
    return [b - SETUP_SECONDS - RESERVE_SECONDS for b in call_budgets(start)]


def window_seconds() -> int:
    "Stage time one window gives, with a slow start."
    return round(sum(window_calls()))


def with_prerequisites(names) -> tuple[str, ...]:
    "`names` and every stage they need, in plan order: a window is a fresh machine, so what a stage needs runs again."
    need = set(names)
    for s in reversed(STAGES):  # a stage's prerequisites come before it
        if s.name in need:
            need.update(s.after)
    return tuple(n for n in STAGE_NAMES if n in need)


def schedule_windows(seconds: dict[str, float], calls: list[float] | None = None) -> list[list[list[tuple[str, bool]]]]:
    """What each window runs, call by call, as (stage, finished) pairs, by the rules of `Call.run`: stages in plan
    order; a benchmark starts only when its estimate fits the time left, a science stage with MIN_SCIENCE_SECONDS left
    and, cut at the call's end, resumes in the window's next call. Each window is prepared with the stages the earlier
    ones did not finish; being a fresh machine, it runs their prerequisites again."""
    calls = window_calls() if calls is None else calls
    todo, windows = list(STAGE_NAMES), []
    while todo:
        need, done, spent, window = with_prerequisites(todo), set(), {}, []
        for capacity in calls:
            left, ran = capacity, []
            for s in (STAGE_BY_NAME[n] for n in need):
                if s.name in done or any(a not in done for a in s.after):
                    continue
                rest = seconds[s.name] - spent.get(s.name, 0.0)
                if left < (rest if s.kind == "bench" else MIN_SCIENCE_SECONDS):
                    continue
                used = min(rest, left)
                spent[s.name], left = spent.get(s.name, 0.0) + used, left - used
                ran.append((s.name, used == rest))
                if used < rest:
                    break  # cut: this call's time is spent
                done.add(s.name)
            window.append(ran)
        if not done.intersection(todo):
            raise ValueError(f"{todo[0]}: does not fit one window ({seconds[todo[0]]:.0f} s; calls {calls})")
        windows.append(window)
        todo = [n for n in todo if n not in done]
    return windows


def budget_table(preset) -> list[dict]:
    "One row per stage in plan order: estimated seconds and the window (1, 2, ...) that first finishes it."
    seconds = stage_seconds(preset)
    finished = {}
    for w, window in enumerate(schedule_windows(seconds), 1):
        for name, _ in (x for ran in window for x in ran if x[1]):
            finished.setdefault(name, w)
    return [dict(stage=s.name, kind=s.kind, seconds=round(seconds[s.name]), window=finished[s.name], what=s.what)
            for s in STAGES]


def format_budget(preset) -> str:
    rows, seconds = budget_table(preset), stage_seconds(preset)
    (first, second), calls = call_budgets(), window_calls()
    lines = [f"GPU plan for preset {preset.name!r}: estimated stage seconds (benchmarks as measured on an H200; "
             f"science at an assumed {PRETRAIN_MFU:.0%} MFU pretraining, {FINETUNE_MFU:.0%} fine-tuning, "
             f"{PEAK_FLOPS / 1e12:.0f} TFLOP/s peak)",
             "| stage | kind | est. s | window | what |", "|---|---|---:|---:|---|"]
    lines += [f"| {r['stage']} | {r['kind']} | {r['seconds']} | {r['window']} | {r['what']} |" for r in rows]
    lines.append(f"total {sum(r['seconds'] for r in rows)} s of stage time. One window ({DEVICE_SECONDS} s of device "
                 f"time) gives {window_seconds()} s: a {START_SECONDS} s start, a first call of --budget {first} "
                 f"({calls[0]:.0f} s of stages; up to {CALL_SECONDS} s with its wheel install and transfers), then "
                 f"at once a second of --budget budget_left_s - {SECOND_CALL_MARGIN} (about {second:.0f}: "
                 f"{calls[1]:.0f} s of stages); each call keeps {SETUP_SECONDS} s for its setup and "
                 f"{RESERVE_SECONDS} s to pack $OUT.")
    for w, window in enumerate(schedule_windows(seconds), 1):
        runs = "; ".join(f"call {c}: " + (", ".join(n + ("" if fin else " (cut)") for n, fin in ran) or "-")
                         for c, ran in enumerate(window, 1))
        lines.append(f"window {w}: {runs}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- prepare (CPU)
def plan_preset(plan: dict):
    "The preset a plan runs: its name with its `--set` overrides."
    return load_preset(plan["preset"], **plan["overrides"])


# What the benchmarks and the CUDA tests import that the GPU image lacks (test_gpu_plan checks it with the rest hidden);
# the science stages need every requirement of settings.ini (papermill and ipykernel for the notebooks, lm_eval...).
BENCH_REQUIREMENTS = ("fastcore",)


def wheel_names(stages=STAGE_NAMES) -> list[str]:
    """Distributions the planned stages need on the device that its image lacks (KINDS.md's package list), with
    their requirements, as installed in this environment."""
    image = set(_norm(n) for n in DEVICE_IMAGE.split())
    if all(STAGE_BY_NAME[n].kind == "bench" for n in stages):
        todo = list(BENCH_REQUIREMENTS)
    else:
        cfg = configparser.ConfigParser(delimiters=["="])
        cfg.read(ROOT / "settings.ini")
        todo = [Requirement(r).name for r in cfg["DEFAULT"]["requirements"].split()]
    seen, out = set(), []
    while todo:
        name = _norm(todo.pop())
        if name in seen or name in image or name in NOT_NEEDED:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise UsageError(f"{name} (needed on the device) is not installed here; run `make install` first") from None
        out.append(f"{dist.metadata['Name']}=={dist.version}")
        for req in map(Requirement, dist.requires or []):
            if req.marker is None or req.marker.evaluate(DEVICE_MARKERS):
                todo.append(req.name)
    return sorted(out, key=str.lower)


DEVICE_MARKERS = dict(python_version="3.12", python_full_version="3.12.3", sys_platform="linux", os_name="posix",
                      platform_system="Linux", platform_machine="x86_64", implementation_name="cpython",
                      platform_python_implementation="CPython", extra="")


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


# The 'cuda' image's Python packages as KINDS.md lists them (read 2026-11-17).
DEVICE_IMAGE = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson
ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
numba-cuda numpy numpyro nvidia-ml-py onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy
seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"""
NOT_NEEDED = {"ipywidgets", "widgetsnbextension", "jupyterlab-widgets"}  # notebooks' progress bars fall back to text


def download_wheels(names: list[str], dest: Path) -> None:
    """cp312 manylinux wheels (or pure-Python ones) of `names` into `dest`, as the device README says; a name with no
    wheel on the index (an sdist only) is built into one here."""
    dest.mkdir(parents=True, exist_ok=True)
    plats = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                                         "manylinux2014_x86_64", "manylinux1_x86_64")]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version=3.12",
           "--implementation=cp", *plats, "-d", str(dest)]
    if subprocess.run([*cmd, *names]).returncode == 0:
        return
    for name in names:  # one has no wheel on the index (rouge_score is an sdist): build that one here
        if subprocess.run([*cmd, name], capture_output=True).returncode != 0:
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), name], check=True)


def cache_files(preset, stages=STAGE_NAMES) -> list[Path]:
    """The data-cache files the planned stages read: the preset's tokenizer, packed tokens and task files (science),
    COGS gen (bench-cogs), the CUDA tests' tokenizer and training tokens (cuda-tests)."""
    files = []
    if any(STAGE_BY_NAME[n].kind == "science" for n in stages):
        data = prepare_pretraining(preset.pretrain.data, preset.pretrain.model.n_ctx, progress=False, log=print)
        files += [data.tokenizer.path, data.tokenizer.path.parent / "meta.json"]
        for blocks in (data.train, *data.eval.values()):
            files += [blocks.path, meta_path(blocks.path)]
        files += [data_path(f.file) for name in (*TASK_DATASETS, *DOWNSTREAM_DATASETS) for f in registry()[name].files]
    if "bench-cogs" in stages:
        files += [data_path(f.file) for f in registry()["cogs"].files if Path(f.file).name == "gen.tsv"]
    if "cuda-tests" in stages:
        files += cuda_test_files()
    root = cache_dir().resolve()
    for f in files:
        f.resolve().relative_to(root)  # everything carried lives in the cache (ValueError otherwise)
    return list(dict.fromkeys(files))


def cuda_test_files() -> list[Path]:
    """What the CUDA tests read from the cache (tests/_train_common.CUDA_TEST_DATA: a tokenizer and 400 packed
    documents, 0.2 MB compressed); the device cannot fetch the raw corpus they are made from."""
    sys.path.insert(0, str(ROOT / "tests"))
    from _train_common import CUDA_TEST_DATA, N_CTX

    data = prepare_pretraining(CUDA_TEST_DATA, N_CTX, progress=False, log=print)
    return [data.tokenizer.path, data.tokenizer.path.parent / "meta.json", data.train.path, meta_path(data.train.path)]


def write_data_archive(files: list[Path], dest: Path, preset: int = 6) -> None:
    "The cache files, relative to the cache folder, in one xz-compressed tar (`preset`: xz's level)."
    root = cache_dir().resolve()
    with tarfile.open(dest, "w:xz", preset=preset) as tar:
        for f in files:
            tar.add(f.resolve(), arcname=str(f.resolve().relative_to(root)))


def tree_bytes(root: Path) -> int:
    "Bytes of the working tree that travels: tracked and untracked-not-ignored files (a copy: all but the ignored)."
    return sum((root / p).stat().st_size for p in travelling_files(root))


def travelling_files(root: Path) -> list[str]:
    "The files the device tool sends: git's tracked and untracked-not-ignored ones, or, in a copy without git, all "
    "but the ignored folders this plan and the runs use."
    git = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, capture_output=True)
    if git.returncode == 0:
        files = git.stdout.decode().split("\0")
    else:
        skip = (PLAN_DIR, "runs", ".venv", str(Path("data") / "cache"))
        files = [str(f.relative_to(root)) for f in root.rglob("*")
                 if f.is_file() and not str(f.relative_to(root)).startswith(skip)]
    return [f for f in files if f and (root / f).is_file()]


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def cmd_prepare(args) -> int:
    overrides = dict(kv.split("=", 1) for kv in args.overrides)
    plan = dict(preset=args.preset, overrides=overrides,
                bench_flags=json.loads(args.bench_flags) if args.bench_flags else DEVICE_BENCH_FLAGS,
                stages=list(_stage_list(args.stages)), created=time.strftime("%Y-%m-%dT%H:%M:%S"))
    preset = plan_preset(plan)
    dest = Path(args.dest) if args.dest else ROOT / PLAN_DIR
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    t0 = time.time()
    files = cache_files(preset, plan["stages"])
    write_data_archive(files, dest / "data.tar.xz", args.xz)
    print(f"data: {len(files)} cache files -> {dest / 'data.tar.xz'} "
          f"({(dest / 'data.tar.xz').stat().st_size / 2**20:.1f} MiB, {time.time() - t0:.0f} s)")
    if args.wheels:
        names = wheel_names(plan["stages"])
        download_wheels(names, dest / "whl")
        print(f"wheels: {len(names)} -> {dest / 'whl'} ({folder_bytes(dest / 'whl') / 2**20:.1f} MiB): {' '.join(names)}")
    (dest / "plan.json").write_text(json.dumps(plan, indent=1))
    tree, carried = tree_bytes(ROOT), folder_bytes(dest)
    print(f"carry: working tree {tree / 2**20:.1f} MiB + {dest.name}/ {carried / 2**20:.1f} MiB = "
          f"{(tree + carried) / 2**20:.1f} MiB of {CARRY_BYTES / 2**20:.0f} MiB")
    if tree + carried > CARRY_BYTES:
        print(f"gpu_plan prepare: error: {tree + carried:,} bytes exceed the carry limit {CARRY_BYTES:,}; lower "
              "pretrain.data.max_train_docs", file=sys.stderr)
        return 1
    print(format_budget(preset))
    print(f"\nplanned stages: {', '.join(plan['stages'])}")
    print(run_calls())
    return 0


def run_calls() -> str:
    "The device tool calls of one window (benchmarks/README.md, 'In the window')."
    least = SECOND_CALL_MARGIN + SETUP_SECONDS + RESERVE_SECONDS + MIN_SCIENCE_SECONDS
    command = "python3 benchmarks/gpu_plan.py device --budget"
    return "\n".join([
        "run tool calls: the first; then, at once when it returns (the machine is given back 30 s after a call), the "
        f"second if the first reply's lease.budget_left_s is at least {least}; then give_back:",
        f'  run(command="{command} {CALL_BUDGET}", carry=["{PLAN_DIR}"], timeout_s={CALL_SECONDS})',
        f'  run(command="{command} <budget_left_s - {SECOND_CALL_MARGIN}>", carry=["{PLAN_DIR}"], '
        f'timeout_s={CALL_SECONDS})',
        "  give_back()"])


def _stage_list(text: str | None) -> tuple[str, ...]:
    "The stages of `--stages` (default all) and their prerequisites, in plan order."
    names = tuple(s for s in (text or "").split(",") if s) or STAGE_NAMES
    unknown = [n for n in names if n not in STAGE_NAMES]
    if unknown:
        raise UsageError(f"--stages: unknown stage {unknown[0]!r}; stages: {', '.join(STAGE_NAMES)}")
    return with_prerequisites(names)


# ------------------------------------------------------------------------------------------- the device
class Call:
    "One device command: setup, the stages under a deadline, and $OUT kept current after every stage."

    def __init__(self, root: Path, out: Path, budget: float, plan: dict, cut: set[str], log=print):
        self.root, self.out, self.plan, self.cut, self.log = root, out, plan, cut, log
        self.t0, self.deadline = time.time(), time.time() + budget
        self.state_dir = root / STATE_DIR
        self.state_file = self.state_dir / "state.json"
        self.state = json.loads(self.state_file.read_text()) if self.state_file.exists() else {
            "calls": 0, "stages": {}}
        self.state["calls"] += 1
        self.call = self.state["calls"]
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", DEPTHNB_DATA_MIRROR="none", MPLBACKEND="Agg",
                        COGS_TSV=str(root / "data" / "cache" / "raw" / "cogs" / "gen.tsv"))
        self.env[MARKER] = str(root)
        self.ran: list[str] = []

    def left(self) -> float:
        return self.deadline - time.time() - RESERVE_SECONDS

    def setup(self) -> None:
        """Kill a killed call's leftovers, unpack the carried data (once per machine), probe the environment. (The
        carried wheels were installed before this module imported depthnb: `use_carried_wheels`.)"""
        kill_marked(str(self.root), self.log)
        self.env["PYTHONPATH"] = os.pathsep.join([str(self.root), self.env.get("PYTHONPATH", "")]).strip(os.pathsep)
        archive = self.root / PLAN_DIR / "data.tar.xz"
        stamp = self.state_dir / "data.sha256"
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if not stamp.exists() or stamp.read_text() != digest:
            with tarfile.open(archive) as tar:
                tar.extractall(self.root / "data" / "cache", filter="data")
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.write_text(digest)
        info = self.state_dir / "logs" / f"call{self.call}_env.txt"
        info.parent.mkdir(parents=True, exist_ok=True)
        probe = ("import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', "
                 "torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0)); "
                 f"import {', '.join(self.imports())}; print('imports ok')")
        smi = shutil.which("nvidia-smi")
        with open(info, "w") as f:
            if smi:
                subprocess.run([smi], stdout=f, stderr=subprocess.STDOUT)
            subprocess.run([sys.executable, "-c", probe], stdout=f, stderr=subprocess.STDOUT, env=self.env,
                           cwd=self.root)
        self.log(info.read_text().strip().splitlines()[-1])

    def imports(self) -> list[str]:
        "What the planned stages import: the benchmarks depthnb.bench, the science the CLI and papermill too."
        science = any(STAGE_BY_NAME[n].kind == "science" for n in self.plan["stages"])
        return ["fastcore", "depthnb.bench", *(["depthnb.cli", "papermill"] if science else [])]

    def status(self, name: str) -> str:
        return self.state["stages"].get(name, {}).get("status", "todo")

    def command(self, stage: Stage) -> list[str]:
        flags = self.plan.get("bench_flags", {})
        if stage.kind == "bench":
            return ["bash", "benchmarks/gpu.sh", stage.bench, *flags.get(stage.bench, [])]
        sets = [x for k, v in self.plan["overrides"].items() for x in ("--set", f"{k}={v}")]
        return [sys.executable, "-c", "import sys; from depthnb.cli import main; sys.exit(main(sys.argv[1:]))",
                "reproduce", "--preset", self.plan["preset"], *sets, "--only", ",".join(stage.experiments),
                "--runs-dir", str(self.state_dir / "runs"), "--figures-dir", str(self.state_dir / "figures")]

    def run(self, stages: tuple[str, ...]) -> None:
        for stage in (s for s in STAGES if s.name in stages):
            st = self.status(stage.name)
            if st == "done":
                continue
            if st == "failed" and (stage.kind == "bench" or self.failures(stage.name) >= MAX_FAILURES):
                continue  # a benchmark that ran to its end failed for good (a variant that does not compile, a
                # failing test: its records and log came back); a science stage gets one more try
            missing = [a for a in stage.after if self.status(a) != "done"]
            if missing:
                self.note(stage, "waiting", f"needs {', '.join(missing)}")
                continue
            need = BENCH_SECONDS.get(stage.bench, 0) if stage.kind == "bench" else MIN_SCIENCE_SECONDS
            if self.left() < need:
                self.note(stage, st if st in ("cut", "failed") else "deferred",
                          f"{self.left():.0f} s left, needs {need} s")
                continue
            if self.run_stage(stage) == "cut":
                break  # the call's time is spent (or, in a rehearsal, is made to look spent)
        self.pack()

    def failures(self, name: str) -> int:
        return sum(c["status"] == "failed" for c in self.state["stages"].get(name, {}).get("calls", []))

    def note(self, stage: Stage, status: str, why: str) -> None:
        rec = self.state["stages"].setdefault(stage.name, {"seconds": 0.0, "calls": []})
        rec["status"] = status
        rec["why"] = why
        self.log(f"[call {self.call}] {stage.name}: {status} ({why})")
        self.save_state()

    def run_stage(self, stage: Stage) -> str:
        rec = self.state["stages"].setdefault(stage.name, {"seconds": 0.0, "calls": []})
        log_path = self.state_dir / "logs" / f"{stage.name}.log"
        env = dict(self.env, OUT=str(self.state_dir / "bench" / stage.name))
        timeout, cut_when = self.left(), None
        if stage.name in self.cut:  # the rehearsal's stand-in for a call whose time runs out mid-stage
            runs = self.state_dir / "runs"
            cut_when = lambda: any(runs.rglob("checkpoints/step_*.pt"))  # noqa: E731
        self.log(f"[call {self.call}] {stage.name}: start ({timeout:.0f} s left) {stage.what}")
        t0 = time.time()
        with open(log_path, "a") as f:
            f.write(f"\n===== call {self.call}, {time.strftime('%H:%M:%S')}: {' '.join(self.command(stage))}\n")
            f.flush()
            proc = subprocess.Popen(self.command(stage), cwd=self.root, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    process_group=0)
            rc = wait_pruning(proc, timeout, self.state_dir / "runs", cut_when)
        if rc is None:
            kill_marked(str(self.root), self.log)
            status = "cut"
        else:
            status = "done" if rc == 0 else "failed"
        seconds = time.time() - t0
        rec["seconds"] = round(rec["seconds"] + seconds, 1)
        rec["calls"].append(dict(call=self.call, seconds=round(seconds, 1), status=status))
        rec["status"], rec["why"] = status, "" if rc in (0, None) else f"exit {rc}, see logs/{log_path.name}"
        self.ran.append(stage.name)
        self.log(f"[call {self.call}] {stage.name}: {status} after {seconds:.0f} s")
        self.save_state()
        self.pack()
        return status

    def save_state(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        os.replace(tmp, self.state_file)

    def pack(self) -> None:
        "$OUT: state.json, summary.md, RESULTS.md and three tarballs (figures, bench outputs, logs); no checkpoints."
        self.out.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.state_file, self.out / "state.json")
        (self.out / "summary.md").write_text(summary(self.state, self.plan))
        results = self.root / "benchmarks" / "RESULTS.md"
        if results.exists():
            shutil.copy(results, self.out / "RESULTS.md")
        figures = self.state_dir / "figures" / plan_preset(self.plan).name
        tar_folder(figures, self.out / "figures.tar.gz")
        tar_folder(self.state_dir / "bench", self.out / "bench.tar.gz")
        tar_folder(self.state_dir / "logs", self.out / "logs.tar.gz")
        for f in self.out.iterdir():
            if f.stat().st_size > OUT_FILE_BYTES:
                self.log(f"warning: {f.name} is {f.stat().st_size / 2**20:.1f} MiB, over the {OUT_FILE_BYTES >> 20} MiB "
                         "a returned file may have: it will not come back")


def tar_folder(folder: Path, dest: Path) -> None:
    "Everything in `folder` but weights and checkpoints, gzipped, written atomically."
    tmp = dest.with_name(dest.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        if folder.exists():
            for f in sorted(folder.rglob("*")):
                if f.is_file() and f.suffix not in (".pt", ".sha256", ".lock") and "checkpoints" not in f.parts:
                    tar.add(f, arcname=str(f.relative_to(folder)))
    os.replace(tmp, dest)


def wait_pruning(proc: subprocess.Popen, timeout: float, runs: Path, cut_when=None) -> int | None:
    """Wait for `proc` at most `timeout` s, or until `cut_when()` (None: it was still running); meanwhile free
    finished runs' checkpoints every 20 s."""
    end, pruned = time.time() + timeout, time.time()
    while True:
        try:
            return proc.wait(timeout=max(0.1, min(1.0, end - time.time())))
        except subprocess.TimeoutExpired:
            if time.time() - pruned > 20:
                prune_checkpoints(runs)
                pruned = time.time()
            if time.time() >= end or (cut_when is not None and cut_when()):
                return None


def prune_checkpoints(runs: Path) -> None:
    "Delete the checkpoints of finished runs (they resume nothing; final.pt and snapshots stay): disk is 64 GiB."
    if runs.exists():
        for done in runs.rglob("DONE"):
            shutil.rmtree(done.parent / "checkpoints", ignore_errors=True)


def marked_pids(value: str) -> list[int]:
    "Processes (not this one) whose environment has MARKER=value: a stage's processes, kernels and workers."
    key = f"{MARKER}={value}".encode()
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                if key in (p / "environ").read_bytes().split(b"\0"):
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def kill_marked(value: str, log=print) -> None:
    "End every process of this plan's stages (papermill kernels start their own sessions, so no group kill)."
    found = marked_pids(value)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in marked_pids(value):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        time.sleep(3 if found else 0)
    if found:
        log(f"ended {len(found)} stage process(es) ({len(marked_pids(value))} still there)")


def summary(state: dict, plan: dict) -> str:
    rows = ["| stage | status | seconds | calls | note |", "|---|---|---:|---|---|"]
    for s in STAGES:
        rec = state["stages"].get(s.name)
        if rec:
            calls = ", ".join(f"{c['call']}:{c['status']} {c['seconds']:.0f}s" for c in rec.get("calls", []))
            rows.append(f"| {s.name} | {rec['status']} | {rec['seconds']:.0f} | {calls} | {rec.get('why', '')} |")
        else:
            rows.append(f"| {s.name} | todo | 0 | | |")
    return f"GPU plan, preset {plan['preset']}, after call {state['calls']}\n\n" + "\n".join(rows) + "\n"


def cmd_device(args) -> int:
    out = os.environ.get("OUT")
    if not out:
        raise UsageError("$OUT is not set: the device tool sets it (a rehearsal sets its own)")
    plan_file = ROOT / PLAN_DIR / "plan.json"
    if not plan_file.exists():
        raise UsageError(f"no {plan_file}: run `python3 benchmarks/gpu_plan.py prepare` here and carry {PLAN_DIR}")
    plan = json.loads(plan_file.read_text())
    cut = set(args.cut)
    unknown = cut - set(STAGE_NAMES)
    if unknown:
        raise UsageError(f"--cut {sorted(unknown)[0]}: not a stage; stages: {', '.join(STAGE_NAMES)}")
    call = Call(ROOT, Path(out), min(args.budget, CALL_SECONDS), plan, cut)
    call.setup()
    call.run(tuple(plan["stages"]))
    print(summary(call.state, plan))
    return 0


# ------------------------------------------------------------------------------------------- assemble (CPU)
def merge_results(local: Path, returned: Path) -> int:
    "Append the sections (`### ` headers) of a returned RESULTS.md that `local` lacks; returns how many."
    have = local.read_text() if local.exists() else ""
    sections = returned.read_text().split("\n### ")[1:]
    new = [s for s in sections if f"\n### {s.rstrip()}" not in have]
    if new:
        local.write_text(have.rstrip("\n") + "\n" + "".join(f"\n### {s.rstrip()}\n" for s in new))
    return len(new)


def cmd_assemble(args) -> int:
    states, plan = [], None
    figures_root = Path(args.figures_dir)
    for folder in map(Path, args.folders):
        if not (folder / "state.json").exists():
            raise UsageError(f"{folder}: no state.json (not a returned $OUT folder of gpu_plan.py device)")
        plan = json.loads((ROOT / PLAN_DIR / "plan.json").read_text()) if args.plan is None else json.loads(
            Path(args.plan).read_text())
        preset = plan_preset(plan)
        dest = figures_root / preset.name
        for tar_name, sub in (("figures.tar.gz", ""), ("bench.tar.gz", "gpu_plan/bench"), ("logs.tar.gz", "gpu_plan/logs")):
            if (folder / tar_name).exists():
                with tarfile.open(folder / tar_name) as tar:
                    tar.extractall(dest / sub, filter="data")
        if (folder / "RESULTS.md").exists():
            n = merge_results(Path(args.results), folder / "RESULTS.md")
            print(f"{folder}: {n} benchmark record(s) appended to {args.results}")
        states.append(json.loads((folder / "state.json").read_text()))
    preset = plan_preset(plan)
    dest = figures_root / preset.name
    (dest / "gpu_plan").mkdir(parents=True, exist_ok=True)
    budget = {r["stage"]: r["seconds"] for r in budget_table(preset)}
    last = states[-1]
    lines = [summary(last, plan), "", "| stage | estimated s | measured s |", "|---|---:|---:|"]
    lines += [f"| {s.name} | {budget[s.name]} | {last['stages'].get(s.name, {}).get('seconds', 0):.0f} |"
              for s in STAGES]
    (dest / "gpu_plan" / "PLAN_STATUS.md").write_text("\n".join(lines) + "\n")
    if args.report:
        from depthnb.reproduce import reproduce  # here, not at the top: the device runs this file before its wheels are in

        with tempfile.TemporaryDirectory() as tmp:
            reproduce(plan["preset"], only=["report"], overrides=plan["overrides"], runs_dir=tmp,
                      figures_dir=figures_root)
    print(f"assembled {len(states)} call(s) into {dest}: {sum(1 for _ in dest.glob('*.csv'))} tables, "
          f"{sum(1 for _ in dest.glob('*.png'))} figures, REPORT.md {'written' if (dest / 'REPORT.md').exists() else 'missing'}")
    return 0


# ------------------------------------------------------------------------------------------- rehearsal (CPU)
# The plan at shrunk shapes (tests/test_experiments.py's scale): the same stages, the bench stages on the CPU.
REHEARSAL_SETS = {
    "size_classes": "[{'name': 'tiny', 'd_model': 64, 'd_attn': 64, 'n_heads': 4, 'n_layers': 2, 'd_ff': 256, "
                    "'n_vocab': 512, 'depths': (1, 2)}]",
    "stack_size_class": "{'name': 'tiny', 'd_model': 64, 'd_attn': 64, 'n_heads': 4, 'n_layers': 2, 'd_ff': 256, "
                        "'n_vocab': 512, 'depths': (1, 2)}",
    "stack_layers": "2", "stack.block_size": "1",
    "device": "cpu", "pretrain.device": "cpu", "finetune.device": "cpu", "pretrain.bf16": "false",
    "finetune.bf16": "false", "pretrain.compile": "false", "workers": "1",
    "pretrain.data.max_train_docs": "400", "pretrain.data.tokenizer_docs": "400", "pretrain.data.vocab_size": "512",
    "pretrain.data.eval_sets": "('enwiki_valid',)", "pretrain.model.n_ctx": "64",
    "pretrain.steps": "60", "pretrain.batch_size": "8", "pretrain.warmup_steps": "4", "pretrain.eval_every": "20",
    "pretrain.eval_sequences": "8", "pretrain.log_every": "5", "pretrain.ckpt_every": "5", "pretrain.n_snapshots": "3",
    "finetune.steps": "10", "finetune.batch_size": "8", "finetune.warmup_steps": "2", "finetune.eval_every": "5",
    "finetune.eval_examples": "20", "finetune.n_snapshots": "2", "finetune.gen_limit": "20",
    "finetune.max_new_tokens": "48", "tasks": "['cogs', 'passivization']", "control_task": "cogs",
    "control_references": "None", "task_steps": "{}",
    "primitives.n_eval": "10", "primitives.ft_steps": "6", "primitives.ft_eval_from": "4",
    "primitives.ft_eval_every": "2", "primitives.ft_seeds": "(0,)",
}
_BENCH_CPU = ["--device", "cpu", "--size-class", "tiny", "--layers", "1", "--n-ctx", "32", "--batch", "2",
              "--steps", "1", "--warmup", "1", "--rounds", "1", "--attn-impl", "sdpa", "--no-compile"]
REHEARSAL_BENCH_FLAGS = {  # every gpu.sh stage on the CPU in seconds; `tests` runs only the gpu-marked (skipped)
    "134M": _BENCH_CPU, "374M": [*_BENCH_CPU, "--memory-budget-gb", "1"],
    "cogs": [*_BENCH_CPU, "--cogs-limit", "8", "--cogs-batch", "8"],
    "midas": [*_BENCH_CPU, "--layers", "2", "--midas-block", "1", "--midas-steps", "4"],
    "tests": ["-m", "gpu"],
}


def copy_tree(src: Path, dest: Path) -> None:
    "What the device tool sends: tracked and untracked-not-ignored files."
    for rel in travelling_files(src):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dest / rel)


def wheel_from_installed(name: str, dest: Path) -> Path:
    "A wheel of the installed pure-Python distribution `name`, zipped from its installed files (the rehearsal's carry)."
    dist = metadata.distribution(name)
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for f in dist.files:
            if ".." not in f.parts and "__pycache__" not in f.parts and f.locate().is_file():
                z.write(f.locate(), str(f))
    return wheel


# A sitecustomize that makes some installed packages look absent, as on the GPU image, except in one folder
# (where the device installs the carried wheels).
_IMAGE_SITECUSTOMIZE = """import importlib.machinery, sys

class _Absent:
    "The GPU image lacks {names}: found only in {allowed} (benchmarks/gpu_plan.py, rehearsal)."
    def find_spec(self, name, path=None, target=None):
        if path is not None or name not in {names!r}:
            return None  # a submodule is found through its package's __path__
        spec = importlib.machinery.PathFinder.find_spec(name, [{allowed!r}])
        if spec is None:
            raise ModuleNotFoundError(f"No module named {{name!r}} (as on the GPU image)", name=name)
        return spec

sys.meta_path.insert(0, _Absent())
"""


def image_without(names: list[str], allowed: Path, folder: Path) -> Path:
    """A folder to put on PYTHONPATH: every Python started with it (and its children) finds the packages `names`
    only in `allowed`, as on the GPU image, which lacks them until the carried wheels are installed there."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_IMAGE_SITECUSTOMIZE.format(names=set(names), allowed=str(allowed)))
    return folder


def cmd_rehearse(args) -> int:
    "Prepare here, then two simulated device calls in a copy of the tree (the first cut mid-pretraining), then assemble."
    work = Path(args.work).resolve()
    if work.exists():
        shutil.rmtree(work)
    tree = work / "tree"
    copy_tree(ROOT, tree)
    sets = [x for k, v in REHEARSAL_SETS.items() for x in ("--set", f"{k}={v}")]
    py = [sys.executable, str(tree / "benchmarks" / "gpu_plan.py")]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))  # python3: ours
    env.pop(MARKER, None)
    here = dict(DEPTHNB_CACHE_DIR=str(cache_dir()))  # this checkout's cache and mirror (the copy has no ../shared)
    if os.environ.get("DEPTHNB_DATA_MIRROR") is None and default_mirror() is not None:
        here["DEPTHNB_DATA_MIRROR"] = str(default_mirror())
    subprocess.run([*py, "prepare", "--preset", "gpu", *sets, "--no-wheels", "--xz", "0",
                    "--bench-flags", json.dumps(REHEARSAL_BENCH_FLAGS), "--dest", str(tree / PLAN_DIR)],
                   check=True, env=dict(env, **here), cwd=tree)
    # As on the device: fastcore is missing but for the carried wheel, installed by the device command itself.
    wheel_from_installed("fastcore", tree / PLAN_DIR / "whl")
    image = image_without(["fastcore"], tree / SITE_DIR, work / "image")
    device_env = dict(env, DEPTHNB_CACHE_DIR=str(tree / "data" / "cache"),  # the device's cache: only what was carried
                      PYTHONPATH=os.pathsep.join(filter(None, [str(image), env.get("PYTHONPATH")])))
    runs = tree / STATE_DIR / "runs"
    evidence = {}
    for i, extra in enumerate([["--cut", "pretrain"], []], 1):
        subprocess.run([*py, "device", "--budget", str(args.budget), *extra], check=True,
                       env=dict(device_env, OUT=str(work / f"out{i}")), cwd=tree)
        if i == 1:  # what the cut left: checkpoints to resume from, snapshots a resumed run must not rewrite
            evidence["checkpoints_after_cut"] = sorted(str(f.relative_to(runs)) for f in runs.rglob("checkpoints/*.pt"))
            snaps = {f: f.stat().st_mtime_ns for f in runs.rglob("pretrain/*/*/snapshots/*.pt")}
    evidence["snapshots_kept"] = sorted(str(f.relative_to(runs)) for f, t in snaps.items()
                                        if f.exists() and f.stat().st_mtime_ns == t)
    evidence["snapshots_rewritten"] = sorted(str(f.relative_to(runs)) for f, t in snaps.items()
                                             if not f.exists() or f.stat().st_mtime_ns != t)
    evidence["finished_runs"] = sorted(str(f.parent.relative_to(runs)) for f in runs.rglob("pretrain/*/*/DONE"))
    subprocess.run([*py, "assemble", str(work / "out1"), str(work / "out2"), "--figures-dir", str(work / "figures"),
                    "--results", str(work / "RESULTS.md"), "--plan", str(tree / PLAN_DIR / "plan.json")],
                   check=True, env=env, cwd=tree)
    (work / "rehearsal.json").write_text(json.dumps(evidence, indent=1))
    resumed = evidence["checkpoints_after_cut"] and evidence["snapshots_kept"] and not evidence["snapshots_rewritten"]
    print(f"resume after the cut: {len(evidence['checkpoints_after_cut'])} checkpoint(s) left by call 1, "
          f"{len(evidence['snapshots_kept'])} snapshot(s) of call 1 kept by call 2, "
          f"{len(evidence['snapshots_rewritten'])} rewritten: {'resumed' if resumed else 'NOT shown to resume'}")
    print(f"rehearsal done: returned files in {work}/out1, {work}/out2; report in {work}/figures/gpu")
    return 0


# ------------------------------------------------------------------------------------------- the CLI
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"budget": _budget_parser, "prepare": _prepare_parser, "device": _device_parser,
                "assemble": _assemble_parser, "rehearse": _rehearse_parser}
    if not argv or argv[0] not in commands:
        print(__doc__.strip())
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    ap, command = commands[argv[0]]()
    return ap.run(command, argv[1:])


def _budget_parser():
    ap = CommandParser("gpu_plan budget", "Print the plan's per-stage budget table for a preset.")

    def command(args) -> int:
        print(format_budget(preset_from_args(args)))
        return 0
    ap.set_defaults(preset="gpu")
    return ap, command


def _prepare_parser():
    ap = CommandParser("gpu_plan prepare", "Build the carried folder: data archive, wheels and plan.json.")
    ap.set_defaults(preset="gpu")
    ap.add_argument("--stages", default=None, help=f"comma-separated stages (default: all: {', '.join(STAGE_NAMES)})")
    ap.add_argument("--dest", default=None, help=f"carried folder (default: {PLAN_DIR}/ in the checkout)")
    ap.add_argument("--xz", type=int, default=6, choices=range(10), help="xz level of data.tar.xz (default 6)")
    ap.add_argument("--no-wheels", dest="wheels", action="store_false", help="no wheels (a machine that has the packages)")
    ap.add_argument("--bench-flags", default=None, help="JSON {gpu.sh stage: [extra flags]} (default: "
                    + json.dumps(DEVICE_BENCH_FLAGS) + ")")

    def command(args) -> int:
        preset_from_args(args)  # a bad --preset/--set is refused before anything is built
        return cmd_prepare(args)
    return ap, command


def _device_parser():
    ap = CommandParser("gpu_plan device", "Run the plan's stages until the budget is spent; results to $OUT.",
                       preset=False)
    ap.add_argument("--budget", type=float, default=CALL_BUDGET, help=f"seconds this call may use (default {CALL_BUDGET})")
    ap.add_argument("--cut", action="append", default=[], metavar="STAGE",
                    help="rehearsal: stop STAGE at its first checkpoint, as if the call's time ran out there")
    return ap, cmd_device


def _assemble_parser():
    ap = CommandParser("gpu_plan assemble", "Turn returned $OUT folders (in call order) into figures/<preset>/, "
                       "REPORT.md and RESULTS.md records.", preset=False)
    ap.add_argument("folders", nargs="+", help="returned $OUT folders, first call first")
    ap.add_argument("--figures-dir", default=str(ROOT / "figures"), help="parent of figures/<preset>/")
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"), help="RESULTS.md to append to")
    ap.add_argument("--plan", default=None, help=f"plan.json (default {PLAN_DIR}/plan.json)")
    ap.add_argument("--no-report", dest="report", action="store_false", help="do not rebuild REPORT.md here")
    return ap, cmd_assemble


def _rehearse_parser():
    ap = CommandParser("gpu_plan rehearse", "The plan on the CPU at shrunk shapes: prepare, two device calls "
                       "(the first cut mid-pretraining), assemble.", preset=False)
    ap.add_argument("--work", default=str(ROOT / "runs" / "gpu-rehearsal"), help="scratch folder (replaced)")
    ap.add_argument("--budget", type=float, default=CALL_BUDGET, help="seconds per simulated call")
    return ap, cmd_rehearse


if __name__ == "__main__":
    sys.exit(main())
