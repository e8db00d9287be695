"""The README's main command, then the docs site, on a fresh clone of this checkout (its committed state): `make
reproduce` (the tiny preset, install included) and then `make docs DOCS_CHECK=1` (the build, then the site check in
headless Chromium) both succeed. The check fails on what a local run could leak into the pages that the committed
notebooks do not hold: an absolute path of the clone (its tokenizer cache, its runs), a progress bar, a broken image.
`../shared` is reachable beside the clone, as beside this checkout, so the clone reads the data mirror as a user's
would. Marked slow (it trains and runs every notebook: about 25 min plus 12 min for the docs on the 2-core CI machine)
and browser (it needs Debian's Chromium)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _browser import CHROMIUM, require  # noqa: E402

from depthnb.presets import repo_root  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.browser]

# The clone's own environment: its .venv (made by `make`), its data mirror found as ../shared/data beside it.
DROPPED = ("VIRTUAL_ENV", "PYTHONPATH", "DEPTHNB_DATA_MIRROR", "PYTEST_CURRENT_TEST")


def make(dest: Path, env: dict, *target: str, timeout: int) -> subprocess.CompletedProcess:
    done = subprocess.run(["make", *target], cwd=dest, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (f"make {' '.join(target)} failed (exit {done.returncode}):\n"
                                  f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done


def test_make_reproduce_then_make_docs_on_a_fresh_clone(tmp_path):
    require(Path(CHROMIUM).exists(), f"{CHROMIUM} missing: apt-get install chromium")
    root = repo_root()
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("needs a git checkout")
    dest = tmp_path / "depthnb"
    subprocess.run(["git", "clone", "-q", str(root), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", head.stdout.strip()], check=True)
    if (root.parent / "shared").is_dir():  # ../shared beside the clone, as beside this checkout
        (tmp_path / "shared").symlink_to(root.parent / "shared")
    env = {k: v for k, v in os.environ.items() if k not in DROPPED}

    make(dest, env, "reproduce", timeout=3 * 3600)
    docs = make(dest, env, "docs", "DOCS_CHECK=1", timeout=2 * 3600)

    assert (dest / "_docs" / "index.html").is_file() and (dest / "_docs" / "results.html").is_file()
    assert "PROBLEM:" not in docs.stderr, docs.stderr[-4000:]
    assert "opened " in docs.stdout and " 0 broken links" in docs.stdout, docs.stdout[-3000:]
    # the experiment pages the check has just passed show the clone's own executed notebooks, not the templates
    assert (dest / "runs" / "tiny" / "notebooks" / "petty_data.ipynb").is_file()
    assert "runs/tiny/notebooks/petty_data.ipynb" in (dest / "_docs" / "experiments" / "petty_data.html").read_text()
