"MIDAS growth operators, optimizer-state copying, stage schedules and the Table 1 speedups."
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from depthnb.config import ModelConfig
from depthnb.plots import birth_stages
from depthnb.growth import grow, grow_layout
from depthnb.schedules import (SAUNSHI_MODELS, TABLE1_SPEEDUPS, speedup, stack_config, stage_depths, stage_schedule,
                               stage_weights)
from depthnb.model import DecoderLM, attention_mask_bias

CFG = ModelConfig(d_model=32, d_attn=32, n_heads=4, d_ff=48, n_layers=3, n_vocab=97, n_ctx=32)
IDX = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(0))

# (parent depth, block size, op) -> expected layout, written out by hand from the definitions
LAYOUTS = {
    (3, 1, "midas"): [0, 1, 1, 2],
    (3, 1, "gradstack"): [0, 1, 2, 2],
    (3, 1, "progressive"): [0, 1, 2, 0, 1, 2],
    (6, 2, "midas"): [0, 1, 2, 3, 2, 3, 4, 5],
    (6, 2, "gradstack"): [0, 1, 2, 3, 4, 5, 4, 5],
    (6, 2, "progressive"): [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5],
    (2, 1, "midas"): [0, 0, 1],
    (4, 1, "midas"): [0, 1, 1, 2, 3],
    (4, 2, "midas"): [0, 1, 0, 1, 2, 3],
    (1, 1, "midas"): [0, 0],
}


def model(n_layers, seed=0, **kw):
    torch.manual_seed(seed)
    return DecoderLM(replace(CFG, n_layers=n_layers, **kw))


@pytest.mark.parametrize("key", list(LAYOUTS))
def test_layouts(key):
    n, b, op = key
    assert grow_layout(n, op, b) == LAYOUTS[key]


@pytest.mark.parametrize("key", [k for k in LAYOUTS if k[0] in (3, 6)])
def test_grown_weights_equal_sources_and_share_no_storage(key):
    n, b, op = key
    parent = model(n)
    grown = grow(parent, op, b)
    assert isinstance(grown, DecoderLM) and grown.cfg.n_layers == len(LAYOUTS[key]) == len(grown.layers)
    assert parent.cfg.n_layers == n and len(parent.layers) == n  # the parent is untouched
    for j, s in enumerate(LAYOUTS[key]):
        src, dst = parent.layers[s].state_dict(), grown.layers[j].state_dict()
        assert src.keys() == dst.keys()
        assert all(torch.equal(src[k], dst[k]) for k in src)
    for name in ("embed.weight", "rel_bias.table.weight", "norm.weight", "lm_head.weight"):
        assert torch.equal(parent.state_dict()[name], grown.state_dict()[name])
    ptrs = [p.untyped_storage().data_ptr() for p in list(grown.parameters()) + list(parent.parameters())]
    assert len(ptrs) == len(set(ptrs))
    assert len({id(l) for l in grown.layers}) == len(grown.layers)


def compose(m, layers, idx):
    pos = torch.arange(idx.shape[1])
    x = m.embed(idx)
    mask = attention_mask_bias(m, pos, pos, dtype=x.dtype)
    for layer in layers:
        x = layer(x, mask, pos)
    return m.lm_head(m.norm(x))


@pytest.mark.parametrize("key", [k for k in LAYOUTS if k[0] in (3, 6)])
@pytest.mark.parametrize("pos_emb", ["t5", "rope"])
def test_grown_function_equals_hand_composition(key, pos_emb):
    n, b, op = key
    parent = model(n, pos_emb=pos_emb).eval()
    grown = grow(parent, op, b).eval()
    with torch.no_grad():
        expected = compose(parent, [parent.layers[i] for i in LAYOUTS[key]], IDX)
        assert torch.allclose(grown(IDX)[0], expected, atol=1e-5)
        # the same model built from scratch with a hand-mapped state dict
        sd = {k: v for k, v in parent.state_dict().items() if not k.startswith("layers.")}
        for j, s in enumerate(LAYOUTS[key]):
            sd.update({f"layers.{j}.{k}": v for k, v in parent.layers[s].state_dict().items()})
        fresh = DecoderLM(replace(parent.cfg, n_layers=len(LAYOUTS[key]))).eval()
        fresh.load_state_dict(sd)
        assert torch.allclose(grown(IDX)[0], fresh(IDX)[0], atol=1e-6)
        assert grown.generate(IDX[:, :4], 5).tolist() == fresh.generate(IDX[:, :4], 5).tolist()


