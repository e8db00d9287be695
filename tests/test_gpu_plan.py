"""The GPU plan (depthnb.tools.gpu_*, nbs/92*; its command line benchmarks/gpu_plan.py): its stages come in the
promised order and each fits a job of the default deadline, its commands and returned records name no machine's
paths, no tracked file holds one (notebooks' saved outputs included), and (slow) the CPU dress rehearsal: prepare, a
first job of the attention stages alone, a second job cut mid-pretraining, a third that resumes, and the report
assembled from the three results folders."""
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

from depthnb.config import BAND_IMPLS
from depthnb.presets import PRESETS
from depthnb.tasks import TASKS
from depthnb.tools import gpu_assemble, gpu_cli, gpu_job, gpu_plan, gpu_prepare, gpu_rehearsal

ROOT = Path(__file__).resolve().parent.parent
OUT_NAME = re.compile(r"[A-Za-z0-9._-]+")
# An absolute path under a folder that names a machine (a checkout, a home, temporary or installed files).
MACHINE_PATH = re.compile(r"(?<![\w.~<>/-])/(work|root|home|tmp|opt|Users|mnt)/")


def test_job_arithmetic():
    capacity = gpu_plan.job_seconds()
    assert capacity == gpu_plan.DEADLINE - gpu_plan.SETUP_SECONDS - gpu_plan.RESERVE_SECONDS
    assert gpu_plan.job_seconds(3600) == 3600 - gpu_plan.SETUP_SECONDS - gpu_plan.RESERVE_SECONDS
    with pytest.raises(ValueError, match="--deadline 60: leaves 25 s"):
        gpu_plan.schedule_jobs(gpu_plan.stage_seconds(PRESETS["gpu"]), 60)


def test_budget_jobs():
    seconds = gpu_plan.stage_seconds(PRESETS["gpu"])
    capacity = gpu_plan.job_seconds()
    assert all(sec <= capacity for sec in seconds.values()), seconds  # every stage fits the first job
    jobs = gpu_plan.schedule_jobs(seconds)
    finished = [[n for n, fin in ran if fin] for ran in jobs]
    assert finished[0] == ["attention-374M", "attention"]  # the missed 374M target, then the 134M one, in one job
    assert finished[1][:2] == ["attention-profile", "cuda-tests"]
    assert sorted(n for f in finished for n in f) == sorted(gpu_plan.STAGE_NAMES)  # each stage finished once
    done, spent = [], {}
    for ran, names in zip(jobs, finished):
        used = 0.0  # a stage resumed from an earlier job spends only what it had left
        for n, fin in ran:
            part = seconds[n] - spent.get(n, 0.0) if fin else capacity - used
            spent[n], used = spent.get(n, 0.0) + part, used + part
        assert used <= capacity + 1e-6
        left = capacity  # a benchmark starts only where its estimate and the overrun it may take fit what is left
        for n, fin in ran:
            if gpu_plan.STAGE_BY_NAME[n].kind == "bench":
                assert seconds[n] + gpu_plan.OVERRUN_SECONDS <= left, n
            left -= seconds[n]
        for n in names:  # a stage's prerequisites finished before it, in this job or an earlier one
            assert all(a in done for a in gpu_plan.STAGE_BY_NAME[n].after), n
            done.append(n)
        cut = [n for n, fin in ran if not fin]  # at most one stage cut per job, the job's last, a science stage
        assert len(cut) <= 1 and (not cut or (ran[-1][0] == cut[0] and gpu_plan.STAGE_BY_NAME[cut[0]].kind == "science"))
    rows = gpu_plan.budget_table(PRESETS["gpu"])
    assert [r["stage"] for r in rows] == list(gpu_plan.STAGE_NAMES)
    assert max(r["job"] for r in rows) == len(jobs)
    assert len(gpu_plan.schedule_jobs(seconds, 3600)) == 1  # an hour's job holds the whole plan
    with pytest.raises(ValueError, match="attention-374M: does not fit a job"):
        gpu_plan.schedule_jobs(seconds, seconds["attention-374M"] + 20)


