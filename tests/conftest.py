import os

import pytest

# Keep each test process to one thread per core pair: pytest-xdist runs two workers on the 2-core CI.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running test (seconds to minutes)")
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped without one")
    config.addinivalue_line("markers", "browser: drives headless Chromium against the built docs site")
    config.addinivalue_line("markers", "rehearsal: the GPU plan's CPU dress rehearsal (make gpu-rehearsal; .ci/run runs it after make test)")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
