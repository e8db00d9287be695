"""The committed fidelity summaries are what the current rules give on the committed tables: every claim of
`figures/cpu` and `figures/tiny` recomputed from the per-seed tables beside it (the report notebook's call, the same
preset facts), row by row: evidence, verdict, stability and rule, for the paper's procedure and the adapted one. A
changed rule or a hand-edited table fails here until the report is regenerated (`depthnb reproduce --preset P --only
report`). And no committed verdict moves without its row in the change log (`figures/verdict_changes.csv`), replayed
over the verdicts the log began from (`figures/verdict_record.csv`)."""

from pathlib import Path

import pandas as pd
import pytest

from depthnb.claims import CHANGE_LOG, VERDICT_RECORD, FigureTables, check_claims, expected_verdicts
from depthnb.presets import experiment_preset

FIGURES = Path(__file__).resolve().parents[1] / "figures"
PPL_SPLIT = {"enwiki": "enwiki_valid", "c4": "c4_sample"}  # as the report notebook reads each corpus
PRESETS = ["cpu", "tiny"]
VERDICT_COLUMNS = ("verdict", "adapted_verdict")


def read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, keep_default_na=False)  # an empty adapted column is "", not NaN


def recomputed(preset: str) -> pd.DataFrame:
    P = experiment_preset(preset, {}, None, None, None, None)
    tables = FigureTables(FIGURES / preset, ppl_split=PPL_SPLIT[P.pretrain.data.corpus], control_task=P.control_task,
                          primitive_n_eval=P.primitives.n_eval)
    return check_claims(tables)


@pytest.mark.parametrize("preset", PRESETS)
def test_committed_fidelity_is_what_the_rules_give(preset):
    committed = read(FIGURES / preset / "fidelity.csv")
    ours = recomputed(preset)
    assert list(committed.columns) == list(ours.columns), "fidelity.csv columns differ: regenerate the report"
    assert len(committed) == len(ours), f"{preset}: {len(committed)} committed claims, the rules list {len(ours)}"
    for (i, old), (_, new) in zip(committed.iterrows(), ours.iterrows()):
        for col in ("claim", "verdict", "stability", "evidence", "adapted_verdict", "adapted_stability",
                    "adapted_evidence", "adapted_why"):
            assert old[col] == new[col], f"{preset} row {i} ({new['where']}: {new['claim']}): {col} {old[col]!r} != {new[col]!r}"


def moved_without_entry(committed: pd.DataFrame, preset: str, expected: dict) -> list[str]:
    "Each verdict of `committed` that differs from what the change log replays to, in words."
    return [f"{preset} {r['where']} ({r['claim']}): {col} {expected.get((preset, r['where'], r['claim'], col), '')!r} "
            f"-> {r[col]!r}" for _, r in committed.iterrows() for col in VERDICT_COLUMNS
            if r[col] != expected.get((preset, r["where"], r["claim"], col), "")]


@pytest.mark.parametrize("preset", PRESETS)
def test_no_verdict_moves_without_a_change_log_entry(preset):
    expected = expected_verdicts(read(FIGURES / VERDICT_RECORD), read(FIGURES / CHANGE_LOG))
    moved = moved_without_entry(read(FIGURES / preset / "fidelity.csv"), preset, expected)
    assert not moved, f"verdicts moved without a row in figures/{CHANGE_LOG}: " + "; ".join(moved)


def test_the_change_log_check_can_fail():
    "A verdict moved by hand (or by a rule change with no entry) is caught, and so is an entry with a wrong `before`."
    expected = expected_verdicts(read(FIGURES / VERDICT_RECORD), read(FIGURES / CHANGE_LOG))
    committed = read(FIGURES / "cpu" / "fidelity.csv")
    before = moved_without_entry(committed, "cpu", expected)
    row = committed.index[committed["where"] == "Fig. 4"][0]
    committed.loc[row, "verdict"] = "holds" if committed.loc[row, "verdict"] != "holds" else "does not hold"
    assert len(moved_without_entry(committed, "cpu", expected)) == len(before) + 1
    log = read(FIGURES / CHANGE_LOG)
    replayed = log.index[log.kind.isin(["rule", "data"])]
    if len(replayed):
        log.loc[replayed[0], "before"] = "a verdict it never had"
        with pytest.raises(ValueError, match="before is 'a verdict it never had'"):
            expected_verdicts(read(FIGURES / VERDICT_RECORD), log)


def test_the_change_log_holds_the_past_moves():
    "The moves made before the log began (issue 56): Fig. 7's pick rule, the control task, Fig. 6's per-seed target."
    history = read(FIGURES / CHANGE_LOG).query("kind == 'history'")
    text = " ".join(history.new_rule + " " + history.why).lower()
    for words in ("within", "geoquery", "own reference"):
        assert words in text, f"no history row about {words!r} in figures/{CHANGE_LOG}"
    assert set(history["where"]) >= {"Fig. 6", "Fig. 7"}


def test_the_regression_catches_a_broken_rule():
    "The comparison can fail: a rule that always says 'holds' differs from the committed cpu summary."
    import depthnb.claims as claims
    broken = [c.__class__(c.paper, c.where, c.claim, c.rule, lambda t: ("broken", "holds")) for c in claims.CLAIMS]
    ours = check_claims(FigureTables(FIGURES / "cpu"), broken)
    committed = read(FIGURES / "cpu" / "fidelity.csv")
    assert (ours.verdict != committed.verdict).any()
