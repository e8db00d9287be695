"""Pretraining runs: loss falls, exact resume after SIGKILL, corrupt-checkpoint fallback, config refusal,
NaN stop, and 2-process data parallelism equal to 1 process (CPU, gloo)."""
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _train_common import Crash, DataHook, assert_resumed_like, resumed_from, small_config, small_data  # noqa: E402

from depthnb.model import DecoderLM  # noqa: E402
from depthnb.runs import ConfigMismatchError, is_done, latest_checkpoint, load_model, read_metrics  # noqa: E402
from depthnb.loop import NonFiniteLossError  # noqa: E402
from depthnb.train import pretrain  # noqa: E402

SCRIPT = Path(__file__).parent / "_pretrain_script.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def data():
    return small_data()


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    "An uninterrupted run of `small_config()` in this process (one thread, like the subprocesses)."
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("reference")
    pretrain(small_config(), run, data=data, progress=False)
    return run


def assert_same_weights(a: DecoderLM, b: DecoderLM, exact: bool = True, atol: float = 0.0):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        if exact:
            assert torch.equal(sa[k], sb[k]), f"{k} differs"
        else:
            torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=atol, msg=f"{k} differs")


def test_loss_falls_and_run_store(reference):
    train = read_metrics(reference, "train")
    assert train.step.tolist() == list(range(5, 41, 5))
    assert train.loss.iloc[-1] < train.loss.iloc[0] - 0.5, train.loss.tolist()
    assert math.isclose(train.loss.iloc[0], math.log(512), abs_tol=0.5)  # starts near uniform over the vocabulary
    ev = read_metrics(reference, "eval")
    assert set(ev.split) == {"enwiki_valid"} and ev.ppl.iloc[-1] < ev.ppl.iloc[0]
    snaps = read_metrics(reference, "snapshot")
    assert snaps.step.tolist() == [4, 13, 40]  # log-spaced from the end of warm-up
    assert all((reference / p).exists() for p in snaps.path)
    assert sorted(p.name for p in (reference / "checkpoints").glob("*.pt")) == ["step_00000030.pt", "step_00000040.pt"]
    assert is_done(reference) and (reference / "final.pt").exists()
    assert train.tokens.iloc[-1] == 40 * 8 * 32 and train.mfu.isna().all() and (train.tokens_per_s > 0).all()
    # a finished run is a no-op that says so
    msgs = []
    pretrain(small_config(), reference, data=None, progress=False, log=msgs.append)
    assert "finished already" in msgs[0]


