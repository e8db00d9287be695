"""Faults in depthnb's data caches. A cache file that does not match its record (a fetched file, a tokenizer, a
packed token array) is rebuilt after a one-line notice and never used as is; where nothing can rebuild it, a
one-line error names the file and the remedy; records hold paths relative to the cache, so a cache that moves
with its checkout is still found. Each test works in a scratch cache and fetches nothing."""
import json
import re
import shutil
from dataclasses import replace

import numpy as np
import pytest

from depthnb import data as D
from depthnb import sources as S
from test_data import SMALL

CFG = replace(SMALL, max_train_docs=100, eval_sets=())  # the training array only: 100 articles
TRAIN = "pretrain/enwiki-2014/enwiki-2014.train.jsonl.gz"
GEO = ("geoquery/geo_funql_train.tsv", "geoquery/geo_funql_test.tsv")


@pytest.fixture(scope="module")
def source():
    "The session cache's verified files and SMALL tokenizer (fetched and trained once)."
    return {f: S.data_path(f) for f in (TRAIN, *GEO)}, D.train_tokenizer(SMALL, log=None)


@pytest.fixture
def scratch(source, tmp_path, monkeypatch):
    "A scratch cache: the training corpus linked in, the geoquery files and the SMALL tokenizer copied in."
    raw, tok = source
    stamps = S.cache_dir() / "raw" / ".verified.json"  # which files were verified, by size and mtime
    cache = tmp_path / "cache"
    for file, path in raw.items():
        dest = cache / "raw" / file
        dest.parent.mkdir(parents=True, exist_ok=True)
        if file == TRAIN:
            dest.symlink_to(path)  # 110 MB: linked, not copied
        else:
            shutil.copy2(path, dest)
    shutil.copy(stamps, cache / "raw" / ".verified.json")
    shutil.copytree(tok.path.parent, cache / "tokenizers" / tok.path.parent.name)
    monkeypatch.setenv("DEPTHNB_CACHE_DIR", str(cache))
    monkeypatch.setenv("DEPTHNB_DATA_MIRROR", str(tmp_path / "no-mirror"))  # anything fetched again would fail
    return cache


def _prepared():
    "The training array of CFG: (path, tokens as an array); no memory map is left open."
    data = D.prepare_pretraining(CFG, n_ctx=64, progress=False, log=None)
    return data.train.path, np.array(data.train.tokens)


