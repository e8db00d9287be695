"""Bring your own benchmark: a folder of real TSV files and a local `hf:` dataset go through
`depthnb pretrain` -> `depthnb finetune --tasks` -> `depthnb evaluate` at a shrunken `tiny` preset, with
per-category accuracy in the results; a malformed line is refused as FILE:LINE before anything is written."""
import json
import os

import datasets
import pytest

from depthnb import sources as S
from depthnb import tasks as T
from depthnb.cli import main
from depthnb.evaluation import evaluate_run

SMALL = ["--preset", "tiny", "--layers", "2", "--seeds", "0", "--no-progress"] + [
    a for kv in ("pretrain.steps=4", "pretrain.warmup_steps=1", "pretrain.eval_every=4", "pretrain.log_every=2",
                 "pretrain.ckpt_every=4", "pretrain.n_snapshots=1", "pretrain.eval_sequences=4", "finetune.steps=4",
                 "finetune.warmup_steps=1", "finetune.eval_every=2", "finetune.n_snapshots=1",
                 "finetune.eval_examples=16", "finetune.gen_limit=40", "finetune.max_new_tokens=24")
    for a in ("--set", kv)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    "A working directory with a pretrained tiny model, a COGS-made task folder and a COGS-made saved dataset."
    root = tmp_path_factory.mktemp("byob")
    folder = root / "cogs_mine"  # train: the real COGS dev split; gen: every 70th line of the real gen split
    folder.mkdir()
    (folder / "train.tsv").write_bytes(S.data_path("cogs/dev.tsv").read_bytes())
    gen = S.data_path("cogs/gen.tsv").read_text().split("\n")[:-1]
    (folder / "gen.tsv").write_text("\n".join(gen[::70]) + "\n")
    rows = T.read_tsv(S.data_path("cogs/test.tsv"))
    def split(part):
        return datasets.Dataset.from_dict({"sentence": [r[0] for r in part], "lf": [r[1] for r in part]})

    datasets.DatasetDict({"train": split(rows[:2500]), "test": split(rows[2500:])}).save_to_disk(str(root / "cogs_saved"))
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert main(["pretrain", *SMALL]) == 0
    finally:
        os.chdir(cwd)
    return root


@pytest.mark.slow
def test_folder_and_hf_tasks_through_finetune_and_evaluate(workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    hf = f"hf:{workdir / 'cogs_saved'}:input=sentence:target=lf"
    assert main(["finetune", *SMALL, "--tasks", f"cogs_mine,{hf}"]) == 0
    out, err = capsys.readouterr()
    assert "cogs_mine: coverage by the 2,048-piece tokenizer" in out and "cogs_saved: coverage" in out
    runs = workdir / "runs/tiny/finetune/tiny/L2_s0"
    assert sorted(p.name for p in runs.iterdir()) == ["cogs_mine", "cogs_saved"]
    gen = json.loads((runs / "cogs_mine/eval/gen.json").read_text())
    subset = [json.loads(line) for line in open(runs / "cogs_mine/eval/gen.predictions.jsonl")]
    assert gen["n"] == 40 and gen["in_distribution_split"] == T.HELD_OUT_SPLIT
    assert {c: v["n"] for c, v in gen["by_category"].items()} == {
        c: sum(r["category"] == c for r in subset) for c in {r["category"] for r in subset}}
    assert len(gen["by_category"]) > 5 and "runs/tiny/finetune/tiny/L2_s0/cogs_mine: gen accuracy" in out
    assert "\n  " + next(iter(gen["by_category"])) + ": " in out  # the per-category lines
    assert json.loads((runs / "cogs_saved/eval/test.json").read_text())["task_source"] == T.parse_task(hf).spec
    assert json.loads((runs / "cogs_mine/task.json").read_text())["task_source"] == str(workdir / "cogs_mine")

    assert main(["evaluate", *SMALL, "--tasks", "cogs_mine", "--split", T.HELD_OUT_SPLIT]) == 0
    held = json.loads((runs / f"cogs_mine/eval/{T.HELD_OUT_SPLIT}.json").read_text())
    assert held["n"] == 16 and held["in_distribution_from"].startswith("a fixed held-out slice of train (300 examples")
    monkeypatch.chdir(workdir.parent)  # a run finds its task from anywhere
    assert evaluate_run(runs / "cogs_mine", "gen", limit=8, overwrite=True)["n"] == 8


def test_malformed_line_is_refused_before_anything_is_written(workdir, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "cogs_broken"
    folder.mkdir()
    lines = (workdir / "cogs_mine/train.tsv").read_text().split("\n")
    (folder / "train.tsv").write_text("\n".join(lines[:1233] + [lines[1233].split("\t")[0]] + lines[1234:]))
    (folder / "gen.tsv").write_text((workdir / "cogs_mine/gen.tsv").read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["finetune", *SMALL, "--tasks", "cogs_broken"]) == 2
    err = capsys.readouterr().err
    assert err == (f"depthnb finetune: error: {folder.relative_to(tmp_path)}/train.tsv:1234: expected 3 tab-separated columns (input, target, "
                   f"category) as on line 1, found 1: {lines[1233].split(chr(9))[0][:80]!r}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cogs_broken"]
    (folder / "train.tsv").unlink()
    assert main(["evaluate", *SMALL, "--tasks", "cogs_broken"]) == 2
    assert "cogs_broken/train.tsv: no such file" in capsys.readouterr().err
