"""Determinism: the same short pretraining, and the same fine-tuning of its result, in two run directories
(the pretraining in two fresh processes) give identical weights, metrics and predictions. Timings are the
only fields allowed to differ."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _train_common import TEST_DATA  # noqa: E402

from depthnb.config import FinetuneConfig  # noqa: E402
from depthnb.data import train_tokenizer  # noqa: E402
from depthnb.evaluation import evaluate_run  # noqa: E402
from depthnb.finetune import finetune  # noqa: E402
from depthnb.runs import load_model  # noqa: E402

SCRIPT = Path(__file__).parent / "_pretrain_script.py"
TIMINGS = {"tokens_per_s", "examples_per_s", "elapsed_s", "mfu", "seconds", "decode_seconds", "step_s"}
FT = FinetuneConfig(steps=12, batch_size=8, lr=1e-2, warmup_steps=2, eval_every=6, eval_examples=16, n_snapshots=1,
                    eval_batch_size=16, max_new_tokens=24, gen_limit=16, device="cpu")


def same_weights(a: Path, b: Path) -> bool:
    sa, sb = load_model(a).state_dict(), load_model(b).state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def metrics_without_timings(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in lines]


@pytest.mark.slow
def test_two_identical_runs_give_identical_files(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:  # each in a fresh process, as two invocations of the command line would be
        subprocess.run([sys.executable, str(SCRIPT), str(run), "--set", "steps=20"], check=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True)
    assert same_weights(*runs)
    assert metrics_without_timings(runs[0]) == metrics_without_timings(runs[1])

    torch.set_num_threads(1)
    tok = train_tokenizer(TEST_DATA, log=None)
    tuned = [tmp_path / "ft_a", tmp_path / "ft_b"]
    for run, source in zip(tuned, runs):
        finetune(source / "final.pt", "geoquery", FT, run, tokenizer=tok, progress=False, log=lambda *a: None)
    assert same_weights(*tuned)
    assert metrics_without_timings(tuned[0]) == metrics_without_timings(tuned[1])
    scores = [evaluate_run(run, "test", log=lambda *a: None) for run in tuned]
    assert [{k: v for k, v in s.items() if k not in TIMINGS} for s in scores][0] == \
           [{k: v for k, v in s.items() if k not in TIMINGS} for s in scores][1]
    assert (tuned[0] / "eval" / "test.predictions.jsonl").read_bytes() == \
           (tuned[1] / "eval" / "test.predictions.jsonl").read_bytes()
