"""Your own benchmark through the whole reproduction: `depthnb reproduce` with a folder task (a few real COGS
rows in COGS's own TSV layout, 17 generalization categories) and with a local `hf:` dataset, offline, through every
experiment notebook that reads the preset's tasks, at a scale below `tiny`. The task must show in Table 1, the token
report, Figure 4, its per-category figure (a page wide) and table, the controls and the fidelity summary."""
import json
import sys
from pathlib import Path

import datasets
import pandas as pd
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from _train_common import REPRODUCE_OVERRIDES  # noqa: E402

from depthnb import sources as S  # noqa: E402
from depthnb import tasks as T  # noqa: E402
from depthnb.reproduce import reproduce  # noqa: E402

# Below `tiny` (tests/_train_common.py), scoring every generalization example of the task: 17 categories x 2 = 34,
# so gen_limit 40 where the shared settings score 20. The tasks are the test's own (`run`), and the primitives
# protocol stays the preset's: the notebooks it runs train no primitives.
OVERRIDES = {k: v for k, v in REPRODUCE_OVERRIDES.items() if k not in ("tasks",) and not k.startswith("primitives.")}
OVERRIDES["finetune.gen_limit"] = 40
# every experiment that reads the preset's tasks (petty_pretrain: the models they fine-tune; report: the summary)
READERS = ["petty_data", "petty_pretrain", "petty_finetune", "petty_equal_ppl", "petty_equal_loss", "report"]
N_CATEGORIES, PER_CATEGORY, N_TRAIN = 17, 2, 60


def real_cogs_rows() -> tuple[list[str], list[str]]:
    "Real COGS lines: the first N_TRAIN of train, and PER_CATEGORY of each of N_CATEGORIES generalization categories."
    train = S.data_path("cogs/train.tsv").read_text().split("\n")[:N_TRAIN]
    by_category: dict[str, list[str]] = {}
    for line in S.data_path("cogs/gen.tsv").read_text().split("\n"):
        if line:
            by_category.setdefault(line.split("\t")[2], []).append(line)
    gen = [line for c in sorted(by_category)[:N_CATEGORIES] for line in by_category[c][:PER_CATEGORY]]
    return train, gen


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    "A folder task `my_cogs` and a saved dataset `cogs_saved` (columns sentence, lf, kind), both of real COGS rows."
    root = tmp_path_factory.mktemp("own_reproduce")
    train, gen = real_cogs_rows()
    folder = root / "my_cogs"
    folder.mkdir()
    (folder / "train.tsv").write_text("\n".join(train) + "\n")
    (folder / "gen.tsv").write_text("\n".join(gen) + "\n")

    def split(lines):
        rows = [line.split("\t") for line in lines]
        return datasets.Dataset.from_dict({"sentence": [r[0] for r in rows], "lf": [r[1] for r in rows],
                                           "kind": [r[2] for r in rows]})

    datasets.DatasetDict({"train": split(train), "generalization": split(gen)}).save_to_disk(str(root / "cogs_saved"))
    return root


def run(root, task: str, figures: str, monkeypatch) -> tuple:
    "`reproduce` of the READERS with `task` as the preset's only task and the controls' task; offline."
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    overrides = dict(OVERRIDES, tasks=(task,), control_task=task)
    executed = reproduce("tiny", only=READERS, seeds=1, overrides=overrides, runs_dir=root / "runs",
                         figures_dir=root / figures, log=lambda *a: None)
    assert [p.stem for p in executed] == READERS
    return root / figures / "tiny", T.task_name(task)


def shows_task(out, name: str, first: dict, splits: set[str]) -> None:
    "Table 1, the token report, Figure 4, the controls and the fidelity summary name the task."
    t1 = pd.read_csv(out / "petty_table1.csv").set_index("dataset")
    assert t1.loc[name, ["x", "y"]].tolist() == [first["input"], first["target"]]
    report = pd.read_csv(out / "data_token_report.csv")
    assert set(report[report.task == name].split) == splits and report.round_trip_failures.sum() == 0
    acc = pd.read_csv(out / "finetune_accuracy.csv")
    assert sorted(acc[acc.task == name].n_layers) == [1, 2] and (acc.n == N_CATEGORIES * PER_CATEGORY).all()
    assert f"tiny {name}: " in (out / "petty_fig4_generalization.txt").read_text()  # the caption's best depth
    for control in ("petty_fig6_equal_perplexity_tiny", "petty_fig7_equal_loss_tiny"):
        assert name in (out / f"{control}.txt").read_text()
    fidelity = pd.read_csv(out / "fidelity.csv")
    depth = fidelity[fidelity.claim == "Deeper models generalize better compositionally"].iloc[0]
    assert f"tiny/{name}" in depth.evidence


def shows_categories(out, name: str) -> None:
    "The per-category figure wraps a page wide (four panels a row); its table has a row per category."
    table = pd.read_csv(out / f"finetune_categories_{name}.csv").set_index("category")
    assert len(table) == N_CATEGORIES and list(table.columns) == ["n", "tiny L1", "tiny L2"]
    assert (table.n == PER_CATEGORY).all()
    width, height = Image.open(out / f"finetune_categories_{name}.png").size
    assert width < 2000 and height > width  # 200 dpi: about 9.4 inches wide, five rows (one row of 17 was 11,348 px)
    report = (out / "REPORT.md").read_text()
    assert f"![finetune_categories_{name}](finetune_categories_{name}.png)" in report
    assert f"[finetune_categories_{name}.md]" in report


@pytest.mark.slow
def test_folder_task_through_the_reproduction(root, monkeypatch):
    out, name = run(root, str(root / "my_cogs"), "figures_folder", monkeypatch)
    assert name == "my_cogs"
    first = T.task_dataset(str(root / "my_cogs"))["train"][0]
    shows_task(out, name, first, {"train", T.HELD_OUT_SPLIT, "gen"})
    shows_categories(out, name)


@pytest.mark.slow
def test_hf_task_through_the_reproduction(root, monkeypatch):
    hf = f"hf:{root / 'cogs_saved'}:input=sentence:target=lf:category=kind"
    out, name = run(root, hf, "figures_hf", monkeypatch)
    assert name == "cogs_saved"
    first = T.task_dataset(hf)["train"][0]
    shows_task(out, name, first, {"train", T.HELD_OUT_SPLIT, "gen"})
    shows_categories(out, name)
    runs = json.loads((root / "runs/tiny/finetune/tiny/L2_s0/cogs_saved/task.json").read_text())
    assert runs["task_source"] == T.parse_task(hf).spec