def test_first_job_fits_with_a_minute_spare():
    "The first job: the 374M check and bench, then 134M's; at most 7.5 minutes of estimates, a minute or more spare."
    seconds = gpu_plan.stage_seconds(PRESETS["gpu"])
    first = gpu_plan.schedule_jobs(seconds)[0]
    assert first == [("attention-374M", True), ("attention", True)] and tuple(n for n, _ in first) == gpu_plan.FIRST_JOB
    used = sum(seconds[n] for n, _ in first)
    assert used <= gpu_plan.FIRST_JOB_SECONDS == 450
    assert gpu_plan.job_seconds() - used >= gpu_plan.FIRST_JOB_SLACK == 60
    # both overrunning to their cut still leave the packing its time
    assert used + len(first) * gpu_plan.OVERRUN_SECONDS <= gpu_plan.job_seconds()
    flags = gpu_plan.PLAN_BENCH_FLAGS  # their profiles run in a later stage, from the checks they wrote
    assert "profile" not in flags["attention"][1] and "profile" not in flags["attention-374M"][1]
    assert flags["attention-profile"] == ["--pick", "runs/gpu-plan/bench/attention-374M/attention_check.json,"
                                                    "runs/gpu-plan/bench/attention/attention_check.json"]


def fake_bench(monkeypatch, tmp_path, script: str, estimate: float):
    "A Job whose `attention` stage runs `script` (Python) under an estimate of `estimate` s and no overrun."
    monkeypatch.setitem(gpu_plan.BENCH_SECONDS, "attention", estimate)
    monkeypatch.setattr(gpu_job, "OVERRUN_SECONDS", 0)
    plan = dict(preset="gpu", overrides={}, stages=["attention", "cuda-tests"], bench_flags={})
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "RESULTS.md").write_text("# Results\n")
    state = tmp_path / gpu_plan.STATE_DIR / "state.json"
    (state.parent / "logs").mkdir(parents=True)
    state.write_text(json.dumps(dict(jobs=1, stages={})))  # not the first job: every stage may run
    job = gpu_job.Job(tmp_path, tmp_path / "out", 540, plan, set(), log=lambda *a: None)
    job.command = lambda stage: [sys.executable, "-c", script if stage.name == "attention" else "pass"]
    return job


def test_a_benchmark_past_its_estimate_is_cut_and_recorded(monkeypatch, tmp_path):
    "It is cut at its estimate (and the overrun), recorded as cut with why, not run again; the next stage runs."
    script = "import time; open('partial.txt', 'w').write('row 1'); print('row 1', flush=True); time.sleep(60)"
    job = fake_bench(monkeypatch, tmp_path, script, 2)
    t0 = time.time()
    job.run(("attention", "cuda-tests"))
    assert time.time() - t0 < 30
    state = json.loads((tmp_path / "out" / "state.json").read_text())
    rec = state["stages"]["attention"]
    assert rec["status"] == "cut" and rec["overran"] and "ran past its estimate of 2 s" in rec["why"]
    assert state["stages"]["cuda-tests"]["status"] == "done"  # the job went on
    assert (tmp_path / "partial.txt").read_text() == "row 1"  # what it wrote before the cut stays
    log = (tmp_path / gpu_plan.STATE_DIR / "logs" / "attention.log").read_text()
    assert "row 1" in log
    started = []  # the next job does not start it again
    job2 = gpu_job.Job(tmp_path, tmp_path / "out", 540, job.plan, set(), log=lambda *a: None)
    job2.run_stage = lambda stage: started.append(stage.name) or "done"
    job2.run(("attention", "cuda-tests"))
    assert started == []  # cuda-tests was done too


def test_a_benchmark_within_its_estimate_is_done(monkeypatch, tmp_path):
    job = fake_bench(monkeypatch, tmp_path, "print('ok')", 30)
    job.run(("attention",))
    assert json.loads((tmp_path / "out" / "state.json").read_text())["stages"]["attention"]["status"] == "done"


def test_small_does_not_fit_and_gpu_is_derived_from_it():
    assert sum(gpu_plan.stage_seconds(PRESETS["small"]).values()) > 3 * gpu_plan.job_seconds()
    g, s = PRESETS["gpu"], PRESETS["small"]
    assert (g.size_classes, g.stack_layers, g.stack, g.pretrain.model) == (s.size_classes, s.stack_layers, s.stack,
                                                                          s.pretrain.model)


