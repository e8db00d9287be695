"""Bad command lines get one line, `depthnb CMD: error: ...`, a non-zero exit (2: a bad argument), no traceback,
and write nothing: 13 command lines a new user might try, run through the console script's `main`."""
import pytest
import torch

from depthnb.cli import main

CASES = [
    ("pretrain --preset nosuch", "unknown preset 'nosuch'; presets: tiny, cpu, small, paper, gpu"),
    ("pretrain --set pretrain.lr=abc", "--set pretrain.lr=abc: cannot read 'abc' as a number"),
    ("pretrain --set pretrain.steps=-5", "PretrainConfig.steps=-5 is outside the allowed range"),
    ("pretrain --set nosuch.key=1", "unknown field 'nosuch' of Preset"),
    ("pretrain --layers 0", "--layers 0: 0 is out of range; allowed: integers ≥ 1"),
    ("pretrain --set pretrain.model.n_heads=3", "class 'tiny': n_heads=4"),
    ("reproduce --only nosuch", "unknown experiment 'nosuch'; experiments: petty_shapes"),
    ("reproduce --preset tiny --set tasks=cogz", "unknown task 'cogz'; tasks: cogs, cogs_vf"),
    ("bench --device cpu --layers -1", "--layers -1"),
    ("finetune --preset tiny --tasks nosuch", "unknown task 'nosuch'; tasks: cogs, cogs_vf, geoquery, passivization"),
    ("evaluate --split nosuch", "unknown split 'nosuch' of task cogs; splits: train, dev, test, gen"),
    ("stack --method nosuch", "unknown method 'nosuch'; methods: baseline, gradstack, midas, progressive, looped"),
    ("data --only nosuch", "unknown dataset 'nosuch'"),
    ("pretrain --threads 0", "--threads 0: out of range; allowed: integers ≥ 1"),
    ("reproduce --preset cpu --set experiments=nosuch", "unknown experiment 'nosuch'; experiments: petty_shapes"),
    ("reproduce --preset cpu --set parts=nosuch", "part 'nosuch' of preset 'cpu' is not a preset without parts"),
]
if not torch.cuda.is_available():
    CASES.append(("bench --device cuda", "CUDA is not available"))


@pytest.mark.parametrize("argv, message", CASES, ids=[c[0] for c in CASES])
def test_bad_command_line_gets_one_line(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a preset's runs/ and figures/ are relative to the working directory
    code = main(argv.split())
    out, err = capsys.readouterr()
    command = argv.split()[0]
    assert code == 2, (code, err)
    assert err.startswith(f"depthnb {command}: error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert "Traceback" not in out + err
    assert list(tmp_path.iterdir()) == [], "a refused command wrote something"


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match="unknown task 'nosuch'"):
        main(["finetune", "--tasks", "nosuch", "--debug"])


def test_other_ranks_leave_a_bad_argument_to_rank_0(monkeypatch, capsys):
    """Under torchrun every rank parses the same command line: each exits 2, and rank 0 alone prints the line."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main("stack --method nosuch".split()) == 2
    with pytest.raises(SystemExit) as e:  # argparse's own refusal
        main("stack --nosuch".split())
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert out + err == ""
    monkeypatch.setenv("RANK", "0")
    assert main("stack --method nosuch".split()) == 2
    assert capsys.readouterr().err.startswith("depthnb stack: error: unknown method 'nosuch'")


def _torchrun_stack(tmp_path, *args):
    import os
    import subprocess
    import sys
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "depthnb.cli",
           "stack", "--preset", "saunshi_tiny", "--method", "baseline", "--no-progress", "--set", f"runs_dir={tmp_path}",
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow  # about 20 s each: torchrun starts 2 processes that import torch
@pytest.mark.parametrize("case", ["run in use", "bad argument"])
def test_sharded_command_refused_on_every_rank(case, tmp_path):
    """A sharded command that is refused (a run in use, a bad argument) prints one line in all, from rank 0, and every
    rank that reaches the refusal exits 2: no rank is left in a collective. torchrun itself still exits 1 and prints its summary of the
    workers' exit codes: it does so for any worker exit code but 0."""
    import re
    from depthnb.config import override
    from depthnb.presets import PRESETS
    from depthnb.runs import run_lock
    from depthnb.runspecs import stack_run_dir

    run_dir = stack_run_dir(override(PRESETS["saunshi_tiny"], runs_dir=str(tmp_path)), "baseline", 0)
    if case == "run in use":
        with run_lock(run_dir):  # this test process holds the run
            proc = _torchrun_stack(tmp_path)
        expected = f"depthnb stack: error: {run_dir} is in use by process"
    else:
        proc = _torchrun_stack(tmp_path, "--set", "pretrain.steps=-5")
        expected = "depthnb stack: error: --set pretrain.steps=-5: PretrainConfig.steps=-5 is outside the allowed range"
    out = proc.stdout + proc.stderr
    ours = [line for line in out.splitlines() if line.startswith("depthnb ")]
    assert len(ours) == 1 and ours[0].startswith(expected), out[-3000:]
    codes = {int(r): int(c) for r, c in re.findall(r"rank\s+: (\d+) \(local_rank: \d+\)\n\s+exitcode\s+: (-?\d+)", out)}
    # rank 1 exits 2 too, unless torchrun stopped it (SIGTERM, -15) before it reached the refusal: torchrun stops the
    # other ranks as soon as one has exited, and a rank still starting up on a loaded machine has decided nothing yet
    assert codes[0] == 2 and codes[1] in (2, -15), out[-3000:]
    assert "gloo" not in out.lower() and "ChildFailedError" in out and proc.returncode == 1
