"Reasoning primitives (Saunshi et al. Appendix B): formats, answers, determinism, splits, scoring."
import gzip
import json
import os
import re
from pathlib import Path

import pytest

from depthnb.primitives import (COPY_WORDS, FT_TASKS, PRIMITIVE_TASKS, extract_answer, few_shot, finetune_set,
                                holdout_set, make_primitive, score_primitive, solve_primitive, three_letter_words)

# Appendix B.1 verbatim; "|" marks where the target starts (it is not part of the prompt).
APPENDIX_B = {
    "copy_random": "Fill in blank:\npum nyj gdq ocu rzk jbw mlz eny kyx uni rzk jbw mlz eny kyx ___. ->|uni",
    "copy_words": "Fill in blank:\neat fit ban sea vet zit pea cat van tea sea vet zit pea cat ___. ->|van",
    "var_depth0_basic": "Fill in blank:\no=14\ns=4\nu=8\nm=10\nq=12\nm=___. ->|10",
    "var_depth1_basic": "Fill in blank:\ng=21\nb=24\nv=3\ns=23\nh=20\nk=b\na=s\nn=v\nf=g\nd=h\na=___. ->|23",
    "var_depth2_basic": "Fill in blank:\nw=24\nl=12\nd=16\ne=5\nj=9\ng=j\ny=e\nr=l\nk=d\nh=w\nv=g\ni=r\nc=h\nt=k\np=y\n"
                        "c=___. ->|24",
    "var_depth0_math": "The following is a set of simple mathematical equations.\nn=22\nr=16\nw=13\nv=6\nk=10\n"
                       "What is the numerical value of n?\nAnswer:|22",
    "var_depth1_math": "The following is a set of simple mathematical equations.\nh=20\nw=9\nc=22\nj=11\nv=5\ng=c\nk=w\n"
                       "a=j\ns=h\no=v\nWhat is the numerical value of s?\nAnswer:|20",
    "var_depth2_math": "The following is a set of simple mathematical equations.\ng=9\nv=24\nk=15\np=6\nc=10\nt=p\ns=g\n"
                       "a=c\ny=v\nn=k\nl=s\nw=n\nj=t\nm=y\ni=a\nWhat is the numerical value of j?\nAnswer:|6",
    "var_depth0_code": "The following is a very short Python program. Use the program to resolve the value of the "
                       "variable in the question.\nProgram:\nq=12\nk=17\nl=1\ny=3\na=6\nQuestion:\n"
                       "What is the value of k?\nAnswer:\n|17",
    "var_depth1_code": "The following is a very short Python program. Use the program to resolve the value of the "
                       "variable in the question.\nProgram:\nk=11\nf=21\ne=10\nl=7\nc=13\ny=f\no=c\nr=e\nu=k\nn=l\n"
                       "Question:\nWhat is the value of o?\nAnswer:\n|13",
    "var_depth2_code": "The following is a very short Python program. Use the program to resolve the value of the "
                       "variable in the question.\nProgram:\nt=13\nj=14\nv=4\ns=17\ny=21\nq=j\nl=s\ne=y\nh=t\nx=v\n"
                       "b=x\nf=e\nn=q\na=h\ni=l\nQuestion:\nWhat is the value of i?\nAnswer:\n|17",
    "psm": "Fill in blank:\nk=1\nj=8\nl=-k+j\nl=___. ->|-1+8=7",
    "arithmetic": "-3+2=-1\n-6+1=-5\n+9-7=2\n-6-4=-10\n-6-1=-7\n+1+9=|10",
}


def paper(task):
    prompt, target = APPENDIX_B[task].split("|")
    return prompt, target


def skeleton(task, text):
    "The text with its free choices blanked: words, variable names, numbers, signs."
    if PRIMITIVE_TASKS[task].family == "copy":
        return re.sub(r"\b[a-z]{3}\b", "W", text.replace("Fill in blank", "HEADER"))
    text = re.sub(r"(?<![A-Za-z])[a-z](?![A-Za-z])", "V", text)  # single-letter names (and the article "a")
    return re.sub(r"[+-]", "S", re.sub(r"[+-]?\d+", "N", text))


