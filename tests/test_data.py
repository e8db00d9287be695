"""Tests of depthnb.sources and depthnb.data on the real files of the mirror: registry and fetching, pretraining text,
tokenizer, packing and the block loader (the compositional tasks: tests/test_tasks.py)."""
import gzip
import http.server
import json
import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from depthnb import data as D
from depthnb import sources as S
from depthnb.cli.data import cli_data
from depthnb.config import DataConfig

# A small tokenizer keeps the suite fast: 400 pieces from 200 articles (trained once, then cached).
SMALL = DataConfig(corpus="enwiki", vocab_size=400, tokenizer_docs=200, max_train_docs=300,
                   eval_sets=("enwiki_valid", "c4_sample", "wikitext2_valid", "wikitext2_test"))


@pytest.fixture(scope="session")
def tok():
    return D.train_tokenizer(SMALL, log=None)


# --- registry and fetching ------------------------------------------------------------------------------

def test_registry_matches_sources_md():
    reg = S.registry()
    files = {f.file: f for d in reg.values() for f in d.files}
    assert len(files) == 29  # 19 for Petty and the pretraining corpora, 10 for Saunshi's downstream sets
    assert files["cogs/gen.tsv"].sha256 == "d013d9eee0bafc153f8decc85f42814ac97260f84964d980e1e2b84577b82361"
    assert files["passivization/passiv_en_nps.train"].alt["transform"] == "gunzip_crlf"
    assert reg["c4"].hub == "allenai/c4" and reg["c4"].config == "en" and not reg["c4"].files
    for f in files.values():
        assert f.license and f.repo and len(f.commit) == 40 and len(f.sha256) == 64
        if f.file.startswith("pretrain/"):
            assert len(f.sha256_uncompressed) == 64


@pytest.fixture(scope="session")
def real():
    "Cached paths of every registry file, verified (copied from the mirror or downloaded)."
    return S.fetch_data(progress=False)


def test_fetch_verifies_every_file(real):
    assert len(real) == 29
    assert S.fetch_data(progress=False, verify=True) == real


def test_fetch_errors_name_file_and_reason(real, tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHNB_CACHE_DIR", str(tmp_path / "cache"))
    mirror = tmp_path / "mirror"
    (mirror / "geoquery").mkdir(parents=True)
    data = bytearray(real["geoquery/geo_funql_test.tsv"].read_bytes())
    data[-1] ^= 1
    (mirror / "geoquery" / "geo_funql_test.tsv").write_bytes(bytes(data))
    with pytest.raises(S.FetchError) as e:
        S.fetch_data(["geoquery"], mirror=mirror, progress=False)
    msg = str(e.value)
    assert "2 of 2 files failed (from mirror" in msg
    assert f"geoquery/geo_funql_train.tsv: missing in mirror {mirror}" in msg
    assert ("geoquery/geo_funql_test.tsv: checksum mismatch: expected sha256 "
            "cfe0dea5b8d1fad8ba75c04a6b859f5699905022909ad0a64fdb5ed3bc40340d, got ") in msg
    assert not (tmp_path / "cache" / "raw" / "geoquery" / "geo_funql_test.tsv").exists()  # nothing bad is kept


@pytest.fixture
def http_sources(real, tmp_path, monkeypatch):
    "A local HTTP server laid out like raw.githubusercontent.com (<repo>/<commit>/<path>)."
    root = tmp_path / "www"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(root), **k)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(S, "RAW_URL", f"http://127.0.0.1:{server.server_port}/{{repo}}/{{commit}}/{{path}}")
    monkeypatch.setenv("DEPTHNB_CACHE_DIR", str(tmp_path / "cache"))
    yield root
    server.shutdown()


def _entry(file):
    return next(f for d in S.registry().values() for f in d.files if f.file == file)


