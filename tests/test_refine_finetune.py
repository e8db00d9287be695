"""Refined fine-tuning stretches (`controls.refine_finetune`, the equal in-distribution loss control's dense
evaluations): a stretch retrained from a kept checkpoint, or from the source model where none is kept, gives the
run's own evaluations and weights bit for bit, evaluates at every step asked for, reruns as a no-op, and refuses
what it cannot retrain faithfully with one line naming the run."""
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _train_common import TEST_DATA  # noqa: E402

import depthnb.finetune as ft  # noqa: E402
from depthnb.config import FinetuneConfig, ModelConfig  # noqa: E402
from depthnb.controls import kept_checkpoint_steps, refine_finetune  # noqa: E402
from depthnb.model import DecoderLM  # noqa: E402
from depthnb.runs import load_model, read_metrics, save_weights  # noqa: E402

CFG = FinetuneConfig(steps=12, batch_size=16, lr=1e-2, warmup_steps=2, eval_every=4, eval_examples=16,
                     n_snapshots=2, eval_batch_size=16, max_new_tokens=16, device="cpu", bf16=False)


def fresh_model(seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    return DecoderLM(ModelConfig(d_model=32, d_attn=32, n_heads=2, d_ff=64, n_layers=2,
                                 n_vocab=TEST_DATA.vocab_size, n_ctx=64))


@pytest.fixture(scope="module")
def run(tok, tmp_path_factory):
    "A 12-step COGS fine-tune of a saved model (its source): evaluations at 4, 8, 12, checkpoints kept at 8 and 12."
    root = tmp_path_factory.mktemp("refine")
    save_weights(root / "init.pt", fresh_model(), 0)
    ft.finetune(root / "init.pt", "cogs", CFG, root / "run", tokenizer=tok, progress=False, log=lambda *a: None)
    return root / "run"


def evals(run_dir) -> dict:
    "Step -> in-distribution loss of a run's evaluations."
    m = read_metrics(run_dir, "eval")
    return dict(zip(m.step, m.loss))


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(load_model(a).state_dict().values(), load_model(b).state_dict().values()))


def test_stretch_from_a_kept_checkpoint_is_the_runs_own(run):
    assert kept_checkpoint_steps(run) == [8, 12]
    out = Path(refine_finetune(run, 9, 12, 1, log=lambda *a: None))
    assert out == run / "refine" / "steps_00000009-00000012_every_1"
    assert read_metrics(out, "snapshot").step.tolist() == [9, 10, 11, 12]
    dense = evals(out)
    assert sorted(dense) == [9, 10, 11, 12]  # every step of the stretch, none before it
    assert dense[12] == evals(run)[12]  # bit-identical, not close
    assert same_weights(out / "snapshots" / "step_00000012.pt", run / "final.pt")
    assert len(set(dense.values())) == 4  # the loss moves between the run's evaluations: what the control reads


def test_stretch_before_any_kept_checkpoint_retrains_from_the_source(run):
    out = Path(refine_finetune(run, 2, 4, 1, log=lambda *a: None))
    assert sorted(evals(out)) == [2, 3, 4] and evals(out)[4] == evals(run)[4]
    assert same_weights(out / "snapshots" / "step_00000004.pt", run / "snapshots" / "step_00000004.pt")
    # the same stretch evaluated every other step ends on the same weights
    sparse = Path(refine_finetune(run, 2, 4, 2, log=lambda *a: None))
    assert sorted(evals(sparse)) == [2, 4] and evals(sparse)[4] == evals(run)[4]


def test_refining_again_is_a_no_op(run):
    out = Path(refine_finetune(run, 9, 12, 1, log=lambda *a: None))
    before = (out / "final.pt").stat().st_mtime_ns
    said = []
    assert Path(refine_finetune(run, 9, 12, 1, log=said.append)) == out
    assert (out / "final.pt").stat().st_mtime_ns == before and "finished already" in said[0]