def test_every_task_has_an_appendix_example():
    assert set(APPENDIX_B) == set(PRIMITIVE_TASKS)


@pytest.mark.parametrize("task", list(PRIMITIVE_TASKS))
def test_format_matches_appendix_b(task):
    p_prompt, p_target = paper(task)
    for ex in make_primitive(task, 50, seed=7):
        assert skeleton(task, ex["prompt"]) == skeleton(task, p_prompt)
        assert skeleton(task, ex["target"]) == skeleton(task, p_target)
        assert ex["prompt"].count("\n") == p_prompt.count("\n")  # line breaks, including the code format's last one
        assert "|" not in ex["prompt"] and "|" not in ex["target"]


@pytest.mark.parametrize("task", list(PRIMITIVE_TASKS))
def test_solver_reproduces_the_papers_answers(task):
    prompt, target = paper(task)
    assert solve_primitive(task, prompt) == target


@pytest.mark.parametrize("task", list(PRIMITIVE_TASKS))
def test_deterministic_and_seed_dependent(task):
    a, b = make_primitive(task, 30, seed=11), make_primitive(task, 30, seed=11)
    assert a == b
    assert a != make_primitive(task, 30, seed=12)
    assert make_primitive(task, 10, seed=11) == a[:10]  # a prefix of a longer draw
    assert len({e["prompt"] for e in make_primitive(task, 300)}) == 300


def _program_lines(prompt):
    return [l for l in prompt.splitlines() if re.fullmatch(r"[a-z]=[-+a-z0-9]+", l)]


@pytest.mark.parametrize("task", [t for t, s in PRIMITIVE_TASKS.items() if s.family in ("var", "psm")])
def test_answers_derivable_by_running_the_program(task):
    spec = PRIMITIVE_TASKS[task]
    for ex in make_primitive(task, 300, seed=3):
        env = {}
        exec("\n".join(_program_lines(ex["prompt"])), {}, env)  # the program is valid Python
        query = re.search(r"^([a-z])=___|value of ([a-z])\?", ex["prompt"], re.M)
        value = env[query[1] or query[2]]
        if spec.family == "psm":
            expr, result = ex["target"].split("=")
            assert eval(expr) == value == int(result)
            assert [int(d) for d in re.findall(r"\d", expr)] == list(env.values())[:2]  # values in order
        else:
            assert ex["target"] == str(value)
            lines = _program_lines(ex["prompt"])
            assert len(lines) == 5 * (spec.depth + 1)
            assert len({l[0] for l in lines}) == len(lines)  # distinct names
            values = [int(l[2:]) for l in lines[:5]]
            assert len(set(values)) == 5 and all(0 <= v <= 24 for v in values)


@pytest.mark.parametrize("task", ["copy_random", "copy_words"])
def test_copy_answer_is_the_word_after_the_repeat(task):
    for ex in make_primitive(task, 300, seed=5):
        words = ex["prompt"].splitlines()[1].split()[:-2]
        seq, sub = words[:10], words[10:]
        assert len(set(seq)) == 10 and len(sub) == 5 and all(len(w) == 3 for w in words)
        i = seq.index(sub[0])
        assert seq[i:i + 5] == sub and seq[i + 5] == ex["target"]
        if task == "copy_words":
            assert set(seq) <= set(COPY_WORDS)


def test_arithmetic_answers():
    for ex in make_primitive("arithmetic", 300, seed=2):
        lines = ex["prompt"].splitlines()
        assert len(lines) == 6
        for line in lines[:-1]:
            expr, result = line.split("=")
            assert eval(expr) == int(result)
        assert eval(lines[-1].rstrip("=")) == int(ex["target"])


def test_all_generated_answers_follow_from_prompts():
    for task in PRIMITIVE_TASKS:
        for ex in make_primitive(task, 300, seed=9):
            assert solve_primitive(task, ex["prompt"]) == ex["target"]