def test_stage_order():
    names = list(gpu_plan.STAGE_NAMES)
    # the attention target still missed (374M), the one met (134M), their profiles, then the CUDA tests
    assert names[:4] == ["attention-374M", "attention", "attention-profile", "cuda-tests"]
    assert "bench-134M" not in names and "bench-374M" not in names  # the attention stages run both shapes themselves
    assert names.index("pretrain") < names.index("finetune") < names.index("controls") < names.index("stacking")
    for s in gpu_plan.STAGES:  # a stage's prerequisites come before it
        assert all(names.index(a) < names.index(s.name) for a in s.after)
    assert {b for b in gpu_plan.BENCH_SECONDS} == {s.bench for s in gpu_plan.STAGES if s.kind == "bench"}
    # a fresh checkout: `prepare --stages` adds what a stage needs
    assert gpu_plan.stage_list("controls,bench-cogs") == ("bench-cogs", "data", "pretrain", "finetune", "controls")


def test_attention_stage_runs_the_check_with_relative_paths(tmp_path):
    # the stage is gpu.sh's `attention`, results in the stage's own folder, relative to the checkout; its estimate
    # covers the check's ~120 s and the two bench runs; the rehearsal runs the check on the CPU at shrunk shapes
    attention = gpu_plan.STAGE_BY_NAME["attention"]
    assert attention.kind == "bench" and gpu_plan.BENCH_SECONDS["attention"] > 120
    plan = dict(preset="gpu", overrides={"pretrain.steps": "5"}, stages=list(gpu_plan.STAGE_NAMES), bench_flags={})
    job = gpu_job.Job(tmp_path, tmp_path / "out", 540, plan, set(), log=lambda *a: None)
    assert job.command(attention) == ["bash", "benchmarks/gpu.sh", "--out", "runs/gpu-plan/bench/attention", "attention"]
    assert gpu_rehearsal.REHEARSAL_BENCH_FLAGS["attention"] == ["--device", "cpu", "--shrink", "--bench-parts", "train"]
    for stage in gpu_plan.STAGES:  # every command as its log records it: no absolute path
        line = gpu_job.shown(job.command(stage), tmp_path)
        assert not [a for a in line.split() if a.startswith("/")], line
    pretrain = gpu_job.shown(job.command(gpu_plan.STAGE_BY_NAME["pretrain"]), tmp_path)
    assert pretrain.startswith("python3 -c") and "--runs-dir runs/gpu-plan/runs --figures-dir runs/gpu-plan/figures" \
        in pretrain


def test_gpu_sh_names_its_stages(tmp_path):
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--out", str(tmp_path / "o"), "nosuch"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "unknown stage nosuch" in result.stderr and "attention|attention-374M|tests" in result.stderr


def test_scrub_paths(tmp_path):
    checkout = tmp_path / "checkout"
    site = "/".join(["", "opt", "torch", ".venv", "lib", "python3.12", "site-packages"])  # as a GPU image has it
    pytest_tmp = "/".join(["", "tmp", "pytest-of-someone", "pytest-7"])
    log = (f"--json {checkout}/runs/gpu-plan/bench/attention/bench_134M.json --note x\n"
           f"cd {checkout}\n"
           f"  {site}/torch/jit/_script.py:365: DeprecationWarning\n"
           f"tmp_path = PosixPath('{pytest_tmp}/test_fsdp_0')\n"
           "| depthnb[band-flex] | 263,379 | 62.2 | 1/2 | runs/tmp/x |\n")
    clean = gpu_assemble.scrub_paths(log, [checkout])
    assert clean.splitlines() == ["--json runs/gpu-plan/bench/attention/bench_134M.json --note x", "cd .",
                                  "  <site-packages>/torch/jit/_script.py:365: DeprecationWarning",
                                  "tmp_path = PosixPath('<tmp>/test_fsdp_0')",
                                  "| depthnb[band-flex] | 263,379 | 62.2 | 1/2 | runs/tmp/x |"]
    # without the checkout recorded: a machine folder's path is cut at the checkout's top folder it reaches
    home = "/" + "/".join(["home", "someone", "depthnb-copy"])
    assert gpu_assemble.scrub_paths(f"{home}/runs/gpu-plan/x.json and {home}/notes.txt") == \
        "runs/gpu-plan/x.json and <abs>/notes.txt"
    assert gpu_assemble.scrub_paths(clean, [checkout]) == clean  # idempotent


