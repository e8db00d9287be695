"""Downstream evaluation: the lm-eval model class against direct computation and DecoderLM.generate, batch-size
invariance, the calculator (correct, malformed, nested, zero-division; inside decoding), the mirror's tasks through
lm-eval offline, the one-line report of online-only tasks, the command's resumable JSON per task, lm-eval kept quiet,
GSM8k fine-tuning within the context and its results' place, and the verdicts of the downstream claims."""
import contextlib
import importlib.util
import io
import json
import math

import pandas as pd
import pytest
import torch
from lm_eval.api.instance import Instance

from depthnb.config import ModelConfig
from depthnb.presets import get_preset
from depthnb.data import train_tokenizer
from depthnb.downstream import (DepthnbLM, apply_calculator, calculator_edit, calculator_step, continuation_ids,
                                continuation_text, safe_eval, CalculatorError)
from depthnb.cmd_downstream import cli_downstream
from depthnb.downstream_data import fits_context, gsm8k_finetune_data
from depthnb.downstream_scoring import (evaluate_config, evaluate_downstream_task, gsm8k_finetune_dir, result_path,
                                        score_run)
from depthnb.downstream_tasks import DOWNSTREAM_TASKS, GROUPS, lm_eval_config, primitive_config, task_unavailable
from depthnb.inference import generate_many
from depthnb.model import DecoderLM
from depthnb.config import to_dict
from depthnb.runs import run_lock, save_checkpoint, save_weights, sha256_file, write_or_check_config
from depthnb.downstream_tables import DOWNSTREAM_CLAIMS, downstream_verdicts


@pytest.fixture(scope="module")
def tok():
    torch.set_num_threads(1)
    return train_tokenizer(get_preset("tiny").pretrain.data, log=None)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return DecoderLM(ModelConfig(d_model=32, d_attn=32, n_heads=2, d_ff=64, n_layers=2, n_vocab=2048, n_ctx=64)).eval()


def req(kind, *args):
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


PAIRS = [("The capital of France is", " Paris"), ("", "Hello"), ("Q: 2+2? ", "A: 4"), ("x " * 80, "the end")]


def test_loglikelihood_is_sum_of_token_logprobs(model, tok):
    lm = DepthnbLM(model=model, tokenizer=tok, bf16=False)
    for (c, x), (lp, greedy) in zip(PAIRS, lm.loglikelihood([req("loglikelihood", c, x) for c, x in PAIRS])):
        ctx, cont = lm._encode_pair(c, x)
        ids = (ctx + cont)[-(model.cfg.n_ctx + 1):]  # left-truncated to the context
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids[:-1]]))[0].float(), -1)[0]
        pos = range(len(ids) - 1 - len(cont), len(ids) - 1)
        direct = sum(logp[p, t].item() for p, t in zip(pos, cont))
        assert lp == pytest.approx(direct, abs=1e-4)
        assert greedy == all(logp[p].argmax().item() == t for p, t in zip(pos, cont))


def test_batch_size_changes_nothing(model, tok):
    reqs = [req("loglikelihood", c, x) for c, x in PAIRS]
    gens = [req("generate_until", c or "A", {"until": ["\n\n"], "max_gen_toks": 10}) for c, _ in PAIRS]
    ref_ll = DepthnbLM(model=model, tokenizer=tok, batch_size=1, bf16=False).loglikelihood(reqs)
    ref_gen = DepthnbLM(model=model, tokenizer=tok, batch_size=1, bf16=False).generate_until(gens)
    for bs in (2, 3, 8):
        lm = DepthnbLM(model=model, tokenizer=tok, batch_size=bs, bf16=False)
        for (a, ga), (b, gb) in zip(ref_ll, lm.loglikelihood(reqs)):
            assert a == pytest.approx(b, abs=1e-4) and ga == gb
        assert lm.generate_until(gens) == ref_gen