def _flip(path, at=None):
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["truncated", "overwritten"])
def test_damaged_token_file_is_rebuilt(scratch, capsys, damage):
    "The observed failure (`depthnb pretrain: mmap length is greater than file size`): a notice, a rebuild, same data."
    path, ref = _prepared()
    size = path.stat().st_size
    if damage == "truncated":  # a killed copy, a full disk
        with open(path, "r+b") as f:
            f.truncate(size // 2)
        why = rf"{size // 2:,} bytes where its record says {size:,}"
    else:  # same size, new mtime: caught by the sha256
        _flip(path)
        why = r"sha256 [0-9a-f]{12}… where its record says [0-9a-f]{12}…"
    capsys.readouterr()
    with pytest.raises(D.CacheError, match=rf"^{re.escape(str(path))} does not match its record \({why}\); not used: "
                                           r"pack_tokens or prepare_pretraining \(CLI: depthnb data --prepare "
                                           r"--preset P\) rebuilds it$"):
        D.read_tokens(path)  # the file alone: refused, never mapped
    again, tokens = _prepared()
    assert re.fullmatch(rf"depthnb: {re.escape(str(path))} does not match its record \({why}\); rebuilding it\n",
                        capsys.readouterr().err)
    assert again == path and np.array_equal(tokens, ref)
    assert json.loads(D.meta_path(path).read_text())["record"]["sha256"] == D.sha256_file(path)


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_corrupted_tokenizer_is_retrained(scratch, source, capsys, damage):
    _, tok = source
    model = scratch / "tokenizers" / tok.path.parent.name / "spm.model"
    if damage == "truncated":
        model.write_bytes(model.read_bytes()[:1000])
    else:
        _flip(model)
    with pytest.raises(D.CacheError, match=rf"^{re.escape(str(model))} does not match its record \(.*\); not used: "
                                           r"train_tokenizer\(DataConfig\(corpus='enwiki', vocab_size=400, "
                                           r"tokenizer_docs=200, tokenizer_max_sentence_length=4192\)\) retrains it$"):
        D.load_tokenizer(model)  # by path (as a fine-tuning run records it): refused
    capsys.readouterr()
    again = D.train_tokenizer(SMALL, log=None)
    err = capsys.readouterr().err
    assert err.startswith(f"depthnb: {model} does not match its record (") and err.endswith("; retraining it\n")
    assert err.count("\n") == 1  # and no second notice: the retrained model is the recorded one
    assert again.path == model and again.fingerprint == tok.fingerprint
    assert D.load_tokenizer(model).encode("a rose") == tok.encode("a rose")


def test_corrupted_fetched_file_is_fetched_again(scratch, tmp_path, monkeypatch, capsys):
    geo = scratch / "raw" / GEO[1]
    good = geo.read_bytes()
    geo.write_bytes(good[:-10])
    mirror = tmp_path / "mirror"
    (mirror / GEO[1]).parent.mkdir(parents=True)
    (mirror / GEO[1]).write_bytes(good)
    monkeypatch.setenv("DEPTHNB_DATA_MIRROR", str(mirror))
    assert S.data_path(GEO[1]).read_bytes() == good
    assert re.fullmatch(rf"depthnb: {re.escape(str(geo))} does not match the registry \(checksum mismatch: expected "
                        r"sha256 cfe0dea5\w+, got \w+\); fetching it again\n", capsys.readouterr().err)


def test_unrebuildable_cache_names_file_and_remedy(scratch, capsys):
    "A damaged token array whose corpus is gone (and no mirror): the notice, then a one-line error with the remedy."
    path, _ = _prepared()
    _flip(path, at=0)
    (scratch / "raw" / TRAIN).unlink()
    with pytest.raises(S.FetchError) as e:
        _prepared()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("1 of 1 files failed (from mirror ")
    assert f"{TRAIN}: missing in mirror " in msg and "; set DEPTHNB_DATA_MIRROR=none to download it from https://" in msg
    assert f"depthnb: {path} does not match its record (sha256 " in capsys.readouterr().err


def test_moved_cache_is_found_without_rebuilding(scratch, source, tmp_path, monkeypatch, capsys):
    "A cache copied to a new root (new mtimes, the old root deleted) is re-hashed once, not rebuilt or fetched."
    _, tok = source
    path, ref = _prepared()
    S.fetch_data(["geoquery"], progress=False)
    moved = tmp_path / "moved" / "cache"
    shutil.copytree(scratch, moved, symlinks=True, copy_function=shutil.copy)  # shutil.copy: new mtimes
    shutil.rmtree(scratch)
    monkeypatch.setenv("DEPTHNB_CACHE_DIR", str(moved))
    new = moved / path.relative_to(scratch)
    inode = new.stat().st_ino
    capsys.readouterr()
    again, tokens = _prepared()
    assert capsys.readouterr().err == ""  # every rebuild prints a notice: nothing was rebuilt
    assert again == new and new.stat().st_ino == inode and np.array_equal(tokens, ref)
    meta = json.loads(D.meta_path(new).read_text())
    assert meta["tokenizer_path"] == f"tokenizers/{tok.path.parent.name}/spm.model" and (moved / meta["tokenizer_path"]).exists()
    assert meta["record"]["file"] == new.name and meta["record"]["mtime_ns"] == new.stat().st_mtime_ns  # refreshed
    status = []
    assert S.fetch_data(["geoquery"], progress=False, log=status.append) == {f: moved / "raw" / f for f in GEO}
    assert status == [f"{f}: cached, sha256 verified" for f in GEO]  # re-hashed; the mirror does not even exist
    # a tokenizer path recorded (absolute, as fine-tuning runs do) by a checkout that has moved
    gone = tmp_path / "old-checkout" / "data" / "cache" / "tokenizers" / tok.path.parent.name / "spm.model"
    assert D.load_tokenizer(gone).path == moved / "tokenizers" / tok.path.parent.name / "spm.model"


def test_caches_from_before_records_are_adopted(scratch, source, capsys):
    "Sidecars and tokenizer folders written before records: checked by what they hold, then given a record."
    _, tok = source
    path, ref = _prepared()
    meta = json.loads(D.meta_path(path).read_text())
    D.meta_path(path).write_text(json.dumps({k: v for k, v in meta.items() if k != "record"}))
    assert np.array_equal(D.read_tokens(path), ref)
    assert json.loads(D.meta_path(path).read_text())["record"]["sha256"] == meta["record"]["sha256"]
    D.meta_path(path).write_text(json.dumps({k: v for k, v in meta.items() if k != "record"}))
    with open(path, "r+b") as f:  # no record, but n_tokens still gives the size
        f.truncate(100)
    with pytest.raises(D.CacheError, match=rf"\(100 bytes where its record says {meta['record']['size']:,}\)"):
        D.read_tokens(path)
    tmeta = scratch / "tokenizers" / tok.path.parent.name / "meta.json"
    tmeta.write_text(json.dumps({k: v for k, v in json.loads(tmeta.read_text()).items() if k != "record"}))
    assert D.train_tokenizer(SMALL, log=None).fingerprint == tok.fingerprint
    assert json.loads(tmeta.read_text())["record"]["sha256"].startswith(tok.fingerprint)
    assert capsys.readouterr().err == ""  # adopted, not rebuilt
