"""A depthnb run scored by other tools: the run's SentencePiece tokenizer as a transformers tokenizer (depthnb's ids
and text for every input), a run's model exported with it as a `save_pretrained` folder, and that folder scored by
lm-eval's own `hf` model — from the shell with the command of nbs/04_training/10_hf_midas.ipynb — with the answers and
log-likelihoods the run's own weights and tokenizer give."""
import pytest

pytest.importorskip("transformers")

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, LlamaConfig, Qwen2Config  # noqa: E402

from depthnb.data import train_texts, train_tokenizer  # noqa: E402
from depthnb.hf import HFCausalLM, build_hf, hf_config_with, load_hf_model, save_hf_config  # noqa: E402
from depthnb.hf_export import export_hf, hf_tokenizer  # noqa: E402
from depthnb.presets import get_preset  # noqa: E402
from depthnb.primitives import PRIMITIVE_TASKS, few_shot, holdout_set  # noqa: E402
from depthnb.runs import save_weights  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _stack_script import STACK_STEPS  # noqa: E402
from _train_common import N_CTX, TEST_DATA, small_config, small_data  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the environment's console scripts: depthnb, lm_eval
DATA = {"test": TEST_DATA, "tiny": get_preset("tiny").pretrain.data}  # vocabularies of 512 and 2048 pieces
# Whitespace SentencePiece keeps as it is, user-defined pieces, characters outside the vocabulary (byte fallback)
TRICKY = ["", " ", "  ", "trailing ", " leading", "two  spaces", "new\nline\n\n x", "\t tab", "a\r\nb", "<sep>",
          "<sep> a<sep>b  <sep>", "ümlaut 日本語 🙂", "123+456=579", "x = 3;\n  y = x * 2", "▁ already ▁marked"]
# Names of pieces SentencePiece never matches in text, spelt out: exact where the vocabulary has their characters
SPELT_OUT = ["a</s>b", "</s>", "<pad> <unk>", "<0x41>", "x <0x0A> y"]


@pytest.fixture(scope="module", params=list(DATA))
def tokenizers(request, tmp_path_factory):
    "(depthnb's tokenizer, its transformers tokenizer saved and loaded back by AutoTokenizer, the data config's name)."
    sp = train_tokenizer(DATA[request.param], log=None)
    folder = tmp_path_factory.mktemp("tok")
    hf_tokenizer(sp, n_ctx=N_CTX).save_pretrained(folder)
    return sp, AutoTokenizer.from_pretrained(folder), request.param


def texts_of(data_name: str) -> list[str]:
    "Corpus documents and their lines, every primitive's few-shot prompts with answers, the tricky strings."
    docs = list(train_texts(DATA[data_name], limit=60, log=None))
    prompts = [e["prompt"] + e["target"] for name in PRIMITIVE_TASKS for e in few_shot(holdout_set(name, 6, 0), k=5)]
    return docs + [line for d in docs for line in d.split("\n")] + prompts + TRICKY


@pytest.mark.data
def test_tokenizer_encodes_and_decodes_as_depthnbs(tokenizers):
    sp, tok, name = tokenizers
    texts = texts_of(name) + (SPELT_OUT if name == "tiny" else [])
    wrong = [t for t in texts if tok.encode(t) != sp.encode(t)]
    assert not wrong, [(t[:80], tok.encode(t)[:20], sp.encode(t)[:20]) for t in wrong[:3]]
    assert all(tok.decode(sp.encode(t)) == sp.decode(sp.encode(t)) for t in texts)
    # ids no text encodes to, pad, EOS and ASCII bytes among them (the newline is a byte piece): decoded as
    # SentencePiece decodes them, a stop sequence where it finds one; all but the two corners the notebook names
    # (non-ASCII byte runs that are not UTF-8, the unknown piece)
    rng = np.random.default_rng(0)
    corners = {sp.unk_id} | {i for i in range(sp.vocab_size)
                             if sp.sp.is_byte(i) and int(sp.sp.id_to_piece(i)[3:5], 16) >= 0x80}
    assert sp.sp.piece_to_id("<0x0A>") in sp.encode("a:\nb") and tok.decode(sp.encode("a:\n\nb")) == "a:\n\nb"
    for _ in range(300):
        ids = [i for i in rng.integers(0, sp.vocab_size, int(rng.integers(1, 40))).tolist() if i not in corners]
        assert tok.decode(ids, skip_special_tokens=True) == sp.decode(ids), ids
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id, tok.bos_token_id) == (0, 1, 2, None)
    assert len(tok) == sp.vocab_size and tok.model_max_length == N_CTX
    assert tok("two words")["input_ids"] == sp.encode("two words")  # no BOS or EOS added


