"Properties of depthnb.analysis beyond the notebook's examples: spectra, statistics, the controls, similarity."
import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from depthnb.analysis import (collect_metrics, common_loss_threshold, cumulative_share, effective_rank,
                              equal_loss_selection, equal_ppl_snapshots, equal_ppl_sweep, ffn_rank_curves,
                              ffn_rank_profile, isoplot_frame, layer_similarity, layer_update_similarity,
                              marchenko_pastur_spectrum, rank_fraction, rank_profiles, rank_summary, read_eval,
                              relative_perplexity, runs_table, select_first_reaching, singular_spectrum, spectrum_auc,
                              summarize_seeds, table3, value_at_steps)
from depthnb.presets import SIZE_CLASSES
from depthnb.config import ModelConfig
from depthnb.model import DecoderLM
from depthnb.solver import solve_d_ff

SMALL = ModelConfig(d_model=32, d_attn=32, n_heads=4, d_ff=48, n_layers=3, n_vocab=97, n_ctx=64)

# ---------------------------------------------------------------- spectra


@pytest.mark.parametrize("shape", [(1, 1), (8, 8), (20, 7), (7, 20)])
def test_identity_is_exactly_y_equals_x(shape):
    p = singular_spectrum(torch.eye(*shape))
    k = min(shape)
    assert p.shape == (k,)
    torch.testing.assert_close(cumulative_share(p), rank_fraction(k), rtol=0, atol=1e-6)
    assert spectrum_auc(p).item() == pytest.approx(0.5, abs=1e-6)
    assert effective_rank(p).item() == pytest.approx(k, rel=1e-5)


@pytest.mark.parametrize("m,n", [(30, 10), (10, 30), (64, 64)])
def test_rank_one_puts_all_mass_in_sigma1(m, n):
    g = torch.Generator().manual_seed(m * n)
    W = torch.outer(torch.randn(m, generator=g), torch.randn(n, generator=g))
    p = singular_spectrum(W)
    k = min(m, n)
    assert p[0].item() == pytest.approx(1.0, abs=1e-5)
    torch.testing.assert_close(cumulative_share(p), torch.ones(k), rtol=0, atol=1e-5)
    assert spectrum_auc(p).item() == pytest.approx(1 - 1 / (2 * k), abs=1e-5)
    assert effective_rank(p).item() == pytest.approx(1.0, abs=1e-3)


def test_known_diagonal_spectrum_normalized_descending_float32():
    W = torch.diag(torch.tensor([1.0, 5.0, 2.0, 2.0], dtype=torch.float64))
    p = singular_spectrum(W)
    assert p.dtype == torch.float32
    torch.testing.assert_close(p, torch.tensor([0.5, 0.2, 0.2, 0.1]))
    torch.testing.assert_close(cumulative_share(p), torch.tensor([0.5, 0.7, 0.9, 1.0]))


def test_invariant_to_scale_transpose_and_orthogonal_rotation():
    g = torch.Generator().manual_seed(1)
    W = torch.randn(40, 12, generator=g)
    Q, _ = torch.linalg.qr(torch.randn(40, 40, generator=g))
    p = singular_spectrum(W)
    for other in (7.5 * W, W.T, Q @ W):
        torch.testing.assert_close(singular_spectrum(other), p, rtol=1e-4, atol=1e-6)


def test_batched_equals_one_by_one_and_bf16_input():
    g = torch.Generator().manual_seed(2)
    W = torch.randn(5, 30, 9, generator=g)
    batched = singular_spectrum(W)
    assert batched.shape == (5, 9)
    torch.testing.assert_close(batched, torch.stack([singular_spectrum(w) for w in W]))
    torch.testing.assert_close(batched.sum(-1), torch.ones(5))
    assert singular_spectrum(W.to(torch.bfloat16)).dtype == torch.float32


@pytest.mark.slow
def test_widest_374m_matrix_on_cpu():
    "The 1-layer 374M model's wi_0: 99002 x 1024 (a few seconds in float32 on two cores)."
    sc = SIZE_CLASSES["374M"]
    W = torch.randn(solve_d_ff(sc, 1), sc.d_model, generator=torch.Generator().manual_seed(0))
    assert W.shape == (99002, 1024)
    p = singular_spectrum(W)
    assert p.shape == (1024,) and p.sum().item() == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(p.numpy(), marchenko_pastur_spectrum(*W.shape), rtol=0.01)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="needs a matrix"):
        singular_spectrum(torch.ones(3))
    with pytest.raises(ValueError, match="all-zero"):
        singular_spectrum(torch.zeros(3, 3))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1e3, allow_nan=False), min_size=1, max_size=40).filter(lambda v: sum(v) > 1e-3))