def test_copies_train_independently():
    parent = model(3)
    grown = grow(parent, "midas", 1)
    before = {k: v.clone() for k, v in parent.state_dict().items()}
    opt = torch.optim.SGD(grown.parameters(), lr=0.5)
    grown(IDX, targets=IDX)[1].backward()
    opt.step()
    assert all(torch.equal(before[k], v) for k, v in parent.state_dict().items())
    assert not torch.equal(grown.layers[1].attn.q.weight, grown.layers[2].attn.q.weight)


def test_errors():
    with pytest.raises(ValueError, match="positive divisor of n_layers=6"):
        grow(model(6), "midas", 4)
    with pytest.raises(ValueError, match="not one of"):
        grow(model(3), "top", 1)
    with pytest.raises(ValueError, match="looped model"):
        grow(model(3, share_layers=True), "midas", 1)


def train(m, opt, steps=3):
    for _ in range(steps):
        opt.zero_grad()
        m(IDX, targets=IDX)[1].backward()
        opt.step()


def decay_groups(m):
    "Weight decay on matrices only: two groups, as a trainer typically builds them."
    named = list(m.named_parameters())
    return [{"params": [p for n, p in named if p.ndim >= 2], "weight_decay": 0.1},
            {"params": [p for n, p in named if p.ndim < 2], "weight_decay": 0.0}]