@pytest.mark.data
def test_tokenizer_of_a_file_and_bad_input(tmp_path):
    sp = train_tokenizer(TEST_DATA, log=None)
    assert hf_tokenizer(sp.path).encode("the file's") == sp.encode("the file's")
    with pytest.raises(TypeError, match="int is not a SentencePiece model"):
        hf_tokenizer(3)


HF_CONFIGS = {
    "llama": lambda v: LlamaConfig(vocab_size=v, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=2, max_position_embeddings=64),
    "qwen2": lambda v: Qwen2Config(vocab_size=v, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64),
    "gpt2": lambda v: GPT2Config(vocab_size=v, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=0,
                                 eos_token_id=0, pad_token_id=5),
}


def hand_run(folder: Path, config, seed: int = 0) -> HFCausalLM:
    "A run directory of a randomly initialised transformers model, as depthnb's trainer writes it (hf_config.json, final.pt)."
    torch.manual_seed(seed)
    model = HFCausalLM(build_hf(config), n_ctx=N_CTX).eval()
    save_hf_config(folder, model.hf.config)
    save_weights(folder / "final.pt", model, step=7)
    return model


@pytest.mark.data
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_export_writes_a_folder_transformers_loads(arch, tmp_path):
    sp = train_tokenizer(TEST_DATA, log=None)
    model = hand_run(tmp_path / "run", HF_CONFIGS[arch](sp.vocab_size))
    out = export_hf(tmp_path / "run" / "final.pt", tmp_path / "out", sp)
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= \
        {p.name for p in out.iterdir()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    back, tok = AutoModelForCausalLM.from_pretrained(out).eval(), AutoTokenizer.from_pretrained(out)
    assert type(back) is type(model.hf) and back.config.num_hidden_layers == 2
    ids = torch.tensor([sp.encode("The exported model reads depthnb's tokens.")])
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).logits, model(ids)[0])
    ids_of = {k: getattr(back.config, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    assert ids_of == {"bos_token_id": None, "eos_token_id": 1, "pad_token_id": 0}
    assert (back.generation_config.eos_token_id, back.generation_config.pad_token_id) == (1, 0)
    assert model.hf.config.pad_token_id == (5 if arch == "gpt2" else None)  # the run's own config is left alone
    assert tok.encode("depthnb's ids") == sp.encode("depthnb's ids")


@pytest.mark.data
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_export_hf_command_round_trips(arch, tmp_path, capsys):
    # `depthnb export-hf RUN OUT`: AutoModelForCausalLM loads the same model; AutoTokenizer reads depthnb's tokens with
    # and without trust_remote_code (transformers would give Qwen2 its own tokenizer class, reading other tokens);
    # README.md says what the run is; a second export into the folder is one line, exit 2
    from depthnb.cli.export_hf import cli_export_hf
    from depthnb.runs import MetricsLog, write_or_check_config
    sp = train_tokenizer(TEST_DATA, log=None)
    run = tmp_path / "runs" / "test" / "stack" / arch
    write_or_check_config(run, dict(kind="stack", tokenizer=str(sp.path), config=dict(steps=7, data=dict(corpus="enwiki")),
                                    stack=dict(method="midas", block_size=1)))
    model = hand_run(run, HF_CONFIGS[arch](sp.vocab_size))
    MetricsLog(run, tensorboard=False).write(kind="eval", step=7, split="enwiki_valid", loss=6.0)
    assert cli_export_hf([str(run), str(tmp_path / "out")]) == 0
    out = Path(capsys.readouterr().out.strip())
    back = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(back) is type(model.hf)
    ids = torch.tensor([sp.encode("The exported model reads depthnb's tokens.")])
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).logits, model(ids)[0])
    for trust in (False, True):
        tok = AutoTokenizer.from_pretrained(out, trust_remote_code=trust)
        assert [tok.encode(t) for t in TRICKY] == [sp.encode(t) for t in TRICKY], trust
    card = (out / "README.md").read_text()
    for line in ("| preset | test |", "| method | midas (block size 1) |", "| steps | 7 (these weights: step 7, `final.pt`) |",
                 "| validation loss | enwiki_valid 6.0000 (step 7) |"):
        assert line in card, (line, card)
    assert (out / "tokenization_depthnb.py").exists() == (arch == "qwen2")  # only where transformers needs telling
    capsys.readouterr()  # what loading printed
    assert cli_export_hf([str(run), str(out)]) == 2
    assert capsys.readouterr().err.strip() == f"depthnb export-hf: error: {out} exists and is not empty; --overwrite replaces it"