def test_summaries_bounded_for_any_descending_spectrum(values):
    s = torch.tensor(sorted(values, reverse=True), dtype=torch.float64)
    p = s / s.sum()
    k = len(values)
    auc, er = spectrum_auc(p).item(), effective_rank(p).item()
    assert 0.5 - 1e-9 <= auc <= 1 - 1 / (2 * k) + 1e-9
    assert 1 - 1e-9 <= er <= k + 1e-6
    c = cumulative_share(p)
    assert (c.diff() >= -1e-12).all() and c[-1].item() == pytest.approx(1.0)


def test_gaussian_matrix_follows_marchenko_pastur():
    m, n = 1600, 400  # aspect 1/4: sigma/sqrt(m) in [0.5, 1.5]
    G = torch.randn(m, n, generator=torch.Generator().manual_seed(0))
    s = torch.linalg.svdvals(G) / math.sqrt(m)
    assert s[0].item() == pytest.approx(1.5, abs=0.04) and s[-1].item() == pytest.approx(0.5, abs=0.04)
    assert (s ** 2).mean().item() == pytest.approx(1.0, abs=0.01)  # E[sigma^2]/m = 1
    mp = marchenko_pastur_spectrum(m, n)
    assert mp.sum() == pytest.approx(1.0) and (np.diff(mp) <= 0).all()
    np.testing.assert_allclose(singular_spectrum(G).numpy(), mp, rtol=0.05)
    np.testing.assert_allclose(cumulative_share(singular_spectrum(G)).numpy(), np.cumsum(mp), atol=2e-3)


def test_marchenko_pastur_shape_dependence():
    auc = lambda m, n: spectrum_auc(torch.tensor(marchenko_pastur_spectrum(m, n))).item()
    assert auc(100_000, 100) == pytest.approx(0.5, abs=0.01)  # very tall: nearly flat
    assert auc(100, 100) > auc(400, 100) > auc(3200, 100)  # squarer: more skewed
    assert auc(100, 400) == pytest.approx(auc(400, 100))  # symmetric in the aspect ratio
    # square: quarter-circle law for sigma/sqrt(m) on [0, 2], mean 8/(3 pi)
    mp = marchenko_pastur_spectrum(500, 500)
    assert mp[0] / mp.mean() == pytest.approx(2 / (8 / (3 * math.pi)), rel=0.02)


# ---------------------------------------------------------------- FFN rank profile


def test_ffn_rank_profile_rows_and_k():
    model = DecoderLM(SMALL)
    prof = ffn_rank_profile(model, stacked_inputs=True)
    assert len(prof) == 4 * SMALL.n_layers
    assert set(prof.weight) == {"wi_0", "wi_1", "wo", "wi"}
    assert (prof[prof.weight != "wi"].k == min(SMALL.d_model, SMALL.d_ff)).all()
    assert (prof[prof.weight == "wi"].k == min(SMALL.d_model, 2 * SMALL.d_ff)).all()
    assert set(prof[prof.weight == "wo"].projection) == {"output"}
    assert prof.ff_ratio.iloc[0] == SMALL.d_model / SMALL.d_ff


def test_ffn_rank_profile_sees_the_layers_weights():
    cfg = replace(SMALL, d_ff=32)
    model = DecoderLM(cfg)
    with torch.no_grad():
        model.layers[1].ffn.wi_0.weight.copy_(torch.eye(32))
        model.layers[2].ffn.wo.weight.copy_(torch.outer(torch.randn(32), torch.randn(32)))
    prof = ffn_rank_profile(model).set_index(["layer", "weight"])
    assert prof.loc[(1, "wi_0"), "auc"] == pytest.approx(0.5, abs=1e-6)
    assert prof.loc[(2, "wo"), "top1"] == pytest.approx(1.0, abs=1e-4)
    assert prof.loc[(0, "wi_0"), "auc"] > 0.5


def test_looped_model_profile_repeats_its_one_layer():
    prof = ffn_rank_profile(DecoderLM(replace(SMALL, share_layers=True)))
    for _, g in prof.groupby("weight"):
        assert g.auc.nunique() == 1 and len(g) == SMALL.n_layers