@pytest.mark.slow  # trains in two subprocesses (about 8 s)
def test_resume_after_sigkill_is_bit_identical(reference, tmp_path):
    run = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(run), "--sleep", "0.05"], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while not list((run / "checkpoints").glob("*.sha256")):
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.time() < deadline, "no checkpoint within 120 s"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and not is_done(run)
    step = latest_checkpoint(run)[1]["step"]
    assert 10 <= step < 40
    out = subprocess.run([sys.executable, str(SCRIPT), str(run)], env=ENV, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"resuming from step_{step:08d}.pt" in out.stdout
    assert_same_weights(load_model(run), load_model(reference))
    # the rerun trained from the checkpoint's step on, and logged every step once, with the same train and eval
    # records and the same snapshots as the uninterrupted run
    assert_resumed_like(run, reference, at=[step])


def test_corrupt_newest_checkpoint_is_skipped(data, reference, tmp_path):
    run = tmp_path / "crashed"
    with pytest.raises(Crash):
        pretrain(small_config(), run, data=DataHook(data, crash_at=25), progress=False)
    newest = run / "checkpoints" / "step_00000020.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated
    msgs = []
    with pytest.warns(UserWarning, match="SHA-256 mismatch"):
        pretrain(small_config(), run, data=data, progress=False, log=msgs.append)
    assert any("step_00000020.pt" in m and "mismatch" in m for m in msgs)
    assert any("resuming from step_00000010.pt" in m for m in msgs)
    assert_same_weights(load_model(run), load_model(reference))
    assert_resumed_like(run, reference, at=[10])


def noisy_model(config, p: float = 0.1) -> DecoderLM:
    """`config`'s initial model (seeded as `pretrain` seeds it) with dropout on its embeddings in training: the mask
    from torch's global generator, its rate from Python's (`random`), so every step draws from both; both seeded here."""
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    model = DecoderLM(config.model)

    def dropout(module, args, out):
        return torch.nn.functional.dropout(out, p * (0.5 + random.random()), training=True) if module.training else out
    model.embed.register_forward_hook(dropout)
    return model


def test_resume_restores_every_random_generator(data, reference, tmp_path):
    """A run that draws from the global generators at every step resumes exactly only if its checkpoint restores them:
    interrupted at step 25, rerun from the step-20 checkpoint (the process's generators elsewhere by then)."""
    torch.set_num_threads(1)
    cfg = small_config()
    pretrain(cfg, tmp_path / "whole", init_model=noisy_model(cfg), data=data, progress=False, log=lambda *a: None)
    # dropout does change the run: the noisy and the plain run part ways
    assert read_metrics(tmp_path / "whole", "train").loss.tolist() != read_metrics(reference, "train").loss.tolist()
    run = tmp_path / "resumed"
    with pytest.raises(Crash):
        pretrain(cfg, run, init_model=noisy_model(cfg), data=DataHook(data, crash_at=25), progress=False,
                 log=lambda *a: None)
    # the rerun's model is built and both generators seeded afresh: only the checkpoint has their states at step 20
    pretrain(cfg, run, init_model=noisy_model(cfg), data=data, progress=False, log=lambda *a: None)
    assert_same_weights(load_model(run), load_model(tmp_path / "whole"))
    assert_resumed_like(run, tmp_path / "whole", at=[20])


def test_config_mismatch_is_refused(reference, data):
    with pytest.raises(ConfigMismatchError) as e:
        pretrain(small_config(lr=1e-3, batch_size=16), reference, data=data, progress=False)
    assert "config.lr 0.003 -> 0.001" in str(e.value) and "config.batch_size 8 -> 16" in str(e.value)
    assert str(e.value).startswith("run ") and "--name" in str(e.value).splitlines()[0]


def test_nan_loss_stops_the_run_and_keeps_the_last_checkpoint(data, tmp_path):
    cfg = small_config(ckpt_every=5)
    torch.manual_seed(cfg.seed)
    model = DecoderLM(cfg.model)
    forward, calls = model.forward, {"n": 0}

    def poisoned(idx, targets=None, **kw):  # training step 13 gets a NaN loss
        logits, loss = forward(idx, targets, **kw)
        if model.training:
            calls["n"] += 1
            if calls["n"] == 13:
                loss = loss * float("nan")
        return logits, loss

    model.forward = poisoned
    run = tmp_path / "nan"
    with pytest.raises(NonFiniteLossError, match="non-finite loss at step 13") as e:
        pretrain(cfg, run, init_model=model, data=data, progress=False)
    assert "last checkpoint (step 10)" in str(e.value)
    path, state = latest_checkpoint(run)
    assert path.name == "step_00000010.pt" and not is_done(run)
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    assert read_metrics(run, "train").step.max() == 10


@pytest.mark.slow  # torchrun (about 9 s)
def test_two_process_ddp_matches_one_process(reference, tmp_path):
    run = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT), str(run)]
    out = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    one, two = read_metrics(reference, "train"), read_metrics(run, "train")
    assert one.step.tolist() == two.step.tolist()
    torch.testing.assert_close(torch.tensor(two.loss.values), torch.tensor(one.loss.values), rtol=1e-5, atol=1e-5)
    e1, e2 = read_metrics(reference, "eval"), read_metrics(run, "eval")
    torch.testing.assert_close(torch.tensor(e2.loss.values), torch.tensor(e1.loss.values), rtol=1e-5, atol=1e-5)
    assert_same_weights(load_model(run), load_model(reference), exact=False, atol=1e-4)