def test_assemble_scrubs_what_it_copies(tmp_path):
    checkout = tmp_path / "gpu-checkout"
    out = tmp_path / "results"
    logs = tmp_path / "logs"
    logs.mkdir(parents=True)
    (logs / "attention.log").write_text(f"===== job 1: bash benchmarks/gpu.sh attention\n"
                                        f"appended to {checkout}/benchmarks/RESULTS.md\n")
    out.mkdir()
    gpu_job.tar_folder(logs, out / "logs.tar.gz")
    (out / "RESULTS.md").write_text(f"# Results\n\n### run one\n- command: `depthnb bench --json "
                                    f"{checkout}/runs/b.json`\n\n| 1.5 | 263,379 |\n")
    state = dict(jobs=1, checkout=str(checkout), stages={"attention": dict(status="done", seconds=300.0, jobs=[])})
    (out / "state.json").write_text(json.dumps(state))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(dict(preset="gpu", overrides={}, stages=list(gpu_plan.STAGE_NAMES))))
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n")
    assert gpu_cli.main(["assemble", str(out), "--figures-dir", str(tmp_path / "figures"), "--results", str(results),
                          "--plan", str(plan), "--no-report"]) == 0
    log = (tmp_path / "figures" / "gpu" / "gpu_plan" / "logs" / "attention.log").read_text()
    assert "appended to benchmarks/RESULTS.md" in log and str(tmp_path) not in log
    merged = results.read_text()
    assert "--json runs/b.json`" in merged and "| 1.5 | 263,379 |" in merged and str(tmp_path) not in merged
    status = (tmp_path / "figures" / "gpu" / "gpu_plan" / "PLAN_STATUS.md").read_text()
    assert "| attention | done | 300 |" in status


def test_no_machine_paths_in_tracked_files():
    # records of commands and logs keep paths relative to the repository, and the notebooks' saved outputs (what the
    # docs site and GitHub show) name files relative to the checkout, the cache or an example's temporary folder
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files", "-z", "--", "."], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    found = []
    for name in filter(None, files):
        path = ROOT / name
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary: images, archives
        found += [f"{name}:{i}: {line.strip()[:160]}" for i, line in enumerate(text.splitlines(), 1)
                  if MACHINE_PATH.search(line)]
    assert not found, "\n".join(found)


def test_carried_tasks_are_the_data_tasks():
    assert tuple(gpu_prepare.TASK_DATASETS) == tuple(TASKS)


def test_wheels_are_what_the_image_lacks():
    names = {n.split("==")[0].lower() for n in gpu_prepare.wheel_names()}
    assert {"fastcore", "papermill", "nbformat", "ipykernel", "datasets"} <= names
    assert not names & {"torch", "numpy", "pandas", "matplotlib", "sentencepiece"}
    bench = [s.name for s in gpu_plan.STAGES if s.kind == "bench"]
    assert [n.split("==")[0].lower() for n in gpu_prepare.wheel_names(bench)] == ["fastcore"]
    assert gpu_prepare.wheel_names(bench, gpu_prepare.GPU_IMAGE + "\nfastcore==1.0\n") == []  # another image's packages


def test_benchmarks_need_no_other_wheel(tmp_path):
    # a plan of benchmarks alone carries BENCH_REQUIREMENTS: gpu.sh's bench and the CUDA tests import with the rest hidden
    carried = {n.split("==")[0].lower().replace("_", "-") for n in gpu_prepare.wheel_names()}
    kept = {n.lower() for n in gpu_prepare.BENCH_REQUIREMENTS}
    modules = {m for m, dists in metadata.packages_distributions().items()
               if {d.lower().replace("_", "-") for d in dists} & (carried - kept)}
    assert {"papermill", "datasets", "lm_eval"} <= modules
    image = gpu_rehearsal.image_without(sorted(modules), tmp_path / "nowhere", tmp_path / "image")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(image), str(ROOT / "tests")]), OMP_NUM_THREADS="1")
    hidden = subprocess.run([sys.executable, "-c", "import papermill"], env=env, capture_output=True, text=True)
    assert "as on the GPU image" in hidden.stderr
    imports = "; ".join(f"import {m}" for m in ("depthnb.tools.bench", "test_band", "test_bench", "test_model",
                                                 "test_parallel"))
    result = subprocess.run([sys.executable, "-c", imports], env=env, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]


