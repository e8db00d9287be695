"Property tests of the parameter solver (Petty et al. §2.1)."
from hypothesis import given, settings
from hypothesis import strategies as st

from depthnb.presets import SIZE_CLASSES
from depthnb.config import SizeClass
from depthnb.solver import (TABLE2_D_FF, flops_per_token, max_depth, model_config, model_params, solve_d_ff,
                            table2)

paper_class = st.sampled_from(list(SIZE_CLASSES.values()))


def test_table2_all_26_cells():
    t = table2()
    assert len(t) == 26 == sum(len(v) for v in TABLE2_D_FF.values())
    assert (t.d_ff == t.d_ff_paper).all(), t[t.d_ff != t.d_ff_paper]


@given(sc=paper_class, data=st.data())
def test_paper_classes_keep_N_within_0p1_percent(sc, data):
    n = data.draw(st.integers(1, max_depth(sc)))
    N = model_params(sc, n, solve_d_ff(sc, n))
    assert abs(N / model_params(sc) - 1) < 1e-3


custom_class = st.builds(
    lambda d_model, heads, n0, d_ff0, vocab: SizeClass("custom", d_model, d_model, heads, n0, d_ff0, vocab),
    d_model=st.sampled_from([32, 64, 96, 128, 256, 384]), heads=st.sampled_from([1, 2, 4, 8]),
    n0=st.integers(1, 24), d_ff0=st.integers(16, 8192), vocab=st.integers(256, 50_000))


@settings(max_examples=200)
@given(sc=custom_class, data=st.data())
def test_custom_classes_solve_within_rounding(sc, data):
    "Any class: the count moves by at most beta/2 per layer (d_ff is whole), and d_ff shrinks with depth."
    deepest = max_depth(sc)
    n = data.draw(st.integers(1, deepest))
    d_ff = solve_d_ff(sc, n)
    assert d_ff >= 1
    assert abs(model_params(sc, n, d_ff) - model_params(sc)) <= n * 3 * sc.d_model / 2
    if n < deepest:
        assert solve_d_ff(sc, n + 1) <= d_ff
    assert solve_d_ff(sc, sc.n_layers) == sc.d_ff


@given(sc=paper_class)
def test_d_ff_decreases_with_depth(sc):
    widths = [solve_d_ff(sc, n) for n in range(1, max_depth(sc) + 1)]
    assert all(a > b for a, b in zip(widths, widths[1:]))


def test_infeasible_depth_names_deepest():
    import pytest

    for sc in SIZE_CLASSES.values():
        with pytest.raises(ValueError, match=f"deepest feasible depth is {max_depth(sc)}"):
            solve_d_ff(sc, max_depth(sc) + 1)


@given(sc=paper_class, n_ctx=st.sampled_from([128, 512, 1024, 2048]))
def test_flops_grow_with_depth_within_a_class(sc, n_ctx):
    "Equal parameters, so deeper models differ only by the attention term: FLOPs rise with depth."
    f = [flops_per_token(model_config(sc, n), n_ctx).train for n in sc.depths]
    assert all(a <= b * 1.001 for a, b in zip(f, f[1:]))


def test_counts_by_hand():
    "The closed forms on numbers small enough to count by hand (a change of any coefficient shows)."
    from depthnb.solver import layer_params

    # one layer: 3 * 4 * 10 (wi_0, wi_1, wo) + 4 * 4 * 6 (q, k, v, o) + 2 * 4 (two RMSNorm scales)
    assert layer_params(4, 6, 10) == 120 + 96 + 8 == 224
    sc = SizeClass("hand", 4, 6, 2, 2, 10, 7)
    assert model_params(sc) == 2 * 224 + 2 * 4 * 7 == 504  # plus untied input and output embeddings
    assert model_params(sc, 3) == 3 * 224 + 56
    assert model_params(sc, 3, 5) == 3 * (60 + 96 + 8) + 56


def test_model_params_counts_the_model_built():
    "`model_params` is the built `DecoderLM`'s count less the shared relative-position table and the final norm."
    from depthnb.model import DecoderLM

    sc = SizeClass("tiny", 8, 8, 2, 2, 12, 16, (1, 2, 3))
    for n in sc.depths:
        cfg = model_config(sc, n)
        assert (cfg.d_model, cfg.d_attn, cfg.n_heads, cfg.n_layers, cfg.n_vocab) == (8, 8, 2, n, 16)
        assert cfg.d_ff == solve_d_ff(sc, n)
        built = sum(p.numel() for p in DecoderLM(cfg).parameters())
        assert built == model_params(sc, n, cfg.d_ff) + cfg.rel_buckets * cfg.n_heads + cfg.d_model