def _serve(root, entry, content: bytes, path=None, repo=None, commit=None, transform=None):
    out = root / (repo or entry.repo) / (commit or entry.commit) / (path or entry.path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(content)


def test_download_verifies_and_transforms(real, http_sources):
    geo, wt = _entry("geoquery/geo_funql_train.tsv"), _entry("pretrain/wikitext-2/valid.txt.gz")
    _serve(http_sources, geo, real[geo.file].read_bytes())
    for e in S.registry()["wikitext2"].files:  # the canonical sources are plain text
        _serve(http_sources, e, gzip.decompress(real[e.file].read_bytes()))
    with pytest.raises(S.FetchError) as e:
        S.fetch_data(["geoquery"], mirror="none", progress=False)
    assert "geoquery/geo_funql_test.tsv: HTTP error 404" in str(e.value)  # not served
    assert "geo_funql_train.tsv:" not in str(e.value) and S.is_verified(geo)
    S.fetch_data(["wikitext2"], mirror="none", progress=False)  # stored gzipped, checked by content hash
    assert D.sha256_file(wt.cached, decompress=True) == wt.sha256_uncompressed


def test_download_falls_back_to_alt_source(real, http_sources):
    "passivization train: the primary is not served, the fork's CRLF gzip is (as in its repository)."
    dev = _entry("passivization/passiv_en_nps.dev")
    train = _entry("passivization/passiv_en_nps.train")
    for e in S.registry()["passivization"].files:
        if e.file != train.file:
            _serve(http_sources, e, real[e.file].read_bytes())
    crlf = real[train.file].read_bytes().replace(b"\n", b"\r\n")
    _serve(http_sources, train, gzip.compress(crlf, compresslevel=1), **train.alt)
    paths = S.fetch_data(["passivization"], mirror="none", progress=False)
    assert D.sha256_file(paths[train.file]) == train.sha256 and S.is_verified(dev)


def test_wikiextractor_rebuild_reproduces_the_valid_split(real, http_sources):
    "The real enwiki valid docs written back as WikiExtractor parts rebuild to the registered content hash."
    entry = _entry("pretrain/enwiki-2014/enwiki-2014.valid.jsonl.gz")
    docs = [json.loads(line) for line in gzip.open(real[entry.file], "rt", encoding="utf-8")]
    parts = S.expand_parts(entry.parts)
    for i, part in enumerate(parts):
        chunk = docs[i * len(docs) // len(parts):(i + 1) * len(docs) // len(parts)]
        text = "".join(f'<doc id="{d["id"]}" url="{d["url"]}" title="{d["title"]}">\n{d["text"]}\n\n</doc>\n'
                       for d in chunk)
        if i == 0:  # WikiExtractor also writes documents with an empty body; the build drops them
            text += '<doc id="1" url="http://en.wikipedia.org/wiki?curid=1" title="Stub">\nStub\n\n</doc>\n'
        _serve(http_sources, entry, text.encode("utf-8"), path=part)
    dest = http_sources / "rebuilt.jsonl.gz"
    S._build_wikiextractor_jsonl(entry, dest, progress=False)
    assert D.sha256_file(dest, decompress=True) == entry.sha256_uncompressed


# --- pretraining text -----------------------------------------------------------------------------------

def test_pretraining_texts_counts():
    assert sum(1 for _ in S.pretraining_texts("enwiki", "valid")) == 3306
    assert sum(1 for _ in S.pretraining_texts("c4_sample")) == 1000
    assert len(list(S.pretraining_texts("wikitext2", "test"))) > 50
    assert len(list(S.pretraining_texts("enwiki", "train", limit=5))) == 5
    with pytest.raises(ValueError, match="split of wikitext2='train' is not one of"):
        S.pretraining_texts("wikitext2", "train")


def test_c4_offline_error_suggests_enwiki(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.time()
    with pytest.raises(RuntimeError, match=r"pretrain on the enwiki-2014 corpus instead: DataConfig\(corpus='enwiki'\)"):
        next(S.pretraining_texts("c4", "train"))
    assert time.time() - t0 < 5


# --- tokenizer ------------------------------------------------------------------------------------------

def test_tokenizer_specials_and_cache(tok):
    assert (tok.pad_id, tok.eos_id, tok.unk_id, tok.sep_id) == (0, 1, 2, 3)
    assert tok.sp.id_to_piece(3) == "<sep>" and tok.vocab_size == 400
    assert tok.encode("x <sep> y").count(3) == 1
    t0 = time.time()
    again = D.train_tokenizer(SMALL, log=None)
    assert time.time() - t0 < 1 and again.fingerprint == tok.fingerprint
    assert D.tokenizer_key(SMALL) != D.tokenizer_key(DataConfig(corpus="enwiki", vocab_size=401, tokenizer_docs=200))
    assert D.load_tokenizer(tok.path).encode("hello") == tok.encode("hello")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_tokenizer_round_trips_any_text(tok, text):
    assert tok.decode(tok.encode(text)) == text


# --- packing and blocks ---------------------------------------------------------------------------------

def _interrupted(docs, after):
    for i, d in enumerate(docs):
        if i == after:
            raise KeyboardInterrupt("simulated interruption")
        yield d


@pytest.mark.parametrize("workers", [1, 2])
def test_pack_resumes(tok, tmp_path, workers):
    docs = list(S.pretraining_texts("enwiki", "valid", limit=120))
    ref = D.read_tokens(D.pack_tokens(docs, tok, tmp_path / "ref.bin", shard_docs=20, workers=1, progress=False))
    assert ref.dtype == np.uint16 and int((ref == tok.eos_id).sum()) == 120
    assert tok.decode(ref[:ref.tolist().index(tok.eos_id)]) == docs[0]
    out = tmp_path / "run.bin"
    with pytest.raises(KeyboardInterrupt):
        D.pack_tokens(_interrupted(docs, 70), tok, out, shard_docs=20, workers=workers, progress=False)
    assert not out.exists()
    manifest = json.loads((tmp_path / "run.bin.parts" / "manifest.json").read_text())
    if workers == 1:  # in-process: every shard before the interruption is finished
        assert sorted(manifest["done"], key=int) == ["0", "1", "2"]
    else:  # worker processes: the shards finished before the interruption, whichever they are
        assert set(manifest["done"]) <= {"0", "1", "2"}
    assert sorted(p.stem for p in (tmp_path / "run.bin.parts").glob("*.bin")) == [f"{int(i):06d}" for i in
                                                                                    sorted(manifest["done"], key=int)]
    D.pack_tokens(docs, tok, out, shard_docs=20, workers=workers, progress=False)
    meta = json.loads(D.meta_path(out).read_text())
    assert np.array_equal(D.read_tokens(out), ref)
    assert meta["new_tokens"] == len(ref) - sum(d["tokens"] for d in manifest["done"].values())
    assert not (tmp_path / "run.bin.parts").exists()


def test_token_dtype():
    assert D.token_dtype(32128) == np.uint16 and D.token_dtype(65536) == np.uint16
    assert D.token_dtype(65537) == np.uint32


@pytest.fixture(scope="module")
def blocks(tok, tmp_path_factory):
    path = D.pack_tokens(S.pretraining_texts("c4_sample", limit=200), tok,
                         tmp_path_factory.mktemp("blocks") / "c4.bin", workers=1, progress=False)
    return path


def test_token_blocks_deterministic_and_ddp(blocks):
    a, b = D.TokenBlocks(blocks, n_ctx=64, seed=3), D.TokenBlocks(blocks, n_ctx=64, seed=3)
    for step in (0, 7, len(a) // 4 + 3):  # the last one wraps into a later epoch
        x = a.batch(step, 8)
        assert x.shape == (8, 65) and x.dtype == torch.int64
        assert torch.equal(x, b.batch(step, 8))
        assert torch.equal(torch.cat([a.batch(step, 8, rank=r, world=2) for r in range(2)]), x)
        assert torch.equal(torch.cat([a.batch(step, 8, rank=r, world=4) for r in range(4)]), x)
    assert not torch.equal(a.batch(1, 8), D.TokenBlocks(blocks, n_ctx=64, seed=4).batch(1, 8))
    epoch = np.concatenate([a.indices(s, 4) for s in range(len(a) // 4)])
    assert len(set(epoch.tolist())) == len(epoch)
    i = int(a.indices(2, 4)[1])
    assert torch.equal(a.batch(2, 4)[1], torch.from_numpy(a.tokens[i * 64:i * 64 + 65].astype(np.int64)))
    with pytest.raises(ValueError, match="batch_size=6 is not divisible by world=4"):
        a.batch(0, 6, world=4)
    seq = list(a.sequential(5, limit=12))
    assert [len(s) for s in seq] == [5, 5, 2] and torch.equal(seq[0][0], a.get([0])[0])


def test_prepare_pretraining_cached(tok):
    data = D.prepare_pretraining(SMALL, n_ctx=64, progress=False, log=None)
    assert data.tokenizer.fingerprint == tok.fingerprint
    assert set(data.eval) == set(SMALL.eval_sets)
    assert data.summary().loc["train", "docs"] == 300
    t0 = time.time()
    again = D.prepare_pretraining(SMALL, n_ctx=64, progress=False, log=None)
    assert time.time() - t0 < 1
    assert torch.equal(again.train.batch(3, 4), data.train.batch(3, 4))
    with pytest.raises(ValueError, match="unknown \\['c5'\\]"):
        D.prepare_pretraining(DataConfig(eval_sets=("c5",)), 64)


def test_cli_data(capsys):
    assert cli_data(["--only", "cogs,geoquery"]) == 0
    assert "6 files verified" in capsys.readouterr().out
    assert cli_data(["--only", "cogz"]) == 2
    assert capsys.readouterr().err == "depthnb data: error: unknown dataset 'cogz'; datasets: " + ", ".join(S.registry()) + "\n"
    assert cli_data(["--list"]) == 0
    assert "allenai/c4" in capsys.readouterr().out