def test_random_guess_and_values_spread():
    assert {t.random_guess for t in PRIMITIVE_TASKS.values() if t.family == "copy"} == {0.1}
    assert {t.random_guess for t in PRIMITIVE_TASKS.values() if t.family == "var"} == {0.2}
    assert PRIMITIVE_TASKS["psm"].random_guess is None and PRIMITIVE_TASKS["arithmetic"].random_guess is None
    # the answer position (copying) and the queried value (depth 0) are spread over all candidates
    pos = {ex["prompt"].split()[3:13].index(ex["target"]) for ex in make_primitive("copy_random", 200)}
    assert pos == {5, 6, 7, 8, 9}
    vals = {int(ex["target"]) for ex in make_primitive("var_depth0_code", 400)}
    assert vals == set(range(25))


def test_few_shot_prompt_layout():
    exs = make_primitive("var_depth1_code", 20, seed=0)
    fs = few_shot(exs, k=5, seed=1)
    for q, f in zip(exs, fs):
        blocks = f["prompt"].split("\n\n")
        assert len(blocks) == 6 and blocks[-1] == q["prompt"]
        solved = {e["prompt"] + e["target"] for e in exs}
        assert all(b in solved for b in blocks[:-1])
        assert q["prompt"] + q["target"] not in blocks[:-1]
        assert f["target"] == q["target"]
    assert few_shot(exs, k=5, seed=1) == fs and few_shot(exs, k=5, seed=2) != fs
    pool = make_primitive("var_depth1_code", 10, seed=99)
    fp = few_shot(exs, k=3, pool=pool)
    assert all(b in {e["prompt"] + e["target"] for e in pool} for f in fp for b in f["prompt"].split("\n\n")[:-1])
    with pytest.raises(ValueError, match="k=5"):
        few_shot(exs[:4], k=5)


def test_scoring():
    assert extract_answer("  17\n\nThe following") == "17"
    assert extract_answer("") == "" and extract_answer(" \n") == ""
    assert score_primitive("var_depth0_math", "22", "22") and not score_primitive("var_depth0_math", "2", "22")
    assert not score_primitive("copy_words", "van.", "van")  # exact match
    assert score_primitive("psm", "-6+5=-1", "-6+5=-1")
    assert not score_primitive("psm", "-6+5=1", "-6+5=-1")
    assert score_primitive("psm", "-6+5=1", "-6+5=-1", calculator=True)
    assert score_primitive("psm", "-6+5", "-6+5=-1", calculator=True)
    assert not score_primitive("psm", "+5-6=-1", "-6+5=-1", calculator=True)
    assert not score_primitive("psm", "-6-5=-11", "-6+5=-1", calculator=True)
    with pytest.raises(ValueError, match="psm"):
        score_primitive("var_depth0_code", "1", "1", calculator=True)
    with pytest.raises(KeyError, match="unknown primitive"):
        score_primitive("depth0", "1", "1")


def test_finetune_sets_and_holdouts():
    sets = [finetune_set(s) for s in (0, 1, 2)]
    held = {t: holdout_set(t) for t in FT_TASKS}
    assert all(len(v) == 1000 for v in held.values())
    for s in sets:
        assert len(s) == 64
        assert sum(e["task"] == "var_depth1_code" for e in s) == 32
        assert sum(e["task"] == "var_depth2_code" for e in s) == 32
        held_prompts = {e["prompt"] for v in held.values() for e in v}
        assert not any(e["prompt"] in held_prompts for e in s)
        assert all(e["prompt"].startswith("The following is a very short Python program.") for e in s)
    assert len({e["prompt"] for s in sets for e in s}) == 192
    assert finetune_set(1) == sets[1]


def test_finetune_excludes_even_on_collision():
    "A forced collision: with exclude = the first draws of the same stream, those prompts never come back."
    first = make_primitive("var_depth1_code", 5, seed=0, split="finetune")
    again = make_primitive("var_depth1_code", 5, seed=0, split="finetune", exclude={e["prompt"] for e in first})
    assert not {e["prompt"] for e in first} & {e["prompt"] for e in again}


def _enwiki_valid():
    for root in filter(None, [os.environ.get("DEPTHNB_DATA_MIRROR"), "../shared/data"]):
        path = Path(root) / "pretrain/enwiki-2014/enwiki-2014.valid.jsonl.gz"
        if path.exists():
            return path
    pytest.skip("enwiki-2014 valid split not present (set DEPTHNB_DATA_MIRROR)")