def test_rank_curves_from_origin_to_one_and_summary_matches_mp_at_init():
    torch.manual_seed(0)
    model = DecoderLM(replace(SMALL, d_model=64, d_attn=64, d_ff=256))
    curves = ffn_rank_curves(model)
    for _, g in curves.groupby("weight"):
        assert g.x.iloc[0] == 0 and g.share.iloc[0] == 0
        assert g.x.iloc[-1] == 1 and g.share.iloc[-1] == pytest.approx(1.0, abs=1e-5)
        assert (np.diff(g.share) >= 0).all() and (g.share >= g.x - 1e-6).all()  # descending spectrum: above y = x
    summary = rank_summary(ffn_rank_profile(model))
    assert set(summary.projection) == {"input", "output"}
    np.testing.assert_allclose(summary.auc, summary.mp_auc, atol=0.01)


# ---------------------------------------------------------------- statistics, perplexity, Table 3


def test_summarize_seeds_interval():
    df = pd.DataFrame(dict(g=["a"] * 5 + ["b"], v=[1.0, 2.0, 3.0, 4.0, 5.0, 7.0]))
    s = summarize_seeds(df, ["g"], "v").set_index("g")
    assert s.loc["a", "mean"] == 3.0 and s.loc["a", "n"] == 5
    assert s.loc["a", "ci"] == pytest.approx(2.7764 * math.sqrt(2.5) / math.sqrt(5), rel=1e-4)
    assert math.isnan(s.loc["b", "ci"])
    with pytest.raises(KeyError, match="columns"):
        summarize_seeds(df, ["nope"], "v")


def test_relative_perplexity():
    runs = pd.DataFrame(dict(size_class="X", n_layers=[1, 1, 2, 2, 4, 4], seed=[0, 1] * 3,
                             ppl=[30.0, 34.0, 20.0, 22.0, 24.0, 24.0], d_model=64, d_ff=[400, 400, 200, 200, 100, 100]))
    rel = relative_perplexity(runs).set_index("n_layers")
    assert rel.loc[2, "rel_ppl"] == 1.0 and rel.loc[2, "is_best"]
    assert rel.loc[1, "rel_ppl"] == pytest.approx(32 / 21)
    assert rel.loc[4, "ff_ratio"] == 0.64
    assert rel.loc[4, "ppl_ci"] == 0.0 and rel.loc[1, "n_seeds"] == 2


def test_table3_sets_the_papers_values_beside_ours():
    ppl = pd.DataFrame(dict(size_class="tiny", n_layers=[1, 1, 2], seed=[0, 1, 0], ppl=[100.0, 110.0, 80.0]))
    acc = pd.DataFrame(dict(size_class="tiny", n_layers=[1, 1, 2], seed=[0, 1, 0], task="cogs", accuracy=[0.1, 0.2, 0.5]))
    t = table3(ppl, acc, paper_class={"tiny": "41M"}).set_index("n_layers")
    assert t.loc[1, "val PPL"] == 105.0 and t.loc[1, "val PPL (paper)"] == 45.7
    assert t.loc[1, "COGS"] == 15.0 and t.loc[2, "COGS (paper)"] == 58.2
    assert t.loc[2, "paper_class"] == "41M"
    assert t["GeoQuery"].isna().all() and t.loc[2, "GeoQuery (paper)"] == 76.4


# ---------------------------------------------------------------- equal-perplexity selection


def run_log(n_layers, ppls, snap_steps, seed=0, step=10, split="valid"):
    evals = [dict(kind="eval", step=(i + 1) * step, split=split, ppl=p, loss=math.log(p)) for i, p in enumerate(ppls)]
    snaps = [dict(kind="snapshot", step=s, path=f"snapshots/step_{s:08d}.pt") for s in snap_steps]
    return pd.DataFrame(evals + snaps).assign(n_layers=n_layers, seed=seed)


@pytest.fixture
def logs():
    return pd.concat([
        run_log(1, [80, 60, 50, 40], [20, 40]),  # reference, final PPL 40
        run_log(2, [70, 45, 39, 38], [20, 40]),  # crosses at 30, between snapshots 20 and 40
        run_log(3, [60, 40, 30, 25], [20, 40]),  # crosses exactly at snapshot 20
        run_log(4, [90, 70, 50, 45], [20, 40]),  # never reaches 40
        run_log(5, [90, 70, 50, 39], [20]),  # crosses at 40 but has no snapshot after 20
        run_log(6, [41, 39, 45, 30], [10, 30, 40]),  # crosses at 20 (unsnapshotted), back above at 30, below at 40
    ], ignore_index=True)


