"""The `cpu` preset in parts: the parts resolve and fit the sizing study's budget of about 2.5 hours, `reproduce` runs
each part once and pools them, `reproduce.pool_parts` pairs by seed across parts, MIDAS -> COGS gets a paired interval
from three stacking seeds, and the training commands default to the reproduction's one thread. Nothing is trained."""
import shutil
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import papermill
import pytest

from depthnb.claims.midas import claim_midas_cogs
from depthnb.claims.petty import claim_depth_generalizes
from depthnb.commands import threads_for
from depthnb.config import Preset
from depthnb.presets import PRESETS, load_preset, preset_depths, preset_stack_seeds, repo_root
from depthnb.reproduce import experiment_order, pool_parts, reproduce
from depthnb.jobs import WORKER_ENV

PARTS = PRESETS["cpu"].parts
BUDGET_MINUTES = 150  # each part on a fresh clone, install included: "about two and a half hours"
PART_MARGIN = 112 / 104  # what the first five-seed Petty part measured over its estimate (README, presets)


def test_parts_resolve():
    cpu = load_preset("cpu")
    assert PARTS == ("cpu-petty-a", "cpu-petty-b", "cpu-petty-c", "cpu-midas", "cpu-midas-b") and cpu.experiments == ("report",)
    for name in PARTS:
        part = load_preset(name)
        assert not part.parts and experiment_order(part.experiments)  # valid experiment names, runnable alone
        assert (part.pretrain, part.finetune, part.size_classes, part.task_steps) == \
               (cpu.pretrain, cpu.finetune, cpu.size_classes, cpu.task_steps)  # one CPU_BASE: nothing repeated
    a, b, c = (load_preset(f"cpu-petty-{x}") for x in "abc")
    assert not set(a.seeds) & set(b.seeds) | set(b.seeds) & set(c.seeds) | set(a.seeds) & set(c.seeds)
    assert sorted(a.seeds + b.seeds + c.seeds) == list(cpu.seeds) == list(range(10))
    assert preset_depths(a) == preset_depths(b) == preset_depths(c) == (1, 2, 3, 4, 6) and a.control_task == "geoquery"
    assert a.pretrain.n_snapshots == a.finetune.n_snapshots == 24
    assert preset_stack_seeds("cpu-midas") == tuple(range(8)) and "midas_cogs" in load_preset("cpu-midas").experiments
    m, mb = preset_stack_seeds("cpu-midas"), preset_stack_seeds("cpu-midas-b")  # pooled by stacking seed: disjoint
    assert not set(m) & set(mb) and m + mb == preset_stack_seeds(cpu) and "midas_cogs" in load_preset("cpu-midas-b").experiments


def allocation_minutes(part: Preset) -> float:
    """The sizing study's estimate (figures/cpu/sizing_allocation.csv) for the allocation a part runs. A Petty part:
    the table's minutes per seed for its depths and tasks, times its seeds, times what the control's matched fine-tunes
    add (the table's three-depth rows with and without the control), times PART_MARGIN."""
    table = pd.read_csv(repo_root() / "figures" / "cpu" / "sizing_allocation.csv", keep_default_na=False)

    def row(**key) -> pd.DataFrame:
        hit = table[np.logical_and.reduce([table[k].astype(str) == str(v) for k, v in key.items()])]
        assert len(hit), f"no sizing_allocation row for {part.name}: {key}"
        return hit

    if part.stack_seeds:
        return float(row(part="midas", models="baseline midas", tasks=" ".join(part.tasks), control="",
                         seeds=len(part.stack_seeds)).minutes.iloc[0])
    tasks = " ".join(part.tasks)
    per_seed = row(part="petty", models=" ".join(map(str, preset_depths(part))), tasks=tasks, control="")
    control = (row(part="petty", models="1 3 6", tasks=tasks, control=part.control_task).minutes.sum()
               / row(part="petty", models="1 3 6", tasks=tasks, control="").minutes.sum())
    return float((per_seed.minutes / per_seed.seeds).mean() * len(part.seeds) * control * PART_MARGIN)


@pytest.mark.parametrize("name", PARTS)
def test_each_part_fits_the_budget(name):
    assert allocation_minutes(load_preset(name)) <= BUDGET_MINUTES


# --- reproduce: parts first, each once, then the report over the pooled tables ------------------------------------

def fake_execute(calls):
    "papermill's stand-in: each notebook writes a per-seed Fig. 4 table of its preset (deeper: +20 points)."
    def execute(source, target, parameters, **kw):
        calls.append((parameters["preset"], Path(source).stem))
        p = load_preset(parameters["preset"])
        folder = Path(kw["cwd"]) / parameters["figures_dir"] / p.name
        folder.mkdir(parents=True, exist_ok=True)
        if not p.parts:
            rng = np.random.default_rng(p.seeds[0])
            rows = [dict(size_class="c", task="geoquery", seed=s, n_layers=d, accuracy=0.3 + 0.2 * (d == 6)
                         + rng.normal(0, 0.02)) for s in p.seeds for d in (1, 3, 6)]
            pd.DataFrame(rows).to_csv(folder / "finetune_accuracy.csv", index=False)
            (folder / "petty_fig4_generalization.txt").write_text(f"Fig. 4 of {p.name}")
        Path(target).write_text("{}")
    return execute


