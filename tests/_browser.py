"""What the browser tests share: where Chromium is, and how a missing piece skips (or, with
DEPTHNB_BROWSER_TESTS=1, where CI installs everything, fails) a test."""
import os

import pytest

CHROMIUM = os.environ.get("DEPTHNB_CHROMIUM", "/usr/bin/chromium")


def require(ok: bool, why: str):
    "Skip the test unless `ok`; fail it instead where the browser tests must run."
    if ok:
        return
    if os.environ.get("DEPTHNB_BROWSER_TESTS") == "1":
        pytest.fail(why)
    pytest.skip(why)