def test_equal_ppl_selection_cases(logs):
    sel = equal_ppl_snapshots(logs, 1, "valid").set_index("n_layers")
    assert sel.target_ppl.unique().tolist() == [40]
    assert sel.loc[1, "status"] == "reference" and sel.loc[1, "step"] == 40 and sel.loc[1, "path"].endswith("40.pt")
    assert sel.loc[2, ["status", "crossing_step", "step", "ppl", "lag_steps", "prev_step", "prev_ppl"]].tolist() == \
        ["between_snapshots", 30, 40, 38, 10, 20, 45]
    assert sel.loc[2, "rel_gap"] == pytest.approx(38 / 40 - 1)
    assert sel.loc[3, ["status", "step", "ppl", "lag_steps"]].tolist() == ["matched", 20, 40, 0]
    assert sel.loc[4, "status"] == "never_reached" and pd.isna(sel.loc[4, "step"]) and sel.loc[4, "best_ppl"] == 45
    assert sel.loc[5, "status"] == "no_snapshot" and sel.loc[5, "crossing_step"] == 40
    # non-monotone curve: the first snapshot at or below the target (40), not the first one after the crossing (30)
    assert sel.loc[6, ["status", "crossing_step", "step", "ppl"]].tolist() == ["between_snapshots", 20, 40, 30]
    assert set(sel.index) == {1, 2, 3, 4, 5, 6}  # nobody dropped


def test_equal_ppl_nearest_rule_and_interpolation(logs):
    near = equal_ppl_snapshots(logs, 1, "valid", rule="nearest").set_index("n_layers")
    assert near.loc[2, "step"] == 40  # |log 38 - log 40| < |log 45 - log 40|
    assert near.loc[6, "step"] == 10  # 41 is the nearest scored snapshot
    # a snapshot at step 25 has no eval record: skipped and counted, or interpolated between 20 and 30
    extra = pd.concat([logs, pd.DataFrame([dict(kind="snapshot", step=25, path="s25.pt", n_layers=2, seed=0)])])
    exact = equal_ppl_snapshots(extra, 1, "valid").set_index("n_layers")
    assert exact.loc[2, "n_unscored"] == 1 and exact.loc[2, "step"] == 40
    interp = equal_ppl_snapshots(extra, 1, "valid", how="interpolate").set_index("n_layers")
    assert interp.loc[2, "n_unscored"] == 0 and interp.loc[2, "step"] == 40  # 42 at step 25 is still above 40
    assert interp.loc[2, "prev_step"] == 25 and interp.loc[2, "prev_ppl"] == pytest.approx(42.0)


def test_equal_ppl_reference_over_seeds_duplicates_and_sweep(logs):
    two_refs = pd.concat([logs, run_log(1, [80, 60, 50, 44], [20, 40], seed=1)])
    sel = equal_ppl_snapshots(two_refs, 1, "valid")
    assert sel.target_ppl.iloc[0] == 42.0  # mean of the reference seeds' final PPLs
    assert (sel[sel.n_layers == 1].status == "reference").sum() == 2
    # a resumed run that logged step 20 twice: the last record counts
    dup = pd.concat([logs, pd.DataFrame([dict(kind="eval", step=20, split="valid", ppl=39.5, n_layers=2, seed=0)])])
    s2 = equal_ppl_snapshots(dup, 1, "valid").set_index("n_layers")
    assert s2.loc[2, ["status", "step", "ppl"]].tolist() == ["matched", 20, 39.5]
    sweep = equal_ppl_sweep(logs, "valid")
    assert sweep.reference_depth.unique().tolist() == [1, 2, 3, 4, 5]
    assert (sweep.groupby("reference_depth").n_layers.nunique() == 6).all()  # every depth, shallower ones included
    with pytest.raises(ValueError, match="no run with n_layers=9"):
        equal_ppl_snapshots(logs, 9, "valid")
    with pytest.raises(ValueError, match="no eval records on split 'test'"):
        equal_ppl_snapshots(logs, 1, "test")