def test_greedy_equals_decoderlm_generate(model, tok):
    prompts = ["The history of", "In 1990, the", "A long time ago in a"]
    lm = DepthnbLM(model=model, tokenizer=tok, batch_size=2, bf16=False)
    got = lm.generate_until([req("generate_until", p, {"until": [], "max_gen_toks": 16}) for p in prompts])
    ref = generate_many(model, [tok.encode(p) for p in prompts], 16, tok.pad_id, tok.eos_id)
    assert got == [continuation_text(tok, r) for r in ref]


def test_rolling_covers_every_token_once(model, tok):
    lm = DepthnbLM(model=model, tokenizer=tok, bf16=False)
    text = "word " * 150  # several windows of 64 tokens
    ids = tok.encode(text)
    with torch.no_grad():  # each token's log-prob under its window, straight from lm-eval's window arithmetic
        total = 0.0
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
        for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(ids, tok.eos_id, 64, 1)):
            total += lm.score_tokens([(ctx, cont)])[0][0]
    assert lm.loglikelihood_rolling([req("loglikelihood_rolling", text)])[0] == pytest.approx(total, abs=1e-3)


@pytest.mark.parametrize("text,expected", [
    ("sold 48/2 = <<48/2=", "sold 48/2 = <<48/2=24>>"),  # correct
    ("<<((2+3)*(4-1))/2=", "<<((2+3)*(4-1))/2=7.5>>"),  # nested parentheses
    ("<<a <<3*4=", "<<a <<3*4=12>>"),  # nested openings: the last one
    ("<<12*5=6", "<<12*5=60>>"),  # the model's own digits replaced
    ("<<2+*3=", "<<2+*3="),  # malformed: unchanged
    ("<<(2+3=", "<<(2+3="),  # unbalanced
    ("<<eggs*2=", "<<eggs*2="),  # a name is not arithmetic
    ("<<5/(2-2)=", "<<5/(2-2)="),  # division by zero
    ("<<48/2=24>> and", "<<48/2=24>> and"),  # closed already
])
def test_calculator_on_handwritten_continuations(text, expected):
    assert apply_calculator(text) == expected


def test_safe_eval_refuses_code():
    for bad in ["__import__('os').system('true')", "(lambda: 1)()", "open('x')", "9**99", "[1][0]"]:
        with pytest.raises(CalculatorError):
            safe_eval(bad)
    with pytest.raises(CalculatorError, match="division by zero"):
        safe_eval("1/0")


def test_calculator_inside_decoding(model, tok):
    gen = {"until": ["\n\n"], "max_gen_toks": 8}
    on = DepthnbLM(model=model, tokenizer=tok, calculator=True, bf16=False)
    off = DepthnbLM(model=model, tokenizer=tok, calculator=False, bf16=False)
    ctx = "He has 3*(4+1) = <<3*(4+1)="
    assert on.generate_until([req("generate_until", ctx, gen)])[0].startswith("15>>")
    assert not off.generate_until([req("generate_until", ctx, gen)])[0].startswith("15>>")
    # a refused expression leaves the model's own continuation
    bad = "He has <<3/0="
    assert on.generate_until([req("generate_until", bad, gen)]) == off.generate_until([req("generate_until", bad, gen)])
    assert calculator_edit(bad) is None


class Scripted(torch.nn.Module):
    "A model that writes `script` after `prompt` (then EOS), recording every sequence it is asked to continue."

    def __init__(self, model, prompt, script, eos):
        super().__init__()
        self.layers, self.cfg, self.embed = model.layers, model.cfg, model.embed
        self.prompt, self.script, self.eos, self.inputs = prompt, script, eos, []

    def _next(self, seq):
        own = seq[len(self.prompt):]
        follows = seq[:len(self.prompt)] == self.prompt and own == self.script[:len(own)]
        return self.script[len(own)] if follows and len(own) < len(self.script) else self.eos  # off script: EOS

    def forward(self, idx, attention_mask=None, cache=None):
        if idx.shape[1] > 1 or not self.inputs:  # a prompt: a new round
            self.inputs.append(idx[0][attention_mask[0].bool()].tolist() if attention_mask is not None else idx[0].tolist())
        else:
            self.inputs[-1].append(int(idx[0, 0]))
        logits = torch.zeros(1, idx.shape[1], self.cfg.n_vocab)
        logits[0, -1, self._next(self.inputs[-1])] = 1.0
        return logits, None