def test_word_list_is_rederived_from_the_corpus():
    with gzip.open(_enwiki_valid(), "rt", encoding="utf-8") as f:
        assert three_letter_words(json.loads(line)["text"] for line in f) == COPY_WORDS
    assert len(COPY_WORDS) == 174 and all(re.fullmatch("[a-z]{3}", w) for w in COPY_WORDS)


# ---- evaluating models: 5-shot accuracy and the fine-tuning protocol ---------------------------

from dataclasses import replace  # noqa: E402

import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from depthnb.config import PrimitiveConfig  # noqa: E402
from depthnb.presets import load_preset
from depthnb.data import train_tokenizer  # noqa: E402
from depthnb.model import DecoderLM  # noqa: E402
from depthnb.paper import TABLE6_PAPER  # noqa: E402
from depthnb.primitives import (answer_ids, complete, evaluate_primitives, evaluate_primitive_task,  # noqa: E402
                                finetune_primitives, ft_eval_steps, ft_summary, ft_tensors, table6, table7,
                                answer_loss)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(load_preset("tiny").pretrain.data, log=None)


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return DecoderLM(replace(load_preset("tiny").pretrain.model, d_model=32, d_attn=32, n_heads=2, d_ff=64, n_layers=2))


class Reader(nn.Module):
    "A stand-in model that answers every prompt's last block correctly (plus `extra`), solving it from the text."
    def __init__(self, task, tokenizer, extra=""):
        super().__init__()
        self.task, self.tok, self.extra = task, tokenizer, extra
        self.lm_head = nn.Linear(1, 1)

    def generate(self, idx, max_new_tokens, eos_id=None, use_cache=True, attention_mask=None):
        rows = []
        for ids, mask in zip(idx.tolist(), attention_mask.tolist()):
            assert mask == sorted(mask) and ids[:mask.count(0)] == [self.tok.pad_id] * mask.count(0)  # left-padded
            prompt = self.tok.decode([i for i, m in zip(ids, mask) if m])
            ans = answer_ids(self.tok, prompt, solve_primitive(self.task, prompt.split("\n\n")[-1]) + self.extra)
            rows.append(ids + (ans + [eos_id] * max_new_tokens)[:max_new_tokens])
        return torch.tensor(rows)


@pytest.mark.parametrize("task", list(PRIMITIVE_TASKS))
def test_a_perfect_reader_scores_everything(tok, task):
    res = evaluate_primitive_task(Reader(task, tok), tok, task, n=25, shots=5, batch_size=7, choice=False)
    assert res["accuracy"] == 1.0 and res["n"] == 25 and len(res["answers"]) == 25
    assert res["accuracy_calculator"] == 1.0 if task == "psm" else "accuracy_calculator" not in res
    wrong = evaluate_primitive_task(Reader(task, tok, extra="3"), tok, task, n=25, choice=False)
    assert wrong["accuracy"] == 0.0  # an answer that runs on past the target is wrong
    if task == "psm":
        assert wrong["accuracy_calculator"] == 1.0  # ... unless only the expression counts


def test_answer_ids_refuses_merged_boundaries():
    class Merging:
        def encode(self, s):
            return [ord(c) for c in s.replace("ab", "X")]
    assert answer_ids(Merging(), "xa", "c") == [ord("c")]
    with pytest.raises(ValueError, match="merges prompt and target"):
        answer_ids(Merging(), "xa", "b")


def test_random_model_gives_sane_table6(tok, tiny_model):
    tasks = ["copy_words", "var_depth1_math", "psm", "arithmetic"]
    rows = evaluate_primitives(tiny_model, tok, tasks, n=16, shots=2)
    assert rows.row.tolist() == [2, 7, 12, 13, 14]
    assert rows.accuracy.between(0, 1).all() and (rows.n == 16).all() and (rows.shots == 2).all()
    guess = rows.set_index("row").random_guess
    assert guess[[2, 7]].tolist() == [0.1, 0.2] and guess[[12, 13, 14]].isna().all()
    assert rows.equals(evaluate_primitives(tiny_model, tok, tasks, n=16, shots=2))  # deterministic
    t6 = table6({"ours": rows})
    assert len(t6) == len(TABLE6_PAPER) == 14 and t6.loc[[2, 7, 12, 13, 14], "ours"].notna().all()
    assert t6.loc[1, "paper MIDAS"] == 24.3 and t6.loc[1, "random guess"] == 10 and pd.isna(t6.loc[1, "ours"])