OPTIMIZERS = {
    "adamw": lambda groups: torch.optim.AdamW(groups, lr=3e-3, betas=(0.8, 0.95)),
    "adafactor": lambda groups: torch.optim.Adafactor(groups, lr=1e-2),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("key", [(3, 1, "midas"), (6, 2, "midas"), (6, 2, "gradstack"), (3, 1, "progressive")])
def test_optimizer_state_is_copied_from_sources(name, key):
    n, b, op = key
    parent = model(n)
    opt = OPTIMIZERS[name](decay_groups(parent))
    train(parent, opt)
    grown, new = grow(parent, op, b, optimizer=opt)
    assert type(new) is type(opt) and new is not opt
    parent_params = dict(parent.named_parameters())
    layout = LAYOUTS[key]
    for pname, p in grown.named_parameters():
        if pname.startswith("layers."):
            _, j, rest = pname.split(".", 2)
            sname = f"layers.{layout[int(j)]}.{rest}"
        else:
            sname = pname
        src, dst = opt.state[parent_params[sname]], new.state[p]
        assert src.keys() == dst.keys() and len(src) >= 2
        for k in src:
            assert torch.equal(src[k], dst[k]) and src[k].data_ptr() != dst[k].data_ptr()
    expected = {"adamw": {"exp_avg", "exp_avg_sq", "step"}, "adafactor": {"row_var", "col_var", "step"}}[name]
    assert set(new.state[grown.layers[-1].ffn.wo.weight]) == expected
    # groups mirror the old ones: same hyperparameters, copies join their source's group
    assert [g["weight_decay"] for g in new.param_groups] == [0.1, 0.0]
    assert [len(g["params"]) for g in new.param_groups] == [len(g["params"]) for g in decay_groups(grown)]
    assert all(p.ndim >= 2 for p in new.param_groups[0]["params"])
    assert new.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    old_state = {id(p): {k: v.clone() for k, v in st.items()} for p, st in opt.state.items()}
    train(grown, new)  # the grown optimizer steps, and the parent's optimizer is left as it was
    assert all(torch.equal(old_state[id(p)][k], v) for p, st in opt.state.items() for k, v in st.items())
    assert not torch.equal(new.state[grown.layers[0].attn.q.weight]["step"], opt.state[parent.layers[0].attn.q.weight]["step"])


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_reset_optimizer_and_step_equivalence(name):
    parent = model(3)
    opt = OPTIMIZERS[name](decay_groups(parent))
    train(parent, opt)
    grown, fresh = grow(parent, "midas", 1, optimizer=opt, reset_optimizer=True)
    assert len(fresh.state) == 0 and [g["weight_decay"] for g in fresh.param_groups] == [0.1, 0.0]
    # with copied state, one step of the grown model moves layer 0 exactly as a step of a model
    # built by hand with the same weights and a hand-copied optimizer state
    grown, carried = grow(parent, "midas", 1, optimizer=opt)
    src_named = {k: p for k, p in parent.named_parameters() if not k.startswith("layers.")}
    for j, i in enumerate((0, 1, 1, 2)):
        src_named.update({f"layers.{j}.{k}": p for k, p in parent.layers[i].named_parameters()})
    twin = DecoderLM(replace(parent.cfg, n_layers=4))
    twin.load_state_dict({k: p.detach() for k, p in src_named.items()})
    twin_opt = OPTIMIZERS[name](decay_groups(twin))
    for k, p in twin.named_parameters():
        twin_opt.state[p] = {s: v.clone() for s, v in opt.state[src_named[k]].items()}
    train(grown, carried, 1)
    train(twin, twin_opt, 1)
    for (a, p), (b, q) in zip(grown.named_parameters(), twin.named_parameters()):
        assert a == b and torch.allclose(p, q, atol=1e-7)


def test_optimizer_with_named_groups_and_foreign_params():
    parent = model(3)
    opt = torch.optim.AdamW(list(parent.named_parameters()), lr=1e-3)
    train(parent, opt, 1)
    grown, new = grow(parent, "gradstack", 1, optimizer=opt)
    assert new.param_groups[0]["param_names"] == [n for n, _ in grown.named_parameters()]
    stranger = torch.optim.AdamW(model(3, seed=1).parameters())
    with pytest.raises(ValueError, match="not parameters of `model`"):
        grow(parent, "midas", 1, optimizer=stranger)


def test_frozen_parameters_stay_out_of_the_optimizer():
    parent = model(3)
    opt = torch.optim.AdamW([p for n, p in parent.named_parameters() if not n.startswith("embed")], lr=1e-3)
    train(parent, opt, 1)
    grown, new = grow(parent, "midas", 1, optimizer=opt)
    in_opt = {id(p) for g in new.param_groups for p in g["params"]}
    assert id(grown.embed.weight) not in in_opt
    assert len(in_opt) == len(list(grown.parameters())) - 1


# ---- stage schedules and speedups ------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 10**7), k=st.integers(1, 30), alpha=st.sampled_from([0, 0.5, 1, 2, 3, 1.7]),
       kind=st.sampled_from(["prop", "uniform", "exponential"]))
def test_schedule_sums_and_rounding(total, k, alpha, kind):
    steps = stage_schedule(total, k, alpha, kind)
    assert len(steps) == k and sum(steps) == total and all(s >= 0 for s in steps)
    w = stage_weights(k, alpha, kind)
    assert all(abs(s - total * x / sum(w)) < 1 for s, x in zip(steps, w))
    if kind == "prop" and alpha > 0:
        assert steps == sorted(steps)  # deeper stages never get fewer steps


def test_schedule_values():
    assert stage_schedule(91, 6, 2) == [1, 4, 9, 16, 25, 36]
    assert stage_schedule(100, 4, 0) == [25, 25, 25, 25]
    assert stage_schedule(15, 4, 1, "exponential") == [1, 2, 4, 8]
    assert stage_schedule(2, 3, kind="uniform") == [0, 1, 1]  # leftover steps go to the later stages on ties
    with pytest.raises(ValueError, match="n_stages=0"):
        stage_schedule(10, 0)