def test_refine_refuses_what_it_cannot_retrain(run, tok, tmp_path):
    with pytest.raises(ValueError, match=r"0 < first <= last <= 12 \(the run's steps\), got first=10, last=14"):
        refine_finetune(run, 10, 14, 1)
    with pytest.raises(ValueError, match="every >= 1"):
        refine_finetune(run, 9, 12, 0)
    with pytest.raises(ValueError, match="is not a finished fine-tuning run"):
        refine_finetune(_pretrain_like(tmp_path), 1, 2, 1)
    objected = tmp_path / "from_object"  # fine-tuned from a model object: no source to start again from
    ft.finetune(fresh_model(), "cogs", replace(CFG, steps=4, eval_every=2), objected, tokenizer=tok, progress=False,
                log=lambda *a: None)
    with pytest.raises(ValueError, match="keeps no checkpoint at or before step 1 and was fine-tuned from a model object"):
        refine_finetune(objected, 1, 2, 1)


def _pretrain_like(folder: Path) -> Path:
    "A run directory whose config.json is a pretraining run's."
    (folder / "pre").mkdir()
    (folder / "pre" / "config.json").write_text(json.dumps(dict(kind="pretrain", config={})))
    return folder / "pre"


@pytest.mark.slow
def test_equal_loss_notebook_evaluates_every_crossing_densely(tmp_path):
    """The Fig. 7 notebook at a scale below `tiny` (two depths, two seeds, GeoQuery, 30 fine-tuning steps evaluated
    every 10): the loss is GeoQuery's held-out slice, every run that crosses below the threshold gets the stretch
    before its crossing retrained and evaluated every step (reproducing its run exactly), each declared pick is the
    first step at or below the threshold among all snapshots, and each deeper pick records how well the set resolves
    its loss against the shallow pick of its seed."""
    import os
    import pandas as pd
    import papermill
    from _train_common import REPRODUCE_OVERRIDES
    from depthnb.claims.petty import declared_picks
    from depthnb.reproduce import KERNEL_QUIET, experiments_dir, reproduce
    from depthnb.tasks import HELD_OUT_SPLIT

    overrides = dict(REPRODUCE_OVERRIDES, finetune_seeds=2, control_task="geoquery", tasks=["geoquery"])
    overrides.update({"finetune.steps": 30, "finetune.eval_every": 10, "finetune.n_snapshots": 3,
                      "finetune.warmup_steps": 3})
    reproduce("tiny", only=["petty_pretrain"], seeds=2, overrides=overrides, runs_dir=tmp_path / "runs",
              figures_dir=tmp_path / "figures", log=lambda *a: None)
    notebook = experiments_dir() / "petty_equal_loss.ipynb"
    papermill.execute_notebook(notebook, tmp_path / "executed.ipynb", cwd=notebook.parent, kernel_name="python3",
                               progress_bar=False, extra_arguments=KERNEL_QUIET,
                               parameters=dict(preset="tiny", overrides=overrides, seeds=2,
                                               runs_dir=os.path.relpath(tmp_path / "runs", notebook.parent),
                                               figures_dir=os.path.relpath(tmp_path / "figures", notebook.parent)))
    out = tmp_path / "figures" / "tiny"
    snaps = pd.read_csv(out / "petty_fig7_snapshots_tiny.csv")
    sel = pd.read_csv(out / "petty_fig7_selection_tiny.csv").assign(size_class="tiny")
    thr = sel.threshold.iloc[0]
    picks = declared_picks(snaps, sel)
    assert len(picks) == 4 and picks.step.notna().all() and (picks.loss <= thr).all(), picks
    dense_dirs = list((tmp_path / "runs" / "tiny" / "finetune").glob("tiny/*/geoquery/refine/*"))
    below = snaps.merge(picks[["n_layers", "seed", "step"]]).query("loss < @thr")
    assert len(dense_dirs) == len(below) >= 1 and snaps.dense.any()
    for r in picks.itertuples():  # every step of the stretch before the pick is above the threshold
        run = snaps[(snaps.n_layers == r.n_layers) & (snaps.seed == r.seed) & (snaps.step < r.step)]
        assert (run.loss > thr).all(), run
    resolved = picks.paired_halfwidth.dropna()
    assert len(resolved) == 2 and (resolved > 0).all(), picks  # the deeper depth of each seed, against the shallow
    assert picks.accuracy.notna().all()
    md = (out / "petty_fig7_snapshots_tiny.md").read_text()
    assert "to within 0.0e+00" in md and HELD_OUT_SPLIT in md
