"""Run a small pretraining (see `_train_common.small_config`) in its own process: for the SIGKILL and DDP tests.

usage: python tests/_pretrain_script.py RUN_DIR [--sleep SECONDS] [--set KEY=VALUE ...]
(also under `torchrun --nproc_per_node 2`)."""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _train_common import DataHook, small_config, small_data  # noqa: E402

from depthnb.train import pretrain  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("run_dir")
ap.add_argument("--sleep", type=float, default=0.0, help="seconds to wait before each batch (to leave time for a kill)")
ap.add_argument("--set", dest="overrides", action="append", default=[])
args = ap.parse_args()
torch.set_num_threads(1)
cfg = small_config(**dict(kv.split("=", 1) for kv in args.overrides))
pretrain(cfg, args.run_dir, data=DataHook(small_data(), sleep=args.sleep), progress=False)