# The eight distinct (L, b, alpha) settings of Table 1, with the exact layer-count value and the printed one.
TABLE1 = [(24, 4, 1, 18 / 13, 1.39), (24, 4, 2, 6 * 91 / 441, 1.24), (24, 4, 3, 6 * 441 / 2275, 1.16),
          (24, 3, 1, 8 * 36 / 204, 1.41), (24, 3, 2, 8 * 204 / 1296, 1.26), (48, 8, 1, 18 / 13, 1.39),
          (48, 8, 2, 6 * 91 / 441, 1.24), (72, 9, 2, 8 * 204 / 1296, 1.26)]


@pytest.mark.parametrize("n,b,alpha,exact,printed", TABLE1)
def test_table1_speedups(n, b, alpha, exact, printed):
    from decimal import ROUND_HALF_UP, Decimal
    s = speedup(n, b, alpha)
    assert s == pytest.approx(exact, abs=1e-12)
    # the printed column: the exact value rounded half-up to 3 decimals, then to 2 (1.3846 -> 1.385 -> 1.39)
    twice = Decimal(repr(s)).quantize(Decimal("0.001"), ROUND_HALF_UP).quantize(Decimal("0.01"), ROUND_HALF_UP)
    assert float(twice) == printed
    assert speedup(n, b, alpha, op="gradstack") == s
    assert speedup(n, b, alpha, total_steps=781_250) == pytest.approx(s, abs=1e-5)


def test_table1_rows_cover_the_eight_settings():
    assert {(n, b, a) for _, _, n, b, a, _ in TABLE1_SPEEDUPS} == {(n, b, a) for n, b, a, _, _ in TABLE1}


def test_full_flop_speedup():
    for n, b, alpha, exact, _ in TABLE1:
        cfg = SAUNSHI_MODELS[{24: "1B", 48: "2B", 72: "8B"}[n]]
        full = speedup(n, b, alpha, flops="full", cfg=cfg)
        assert 1 < full < exact
    # by hand: 2 stages of 1 and 2 layers, equal steps; cost = flops_per_token per depth
    from depthnb.solver import flops_per_token
    cfg = replace(CFG, n_layers=2)
    c1, c2 = (flops_per_token(replace(cfg, n_layers=d)).train for d in (1, 2))
    assert speedup(2, 1, kind="uniform", flops="full", cfg=cfg) == pytest.approx(2 * c2 / (c1 + c2))
    assert stack_config("41M", 12).d_ff == 2048 and stack_config("41M", 12).n_layers == 12
    with pytest.raises(ValueError, match="flops="):
        speedup(24, 4, flops="params")


def test_stage_depths_and_births():
    assert stage_depths(24, 4) == [4, 8, 12, 16, 20, 24]
    assert stage_depths(8, 1, "progressive") == [1, 2, 4, 8]
    assert stage_depths(24, 4, "baseline") == [24]
    with pytest.raises(ValueError, match="power of 2"):
        stage_depths(6, 1, "progressive")
    births = birth_stages(6, 1, "midas")
    assert [len(b) for b in births] == [1, 2, 3, 4, 5, 6] and sorted(births[-1]) == [1, 2, 3, 4, 5, 6]
    assert births[-1][0] == 1 and births[-1][-1] == 2  # MIDAS keeps the oldest layers at both ends


# ---- stagewise training ------------------------------------------------------------------------

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _stack_script import STACK_STEPS  # noqa: E402
from _train_common import Crash, DataHook, assert_resumed_like, records, small_config, small_data  # noqa: E402

from depthnb.config import StackConfig, override  # noqa: E402
from depthnb.presets import load_preset
from depthnb.cli.stack import cli_stack  # noqa: E402
from depthnb.schedules import stack_stages  # noqa: E402
from depthnb.stacking import measured_speedup, stack_job, stack_train  # noqa: E402
from depthnb.runs import is_done, latest_checkpoint, load_model, read_metrics  # noqa: E402
from depthnb.runspecs import stack_pretrain_config, stack_run_dir  # noqa: E402
from depthnb.optim import lr_at  # noqa: E402

STACK_SCRIPT = Path(__file__).parent / "_stack_script.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
MIDAS = StackConfig(method="midas", block_size=1)


