"""Every verdict rule of depthnb.claims.petty and depthnb.claims.midas against its null: on data with no effect (depth labels shuffled within a
seed, identical across depths, at the floor, the statistic at initialization) it must not say "holds" more often
than the nominal 5%; on a clear effect it must say "holds"; where the interval excludes the paper's effect size,
"does not hold"."""

import numpy as np
import pandas as pd
import pytest

from depthnb.claims.midas import claim_midas_beats_gradstack, claim_midas_cogs, claim_midas_loss_near_baseline
from depthnb.claims.petty import (claim_depth_generalizes, claim_depth_lowers_ppl, claim_diminishing_returns, claim_equal_loss,
                                  claim_equal_ppl, claim_latency_linear, claim_lexical_not_structural, claim_narrow_degrades,
                                  claim_rank_deficient, claim_saturation, claim_structural_near_zero)
from depthnb.seeds import (FLOOR, Interval, half_width, interval_verdict, seeds_for_half_width, shuffle_within_seed,
                           t_interval)

DEPTHS = (1, 2, 3, 4, 6)
DRAWS = 300
NOMINAL = 0.05
# the 95% binomial upper bound of a false-"holds" rate of 5% over DRAWS draws: the rate may not exceed it
RATE_BOUND = NOMINAL + 1.96 * np.sqrt(NOMINAL * (1 - NOMINAL) / DRAWS)


def rate(verdicts, verdict="holds") -> float:
    return float(np.mean([v == verdict for v in verdicts]))


def accuracy_table(mean_by_depth, seeds=5, noise=0.05, rng=None, task="geoquery", depths=DEPTHS) -> pd.DataFrame:
    "A finetune_accuracy-like table: accuracy per (depth, seed) = the depth's mean + a seed effect + noise, in [0, 1]."
    rng = rng or np.random.default_rng(0)
    rows = []
    for s in range(seeds):
        seed_effect = rng.normal(0, noise)
        for d in depths:
            acc = np.clip(mean_by_depth(d) + seed_effect + rng.normal(0, noise), 0, 1)
            rows.append(dict(size_class="c", task=task, n_layers=d, seed=s, accuracy=acc))
    return pd.DataFrame(rows)


# --- the interval rule itself -------------------------------------------------------------------------------------

def test_interval_verdict_null_rate():
    rng = np.random.default_rng(1)
    verdicts = [interval_verdict(t_interval(rng.normal(0, 1, size=n)), effect=2.0)
                for n in (2, 3, 5, 8) for _ in range(DRAWS)]
    assert rate(verdicts) <= RATE_BOUND / 2 + 0.01  # one-sided: 2.5% nominal


def test_interval_verdict_decides_both_ways():
    assert interval_verdict(t_interval([1.0, 1.1, 0.9, 1.05])) == "holds"
    assert interval_verdict(t_interval([0.01, -0.02, 0.0, 0.01]), effect=0.3) == "does not hold"
    assert interval_verdict(t_interval([0.5])) == "inconclusive"  # one seed: no interval
    assert interval_verdict(Interval(0.2, float("nan"), float("nan"), 1)) == "inconclusive"


# --- Fig. 4: deeper generalizes better ------------------------------------------------------------------------------

def test_depth_generalizes_null_shuffled_within_seed():
    rng = np.random.default_rng(2)
    effect = accuracy_table(lambda d: 0.3 + 0.08 * d, rng=rng)
    verdicts = [claim_depth_generalizes(shuffle_within_seed(effect, rng))[1] for _ in range(DRAWS)]
    assert rate(verdicts) <= RATE_BOUND


