"""benchmarks/gpu_plan.py, the GPU plan of issue 17: its budget fits one device window, its stages come in the
promised order, what it returns obeys the device tool's limits, and (slow) the CPU dress rehearsal: prepare, a
first call cut mid-pretraining, a second call that resumes, and the report assembled from the returned files."""
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from depthnb.presets import PRESETS
from depthnb.tasks import TASKS

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("gpu_plan", ROOT / "benchmarks" / "gpu_plan.py")
gpu_plan = sys.modules["gpu_plan"] = importlib.util.module_from_spec(spec)  # dataclasses look the module up
spec.loader.exec_module(gpu_plan)
OUT_NAME = re.compile(r"[A-Za-z0-9._-]+")


def test_budget_fits_one_window():
    rows = gpu_plan.budget_table(PRESETS["gpu"])
    core = [r for r in rows if not r["later"]]
    assert rows[:len(core)] == core  # the later stages come after the one-window plan
    assert core[-1]["total"] <= gpu_plan.window_seconds(), gpu_plan.format_budget(PRESETS["gpu"])
    assert all(r["seconds"] <= 9 * 60 for r in rows)  # every stage fits one call with room to pack
    assert gpu_plan.window_seconds() + gpu_plan.START_SECONDS + 3 * gpu_plan.GAP_SECONDS <= gpu_plan.DEVICE_SECONDS


def test_small_does_not_fit_and_gpu_is_derived_from_it():
    assert gpu_plan.budget_table(PRESETS["small"])[-1]["total"] > gpu_plan.window_seconds()
    g, s = PRESETS["gpu"], PRESETS["small"]
    assert (g.size_classes, g.stack_layers, g.stack, g.pretrain.model) == (s.size_classes, s.stack_layers, s.stack,
                                                                          s.pretrain.model)


def test_stage_order():
    names = list(gpu_plan.STAGE_NAMES)
    assert names[:2] == ["bench-134M", "cuda-tests"]  # the MFU target and the CUDA tests first
    assert names.index("pretrain") < names.index("finetune") < names.index("stacking")
    for s in gpu_plan.STAGES:  # a stage's prerequisites come before it
        assert all(names.index(a) < names.index(s.name) for a in s.after)
    assert {b for b in gpu_plan.BENCH_SECONDS} == {s.bench for s in gpu_plan.STAGES if s.kind == "bench"}


def test_carried_tasks_are_the_data_tasks():
    assert tuple(gpu_plan.TASK_DATASETS) == tuple(TASKS)


def test_wheels_are_what_the_image_lacks():
    names = {n.split("==")[0].lower() for n in gpu_plan.wheel_names()}
    assert {"fastcore", "papermill", "nbformat", "ipykernel", "datasets"} <= names
    assert not names & {"torch", "numpy", "pandas", "matplotlib", "sentencepiece"}


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


def test_readme_table_is_the_budget():
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    for r in gpu_plan.budget_table(PRESETS["gpu"]):
        assert re.search(rf"\| `{r['stage']}` \|[^\n]*\| {r['seconds']} \| {r['total']} \|", readme), r