class Steps(DataHook):
    "A `DataHook` that also records the global step of every training batch."
    def __init__(self, data, **kw):
        super().__init__(data, **kw)
        self.steps = []

    def batch(self, step, *args):
        out = super().batch(step, *args)
        self.steps.append(step)
        return out


@pytest.fixture(scope="module")
def data():
    return small_data()


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    "Uninterrupted baseline, MIDAS and looped runs of the 3-layer test model (one thread, like the subprocesses)."
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("stack")
    cfg = small_config(**STACK_STEPS)
    out = {}
    for name, config, stack in (("baseline", cfg, StackConfig(method="baseline")), ("midas", cfg, MIDAS),
                                ("looped", override(cfg, model__share_layers=True), StackConfig(method="baseline"))):
        hook = Steps(data)
        stack_train(config, stack, root / name, data=hook, progress=False)
        out[name] = (root / name, hook.steps)
    return out


def same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_same_data_same_tokens_one_schedule(runs):
    cfg = small_config(**STACK_STEPS)
    base = read_metrics(runs["baseline"][0], "train")
    for name, (run, steps) in runs.items():
        assert steps == list(range(30)), name  # the batches of global steps 0..29, once each, in order
        tr = read_metrics(run, "train")
        assert tr.step.is_unique and tr.step.is_monotonic_increasing
        assert tr.tokens.iloc[-1] == base.tokens.iloc[-1] == 30 * cfg.batch_size * cfg.model.n_ctx
        assert tr.lr.tolist() == pytest.approx([lr_at(s - 1, cfg.lr, 30, cfg.warmup_steps, cfg.min_lr_ratio) for s in tr.step])
        assert tr.loss.iloc[-1] < tr.loss.iloc[0] - 0.5, (name, tr.loss.tolist())  # every model trains
        assert read_metrics(run, "snapshot").step.tolist() == read_metrics(runs["baseline"][0], "snapshot").step.tolist()
        assert load_model(run).cfg.n_layers == 3 and is_done(run)
    stages = read_metrics(runs["midas"][0], "stage")
    assert stages.n_layers.tolist() == [1, 2, 3] and stages.start_step.tolist() == [0, 5, 15] and stages.step.tolist() == [5, 15, 30]
    assert (stages.wall_s >= stages.train_s).all() and (stages.train_s > 0).all() and not stages.resumed.any()
    assert sorted(p.name for p in runs["midas"][0].glob("stage*")) == ["stage1_L1", "stage2_L2", "stage3_L3"]
    looped = load_model(runs["looped"][0])
    assert len({id(l) for l in looped.layers}) == 1 and looped.num_params() < load_model(runs["baseline"][0]).num_params()


