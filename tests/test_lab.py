"""JupyterLab, one of the three ways in, in a real browser: start the server `make lab` starts, open a component
notebook in headless Chromium, run its cells down to the first one with an output, and see that output.

Needs JupyterLab and Playwright (`python -m depthnb.tools.docs_cli deps --browser`) and Debian's Chromium at
/usr/bin/chromium. Without them the test skips, unless DEPTHNB_BROWSER_TESTS=1 turns a missing piece into a
failure (CI sets it where it installs them). Screenshot: runs/lab-screenshots/.
"""
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _browser import CHROMIUM, require  # noqa: E402

from depthnb.tools import docs, sitecheck  # noqa: E402

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "00_foundations/03_solver.ipynb"
CELL = "pd.DataFrame(SIZE_CLASSES.values())"  # its output lists the paper's size classes



def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    missing = docs.missing_requirements(sitecheck.BROWSER_REQUIREMENTS)
    require(not missing, f"missing {missing}: run `.venv/bin/python -m depthnb.tools.docs_cli deps --browser`")
    require(Path(CHROMIUM).exists(), f"{CHROMIUM} missing: apt-get install chromium")
    port, token = _free_port(), secrets.token_hex(16)
    home = tmp_path_factory.mktemp("lab-home")  # workspace and settings of a first-time user
    root = tmp_path_factory.mktemp("lab-root")  # a copy: JupyterLab autosaves the notebook it runs
    (root / NOTEBOOK).parent.mkdir(parents=True)  # the notebook's layer folder, as in nbs/
    shutil.copy(ROOT / "nbs" / NOTEBOOK, root / NOTEBOOK)
    env = {**os.environ, "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
           "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"), "JUPYTER_RUNTIME_DIR": str(home / "runtime")}
    server = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
                               f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={token}",
                               "--allow-root"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if server.poll() is not None:
                pytest.fail(f"jupyter lab exited: {server.stderr.read()[-2000:]}")
            time.sleep(1)
    else:
        server.kill()
        pytest.fail("jupyter lab did not answer within 120 s")
    yield base, token
    server.terminate()
    server.wait(30)


def test_a_component_notebook_runs_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    base, token = lab
    cells = json.loads((ROOT / "nbs" / NOTEBOOK).read_text())["cells"]
    target = next(i for i, c in enumerate(cells) if "".join(c["source"]).strip() == CELL)
    shots = ROOT / "runs" / "lab-screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=list(sitecheck.CHROMIUM_FLAGS[1:]), headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{base}/lab/tree/{NOTEBOOK}?token={token}")
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=120_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
        page.locator(".jp-NotebookPanel .jp-Cell").first.click()
        page.keyboard.press("Escape")  # command mode: Shift+Enter runs the cell and selects the next
        for _ in range(target + 1):
            page.keyboard.press("Shift+Enter")
            page.wait_for_timeout(300)  # a keystroke at a time, as a person types
        output = page.locator(".jp-NotebookPanel .jp-OutputArea-output", has_text="374M")
        try:
            output.first.wait_for(timeout=180_000)
        finally:
            page.screenshot(path=str(shots / "lab.png"))
        text = output.first.text_content()
        browser.close()
    assert "41M" in text and "134M" in text, text
