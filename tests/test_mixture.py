"""The data mixture (Saunshi et al. App. A): weights honoured as shares of text, a pre-cached order identical across
reads and runs, and one-line errors for bad weights and unknown sources. Local sources in the real schemas."""
import itertools
import json
import random
import subprocess
import sys

import datasets
import pytest

from depthnb.mixture import (LLAMA_MIXTURE, MixtureCacheError, MixtureSource, mixture_shares, mixture_sources,
                             mixture_texts, precache_mixture, read_mixture)
from depthnb.sources import pretraining_texts

WORDS = "the of and a to in is was for on as with by at from".split()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    "Four small sources in C4's, Wikipedia's and RedPajama's schemas, with documents of very different lengths."
    tmp, rng = tmp_path_factory.mktemp("sources"), random.Random(1)
    text = lambda lo, hi: " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))
    rows = {
        "c4": [dict(text=text(50, 150), timestamp="2019-04-25T12:57:54Z", url=f"https://example.org/{i}") for i in range(60)],
        "wikipedia": [dict(id=str(i), url=f"https://en.wikipedia.org/wiki?curid={i}", title=f"T{i}", text=text(200, 400))
                      for i in range(30)],
        "github": [dict(text=text(20, 80), meta=dict(repo_name="o/r", path=f"f{i}.py", license="mit")) for i in range(40)],
        "arxiv": [dict(text=text(600, 900), meta=dict(arxiv_id=f"2101.{i:05d}")) for i in range(20)],
    }
    sources = {}
    for name, rs in rows.items():
        path = tmp / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rs))
        sources[name] = MixtureSource("json", data_files=(str(path),))
    datasets.disable_progress_bars()
    return sources


@pytest.fixture(scope="module")
def cached(local, tmp_path_factory):
    return precache_mixture(LLAMA_MIXTURE, tmp_path_factory.mktemp("mix") / "m", n_docs=30_000, sources=local, log=None)


def test_weights_are_honoured_as_shares_of_text(cached):
    shares = mixture_shares(cached)
    assert (shares.char_share - shares.weight).abs().max() < 0.02, shares
    assert (shares.doc_share - shares.weight).abs().max() > 0.1  # documents alone would not give the weights


def test_equal_weights_by_documents_when_lengths_are_equal(tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(dict(text=f"{name}{i:03d}")) + "\n" for i in range(50)))
    sources = {n: MixtureSource("json", data_files=(str(tmp_path / f"{n}.jsonl"),)) for n in "abc"}
    out = precache_mixture({"a": 0.5, "b": 0.3, "c": 0.2}, tmp_path / "m", n_docs=10_000, sources=sources, log=None)
    shares = mixture_shares(out)
    assert (shares.doc_share - shares.weight).abs().max() < 0.02, shares
    texts = list(mixture_texts(out))
    assert texts[:50].count("a000") == 1 and "a049" in texts  # a source is read in its order, then repeats


def test_the_precached_order_is_fixed(cached, local, tmp_path):
    first = list(mixture_texts(cached))
    assert list(mixture_texts(cached)) == first
    assert read_mixture(cached, verify=True)["source"] == list(read_mixture(cached)["source"])
    # another process (another run, another method) reads the same documents in the same order
    code = ("import sys, json; from depthnb.mixture import mixture_texts; "
            "print(json.dumps(list(mixture_texts(sys.argv[1], limit=2000))))")
    other = subprocess.run([sys.executable, "-c", code, str(cached)], capture_output=True, text=True, check=True)
    assert json.loads(other.stdout) == first[:2000]
    # the same mixture drawn again elsewhere is the same stream; another seed is another order
    again = precache_mixture(LLAMA_MIXTURE, tmp_path / "again", n_docs=3_000, sources=local, log=None)
    assert list(mixture_texts(again)) == first[:3_000]
    reseeded = precache_mixture(LLAMA_MIXTURE, tmp_path / "seed1", n_docs=3_000, sources=local, seed=1, log=None)
    assert list(mixture_texts(reseeded)) != first[:3_000]
    assert precache_mixture(LLAMA_MIXTURE, cached, n_docs=30_000, sources=local, log=None) == cached  # kept


def test_a_damaged_or_other_cache_is_refused(local, tmp_path):
    out = precache_mixture(LLAMA_MIXTURE, tmp_path / "m", n_chars=50_000, sources=local, log=None)
    with pytest.raises(MixtureCacheError, match="holds another pre-cached mixture"):
        precache_mixture(LLAMA_MIXTURE, out, n_chars=60_000, sources=local, log=None)
    arrow = next((out / "docs").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[:-10])
    with pytest.raises(MixtureCacheError, match="the pre-cached mixture is damaged"):
        read_mixture(out)
    with pytest.raises(MixtureCacheError, match="holds no pre-cached mixture"):
        read_mixture(tmp_path / "nothing")


@pytest.mark.parametrize("weights, message", [
    ({"c4": 0.57, "wikipedia": 0.17, "github": 0.17}, r"mixture weights sum to 0.91, not 1"),
    ({"c4": 1.1, "arxiv": -0.1}, r"mixture weight of 'arxiv' is -0.1: each weight must be a number > 0"),
    ({"c4": 0.5, "wikipedia": float("nan")}, r"mixture weight of 'wikipedia' is nan"),
    ({"c4": 0.5, "books": 0.5}, r"unknown source 'books' for 'books'; known: c4, wikipedia, github, arxiv, enwiki"),
    ({}, r"no sources given"),
])
def test_bad_mixtures_fail_in_one_line(weights, message):
    with pytest.raises(ValueError, match=message) as e:
        mixture_sources(weights)
    assert "\n" not in str(e.value)


def test_sources_and_stand_ins():
    hub = mixture_sources(LLAMA_MIXTURE)
    assert (hub["c4"].path, hub["c4"].config) == ("allenai/c4", "en")
    assert (hub["wikipedia"].path, hub["wikipedia"].config) == ("wikimedia/wikipedia", "20231101.en")
    assert hub["github"].url_list == "togethercomputer/RedPajama-Data-1T:urls/github.txt"
    assert mixture_sources(LLAMA_MIXTURE, {"wikipedia": "enwiki"})["wikipedia"].path == "depthnb:enwiki"
    with pytest.raises(ValueError, match="unknown source 'wiki' for 'wikipedia'"):
        mixture_sources(LLAMA_MIXTURE, {"wikipedia": "wiki"})
    with pytest.raises(ValueError, match="give n_docs or n_chars"):
        precache_mixture(LLAMA_MIXTURE, "/nonexistent", sources={})


def test_enwiki_stands_in_where_named(local, tmp_path):
    out = precache_mixture({"c4": 0.5, "wikipedia": 0.5}, tmp_path / "m", n_chars=300_000, probe_docs=100,
                           sources={"c4": local["c4"], "wikipedia": "enwiki"}, log=None)
    docs = read_mixture(out)
    wiki = docs.filter(lambda r: r["source"] == "wikipedia")
    assert wiki["text"][:5] == list(itertools.islice(pretraining_texts("enwiki", "train"), 5))  # the corpus, in order
    assert abs(mixture_shares(out).char_share["wikipedia"] - 0.5) < 0.1  # few, long articles: a loose check
