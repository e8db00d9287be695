"""Shared pytest settings, markers and fixtures of `tests/`.

Where a test lives. A notebook tests its own contract: small examples in its cells, run by `nbdev_test`, of
what its functions promise on inputs that take seconds. `tests/` holds what a notebook cannot hold in a few
seconds or on its own: a test that starts a process (a `depthnb` command, `torchrun`, a script, a notebook
through papermill), trains a model, or crosses modules (a run through several notebooks' code, the
reproduction, the docs site). A fixture or setting that more than one test module uses lives in one place:
a fixture here, a plain setting or helper in `_train_common.py` (which the scripts that the tests start
import as well)."""
import functools
import os
from pathlib import Path

import pytest

# Keep each test process to one thread per core pair: pytest-xdist runs two workers on the 2-core CI.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The `slow` rule: a test is marked `slow` when it takes more than 10 s on one core of the CI machine, or starts a
# process that trains (a `depthnb` command, `torchrun`, a training script) or runs a notebook. `make test` runs every
# test; `make quick` leaves the slow ones out (nbs/guides/01_running.ipynb, "Developing").
SLOW_SECONDS = 10
# Modules whose every test falls under the rule through a shared fixture: test_experiments runs `depthnb reproduce`
# (every notebook of the tiny preset, the report included) once for the module.
SLOW_MODULES = {"test_experiments"}

# Test modules that read the registry's data files (through the local mirror or the cache) in most of their tests:
# without the data they are skipped with one reason (`data_unavailable`) instead of failing, or downloading.
DATA_MODULES = {"test_data", "test_faults_data", "test_train", "test_ul2", "test_finetune", "test_midas",
                "test_parallel", "test_faults", "test_determinism", "test_tasks", "test_variants"}


def pytest_configure(config):
    config.addinivalue_line("markers", f"slow: takes more than {SLOW_SECONDS} s, or starts a process that trains or "
                                       "runs a notebook (make quick leaves these out)")
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped without one")
    config.addinivalue_line("markers", "browser: drives headless Chromium against the built docs site")
    config.addinivalue_line("markers", "rehearsal: the GPU plan's CPU dress rehearsal (make gpu-rehearsal; .ci/run runs it after make test)")
    config.addinivalue_line("markers", "data: reads the registry's data files: skipped, with one reason, when neither "
                                       "the local mirror nor the cache has them")


@functools.cache
def data_unavailable() -> str | None:
    """Why the registry's data files cannot be had without the network, or None: each must be verified in the cache
    or present in the local mirror (`sources.default_mirror`). `DEPTHNB_DATA_MIRROR=none` asks for downloads: None."""
    from depthnb import sources as S

    if (os.environ.get("DEPTHNB_DATA_MIRROR") or "x").strip().lower() == "none":
        return None
    try:
        registry = S.registry()
    except FileNotFoundError as e:
        return f"needs the data registry: {e}"
    mirror = S.default_mirror()
    lacking = [f.file for d in registry.values() for f in d.files
               if not S.is_verified(f) and not (mirror is not None and (mirror / f.file).is_file())]
    if not lacking:
        return None
    where = f"the mirror {mirror} lacks" if mirror is not None else "there is no local mirror (../shared/data or " \
        "DEPTHNB_DATA_MIRROR), and the cache lacks"
    return f"needs the data mirror: {where} {len(lacking)} data file(s), e.g. {lacking[0]}"


def pytest_collection_modifyitems(config, items):
    import torch

    no_cuda = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        module = Path(str(item.fspath)).stem
        if module in DATA_MODULES:
            item.add_marker(pytest.mark.data)
        if module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_cuda)
    if any("data" in item.keywords for item in items) and (why := data_unavailable()) is not None:
        os.environ["DEPTHNB_DATA_MIRROR"] = str(Path(config.rootpath) / ".no-data-mirror")  # never download instead
        skip = pytest.mark.skip(reason=why)
        for item in items:
            if "data" in item.keywords:
                item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    "Without the data, a test outside `DATA_MODULES` that stops on a missing data file is skipped for the same reason."
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or report.skipped:
        return
    from depthnb.sources import FetchError

    if call.excinfo.errisinstance(FetchError) and (why := data_unavailable()) is not None:
        report.outcome, report.longrepr = "skipped", (str(item.fspath), item.location[1] or 0, f"Skipped: {why}")


_unmarked_slow: list[tuple[str, float]] = []


def pytest_runtest_logreport(report):
    "Note the tests that broke the `slow` rule: longer than `SLOW_SECONDS` (set-up included) and not marked."
    if report.when in ("setup", "call") and report.duration > SLOW_SECONDS and "slow" not in report.keywords:
        _unmarked_slow.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter):
    if _unmarked_slow:
        terminalreporter.section(f"over {SLOW_SECONDS} s and not marked slow")
        for nodeid, seconds in sorted(_unmarked_slow, key=lambda t: -t[1]):
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")


@pytest.fixture(scope="module")
def tok():
    """The tokenizer of the trainer tests' data (`_train_common.TEST_DATA`), on one thread. A module whose tests use
    another corpus defines its own `tok`, which takes precedence there."""
    import torch
    from _train_common import TEST_DATA
    from depthnb.data import train_tokenizer

    torch.set_num_threads(1)
    return train_tokenizer(TEST_DATA, log=None)