def test_select_first_reaching_validates():
    ev = pd.DataFrame(dict(step=[1, 2], ppl=[5.0, 3.0]))
    with pytest.raises(ValueError, match="rule='last'"):
        select_first_reaching(ev, ev.assign(path="x"), 4.0, rule="last")
    with pytest.raises(ValueError, match="no eval records"):
        select_first_reaching(ev.iloc[:0], ev.assign(path="x"), 4.0)
    with pytest.raises(ValueError, match="how='nearest'"):
        value_at_steps(ev, [1], "ppl", how="nearest")


# ---------------------------------------------------------------- equal in-distribution loss


def ft_tables():
    steps = [50, 100, 150, 200]
    loss = pd.DataFrame(dict(n_layers=np.repeat([1, 2, 4], 4), seed=0, step=steps * 3,
                             loss=[0.9, 0.5, 0.3, 0.25, 0.6, 0.2, 0.1, 0.05, 0.5, 0.1, 0.04, 1e-4]))
    acc = loss[["n_layers", "seed", "step"]].assign(accuracy=np.linspace(0, 0.55, 12))
    return loss, acc


def test_common_loss_threshold_rule():
    loss, acc = ft_tables()
    thr, why = common_loss_threshold(loss, acc)
    assert thr == 0.25 and "lowest loss every run reaches" in why and "'n_layers': 1" in why
    low = loss.assign(loss=loss.loss * 1e-4)
    thr2, why2 = common_loss_threshold(low, acc)
    assert thr2 == 2e-4 and "paper" in why2
    # only steps with a measured accuracy count: without step 200 the 1-layer run reaches only 0.3
    thr3, _ = common_loss_threshold(loss, acc[acc.step < 200])
    assert thr3 == 0.3
    with pytest.raises(ValueError, match="no in-distribution loss"):
        common_loss_threshold(loss, acc[acc.n_layers != 4])


def test_equal_loss_selection():
    loss, acc = ft_tables()
    sel = equal_loss_selection(loss, acc, 0.25).set_index("n_layers")
    assert sel.step.tolist() == [200, 100, 100]
    assert sel.loc[4, "accuracy"] == pytest.approx(acc.accuracy[9])
    assert (sel.threshold == 0.25).all()
    strict = equal_loss_selection(loss, acc, 0.01).set_index("n_layers")
    assert strict.status.tolist() == ["never_reached", "never_reached", "matched"]
    assert math.isnan(strict.loc[1, "accuracy"])
    # accuracy measured only at 100 and 200: the 4-layer run crosses 0.04 at 150, chosen at 200
    sparse = equal_loss_selection(loss, acc[acc.step.isin([100, 200])], 0.04).set_index("n_layers")
    assert sparse.loc[4, ["status", "crossing_step", "step"]].tolist() == ["between_snapshots", 150, 200]


# ---------------------------------------------------------------- layer similarity, isoplots


def test_layer_similarity_copies_loops_and_errors():
    model = DecoderLM(replace(SMALL, n_layers=4))
    with torch.no_grad():
        model.layers[2].load_state_dict(model.layers[1].state_dict())  # a MIDAS-style copy
    sim = layer_similarity(model)
    for M in sim.values():
        assert M.shape == (4, 4)
        np.testing.assert_allclose(M, M.T, atol=1e-6)
        assert M[1, 2] == pytest.approx(1.0, abs=1e-5) and abs(M[0, 3]) < 0.2
    looped = layer_similarity(DecoderLM(replace(SMALL, share_layers=True)), ["ffn.wo", "norm_ffn"])
    np.testing.assert_allclose(looped["ffn.wo"], np.ones((3, 3)), atol=1e-5)
    with pytest.raises(ValueError, match="unknown weight type 'ffn.w9'"):
        layer_similarity(model, ["ffn.w9"])


def test_layer_update_similarity_is_a_cosine_matrix():
    model = DecoderLM(replace(SMALL, share_layers=True))
    S = layer_update_similarity(model, torch.randint(0, SMALL.n_vocab, (2, 16)))
    assert S.shape == (3, 3)
    np.testing.assert_allclose(np.diag(S), 1.0, atol=1e-4)
    np.testing.assert_allclose(S, S.T, atol=1e-5)
    assert (np.abs(S) <= 1 + 1e-5).all()


