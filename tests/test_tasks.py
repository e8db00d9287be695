"""Tests of depthnb.tasks on the real files of the mirror: the four compositional tasks, their conventions,
strict reading of task files, and target round trips under a tokenizer."""
import shutil
from collections import Counter

import pandas as pd
import pytest

from depthnb import data as D
from depthnb import sources as S
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
    return S.data_path("cogs/dev.tsv")


def test_wrong_column_count(tmp_path, cogs_dev):
    lines = cogs_dev.read_text().split("\n")
    lines[41] = "\t".join(lines[41].split("\t")[:2])
    (tmp_path / "dev.tsv").write_text("\n".join(lines))
    with pytest.raises(T.TaskFormatError, match=r"dev.tsv:42: expected 3 tab-separated columns \(input, target, "
                                                r"category\) as on line 1, found 2"):
        T.load_tsv_task({"dev": tmp_path / "dev.tsv"})
    geo = S.data_path("geoquery/geo_funql_train.tsv").read_text().split("\n")
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
    shutil.copy(S.data_path("passivization/passiv_en_nps.dev"), tmp_path / "dev.tsv")
    dd = T.load_tsv_task([tmp_path / "dev.tsv"])
    assert len(dd["dev"]) == 1000 and set(dd["dev"]["category"]) == {"none"}



def test_task_targets_round_trip(tok):
    report = T.task_token_report(tok, limit=2000)  # the notebook's report covers every target
    assert int(report.round_trip_failures.sum()) == 0
    assert report.examples.to_dict() == {(t, s): min(n, 2000) for t, d in SIZES.items() for s, n in d.items()}
    assert (report.target_tokens_mean > 1).all()


# --- a user's own tasks: folders and hf: datasets -------------------------------------------------------

@pytest.fixture
def passiv_folder(tmp_path):
    "A task folder made from real passivization files: train and gen, no dev."
    folder = tmp_path / "passiv_mine"
    folder.mkdir()
    shutil.copy(S.data_path("passivization/passiv_en_nps.dev"), folder / "train.tsv")
    lines = S.data_path("passivization/passiv_en_nps.gen").read_text().split("\n")
    (folder / "gen.tsv").write_text("\n".join(lines[:300]) + "\n")
    return folder


def test_folder_task_holds_out_a_slice_of_train(passiv_folder):
    source = T.parse_task(str(passiv_folder))
    assert (source.kind, source.name, source.spec) == ("folder", "passiv_mine", str(passiv_folder.resolve()))
    dd = T.task_dataset(str(passiv_folder))
    assert {k: len(v) for k, v in dd.items()} == {"train": 900, T.HELD_OUT_SPLIT: 100, "gen": 300}
    assert not set(dd["train"]["input"]) & set(dd[T.HELD_OUT_SPLIT]["input"])
    assert dd[T.HELD_OUT_SPLIT]["input"] == T.task_dataset(str(passiv_folder))[T.HELD_OUT_SPLIT]["input"]  # fixed
    (passiv_folder / "dev.tsv").write_text((passiv_folder / "train.tsv").read_text().split("\n", 1)[0] + "\n")
    assert list(T.task_dataset(str(passiv_folder))) == ["train", "dev", "gen"]


def test_folder_task_errors_name_file_and_line(passiv_folder):
    lines = (passiv_folder / "train.tsv").read_text().split("\n")
    (passiv_folder / "train.tsv").write_text("\n".join(lines[:56] + [lines[56].replace("\t", " ")] + lines[57:]))
    with pytest.raises(T.TaskFormatError, match=r"passiv_mine/train.tsv:57: expected 2 tab-separated columns"):
        T.task_dataset(str(passiv_folder))
    (passiv_folder / "train.tsv").unlink()
    with pytest.raises(T.TaskFormatError, match=r"train.tsv: no such file"):
        T.task_dataset(str(passiv_folder))
    (passiv_folder / "gen.tsv").rename(passiv_folder / "train.tsv")
    with pytest.raises(T.TaskFormatError, match=r"passiv_mine: train but no dev, test or gen split"):
        T.task_dataset(str(passiv_folder))