def test_model_config_keeps_other_options_of_base():
    from depthnb.config import ModelConfig

    sc = SizeClass("tiny", 8, 8, 2, 2, 12, 16)
    cfg = model_config(sc, 3, ModelConfig(n_ctx=64, pos_emb="rope", n_heads=4, d_model=32))
    assert (cfg.n_ctx, cfg.pos_emb) == (64, "rope")
    assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_layers) == (8, 2, solve_d_ff(sc, 3), 3)


def test_max_depth_reaches_d_ff_of_one():
    "A class whose deepest member has d_ff exactly 1: that member is feasible, the next is not."
    import pytest

    sc = SizeClass("edge", 4, 4, 1, 1, 8, 10)
    assert max_depth(sc) == 2 and solve_d_ff(sc, 2) == 1
    with pytest.raises(ValueError, match="n_layers=3 gives d_ff=-1 < 1 .*deepest feasible depth is 2"):
        solve_d_ff(sc, 3)
    with pytest.raises(ValueError, match="n_layers=0 must be >= 1"):
        solve_d_ff(sc, 0)


def test_width_delta_by_hand():
    "w(k) = round((1 - n0 / (n0 + k)) * (d_ff0 + A / beta)), A / beta = (4 * d_attn + 2) / 3."
    from depthnb.solver import width_delta

    sc = SizeClass("hand", 4, 4, 1, 1, 8, 10)  # A / beta = 18 / 3 = 6, so d_ff0 + A / beta = 14
    # 14/2 = 7, 14*2/3 = 9.33, 14*3/4 = 10.5 -> 11 (halves round up)
    assert [width_delta(sc, k) for k in (0, 1, 2, 3)] == [0, 7, 9, 11]
    assert width_delta(SizeClass("hand", 4, 4, 1, 2, 8, 10), -1) == -14  # (1 - 2/1) * 14: one layer fewer, wider


def test_flops_by_hand():
    "Forward = 2 x matmul parameters (layers and output projection) + 4 n_layers n_ctx d_attn; training = 3 x forward."
    from types import SimpleNamespace

    cfg = SimpleNamespace(n_layers=2, d_model=4, d_ff=10, d_attn=6, n_vocab=7, n_ctx=8)
    matmul = 2 * (3 * 4 * 10 + 4 * 4 * 6) + 4 * 7  # 460
    f = flops_per_token(cfg)
    assert f.forward == 2 * matmul + 4 * 2 * 8 * 6 == 1304 and f.train == 3 * 1304
    g = flops_per_token(cfg, n_ctx=16)  # the argument overrides the config's context
    assert g == (2 * matmul + 4 * 2 * 16 * 6, 3 * (2 * matmul + 4 * 2 * 16 * 6))


def test_table2_columns_and_rows():
    t = table2()
    assert list(t.columns) == ["size_class", "n_layers", "d_ff", "d_ff_paper", "n_params", "ff_ratio", "baseline"]
    assert list(t.size_class.unique()) == list(SIZE_CLASSES)
    for row in t.itertuples():
        sc = SIZE_CLASSES[row.size_class]
        assert row.n_layers in sc.depths
        assert row.n_params == model_params(sc, row.n_layers, row.d_ff)
        assert row.ff_ratio == round(sc.d_model / row.d_ff, 4)
        assert row.baseline == (row.n_layers == sc.n_layers)
    assert t.baseline.sum() == len(SIZE_CLASSES)
    assert t.loc[t.size_class == "41M", "n_params"].iloc[0] == 41_289_216  # Petty et al.'s 41M class, one layer


def test_family_rows():
    from depthnb.solver import family

    sc = SizeClass("tiny", 8, 8, 2, 2, 12, 16, (1, 2, 3))
    f = family(sc)
    assert list(f.columns) == ["n_layers", "d_ff", "n_params", "ff_ratio"]
    assert list(f.n_layers) == [1, 2, 3] and list(f.d_ff) == [35, 12, 4]
    assert list(f.n_params) == [model_params(sc, n, d) for n, d in zip(f.n_layers, f.d_ff)]
    assert list(f.ff_ratio) == [8 / 35, 8 / 12, 8 / 4]
    assert list(family(sc, depths=[3, 1]).n_layers) == [3, 1]  # explicit depths win over the class's
    edge = SizeClass("edge", 4, 4, 1, 1, 8, 10)  # no depths of its own: every feasible depth
    assert family(edge).to_dict("list") == dict(n_layers=[1, 2], d_ff=[8, 1], n_params=[248, 248], ff_ratio=[0.5, 4.0])
    paper = family("41M")
    t = table2()
    assert list(paper.d_ff) == list(t[t.size_class == "41M"].d_ff)
