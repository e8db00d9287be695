"""Runs that survive what users do to them: a SIGKILL halfway through writing a checkpoint or a metrics record,
followed by a rerun that ends bit-identical to an uninterrupted run; and a second process on a busy run, refused
at once (exit status 2, one line) without touching the first's record. Full disks: nbs/02a_runs.ipynb; damaged
caches: tests/test_faults_data.py."""
import io
import json
import os
import subprocess
import sys
import time
from contextlib import redirect_stderr
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _train_common import small_config, small_data  # noqa: E402

from depthnb.runs import load_model, read_metrics  # noqa: E402
from depthnb.train import cli_pretrain, pretrain  # noqa: E402

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
def test_sigkill_halfway_through_a_write_then_rerun_is_bit_identical(fault, reference, tmp_path):
    run = tmp_path / "run"
    killed = subprocess.run([sys.executable, str(SCRIPT), str(run), "--kill-in", fault], env=ENV, capture_output=True)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert not (run / "DONE").exists()
    subprocess.run([sys.executable, str(SCRIPT), str(run)], env=ENV, check=True, capture_output=True)
    assert identical_weights(run, reference)
    steps = read_metrics(run, "train").step.tolist()
    assert steps == sorted(set(steps)) == read_metrics(reference, "train").step.tolist()
    assert not list(run.rglob(".*.tmp*")), "temporary files left behind"


def test_second_process_on_a_busy_run_is_refused(tmp_path):
    "Two `depthnb pretrain` on one run: the second exits 2 with one line naming the first; every step logged once."
    args = ["pretrain", "--preset", "tiny", "--layers", "1", "--seeds", "0", "--no-progress",
            "--set", f"runs_dir={tmp_path}", "--set", "pretrain.steps=300", "--set", "pretrain.compile=false"]
    run = tmp_path / "tiny" / "pretrain" / "tiny" / "L1_s0"
    first = subprocess.Popen([sys.executable, "-c", "import sys; from depthnb.cli import main; sys.exit(main())", *args],
                             env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(1200):  # until the first process holds the run
            if (run / ".lock").exists() and (run / ".lock").read_text().startswith("process"):
                break
            time.sleep(0.1)
        before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
        err = io.StringIO()
        with redirect_stderr(err):
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
