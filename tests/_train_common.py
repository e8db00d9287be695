"""Shared settings of the trainer tests, imported by the tests and by the scripts they run as subprocesses."""
from __future__ import annotations

import time
from dataclasses import replace

from depthnb.config import DataConfig, ModelConfig, PretrainConfig, override

# A small slice of the real pretraining corpus: tokenizer and packed blocks are cached by the data module.
TEST_DATA = DataConfig(corpus="enwiki", max_train_docs=400, eval_sets=("enwiki_valid",), vocab_size=512,
                       tokenizer_docs=400)
# The CUDA tests' data: the same tokenizer and training blocks, no held-out set. The GPU plan carries their cache
# files (0.2 MB compressed; benchmarks/gpu_plan.py cuda_test_files): the device cannot fetch the raw corpus, and the
# held-out set's packed tokens (7 MB) would not fit the carry.
CUDA_TEST_DATA = replace(TEST_DATA, eval_sets=())
N_CTX = 32


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
