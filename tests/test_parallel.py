"""Sharded training on 2 CPU processes (gloo, tiny shapes): FSDP2 matches 1-process training step for step, with band
attention too; a
sharded checkpoint written at 2 processes resumes at 2 bit-identically to an uninterrupted run, and at 1 process
bit-identically to a 1-process run resumed from the same state; MIDAS and GradStack growth under FSDP equal growth
without it; a SIGKILL during a sharded save leaves the previous checkpoint usable. The FSDP side runs in
tests/_parallel_script.py under torchrun."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _parallel_script import BAND_RUN, run_config, stack_run_config  # noqa: E402
from _train_common import CUDA_TEST_DATA, assert_resumed_like, records, resumed_from, small_data  # noqa: E402

from depthnb.config import StackConfig  # noqa: E402
from depthnb.model import BandMask, DecoderLM, layer_mask  # noqa: E402
from depthnb.optim import make_optimizer  # noqa: E402
from depthnb.parallel import FullCheckpoints, ShardedCheckpoints  # noqa: E402
from depthnb.runs import load_model, read_metrics  # noqa: E402
from depthnb.stacking import stack_train  # noqa: E402
from depthnb.train import pretrain  # noqa: E402

SCRIPT = Path(__file__).parent / "_parallel_script.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
QUIET = dict(progress=False, log=lambda *a: None)

pytestmark = pytest.mark.slow  # every test launches torchrun (about 5 s each)


def torchrun(nproc: int, *args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone",
           str(SCRIPT), *map(str, args)]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers
        out, _ = proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def check(result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def weights(run: Path) -> dict:
    return load_model(run).state_dict()


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    "2-process FSDP runs: uninterrupted, and interrupted after the checkpoint at step 8."
    root = tmp_path_factory.mktemp("fsdp")
    check(torchrun(2, "train", root / "full"))
    check(torchrun(2, "train", root / "crashed", "--crash-at", 9))
    return root


def test_fsdp_matches_single_process_step_for_step(runs, tmp_path):
    torch.set_num_threads(1)
    pretrain(run_config("ddp"), tmp_path / "single", data=small_data(), **QUIET)
    fsdp, single = read_metrics(runs / "full", "train"), read_metrics(tmp_path / "single", "train")
    assert fsdp.step.tolist() == single.step.tolist() == list(range(1, 13))
    assert fsdp.loss.tolist() == pytest.approx(single.loss.tolist(), rel=1e-5)
    assert max_diff(weights(runs / "full"), weights(tmp_path / "single")) < 1e-5


def test_band_attention_under_fsdp_matches_single_process(tmp_path):
    "Band attention under FSDP2: the band step's gradient of the bias table reaches the sharded table as without FSDP."
    config = run_config("ddp", **BAND_RUN)
    pos = torch.arange(config.model.n_ctx)
    assert isinstance(layer_mask(DecoderLM(config.model), pos, pos), BandMask)  # the band path, not the dense one
    check(torchrun(2, "train", tmp_path / "fsdp", "--band"))
    torch.set_num_threads(1)
    pretrain(config, tmp_path / "single", data=small_data(), **QUIET)
    fsdp, single = read_metrics(tmp_path / "fsdp", "train"), read_metrics(tmp_path / "single", "train")
    assert fsdp.loss.tolist() == pytest.approx(single.loss.tolist(), rel=1e-5)
    assert max_diff(weights(tmp_path / "fsdp"), weights(tmp_path / "single")) < 1e-5


def test_resume_at_two_processes_is_bit_identical(runs, tmp_path):
    run = tmp_path / "resumed"
    shutil.copytree(runs / "crashed", run)
    assert [p.name for p in ShardedCheckpoints.checkpoints(run)] == ["step_00000008.dcp", "step_00000004.dcp"]
    check(torchrun(2, "train", run))
    assert max_diff(weights(run), weights(runs / "full")) == 0
    assert_resumed_like(run, runs / "full", at=[8])


def test_resume_at_one_process_is_bit_identical(runs, tmp_path):
    "At 1 process: the same final weights as a 1-process run (no FSDP) resumed from the checkpoint's state."
    run = tmp_path / "resumed"
    shutil.copytree(runs / "crashed", run)
    check(torchrun(1, "train", run))
    torch.set_num_threads(1)
    config = run_config("ddp")
    model = DecoderLM(config.model)
    optimizer = make_optimizer(model, config.optimizer, config.lr)
    meta = ShardedCheckpoints().load(runs / "crashed", model, optimizer)  # read without any process group
    assert meta["step"] == 8
    reference = tmp_path / "reference"
    FullCheckpoints().save(reference, model, optimizer, {k: v for k, v in meta.items() if k != "path"})
    pretrain(config, reference, data=small_data(), **QUIET)
    assert max_diff(weights(run), weights(reference)) == 0
    assert max_diff(weights(run), weights(runs / "full")) < 1e-5  # and close to the 2-process run
    # both went on from step 8 and wrote the same records and snapshots after it
    assert resumed_from(run) == resumed_from(reference) == [8]
    after = lambda d: [r for r in records(d) if r["step"] > 8]
    assert after(run) == after(reference) and any(r["kind"] == "snapshot" for r in after(run))
    for r in after(run):
        if r["kind"] == "snapshot":
            assert max_diff(weights(run / r["path"]), weights(reference / r["path"])) == 0, r["path"]


def test_growth_under_fsdp_equals_growth_without_it(tmp_path):
    "Bit for bit through a sharded checkpoint; and a whole MIDAS run at 2 processes against 1 without FSDP."
    check(torchrun(2, "grow", tmp_path / "grow.json"))
    for method, r in json.loads((tmp_path / "grow.json").read_text()).items():
        assert r == dict(layers=4, model=True, optimizer=True, optimizer_entries=120), method
    check(torchrun(2, "stack", tmp_path / "fsdp"))
    torch.set_num_threads(1)
    stack_train(stack_run_config("ddp"), StackConfig(method="midas", block_size=1), tmp_path / "single",
                data=small_data(), **QUIET)
    stages = read_metrics(tmp_path / "fsdp", "stage")
    assert stages.n_layers.tolist() == [1, 2, 3]
    assert (read_metrics(tmp_path / "fsdp", "train").loss.tolist()
            == pytest.approx(read_metrics(tmp_path / "single", "train").loss.tolist(), rel=1e-5))
    assert max_diff(weights(tmp_path / "fsdp"), weights(tmp_path / "single")) < 1e-5


def test_sigkill_during_a_sharded_save_leaves_the_previous_checkpoint(runs, tmp_path):
    run = tmp_path / "killed"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
           str(SCRIPT), "train", str(run), "--hang-in-save", "12"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    markers = [tmp_path / f"saving.{rank}" for rank in (0, 1)]
    try:
        deadline = time.time() + 120
        while not all(m.exists() and m.read_text() for m in markers):
            assert proc.poll() is None and time.time() < deadline, "the run ended before its step-12 save"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun; its workers run in sessions of their own:
        for m in markers:
            if m.exists() and m.read_text():
                os.kill(int(m.read_text()), signal.SIGKILL)
        proc.wait()
    assert (run / "checkpoints" / "step_00000012.dcp.partial").is_dir()  # killed with every shard written
    assert not (run / "DONE").exists()
    path, meta = ShardedCheckpoints().latest(run)
    assert path.name == "step_00000008.dcp" and meta["step"] == 8
    check(torchrun(2, "train", run))  # resumes from step 8 and finishes as if never killed
    assert max_diff(weights(run), weights(runs / "full")) == 0
    assert_resumed_like(run, runs / "full", at=[8])
    assert not list((run / "checkpoints").glob("*.partial"))


@pytest.mark.gpu
def test_fsdp_bf16_on_cuda_trains_like_unsharded_bf16(tmp_path):
    """FSDP2 on one CUDA process (nccl, bf16 MixedPrecisionPolicy) trains like the unsharded model under bf16 autocast,
    within bf16 tolerance, and writes sharded checkpoints (the GPU plan's cuda-tests stage runs this, on the data it
    carries: no held-out set)."""
    cuda = dict(device="cuda", bf16=True, data=CUDA_TEST_DATA)
    pretrain(run_config("ddp", **cuda), tmp_path / "ddp", data=small_data(CUDA_TEST_DATA), **QUIET)
    pretrain(run_config("fsdp", **cuda), tmp_path / "fsdp", data=small_data(CUDA_TEST_DATA), **QUIET)
    unsharded, sharded = read_metrics(tmp_path / "ddp", "train"), read_metrics(tmp_path / "fsdp", "train")
    assert sharded.loss.tolist() == pytest.approx(unsharded.loss.tolist(), rel=2e-2)
    assert any((tmp_path / "fsdp" / "checkpoints").glob("step_*.dcp"))