@pytest.mark.data
def test_export_refuses_what_it_cannot_write(tmp_path):
    sp = train_tokenizer(TEST_DATA, log=None)
    hand_run(tmp_path / "run", HF_CONFIGS["llama"](sp.vocab_size))
    out = export_hf(tmp_path / "run", tmp_path / "out", sp)
    with pytest.raises(FileExistsError, match="exists and is not empty"):
        export_hf(tmp_path / "run", out, sp)
    hand_run(tmp_path / "other", HF_CONFIGS["llama"](sp.vocab_size), seed=1)
    assert export_hf(tmp_path / "other", out, sp, overwrite=True) == out
    with torch.no_grad():
        ids = torch.tensor([[5, 6, 7]])
        assert torch.equal(AutoModelForCausalLM.from_pretrained(out)(input_ids=ids).logits,
                           load_hf_model(tmp_path / "other")(ids)[0])
    hand_run(tmp_path / "small", HF_CONFIGS["llama"](100))
    with pytest.raises(ValueError, match="100 token embeddings, the tokenizer 512 tokens: not the tokenizer of this run"):
        export_hf(tmp_path / "small", tmp_path / "small-out", sp)
    assert not (tmp_path / "small-out").exists()
    with pytest.raises(FileNotFoundError, match="not a transformers model's run"):
        export_hf(tmp_path / "nowhere", tmp_path / "x", sp)


# --- a MIDAS run of a tiny Llama scored by lm-eval's hf model -------------------------------------------------------
# The positions lm-eval's hf model reads as the model's context: room for SVAMP's prompt and the command's budget.
MAX_POSITIONS = 128
HF_LLAMA = LlamaConfig(vocab_size=10, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                       max_position_embeddings=MAX_POSITIONS)
TASKS = ("primitive_copy_random", "depthnb_svamp")


def documented_command() -> str:
    "The lm-eval command shown in nbs/04_training/10_hf_midas.ipynb (its `%%bash` cell), as a shell runs it."
    nb = json.loads((ROOT / "nbs" / "04_training/10_hf_midas.ipynb").read_text())
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    (cell,) = [c for c in cells if c.startswith("%%bash") and "lm_eval --model hf" in c]
    return "\n".join(line for line in cell.splitlines() if not line.startswith(("%%", "#|")))


@pytest.fixture(scope="module")
def midas_run(tmp_path_factory):
    "A MIDAS run of a 3-layer Llama (30 steps, stages of 1, 2, 3 layers) and its tokenizer."
    from depthnb.config import StackConfig
    from depthnb.evaluation import run_tokenizer
    from depthnb.stacking import stack_train
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("hfexport") / "midas"
    stack_train(small_config(**STACK_STEPS), StackConfig(method="midas", block_size=1), run, data=small_data(),
                progress=False, hf_config=HF_LLAMA)
    return run, run_tokenizer(run)


def greedy_answer(model: HFCausalLM, sp, context: str, gen_kwargs: dict) -> str:
    """The answer lm-eval's generate_until asks for, decoded by hand: the context's last tokens that leave room for the
    budget in the model's positions, greedy steps of a full forward pass (no KV cache) until EOS, the budget or a stop
    sequence, the text cut at the first stop sequence."""
    stops, budget = gen_kwargs["until"], gen_kwargs["max_gen_toks"]
    ids, new = sp.encode(context)[-(MAX_POSITIONS - budget):], []
    with torch.no_grad():
        while len(new) < budget and not any(s in sp.decode(new) for s in stops):
            token = int(model(torch.tensor([ids + new]))[0][0, -1].argmax())
            if token == sp.eos_id:
                break
            new.append(token)
    text = sp.decode(new)
    return text[:min([text.index(s) for s in stops if s in text], default=len(text))]


