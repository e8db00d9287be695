"""Run a test module's check function under Triton's interpreter in a fresh process: Triton reads TRITON_INTERPRET
when it is first imported, so a process that imported it already cannot switch."""
import os
import subprocess
import sys
from pathlib import Path


def assert_interpreted(module: str, check: str, timeout: int = 600, **env) -> None:
    "`module.check()` in a fresh interpreter with TRITON_INTERPRET=1 (and `env`) on one thread; fails with its stderr."
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1", **env}
    code = f"import {module}; {module}.{check}(); print('ok')"
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent, env=env, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