def test_stages_continue_one_schedule(reference, data, tmp_path):
    "MIDAS's use: train [0, 20) in one directory, hand model and optimizer state to [20, 40) in another."
    cfg = small_config()
    first = pretrain(cfg, tmp_path / "stage1", stop_step=20, data=data, progress=False)
    _, state = latest_checkpoint(tmp_path / "stage1")
    assert state["step"] == 20 and is_done(tmp_path / "stage1")
    second = pretrain(cfg, tmp_path / "stage2", init_model=first, init_optimizer_state=state["optimizer"],
                      start_step=20, data=data, progress=False)
    assert_same_weights(second, load_model(reference))
    assert read_metrics(tmp_path / "stage2", "train").step.tolist() == [25, 30, 35, 40]
    assert resumed_from(tmp_path / "stage2") == []  # a stage starts from what it is handed, not from a checkpoint
    with pytest.raises(ValueError, match="init_model's config differs"):
        pretrain(small_config(), tmp_path / "stage3", init_model=DecoderLM(small_config(**{"model.n_layers": 3}).model),
                 start_step=20, data=data, progress=False)


def test_activation_checkpointing_trains_the_same_model(reference, data, tmp_path):
    "Recomputing each layer in backward changes memory, not the arithmetic: the same losses and weights."
    run = tmp_path / "ac"
    pretrain(small_config(activation_checkpointing=True), run, data=data, progress=False)
    assert read_metrics(run, "train").loss.tolist() == read_metrics(reference, "train").loss.tolist()
    assert_same_weights(load_model(run), load_model(reference))


def numpy_draws(n: int = 4) -> list[float]:
    "The next `n` numbers of NumPy's global generator (uniform, then normal: both parts of its state)."
    import numpy as np

    return np.random.random(n).tolist() + np.random.standard_normal(n).tolist()


def test_rng_state_restores_numpy_through_a_checkpoint(tmp_path):
    "NumPy's global generator is saved with the others, survives a weights-only checkpoint load, and is restored."
    import numpy as np

    from depthnb.runs import load_verified, rng_state, save_verified, set_rng_state

    np.random.seed(3)
    np.random.standard_normal()  # leaves a cached Gaussian in the state
    state = load_verified(save_verified({"rng": rng_state()}, tmp_path / "rng.pt"))["rng"]
    expected = numpy_draws()
    np.random.seed(4)  # elsewhere, as a rerun's process would be
    set_rng_state(state)
    assert numpy_draws() == expected


def numpy_noisy_model(config, p: float = 0.1) -> DecoderLM:
    "`noisy_model` with the dropout rate drawn from NumPy's global generator (seeded here) instead of Python's."
    import numpy as np

    torch.manual_seed(config.seed)
    np.random.seed(config.seed)
    model = DecoderLM(config.model)

    def dropout(module, args, out):
        if not module.training:
            return out
        return torch.nn.functional.dropout(out, p * (0.5 + np.random.random()), training=True)
    model.embed.register_forward_hook(dropout)
    return model


def test_resume_restores_numpys_generator(data, tmp_path):
    "A run drawing from NumPy's global generator at every step resumes exactly from the step-20 checkpoint."
    torch.set_num_threads(1)
    cfg = small_config()
    quiet = dict(progress=False, log=lambda *a: None)
    pretrain(cfg, tmp_path / "whole", init_model=numpy_noisy_model(cfg), data=data, **quiet)
    run = tmp_path / "resumed"
    with pytest.raises(Crash):
        pretrain(cfg, run, init_model=numpy_noisy_model(cfg), data=DataHook(data, crash_at=25), **quiet)
    # NumPy reseeded by the rerun's model: only the checkpoint knows its state at step 20
    pretrain(cfg, run, init_model=numpy_noisy_model(cfg), data=data, **quiet)
    assert_same_weights(load_model(run), load_model(tmp_path / "whole"))
    assert_resumed_like(run, tmp_path / "whole", at=[20])