def test_task_names_that_are_refused(tmp_path):
    (tmp_path / "geoquery").mkdir()
    with pytest.raises(T.TaskSpecError, match="its name 'geoquery' is a built-in task's"):
        T.parse_task(str(tmp_path / "geoquery"))
    with pytest.raises(T.TaskSpecError, match="unknown task 'nope'; tasks: cogs"):
        T.parse_task("nope")
    assert T.parse_task("hf:user/bench:cfg:target=lf").spec == "hf:user/bench:cfg:target=lf"
    assert T.parse_task("hf:user/bench:cfg").name == "user_bench_cfg"


def test_hf_task_from_a_saved_dataset(tmp_path):
    "hf: on a local DatasetDict written by save_to_disk: no network; columns renamed; validation read as dev."
    import datasets
    rows = T.read_tsv(S.data_path("cogs/test.tsv"))
    cols = {"sentence": [r[0] for r in rows], "lf": [r[1] for r in rows], "kind": [r[2] for r in rows]}
    parts = {"train": slice(0, 2000), "validation": slice(2000, 2500), "test": slice(2500, 3000)}
    datasets.DatasetDict({k: datasets.Dataset.from_dict({c: v[s] for c, v in cols.items()})
                          for k, s in parts.items()}).save_to_disk(str(tmp_path / "cogs_test"))
    spec = f"hf:{tmp_path / 'cogs_test'}:input=sentence:target=lf:category=kind"
    source = T.parse_task(spec)
    assert (source.kind, source.name, source.columns) == ("hf", "cogs_test", ("sentence", "lf", "kind"))
    dd = T.task_dataset(spec)
    assert {k: len(v) for k, v in dd.items()} == {"train": 2000, "dev": 500, "test": 500}
    assert (dd["test"][0]["input"], dd["test"][0]["target"], dd["test"][0]["category"]) == rows[2500]
    assert T.task_dataset(source.spec)["dev"]["target"] == dd["dev"]["target"]
    with pytest.raises(T.TaskFormatError, match="no column 'target'; columns: sentence, lf, kind"):
        T.task_dataset(f"hf:{tmp_path / 'cogs_test'}:input=sentence")
    with pytest.raises(T.TaskFormatError, match="no column 'type'"):
        T.task_dataset(f"hf:{tmp_path / 'cogs_test'}:input=sentence:target=lf:category=type")


def test_coverage_counts_unknown_characters(tok, tmp_path):
    geo = T.task_dataset("geoquery")
    cov = T.task_coverage(tok, geo, n_ctx=1024, max_new_tokens=1024)
    pieces = [p for s in list(geo["test"]["input"]) + list(geo["test"]["target"]) for p in tok.pieces(s)]
    # the 400-piece tokenizer spells FunQL's "_" in bytes: about 2% of GeoQuery's tokens
    assert cov.loc["test", "unknown_rate"] == pytest.approx(sum(p.startswith("<0x") for p in pieces) / len(pieces))
    assert cov.loc["test", "tokens"] == len(pieces) and cov.over_n_ctx.sum() == 0
    rows = T.read_tsv(S.data_path("geoquery/geo_funql_test.tsv"))
    greek = "".join(f"{x.translate(str.maketrans('aeiou', 'αειου'))}\t{y}\n" for x, y in rows)
    (tmp_path / "greek.tsv").write_text(greek)
    cov = T.task_coverage(tok, T.load_tsv_task(tmp_path / "greek.tsv"), n_ctx=16, max_new_tokens=8)
    warning = T.coverage_warnings(cov, "greek", 16, 8)
    assert cov.unknown_rate.iloc[0] > 0.2 and len(warning) == 3 and "outside the tokenizer's vocabulary" in warning[0]
    assert f"{cov.over_n_ctx.iloc[0]} example(s) are longer" in warning[1]


def test_geoquery_holds_out_what_its_sizing_chose():
    """GeoQuery has no dev split: its in-distribution split is a held-out slice of train whose size the experiment
    petty_heldout_sizing chose from a pilot's measured spread (figures/cpu/sizing_heldout.csv)."""
    from depthnb.presets import repo_root

    sizing = pd.read_csv(repo_root() / "figures" / "cpu" / "sizing_heldout.csv")
    assert sizing.task.unique().tolist() == ["geoquery"]
    assert T.HELD_OUT_EXAMPLES["geoquery"] == int(sizing.chosen.iloc[0])
    geo = T.task_dataset("geoquery")
    assert len(geo[T.HELD_OUT_SPLIT]) == T.HELD_OUT_EXAMPLES["geoquery"]
    assert len(geo["train"]) + len(geo[T.HELD_OUT_SPLIT]) == 600
