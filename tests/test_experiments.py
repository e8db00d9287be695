"""The whole reproduction — every experiment notebook of `depthnb.reproduce.EXPERIMENTS`, report included — run by
`depthnb.reproduce.reproduce` (papermill) at a scale below `tiny`; every figure and table the report indexes; a rerun
that finds everything done; a failing notebook named with its cell."""
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _train_common import REPRODUCE_OVERRIDES  # noqa: E402

from depthnb.claims.petty import EQUAL_PPL_TOLERANCE  # noqa: E402
from depthnb.reproduce import EXPERIMENTS  # noqa: E402
from depthnb.reproduce import ExperimentFailed, reproduce  # noqa: E402

OVERRIDES = REPRODUCE_OVERRIDES  # below `tiny`: tests/_train_common.py
VERDICTS = {"holds", "does not hold", "inconclusive", "mixed", "not testable", "not reproducible here"}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("reproduce")
    runs, figures = root / "runs", root / "figures"
    log = []
    executed = reproduce("tiny", seeds=1, overrides=OVERRIDES, runs_dir=runs, figures_dir=figures, log=log.append)
    return runs, figures / "tiny", executed, log


def test_every_experiment_ran(pipeline):
    runs, out, executed, log = pipeline
    default = [e for e in EXPERIMENTS if not e.optional]  # optional ones (sizing studies) run only when named
    assert [p.stem for p in executed] == [e.name for e in default]
    for e in default:
        assert (runs / "tiny" / "notebooks" / f"{e.name}.done.json").exists()
    assert sorted(p.name for p in (runs / "tiny" / "pretrain" / "tiny").iterdir()) == ["L1_s0", "L2_s0"]
    scored = json.loads((runs / "tiny" / "finetune" / "tiny" / "L2_s0" / "cogs" / "eval" / "gen.json").read_text())
    assert scored["n"] == 20 and 0.0 <= scored["accuracy"] <= 1.0


def test_report_indexes_every_item(pipeline):
    _, out, _, _ = pipeline
    report = (out / "REPORT.md").read_text()
    assert "**missing**" not in report, [line for line in report.splitlines() if "**missing**" in line]
    for png in out.glob("*.png"):  # every figure has its PDF and a caption naming the preset and hardware
        assert png.with_suffix(".pdf").exists()
        assert "[preset: tiny, variant " in png.with_suffix(".txt").read_text()  # OVERRIDES make a variant
        assert "; hardware: " in png.with_suffix(".txt").read_text()
    for csv in out.glob("*.csv"):
        assert csv.with_suffix(".md").exists()


def test_fidelity_summary(pipeline):
    _, out, _, _ = pipeline
    fidelity = pd.read_csv(out / "fidelity.csv")
    assert len(fidelity) >= 18 and set(fidelity.paper) == {"Petty", "Saunshi", "Beyond"}
    assert set(fidelity.verdict) <= VERDICTS
    assert not fidelity.evidence.str.startswith("missing output").any(), fidelity[["claim", "evidence"]]
    speedups = fidelity[fidelity.claim.str.contains("speedup column")].iloc[0]
    assert speedups.verdict == "holds" and speedups.evidence.startswith("11 of 11")


def test_rerun_finds_everything_done(pipeline):
    runs, out, _, _ = pipeline
    log = []
    reproduce("tiny", seeds=1, overrides=OVERRIDES, runs_dir=runs, figures_dir=out.parent, log=log.append)
    assert sum("done already" in line for line in log) == len([e for e in EXPERIMENTS if not e.optional]), log


def test_failure_names_notebook_and_cell(tmp_path):
    # petty_rank reads pretrained models; in an empty runs folder it must fail, and say where
    with pytest.raises(ExperimentFailed) as e:
        reproduce("tiny", only=["petty_rank"], seeds=1, overrides=OVERRIDES, runs_dir=tmp_path / "runs",
                  figures_dir=tmp_path / "figures", log=lambda *a: None)
    message = str(e.value)
    assert message.startswith("petty_rank: RuntimeError: ") and "experiment 'petty_rank' failed in cell" in message
    assert "RuntimeError" in message and "run petty_pretrain first" in message
    assert "executed copy:" in message
    assert not (tmp_path / "runs" / "tiny" / "notebooks" / "petty_rank.done.json").exists()


def test_equal_ppl_refines_a_sparse_match(pipeline):
    """At reference depth 2 the 1-layer model crosses the target between two kept snapshots, further from it than the
    claims' tolerance: that stretch is retrained with denser snapshots (`controls.refine_snapshots`), which reproduce
    the run's own evaluations exactly (same process, same threads), and the match is made again among them."""
    runs, out, _, _ = pipeline
    figures = out.parent.with_name("figures_refined")
    reproduce("tiny", only=["petty_equal_ppl"], seeds=1, overrides=dict(OVERRIDES, control_references=(2,)),
              runs_dir=runs, figures_dir=figures, log=lambda *a: None)
    sel = pd.read_csv(figures / "tiny" / "petty_fig6_selection_tiny.csv")
    shallow = sel[sel.n_layers == 1].iloc[0]
    refined = list((runs / "tiny" / "pretrain" / "tiny" / "L1_s0" / "refine").iterdir())
    assert len(refined) == 1 and (refined[0] / "DONE").exists()
    assert shallow.refined and shallow.status == "matched" and abs(shallow.rel_gap) <= EQUAL_PPL_TOLERANCE, shallow
    caption = (figures / "tiny" / "petty_fig6_selection_tiny.md").read_text()
    assert "shared evaluations to within 0.0e+00" in caption
