"""Bad command lines get one line, `depthnb CMD: error: ...`, a non-zero exit (2: a bad argument), no traceback,
and write nothing: the 13 command lines a new user tried (issue 16), run through the console script's `main`."""
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
