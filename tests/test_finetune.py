"""Fine-tuning and evaluation: target-only loss, a short fine-tune on real COGS that beats the untrained
model, cached = uncached decoding, resume after a crash, and the evaluation files."""
import difflib
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from _train_common import TEST_DATA, assert_resumed_like  # noqa: E402

import depthnb.evaluation as evaluation  # noqa: E402
import depthnb.finetune as ft  # noqa: E402
from depthnb.config import FinetuneConfig, ModelConfig  # noqa: E402
from depthnb.model import DecoderLM  # noqa: E402
from depthnb.runs import is_done, latest_checkpoint, load_model, read_metrics  # noqa: E402

CFG = FinetuneConfig(steps=120, batch_size=16, lr=1e-2, warmup_steps=6, eval_every=40, eval_examples=64,
                     n_snapshots=2, eval_batch_size=64, max_new_tokens=48, device="cpu")


def fresh_model(seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    return DecoderLM(ModelConfig(d_model=32, d_attn=32, n_heads=2, d_ff=128, n_layers=2,
                                 n_vocab=TEST_DATA.vocab_size, n_ctx=64))


@pytest.fixture(scope="module")
def cogs():
    return evaluation.cached_task("cogs")


@pytest.fixture(scope="module")
def dev(cogs):
    return cogs["dev"].select(range(48))


@pytest.fixture(scope="module")
def tuned(tok, tmp_path_factory):
    "A 120-step COGS fine-tune of a fresh model, and its run directory."
    run = tmp_path_factory.mktemp("cogs")
    model = ft.finetune(fresh_model(), "cogs", CFG, run, tokenizer=tok, progress=False)
    return model, run


def test_loss_counts_target_tokens_only(tok, cogs):
    ex = cogs["train"][0]
    ids, n_prompt = evaluation.encode_example(tok, ex["input"], ex["target"])
    assert ids[n_prompt - 1] == tok.sep_id and ids[-1] == tok.eos_id
    assert tok.decode(ids[n_prompt:-1]) == ex["target"]
    x, y = evaluation.lm_pair(ids, n_prompt)
    assert (y[: n_prompt - 1] == -100).all() and y[n_prompt - 1:].tolist() == ids[n_prompt:]
    model = fresh_model()
    logits, loss = model(x[None], y[None])
    manual = F.cross_entropy(logits[0, n_prompt - 1:], torch.tensor(ids[n_prompt:]))
    torch.testing.assert_close(loss, manual)
    # padding a batch changes nothing: the labels of padding are -100 too
    other = evaluation.lm_pair(*evaluation.encode_example(tok, "A cat ran .", "cat ( x _ 1 )"))
    xs, ys = evaluation.collate([(x, y), other], tok.pad_id)
    assert xs.shape[1] == len(x) and model(xs[:1], ys[:1])[1].item() == pytest.approx(loss.item(), rel=1e-5)
    # exactly the target tokens and EOS are supervised
    assert int((ys[1] != -100).sum()) == len(tok.encode("cat ( x _ 1 )")) + 1


def test_finetune_on_cogs_beats_the_untrained_model(tuned, tok, dev):
    model, run = tuned
    before = evaluation.evaluate(fresh_model(), tok, dev, max_new_tokens=48)
    after = evaluation.evaluate(model, tok, dev, max_new_tokens=48)
    assert after["loss"] < 0.3 * before["loss"], (before["loss"], after["loss"])

    def similarity(m):  # character overlap of the greedy outputs with the targets (cut to the output's length)
        preds = evaluation.greedy_decode(m, tok, dev["input"], max_new_tokens=48)
        return sum(difflib.SequenceMatcher(None, p, t[: len(p)]).ratio() if p else 0.0
                   for p, t in zip(preds, dev["target"])) / len(dev)

    # exact match needs far longer training than a test can afford (both score 0 here); the outputs
    # of the fine-tuned model are nonetheless much closer to the targets
    assert similarity(model) > 2 * similarity(fresh_model())
    ev = read_metrics(run, "eval")
    assert ev.step.tolist() == [40, 80, 120] and set(ev.split) == {"dev"} and ev.loss.iloc[-1] < ev.loss.iloc[0]
    assert read_metrics(run, "snapshot").step.tolist() == [40, 120]
    assert is_done(run) and load_model(run).cfg == model.cfg


def test_cached_and_uncached_evaluation_agree(tuned, tok, dev):
    model, _ = tuned
    fast = evaluation.evaluate(model, tok, dev, max_new_tokens=48, use_cache=True, loss=False)
    slow = evaluation.evaluate(model, tok, dev, max_new_tokens=48, use_cache=False, loss=False)
    for key in ("accuracy", "by_category", "by_generalization_type", "n"):
        assert fast[key] == slow[key]
    assert evaluation.greedy_decode(model, tok, dev["input"], max_new_tokens=48) == \
        evaluation.greedy_decode(model, tok, dev["input"], max_new_tokens=48, use_cache=False, batch_size=7)


def test_evaluate_writes_scores_and_predictions(tuned, tok, cogs, tmp_path):
    model, _ = tuned
    gen = cogs["gen"]
    res = evaluation.evaluate(model, tok, gen, split="gen", limit=60, max_new_tokens=32, out_dir=tmp_path)
    assert res["n"] == 60 and 0 <= res["accuracy"] <= 1
    assert set(res["by_generalization_type"]) <= {"lexical", "structural"}
    assert sum(v["n"] for v in res["by_category"].values()) == 60 and len(res["by_category"]) > 5  # a random subset
    assert json.loads((tmp_path / "gen.json").read_text()) == res
    lines = [json.loads(x) for x in (tmp_path / "gen.predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 60 and {"input", "target", "prediction", "correct", "category"} <= set(lines[0])
    assert sum(x["correct"] for x in lines) / 60 == res["accuracy"]


def test_finetune_resumes_exactly_and_reruns_are_noops(tok, cogs, tmp_path, monkeypatch):
    cfg = replace(CFG, steps=12, eval_every=4, eval_examples=16)
    data = {"train": cogs["train"].select(range(400)), "dev": cogs["dev"].select(range(16))}
    ref = ft.finetune(fresh_model(), "cogs", cfg, tmp_path / "ref", tokenizer=tok, dataset=data, progress=False)

    calls, collate = {"n": 0}, ft.collate

    def crashing(*a, **k):
        calls["n"] += 1
        if calls["n"] == 7:
            raise KeyboardInterrupt("simulated crash before step 7")
        return collate(*a, **k)

    monkeypatch.setattr(ft, "collate", crashing)
    run = tmp_path / "crashed"
    with pytest.raises(KeyboardInterrupt):
        ft.finetune(fresh_model(), "cogs", cfg, run, tokenizer=tok, dataset=data, progress=False)
    monkeypatch.setattr(ft, "collate", collate)
    assert latest_checkpoint(run)[1]["step"] == 4 and not is_done(run)
    msgs = []
    again = ft.finetune(fresh_model(), "cogs", cfg, run, tokenizer=tok, dataset=data, progress=False, log=msgs.append)
    assert any("resuming from step_00000004.pt" in m for m in msgs)
    for a, b in zip(again.state_dict().values(), ref.state_dict().values()):
        assert torch.equal(a, b)
    assert read_metrics(run, "train").loss.tolist() == read_metrics(tmp_path / "ref", "train").loss.tolist()
    assert_resumed_like(run, tmp_path / "ref", at=[4])
    msgs.clear()
    ft.finetune(fresh_model(), "cogs", cfg, run, tokenizer=tok, dataset=data, progress=False, log=msgs.append)
    assert "finished already" in msgs[0]
    with pytest.raises(ValueError, match="config.lr"):
        ft.finetune(fresh_model(), "cogs", replace(cfg, lr=1e-4), run, tokenizer=tok, dataset=data, progress=False)
