"Every figure function renders from a small fixture and is saved with its caption (set DEPTHNB_TEST_FIGURES=DIR to keep the images)."
import os
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from depthnb.analysis import (common_loss_threshold, equal_loss_selection, equal_ppl_sweep, ffn_rank_curves,  # noqa: E402
                              ffn_rank_profile, isoplot_frame, layer_similarity, layer_update_similarity,
                              rank_summary)
from depthnb.paper import petty_table3_paper  # noqa: E402
from depthnb.presets import SIZE_CLASSES  # noqa: E402
from depthnb.config import ModelConfig
from depthnb.model import DecoderLM  # noqa: E402
from depthnb.plots import (caption, figure_equal_loss, figure_equal_perplexity, figure_generalization,  # noqa: E402
                           figure_generalization_types, figure_isoplots, figure_latency, figure_layer_similarity,
                           figure_perplexity, figure_rank, figure_rank_summary, figure_relative_perplexity,
                           save_figure)
from depthnb.solver import solve_d_ff  # noqa: E402

SMALL = ModelConfig(d_model=32, d_attn=32, n_heads=4, d_ff=48, n_layers=3, n_vocab=97, n_ctx=64)


@pytest.fixture
def out(tmp_path):
    d = os.environ.get("DEPTHNB_TEST_FIGURES")
    return Path(d) if d else tmp_path


def save(fig, out, stem):
    paths = save_figure(fig, out / stem, caption(f"Test fixture for {stem}.", "test", "CPU"))
    plt.close(fig)
    for p in paths:
        assert p.exists() and p.stat().st_size > 0
    assert "preset: test; hardware: CPU" in paths[2].read_text()


def lines_with(fig, **props):
    "Lines of any axes of `fig` whose properties match `props` (e.g. color='red', linestyle='--')."
    found = []
    for ax in fig.axes:
        for line in ax.get_lines():
            if all(matplotlib.colors.same_color(line.get_color(), v) if k == "color" else matplotlib.artist.getp(line, k) == v
                   for k, v in props.items()):
                found.append(line)
    return found


def series(ax) -> dict:
    "The data line of each labelled error-bar series of `ax` (not its caps)."
    return {c.get_label(): c.lines[0] for c in ax.containers}


@pytest.fixture
def ppl_runs():
    rows = []
    for sc, base in (("41M", 30.0), ("134M", 20.0)):
        for n in SIZE_CLASSES[sc].depths[:5]:
            for seed in (0, 1):
                rows.append(dict(size_class=sc, n_layers=n, seed=seed, ppl=base * (1 + 0.6 / n) + seed,
                                 d_model=SIZE_CLASSES[sc].d_model, d_ff=solve_d_ff(sc, n)))
    return pd.DataFrame(rows)


def test_figure_perplexity(ppl_runs, out):
    fig = figure_perplexity(ppl_runs)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["41M", "134M"]
    save(fig, out, "petty_fig2")


def test_figure_relative_perplexity_rules(ppl_runs, out):
    fig = figure_relative_perplexity(ppl_runs)
    red = lines_with(fig, color="red", linestyle="--")
    black = lines_with(fig, color="black", linestyle="-")
    assert [l.get_xdata()[0] for l in red] == [1.0] and 0.25 in [l.get_xdata()[0] for l in black]
    assert fig.axes[1].get_xscale() == "log"
    data = series(fig.axes[0])
    assert list(data) == ["41M", "134M"] and min(min(l.get_ydata()) for l in data.values()) == pytest.approx(1.0)
    save(fig, out, "petty_fig3")


def test_figure_generalization_from_paper_table(out):
    acc = petty_table3_paper().melt(id_vars=["size_class", "n_layers"], value_vars=["cogs", "cogs_vf", "geoquery", "passivization"],
                              var_name="task", value_name="accuracy").assign(seed=0)
    acc["accuracy"] /= 100
    fig = figure_generalization(acc)
    assert [ax.get_title() for ax in fig.axes] == ["COGS", "COGS-vf", "GeoQuery", "English Passivization"]
    data = series(fig.axes[3])
    assert list(data) == ["41M", "134M", "374M"] and max(max(l.get_ydata()) for l in data.values()) == pytest.approx(98.4)
    save(fig, out, "petty_fig4")


def test_figure_generalization_types(out):
    rng = np.random.default_rng(0)
    df = pd.DataFrame([dict(size_class="tiny", task=t, generalization_type=g, n_layers=n, seed=s,
                            accuracy=float(rng.uniform(0.5, 0.9) if g == "lexical" else rng.uniform(0, 0.1)))
                       for t in ("cogs", "cogs_vf") for g in ("lexical", "structural") for n in (1, 2, 3) for s in (0, 1)])
    fig = figure_generalization_types(df)
    assert len(fig.axes) == 2
    assert len(lines_with(fig, linestyle="--")) >= 2  # structural dashed in each panel
    for ax in fig.axes:  # 2 seeds: t(0.975, 1) = 12.7 makes wide intervals; drawn clipped to 0-100%
        for c in ax.containers:
            ys = np.concatenate([seg[:, 1] for seg in c.lines[2][0].get_segments()])
            assert ys.min() >= 0 and ys.max() <= 100
    save(fig, out, "petty_fig5")
    with pytest.raises(ValueError, match="none of the tasks"):
        figure_generalization_types(df, tasks=("geoquery",))


def run_log(n_layers, ppls, snap_steps, step=10):
    evals = [dict(kind="eval", step=(i + 1) * step, split="valid", ppl=p) for i, p in enumerate(ppls)]
    snaps = [dict(kind="snapshot", step=s, path=f"snapshots/step_{s:08d}.pt") for s in snap_steps]
    return pd.DataFrame(evals + snaps).assign(n_layers=n_layers, seed=0)


