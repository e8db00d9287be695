"""Run a small pretraining (see `_train_common.small_config`) in its own process: for the SIGKILL, fault and DDP tests.

usage: python tests/_pretrain_script.py RUN_DIR [--sleep SECONDS] [--kill-in checkpoint|metrics] [--set KEY=VALUE ...]
(also under `torchrun --nproc_per_node 2`). `--kill-in` SIGKILLs the process halfway through writing the step-20
checkpoint, or halfway through appending the step-25 metrics record."""
import argparse
import io
import os
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _train_common import DataHook, small_config, small_data  # noqa: E402

import depthnb.runs  # noqa: E402
from depthnb.train import pretrain  # noqa: E402


def die_halfway(path: Path, data: bytes):
    "Leave the first half of `data` where the process was writing `path`, then die as a SIGKILL would leave it."
    with open(path, "ab") as f:
        f.write(data[: len(data) // 2])
    os.kill(os.getpid(), signal.SIGKILL)


def kill_in_checkpoint():
    atomic_write = depthnb.runs.atomic_write

    def dying(path, write):
        path = Path(path)
        if path.name == "step_00000020.pt":
            buffer = io.BytesIO()
            write(buffer)
            die_halfway(path.with_name(f".{path.name}.tmp{os.getpid()}"), buffer.getvalue())
        return atomic_write(path, write)
    depthnb.runs.atomic_write = dying


def kill_in_metrics():
    write = depthnb.runs.MetricsLog.write

    def dying(self, **record):
        if record.get("kind") == "train" and record.get("step") == 25:
            die_halfway(self.path, (depthnb.runs.json.dumps(record) + "\n").encode())
        return write(self, **record)
    depthnb.runs.MetricsLog.write = dying


ap = argparse.ArgumentParser()
ap.add_argument("run_dir")
ap.add_argument("--sleep", type=float, default=0.0, help="seconds to wait before each batch (to leave time for a kill)")
ap.add_argument("--kill-in", choices=("checkpoint", "metrics"), default=None)
ap.add_argument("--set", dest="overrides", action="append", default=[])
args = ap.parse_args()
torch.set_num_threads(1)
if args.kill_in:
    {"checkpoint": kill_in_checkpoint, "metrics": kill_in_metrics}[args.kill_in]()
cfg = small_config(**dict(kv.split("=", 1) for kv in args.overrides))
pretrain(cfg, args.run_dir, data=DataHook(small_data(), sleep=args.sleep), progress=False)
