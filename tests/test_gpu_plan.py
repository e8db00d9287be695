"""benchmarks/gpu_plan.py, the GPU plan of issue 17: its budget fits one device window, its stages come in the
promised order, what it returns obeys the device tool's limits, and (slow) the CPU dress rehearsal: prepare, a
first call cut mid-pretraining, a second call that resumes, and the report assembled from the returned files."""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from importlib import metadata
from pathlib import Path

import pytest

from depthnb.presets import PRESETS
from depthnb.tasks import TASKS

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("gpu_plan", ROOT / "benchmarks" / "gpu_plan.py")
gpu_plan = sys.modules["gpu_plan"] = importlib.util.module_from_spec(spec)  # dataclasses look the module up
spec.loader.exec_module(gpu_plan)
OUT_NAME = re.compile(r"[A-Za-z0-9._-]+")


def test_window_arithmetic():
    # one window: a start of 1-2 min, a first call of at most 10 min, then one short call on the warm machine
    for start in (60, 120):
        left = gpu_plan.DEVICE_SECONDS - start - gpu_plan.CALL_SECONDS
        assert 180 <= left <= 240
        assert gpu_plan.call_budgets(start) == (gpu_plan.CALL_BUDGET, left - gpu_plan.SECOND_CALL_MARGIN)
    first, second = gpu_plan.window_calls()
    assert first == gpu_plan.CALL_BUDGET - gpu_plan.SETUP_SECONDS - gpu_plan.RESERVE_SECONDS
    assert gpu_plan.MIN_SCIENCE_SECONDS <= second < first
    assert gpu_plan.window_seconds() == round(first + second)


def test_budget_windows():
    seconds = gpu_plan.stage_seconds(PRESETS["gpu"])
    first = gpu_plan.window_calls()[0]
    assert all(sec <= first for sec in seconds.values()), seconds  # every stage fits a window's first call
    windows = gpu_plan.schedule_windows(seconds)
    finished = [[n for call in w for n, fin in call if fin] for w in windows]
    assert finished[0][:3] == ["bench-134M", "cuda-tests", "bench-374M"]  # the MFU targets and the CUDA tests first
    assert sorted(n for f in finished for n in f if n != "data") == sorted(n for n in gpu_plan.STAGE_NAMES if n != "data")
    for w, calls in zip(finished, windows):  # a window's stages fit its calls, and their prerequisites ran in it
        assert all(a in w for n in w for a in gpu_plan.STAGE_BY_NAME[n].after)
        for call, capacity in zip(calls, gpu_plan.window_calls()):
            assert sum(seconds[n] for n, fin in call if fin) <= capacity
    rows = gpu_plan.budget_table(PRESETS["gpu"])
    assert [r["stage"] for r in rows] == list(gpu_plan.STAGE_NAMES)
    assert max(r["window"] for r in rows) == len(windows)


def test_small_does_not_fit_and_gpu_is_derived_from_it():
    assert sum(gpu_plan.stage_seconds(PRESETS["small"]).values()) > 3 * gpu_plan.window_seconds()
    g, s = PRESETS["gpu"], PRESETS["small"]
    assert (g.size_classes, g.stack_layers, g.stack, g.pretrain.model) == (s.size_classes, s.stack_layers, s.stack,
                                                                          s.pretrain.model)


def test_stage_order():
    names = list(gpu_plan.STAGE_NAMES)
    assert names[:3] == ["bench-134M", "cuda-tests", "bench-374M"]  # the MFU targets and the CUDA tests first
    assert names.index("pretrain") < names.index("finetune") < names.index("controls") < names.index("stacking")
    for s in gpu_plan.STAGES:  # a stage's prerequisites come before it
        assert all(names.index(a) < names.index(s.name) for a in s.after)
    assert {b for b in gpu_plan.BENCH_SECONDS} == {s.bench for s in gpu_plan.STAGES if s.kind == "bench"}
    # a window is a fresh machine: `prepare --stages` adds what a stage needs
    assert gpu_plan._stage_list("controls,bench-cogs") == ("bench-cogs", "data", "pretrain", "finetune", "controls")


def test_carried_tasks_are_the_data_tasks():
    assert tuple(gpu_plan.TASK_DATASETS) == tuple(TASKS)