@pytest.mark.slow  # trains in two subprocesses
def test_resume_after_sigkill_in_stage_two_is_bit_identical(runs, tmp_path):
    run = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, str(STACK_SCRIPT), str(run), "--sleep", "0.1"], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while not list((run / "stage2_L2" / "checkpoints").glob("*.sha256")):
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.time() < deadline, "stage 2 wrote no checkpoint within 120 s"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert is_done(run / "stage1_L1") and not is_done(run / "stage2_L2") and not is_done(run)
    assert latest_checkpoint(run / "stage2_L2")[1]["step"] == 10
    out = subprocess.run([sys.executable, str(STACK_SCRIPT), str(run)], env=ENV, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "resuming from step_00000010.pt" in out.stdout and "stage 1/3" not in out.stdout
    assert same_weights(load_model(run), load_model(runs["midas"][0]))
    assert read_metrics(run, "train").loss.tolist() == read_metrics(runs["midas"][0], "train").loss.tolist()
    assert read_metrics(run, "stage").resumed.tolist() == [False, True, False]
    # stage 2 went on from its step-10 checkpoint, grew into stage 3 at step 15, and wrote what the uninterrupted
    # run wrote (stage records aside from their timings and `resumed`)
    assert_resumed_like(run, runs["midas"][0], at=[10])
    drop = lambda recs: [{k: v for k, v in r.items() if k != "resumed"} for r in recs]
    assert drop(records(run, ("stage",))) == drop(records(runs["midas"][0], ("stage",)))


@pytest.mark.parametrize("crash_at, resumed_at", [(15, []), (22, [20])])
def test_crash_in_the_last_stage_regrows_or_resumes(runs, data, tmp_path, crash_at, resumed_at):
    """Killed at stage 3's first step, before its first checkpoint: the grown model is rebuilt from the previous stage's
    end state (no resume); killed after its step-20 checkpoint: stage 3 resumes from it. Either way the run ends as
    the uninterrupted one, with the same records and snapshots."""
    torch.set_num_threads(1)
    run = tmp_path / "crashed"
    with pytest.raises(Crash):
        stack_train(small_config(**STACK_STEPS), MIDAS, run, data=DataHook(data, crash_at=crash_at), progress=False)
    assert is_done(run / "stage2_L2") and not is_done(run / "stage3_L3")
    assert (run / "stage3_L3" / "checkpoints").exists() == bool(resumed_at)
    model = stack_train(small_config(**STACK_STEPS), MIDAS, run, data=data, progress=False)
    assert same_weights(model, load_model(runs["midas"][0]))
    assert_resumed_like(run, runs["midas"][0], at=resumed_at)
    assert read_metrics(run, "stage").resumed.tolist() == [False, False, bool(resumed_at)]
    with pytest.raises(ValueError, match="config.lr"):
        stack_train(small_config(**STACK_STEPS, lr=0.1), MIDAS, run, data=data, progress=False)


def test_empty_stages_and_refusals(data, tmp_path):
    torch.set_num_threads(1)
    cfg = small_config(steps=3, ckpt_every=5, log_every=1, eval_every=5, n_snapshots=1, model__n_layers=4)
    assert [s.steps for s in stack_stages(cfg, MIDAS)] == [0, 1, 1, 1]
    model = stack_train(cfg, MIDAS, tmp_path / "short", data=data, progress=False)
    assert model.cfg.n_layers == 4 and read_metrics(tmp_path / "short", "stage").n_layers.tolist() == [2, 3, 4]
    with pytest.raises(ValueError, match="looped model"):
        stack_train(override(cfg, model__share_layers=True), MIDAS, tmp_path / "looped", data=data, progress=False)


def test_measured_speedup(runs):
    m = measured_speedup(runs["baseline"][0], runs["midas"][0])
    cfg = small_config(**STACK_STEPS)
    assert m["flop_speedup_layers"] == pytest.approx(30 * 3 / (5 * 1 + 10 * 2 + 15 * 3))
    assert m["flop_speedup"] == pytest.approx(speedup(3, 1, 1.0, flops="full", cfg=cfg.model, total_steps=30))
    assert m["wall_speedup"] == pytest.approx(m["baseline_wall_s"] / m["stacked_wall_s"])
    assert m["efficiency"] == pytest.approx(m["wall_speedup"] / m["flop_speedup"])
    assert measured_speedup(runs["baseline"][0], runs["looped"][0])["flop_speedup"] == 1.0
    with pytest.raises(ValueError, match="not the baseline"):
        measured_speedup(runs["midas"][0], runs["baseline"][0])


def test_tiny_preset_midas_and_baseline_train_on_cpu(tmp_path):
    "The tiny preset's stacking study (4 layers, b=1, Prop-1), shortened to 30 steps: both losses fall."
    torch.set_num_threads(1)
    P = load_preset("tiny", runs_dir=str(tmp_path), pretrain__steps=30, pretrain__eval_sequences=8,
                    pretrain__n_snapshots=2)
    for method in ("baseline", "midas"):
        run = Path(stack_job(P, method))
        assert run == stack_run_dir(P, method) and is_done(run)
        tr = read_metrics(run, "train")
        assert tr.loss.iloc[-1] < tr.loss.iloc[0] - 1.0, (method, tr.loss.tolist())
    assert stack_pretrain_config(P).model.d_ff == 256  # the tiny class's baseline width, not the solver's
    assert read_metrics(stack_run_dir(P, "midas"), "stage").n_layers.tolist() == [1, 2, 3, 4]
    assert stack_job(P, "midas") == str(stack_run_dir(P, "midas"))  # finished: found, not retrained
    assert cli_stack(["--preset", "tiny", "--set", f"runs_dir={tmp_path}", "--set", "pretrain.steps=30",
                      "--set", "pretrain.eval_sequences=8", "--set", "pretrain.n_snapshots=2", "--method", "midas"]) == 0


def test_block_size_error_names_the_operator():
    with pytest.raises(ValueError, match=r"^grow gradstack: block_size=4 must be a positive divisor of n_layers=6$"):
        grow_layout(6, "gradstack", 4)


def test_grow_optimizer_called_directly_copies_the_state():
    "`grow_optimizer`'s defaults: the state is carried over and the layers are `model.layers`."
    from depthnb.growth import grow_model, grow_optimizer

    parent = model(3)
    opt = torch.optim.AdamW(parent.parameters(), lr=3e-3)
    train(parent, opt, 1)
    layout = grow_layout(3, "midas", 1)
    grown = grow_model(parent, layout)
    new = grow_optimizer(opt, parent, grown, layout)
    assert len(new.state) == len(list(grown.parameters()))
    src = opt.state[parent.layers[1].attn.q.weight]["exp_avg"]
    for j in (1, 2):  # both copies of layer 1 carry its moments
        assert torch.equal(new.state[grown.layers[j].attn.q.weight]["exp_avg"], src)
    assert not torch.equal(src, opt.state[parent.layers[2].attn.q.weight]["exp_avg"])


def _assert_equal_and_independent(a, b, where):
    "`a` equals `b` and shares no tensor storage or mutable container with it."
    assert type(a) is type(b), where
    if torch.is_tensor(a):
        assert torch.equal(a, b) and a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr(), where
    elif isinstance(a, (list, dict)):
        assert a is not b and len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a.values(), b.values()) if isinstance(a, dict) else zip(a, b)):
            _assert_equal_and_independent(x, y, f"{where}[{k}]")
    else:
        assert a == b, where


