"Properties of depthnb.seeds beyond the notebook's examples."
import numpy as np
import pandas as pd
import pytest

from depthnb.seeds import latency_fit


@pytest.mark.parametrize("slope,intercept", [(0.2, 0.1), (1.5, 0.0), (0.01, 3.0)])
def test_latency_fit_exact_lines(slope, intercept):
    depths = np.array([1, 2, 4, 6, 8, 12, 16, 24, 32])
    fit = latency_fit(pd.DataFrame(dict(n_layers=depths, seconds=slope * depths + intercept)))
    assert fit.slope == pytest.approx(slope) and fit.intercept == pytest.approx(intercept, abs=1e-9)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12) and fit.n == len(depths)


def test_latency_fit_noise_and_errors():
    df = pd.DataFrame(dict(n_layers=[1, 2, 3, 4], seconds=[1.0, 3.0, 2.0, 4.0]))
    fit = latency_fit(df)
    assert fit.slope == pytest.approx(0.8) and fit.r2 == pytest.approx(0.64)
    with pytest.raises(ValueError, match="at least two distinct"):
        latency_fit(df.assign(n_layers=3))
