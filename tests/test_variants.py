"""A researcher's own variant, and a reproduction run twice, on a fresh clone of this checkout (its committed state):
- `depthnb reproduce ... --set ...` and papermill on one notebook from the clone's root (no `--cwd`) write the variant
  into its own folder, named from its overrides, and leave `git status` clean under `figures/`;
- two reproductions of one experiment leave no tracked change outside the timing files (`reproduce.TIMING_FILES`),
  and their executed copies (what the docs site renders) show no progress bar and no absolute path.
Marked slow (tests/conftest.py): each starts notebooks."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from depthnb.presets import repo_root
from depthnb.reproduce import is_timing_file
from depthnb.sources import default_mirror
from depthnb.tools.sitecheck import FORBIDDEN_TEXT

pytestmark = pytest.mark.slow

GIT = ["git", "-c", "user.name=depthnb-test", "-c", "user.email=test@depthnb.invalid"]


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    "A `git clone` of this checkout at its HEAD, and the environment that runs the clone's depthnb."
    root = repo_root()
    if subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("needs a git checkout")
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dest = tmp_path_factory.mktemp("clone") / "depthnb"
    subprocess.run(["git", "clone", "-q", str(root), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", head], check=True)
    env = dict(os.environ, PYTHONPATH=str(dest), OMP_NUM_THREADS="1")
    if (mirror := default_mirror()) is not None:  # the clone has no ../shared/data beside it
        env["DEPTHNB_DATA_MIRROR"] = str(mirror)
    return dest, env


def run(clone, *argv) -> subprocess.CompletedProcess:
    dest, env = clone
    done = subprocess.run([sys.executable, *argv], cwd=dest, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def changed(dest: Path) -> list[str]:
    "`git status` under figures/: every tracked change and every new file."
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "figures"], cwd=dest,
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def test_variant_keeps_the_committed_figures(clone):
    dest, _ = clone
    done = run(clone, "-m", "depthnb.cli", "reproduce", "--preset", "tiny", "--only", "petty_shapes",
               "--set", "pretrain.steps=80")
    assert changed(dest) == []
    own = dest / "runs" / "variants" / "pretrain.steps=80" / "figures" / "tiny"
    caption = (own / "petty_table2.md").read_text().split("\n")[0]
    assert "[preset: tiny, variant pretrain.steps=80 (overrides: pretrain.steps=80); hardware: " in caption
    assert "variant pretrain.steps=80 of preset tiny" in done.stdout


def test_papermill_from_the_root_without_cwd(clone, tmp_path):
    "The README's papermill command on one notebook, run from the checkout's root: the notebook finds its folders."
    dest, _ = clone
    run(clone, "-m", "papermill", "nbs/experiments/petty_shapes.ipynb", str(tmp_path / "out.ipynb"),
        "-p", "preset", "tiny", "-y", "overrides: {pretrain.steps: 60}", "--no-progress-bar")
    assert changed(dest) == []
    own = dest / "runs" / "variants" / "pretrain.steps=60" / "figures" / "tiny"
    assert "variant pretrain.steps=60" in (own / "petty_fig1_size_classes.txt").read_text()


def test_two_reproductions_leave_no_tracked_change(clone):
    """The preset itself (no overrides: into the clone's figures/tiny/), twice, from fresh runs folders. The first run
    is committed in the clone as this machine's baseline (the hardware in the captions is this machine's); the second
    must change nothing but timing files."""
    dest, _ = clone
    only = "petty_shapes,petty_data"
    run(clone, "-m", "depthnb.cli", "reproduce", "--preset", "tiny", "--only", only, "--runs-dir", "runs-first")
    subprocess.run([*GIT, "add", "-A", "figures"], cwd=dest, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "first reproduction", "--allow-empty"], cwd=dest, check=True)
    run(clone, "-m", "depthnb.cli", "reproduce", "--preset", "tiny", "--only", only, "--runs-dir", "runs-second")
    changes = changed(dest)
    assert [c for c in changes if not is_timing_file(c.split()[-1])] == [], changes
    assert (dest / "figures" / "tiny" / "data_pretraining_timing.csv").exists()
    assert "pack_seconds" not in (dest / "figures" / "tiny" / "data_pretraining.csv").read_text()
    # what the docs site renders of a local run: the executed copies, without progress bars or absolute paths
    absolute = re.compile(FORBIDDEN_TEXT["absolute path"])
    for name in only.split(","):
        executed = json.loads((dest / "runs-second" / "tiny" / "notebooks" / f"{name}.ipynb").read_text())
        shown = ["".join(o.get("text", [])) + "".join("".join(v) if isinstance(v, list) else str(v)
                                                      for v in o.get("data", {}).values())
                 for c in executed["cells"] for o in c.get("outputs", [])]
        assert not [o for o in shown if "\r" in o], f"{name}: a progress bar in its outputs"
        assert not [m.group(0) for o in shown for m in absolute.finditer(o)], f"{name}: an absolute path in its outputs"
