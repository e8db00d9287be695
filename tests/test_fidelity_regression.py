"""The committed fidelity summaries are what the current rules give on the committed tables: every claim of
`figures/cpu` and `figures/tiny` recomputed from the per-seed tables beside it (the report notebook's call, the same
preset facts), row by row: evidence, verdict, stability and rule. A changed rule or a hand-edited table fails here
until the report is regenerated (`depthnb reproduce --preset P --only report`)."""

from pathlib import Path

import pandas as pd
import pytest

from depthnb.claims import FigureTables, check_claims
from depthnb.presets import experiment_preset

FIGURES = Path(__file__).resolve().parents[1] / "figures"
PPL_SPLIT = {"enwiki": "enwiki_valid", "c4": "c4_sample"}  # as the report notebook reads each corpus


def recomputed(preset: str) -> pd.DataFrame:
    P = experiment_preset(preset, {}, None, None, None, None)
    tables = FigureTables(FIGURES / preset, ppl_split=PPL_SPLIT[P.pretrain.data.corpus], control_task=P.control_task,
                          primitive_n_eval=P.primitives.n_eval)
    return check_claims(tables)


@pytest.mark.parametrize("preset", ["cpu", "tiny"])
def test_committed_fidelity_is_what_the_rules_give(preset):
    committed = pd.read_csv(FIGURES / preset / "fidelity.csv")
    ours = recomputed(preset)
    assert list(committed.columns) == list(ours.columns), "fidelity.csv columns differ: regenerate the report"
    assert len(committed) == len(ours), f"{preset}: {len(committed)} committed claims, the rules list {len(ours)}"
    for (i, old), (_, new) in zip(committed.iterrows(), ours.iterrows()):
        for col in ("claim", "verdict", "stability", "evidence"):
            assert old[col] == new[col], f"{preset} row {i} ({new['where']}: {new['claim']}): {col} {old[col]!r} != {new[col]!r}"


def test_the_regression_catches_a_broken_rule():
    "The comparison can fail: a rule that always says 'holds' differs from the committed cpu summary."
    import depthnb.claims as claims
    broken = [c.__class__(c.paper, c.where, c.claim, c.rule, lambda t: ("broken", "holds")) for c in claims.CLAIMS]
    ours = check_claims(FigureTables(FIGURES / "cpu"), broken)
    committed = pd.read_csv(FIGURES / "cpu" / "fidelity.csv")
    assert (ours.verdict != committed.verdict).any()