def test_run_installs_the_carried_wheels_before_importing_depthnb(tmp_path):
    # the GPU image lacks fastcore, which depthnb.model imports; the carried wheel must be installed before
    # gpu_plan.py imports the rest of depthnb (what it imports first, depthnb.tools.gpu_job, needs no fastcore)
    tree = tmp_path / "tree"
    (tree / "benchmarks").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "gpu_plan.py", tree / "benchmarks")
    (tree / "depthnb").symlink_to(ROOT / "depthnb")
    image = gpu_rehearsal.image_without(["fastcore"], tree / gpu_plan.SITE_DIR, tmp_path / "image")
    env = dict(os.environ, PYTHONPATH=str(image), OMP_NUM_THREADS="1")
    run = [sys.executable, str(tree / "benchmarks" / "gpu_plan.py"), "run"]
    missing = subprocess.run(run, env=env, cwd=tree, capture_output=True, text=True)
    assert "No module named 'fastcore' (as on the GPU image)" in missing.stderr  # without the wheel: a crash
    gpu_rehearsal.wheel_from_installed("fastcore", tree / gpu_plan.PLAN_DIR / "whl")
    result = subprocess.run(run, env=env, cwd=tree, capture_output=True, text=True)
    assert result.returncode == 2 and "no .gpu/plan.json" in result.stderr, result.stderr[-2000:]  # past the imports
    assert (tree / gpu_plan.SITE_DIR / "fastcore" / "__init__.py").exists()


def test_cuda_tests_run_on_the_carried_data(tmp_path):
    # a GPU job has no raw corpus and no mirror: the CUDA tests' data must come from the carried cache files alone
    files = gpu_prepare.cuda_test_files()
    gpu_prepare.write_data_archive(files, tmp_path / "data.tar.xz")
    assert (tmp_path / "data.tar.xz").stat().st_size < 2**20  # small: the carry limit is shared with the science
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
    gpu_job.tar_folder(src, tmp_path / "t.tar.gz")
    with tarfile.open(tmp_path / "t.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["a.csv", "sub/b.png"]


def test_merge_results_appends_new_sections_once(tmp_path):
    local, returned = tmp_path / "RESULTS.md", tmp_path / "back.md"
    local.write_text("# Results\n\n### one\nA runs/x.json\n")
    returned.write_text(f"# Results\n\n### one\nA {tmp_path}/c/runs/x.json\n\n### two\nB\n")
    assert gpu_assemble.merge_results(local, returned, [tmp_path / "c"]) == 1  # `one`, scrubbed, is there already
    assert gpu_assemble.merge_results(local, returned, [tmp_path / "c"]) == 0
    assert local.read_text().count("### two") == 1 and local.read_text().startswith("# Results\n\n### one")


def test_kill_marked_ends_a_process_in_its_own_session(tmp_path):
    # papermill's kernels start new sessions: the plan finds its processes by an environment marker
    env = dict(os.environ, **{gpu_job.MARKER: str(tmp_path)})
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)
    time.sleep(0.5)
    assert proc.pid in gpu_job.marked_pids(str(tmp_path))
    gpu_job.kill_marked(str(tmp_path), log=lambda *a: None)
    assert proc.wait(timeout=10) != 0 and not gpu_job.marked_pids(str(tmp_path))


def test_a_failed_benchmark_is_not_started_again(tmp_path):
    # a benchmark that ran to its end and exited 1 (a variant that did not compile: its records came back) is not
    # run again in the next job; a science stage that failed gets one more try
    plan = dict(preset="gpu", overrides={}, stages=["attention", "cuda-tests", "data"])
    failed = dict(status="failed", seconds=80.0, jobs=[dict(job=1, seconds=80.0, status="failed")])
    state = gpu_plan.STATE_DIR / "state.json"
    (tmp_path / state).parent.mkdir(parents=True)
    (tmp_path / state).write_text(json.dumps(dict(jobs=1, stages={"attention": failed, "data": failed})))
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "RESULTS.md").write_text("# Results\n")
    job = gpu_job.Job(tmp_path, tmp_path / "out", 540, plan, set(), log=lambda *a: None)
    started = []
    job.run_stage = lambda stage: started.append(stage.name) or "done"
    job.run(tuple(plan["stages"]))
    assert started == ["cuda-tests", "data"]
    assert json.loads((tmp_path / "out" / "state.json").read_text())["jobs"] == 2
    assert sorted(f.name for f in (tmp_path / "out").iterdir()) == sorted(gpu_job.RESULT_FILES)