def test_batched_left_padded_decoding_equals_one_by_one(tok, tiny_model):
    prompts = [e["prompt"] for e in make_primitive("var_depth0_basic", 3)] + ["Fill in blank:\nab ___. ->"]
    batched = complete(tiny_model, tok, prompts, 6, batch_size=4)
    assert batched == [complete(tiny_model, tok, [p], 6)[0] for p in prompts]
    # and the output layer restricted to the last position changes nothing
    ids = torch.tensor([tok.encode(prompts[0])])
    full = tiny_model.eval().generate(ids, 6)
    assert tok.decode(full[0, ids.shape[1]:].tolist()).startswith(batched[0])


def test_target_loss_is_the_models_loss_on_the_answer(tok, tiny_model):
    exs = finetune_set(1, n_per_task=3, n_holdout=20)
    x, y = ft_tensors(tok, exs)
    assert x.shape == y.shape and x.shape[0] == 6
    for row, e in zip(range(6), exs):
        labels = y[row][y[row] != -100].tolist()
        assert labels == answer_ids(tok, e["prompt"], e["target"]) + [tok.eos_id]
        assert tok.decode(labels[:-1]) == e["target"]
    with torch.no_grad():
        assert answer_loss(tiny_model, x, y).item() == pytest.approx(tiny_model(x, y)[1].item(), abs=1e-5)


def test_ft_protocol_averages_the_right_steps():
    cfg = PrimitiveConfig(ft_steps=300, ft_eval_from=200, ft_eval_every=10)
    assert ft_eval_steps(cfg) == list(range(200, 301, 10))
    assert ft_eval_steps(PrimitiveConfig(ft_steps=60, ft_eval_from=40, ft_eval_every=7)) == [40, 47, 54, 60]
    log = pd.DataFrame([dict(seed=s, step=t, task=k, split=sp, accuracy=(t + s) / 1000 if 200 <= t <= 300 else 9.0)
                        for s in (0, 1, 2) for t in range(0, 400, 10) for k in FT_TASKS for sp in ("holdout", "train")])
    log.loc[log.split == "train", "accuracy"] = 7.0  # the training split never counts
    s = ft_summary(log, cfg)
    assert s.accuracy.tolist() == pytest.approx([(250 + seed) / 1000 for seed in (0, 1, 2) for _ in FT_TASKS])
    assert (s.n_steps == 11).all()
    t7 = table7({"ours": log}, cfg)
    assert t7.loc["Variable assignment depth 1 (code)", "ours"] == "25.10 ± 0.10"
    assert t7.loc["Variable assignment depth 2 (code)", "paper MIDAS"] == "44.97 ± 7.26"
    assert (t7["ours seeds"] == 3).all() and (t7["random guess"] == 20).all()
    with pytest.raises(ValueError, match="ft_eval_from"):
        ft_eval_steps(PrimitiveConfig(ft_steps=10, ft_eval_from=20))


def test_finetune_protocol_on_a_tiny_model(tok, tiny_model):
    cfg = PrimitiveConfig(n_eval=12, ft_examples_per_depth=4, ft_steps=12, ft_eval_from=8, ft_eval_every=4, ft_lr=3e-3)
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    log = finetune_primitives(tiny_model, tok, cfg, seed=2)
    assert all(torch.equal(before[k], v) for k, v in tiny_model.state_dict().items())  # the model is not touched
    assert sorted(log.step.unique()) == [8, 12] and set(log.split) == {"holdout", "train"} and set(log.task) == set(FT_TASKS)
    assert log[log.split == "holdout"].n.eq(12).all() and log[log.split == "train"].n.eq(4).all()
    assert log.accuracy.between(0, 1).all()
    losses = log.groupby("step").loss.first()
    assert losses[12] < losses[8]
    assert len(ft_summary(log, cfg)) == 2