def test_depth_generalizes_null_no_depth_effect():
    rng = np.random.default_rng(3)
    verdicts = [claim_depth_generalizes(accuracy_table(lambda d: 0.5, seeds=n, rng=rng))[1]
                for n in (2, 3, 5) for _ in range(DRAWS // 3)]
    assert rate(verdicts) <= RATE_BOUND


def test_depth_generalizes_identical_depths_never_holds():
    flat = accuracy_table(lambda d: 0.5, noise=0.0)
    assert claim_depth_generalizes(flat)[1] == "does not hold"  # a decided null: 0 +- 0 excludes the paper's +9.3


def test_depth_generalizes_floor_not_testable():
    floor = accuracy_table(lambda d: 0.01 * d / 6, noise=0.002)  # 0.2% .. 1%
    assert claim_depth_generalizes(floor)[1] == "not testable"


def test_depth_generalizes_clear_effect_holds():
    assert claim_depth_generalizes(accuracy_table(lambda d: 0.2 + 0.1 * d, noise=0.03))[1] == "holds"


def test_depth_generalizes_excludes_paper_effect():
    # passivization: the paper gains 74.1 points from 1 to 6 layers; ours gains nothing, measured on 5 seeds
    none = accuracy_table(lambda d: 0.3, noise=0.03, task="passivization")
    assert claim_depth_generalizes(none)[1] == "does not hold"


# --- Fig. 4: saturation ----------------------------------------------------------------------------------------------

def test_saturation_null_no_gain_is_not_testable():
    rng = np.random.default_rng(4)
    verdicts = [claim_saturation(accuracy_table(lambda d: 0.5, rng=rng))[1] for _ in range(DRAWS)]
    assert rate(verdicts) <= RATE_BOUND
    assert rate(verdicts, "not testable") > 0.9


def test_saturation_null_linear_rise():
    rng = np.random.default_rng(5)
    verdicts = [claim_saturation(accuracy_table(lambda d: 0.1 + 0.1 * (d - 1), rng=rng))[1] for _ in range(DRAWS)]
    assert rate(verdicts) <= RATE_BOUND


def test_saturation_concave_holds():
    concave = accuracy_table(lambda d: 0.2 + 0.5 * min(d, 3) / 3, noise=0.02)
    assert claim_saturation(concave)[1] == "holds"


def test_saturation_leaves_out_passivization():
    evidence, verdict = claim_saturation(accuracy_table(lambda d: 0.2 + 0.1 * d, noise=0.02, task="passivization"))
    assert verdict == "not testable" and "names no threshold" in evidence


# --- Fig. 5 -----------------------------------------------------------------------------------------------------------

def types_table(lexical, structural, seeds=5, noise=0.03, rng=None) -> pd.DataFrame:
    rng = rng or np.random.default_rng(0)
    rows = []
    for s in range(seeds):
        for d in DEPTHS:
            for kind, f in (("lexical", lexical), ("structural", structural)):
                rows.append(dict(size_class="c", task="cogs_vf", n_layers=d, seed=s, generalization_type=kind,
                                 accuracy=float(np.clip(f(d) + rng.normal(0, noise), 0, 1))))
    return pd.DataFrame(rows)


def test_lexical_not_structural_floor_and_null():
    assert claim_lexical_not_structural(types_table(lambda d: 0.01, lambda d: 0.02, noise=0.005))[1] == "not testable"
    rng = np.random.default_rng(6)
    same = [claim_lexical_not_structural(types_table(lambda d: 0.2 + 0.05 * d, lambda d: 0.2 + 0.05 * d, rng=rng))[1]
            for _ in range(DRAWS)]
    assert rate(same) <= RATE_BOUND


def test_lexical_not_structural_decides():
    assert claim_lexical_not_structural(types_table(lambda d: 0.1 * d, lambda d: 0.0, noise=0.01))[1] == "holds"
    # equal gains of 20 points, measured tightly: excludes the paper's COGS-vf gain (56.9 points)
    assert claim_lexical_not_structural(types_table(lambda d: 0.04 * d, lambda d: 0.04 * d, noise=0.01))[1] \
        == "does not hold"


def test_structural_near_zero():
    at_floor = types_table(lambda d: 0.017, lambda d: 0.028, noise=0.005)  # the committed cpu numbers' level
    assert claim_structural_near_zero(at_floor)[1] == "not testable"
    assert claim_structural_near_zero(types_table(lambda d: 0.6, lambda d: 0.005, noise=0.003))[1] == "holds"
    assert claim_structural_near_zero(types_table(lambda d: 0.6, lambda d: 0.2, noise=0.02))[1] == "does not hold"


# --- Fig. 2, 3: perplexity -----------------------------------------------------------------------------------------

def ppl_table(log_ppl, seeds=4, noise=0.003, rng=None, depths=DEPTHS) -> pd.DataFrame:
    rng = rng or np.random.default_rng(0)
    rows = [dict(size_class="c", n_layers=d, seed=s, split="v", loss=log_ppl(d) + rng.normal(0, noise))
            for s in range(seeds) for d in depths]
    return pd.DataFrame(rows).assign(ppl=lambda t: np.exp(t.loss))


def test_depth_lowers_ppl():
    rng = np.random.default_rng(7)
    null = [claim_depth_lowers_ppl(ppl_table(lambda d: 4.1, rng=rng), "v")[1] for _ in range(DRAWS)]
    assert rate(null) <= RATE_BOUND
    assert claim_depth_lowers_ppl(ppl_table(lambda d: 4.1 + 0.3 / d), "v")[1] == "holds"
    assert claim_depth_lowers_ppl(ppl_table(lambda d: 4.1 + 0.01 * d), "v")[1] == "does not hold"  # the cpu shape
    with pytest.raises(ValueError, match="no split 'x'"):
        claim_depth_lowers_ppl(ppl_table(lambda d: 4.1), "x")


def test_diminishing_returns():
    assert claim_diminishing_returns(ppl_table(lambda d: 4.1 + 0.01 * d), "v")[1] == "not testable"  # no 1->2 gain
    rng = np.random.default_rng(8)
    linear = [claim_diminishing_returns(ppl_table(lambda d: 4.5 - 0.1 * d, rng=rng), "v")[1] for _ in range(DRAWS)]
    assert rate(linear) <= RATE_BOUND  # equal gains 1->2 and 2->4 per layer... 2->4 is larger: never holds
    assert claim_diminishing_returns(ppl_table(lambda d: 4.1 + 0.4 / d), "v")[1] == "holds"


def test_narrow_degrades():
    rising = ppl_table(lambda d: 4.1 + 0.02 * d)  # the committed cpu shape: worse with every layer
    assert claim_narrow_degrades(rising, "v")[1] == "not testable"
    u_shape = ppl_table(lambda d: 4.1 + 0.03 * (d - 3) ** 2)
    assert claim_narrow_degrades(u_shape, "v")[1] == "holds"
    rng = np.random.default_rng(9)
    flat_end = [claim_narrow_degrades(ppl_table(lambda d: 4.1 + 0.4 / min(d, 3), rng=rng), "v")[1] for _ in range(DRAWS)]
    assert rate(flat_end) <= RATE_BOUND


# --- Fig. 6, 7: the controls ---------------------------------------------------------------------------------------

def equal_ppl_selection(acc: pd.DataFrame, gap: float) -> pd.DataFrame:
    deepest = acc.n_layers.max()
    return acc.assign(reference_depth=deepest, status=np.where(acc.n_layers == deepest, "reference", "matched"),
                      rel_gap=np.where(acc.n_layers == deepest, 0.0, gap), step=np.where(acc.n_layers == deepest, 10, 5),
                      target_ppl=60.0)


def test_equal_ppl():
    effect = accuracy_table(lambda d: 0.2 + 0.1 * d, noise=0.02)
    assert claim_equal_ppl(equal_ppl_selection(effect, -0.05), "geoquery")[1] == "not testable"  # loose match
    assert claim_equal_ppl(equal_ppl_selection(effect, -0.005), "geoquery")[1] == "holds"
    rng = np.random.default_rng(10)
    null = [claim_equal_ppl(equal_ppl_selection(shuffle_within_seed(effect, rng), -0.005), "geoquery")[1]
            for _ in range(DRAWS)]
    assert rate(null) <= RATE_BOUND


def test_equal_loss():
    effect = accuracy_table(lambda d: 0.2 + 0.1 * d, noise=0.02)
    loose = effect.assign(threshold=0.02, loss=np.where(effect.n_layers == 1, 0.008, 0.02), step=800)
    assert claim_equal_loss(loose, "geoquery")[1] == "not testable"
    tight = effect.assign(threshold=0.02, loss=0.0195, step=800)
    assert claim_equal_loss(tight, "geoquery")[1] == "holds"
    rng = np.random.default_rng(11)
    null = [claim_equal_loss(shuffle_within_seed(tight, rng), "geoquery")[1] for _ in range(DRAWS)]
    assert rate(null) <= RATE_BOUND


# --- Fig. 8, 9 -----------------------------------------------------------------------------------------------------

def latency_table(seconds_of, depths=DEPTHS, rounds=3, noise=0.0, rng=None) -> pd.DataFrame:
    "A petty_fig8_latency_rounds-like table: per depth and round, seconds_of(depth) plus Gaussian noise."
    rng = rng or np.random.default_rng(0)
    return pd.DataFrame([dict(size_class="c", n_layers=d, round=r, seconds=seconds_of(d) + rng.normal(0, noise),
                              device="cpu") for r in range(rounds) for d in depths])


LINE = lambda d: 0.05 + 0.01 * d  # noqa: E731
CURVE = lambda d: 0.05 + 0.004 * d * d  # noqa: E731  the same rise from 1 to 6 layers, bowed


def test_latency_each_verdict():
    assert claim_latency_linear(latency_table(LINE, noise=0.0005))[1] == "holds"
    evidence, verdict = claim_latency_linear(latency_table(CURVE, noise=0.0005))
    assert verdict == "does not hold" and "quadratic term" in evidence, evidence
    assert claim_latency_linear(latency_table(lambda d: 0.2 - 0.01 * d, noise=0.0005))[1] == "does not hold"
    assert claim_latency_linear(latency_table(LINE, noise=0.004))[1] == "inconclusive"  # a line, too noisy to tell
    evidence, verdict = claim_latency_linear(latency_table(LINE, depths=(1, 3, 6), noise=0.0005))
    assert verdict == "not testable" and "3 depths" in evidence, evidence  # three points: a line and a curve alike
    assert claim_latency_linear(latency_table(LINE, rounds=2, noise=0.0005))[1] == "not testable"
    assert claim_latency_linear(latency_table(LINE).drop(columns="round"))[1] == "not testable"  # no rounds recorded
    busy = latency_table(LINE, noise=0.0005)
    busy.loc[(busy.n_layers == 3) & (busy["round"] == 1), "seconds"] *= 1.5  # one round slowed by other work
    evidence, verdict = claim_latency_linear(busy)
    assert verdict == "not testable" and "not measured: timings unstable across rounds" in evidence, evidence
    assert claim_latency_linear(latency_table(lambda d: 0.1, noise=0.002))[1] == "not testable"  # flat: no slope


def test_latency_null_rates():
    rng = np.random.default_rng(12)
    # flat step times: never a line that rises
    assert rate([claim_latency_linear(latency_table(lambda d: 0.1, noise=0.002, rng=rng))[1] for _ in range(DRAWS)]) == 0
    # a curve whose bow is 3x the margin: "holds" at most at the nominal rate
    assert rate([claim_latency_linear(latency_table(CURVE, noise=0.004, rng=rng))[1] for _ in range(DRAWS)]) <= RATE_BOUND
    # a true line: "does not hold" at most at the nominal rate
    lines = [claim_latency_linear(latency_table(LINE, noise=0.002, rng=rng))[1] for _ in range(DRAWS)]
    assert rate(lines, "does not hold") <= RATE_BOUND


def rank_table(init_auc, trained_auc) -> pd.DataFrame:
    ratio = np.array([0.09, 0.2, 0.35, 0.55, 1.29])
    frames = [pd.DataFrame(dict(size_class="c", projection="input", n_layers=DEPTHS, ff_ratio=ratio, auc=a, label=lab))
              for a, lab in ((init_auc, "init"), (trained_auc, "trained"))]
    return pd.concat(frames, ignore_index=True)


def test_rank_compares_against_init():
    init = np.array([0.54, 0.57, 0.59, 0.62, 0.65])  # rises with the ratio already (Marchenko-Pastur)
    # training adds the same to every depth: the trained AUC still correlates +1 with the ratio, but the rule must not hold
    assert claim_rank_deficient(rank_table(init, init + 0.05))[1] != "holds"
    assert claim_rank_deficient(rank_table(init, init + np.array([0.01, 0.02, 0.03, 0.04, 0.05])))[1] == "holds"
    assert claim_rank_deficient(rank_table(init, init + np.array([0.05, 0.04, 0.03, 0.02, 0.01])))[1] == "does not hold"
    rng = np.random.default_rng(13)
    null = [claim_rank_deficient(rank_table(init, init + rng.normal(0.05, 0.01, 5)))[1] for _ in range(100)]
    assert rate(null) <= 0.025 + 1.96 * np.sqrt(0.025 * 0.975 / 100)


# --- single runs: the stacking study -------------------------------------------------------------------------------

STACK_T1 = pd.DataFrame(dict(method=["baseline", "gradstack", "midas"], val_loss=[4.153, 4.084, 4.081],
                             flop_speedup=[1.0, 1.24, 1.24]))
PAPER_T1 = pd.DataFrame(dict(model=["1B", "1B"], method=["Baseline", "MIDAS"], val_loss=[2.0, 2.036],
                             schedule=[None, "Prop-1"], speedup=[1.0, 1.39]))


def test_single_runs_are_never_decided():
    family = ppl_table(lambda d: 4.1, seeds=2)
    assert claim_midas_loss_near_baseline(STACK_T1, PAPER_T1, family, "v")[1] == "inconclusive"
    assert claim_midas_beats_gradstack(STACK_T1, family, "v")[1] == "inconclusive"
    cogs = pd.DataFrame(dict(task="COGS-vf", method=["baseline", "midas"], accuracy=[1.5, 12.75]))
    assert claim_midas_cogs(cogs)[1] == "not testable"  # one stacking seed per method: no interval


def midas_cogs_table(gap, seeds=4, noise=2.0, rng=None) -> pd.DataFrame:
    rng = rng or np.random.default_rng(0)
    rows = []
    for s in range(seeds):
        base = 20 + rng.normal(0, noise)
        rows += [dict(task="COGS-vf", method="baseline", seed=s, accuracy=base),
                 dict(task="COGS-vf", method="midas", seed=s, accuracy=base + gap + rng.normal(0, noise))]
    return pd.DataFrame(rows)


def test_midas_cogs_with_seeds():
    assert claim_midas_cogs(midas_cogs_table(10.0))[1] == "holds"
    assert claim_midas_cogs(midas_cogs_table(-10.0))[1] == "does not hold"
    rng = np.random.default_rng(14)
    null = [claim_midas_cogs(midas_cogs_table(0.0, rng=rng))[1] for _ in range(DRAWS)]
    assert rate(null) <= RATE_BOUND
    at_floor = midas_cogs_table(0.5, noise=0.2).assign(accuracy=lambda t: t.accuracy / 100)  # 0.2% accuracies
    assert claim_midas_cogs(at_floor)[1] == "not testable"


# --- the power calculation -----------------------------------------------------------------------------------------

def test_power_calculation():
    assert seeds_for_half_width(0.108, 0.10) == 7
    assert half_width(0.108, 7) <= 0.10 < half_width(0.108, 6)
    # the achieved half-width, simulated: the t-interval over 7 seeds covers the true mean ~95% of the time
    rng = np.random.default_rng(15)
    covered = [abs((iv := t_interval(rng.normal(0.0, 0.108, 7))).mean) <= iv.hi - iv.mean for _ in range(2000)]
    assert 0.93 <= np.mean(covered) <= 0.97
    with pytest.raises(ValueError, match="n >= 2"):
        half_width(0.1, 1)


# --- every rule with the paper's sign and value --------------------------------------------------------------------

def test_paper_effects_have_the_papers_sign_and_value():
    from depthnb.claims.midas import paper_midas_gaps
    from depthnb.paper import GRADSTACK_GAP
    from depthnb.claims.petty import (bend, paper_accuracy, paper_contrast, paper_diminishing, paper_log_ppl)
    assert round(paper_log_ppl(1) - paper_log_ppl(2), 3) == 0.385  # Fig. 2: ln(45.7 / 31.1), deeper is lower
    assert round(paper_diminishing(), 3) == 0.308  # Fig. 3a: the 1 -> 2 gain exceeds the 2 -> 4 gain
    assert round(paper_log_ppl(7) - paper_log_ppl(6), 3) == 0.017  # Fig. 3: the narrow end turns up
    assert round(paper_contrast("geoquery", DEPTHS), 3) == 0.093  # Fig. 4: 77.5% - 68.2%
    assert paper_contrast("passivization", (1, 6)) > 0.7  # Fig. 4: +74.1 points
    acc = paper_accuracy("geoquery", (1, 3, 6))
    assert bend(acc, 1, 3, 6) > 0  # saturation: the curve bends over by the middle depth
    assert round(GRADSTACK_GAP, 3) == 0.017  # Saunshi Table 1: GradStack 2.045 minus MIDAS 2.028
    paper_t1 = pd.DataFrame(dict(model=["1B", "1B", "1B"], method=["Baseline", "MIDAS", "MIDAS"],
                                 val_loss=[2.0, 2.036, 1.99]))
    assert round(paper_midas_gaps(paper_t1, "val_loss").max(), 3) == 0.036  # the non-inferiority margin's sign


def test_diminishing_returns_acceptance():
    # the 1 -> 2 gain (0.1 nats) is smaller than the 2 -> 4 gain (0.3): the opposite of the paper's claim
    smaller_first = ppl_table(lambda d: {1: 4.6, 2: 4.5, 3: 4.35, 4: 4.2, 6: 4.1}[d], seeds=5)
    evidence, verdict = claim_diminishing_returns(smaller_first, "v")
    assert verdict == "does not hold", evidence
    assert "paper +0.308" in evidence


def test_diminishing_returns_null_equal_gains():
    sd = committed_spread("ppl")
    rng = np.random.default_rng(16)
    equal = {1: 4.6, 2: 4.4, 3: 4.3, 4: 4.2, 6: 4.1}  # 0.2 nats from 1 to 2 and from 2 to 4: nothing diminishes
    verdicts = [claim_diminishing_returns(ppl_table(lambda d: equal[d], seeds=10, noise=sd, rng=rng), "v")[1]
                for _ in range(DRAWS)]
    assert rate(verdicts) <= RATE_BOUND


# --- nulls simulated from the committed cpu tables' per-seed spread -------------------------------------------------

def committed_spread(kind: str) -> float:
    "The committed cpu run's seed-to-seed sd of one model: GeoQuery accuracy, or ln PPL (pooled over depths)."
    from pathlib import Path
    from depthnb.seeds import between_seed_sd
    root = Path(__file__).resolve().parents[1] / "figures" / "cpu"
    if kind == "ppl":
        ppl = pd.read_csv(root / "pretrain_final_ppl.csv").query("split == 'enwiki_valid'")
        return between_seed_sd(ppl.assign(log_ppl=np.log(ppl.ppl)), "log_ppl", ["n_layers"])[0]
    acc = pd.read_csv(root / "finetune_accuracy.csv").query("task == 'geoquery'")
    return between_seed_sd(acc, "accuracy", ["n_layers"])[0]


def test_depth_generalizes_null_at_the_observed_spread():
    sd = committed_spread("accuracy")
    assert 0.01 < sd < 0.3
    rng = np.random.default_rng(17)
    verdicts = [claim_depth_generalizes(accuracy_table(lambda d: 0.4, seeds=10, noise=sd / np.sqrt(2), rng=rng))[1]
                for _ in range(DRAWS)]
    assert rate(verdicts) <= RATE_BOUND


def test_depth_lowers_ppl_null_at_the_observed_spread():
    sd = committed_spread("ppl")
    rng = np.random.default_rng(18)
    verdicts = [claim_depth_lowers_ppl(ppl_table(lambda d: 4.1, seeds=10, noise=sd, rng=rng), "v")[1]
                for _ in range(DRAWS)]
    assert rate(verdicts) <= RATE_BOUND


# --- one floor -----------------------------------------------------------------------------------------------------

def test_one_floor_for_every_accuracy_claim():
    # MIDAS -> COGS-vf at the committed cpu means: MIDAS 4.8%, baseline 3.1%: the best method is at the floor
    cogs = midas_cogs_table(1.7, seeds=8, noise=0.5).assign(
        accuracy=lambda t: np.where(t.method == "midas", 4.8, 3.1) + np.tile([0.1, -0.1], 8))
    evidence, verdict = claim_midas_cogs(cogs)
    assert verdict == "not testable" and "at the floor" in evidence
    floor = accuracy_table(lambda d: 0.045, noise=0.0)  # every depth at 4.5%
    assert claim_depth_generalizes(floor)[1] == "not testable"


# --- Saunshi: wall clock, similarity ---------------------------------------------------------------------------------

def speedup_table(midas, looped, seeds=None, resumed=False) -> pd.DataFrame:
    midas, looped = np.atleast_1d(midas), np.atleast_1d(looped)
    seed = list(range(len(midas)))
    t = pd.concat([pd.DataFrame(dict(method="midas", seed=seed, flop_speedup=1.24, wall_speedup=midas, resumed=resumed)),
                   pd.DataFrame(dict(method="looped", seed=seed, flop_speedup=1.0, wall_speedup=looped, resumed=False))])
    return t if seeds else t.drop(columns="seed")


def test_wall_clock_against_the_no_flop_saving_control():
    from depthnb.claims.midas import claim_wall_clock
    # the committed cpu numbers: one run each, the looped control's 1.014x is the only error estimate (1 dof)
    assert claim_wall_clock(speedup_table(1.2381, 1.0142))[1] == "inconclusive"
    evidence, verdict = claim_wall_clock(speedup_table(1.2381, 1.0142, resumed=True))
    assert verdict == "not testable" and "not measured" in evidence
    rng = np.random.default_rng(19)
    assert claim_wall_clock(speedup_table(np.exp(np.log(1.24) + rng.normal(0, 0.01, 5)),
                                          np.exp(rng.normal(0, 0.01, 5)), seeds=True))[1] == "holds"
    # the null: MIDAS saves no time (both runs measure noise around 1x), one run each and paired over 5 seeds
    single = [claim_wall_clock(speedup_table(np.exp(rng.normal(0, 0.02)), np.exp(rng.normal(0, 0.02))))[1]
              for _ in range(DRAWS // 2)]
    paired = [claim_wall_clock(speedup_table(np.exp(rng.normal(0, 0.02, 5)), np.exp(rng.normal(0, 0.02, 5)), seeds=True))[1]
              for _ in range(DRAWS // 2)]
    assert rate(single) <= RATE_BOUND and rate(paired) <= RATE_BOUND
    assert rate(paired, "does not hold") > 0.9  # and the FLOP model's +0.214 is excluded


def similarity_table(midas_minus_gradstack, seeds=1, rng=None) -> pd.DataFrame:
    rng = rng or np.random.default_rng(0)
    weights = ["attn.k", "attn.q", "ffn.wi_0", "ffn.wo"]
    rows = []
    for s in range(seeds):
        grad = 0.6 + rng.normal(0, 0.02, len(weights))
        rows.append(pd.DataFrame(dict(weight=weights, seed=s, baseline=0.0, looped=1.0, gradstack=grad,
                                      midas=grad + midas_minus_gradstack + rng.normal(0, 0.02, len(weights)))))
    return pd.concat(rows, ignore_index=True)


def test_similarity_compares_midas_with_gradstack():
    from depthnb.claims.midas import claim_looped_similarity
    assert claim_looped_similarity(similarity_table(0.05).drop(columns="seed"))[1] == "inconclusive"  # one run each
    assert claim_looped_similarity(similarity_table(0.05, seeds=5))[1] == "holds"
    assert claim_looped_similarity(similarity_table(-0.05, seeds=5))[1] == "does not hold"
    rng = np.random.default_rng(20)
    null = [claim_looped_similarity(similarity_table(0.0, seeds=5, rng=rng))[1] for _ in range(DRAWS)]
    assert rate(null) <= RATE_BOUND  # MIDAS no more alike than GradStack, though both beat the baseline every time


# --- downstream: >= 3 runs per method and an interval ------------------------------------------------------------

def downstream_results(gap, seeds=1, base=0.2, noise=0.03, rng=None) -> pd.DataFrame:
    rng = rng or np.random.default_rng(0)
    rows = []
    for s in range(seeds):
        seed_effect = rng.normal(0, noise)
        for task, title in (("asdiv", "ASDiv"), ("svamp", "SVAMP")):
            for method, shift in (("baseline", 0.0), ("midas", gap)):
                acc = float(np.clip(base + seed_effect + shift + rng.normal(0, noise), 0, 1))
                rows += [dict(method=method, seed=s, task=task, title=title, group="math", calculator=calc, n=200,
                              accuracy=acc, missing=None, val_loss=4.0) for calc in (False, True)]
    t = pd.DataFrame(rows)
    return t if seeds > 1 else t.drop(columns="seed")


def math_verdict(results) -> tuple[str, str]:
    from depthnb.downstream_tables import DOWNSTREAM_CLAIMS
    check = next(check for where, _, check in DOWNSTREAM_CLAIMS if where == "§4.3, Tables 1, 5")
    return check(results, None)


def test_downstream_needs_three_runs_and_an_interval():
    evidence, verdict = math_verdict(downstream_results(0.3))  # one run per method, a huge binomial gap
    assert verdict == "not testable" and "at least 3 runs per method" in evidence
    assert math_verdict(downstream_results(0.3, seeds=2))[1] == "not testable"
    assert math_verdict(downstream_results(0.2, seeds=4))[1] == "holds"
    rng = np.random.default_rng(21)
    null = [math_verdict(downstream_results(0.0, seeds=4, rng=rng))[1] for _ in range(DRAWS // 3)]
    assert rate(null) <= 0.05 + 1.96 * np.sqrt(0.05 * 0.95 / (DRAWS // 3))
    floor = downstream_results(0.01, seeds=4, base=0.02, noise=0.002)
    assert math_verdict(floor)[1] == "not testable"  # the same floor as every accuracy claim


# --- robustness: leave one seed out ----------------------------------------------------------------------------------

def test_a_verdict_one_seed_carries_is_fragile(tmp_path):
    from depthnb.claims import CLAIMS, FigureTables, check_robust
    fig4 = next(c for c in CLAIMS if c.where == "Fig. 4" and c.claim.startswith("Deeper"))
    # GeoQuery: every seed gains; passivization: one seed carries the gain (the committed cpu shape)
    gains = [0.025, 0.0325, 0.23, 0.0725, 0.0, 0.0, 0.025, 0.065, 0.0, 0.14]
    rows = []
    for s, g in enumerate(gains):
        for d in (1, 6):
            rows.append(dict(size_class="c", task="passivization", n_layers=d, seed=s, accuracy=0.02 + (g if d == 6 else 0)))
            rows.append(dict(size_class="c", task="geoquery", n_layers=d, seed=s,
                             accuracy=0.3 + (0.16 + 0.01 * (s % 3) if d == 6 else 0)))
    pd.DataFrame(rows).to_csv(tmp_path / "finetune_accuracy.csv", index=False)
    evidence, verdict, stability = check_robust(fig4, FigureTables(tmp_path))
    assert verdict == "mixed"  # GeoQuery holds and stays; passivization holds on all ten seeds, not without seed 3, 7 or 9
    assert "GeoQuery: stable" in stability
    assert "English Passivization: fragile (holds on every seed): without seed 3, 7 or 9: does not hold" in stability
    geo = pd.DataFrame(rows).query("task == 'geoquery'")
    geo.to_csv(tmp_path / "finetune_accuracy.csv", index=False)
    assert check_robust(fig4, FigureTables(tmp_path))[1:] == ("holds", "stable: holds without any one of its 10 seeds")


# --- Fig. 6 with one target per seed; Fig. 7's refined picks; Table 1's loss paired over stacking seeds -------------

def test_equal_ppl_checks_the_references_against_their_target():
    "A target shared by all seeds leaves the references off it: beyond the tolerance, that is not testable either."
    effect = accuracy_table(lambda d: 0.2 + 0.1 * d, noise=0.02)
    per_seed = equal_ppl_selection(effect, -0.005)
    evidence, verdict = claim_equal_ppl(per_seed, "geoquery")
    assert verdict == "holds" and "each reference on its own seed's target" in evidence
    shared = per_seed.assign(rel_gap=np.where(per_seed.status == "reference", 0.024, per_seed.rel_gap))
    evidence, verdict = claim_equal_ppl(shared, "geoquery")
    assert verdict == "not testable" and "references +2.4% to +2.4% from it" in evidence


def test_equal_loss_counts_the_densely_evaluated_picks():
    effect = accuracy_table(lambda d: 0.2 + 0.1 * d, noise=0.02)
    n = int((effect.n_layers > 2).sum())
    for column in ("dense", "refined"):  # this procedure's tables, and those made before it
        tight = effect.assign(threshold=0.02, loss=0.0195, step=800, **{column: effect.n_layers > 2})
        evidence, verdict = claim_equal_loss(tight, "geoquery")
        assert verdict == "holds" and f"{n} of {len(effect)} picks in a retrained stretch" in evidence, evidence


def valid_loss_table(gap, seeds=8, sd=0.01, rng=None) -> pd.DataFrame:
    "Per stacking seed, the baseline's and MIDAS's final loss: a shared seed effect, MIDAS `gap` above the baseline."
    rng = rng or np.random.default_rng(0)
    shared = 4.1 + rng.normal(0, sd, seeds)
    return pd.DataFrame([dict(method=m, seed=s, val_loss=shared[s] + (gap if m == "midas" else 0.0) + rng.normal(0, sd))
                         for s in range(seeds) for m in ("baseline", "midas")])


def test_midas_loss_paired_over_stacking_seeds():
    family = ppl_table(lambda d: 4.1, seeds=2)
    margin = 0.036  # PAPER_T1: the paper's MIDAS-minus-baseline gap at its only schedule, positive (MIDAS slightly worse)
    evidence, verdict = claim_midas_loss_near_baseline(STACK_T1, PAPER_T1, family, "v", valid_loss_table(-0.05))
    assert verdict == "holds" and "per stacking seed" in evidence and "over 8 seeds" in evidence
    assert "seed 7 " in evidence and len(evidence.split("seed 0 ")[1].split(",")[0].split(".")[1]) == 6  # 6 decimals
    assert claim_midas_loss_near_baseline(STACK_T1, PAPER_T1, family, "v", valid_loss_table(0.1))[1] == "does not hold"
    one = valid_loss_table(-0.05, seeds=1)  # one stacking seed: the single-run rule, never decided
    assert claim_midas_loss_near_baseline(STACK_T1, PAPER_T1, family, "v", one)[1] == "inconclusive"
    # the null of non-inferiority: MIDAS exactly the margin worse; "holds" at most about 2.5% of the time
    rng = np.random.default_rng(21)
    null = [claim_midas_loss_near_baseline(STACK_T1, PAPER_T1, family, "v", valid_loss_table(margin, rng=rng))[1]
            for _ in range(DRAWS)]
    assert rate(null) <= RATE_BOUND


# --- the rules' decisions and evidence on small hand-made tables ------------------------------------------------------

def test_structural_near_zero_uses_the_deepest_and_says_so():
    from depthnb.claims.petty import claim_structural_near_zero

    # structural far above the floor except at the deepest: only the deepest counts
    deep_only = types_table(lambda d: 0.6, lambda d: 0.3 if d < max(DEPTHS) else 0.005, noise=0.003)
    deep_only = deep_only.assign(task="my_task")
    evidence, verdict = claim_structural_near_zero(deep_only)
    assert verdict == "holds"
    assert evidence.startswith("c/my_task: structural at the deepest +0.7 %, 95% interval [+0.2, +1.1] over 5 seeds "
                               "(lexical 60.1%). Holds if the interval lies below 5.0%")
    # an interval across the floor decides nothing
    rows = [dict(size_class="c", task="cogs_vf", n_layers=d, seed=s, generalization_type=kind,
                 accuracy=0.6 if kind == "lexical" else v)
            for s, v in enumerate([0.03, 0.07, 0.05, 0.04, 0.06]) for d in DEPTHS for kind in ("lexical", "structural")]
    evidence, verdict = claim_structural_near_zero(pd.DataFrame(rows))
    assert verdict == "inconclusive"
    assert evidence.startswith("c/COGS-vf: structural at the deepest +5.0 %, 95% interval [+3.0, +7.0] over 5 seeds "
                               "(lexical 60.0%)")


def test_table1_speedups_decide_on_the_printed_values(monkeypatch):
    from depthnb.claims import midas
    from depthnb.claims.midas import as_printed, claim_table1_speedups, rounded_once
    from depthnb.schedules import TABLE1_SPEEDUPS, speedup

    evidence, verdict = claim_table1_speedups()
    n = len(TABLE1_SPEEDUPS)
    assert verdict == "holds" and evidence.startswith(f"{n} of {n} rows of Table 1 match")
    assert "1B GradStack L24 b4 Prop-1: 1.3846 -> 1.39 (1.39)" in evidence
    assert "3 of the 11 matches hold only under double rounding (to 3 decimals, then 2): 1.3846 -> 1.39, where " \
           "rounding once gives 1.38; the others match either way." in evidence
    m, method, layers, b, a, paper = TABLE1_SPEEDUPS[0]
    wrong = [(m, method, layers, b, a, paper + 0.01), *TABLE1_SPEEDUPS[1:]]
    monkeypatch.setattr(midas, "TABLE1_SPEEDUPS", wrong)
    evidence, verdict = claim_table1_speedups()
    assert verdict == "does not hold" and evidence.startswith(f"{n - 1} of {n} rows of Table 1 match")
    once = [r for r in TABLE1_SPEEDUPS if rounded_once(speedup(*r[2:5], op=r[1].lower())) == r[5]]
    assert once and all(as_printed(speedup(*r[2:5])) == r[5] for r in once)
    monkeypatch.setattr(midas, "TABLE1_SPEEDUPS", once)
    evidence, verdict = claim_table1_speedups()
    assert verdict == "holds"
    assert evidence.endswith(f"0 of the {len(once)} matches hold only under double rounding (to 3 decimals, then 2): "
                             "none; the others match either way.")


def table1(base_loss, midas_loss, base_avg, midas_avg) -> pd.DataFrame:
    "Our Table 1 as `claim_downstream_beyond_ppl` reads it: one row per method, a loss column, the primitives' average."
    return pd.DataFrame(dict(method=["baseline", "midas"], valid_loss=[base_loss, midas_loss],
                             primitives_average=[base_avg, midas_avg]))


def test_downstream_beyond_ppl_decides_on_the_relative_changes():
    from depthnb.claims.midas import claim_downstream_beyond_ppl

    paper = pd.DataFrame(dict(model=["1B", "1B"], method=["Baseline", "MIDAS"], val_loss=[2.0, 1.99],
                              average=[30.0, 33.0]))
    # MIDAS's accuracy gain (+10%) beats its perplexity change (+1%, worse): a gain beyond perplexity, one run each
    evidence, verdict = claim_downstream_beyond_ppl(table1(2.0, 2.01, 20.0, 22.0), paper)
    assert verdict == "inconclusive"
    assert evidence == ("MIDAS vs baseline: PPL +1.0% (valid_loss 2.010 vs 2.000), primitive average 22.0% vs 20.0% "
                        "(+10.0%); one run per method, no interval. Paper (Table 1, 1 MIDAS rows vs their baseline): "
                        "PPL -1.0% to -1.0%, downstream average +10.0% to +10.0%.")
    # the accuracy gain (+2%) is no more than the perplexity gain (-4.9%) explains
    assert claim_downstream_beyond_ppl(table1(2.0, 1.95, 20.0, 20.4), paper)[1] == "does not hold"
    assert claim_downstream_beyond_ppl(table1(2.0, 2.01, 20.0, 20.0), paper)[1] == "does not hold"  # no gain at all
    # the floor: the better method's average at most 5%
    evidence, verdict = claim_downstream_beyond_ppl(table1(2.0, 2.01, 5.0, 3.0), paper)
    assert verdict == "not testable"
    assert evidence.startswith("primitive average at the floor for both methods (3.0% MIDAS")
    assert claim_downstream_beyond_ppl(table1(2.0, 2.01, 5.03, 4.0), paper)[1] == "does not hold"  # just above it


def iso_table(gaps, tasks=("Copying (random-letter words)", "Copying (real words)"), floor_task=None) -> pd.DataFrame:
    """Isoplot points (Saunshi Fig. 4): per seed and primitive, baseline and MIDAS snapshots at the same validation
    losses, MIDAS `gaps[seed]` more accurate; `floor_task` at the floor for both."""
    rows = []
    for s, gap in enumerate(gaps):
        for task in tasks + ((floor_task,) if floor_task else ()):
            for step, loss in enumerate((3.0, 2.9, 2.8, 2.7)):
                base = 0.01 if task == floor_task else 0.3 + (3.0 - loss)
                for method, acc in (("baseline", base), ("midas", base if task == floor_task else base + gap)):
                    rows.append(dict(task=task, seed=s, step=100 * (step + 1), method=method, val_loss=loss,
                                     accuracy=acc))
    return pd.DataFrame(rows)


def test_isoplots_decide_over_seeds_at_matched_loss():
    from depthnb.claims.midas import claim_isoplots

    evidence, verdict = claim_isoplots(iso_table([0.10, 0.12, 0.14, 0.16]))
    assert verdict == "holds"
    assert evidence.startswith("Copying (random-letter words): MIDAS +13.0 points over 16 matched losses in "
                               "[2.700, 3.000] nats; Copying (real words): MIDAS +13.0 points over 16 matched losses "
                               "in [2.700, 3.000] nats; mean over primitives +13.0 points, 95% interval [+8.9, +17.1] "
                               "over 4 seeds; paper +8.4. Paper: Fig. 4")
    evidence, verdict = claim_isoplots(iso_table([-0.10, -0.12, -0.14, -0.16]))
    assert verdict == "does not hold"
    # no lead: an interval across 0 lies below the paper's lead on these primitives (Table 6)...
    assert claim_isoplots(iso_table([0.001, -0.001, 0.002, -0.002]))[1] == "does not hold"
    # ...and decides nothing on primitives Table 6 does not list
    evidence, verdict = claim_isoplots(iso_table([0.001, -0.001, 0.002, -0.002], tasks=("my primitive",)))
    assert verdict == "inconclusive" and "over 4 seeds. Paper: Fig. 4" in evidence
    silent = "Variable assignment depth 0 (basic)"
    evidence, verdict = claim_isoplots(iso_table([0.02, 0.021, 0.019, 0.02], floor_task=silent))
    assert verdict == "holds" and f"; left out (at the floor for both): {silent}; " in evidence
    assert "Variable assignment depth 0 (basic): MIDAS" not in evidence
    # a table without seeds is one run: no interval
    evidence, verdict = claim_isoplots(iso_table([0.10]).drop(columns="seed"))
    assert verdict == "inconclusive" and "(one seed: no interval)" in evidence
    assert claim_isoplots(iso_table([0.1, 0.12]).query("method == 'baseline'")) == \
        ("no midas snapshots in the table", "not testable")
    assert claim_isoplots(iso_table([0.1, 0.12]).assign(method="gradstack")) == \
        ("no baseline or midas snapshots in the table", "not testable")
    apart = iso_table([0.1, 0.12])
    apart.loc[apart.method == "midas", "val_loss"] -= 1
    assert claim_isoplots(apart) == ("the baseline's and MIDAS's snapshots share no validation-loss range",
                                     "not testable")
    floor = iso_table([0.0, 0.0], tasks=(), floor_task="Copying (real words)")
    evidence, verdict = claim_isoplots(floor)
    assert verdict == "not testable"
    assert evidence == "at the floor (5.0%) for both methods at every snapshot on Copying (real words)"


def test_vf_saturates_sooner_compares_the_bends():
    from depthnb.claims.petty import claim_vf_saturates_sooner

    rng = np.random.default_rng(31)
    early = lambda d: min(0.2 + 0.25 * d, 0.8)  # noqa: E731  flat from 3 layers on: bends over
    linear = lambda d: 0.1 + 0.1 * d  # noqa: E731
    both = lambda vf, cogs: pd.concat([accuracy_table(vf, noise=0.02, rng=rng, task="cogs_vf"),  # noqa: E731
                                       accuracy_table(cogs, noise=0.02, rng=rng, task="cogs")])
    evidence, verdict = claim_vf_saturates_sooner(both(early, linear))
    assert verdict == "holds"
    assert evidence == ("c: COGS-vf's bend minus COGS's +43.8 points, 95% interval [+37.7, +49.8] over 5 seeds. Paper "
                        "(Table 3, 90% rule): 41M COGS 4 layers, COGS-vf 2; 134M COGS 4 layers, COGS-vf 2; 374M COGS 6 "
                        "layers, COGS-vf 2.")  # the bends: +35 and -10 points
    assert claim_vf_saturates_sooner(both(linear, early))[1] == "does not hold"
    evidence, verdict = claim_vf_saturates_sooner(both(early, lambda d: 0.3))  # COGS does not rise with depth
    assert verdict == "not testable" and evidence.startswith("c: no established gain with depth on both tasks")
    # a size class without a gain is left out; the next one still decides
    two = pd.concat([both(early, lambda d: 0.3).assign(size_class="a"), both(early, linear).assign(size_class="b")])
    evidence, verdict = claim_vf_saturates_sooner(two)
    assert verdict == "holds" and evidence.startswith("a: no established gain with depth on both tasks; b: COGS-vf's")
    evidence, verdict = claim_vf_saturates_sooner(both(early, linear).query("task == 'cogs'"))
    assert verdict == "not reproducible here" and evidence.startswith("no COGS-vf fine-tuning at this preset")


def test_latency_verdicts_and_evidence():
    evidence, verdict = claim_latency_linear(latency_table(LINE, noise=0.0005))
    assert verdict == "holds" and evidence.startswith("c on cpu, 5 depths x 3 rounds: slope 0.00989 s/layer"), evidence
    assert "against a line's band of +-" in evidence and "Paper: strongly linear" in evidence
    evidence, verdict = claim_latency_linear(latency_table(lambda d: 0.1, noise=0.002))
    assert verdict == "not testable"
    assert "; the slope's interval spans 0: depth moves the step time less than the timing noise" in evidence
    evidence, verdict = claim_latency_linear(latency_table(LINE, depths=(1, 2)))
    assert verdict == "not testable" and "2 depths (1, 2) x 3 timing round(s)" in evidence, evidence


def table6(arithmetic, no_calculator, calculator) -> pd.DataFrame:
    "Table 6's three arithmetic rows, each (MIDAS, baseline) accuracy in %; the paper's columns fixed."
    rows = [("Arithmetic-only", arithmetic), ("Pre-school math (PSM), no calculator", no_calculator),
            ("Pre-school math (PSM), with calculator", calculator)]
    return pd.DataFrame([{"title": title, "midas": m, "baseline": b, "paper MIDAS": 20.0, "paper baseline": 10.0}
                         for title, (m, b) in rows])


def test_arithmetic_poor_without_a_calculator():
    from depthnb.claims.midas import claim_arithmetic_poor

    evidence, verdict = claim_arithmetic_poor(table6((12.0, 10.0), (15.0, 14.0), (40.0, 45.0)))
    assert verdict == "holds"
    assert evidence.startswith("MIDAS / baseline: arithmetic 12.0% / 10.0%, no calculator 15.0% / 14.0%, calculator "
                               "40.0% / 45.0%. Paper: arithmetic 20.0% / 10.0%")
    assert claim_arithmetic_poor(table6((12.0, 10.0), (15.0, 45.0), (40.0, 45.0)))[1] == "does not hold"  # a tie
    assert claim_arithmetic_poor(table6((41.0, 10.0), (15.0, 14.0), (40.0, 45.0)))[1] == "does not hold"
    evidence, verdict = claim_arithmetic_poor(table6((1.0, 2.0), (3.0, 4.0), (5.0, 5.0)))  # the best cell at 5%
    assert verdict == "not testable" and evidence.startswith("at the floor (5.0%) for both methods on all three rows")
    assert claim_arithmetic_poor(table6((1.0, 2.0), (3.0, 4.0), (5.03, 5.0)))[1] == "holds"  # just above the floor
    evidence, verdict = claim_arithmetic_poor(table6((12.0, 10.0), (15.0, 14.0), (40.0, 45.0)).iloc[:2])
    assert (evidence, verdict) == ("no Pre-school math (PSM), with calculator row at this preset", "not testable")


def test_rules_go_on_past_a_class_they_leave_out():
    "A size class a rule cannot test is left out, and the next class still decides."
    two = pd.concat([ppl_table(lambda d: 4.1 + 0.02 * d).assign(size_class="a"),
                     ppl_table(lambda d: 4.1 + 0.03 * (d - 3) ** 2).assign(size_class="b")])
    evidence, verdict = claim_narrow_degrades(two, "v")
    assert verdict == "holds" and "perplexity does not fall from 1 to 2 layers" in evidence.split("; b: ")[0]


def test_midas_beats_gradstack_needs_a_gradstack_run():
    t1 = pd.DataFrame(dict(method=["baseline", "midas"], valid_loss=[2.0, 1.99]))
    assert claim_midas_beats_gradstack(t1, None, "v") == ("no GradStack run at this preset", "not testable")


def test_narrow_degrades_an_upturn_smaller_than_the_papers_does_not_hold():
    "Perplexity falls first; the narrow end's interval straddles 0 but lies below the paper's +0.017 nats: does not hold."
    t = ppl_table(lambda d: 4.1 + 0.4 / min(d, 3))
    at4 = t[t.n_layers == 4].set_index("seed").loss
    wobble = pd.Series({0: 0.004, 1: -0.004, 2: 0.002, 3: -0.002})  # deepest minus next per seed: mean 0, hi ~ +0.006
    deepest = t.n_layers == 6
    t.loc[deepest, "loss"] = t.loc[deepest, "seed"].map(at4 + wobble).to_numpy()
    assert claim_narrow_degrades(t.assign(ppl=np.exp(t.loss)), "v")[1] == "does not hold"


def test_midas_beats_gradstack_proxy_reads_the_papers_gap():
    "The single-run proxy interval of GradStack minus MIDAS is read against the paper's gap, not against 0."
    def family(spread):  # two seeds per depth, `spread` nats apart
        return pd.DataFrame(dict(size_class="c", split="v", n_layers=[1, 1, 2, 2], seed=[0, 1, 0, 1],
                                 loss=[4.1, 4.1 + spread, 4.2, 4.2 + spread]))
    evidence, verdict = claim_midas_beats_gradstack(STACK_T1, family(0.002), "v")  # +0.003, interval ~[-0.006, +0.012]
    assert verdict == "inconclusive" and evidence.endswith("(the proxy interval alone would say: does not hold). "
                                                           "Paper: MIDAS lower at every schedule (2.028 vs 2.045, 1B Prop-1).")
    evidence, verdict = claim_midas_beats_gradstack(STACK_T1, family(0.02), "v")  # wide enough to reach the paper's gap
    assert verdict == "inconclusive" and "(the proxy interval alone would say: inconclusive)" in evidence


def test_similarity_missing_columns_and_midas_below_the_baseline():
    from depthnb.claims.midas import claim_looped_similarity
    evidence, verdict = claim_looped_similarity(similarity_table(0.05, seeds=5).drop(columns=["gradstack", "midas"]))
    assert (evidence, verdict) == ("no gradstack, midas column: the rule compares MIDAS with GradStack and the baseline",
                                   "not testable")
    below = similarity_table(0.05, seeds=5)
    below.loc[below.weight == "ffn.wo", "baseline"] = 0.95  # above MIDAS (~0.65) in one weight type
    evidence, verdict = claim_looped_similarity(below)
    assert verdict == "does not hold"  # though MIDAS beats GradStack on every seed (the interval alone: holds)
    assert "MIDAS above the baseline in 3 of 4 rows" in evidence and evidence.endswith("are most alike.")


def chance_table(depth0, depth2, chance=20.0) -> pd.DataFrame:
    "Table 6's variable-assignment rows at depths 0 and 2, each (MIDAS, baseline) accuracy in %."
    rows = [("Variable assignment depth 0 (basic)", depth0), ("Variable assignment depth 2 (basic)", depth2)]
    return pd.DataFrame([{"title": t, "midas": m, "baseline": b, "paper MIDAS": 18.9, "paper baseline": 17.7,
                          "random guess": chance} for t, (m, b) in rows])


def test_depth2_at_chance_reads_the_choice_table_only_when_exact_match_decides_nothing():
    from depthnb.claims.midas import claim_depth2_at_chance
    decided = chance_table(depth0=(60.0, 50.0), depth2=(21.0, 19.0))  # beats chance at depth 0, at chance at depth 2
    at_chance = chance_table(depth0=(20.0, 20.0), depth2=(20.0, 20.0))
    evidence, verdict = claim_depth2_at_chance(decided, at_chance, 100)
    assert verdict == "holds" and evidence.startswith("depth 2, MIDAS / baseline: basic 21.0% / 19.0%")
    assert "midas_table6_choice" not in evidence
    evidence, verdict = claim_depth2_at_chance(at_chance, decided, 100)
    assert verdict == "holds" and evidence.startswith("exact match: neither model beats random guessing")


# --- Fig. 6, 7 by the paper's procedure (issue 56) ----------------------------------------------------------------

def paper_fig6_selection(acc: pd.DataFrame, ppl_by_depth, gap: float = -0.005) -> pd.DataFrame:
    """A petty_fig6_selection-like table of the paper's procedure: the shallowest depth is the reference (final PPL
    `ppl_by_depth(shallowest)`), every deeper model matched at `gap`, or never reaching it where its best PPL is higher."""
    shallow = acc.n_layers.min()
    target = ppl_by_depth(shallow)
    rows = acc.assign(reference_depth=shallow, target_ppl=target, final_ppl=acc.n_layers.map(ppl_by_depth),
                      best_ppl=acc.n_layers.map(ppl_by_depth))
    reached = rows.best_ppl <= target
    return rows.assign(status=np.where(rows.n_layers == shallow, "reference", np.where(reached, "matched", "never_reached")),
                       rel_gap=np.where(rows.n_layers == shallow, 0.0, np.where(reached, gap, np.nan)),
                       step=np.where(rows.n_layers == shallow, 10, 5),
                       accuracy=np.where(reached | (rows.n_layers == shallow), rows.accuracy, np.nan))


def test_equal_ppl_paper_each_verdict():
    from depthnb.claims.petty import claim_equal_ppl_paper

    falls = lambda d: 70.0 - d  # noqa: E731  deeper models reach the 1-layer PPL
    rises = lambda d: 60.0 + d  # noqa: E731  depth raises perplexity, as at cpu
    effect = accuracy_table(lambda d: 0.2 + 0.1 * d, noise=0.02)
    assert claim_equal_ppl_paper(paper_fig6_selection(effect, falls), "geoquery")[1] == "holds"
    worse = accuracy_table(lambda d: 0.8 - 0.1 * d, noise=0.02)
    assert claim_equal_ppl_paper(paper_fig6_selection(worse, falls), "geoquery")[1] == "does not hold"
    flat = accuracy_table(lambda d: 0.5, noise=0.2)
    assert claim_equal_ppl_paper(paper_fig6_selection(flat, falls), "geoquery")[1] == "inconclusive"
    evidence, verdict = claim_equal_ppl_paper(paper_fig6_selection(effect, rises), "geoquery")
    assert verdict == "not testable" and "depth does not lower perplexity at this scale" in evidence, evidence
    reversed_control = equal_ppl_selection(effect, -0.005).assign(final_ppl=lambda t: t.n_layers.map(falls),
                                                                  best_ppl=lambda t: t.n_layers.map(falls))
    evidence, verdict = claim_equal_ppl_paper(reversed_control, "geoquery")  # reached, but matched to the deepest only
    assert verdict == "not testable" and "matched to the [6]-layer models only" in evidence, evidence
    rng = np.random.default_rng(20)
    null = [claim_equal_ppl_paper(paper_fig6_selection(shuffle_within_seed(effect, rng), falls), "geoquery")[1]
            for _ in range(DRAWS)]
    assert rate(null) <= RATE_BOUND


def fig7_tables(acc: pd.DataFrame, loss_at_pick, halfwidth: float | None = 0.02) -> tuple[pd.DataFrame, pd.DataFrame]:
    """petty_fig7_snapshots- and _selection-like tables: every run evaluated at steps 100..800 with its loss falling
    through the threshold 0.02 at step 500, where its loss is `loss_at_pick(depth)`, its accuracy is scored and (but
    for the shallowest depth, the reference) the set resolves its loss to `halfwidth` (None: a table without it)."""
    snaps, sel = [], []
    shallowest = acc.n_layers.min()
    for r in acc.itertuples():
        for step in range(100, 900, 100):
            loss = 0.05 if step < 500 else loss_at_pick(r.n_layers) if step == 500 else 0.01
            pick = step == 500 and r.n_layers != shallowest
            snaps.append(dict(n_layers=r.n_layers, seed=r.seed, step=step, dense=False, loss=loss,
                              accuracy=r.accuracy if step == 500 else np.nan, n=100,
                              paired_halfwidth=halfwidth if pick and halfwidth is not None else np.nan))
        sel.append(dict(size_class="c", n_layers=r.n_layers, seed=r.seed, threshold=0.02, step=500, loss=loss_at_pick(r.n_layers),
                        accuracy=r.accuracy, dense=False))
    snaps = pd.DataFrame(snaps).assign(size_class="c")
    return (snaps.drop(columns="paired_halfwidth") if halfwidth is None else snaps), pd.DataFrame(sel)


def test_equal_loss_paper_each_verdict():
    from depthnb.claims.petty import claim_equal_loss_paper

    effect = accuracy_table(lambda d: 0.2 + 0.1 * d, noise=0.02)
    assert claim_equal_loss_paper(*fig7_tables(effect, lambda d: 0.0195), "geoquery")[1] == "holds"
    worse = accuracy_table(lambda d: 0.8 - 0.1 * d, noise=0.02)
    assert claim_equal_loss_paper(*fig7_tables(worse, lambda d: 0.0195), "geoquery")[1] == "does not hold"
    flat = accuracy_table(lambda d: 0.5, noise=0.2)
    assert claim_equal_loss_paper(*fig7_tables(flat, lambda d: 0.0195), "geoquery")[1] == "inconclusive"
    evidence, verdict = claim_equal_loss_paper(*fig7_tables(effect, lambda d: 0.012 if d == 1 else 0.0195), "geoquery")
    assert verdict == "not testable" and "5 of 25 picks beyond the 10% tolerance (-40% to -3%)" in evidence, evidence
    snaps, sel = fig7_tables(effect, lambda d: 0.0195)
    snaps.loc[snaps.step == 500, "accuracy"] = np.nan  # matched, but never scored
    assert claim_equal_loss_paper(snaps, sel, "geoquery")[1] == "not testable"
    snaps, sel = fig7_tables(effect, lambda d: 0.0195)  # a refined snapshot (an older table's) is not the declared rule's
    snaps = pd.concat([snaps.assign(refined=False), snaps[snaps.step == 500].assign(step=450, refined=True, loss=0.019)],
                      ignore_index=True)
    assert claim_equal_loss_paper(snaps, sel, "geoquery")[1] == "holds"
    snaps, sel = fig7_tables(effect, lambda d: 0.0195)  # a dense stretch's snapshot is: its pick at 450 is not scored
    snaps = pd.concat([snaps, snaps[snaps.step == 500].assign(step=450, dense=True, loss=0.019, accuracy=np.nan)],
                      ignore_index=True)
    evidence, verdict = claim_equal_loss_paper(snaps, sel, "geoquery")
    assert verdict == "not testable" and "not scored" in evidence, evidence
    evidence, verdict = claim_equal_loss_paper(*fig7_tables(effect, lambda d: 0.0195, halfwidth=0.08), "geoquery")
    assert verdict == "not testable" and "only to 8% (95% half-width" in evidence, evidence
    evidence, verdict = claim_equal_loss_paper(*fig7_tables(effect, lambda d: 0.0195, halfwidth=None), "geoquery")
    assert verdict == "not testable" and "was not measured" in evidence, evidence
    rng = np.random.default_rng(21)
    null = [claim_equal_loss_paper(*fig7_tables(shuffle_within_seed(effect, rng), lambda d: 0.0195), "geoquery")[1]
            for _ in range(DRAWS)]
    assert rate(null) <= RATE_BOUND


def test_equal_loss_does_not_hold_and_shows_systematic_gaps():
    "The adapted rule's 'does not hold', and picks at systematically unequal loss inside the tolerance are shown."
    worse = accuracy_table(lambda d: 0.8 - 0.1 * d, noise=0.02)
    assert claim_equal_loss(worse.assign(threshold=0.02, loss=0.0195, step=800), "geoquery")[1] == "does not hold"
    effect = accuracy_table(lambda d: 0.2 + 0.1 * d, noise=0.02)
    skewed = effect.assign(threshold=0.02, loss=np.where(effect.n_layers == 1, 0.0218, 0.0182), step=800)
    evidence, verdict = claim_equal_loss(skewed, "geoquery")
    assert verdict == "holds" and "mean per depth 1 layer(s) +9%, 2 layer(s) -9%" in evidence, evidence


def test_equal_ppl_does_not_hold():
    worse = accuracy_table(lambda d: 0.8 - 0.1 * d, noise=0.02)
    assert claim_equal_ppl(equal_ppl_selection(worse, -0.005), "geoquery")[1] == "does not hold"


def midas_tables(gaps, base_curve_slope=0.0):
    "Table 1 (one row per method), the paper's Table 1, the per-seed final losses and the validation curves."
    from depthnb.paper import table1_paper

    t1 = pd.DataFrame([dict(method="baseline", schedule=None, flop_speedup=1.0, val_loss=4.15),
                       dict(method="midas", schedule="prop-1", flop_speedup=1.24, val_loss=4.15 + np.mean(gaps))])
    per_seed = pd.DataFrame([dict(method=m, seed=s, val_loss=4.15 + (g if m == "midas" else 0.0))
                             for s, g in enumerate(gaps) for m in ("baseline", "midas")])
    curve = pd.DataFrame([dict(method="baseline", seed=s, step=step, val_loss=4.2 + base_curve_slope * step / 1000
                               + 0.001 * ((step // 100 + s) % 2)) for s in range(len(gaps)) for step in range(100, 1300, 100)])
    return t1, table1_paper(), per_seed, curve


def test_midas_loss_near_baseline_margin_sign_and_convergence():
    t1, paper, per_seed, curve = midas_tables([-0.06, -0.05, -0.055, -0.045])
    evidence, verdict = claim_midas_loss_near_baseline(t1, paper, None, "v", per_seed, curve)
    assert verdict == "holds" and "closest schedule (Prop-1, 1.39x: 1B +0.032, 2B +0.021), the largest +0.032" in evidence
    assert "The sign is the opposite of the paper's" in evidence and "is flat within the interval" in evidence, evidence
    t1, paper, per_seed, curve = midas_tables([0.02, 0.04, 0.025, 0.035], base_curve_slope=-0.05)
    evidence, verdict = claim_midas_loss_near_baseline(t1, paper, None, "v", per_seed, curve)
    assert verdict == "inconclusive" and "opposite" not in evidence  # the interval straddles the +0.032 margin
    assert "has not converged" in evidence and "under-trained baseline" in evidence, evidence
    t1, paper, per_seed, _ = midas_tables([0.05, 0.06, 0.055, 0.05])
    evidence, verdict = claim_midas_loss_near_baseline(t1, paper, None, "v", per_seed, None)
    assert verdict == "does not hold" and "convergence is not checked" in evidence


def test_busy_timings_are_not_measured():
    "A timing the measurement itself flagged as taken on a busy machine decides nothing (issue 59's load record)."
    flagged = latency_table(LINE, noise=0.0005).assign(machine_busy=False, others_cpu_share=0.1, step_spread=0.2)
    assert claim_latency_linear(flagged)[1] == "holds"
    flagged.loc[3, "machine_busy"] = True
    evidence, verdict = claim_latency_linear(flagged)
    assert verdict == "not testable" and "not measured: machine busy (1 of 15 timings flagged" in evidence, evidence
    from depthnb.claims.midas import claim_wall_clock

    sp = pd.DataFrame(dict(method=["midas", "looped"], flop_speedup=[1.24, 1.0], wall_speedup=[1.24, 1.0],
                           resumed=False, machine_busy=[False, True], own_cpu_share=[0.9, 0.4]))
    evidence, verdict = claim_wall_clock(sp)
    assert verdict == "not testable" and "not measured: machine busy (this run got as little as 40%" in evidence