def test_figure_equal_perplexity(out):
    metrics = pd.concat([run_log(1, [80, 60, 50, 40], [20, 40]), run_log(2, [70, 45, 39, 38], [20, 40]),
                         run_log(4, [90, 70, 50, 45], [20, 40])])
    sel = equal_ppl_sweep(metrics, "valid")
    acc = sel[sel.step.notna()][["reference_depth", "n_layers", "seed"]].assign(accuracy=[0.2, 0.3, 0.25])
    fig = figure_equal_perplexity(metrics, sel, "valid", acc)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "4 layers (never reaches)" in legend and "target 40" in legend
    chosen = [l for l in fig.axes[0].get_lines() if l.get_label() == "chosen snapshots"][0]
    assert list(chosen.get_xdata()) == [40]  # the 2-layer model's snapshot (the reference's own is not a choice)
    save(fig, out, "petty_fig6")
    save(figure_equal_perplexity(metrics, sel, "valid"), out, "petty_fig6a_only")


def test_figure_equal_loss(out):
    loss = pd.DataFrame(dict(n_layers=np.repeat([1, 2, 4], 4), seed=0, step=[50, 100, 150, 200] * 3,
                             loss=[0.9, 0.5, 0.3, 0.25, 0.6, 0.2, 0.1, 0.05, 0.5, 0.1, 0.04, 0.02]))
    acc = loss[["n_layers", "seed", "step"]].assign(accuracy=np.linspace(0, 0.55, 12))
    thr, why = common_loss_threshold(loss, acc)
    sel = equal_loss_selection(loss, acc, thr)
    fig = figure_equal_loss(loss, sel)
    assert lines_with(fig, color="black", linestyle="--")[0].get_ydata()[0] == thr
    save(fig, out, "petty_fig7")
    strict = equal_loss_selection(loss, acc, 0.03)  # only the 4-layer run reaches it
    fig = figure_equal_loss(loss, strict)
    assert sum(t.get_text() == "not reached" for t in fig.axes[1].texts) == 2
    save(fig, out, "petty_fig7_not_reached")


def test_figure_latency_fit_in_legend(out):
    lat = pd.DataFrame(dict(n_layers=[1, 2, 4, 8, 16], seconds=[0.12, 0.14, 0.18, 0.26, 0.42]))
    fig = figure_latency(lat)
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("$R^2$ = 1.000" in t for t in texts)
    save(fig, out, "petty_fig8")
    rel = figure_latency(lat, relative=True)
    assert rel.axes[0].get_lines()[0].get_ydata()[0] == pytest.approx(1.0)
    plt.close(rel)


@pytest.fixture(scope="module")
def depth_models():
    torch.manual_seed(0)
    return {n: DecoderLM(replace(SMALL, n_layers=n, d_ff=d_ff)) for n, d_ff in ((1, 160), (2, 64), (4, 24))}


def test_figure_rank(depth_models, out):
    curves = pd.concat([ffn_rank_curves(m, stacked_inputs=True) for m in depth_models.values()])
    fig = figure_rank(curves, " — fixture")
    assert len(fig.axes) == 2
    for ax in fig.axes:
        assert len(ax.get_lines()) == len(depth_models) + 1  # a curve per depth and y = x
    diag = lines_with(fig, color="black", linestyle="--")
    assert all(list(l.get_xdata()) == [0, 1] and list(l.get_ydata()) == [0, 1] for l in diag) and len(diag) == 2
    save(fig, out, "petty_fig9")


def test_figure_rank_summary(depth_models, out):
    prof = pd.concat([ffn_rank_profile(m) for m in depth_models.values()])
    summary = pd.concat([rank_summary(prof).assign(label="init"), rank_summary(prof).assign(label="copy")])
    fig = figure_rank_summary(summary)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "Gaussian init (MP)" in labels and "input, init" in labels
    save(fig, out, "rank_summary")


def test_figure_layer_similarity(out):
    base = DecoderLM(replace(SMALL, n_layers=4))
    looped = DecoderLM(replace(SMALL, n_layers=4, share_layers=True))
    tokens = torch.randint(0, SMALL.n_vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    sims = {name: {**layer_similarity(m, ["attn.q", "ffn.wo"]), "residual update": layer_update_similarity(m, tokens)}
            for name, m in (("baseline", base), ("looped", looped))}
    sims["weights only"] = layer_similarity(base, ["ffn.wo"])
    fig = figure_layer_similarity(sims, ["attn.q", "ffn.wo", "residual update"])
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 2 * 3 + 1
    assert images[0].get_clim()[1] == 1.0
    row_labels = [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()]
    assert row_labels[:3] == ["baseline", "looped", "weights only"]
    save(fig, out, "saunshi_fig2")


def test_figure_isoplots(out):
    acc = pd.DataFrame(dict(method=np.repeat(["baseline", "midas", "gradstack"], 3), step=[10, 20, 30] * 3, task="copy_random",
                            accuracy=[0.1, 0.2, 0.25, 0.1, 0.3, 0.4, 0.05, 0.1, 0.2]))
    metrics = acc[["method", "step"]].assign(kind="eval", split="valid",
                                             loss=[5.0, 4.5, 4.2, 5.1, 4.6, 4.25, 5.3, 4.8, 4.4])
    iso = isoplot_frame(acc, metrics, "valid")
    fig = figure_isoplots(pd.concat([iso, iso.assign(task="var_depth1_code", accuracy=iso.accuracy / 2)]))
    assert len(fig.axes) == 2 and all(ax.xaxis_inverted() for ax in fig.axes)
    assert [l.get_label() for l in fig.axes[0].get_lines()] == ["baseline", "midas", "gradstack"]
    save(fig, out, "saunshi_fig4")
