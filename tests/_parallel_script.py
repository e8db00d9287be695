"""The FSDP side of tests/test_parallel.py, launched by `torchrun --nproc_per_node N` (gloo, one thread per process).

usage: torchrun ... tests/_parallel_script.py train RUN_DIR [--crash-at S] [--hang-in-save S] [--band]
       torchrun ... tests/_parallel_script.py stack RUN_DIR
       torchrun ... tests/_parallel_script.py grow OUT_JSON"""
import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_optimizer_state_dict

sys.path.insert(0, str(Path(__file__).parent))
from _train_common import Crash, DataHook, small_config, small_data  # noqa: E402

import depthnb.parallel as parallel  # noqa: E402
from depthnb.config import StackConfig  # noqa: E402
from depthnb.model import DecoderLM  # noqa: E402
from depthnb.optim import make_optimizer  # noqa: E402
from depthnb.stacking import grow_state, stack_train  # noqa: E402
from depthnb.train import pretrain  # noqa: E402

# 12 steps, a checkpoint every 4, a record every step: short enough for 2 CPU processes in seconds
RUN = dict(steps=12, ckpt_every=4, log_every=1, eval_every=6, n_snapshots=2, warmup_steps=2)
STACK = dict(RUN, model__n_layers=3)
# band attention (CUDA's default; on the CPU its fused CPU kernel and the PyTorch band step): buckets that put every
# distance from 12 on in the last one, so that 32-token sequences have a band
BAND_RUN = dict(model__attn_impl="band-cudnn-triton", model__rel_buckets=8, model__rel_max_distance=16)


def run_config(parallel_mode: str, **changes):
    return small_config(**{**RUN, **changes}, parallel=parallel_mode)


def stack_run_config(parallel_mode: str):
    return small_config(**STACK, parallel=parallel_mode)


def hang_in_save(step: int, marker: Path):
    "Make `dcp.save` of step `step` write everything, then hang before the rename, its pid in `marker` (for the SIGKILL test)."
    real = parallel.dcp

    def save(state, checkpoint_id):
        real.save(state, checkpoint_id=checkpoint_id)
        if f"step_{step:08d}" in str(checkpoint_id):
            marker.with_name(f"{marker.name}.{dist.get_rank()}").write_text(str(os.getpid()))
            time.sleep(600)
    parallel.dcp = SimpleNamespace(save=save, load=real.load)


def full_state(model, optimizer):
    "Model and optimizer state, gathered in full on every rank (keyed by parameter name)."
    return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))


def same(a, b) -> bool:
    if torch.is_tensor(a):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):  # a checkpoint stores AdamW's betas tuple as a list
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def grow_check(out: Path) -> None:
    """Grow a trained sharded model two ways and compare bit for bit: (a) through its sharded checkpoint, loaded full,
    grown, resharded and gathered; (b) its gathered full state grown without FSDP."""
    cfg = run_config("fsdp", model__n_layers=3)
    info = parallel.init_parallel("cpu", "fsdp")
    make = lambda m: make_optimizer(m, cfg.optimizer, cfg.lr)
    torch.manual_seed(0)
    model, optimizer = parallel.prepare_training(DecoderLM(cfg.model), make, None, "fsdp", torch.device("cpu"), False)
    x = torch.randint(0, cfg.model.n_vocab, (8, 33), generator=torch.Generator().manual_seed(1))[info.rank::info.world]
    for _ in range(2):
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    run_dir = out.parent / "grow_run"
    parallel.ShardedCheckpoints().save(run_dir, model, optimizer, dict(step=2), info)
    results = {}
    for method in ("midas", "gradstack"):
        stack = StackConfig(method=method, block_size=1)
        # (b) without FSDP: the gathered state, as a plain model and optimizer
        plain = DecoderLM(cfg.model)
        plain_opt = make(plain)
        model_sd, optimizer_sd = full_state(model, optimizer)
        plain.load_state_dict(model_sd)
        set_optimizer_state_dict(plain, plain_opt, optimizer_sd)
        grown_b, opt_b = grow_state(plain, plain_opt.state_dict(), cfg, stack)
        # (a) through the sharded checkpoint, then resharded for the next stage
        full = DecoderLM(cfg.model)
        full_opt = make(full)
        parallel.ShardedCheckpoints().load(run_dir, full, full_opt)
        grown_a, opt_a = grow_state(full, full_opt.state_dict(), cfg, stack)
        sharded, sharded_opt = parallel.prepare_training(grown_a, make, opt_a, "fsdp", torch.device("cpu"), False)
        msd_a, osd_a = full_state(sharded, sharded_opt)
        ref_opt = make(grown_b)
        ref_opt.load_state_dict(opt_b)
        msd_b, osd_b = full_state(grown_b, ref_opt)
        results[method] = dict(layers=len(sharded.layers), model=same(msd_a, msd_b), optimizer=same(osd_a, osd_b),
                               optimizer_entries=sum(len(v) for v in osd_a["state"].values()))
    if info.main:
        out.write_text(json.dumps(results))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["train", "stack", "grow"])
    ap.add_argument("path")
    ap.add_argument("--crash-at", type=int, default=None)
    ap.add_argument("--hang-in-save", type=int, default=None)
    ap.add_argument("--band", action="store_true", help="train with band attention (BAND_RUN)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    path = Path(args.path)
    if args.what == "grow":
        grow_check(path)
    elif args.what == "stack":
        stack_train(stack_run_config("fsdp"), StackConfig(method="midas", block_size=1), path, data=small_data(),
                    progress=False)
    else:
        if args.hang_in_save is not None:
            hang_in_save(args.hang_in_save, path.parent / "saving")
        try:
            config = run_config("fsdp", **BAND_RUN if args.band else {})
            pretrain(config, path, data=DataHook(small_data(), crash_at=args.crash_at), progress=False)
        except Crash as e:
            print(e)