def test_run_refuses_bad_flags(capsys):
    assert gpu_cli.main(["run", "--deadline", "30"]) == 2
    assert "gpu_plan run: error: --deadline 30: at least 36 s needed" in capsys.readouterr().err
    assert gpu_cli.main(["run", "--cut", "bench-134M"]) == 2
    assert "--cut bench-134M: not a stage" in capsys.readouterr().err
    assert gpu_cli.main(["budget", "--deadline", "200"]) == 2
    assert "attention-374M: does not fit a job" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.rehearsal
def test_rehearsal(tmp_path):
    "The whole plan on the CPU at shrunk shapes; about 6 minutes on one thread."
    work = tmp_path / "rehearsal"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_plan.py"), "rehearse", "--work", str(work)],
                   check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    first, cut, last = (json.loads((work / f"out{i}" / "state.json").read_text()) for i in (1, 2, 3))
    assert sorted(first["stages"]) == sorted(gpu_plan.FIRST_JOB)  # a fresh checkout's first job: the attention stages
    assert cut["stages"]["pretrain"]["status"] == "cut"
    assert "finetune" not in cut["stages"] or cut["stages"]["finetune"]["status"] != "done"
    assert {k: v["status"] for k, v in last["stages"].items()} == {s: "done" for s in gpu_plan.STAGE_NAMES}
    evidence = json.loads((work / "rehearsal.json").read_text())
    assert evidence["checkpoints_after_cut"] and evidence["snapshots_kept"] and not evidence["snapshots_rewritten"]
    assert len(evidence["finished_runs"]) == 2
    for out in (work / "out1", work / "out2", work / "out3"):  # what a job hands back
        files = list(out.iterdir())
        assert sorted(f.name for f in files) == sorted(gpu_job.RESULT_FILES)
        assert all(f.is_file() and f.stat().st_size <= gpu_job.RESULT_FILE_MIB * 2**20 for f in files)
        for t in out.glob("*.tar.gz"):
            with tarfile.open(t) as tar:
                assert not [n for n in tar.getnames() if n.endswith(".pt") or "checkpoints" in n]
    figures = work / "figures" / "gpu"
    report = (figures / "REPORT.md").read_text()
    assert "**missing**" not in report, [line for line in report.splitlines() if "**missing**" in line]
    assert (figures / "fidelity.csv").exists() and (figures / "petty_fig2_perplexity.png").exists()
    assert (figures / "gpu_plan" / "PLAN_STATUS.md").exists()
    check = json.loads((figures / "gpu_plan" / "bench" / "attention" / "attention_check.json").read_text())
    assert check["device"] == "CPU" and check["fastest_correct"] in BAND_IMPLS
    assert (figures / "gpu_plan" / "bench" / "attention" / "bench_134M.json").exists()
    assert (figures / "gpu_plan" / "bench" / "attention-374M" / "bench_374M.json").exists()
    results = (work / "RESULTS.md").read_text()
    assert results.count("\n### ") >= 6  # the attention checks, the 134M and 374M runs, cogs, midas
    assert "Where a training step's time goes" in results  # the 134M run's profile
    assert "attention check (benchmarks/attention_check.py)" in results
    for f in [work / "RESULTS.md", *(figures / "gpu_plan").rglob("*")]:  # assembled: no machine path
        if f.is_file() and f.suffix in gpu_assemble.SCRUBBED:
            assert not [line for line in f.read_text().splitlines() if MACHINE_PATH.search(line)], f


def test_readme_is_the_budget():
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    for r in gpu_plan.budget_table(PRESETS["gpu"]):
        assert re.search(rf"\| `{r['stage']}` \|[^\n]*\| {r['seconds']} \| {r['job']} \|", readme), r
    for line in gpu_plan.job_commands().splitlines()[1:2]:  # the command of each job
        assert line.strip() in readme, line
