"""Shared settings of the trainer tests, imported by the tests and by the scripts they run as subprocesses."""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from depthnb.config import DataConfig, ModelConfig, PretrainConfig, override
from depthnb.runs import load_model

# A small slice of the real pretraining corpus: tokenizer and packed blocks are cached by the data module.
TEST_DATA = DataConfig(corpus="enwiki", max_train_docs=400, eval_sets=("enwiki_valid",), vocab_size=512,
                       tokenizer_docs=400)
# The CUDA tests' data: the same tokenizer and training blocks, no held-out set. The GPU plan carries their cache
# files (0.2 MB compressed; depthnb.tools.gpu_prepare.cuda_test_files): the device cannot fetch the raw corpus, and the
# held-out set's packed tokens (7 MB) would not fit the carry.
CUDA_TEST_DATA = replace(TEST_DATA, eval_sets=())
N_CTX = 32
# The reproduction below `tiny` (tests/test_experiments.py, test_own_reproduce.py, test_refine_finetune.py): two
# depths, one seed, 20 pretraining and 10 fine-tuning steps, 20 gen examples, two tasks, a shortened primitives
# protocol. The data settings are TEST_DATA's, so the tokenizer and packed corpus are shared caches. A test that needs
# another setting says so where it adds it to a copy (test_own_reproduce scores 34 gen examples: gen_limit 40).
REPRODUCE_OVERRIDES = {
    "pretrain.data.max_train_docs": 400, "pretrain.data.tokenizer_docs": 400, "pretrain.data.vocab_size": 512,
    "pretrain.data.eval_sets": "('enwiki_valid',)", "pretrain.model.n_vocab": 512, "pretrain.model.n_ctx": 64,
    "pretrain.steps": 20, "pretrain.batch_size": 8, "pretrain.warmup_steps": 4, "pretrain.eval_every": 10,
    "pretrain.eval_sequences": 8, "pretrain.log_every": 5, "pretrain.ckpt_every": 10, "pretrain.n_snapshots": 3,
    "finetune.steps": 10, "finetune.batch_size": 8, "finetune.warmup_steps": 2, "finetune.eval_every": 5,
    "finetune.eval_examples": 20, "finetune.n_snapshots": 2, "finetune.gen_limit": 20, "finetune.max_new_tokens": 48,
    "depths": {"tiny": [1, 2]}, "tasks": ["cogs", "passivization"],
    "primitives.n_eval": 10, "primitives.ft_steps": 6, "primitives.ft_eval_from": 4, "primitives.ft_eval_every": 2,
    "primitives.ft_seeds": "(0,)",
}


def small_config(**changes) -> PretrainConfig:
    "A 2-layer, 32-wide model on 8 x 32-token batches; checkpoints every 10 of 40 steps."
    base = PretrainConfig(model=ModelConfig(d_model=32, d_attn=32, n_heads=2, d_ff=64, n_layers=2,
                                            n_vocab=TEST_DATA.vocab_size, n_ctx=N_CTX),
                          data=TEST_DATA, steps=40, batch_size=8, lr=3e-3, warmup_steps=4, eval_every=20,
                          eval_sequences=16, log_every=5, ckpt_every=10, n_snapshots=3, device="cpu",
                          compile=False)
    return override(base, **changes)


def small_data(data_cfg: DataConfig = TEST_DATA):
    "The real `PretrainingData` for `data_cfg`."
    from depthnb.data import prepare_pretraining
    return prepare_pretraining(data_cfg, N_CTX)


class Crash(Exception):
    "Raised by `DataHook` to simulate a crash at a given step."


class DataHook:
    "Wraps a `PretrainingData`: optionally sleeps before every batch, or crashes at `crash_at`."
    def __init__(self, data, sleep: float = 0.0, crash_at: int | None = None):
        self.eval, self.tokenizer, self._train = data.eval, getattr(data, "tokenizer", None), data.train
        self.sleep, self.crash_at = sleep, crash_at
        self.train = self

    def __len__(self):
        return len(self._train)

    def batch(self, step, batch_size, rank=0, world=1):
        if self.crash_at is not None and step == self.crash_at:
            raise Crash(f"simulated crash at step {step}")
        if self.sleep:
            time.sleep(self.sleep)
        return self._train.batch(step, batch_size, rank, world)


# Fields that measure time: the only ones a resumed run's records may differ in from the uninterrupted run's.
TIMINGS = {"tokens_per_s", "examples_per_s", "elapsed_s", "mfu", "seconds", "wall_s", "train_s", "grow_s",
           "own_cpu_share", "others_cpu_share", "machine_busy"}  # what the clock and the machine's load decide


def records(run_dir: Path, kinds=("train", "eval", "snapshot")) -> list[dict]:
    "The records of `kinds` in `run_dir/metrics.jsonl`, in order, without their timing fields."
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in map(json.loads, lines) if r.get("kind") in kinds]


def resumed_from(run_dir: Path) -> list[int]:
    "The checkpoint steps the run's calls resumed from (its `resume` records: the first step each trained is the next)."
    return [r["step"] for r in records(run_dir, ("resume",))]


def assert_resumed_like(run: Path, reference: Path, at: list[int], kinds=("train", "eval", "snapshot")):
    """`run` resumed from the checkpoints of steps `at` (and from no other), and every record of `kinds` it wrote, and
    the weights of every snapshot it kept, equal those of the uninterrupted run `reference` (timings aside)."""
    assert resumed_from(run) == at, f"{run} resumed from steps {resumed_from(run)}, expected {at}"
    got, want = records(run, kinds), records(reference, kinds)
    assert got == want, next((f"record {i}: {g} != {w}" for i, (g, w) in enumerate(zip(got, want)) if g != w),
                             f"{len(got)} records != {len(want)}")
    snaps = [r["path"] for r in got if r["kind"] == "snapshot"]
    assert snaps, f"{run}: no snapshot records to compare"
    for rel in snaps:
        a, b = load_model(Path(run) / rel).state_dict(), load_model(Path(reference) / rel).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"snapshot {rel} differs"