def test_wheels_are_what_the_image_lacks():
    names = {n.split("==")[0].lower() for n in gpu_plan.wheel_names()}
    assert {"fastcore", "papermill", "nbformat", "ipykernel", "datasets"} <= names
    assert not names & {"torch", "numpy", "pandas", "matplotlib", "sentencepiece"}
    bench = [s.name for s in gpu_plan.STAGES if s.kind == "bench"]
    assert [n.split("==")[0].lower() for n in gpu_plan.wheel_names(bench)] == ["fastcore"]


def test_benchmarks_need_no_other_wheel(tmp_path):
    # a plan of benchmarks alone carries BENCH_REQUIREMENTS: gpu.sh's bench and the CUDA tests import with the rest hidden
    carried = {n.split("==")[0].lower().replace("_", "-") for n in gpu_plan.wheel_names()}
    kept = {n.lower() for n in gpu_plan.BENCH_REQUIREMENTS}
    modules = {m for m, dists in metadata.packages_distributions().items()
               if {d.lower().replace("_", "-") for d in dists} & (carried - kept)}
    assert {"papermill", "datasets", "lm_eval"} <= modules
    image = gpu_plan.image_without(sorted(modules), tmp_path / "nowhere", tmp_path / "image")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(image), str(ROOT / "tests")]), OMP_NUM_THREADS="1")
    hidden = subprocess.run([sys.executable, "-c", "import papermill"], env=env, capture_output=True, text=True)
    assert "as on the GPU image" in hidden.stderr
    imports = "; ".join(f"import {m}" for m in ("depthnb.bench", "test_bench", "test_model", "test_parallel"))
    result = subprocess.run([sys.executable, "-c", imports], env=env, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]


def test_device_installs_the_carried_wheels_before_importing_depthnb(tmp_path):
    # issue 33's first call: the GPU image lacks fastcore, which depthnb.model imports; the carried wheel must be
    # installed before gpu_plan.py imports depthnb
    tree = tmp_path / "tree"
    (tree / "benchmarks").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "gpu_plan.py", tree / "benchmarks")
    (tree / "depthnb").symlink_to(ROOT / "depthnb")
    image = gpu_plan.image_without(["fastcore"], tree / gpu_plan.SITE_DIR, tmp_path / "image")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env.update(PYTHONPATH=str(image), OMP_NUM_THREADS="1")
    device = [sys.executable, str(tree / "benchmarks" / "gpu_plan.py"), "device"]
    missing = subprocess.run(device, env=env, cwd=tree, capture_output=True, text=True)
    assert "No module named 'fastcore' (as on the GPU image)" in missing.stderr  # without the wheel: today's crash
    gpu_plan.wheel_from_installed("fastcore", tree / gpu_plan.PLAN_DIR / "whl")
    result = subprocess.run(device, env=env, cwd=tree, capture_output=True, text=True)
    assert result.returncode == 2 and "$OUT is not set" in result.stderr, result.stderr[-2000:]  # past the imports
    assert (tree / gpu_plan.SITE_DIR / "fastcore" / "__init__.py").exists()


def test_cuda_tests_run_on_the_carried_data(tmp_path):
    # the device has no raw corpus and no mirror: the CUDA tests' data must come from the carried cache files alone
    files = gpu_plan.cuda_test_files()
    gpu_plan.write_data_archive(files, tmp_path / "data.tar.xz")
    assert (tmp_path / "data.tar.xz").stat().st_size < 2**20  # the carry is all but full (README, "The GPU plan")
    cache = tmp_path / "cache"
    with tarfile.open(tmp_path / "data.tar.xz") as tar:
        tar.extractall(cache, filter="data")
    code = "from _train_common import CUDA_TEST_DATA, small_data; d = small_data(CUDA_TEST_DATA); print(len(d.train))"
    env = dict(os.environ, DEPTHNB_CACHE_DIR=str(cache), DEPTHNB_DATA_MIRROR="none", OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT / "tests"))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and int(result.stdout.split()[-1]) > 0, result.stderr[-2000:]