def test_checkpoint_rotation_removes_each_old_file_and_its_checksum(tmp_path):
    "Rotation keeps the newest `keep` checkpoints with their checksums, even past one whose checksum was never written."
    from depthnb.runs import save_checkpoint

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step_00000001.pt").write_bytes(b"cut short before its checksum")
    for step in (2, 3, 4):
        save_checkpoint(tmp_path, dict(step=step), keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step_00000003.pt", "step_00000003.pt.sha256", "step_00000004.pt", "step_00000004.pt.sha256"]


def test_resume_returns_the_checkpoints_step_and_seconds(tmp_path):
    "`resume` at the edges of a call's steps, with and without the recorded training seconds; a step outside refused."
    from depthnb.runs import rng_state, save_checkpoint
    from depthnb.loop import LoopSchedule, resume

    model = DecoderLM(small_config().model)
    optimizer = torch.optim.AdamW(model.parameters())
    schedule = LoopSchedule(begin=10, stop=30, steps=30, lr=1e-3, warmup_steps=0, min_lr_ratio=1.0, log_every=5,
                            eval_every=10, ckpt_every=10)
    quiet = lambda *a: None  # noqa: E731
    assert resume(tmp_path / "empty", model, optimizer, schedule, say=quiet) == (None, 0.0)

    def checkpoint(run, step, **extra):
        save_checkpoint(run, dict(step=step, rng=rng_state(), model=model.state_dict(),
                                  optimizer=optimizer.state_dict(), **extra))
        return run
    begin = checkpoint(tmp_path / "begin", 10, elapsed_s=12.5)
    assert resume(begin, model, optimizer, schedule, say=quiet) == (10, 12.5)
    assert resume(checkpoint(tmp_path / "stop", 30), model, optimizer, schedule, say=quiet) == (30, 0.0)
    with pytest.raises(ValueError, match=r"step_00000040\.pt is at step 40, outside this call's steps \[10, 30\]"):
        resume(checkpoint(tmp_path / "after", 40), model, optimizer, schedule, say=quiet)


def test_sha256_file_of_bytes_and_of_gunzipped_content(tmp_path):
    import gzip
    import hashlib

    from depthnb.runs import sha256_file

    content = b"depthnb\n" * 1000
    (tmp_path / "plain").write_bytes(content)
    (tmp_path / "packed.gz").write_bytes(gzip.compress(content))
    assert sha256_file(tmp_path / "plain") == hashlib.sha256(content).hexdigest()
    assert sha256_file(tmp_path / "packed.gz", decompress=True) == hashlib.sha256(content).hexdigest()
    packed = (tmp_path / "packed.gz").read_bytes()
    assert sha256_file(tmp_path / "packed.gz") == hashlib.sha256(packed).hexdigest()  # the file's own bytes


class NotAWeight:
    "An object a weights-only load refuses: checkpoints carry tensors, numbers, strings and containers only."


def test_verified_files_refuse_what_cannot_be_trusted(tmp_path, monkeypatch):
    "A new run folder is created; a missing checksum, a pickled object and a full disk each give one clear error."
    import errno

    from depthnb import runs
    from depthnb.runs import CheckpointError, DiskFullError, atomic_write, load_verified, save_verified

    path = save_verified(dict(step=1), tmp_path / "new" / "run" / "state.pt")  # folders that do not exist yet
    assert load_verified(path) == dict(step=1)
    path.with_name("state.pt.sha256").unlink()
    with pytest.raises(CheckpointError, match=r"state\.pt: no state\.pt\.sha256 beside it \(the write did not "):
        load_verified(path)
    assert load_verified(path, require_checksum=False) == dict(step=1)
    with pytest.raises(CheckpointError, match=r"object\.pt: unreadable \(UnpicklingError: "):
        load_verified(save_verified(dict(x=NotAWeight()), tmp_path / "object.pt"))

    def full(f):
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(DiskFullError, match=r"full\.pt: no space left on device while writing it \([\d,.]+ MiB free\); "
                                            r"free some space and run again"):
        atomic_write(tmp_path / "full.pt", full)
    assert not list(tmp_path.glob("*full.pt*"))  # no temporary file left behind
    monkeypatch.setattr(runs, "free_space", lambda folder: 10)
    with pytest.raises(DiskFullError, match=r"writing tight\.pt needs [\d.]+ MiB, but only 0\.0 MiB is free there"):
        save_verified(dict(step=1), tmp_path / "tight.pt")