TOY = {"toy-a": Preset("toy-a", "", "", seeds=(0, 1, 2), experiments=("petty_shapes",)),
       "toy-b": Preset("toy-b", "", "", seeds=(3, 4), experiments=("petty_shapes",)),
       "toy": Preset("toy", "", "", parts=("toy-a", "toy-b"), experiments=("report",))}


def test_reproduce_runs_parts_once_then_pools(tmp_path):
    calls, dirs = [], dict(runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures", log=lambda *a: None)
    with mock.patch.dict(PRESETS, TOY), mock.patch.object(papermill, "execute_notebook", fake_execute(calls)):
        reproduce("toy-a", **dirs)  # one part alone, in its own sitting
        assert calls == [("toy-a", "petty_shapes")]
        reproduce("toy", **dirs)
        assert calls[1:] == [("toy-b", "petty_shapes"), ("toy", "report")]  # part a was done: skipped
        calls.clear()
        reproduce("toy", **dirs)
        assert calls == []
    assert (tmp_path / "runs" / "toy-a" / "notebooks" / "petty_shapes.done.json").exists()
    pooled = pd.read_csv(tmp_path / "figures" / "toy" / "finetune_accuracy.csv")
    assert sorted(set(pooled.seed)) == [0, 1, 2, 3, 4] and set(pooled.part) == {"toy-a", "toy-b"}
    manifest = pd.read_csv(tmp_path / "figures" / "toy" / "pooled_parts.csv")
    assert manifest.set_index("file").source["finetune_accuracy.csv"] == "pooled: toy-a, toy-b"
    caption = (tmp_path / "figures" / "toy" / "petty_fig4_generalization.txt").read_text()
    assert caption.startswith("[From part toy-a only") and caption.endswith("Fig. 4 of toy-a")


def test_only_report_pools_the_parts_figures_as_committed(tmp_path):
    "Parts run in earlier sittings leave only their figures: `--only report` pools those and runs the report."
    calls, dirs = [], dict(runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures", log=lambda *a: None)
    with mock.patch.dict(PRESETS, TOY), mock.patch.object(papermill, "execute_notebook", fake_execute(calls)):
        reproduce("toy-a", **dirs)
        with pytest.raises(FileNotFoundError, match="toy-b"):  # a part not run yet is named
            reproduce("toy", only=["report"], **dirs)
        reproduce("toy-b", **dirs)
        shutil.rmtree(tmp_path / "runs")  # a later sitting: the runs are gone, the figures committed
        calls.clear()
        reproduce("toy", only=["report"], **dirs)
        assert calls == [("toy", "report")]
        reproduce("toy", only=["report"], **dirs)
        assert calls == [("toy", "report")]  # same figures: done already
    pooled = pd.read_csv(tmp_path / "figures" / "toy" / "finetune_accuracy.csv")
    assert sorted(set(pooled.seed)) == [0, 1, 2, 3, 4]


def test_pool_parts_pairs_by_seed(tmp_path):
    rng = np.random.default_rng(0)
    for part, seeds in (("a", range(5)), ("b", range(5, 10))):
        (tmp_path / part).mkdir()
        rows = []
        for s in seeds:  # a seed effect shared by its depths: pairing within seed removes it
            base = rng.normal(0.4, 0.15)
            rows += [dict(size_class="cpu", task="geoquery", seed=s, n_layers=d, accuracy=base + 0.1 * (d == 6)
                          + rng.normal(0, 0.01)) for d in (1, 3, 6)]
        pd.DataFrame(rows).to_csv(tmp_path / part / "finetune_accuracy.csv", index=False)
    pool_parts({"a": tmp_path / "a", "b": tmp_path / "b"}, tmp_path / "cpu")
    evidence, verdict = claim_depth_generalizes(pd.read_csv(tmp_path / "cpu" / "finetune_accuracy.csv"))
    assert verdict == "holds" and "over 10 seeds" in evidence, evidence
    pd.read_csv(tmp_path / "a" / "finetune_accuracy.csv").to_csv(tmp_path / "b" / "finetune_accuracy.csv", index=False)
    with pytest.raises(ValueError, match="has seed 0 in parts 'a' and 'b'"):
        pool_parts({"a": tmp_path / "a", "b": tmp_path / "b"}, tmp_path / "cpu")


def test_midas_cogs_claim_over_stacking_seeds():
    rows = [dict(task="COGS-vf", method=m, seed=s, accuracy=acc)
            for s, (base, midas) in enumerate([(2.0, 11.0), (5.0, 13.5), (1.0, 12.0)])
            for m, acc in (("baseline", base), ("midas", midas))]
    evidence, verdict = claim_midas_cogs(pd.DataFrame(rows))
    assert verdict == "holds" and "95% interval" in evidence and "over 3 seeds" in evidence, evidence
    one = pd.DataFrame(rows[:2])
    assert claim_midas_cogs(one)[1] == "not testable"


def test_threads_default_matches_the_workers():
    assert all(threads_for(load_preset(n)) == 1 for n in PARTS)  # two workers of one thread each
    assert threads_for(load_preset("small")) is None and threads_for(load_preset("cpu"), 2) == 2
    assert WORKER_ENV == {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "268435456"}


def test_report_redraws_the_pooled_figures(tmp_path):
    """The report of a preset in parts redraws Figures 2-4, Table 3 and Figure 7 over every part's seeds, where a copy
    would show one part's (a few rows in the real tables' format, nothing trained; the real report notebook runs)."""
    figures = tmp_path / "figures"
    for part, seeds in (("cpu-petty-a", (0, 1)), ("cpu-petty-b", (5,))):
        folder = figures / part
        folder.mkdir(parents=True)
        runs = [dict(size_class="cpu", n_layers=n, d_model=128, d_ff=1451 // n, seed=s) for n in (1, 3, 6) for s in seeds]
        pd.DataFrame([dict(r, split="enwiki_valid", step=1200, loss=4.0 + 0.01 * r["n_layers"],
                           ppl=np.exp(4.0 + 0.01 * r["n_layers"]), run_dir="x") for r in runs]
                     ).to_csv(folder / "pretrain_final_ppl.csv", index=False)
        pd.DataFrame([dict(r, task="geoquery", split="test", n=280, accuracy=0.5 + 0.01 * r["n_layers"] + 0.01 * r["seed"],
                           id_split="dev", id_n=200, id_accuracy=0.9, id_loss=0.1, run_dir="x") for r in runs]
                     ).to_csv(folder / "finetune_accuracy.csv", index=False)
        (folder / "petty_fig4_generalization.txt").write_text(f"Fig. 4 of {part}")
        threshold = {"cpu-petty-a": 0.2, "cpu-petty-b": 0.25}[part]  # each part's runs reach their own
        snaps = pd.DataFrame([dict(n_layers=r["n_layers"], seed=r["seed"], step=step, dense=False, loss=loss,
                                   accuracy=acc, n=280 if acc == acc else None, paired_halfwidth=None)
                              for r in runs for step, loss, acc in ((50, 0.5, np.nan), (100, threshold - 0.01, 0.01 * r["n_layers"]),
                                                                    (1000, 0.1, 0.5))])
        snaps.to_csv(folder / "petty_fig7_snapshots_cpu.csv", index=False)
        pd.DataFrame([dict(n_layers=r["n_layers"], seed=r["seed"], threshold=threshold, status="within_tolerance",
                           step=100, loss=threshold - 0.01, interpolated=False, crossing_step=100, lag_steps=0,
                           prev_step=50, prev_loss=0.5, best_loss=0.1, final_loss=0.1, n_snapshots=3, n_unscored=0,
                           accuracy=0.01 * r["n_layers"], dense=False) for r in runs]
                     ).to_csv(folder / "petty_fig7_selection_cpu.csv", index=False)
        (folder / "petty_fig7_equal_loss_cpu.txt").write_text(f"Fig. 7 of {part}")
    for empty in ("cpu-petty-c", "cpu-midas", "cpu-midas-b"):
        (figures / empty).mkdir()
    reproduce("cpu", only=["report"], runs_dir=tmp_path / "runs", figures_dir=figures, log=lambda *a: None)
    out = figures / "cpu"
    caption = (out / "petty_fig4_generalization.txt").read_text()
    assert "mean over 3 pretraining seeds (0, 1, 5; pooled over cpu-petty-a, cpu-petty-b)" in caption, caption
    assert (out / "petty_fig4_generalization.png").exists() and (out / "petty_fig2_perplexity.png").exists()
    t3 = pd.read_csv(out / "petty_table3.csv").set_index("n_layers")
    assert t3.loc[6, "GeoQuery"] == pytest.approx(100 * (0.56 + (0 + 1 + 5) / 3 * 0.01), abs=0.01)
    manifest = pd.read_csv(out / "pooled_parts.csv").set_index("file").source
    assert manifest["petty_table3.csv"].startswith("redrawn") and manifest["finetune_accuracy.csv"].startswith("pooled")
    fig7 = (out / "petty_fig7_equal_loss_cpu.txt").read_text()  # every seed's runs, each part's threshold
    assert "over 3 pretraining seeds (0, 1, 5; pooled over cpu-petty-a, cpu-petty-b)" in fig7, fig7
    assert "thresholds 0.2000 to 0.2500 (one per part)" in fig7 and "equal loss by depth: 1: 1.0%, 3: 3.0%, 6: 6.0%" in fig7
    assert manifest["petty_fig7_equal_loss_cpu.png"].startswith("redrawn")