def test_isoplot_frame_join():
    acc = pd.DataFrame(dict(method=["a", "a", "b"], step=[10, 20, 15], task="t", accuracy=[0.1, 0.2, 0.3]))
    m = pd.DataFrame(dict(method=["a", "a", "b", "b"], kind="eval", split="valid", step=[10, 20, 10, 20],
                          loss=[4.0, 3.0, 5.0, 3.0]))
    with pytest.raises(ValueError, match="no 'valid' eval record"):
        isoplot_frame(acc, m, "valid")
    iso = isoplot_frame(acc, m, "valid", how="interpolate")
    assert iso.val_loss.tolist() == [4.0, 3.0, 4.0] and iso.interpolated.tolist() == [False, False, True]


# ---------------------------------------------------------------- run directories (through depthnb.train)


def test_run_dir_readers(tmp_path):
    from depthnb.config import PretrainConfig, to_dict
    from depthnb.runs import save_weights

    dirs = []
    for n, ppls in ((1, [50.0, 40.0]), (2, [45.0, 35.0])):
        cfg = replace(SMALL, n_layers=n)
        d = tmp_path / f"L{n}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps(dict(kind="pretrain", config=to_dict(PretrainConfig(model=cfg, seed=3)))))
        recs = [dict(kind="eval", step=10 * (i + 1), split="valid", loss=math.log(p), ppl=p) for i, p in enumerate(ppls)]
        recs.append(dict(kind="snapshot", step=10, path="snapshots/step_00000010.pt"))
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        model = DecoderLM(cfg)
        save_weights(d / "snapshots" / "step_00000010.pt", model, step=10)
        save_weights(d / "final.pt", model, step=20)
        dirs.append(d)
    runs = runs_table(dirs)
    assert runs[["run_kind", "n_layers", "d_model", "d_ff", "seed"]].values.tolist() == [
        ["pretrain", 1, 32, 48, 3], ["pretrain", 2, 32, 48, 3]]
    metrics = collect_metrics(runs)
    assert set(metrics.kind) == {"eval", "snapshot"} and "run_kind" in metrics
    sel = equal_ppl_snapshots(metrics, 1, "valid").set_index("n_layers")
    # the 2-layer run reaches 40 only at step 20, where only final.pt holds its weights
    assert sel.loc[2, ["status", "step", "path"]].tolist() == ["matched", 20, "final.pt"]
    prof = rank_profiles([dirs[1], dirs[1] / "snapshots" / "step_00000010.pt"])
    assert len(prof) == 2 * 3 * 2 and prof.path.nunique() == 2
    with pytest.raises(FileNotFoundError, match="config.json does not exist"):
        runs_table([tmp_path])


def test_read_eval_tables(tmp_path):
    runs = []
    for n, acc in ((1, 0.25), (2, 0.5)):
        d = tmp_path / f"L{n}"
        (d / "eval").mkdir(parents=True)
        res = dict(split="gen", n=4, accuracy=acc, loss=1.0, seconds=0.1,
                   by_category={"a": dict(accuracy=acc, n=2), "b": dict(accuracy=acc, n=2)},
                   by_generalization_type={"lexical": dict(accuracy=acc + 0.25, n=2), "structural": dict(accuracy=0.0, n=2)})
        (d / "eval" / "gen.json").write_text(json.dumps(res))
        for step in (50, 100):
            (d / "eval" / f"gen.step_{step:08d}.json").write_text(json.dumps({**res, "accuracy": acc * step / 100}))
        runs.append(dict(run_dir=str(d), size_class="tiny", task="cogs", n_layers=n, seed=0))
    runs = pd.DataFrame(runs)
    overall = read_eval(runs, "gen")
    assert overall.accuracy.tolist() == [0.25, 0.5] and (overall.n == 4).all()
    types = read_eval(runs, "gen", by="generalization_type")
    assert types.generalization_type.tolist() == ["lexical", "structural"] * 2
    assert types.accuracy.tolist() == [0.5, 0.0, 0.75, 0.0]
    snaps = read_eval(runs, "gen", snapshots=True)
    assert snaps.step.tolist() == [50, 100, 50, 100] and snaps.accuracy.tolist() == [0.125, 0.25, 0.25, 0.5]
    with pytest.raises(FileNotFoundError, match="test.json does not exist"):
        read_eval(runs, "test")
    with pytest.raises(KeyError, match="no 'by_nothing'"):
        read_eval(runs, "gen", by="nothing")
