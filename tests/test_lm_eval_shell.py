"""lm-eval from the shell as documented: `python -m depthnb.lm_eval` with the `depthnb` model on depthnb's task
files, `depthnb downstream --include-path`, a command that can score nothing, and lm-eval's own `hf` model (a small
randomly initialised Hugging Face model built from a config, no download) on depthnb's primitive and math tasks."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from depthnb.config import ModelConfig
from depthnb.data import train_tokenizer
from depthnb.downstream_tasks import TASKS_DIR
from depthnb.model import DecoderLM
from depthnb.presets import get_preset
from depthnb.runs import save_weights, write_or_check_config

BIN = Path(sys.executable).parent  # the environment's console scripts: depthnb, lm_eval


def shell(command: str, tmp_path, **env) -> subprocess.CompletedProcess:
    "`command` run by bash as a user types it, with this environment's scripts first on PATH, offline."
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               OMP_NUM_THREADS="1", **env)
    return subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    torch.manual_seed(0)
    tok = train_tokenizer(get_preset("tiny").pretrain.data, log=None)
    run = tmp_path_factory.mktemp("shell") / "run"
    write_or_check_config(run, dict(kind="pretrain", tokenizer=str(tok.path)))
    model = DecoderLM(ModelConfig(d_model=32, d_attn=32, n_heads=2, d_ff=64, n_layers=2, n_vocab=2048, n_ctx=128))
    save_weights(run / "final.pt", model, step=0)
    return run


def results(folder: Path) -> dict:
    return json.loads(next(folder.rglob("results_*.json")).read_text())


def test_include_path_is_the_shipped_task_folder(tmp_path):
    done = shell("depthnb downstream --include-path", tmp_path)
    assert done.returncode == 0 and Path(done.stdout.strip()) == TASKS_DIR
    assert (TASKS_DIR / "svamp.yaml").exists() and (TASKS_DIR / "primitive_copy_random.yaml").exists()


@pytest.mark.slow
def test_documented_lm_eval_command(run_dir, tmp_path):
    # the command of the README and nbs/07c_lm_eval.ipynb, word for word (RUN_DIR a tiny run), plus --output_path
    command = ('python -m depthnb.lm_eval --model depthnb --model_args pretrained=$RUN_DIR '
               '--include_path "$(depthnb downstream --include-path)" --tasks svamp --limit 8')
    done = shell(command + " --output_path out", tmp_path, RUN_DIR=str(run_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    res = results(tmp_path / "out")
    assert res["n-samples"]["svamp"]["effective"] == 8 and "exact_match,strict-match" in res["results"]["svamp"]
    assert res["config"]["model"] == "depthnb"


def test_a_command_that_scores_nothing_exits_with_one_line(run_dir, tmp_path):
    # the hub made unreachable whatever the network: the message names that, not a flag depthnb set itself
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    done = subprocess.run(["bash", "-c", f"depthnb downstream {run_dir} --tasks triviaqa"], cwd=tmp_path,
                          env=dict(env, PATH=f"{BIN}:{env['PATH']}", HF_ENDPOINT="http://127.0.0.1:9"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("depthnb downstream: error: nothing to score: TriviaQA: not in the local mirror")
    assert "127.0.0.1 is unreachable" in done.stderr and "HF_HUB_OFFLINE" not in done.stderr
    assert not (run_dir / "downstream").exists()


@pytest.fixture(scope="module")
def hf_model_dir(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # lm-eval's hf model imports it
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from depthnb.primitives import few_shot, holdout_set
    words = sorted({w for e in few_shot(holdout_set("copy_random", 40, 0), k=5) for w in (e["prompt"] + e["target"]).split()})
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.WhitespaceSplit(), decoders.WordPiece(prefix="##")
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                               unk_token="<unk>")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                                      pad_token_id=0, eos_token_id=1, bos_token_id=1)
    folder = tmp_path_factory.mktemp("hf") / "tiny-llama"
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_any_lm_eval_model_scores_depthnbs_tasks(hf_model_dir, tmp_path):
    # plain lm_eval, its own hf model: depthnb's tasks need only --include_path
    command = (f'lm_eval --model hf --model_args pretrained={hf_model_dir},dtype=float32 --device cpu '
               '--include_path "$(depthnb downstream --include-path)" '
               '--tasks primitive_copy_random,primitive_psm,svamp --limit 4 --batch_size 4 --output_path out')
    done = shell(command, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    res = results(tmp_path / "out")
    assert {t: res["n-samples"][t]["effective"] for t in res["n-samples"]} == \
        {"primitive_copy_random": 4, "primitive_psm": 4, "svamp": 4}
    assert set(res["results"]["primitive_psm"]) >= {"accuracy,none", "accuracy_calculator,none"}
    assert res["config"]["model"] == "hf"