def test_calculator_continues_from_the_models_own_tokens(model, tok):
    context = "Question: He runs 3 laps of 4 km.\nAnswer:"
    prompt = tok.encode(context)
    own = continuation_ids(tok, " He runs <<3*4=")  # '▁He' first: re-encoding 'Answer:He' would give ':', 'H', 'e'
    inserted = continuation_ids(tok, "12>>")
    scripted = Scripted(model, prompt, own + continuation_ids(tok, "7 km"), tok.eos_id)
    lm = DepthnbLM(model=scripted, tokenizer=tok, calculator=True, bf16=False)
    out = lm.generate_until([req("generate_until", context, {"until": ["\n\n"], "max_gen_toks": 40})])[0]
    assert out == " He runs <<3*4=12>>"
    assert len(scripted.inputs) == 2  # a round up to the '=', then one after the insertion
    assert scripted.inputs[0] == prompt + own[:-1]  # its tokens fed back in its first round ('=' ended the round)
    assert scripted.inputs[1] == prompt + own + inserted  # the next round: exactly its tokens and the result's
    assert tok.sp.id_to_piece(scripted.inputs[1][len(prompt)]) == "\u2581He"
    # without the calculator the model's own wrong digit stands
    scripted.inputs.clear()
    plain = DepthnbLM(model=scripted, tokenizer=tok, calculator=False, bf16=False)
    assert plain.generate_until([req("generate_until", context, {"until": ["\n\n"], "max_gen_toks": 40})])[0] \
        == " He runs <<3*4=7 km"


def test_calculator_step_keeps_tokens_up_to_the_equals_sign(tok):
    ctx = "Answer:"
    own = continuation_ids(tok, " <<48/2=") + continuation_ids(tok, "25>> clips")
    assert calculator_step(tok, ctx, own) is None  # closed by the model itself: nothing to do
    own = continuation_ids(tok, " <<48/2=") + continuation_ids(tok, "2")
    assert calculator_step(tok, ctx, own) == continuation_ids(tok, " <<48/2=") + continuation_ids(tok, "24>>")
    for text in ("24>>", " x", "  two spaces", "é>>", "=1"):
        assert continuation_text(tok, continuation_ids(tok, text)) == text


REGISTRY_CHECK = """
import importlib, pkgutil, sys, depthnb
names = [m.name for m in pkgutil.iter_modules(depthnb.__path__)] if sys.argv[1] == "all" else [sys.argv[1]]
for name in names:  # imported before any lookup
    importlib.import_module(f"depthnb.{name}")
from lm_eval.api.registry import get_model, model_registry
dummy = get_model("dummy")  # before importing lm_eval.models, which would fill the registry itself
from lm_eval.models.dummy import DummyLM
from depthnb.downstream import DepthnbLM
assert dummy is DummyLM and get_model("depthnb") is DepthnbLM
assert {"hf", "vllm", "openai-completions"} <= set(model_registry.keys())
try:
    import accelerate, transformers  # lm-eval's hf model needs both (the hf extra)
except ImportError:
    print("ok without hf")
else:
    from lm_eval.models.huggingface import HFLM
    assert get_model("hf") is HFLM
    print("ok")
"""


