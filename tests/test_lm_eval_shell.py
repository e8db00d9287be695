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

from depthnb.config import ModelConfig, to_dict
from depthnb.data import train_tokenizer
from depthnb.downstream_tasks import TASKS_DIR
from depthnb.model import DecoderLM
from depthnb.presets import get_preset
from depthnb.runs import run_lock, save_checkpoint, save_weights, sha256_file, write_or_check_config

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


def one_line(done: subprocess.CompletedProcess, prog: str = "python -m depthnb.lm_eval") -> str:
    "The one line a bad input gets: exit status 2, no traceback, the line on stderr."
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr and done.stderr.strip().count("\n") == 0, done.stderr[-3000:]
    assert done.stderr.startswith(f"{prog}: error: "), done.stderr
    return done.stderr.strip()


BAD_YAML = "task: bad_task\ndataset_path: foo\n  output_type: [generate_until\n"
FIELD = 'task: field_task\ntest_split: test\ndoc_to_text: "{{question}}"\noutput_type: {}\n'


@pytest.mark.slow
@pytest.mark.parametrize("case", ["unknown task", "include path", "yaml syntax", "field value", "unknown field",
                                  "missing run", "downstream unknown task"])
def test_bad_lm_eval_input_is_one_line(case, tmp_path):
    (tmp_path / "tasks").mkdir()
    lm_eval = "python -m depthnb.lm_eval --model dummy --device cpu"
    if case == "unknown task":
        line = one_line(shell(f"{lm_eval} --tasks svampp", tmp_path))
        assert "unknown task 'svampp' (closest: depthnb_svamp" in line
    elif case == "include path":
        line = one_line(shell(f"{lm_eval} --tasks depthnb_svamp --include_path nowhere", tmp_path))
        assert line.endswith("--include_path nowhere: no such folder")
    elif case == "yaml syntax":
        (tmp_path / "tasks" / "bad_task.yaml").write_text(BAD_YAML)
        line = one_line(shell(f"{lm_eval} --tasks bad_task --include_path tasks", tmp_path))
        assert "tasks/bad_task.yaml:3: YAML syntax error: mapping values are not allowed" in line
    elif case == "field value":
        (tmp_path / "tasks" / "field_task.yaml").write_text(FIELD.format("generate"))
        line = one_line(shell(f"{lm_eval} --tasks field_task --include_path tasks", tmp_path))
        assert line.endswith("tasks/field_task.yaml:4: output_type 'generate'; allowed values: loglikelihood, "
                             "multiple_choice, loglikelihood_rolling, generate_until")
    elif case == "unknown field":
        (tmp_path / "tasks" / "field_task.yaml").write_text(FIELD.format("generate_until") + "doc_to_targt: x\n")
        line = one_line(shell(f"{lm_eval} --tasks tasks/field_task.yaml", tmp_path))
        assert "tasks/field_task.yaml:5: unknown field 'doc_to_targt' (did you mean 'doc_to_target'?)" in line
    elif case == "missing run":
        line = one_line(shell("python -m depthnb.lm_eval --model depthnb --model_args pretrained=no/run --tasks depthnb_svamp",
                              tmp_path))
        assert line.endswith("--model_args pretrained=no/run: no such run directory or weights file")
    else:
        line = one_line(shell("depthnb downstream no/run --tasks svampp", tmp_path), "depthnb downstream")
        assert "unknown task or group 'svampp' (closest: svamp)" in line


@pytest.mark.slow
def test_lm_eval_refuses_a_run_in_training_and_scores_a_named_checkpoint(tmp_path):
    torch.manual_seed(0)
    tok = train_tokenizer(get_preset("tiny").pretrain.data, log=None)
    run = tmp_path / "run"
    write_or_check_config(run, dict(kind="pretrain", tokenizer=str(tok.path)))
    model = DecoderLM(ModelConfig(d_model=32, d_attn=32, n_heads=2, d_ff=64, n_layers=2, n_vocab=2048, n_ctx=128))
    save_checkpoint(run, dict(model_config=to_dict(model.cfg), model=model.state_dict(), step=6))
    command = "python -m depthnb.lm_eval --model depthnb --model_args pretrained=run{} --tasks depthnb_svamp --limit 2 --output_path out"
    with run_lock(run):  # a trainer's lock, held by a live process (this one)
        line = one_line(shell(command.format(""), tmp_path))
        assert "--model_args pretrained=run: run is in use by process" in line and "name a checkpoint (a step: 6;" in line
        done = shell(command.format(",step=6"), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    config = results(tmp_path / "out")["config"]
    assert config["depthnb_step"] == 6 and config["depthnb_weights"].endswith("checkpoints/step_00000006.pt")
    assert config["depthnb_weights_sha256"] == sha256_file(run / "checkpoints" / "step_00000006.pt")


@pytest.mark.slow
def test_depthnbs_tasks_never_shadow_lm_evals(caplog):
    # lm-eval's index with and without depthnb's folder: no name in common, so no override WARNING, and lm-eval's
    # gsm8k stays lm-eval's, beside depthnb's own depthnb_gsm8k
    from lm_eval.tasks import TaskManager
    import lm_eval
    ours = {p.stem for p in TASKS_DIR.glob("*.yaml")}
    assert ours and not ours & set(TaskManager().all_tasks)
    with caplog.at_level("WARNING"):
        index = TaskManager(include_path=str(TASKS_DIR)).task_index
    assert not [r for r in caplog.records if "overrides" in r.getMessage()]
    assert Path(index["gsm8k"].yaml_path).is_relative_to(Path(lm_eval.__file__).parent / "tasks")
    assert index["depthnb_gsm8k"].yaml_path == TASKS_DIR / "depthnb_gsm8k.yaml"


def results(folder: Path) -> dict:
    return json.loads(next(folder.rglob("results_*.json")).read_text())


def test_include_path_is_the_shipped_task_folder(tmp_path):
    done = shell("depthnb downstream --include-path", tmp_path)
    assert done.returncode == 0 and Path(done.stdout.strip()) == TASKS_DIR
    assert (TASKS_DIR / "depthnb_svamp.yaml").exists() and (TASKS_DIR / "primitive_copy_random.yaml").exists()


@pytest.mark.slow
def test_documented_lm_eval_command(run_dir, tmp_path):
    # the command of nbs/guides/02_beyond.ipynb and nbs/07c_lm_eval.ipynb, word for word (RUN_DIR a tiny run), plus --output_path
    command = ('python -m depthnb.lm_eval --model depthnb --model_args pretrained=$RUN_DIR '
               '--include_path "$(depthnb downstream --include-path)" --tasks depthnb_svamp --limit 8')
    done = shell(command + " --output_path out", tmp_path, RUN_DIR=str(run_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    res = results(tmp_path / "out")
    assert res["n-samples"]["depthnb_svamp"]["effective"] == 8 and "exact_match,strict-match" in res["results"]["depthnb_svamp"]
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
               '--tasks primitive_copy_random,primitive_psm,depthnb_svamp --limit 4 --batch_size 4 --output_path out')
    done = shell(command, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    res = results(tmp_path / "out")
    assert {t: res["n-samples"][t]["effective"] for t in res["n-samples"]} == \
        {"primitive_copy_random": 4, "primitive_psm": 4, "depthnb_svamp": 4}
    assert set(res["results"]["primitive_psm"]) >= {"accuracy,none", "accuracy_calculator,none"}
    assert res["config"]["model"] == "hf"
