"""Committed notebook outputs come out the same on every run. None carries the free disk space (a run says it only
when it is tight: `loop.disk_note`), and the component notebooks (nbs/NN_layer/*.ipynb; the experiments keep no outputs)
show no wall-clock times, throughputs or dates in their tables and prints: what the clock decides is measured and
checked in their cells, not displayed, so that re-executing a notebook is not a diff."""
import json
import re
from pathlib import Path

import pytest

NBS = Path(__file__).resolve().parent.parent / "nbs"
FREE_DISK = re.compile(r"\b\d[\d,.]*\s?[KMGT]i?B free\b")
CLOCK = {  # what a displayed output must not carry, by what it is
    "a date or time of day": re.compile(r"(?<!\d)(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])(?!\d)"
                                        r"|(?<!\d)\d\d:\d\d:\d\d(?!\d)|\bmtime(_ns)?\b|tfevents\.\d"),
    "seconds": re.compile(r"(?<![\w.])\d[\d,]*(\.\d+)?\s?(s|ms|sec|secs|seconds)\b(?![\w'-])"),
    "a throughput": re.compile(r"\d[\d,.]*\s?[kMG]?(it|tok|tokens|examples|ex|steps|seqs?|samples)/s\b"),
    "a timing column": re.compile(r"\b\w*(seconds|_per_s|wall_s|grow_s|train_s|elapsed_s|step_ms)\b|\bwall[- ]clock\b"
                                  r"|\bstep time\b|\bwall_speedup\b"),
}


def output_lines(path: Path):
    "(cell number, line) of every text a notebook's committed outputs display: streams, text/plain, HTML, Markdown."
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        for out in cell.get("outputs", []):
            texts = [out.get("text", "")] + [v for k, v in out.get("data", {}).items() if k.startswith("text/")]
            for text in texts:
                for line in ("".join(text) if isinstance(text, list) else text).splitlines():
                    yield i, line


def clock_readings(lines) -> list[str]:
    "The lines that carry a reading of the clock, each with what it carries."
    return [f"cell {i}: {what}: {line.strip()[:160]}" for i, line in lines
            for what, pattern in CLOCK.items() if pattern.search(line)]


def test_the_patterns_catch_what_they_are_for():
    caught = clock_readings(enumerate([
        "### 2026-11-22T02:50:07+00:00 · CPU", "14 files in 0.02 s", "done after 2 s", "second call 0.027 s",
        "step  tokens  loss  tokens_per_s", "<th>wall_s</th>", "wall-clock 0.311x, step time 0.995x",
        "{'seconds': 0.1}", "12,345 tok/s", "{'size': 1, 'mtime_ns': 1795755581328805699}",
        "'events.out.tfevents.1795756534.vm.32609.2'"]))
    assert len({c.split(":")[0] for c in caught}) == 11, caught
    kept = ["L2_s0: stage 1/1: 4 layers, steps [0, 4)", "runs/tiny/stack/midas_L4_b1_prop1_s0: done", "n=30",
            "0/2000 [00:00<?, ? examples/s]", "lr 1e-3 over 40 steps", "seed 0, 5 shots", "1.5x fewer FLOPs",
            "'events.out.tfevents.*'"]
    assert clock_readings(enumerate(kept)) == []
    assert FREE_DISK.search("need up to 20 MiB; 73,397 MiB free") and not FREE_DISK.search("need up to 20 MiB")


@pytest.mark.parametrize("path", sorted(NBS.rglob("*.ipynb")), ids=lambda p: str(p.relative_to(NBS)))
def test_no_free_disk_space_in_committed_outputs(path):
    found = [f"cell {i}: {line.strip()}" for i, line in output_lines(path) if FREE_DISK.search(line)]
    assert not found, f"{path.name} shows the free disk space (run the notebook again):\n" + "\n".join(found)


@pytest.mark.parametrize("path", sorted(NBS.glob("*.ipynb")) + sorted(NBS.glob("[0-9][0-9]_*/*.ipynb")),
                         ids=lambda p: str(p.relative_to(NBS)))
def test_no_clock_readings_in_component_outputs(path):
    found = clock_readings(output_lines(path))
    assert not found, (f"{path.name} displays what the clock decides; check it in the cell instead of showing it:\n"
                       + "\n".join(found))


def test_experiment_notebooks_keep_no_outputs():
    kept = [p.name for p in sorted((NBS / "experiments").glob("*.ipynb")) if any(output_lines(p))]
    assert not kept, f"experiment notebooks with committed outputs: {kept}"