@pytest.mark.parametrize("first", ["downstream", "all"])
def test_registering_depthnb_keeps_lm_evals_models(first):
    # a fresh interpreter: lm-eval loads its own models only while its registry is empty, once per process
    import subprocess, sys
    done = subprocess.run([sys.executable, "-c", REGISTRY_CHECK, first], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().startswith("ok"), done.stderr[-2000:]


def test_task_registry_covers_the_paper():
    assert len(GROUPS["closed_book_qa"]) == 4 and len(GROUPS["open_book_qa"]) == 5 and len(GROUPS["math"]) == 6
    assert lm_eval_config("gsm8k")["num_fewshot"] == 8
    assert all(lm_eval_config(t)["num_fewshot"] == 5 for t in GROUPS["math"])


def test_online_only_task_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    online = ["triviaqa", "tydiqa_goldp", "squadv2", "drop", "tydiqa_nocontext"]
    if importlib.util.find_spec("transformers.data.metrics") is not None:  # CoQA's lm-eval scoring imports it
        online.append("coqa")
    else:
        assert "No module named 'transformers.data.metrics'" in task_unavailable("coqa")
    for name in online:
        why = task_unavailable(name)
        assert why == f"{DOWNSTREAM_TASKS[name].title}: not in the local mirror; needs the internet (HF_HUB_OFFLINE is set)"
    assert "\n" not in task_unavailable("quac")
    assert task_unavailable("nq_open") is None and task_unavailable("gsm8k") is None


def test_mirror_tasks_through_lm_eval_offline(model, tok, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm = DepthnbLM(model=model, tokenizer=tok, bf16=False, calculator=True)
    for name in ("svamp", "gsm8k", "nq_open", "webqs"):
        rec = evaluate_downstream_task(lm, name, limit=2)
        assert rec["n"] == 2 and 0.0 <= rec["accuracy"] <= 1.0, rec


def test_primitives_as_lm_eval_tasks(model, tok):
    lm = DepthnbLM(model=model, tokenizer=tok, bf16=False)
    metrics, n, _ = evaluate_config(lm, primitive_config("psm", n=8), limit=4)
    assert n == 4 and set(metrics) == {"accuracy,none", "accuracy_calculator,none"}


def test_gsm8k_finetune_data():
    data = gsm8k_finetune_data()
    assert (len(data["train"]), len(data["train_heldout"]), len(data["test"])) == (7273, 200, 1319)
    assert "<<" in data["train"][0]["target"] and "####" in data["train"][0]["target"]


def test_cli_writes_one_json_per_task_and_resumes(model, tok, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = tmp_path / "run"
    write_or_check_config(run, dict(kind="pretrain", tokenizer=str(tok.path)))
    save_weights(run / "final.pt", model, step=0)
    argv = [str(run), "--tasks", "svamp,triviaqa", "--limit", "2", "--calculator", "both", "--device", "cpu"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_downstream(argv) == 0
    assert "TriviaQA: not in the local mirror; needs the internet" in out.getvalue()
    files = sorted(p.name for p in (run / "downstream" / "final").glob("*.json"))
    assert files == ["svamp.5shot.calc.limit2.json", "svamp.5shot.nocalc.limit2.json"]
    assert json.loads(result_path(run, "svamp", 5, True, 2).read_text())["calculator"] is True
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_downstream(argv) == 0
    assert out.getvalue().count("scored already") == 2


def test_scores_belong_to_weights_busy_then_finished(model, tok, tmp_path, monkeypatch):
    # a run in training (its lock held, two checkpoints, no final.pt) is refused unless a step is named; a named
    # checkpoint is filed under its step; the finished run then gets its own final score, and a final.pt written
    # again (other weights) is scored again: every record names its step and the weights' checksum
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = tmp_path / "run"
    write_or_check_config(run, dict(kind="pretrain", tokenizer=str(tok.path)))
    for step in (4, 8):
        save_checkpoint(run, dict(model_config=to_dict(model.cfg), model=model.state_dict(), step=step))

    def cli(*extra):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_downstream([str(run), "--tasks", "svamp", "--limit", "2", "--calculator", "off", "--device", "cpu",
                                   *extra])
        return code, out.getvalue(), err.getvalue()

    def record(step=None):
        return json.loads(result_path(run, "svamp", 5, False, 2, step).read_text())

    with run_lock(run):  # the trainer's lock, held by a live process
        code, _, err = cli()
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "is in use by process" in err and "a step: 4, 8" in err
        assert not (run / "downstream").exists()
        code, _, err = cli("--step", "8")
        assert code == 0, err
    at8 = record(8)
    assert result_path(run, "svamp", 5, False, 2, 8).parent.name == "step_00000008"
    assert (at8["step"], at8["weights_sha256"]) == (8, sha256_file(run / "checkpoints" / "step_00000008.pt"))
    finished = DecoderLM(model.cfg)
    save_weights(run / "final.pt", finished, step=12)
    code, out, _ = cli()  # finished: its own final score, not the checkpoint's
    assert code == 0 and "scored already" not in out
    final = record()
    assert result_path(run, "svamp", 5, False, 2).parent.name == "final"
    assert (final["step"], final["weights_sha256"]) == (12, sha256_file(run / "final.pt")) != (8, at8["weights_sha256"])
    assert cli()[1].count("scored already (step 12)") == 1
    save_weights(run / "final.pt", DecoderLM(model.cfg), step=12)  # written again: other weights, the same name
    code, out, _ = cli()
    assert code == 0 and "filed for other weights (step 12)" in out
    assert record()["weights_sha256"] == sha256_file(run / "final.pt") != final["weights_sha256"]


def test_cli_bad_arguments_are_one_line():
    for argv, msg in ((["--tasks", "mathh"], "unknown task or group 'mathh' (closest: math)"), (["--limit", "0", "x"], "--limit 0"),
                      (["no/such/run", "--tasks", "svamp"], "no such run directory")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert cli_downstream(argv) == 2
        assert msg in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1


def test_lm_eval_is_quiet_by_default(model, tok, capfd, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm = DepthnbLM(model=model, tokenizer=tok, bf16=False)
    assert evaluate_downstream_task(lm, "svamp", limit=2)["n"] == 2
    err = capfd.readouterr().err
    assert "Custom kwargs" not in err and "it/s" not in err, err


def test_gsm8k_finetuning_leaves_out_what_does_not_fit(tok):
    logs = []
    data = gsm8k_finetune_data(tok, 128, log=logs.append)
    for split in ("train", "train_heldout"):
        assert 0 < len(data[split]) and all(fits_context(data[split], tok, 128))
    assert len(data["test"]) == 1319  # the benchmark stays whole
    assert logs == [f"GSM8k fine-tuning: {7273 - len(data['train'])} of 7273 train problems and "
                    f"{200 - len(data['train_heldout'])} of 200 train_heldout problems are longer than n_ctx=128 tokens "
                    "and left out"]
    with pytest.raises(ValueError, match="no training problem fits in n_ctx=8"):
        gsm8k_finetune_data(tok, 8, log=logs.append)


def test_a_context_too_short_for_gsm8k_is_a_result_with_its_reason(model, tok, tmp_path):
    run = tmp_path / "run"
    write_or_check_config(run, dict(kind="pretrain", tokenizer=str(tok.path)))
    save_weights(run / "final.pt", model, step=0)  # n_ctx=64: no GSM8k problem and its solution fit
    logs = []
    records = score_run(run, ["gsm8k_finetuned"], device="cpu", log=logs.append)
    assert [r["calculator"] for r in records] == [False, True]
    for r in records:
        assert r["n"] == 0 and math.isnan(r["accuracy"])
        assert r["missing"].startswith("GSM8k (fine-tuned): GSM8k fine-tuning: no training problem fits in n_ctx=64")
    assert not gsm8k_finetune_dir(run).exists()
    again = score_run(run, ["gsm8k_finetuned"], device="cpu", log=logs.append)  # read back, not recomputed
    assert [r["missing"] for r in again] == [r["missing"] for r in records] and logs[-1].endswith("scored already (step 0)")


def test_finetuned_gsm8k_results_sit_beside_the_others(tmp_path):
    run = tmp_path / "run"
    (run / "stage1").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "final.pt").write_bytes(b"")  # only the names matter here
    assert gsm8k_finetune_dir(run) == run / "downstream" / "final" / "gsm8k_finetune"
    assert result_path(run, "gsm8k_finetuned", 0, True, None) == run / "downstream" / "final" / "gsm8k_finetuned.0shot.calc.json"
    snap = run / "stage1" / "step_00000016.pt"
    snap.write_bytes(b"")
    assert result_path(snap, "svamp", 5, False, 8).parent == run / "downstream" / "step_00000016"


def _rows(method, tasks, acc, calc=False, n=400, missing=None, seed=0):
    return [dict(method=method, seed=seed, task=t, title=DOWNSTREAM_TASKS[t].title, group=DOWNSTREAM_TASKS[t].group,
                 calculator=calc, n=0 if missing else n, accuracy=float("nan") if missing else acc,
                 missing=f"{DOWNSTREAM_TASKS[t].title}: {missing}" if missing else None, val_loss=2.0) for t in tasks]


def test_downstream_verdicts():
    offline = "not in the local mirror; needs the internet"
    floor = pd.DataFrame([r for m in ("baseline", "midas") for r in
                          _rows(m, GROUPS["math"], 0.0, True, n=8) + _rows(m, GROUPS["math"], 0.0, False, n=8)
                          + _rows(m, GROUPS["open_book_qa"], 0, missing=offline)
                          + _rows(m, ["tydiqa_nocontext"], 0, missing=offline)])
    v = downstream_verdicts(floor).set_index("where")
    assert v.loc["§4.3, Tables 1, 5", "verdict"] == "not testable"
    assert "0 of 8 examples" in v.loc["§4.3, Tables 1, 5", "evidence"] and "below 31%" in v.loc["§4.3, Tables 1, 5", "evidence"]
    assert v.loc["§3, Tables 1, 4", "verdict"] == v.loc["§4.2, Fig. 3", "verdict"] == "not reproducible here"
    assert f"TyDi QA (GoldP), TyDi QA (no context): {offline}" in v.loc["§4.2, Fig. 3", "evidence"]
    ahead = pd.DataFrame([r for seed, j in enumerate((0.0, 0.01, -0.01)) for r in  # three stacking seeds per method
                          _rows("baseline", GROUPS["math"], 0.20 + j, True, seed=seed)
                          + _rows("midas", GROUPS["math"], 0.30 - j / 2, True, seed=seed)
                          + _rows("baseline", ["gsm8k_finetuned"], 0.10 + j, True, seed=seed)
                          + _rows("midas", ["gsm8k_finetuned"], 0.05 + j / 2, True, seed=seed)
                          + _rows("baseline", ["gsm8k_finetuned"], 0.10 + j, seed=seed)
                          + _rows("midas", ["gsm8k_finetuned"], 0.11 - j, seed=seed)])
    v = downstream_verdicts(ahead).set_index("claim").verdict
    assert v[DOWNSTREAM_CLAIMS[1][1]] == "holds"  # math: +10 points on every seed
    assert v[DOWNSTREAM_CLAIMS[6][1]] == "mixed"  # fine-tuned: behind with the calculator, level without
    assert v[DOWNSTREAM_CLAIMS[5][1]] == "not testable"  # no calculator-off rows: the calculator's effect unmeasured
    one = downstream_verdicts(ahead[ahead.seed == 0]).set_index("claim").verdict  # the same gaps from one run each
    assert one[DOWNSTREAM_CLAIMS[1][1]] == one[DOWNSTREAM_CLAIMS[6][1]] == "not testable"


def test_prompts_cut_to_fit_the_context_are_counted(model, tok, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm = DepthnbLM(model=model, tokenizer=tok, bf16=False)  # n_ctx 64: an 8-shot GSM8k prompt never fits
    rec = evaluate_downstream_task(lm, "gsm8k", limit=3)
    assert rec["truncated"] == 3 and lm.truncated == {"loglikelihood": 0, "generate_until": 3}
    short = evaluate_downstream_task(lm, "gsm8k", shots=0, limit=3)  # 0-shot: cut only where question + 32-token budget > 64
    fits = sum(len(tok.encode(f"Question: {q}\nAnswer:")) + 32 <= 64 for q in short_questions(3))
    assert short["truncated"] == 3 - fits


def short_questions(n):
    from depthnb.downstream_data import load_gsm8k
    return [d["question"] for d in load_gsm8k()["test"][:n]]