def check_samples(samples: dict, model: HFCausalLM, sp, limit: int) -> list[str]:
    "Every answer lm-eval's hf model gave (its samples, per task) is the hand-decoded one; the primitive's score is Table 6's."
    from depthnb.downstream_tasks import primitive_results
    one_per_doc = {t: list({s["doc_id"]: s for s in samples[t]}.values()) for t in TASKS}  # a line per filter
    assert {t: len(one_per_doc[t]) for t in TASKS} == {t: limit for t in TASKS}
    answers = []
    for task in TASKS:
        for s in samples[task]:
            args = s["arguments"]
            context, gen_kwargs = (args["gen_args_0"]["arg_0"], args["gen_args_0"]["arg_1"]) if isinstance(args, dict) \
                else args[0]
            assert gen_kwargs["max_gen_toks"] == 64  # the command's budget, in every task
            expected = greedy_answer(model, sp, context, gen_kwargs)
            assert s["resps"] == [[expected]], (task, s["doc_id"], s["resps"], expected)
            if task == "primitive_copy_random":
                assert s["accuracy"] == primitive_results(s["doc"], [expected])["accuracy"]
            answers.append(expected)
    return answers


@pytest.mark.slow
@pytest.mark.data
def test_lm_eval_hf_scores_an_exported_midas_run(midas_run, tmp_path):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from depthnb.downstream import DepthnbLM
    from depthnb.runs import read_metrics
    pytest.importorskip("accelerate")  # lm-eval's hf model imports it
    run, sp = midas_run
    snapshot = run / read_metrics(run, "snapshot").path.iloc[0]  # kept at step 4, in the 1-layer stage
    final = load_hf_model(run)
    shallow = load_hf_model(snapshot)
    assert (final.hf.config.num_hidden_layers, shallow.hf.config.num_hidden_layers) == (3, 1)
    out_final, out_snapshot = export_hf(run, tmp_path / "final", sp), export_hf(snapshot, tmp_path / "snapshot", sp)

    # lm-eval's hf model and depthnb's own lm-eval model: the same log-likelihoods of the same requests (at the run's
    # context, which max_length gives lm-eval), and the same tokens of each prompt
    examples = few_shot(holdout_set("copy_random", 6, 0), k=5) + [dict(prompt="Question: 2 + 3?\nAnswer:", target=" 5")]
    requests = [Instance("loglikelihood", doc={}, arguments=(e["prompt"], e["target"]), idx=i)
                for i, e in enumerate(examples)]
    for folder, model in ((out_final, final), (out_snapshot, shallow)):
        lm = HFLM(pretrained=str(folder), device="cpu", batch_size=3, max_length=N_CTX)
        theirs = lm.loglikelihood(requests, disable_tqdm=True)
        ours = DepthnbLM(model=model, tokenizer=sp, bf16=False, device="cpu").loglikelihood(requests, disable_tqdm=True)
        assert np.allclose([t[0] for t in theirs], [o[0] for o in ours], rtol=0, atol=1e-4), (theirs, ours)
        assert [t[1] for t in theirs] == [o[1] for o in ours]
        assert all(lm.tok_encode(e["prompt"]) == sp.encode(e["prompt"]) for e in examples)

    # the documented command, word for word, on the final model
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               OMP_NUM_THREADS="1", OUT_DIR=str(out_final))
    done = subprocess.run(["bash", "-c", documented_command() + " --log_samples --output_path scored"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(next((tmp_path / "scored").rglob("results_*.json")).read_text())
    assert results["config"]["model"] == "hf" and {t: results["n-samples"][t]["effective"] for t in TASKS} == \
        {t: 8 for t in TASKS}
    samples = {t: [json.loads(line) for f in (tmp_path / "scored").rglob(f"samples_{t}_*.jsonl")
                   for line in f.read_text().splitlines()] for t in TASKS}
    check_samples(samples, final, sp, 8)
    accuracy = np.mean([s["accuracy"] for s in samples["primitive_copy_random"]])
    assert results["results"]["primitive_copy_random"]["accuracy,none"] == pytest.approx(accuracy)

    # the snapshot, through lm-eval's Python entry point and the same hf model
    import lm_eval
    from lm_eval.tasks import TaskManager

    from depthnb.downstream_tasks import TASKS_DIR
    res = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={out_snapshot}", device="cpu", tasks=list(TASKS),
                                  limit=4, gen_kwargs="max_gen_toks=64", log_samples=True,
                                  task_manager=TaskManager(include_path=str(TASKS_DIR)))
    answers = check_samples(res["samples"], shallow, sp, 4)
    # a model trained 30 steps may answer every prompt alike; the barely trained snapshot does not, so that there
    # the check tells answers apart
    assert len(set(answers)) > 2, answers
