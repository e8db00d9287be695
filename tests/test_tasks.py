"""Tests of depthnb.tasks on the real files of the mirror: the four compositional tasks, their conventions,
strict reading of task files, and target round trips under a tokenizer."""
import shutil
from collections import Counter

import pytest

from depthnb import data as D
from depthnb import tasks as T
from depthnb.config import DataConfig

SMALL = DataConfig(corpus="enwiki", vocab_size=400, tokenizer_docs=200)  # tests/test_data.py's tokenizer


@pytest.fixture(scope="session")
def tok():
    return D.train_tokenizer(SMALL, log=None)


@pytest.fixture(scope="session")
def tasks():
    return {name: T.load_task(name) for name in T.TASKS}


# --- the four tasks --------------------------------------------------------------------------------

SIZES = {"cogs": {"train": 24155, "dev": 3000, "test": 3000, "gen": 21000},
         "cogs_vf": {"train": 24155, "dev": 3000, "test": 3000, "gen": 21000},
         "geoquery": {"train": 600, "test": 280},
         "passivization": {"train": 100000, "dev": 1000, "test": 10000, "gen": 10000}}


def test_every_split_has_the_documented_size(tasks):
    assert {n: {s: len(d) for s, d in dd.items()} for n, dd in tasks.items()} == SIZES
    for dd in tasks.values():
        for ds in dd.values():
            assert ds.column_names == ["input", "target", "category", "generalization_type"]


@pytest.mark.parametrize("name", ["cogs", "cogs_vf"])
def test_cogs_categories(tasks, name):
    train = Counter(tasks[name]["train"]["category"])
    assert train["in_distribution"] == 24000 and train["primitive"] == 143
    assert sum(v for k, v in train.items() if k.startswith("exposure_example_")) == 12
    gen = tasks[name]["gen"].to_pandas()
    kinds = gen.groupby("generalization_type").category.unique()
    assert len(kinds["lexical"]) == 18 and sorted(kinds["structural"]) == sorted(T.COGS_STRUCTURAL)
    assert (gen.category.value_counts() == 1000).all()
    assert set(tasks[name]["dev"]["generalization_type"]) == {"in_distribution"}


def test_cogs_vf_primitive_rule(tasks):
    vf = tasks["cogs_vf"]["train"].to_pandas()
    prim = vf[vf.category == "primitive"]
    assert (prim.input == prim.target).all() and (prim.input.str.count(" ") == 0).all()
    raw = T.load_task("cogs_vf", splits=["train"], primitive_rule=False)["train"].to_pandas()
    raw_prim = raw[raw.category == "primitive"]
    assert (raw_prim.target.str.startswith("LAMBDA")).sum() == 122
    assert (raw.target != vf.target).sum() == 122  # the rule changes exactly the lambda primitives


def test_geoquery_anonymization_on_real_questions(tasks):
    test = tasks["geoquery"]["test"]
    i = test["input"].index("which states have cities named m0")
    assert test[i]["target"] == "answer ( intersection ( state , loc_1 ( intersection ( city , m0 ) ) ) )"
    raw = T.load_task("geoquery", anonymize=False, normalize=False)
    assert raw["test"][i]["input"] == "which states have cities named austin"
    assert raw["test"][i]["target"] == "answer(state(loc_1(city(cityid('austin', _)))))"
    train = tasks["geoquery"]["train"]
    j = raw["train"]["input"].index("what is the population of austin texas")
    assert (train[j]["input"], train[j]["target"]) == ("what is the population of m0", "answer ( population_1 ( m0 ) )")
    two = [k for k, x in enumerate(train["input"]) if "m1" in x.split()]
    assert len(two) == 6
    for k in two:
        assert {"m0", "m1"} <= set(train[k]["target"].split())
    for split in ("train", "test"):  # every entity of every query is found in its question
        assert not any("'" in y for y in tasks["geoquery"][split]["target"])
        for x, y in zip(tasks["geoquery"][split]["input"], tasks["geoquery"][split]["target"]):
            assert {t for t in y.split() if t in ("m0", "m1")} == {t for t in x.split() if t in ("m0", "m1")}
    unanon = T.load_task("geoquery", anonymize=False)["test"][i]
    assert unanon["target"] == "answer ( intersection ( state , loc_1 ( intersection ( city , cityid ( 'austin' , _ ) ) ) ) )"


