"""Run a small stacked pretraining (see `test_midas.stack_config_small`) in its own process: for the SIGKILL test.

usage: python tests/_stack_script.py RUN_DIR [--sleep SECONDS] [--method M]"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _train_common import DataHook, small_config, small_data  # noqa: E402

from depthnb.config import StackConfig  # noqa: E402
from depthnb.stacking import stack_train  # noqa: E402

STACK_STEPS = dict(steps=30, ckpt_every=5, log_every=5, eval_every=15, n_snapshots=3, model__n_layers=3)

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds to wait before each batch (time for a kill)")
    ap.add_argument("--method", default="midas")
    args = ap.parse_args()
    torch.set_num_threads(1)
    stack_train(small_config(**STACK_STEPS), StackConfig(method=args.method, block_size=1), args.run_dir,
                data=DataHook(small_data(), sleep=args.sleep), progress=False)
