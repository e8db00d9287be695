"""Oracle tests of scoring: through the same lm-eval path as every model (depthnb's task files, lm-eval's filters
and metrics, `evaluate_downstream_task`), a model that answers with the gold answer scores 1.0 and one that answers wrongly
0.0 — GSM8k with and without the calculator, a math set (SVAMP), NQ-open and WebQuestions, on the local mirror."""
import re

import pytest
from lm_eval.api.model import LM

from depthnb.downstream import calculator_edit
from depthnb.downstream_scoring import evaluate_downstream_task

FINAL = re.compile(r"#### (-?[\d.,]+)\s*$")


def gold(task: str, doc: dict) -> str:
    "What a perfect model writes: the worked solution (math), the first answer (QA)."
    if task == "nq_open":
        return " " + next((a for a in doc["answer"] if not set(a) & set(".,")), doc["answer"][0])
    return " " + doc["answer"]


def wrong(task: str, doc: dict) -> str:
    "A confident wrong answer: the solution with its final number off by one (math), a non-answer (QA)."
    if task == "nq_open":
        return " zebra crossing"
    value = FINAL.search(doc["answer"]).group(1).replace(",", "")
    return " " + FINAL.sub(f"#### {float(value) + 1:g}", doc["answer"])


def with_calculator(context: str, script: str) -> str:
    """A model writing `script` character by character with the calculator on: every annotation it opens is
    completed by the calculator (its own digits up to `>>` are skipped), as `DepthnbLM` decoding does."""
    out, i = "", 0
    while i < len(script):
        out, i = out + script[i], i + 1
        edit = calculator_edit(context + out)
        if edit is not None and edit[0] >= len(context):
            out = (context + out)[len(context): edit[0]] + edit[1]
            i = script.index(">>", i) + 2
    return out


def blank_results(solution: str) -> str:
    "A solution whose annotation results are wrong (7777): only a working calculator restores them."
    return re.sub(r"<<([^=<>]+)=[^>]*>>", r"<<\1=7777>>", solution)


class Oracle(LM):
    "An lm-eval model that answers every request from its document: `answer(task, doc)`."

    def __init__(self, task: str, answer, calculator: bool = False):
        super().__init__()
        self.task, self.answer, self.calculator = task, answer, calculator

    def generate_until(self, requests, disable_tqdm: bool = False):
        out = []
        for req in requests:
            text = self.answer(self.task, req.doc)
            if self.calculator:
                text = with_calculator(req.args[0], blank_results(text))
            out.append(text)
        return out

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        # WebQuestions scores by log-likelihood: the oracle is sure of the gold answers, the wrong one of none
        out = []
        for req in requests:
            right = req.args[1].strip() in req.doc["answers"] and self.answer is gold
            out.append((0.0, True) if right else (-50.0, False))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


CASES = [("gsm8k", False), ("gsm8k", True), ("svamp", False), ("svamp", True), ("nq_open", False), ("webqs", False)]


@pytest.mark.parametrize("task, calculator", CASES, ids=[f"{t}{'-calc' if c else ''}" for t, c in CASES])
def test_gold_scores_one_and_wrong_scores_zero(task, calculator):
    right = evaluate_downstream_task(Oracle(task, gold, calculator), task, limit=8)
    assert right["n"] == 8 and right["accuracy"] == 1.0, right
    miss = evaluate_downstream_task(Oracle(task, wrong, calculator), task, limit=8)
    assert miss["n"] == 8 and miss["accuracy"] == 0.0, miss


def test_the_calculator_restores_the_annotations():
    solution = "She sold 48/2 = <<48/2=24>>24 clips.\n#### 24"
    assert blank_results(solution) == "She sold 48/2 = <<48/2=7777>>24 clips.\n#### 24"
    assert with_calculator("Answer:", " " + blank_results(solution)) == " " + solution
