"""Runs that survive what users do to them: a SIGKILL halfway through writing a checkpoint or a metrics record,
followed by a rerun that ends bit-identical to an uninterrupted run; and a second process on a busy run, refused
at once (exit status 2, one line) without touching the first's record; `depthnb reproduce` killed with its
kernel and workers in the middle of a training notebook, then rerun. Full disks: nbs/01_model/03_runs.ipynb; damaged
caches: tests/test_faults_data.py."""
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _train_common import assert_resumed_like, small_config, small_data  # noqa: E402

from depthnb.runs import latest_checkpoint, load_model, read_metrics  # noqa: E402
from depthnb.cli.pretrain import cli_pretrain  # noqa: E402
from depthnb.train import pretrain  # noqa: E402

SCRIPT = Path(__file__).parent / "_pretrain_script.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    "An uninterrupted run of `small_config()` (one thread, like the subprocesses)."
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("reference")
    pretrain(small_config(), run, data=small_data(), progress=False, log=lambda *a: None)
    return run


def identical_weights(a: Path, b: Path) -> bool:
    sa, sb = load_model(a).state_dict(), load_model(b).state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("fault", ["checkpoint", "metrics"])
@pytest.mark.slow  # trains in two subprocesses (9-13 s)
def test_sigkill_halfway_through_a_write_then_rerun_is_bit_identical(fault, reference, tmp_path):
    run = tmp_path / "run"
    killed = subprocess.run([sys.executable, str(SCRIPT), str(run), "--kill-in", fault], env=ENV, capture_output=True)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert not (run / "DONE").exists()
    # killed writing the step-20 checkpoint: the step-10 one is the newest good one; killed writing the step-25
    # record: the step-20 checkpoint is
    kept = {"checkpoint": 10, "metrics": 20}[fault]
    assert latest_checkpoint(run)[1]["step"] == kept
    subprocess.run([sys.executable, str(SCRIPT), str(run)], env=ENV, check=True, capture_output=True)
    assert identical_weights(run, reference)
    steps = read_metrics(run, "train").step.tolist()
    assert steps == sorted(set(steps)) == read_metrics(reference, "train").step.tolist()
    assert_resumed_like(run, reference, at=[kept])  # trained on from there, and wrote what the reference wrote
    assert not list(run.rglob(".*.tmp*")), "temporary files left behind"


@pytest.mark.slow  # a 300-step run in a subprocess (about 65 s)
def test_second_process_on_a_busy_run_is_refused(tmp_path):
    "Two `depthnb pretrain` on one run: the second exits 2 with one line naming the first; every step logged once."
    args = ["pretrain", "--preset", "tiny", "--layers", "1", "--seeds", "0", "--no-progress",
            "--set", f"runs_dir={tmp_path}", "--set", "pretrain.steps=300", "--set", "pretrain.compile=false"]
    run = tmp_path / "tiny" / "pretrain" / "tiny" / "L1_s0"
    first = subprocess.Popen([sys.executable, "-c", "import sys; from depthnb.cli import main; sys.exit(main())", *args],
                             env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(1200):  # until the first process holds the run and has written its config
            if (run / ".lock").exists() and (run / ".lock").read_text().startswith("process") \
                    and (run / "config.json").exists():
                break
            time.sleep(0.1)
        # the files a second process would overwrite first; the first process goes on writing its metrics and
        # checkpoints (and their temporary files) meanwhile, so those cannot tell the two apart
        before = {p: p.stat().st_mtime_ns for p in (run / ".lock", run / "config.json")}
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = cli_pretrain(args[1:])
        assert first.poll() is None, "the first process finished before the second started: give it more steps"
        assert code == 2
        assert err.getvalue() == f"depthnb pretrain: error: {run} is in use by process {first.pid} (started " \
            + err.getvalue().split("(started ", 1)[1], err.getvalue()
        assert err.getvalue().count("\n") == 1
        assert before == {p: p.stat().st_mtime_ns for p in before}, "the refused process wrote into the run"
    finally:
        assert first.wait(600) == 0, first.stderr.read().decode()[-2000:]
    steps = read_metrics(run, "train").step.tolist()
    assert steps == sorted(set(steps)), "every step once"
    assert json.loads((run / "DONE").read_text())["step"] == 300


def _process_tree(root: int) -> list[int]:
    "`root` and every process below it (from /proc: the kernel and workers that `reproduce` starts)."
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += [p for p, parent in parents.items() if parent == pid]
    return tree


REPRODUCE = ["--preset", "tiny", "--only", "petty_pretrain", "--seeds", "1", "--set", "pretrain.steps=40",
             "--set", "pretrain.ckpt_every=10", "--set", "depths={'tiny': (1, 2)}"]


def _reproduce(runs: Path, figures: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import sys; from depthnb.cli import main; sys.exit(main())",
                             "reproduce", *REPRODUCE, "--runs-dir", str(runs), "--figures-dir", str(figures)],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find the kernel and its workers")
def test_reproduce_killed_in_a_notebook_then_rerun_is_bit_identical(tmp_path):
    reference = _reproduce(tmp_path / "ref_runs", tmp_path / "ref_figures")
    assert reference.wait(900) == 0, reference.stderr.read().decode()[-3000:]
    runs = tmp_path / "runs"
    killed = _reproduce(runs, tmp_path / "figures")
    def complete(ckpt):  # written in full: its checksum is written after it
        return Path(f"{ckpt}.sha256").exists()

    for _ in range(6000):  # until a pretraining run of the notebook has a complete checkpoint, and is not done
        if any(complete(ckpt) and not (ckpt.parent.parent / "DONE").exists()
               for ckpt in runs.glob("tiny/pretrain/*/*/checkpoints/*.pt")):
            break
        assert killed.poll() is None, killed.stderr.read().decode()[-3000:]
        time.sleep(0.1)
    for pid in _process_tree(killed.pid):  # the whole tree at once, as a power cut would
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    killed.wait()
    interrupted = {ckpt.parent.parent: None for ckpt in runs.glob("tiny/pretrain/*/*/checkpoints/*.pt")
                   if complete(ckpt) and not (ckpt.parent.parent / "DONE").exists()}
    interrupted = {run: latest_checkpoint(run)[1]["step"] for run in interrupted}
    assert interrupted, "no pretraining run was interrupted after a checkpoint"
    rerun = _reproduce(runs, tmp_path / "figures")
    assert rerun.wait(900) == 0, rerun.stderr.read().decode()[-3000:]
    finals = sorted(p.relative_to(tmp_path / "ref_runs") for p in (tmp_path / "ref_runs").rglob("pretrain/*/*/final.pt"))
    assert len(finals) == 2
    for final in finals:
        assert identical_weights(tmp_path / "ref_runs" / final, runs / final), final
    for run, step in interrupted.items():  # each interrupted run went on from its newest good checkpoint
        assert_resumed_like(run, tmp_path / "ref_runs" / run.relative_to(runs), at=[step])