def test_passivization_keeps_task_token(tasks):
    train = tasks["passivization"]["train"].to_pandas()
    assert train.category.value_counts().to_dict() == {"decl": 67265, "passiv": 32735}
    assert (train.input.str.split().str[-1] == train.category).all()
    assert Counter(tasks["passivization"]["test"]["category"]) == {"decl": 6693, "passiv": 3307}
    assert set(tasks["passivization"]["gen"]["generalization_type"]) == {"structural"}


def test_petty_table1():
    t = T.petty_table1()
    assert list(t.index) == ["COGS", "COGS-vf", "GeoQuery", "English Passivization"]
    assert t.loc["COGS-vf", "y"] == "eat ( agent = hedgehog , theme = * cake ( nmod . on = * bed ) )"


def test_load_task_rejects_unknown():
    with pytest.raises(ValueError, match="task='scan' is not one of"):
        T.load_task("scan")
    with pytest.raises(ValueError, match="split of geoquery='gen' is not one of \\['train', 'test'\\]"):
        T.load_task("geoquery", splits=["gen"])


# --- malformed files (corrupted copies of real files) ---------------------------------------------------

@pytest.fixture
def cogs_dev():
    return D.data_path("cogs/dev.tsv")


def test_wrong_column_count(tmp_path, cogs_dev):
    lines = cogs_dev.read_text().split("\n")
    lines[41] = "\t".join(lines[41].split("\t")[:2])
    (tmp_path / "dev.tsv").write_text("\n".join(lines))
    with pytest.raises(T.TaskFormatError, match=r"dev.tsv:42: expected 3 tab-separated columns \(input, target, "
                                                r"category\) as on line 1, found 2"):
        T.load_tsv_task({"dev": tmp_path / "dev.tsv"})
    geo = D.data_path("geoquery/geo_funql_train.tsv").read_text().split("\n")
    geo[9] += "\textra\tcolumns"
    (tmp_path / "geo.tsv").write_text("\n".join(geo))
    with pytest.raises(T.TaskFormatError, match=r"geo.tsv:10: expected 2 tab-separated columns"):
        T.read_tsv(tmp_path / "geo.tsv", columns=(2,))


def test_empty_field(tmp_path, cogs_dev):
    lines = cogs_dev.read_text().split("\n")
    x, y, c = lines[99].split("\t")
    lines[99] = f"{x}\t \t{c}"
    (tmp_path / "dev.tsv").write_text("\n".join(lines))
    with pytest.raises(T.TaskFormatError, match=r"dev.tsv:100: column 2 \(target\) is empty"):
        T.load_tsv_task(tmp_path / "dev.tsv")
    lines.insert(5, "")
    (tmp_path / "blank.tsv").write_text("\n".join(lines))
    with pytest.raises(T.TaskFormatError, match=r"blank.tsv:6: expected 3 tab-separated"):
        T.load_tsv_task(tmp_path / "blank.tsv")


def test_undecodable_bytes(tmp_path, cogs_dev):
    raw = cogs_dev.read_bytes()
    at = raw.index(b"\n", 5000) + 3
    (tmp_path / "dev.tsv").write_bytes(raw[:at] + b"\xc3\x28" + raw[at:])
    line = raw[:at].count(b"\n") + 1
    with pytest.raises(T.TaskFormatError, match=rf"dev.tsv:{line}: not valid UTF-8 \(byte 0xc3 at offset {at}\)"):
        T.load_tsv_task(tmp_path / "dev.tsv")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.tsv: no such task file"):
        T.load_tsv_task({"train": tmp_path / "nope.tsv"})


def test_user_task_loads(tmp_path):
    shutil.copy(D.data_path("passivization/passiv_en_nps.dev"), tmp_path / "dev.tsv")
    dd = T.load_tsv_task([tmp_path / "dev.tsv"])
    assert len(dd["dev"]) == 1000 and set(dd["dev"]["category"]) == {"none"}



def test_task_targets_round_trip(tok):
    report = T.task_token_report(tok, limit=2000)  # the notebook's report covers every target
    assert int(report.round_trip_failures.sum()) == 0
    assert report.examples.to_dict() == {(t, s): min(n, 2000) for t, d in SIZES.items() for s, n in d.items()}
    assert (report.target_tokens_mean > 1).all()