def test_grown_optimizer_shares_no_state_with_the_parents():
    """Whatever the state holds (tensors, numbers, lists of tensors: L-BFGS's history) and a tensor learning rate,
    the grown optimizer owns copies: changing them in place, as optimizers and schedulers do, leaves the parent's
    optimizer as it was."""
    parent = model(3)
    opt = torch.optim.LBFGS(parent.parameters(), lr=0.1, history_size=5, max_iter=4)

    def closure(m, o):
        def f():
            o.zero_grad()
            loss = m(IDX, targets=IDX)[1]
            loss.backward()
            return loss
        return f
    opt.step(closure(parent, opt))
    grown, new = grow(parent, "midas", 1, optimizer=opt)
    (old_state,), (new_state,) = opt.state.values(), new.state.values()  # L-BFGS keeps its state on one tensor
    assert {type(v).__name__ for v in old_state.values()} >= {"Tensor", "int", "list"} and old_state["old_dirs"]
    _assert_equal_and_independent(new_state, old_state, "state")
    new_state["old_dirs"].append(torch.zeros(1))  # L-BFGS extends its history in place
    assert len(new_state["old_dirs"]) == len(old_state["old_dirs"]) + 1

    opt = torch.optim.AdamW(parent.parameters(), lr=torch.tensor(0.01))
    train(parent, opt, 1)
    grown, new = grow(parent, "midas", 1, optimizer=opt)
    torch.optim.lr_scheduler.LambdaLR(new, lambda step: 0.5)  # writes the tensor rate in place
    assert new.param_groups[0]["lr"].item() == pytest.approx(0.005)
    assert opt.param_groups[0]["lr"].item() == pytest.approx(0.01)
    assert new.defaults["lr"] is not opt.defaults["lr"] and new.defaults["lr"].item() == pytest.approx(0.01)
