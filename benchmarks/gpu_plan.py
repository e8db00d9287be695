#!/usr/bin/env python3
"""The GPU plan's command line: `python3 benchmarks/gpu_plan.py budget|prepare|run|assemble|rehearse` (with no
command: its usage). The plan is the package's tooling, depthnb.tools.gpu_plan and its neighbours (nbs/92*_gpu_*.ipynb);
benchmarks/README.md ("The GPU plan") says how to use it. This script runs it from its own checkout, which the GPU
image has not installed, and installs the carried wheels for `run` before the rest of depthnb is imported."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's depthnb, also where it is not installed (the GPU image)

from depthnb.tools.gpu_job import use_carried_wheels  # noqa: E402  (it imports nothing the GPU image lacks)

if __name__ == "__main__" and sys.argv[1:2] == ["run"]:
    use_carried_wheels(ROOT)  # before the rest of depthnb: its model module needs fastcore, which the image lacks

from depthnb.tools.gpu_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(root=ROOT))