def test_tar_folder_leaves_out_weights(tmp_path):
    src = tmp_path / "src"
    for rel in ("a.csv", "sub/b.png", "run/checkpoints/step_1.json", "run/final.pt", "run/final.pt.sha256"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("x")
    gpu_plan.tar_folder(src, tmp_path / "t.tar.gz")
    with tarfile.open(tmp_path / "t.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["a.csv", "sub/b.png"]


def test_merge_results_appends_new_sections_once(tmp_path):
    local, returned = tmp_path / "RESULTS.md", tmp_path / "back.md"
    local.write_text("# Results\n\n### one\nA\n")
    returned.write_text("# Results\n\n### one\nA\n\n### two\nB\n")
    assert gpu_plan.merge_results(local, returned) == 1
    assert gpu_plan.merge_results(local, returned) == 0
    assert local.read_text().count("### two") == 1 and local.read_text().startswith("# Results\n\n### one")


def test_kill_marked_ends_a_process_in_its_own_session(tmp_path):
    # papermill's kernels start new sessions: the plan finds its processes by an environment marker
    env = dict(os.environ, **{gpu_plan.MARKER: str(tmp_path)})
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)
    time.sleep(0.5)
    assert proc.pid in gpu_plan.marked_pids(str(tmp_path))
    gpu_plan.kill_marked(str(tmp_path), log=lambda *a: None)
    assert proc.wait(timeout=10) != 0 and not gpu_plan.marked_pids(str(tmp_path))


def test_a_failed_benchmark_is_not_started_again(tmp_path):
    # issue 33: bench-134M exited 1 (its flex variant did not compile; its records came back) and ran again in the
    # next call; a science stage that failed gets one more try
    plan = dict(preset="gpu", overrides={}, stages=["bench-134M", "cuda-tests", "data"])
    failed = dict(status="failed", seconds=80.0, calls=[dict(call=1, seconds=80.0, status="failed")])
    state = gpu_plan.STATE_DIR / "state.json"
    (tmp_path / state).parent.mkdir(parents=True)
    (tmp_path / state).write_text(json.dumps(dict(calls=1, stages={"bench-134M": failed, "data": failed})))
    call = gpu_plan.Call(tmp_path, tmp_path / "out", 540, plan, set(), log=lambda *a: None)
    started = []
    call.run_stage = lambda stage: started.append(stage.name) or "done"
    call.run(tuple(plan["stages"]))
    assert started == ["cuda-tests", "data"]


def test_device_needs_out_and_plan(monkeypatch, capsys):
    monkeypatch.delenv("OUT", raising=False)
    assert gpu_plan.main(["device"]) == 2
    assert "gpu_plan device: error: $OUT is not set" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.rehearsal
def test_rehearsal(tmp_path):
    "The whole plan on the CPU at shrunk shapes; about 5 minutes on one thread."
    work = tmp_path / "rehearsal"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_plan.py"), "rehearse", "--work", str(work)],
                   check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    first = json.loads((work / "out1" / "state.json").read_text())
    last = json.loads((work / "out2" / "state.json").read_text())
    assert first["stages"]["pretrain"]["status"] == "cut"
    assert "finetune" not in first["stages"] or first["stages"]["finetune"]["status"] != "done"
    assert {k: v["status"] for k, v in last["stages"].items()} == {s: "done" for s in gpu_plan.STAGE_NAMES}
    evidence = json.loads((work / "rehearsal.json").read_text())
    assert evidence["checkpoints_after_cut"] and evidence["snapshots_kept"] and not evidence["snapshots_rewritten"]
    assert len(evidence["finished_runs"]) == 2
    for out in (work / "out1", work / "out2"):  # what the device tool brings back
        files = list(out.iterdir())
        assert len(files) <= gpu_plan.OUT_FILES and all(OUT_NAME.fullmatch(f.name) for f in files)
        assert all(f.is_file() and f.stat().st_size <= gpu_plan.OUT_FILE_BYTES for f in files)
        for t in out.glob("*.tar.gz"):
            with tarfile.open(t) as tar:
                assert not [n for n in tar.getnames() if n.endswith(".pt") or "checkpoints" in n]
    figures = work / "figures" / "gpu"
    report = (figures / "REPORT.md").read_text()
    assert "**missing**" not in report, [line for line in report.splitlines() if "**missing**" in line]
    assert (figures / "fidelity.csv").exists() and (figures / "petty_fig2_perplexity.png").exists()
    assert (figures / "gpu_plan" / "PLAN_STATUS.md").exists()
    assert (figures / "gpu_plan" / "bench" / "bench-134M" / "134M.json").exists()
    assert (work / "RESULTS.md").read_text().count("\n### ") >= 4  # 134M, 374M, cogs, midas records merged


def test_readme_is_the_budget():
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    for r in gpu_plan.budget_table(PRESETS["gpu"]):
        assert re.search(rf"\| `{r['stage']}` \|[^\n]*\| {r['seconds']} \| {r['window']} \|", readme), r
    for line in gpu_plan.run_calls().splitlines()[1:]:  # the calls of one window
        assert line.strip() in readme, line
