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
