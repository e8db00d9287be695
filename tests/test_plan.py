"""depthnb.tools.plan: Saunshi's size classes, the memory model against torch's own byte counts, the runs it plans, and
`depthnb plan` on the command line."""
import math
import subprocess
import sys

import pytest
import torch

from depthnb.presets import PRESETS, SAUNSHI_CLASSES, SAUNSHI_TABLE1, STACK_STUDIES
from depthnb.config import CUDA_ATTN_IMPL, ModelConfig, override, reserved_ids
from depthnb.devices import PEAK_FLOPS
from depthnb.model import DecoderLM
from depthnb.optim import make_optimizer
from depthnb.cli.plan import cli_plan
from depthnb.tools.plan import (GPUS, USABLE_MEMORY, GiB, activation_bytes, format_plan, planned_family_runs, gpu_attn_impl,
                                matmul_params, measured_mfu, memory_per_gpu, n_params, optimizer_state_bytes, plan_table,
                                position_activation_bytes, study_runs)
from depthnb.schedules import SAUNSHI_MODELS, TABLE1_SPEEDUPS, speedup
from depthnb.solver import layer_params, model_params
from depthnb.runspecs import pretrain_config, stack_pretrain_config

SMALL = dict(d_model=32, d_attn=48, n_heads=4, d_ff=72, n_layers=2, n_vocab=300, n_ctx=40)  # no two shapes alike


def test_no_torch_on_the_import_path():
    out = subprocess.run([sys.executable, "-c", "import depthnb.tools.plan, sys; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_saunshi_classes_round_to_their_names():
    for name, sc in SAUNSHI_CLASSES.items():
        billions = int(name.removesuffix("B"))
        layers = sc.n_layers * layer_params(sc.d_model, sc.d_attn, sc.d_ff)
        assert round(layers / 1e9) == billions, (name, layers)  # the layers alone: independent of the vocabulary
        assert math.floor(model_params(sc) / 1e9) == billions, (name, model_params(sc))
    assert [model_params(sc) for sc in SAUNSHI_CLASSES.values()] == [1_289_322_496, 2_447_048_704, 8_587_608_064]


def test_saunshi_study_is_table1():
    stacked = [(m, meth, SAUNSHI_CLASSES[m].n_layers, b, a) for m, meth, b, a in SAUNSHI_TABLE1 if meth != "baseline"]
    assert stacked == [(m, meth.lower(), n, b, a) for m, meth, n, b, a, _ in TABLE1_SPEEDUPS]
    runs = {r.label: r for r in study_runs("saunshi")}
    assert len(runs) == len(STACK_STUDIES["saunshi"]) == 14
    for label, r in runs.items():
        assert r.tokens == 512 * 10**9 and r.model.n_ctx == 1280
        assert r.optimizer == ("adamw" if label.startswith("8B") else "adafactor")  # AdaFactor does not shard
        assert r.batch_size == (1024 if label.startswith("8B") else 512)
        model, method, *rest = label.split()
        assert r.model == replace_vocab(SAUNSHI_MODELS[model])
        if method != "baseline":  # the planned FLOPs are schedules' full-FLOP speedup over the baseline
            b, alpha = int(rest[0][2:]), int(rest[1][5:])
            base = runs[f"{model} baseline"]
            full = speedup(r.model.n_layers, b, alpha, op=method, flops="full", cfg=r.model,
                           total_steps=base.stages[0][1])
            assert base.train_flops / r.train_flops == pytest.approx(full, rel=1e-12)


def replace_vocab(cfg: ModelConfig) -> ModelConfig:
    from dataclasses import replace
    pc = PRESETS["saunshi"].pretrain
    return replace(cfg, n_vocab=pc.data.vocab_size + reserved_ids(pc.objective))  # 32000 pieces + UL2's 128 ids


@pytest.mark.parametrize("preset", ["tiny", "paper", "saunshi"])
def test_planned_models_are_the_trainers(preset):
    p = PRESETS[preset]
    for run in planned_family_runs(p):
        sc, n = run.label.split(" L=")
        assert run.model == pretrain_config(p, sc, int(n)).model
    if preset not in STACK_STUDIES:
        for run in study_runs(p):
            assert run.model == stack_pretrain_config(p, looped=run.label == "looped").model
    label, changes = STACK_STUDIES["saunshi"][-1]
    q = override(PRESETS["saunshi"], **changes)
    planned = {r.label: r for r in study_runs("saunshi")}[label].model
    assert planned == stack_pretrain_config(q).model and planned.n_layers == 72


@pytest.mark.parametrize("changes", [{}, {"pos_emb": "rope"}, {"share_layers": True, "n_layers": 3}])
@pytest.mark.parametrize("optimizer", ["adamw", "adafactor"])
def test_parameter_and_optimizer_bytes_are_torchs(changes, optimizer):
    cfg = ModelConfig(**{**SMALL, **changes})
    torch.manual_seed(0)
    model = DecoderLM(cfg)
    assert n_params(cfg) == sum(p.numel() for p in model.parameters())
    assert matmul_params(cfg) == sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    opt = make_optimizer(model, optimizer)
    x = torch.randint(0, cfg.n_vocab, (2, cfg.n_ctx))
    model(x, torch.randint(0, cfg.n_vocab, (2, cfg.n_ctx)))[1].backward()
    opt.step()
    state = sum(v.nbytes for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    assert optimizer_state_bytes(cfg, optimizer) == state
    assert 4 * n_params(cfg) == sum(p.nbytes for p in model.parameters())  # fp32 weights, and so fp32 gradients
    assert 4 * n_params(cfg) == sum(p.grad.nbytes for p in model.parameters())


@pytest.mark.parametrize("changes", [{}, {"n_layers": 3}, {"d_ff": 100}, {"share_layers": True, "n_layers": 3}])
def test_activation_bytes_are_the_saved_tensors(changes):
    "What autograd keeps for backward under CPU bf16 autocast (RoPE: the fused attention kernel), byte for byte."
    cfg = ModelConfig(**{**SMALL, "pos_emb": "rope", **changes})
    torch.manual_seed(0)
    model = DecoderLM(cfg)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    weight_shapes = {s for p in model.parameters() if p.ndim == 2 for s in (tuple(p.shape), tuple(p.shape)[::-1])}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), t.dtype, tuple(t.shape))
        return t

    b = 3
    x, y = torch.randint(0, cfg.n_vocab, (b, cfg.n_ctx)), torch.randint(0, cfg.n_vocab, (b, cfg.n_ctx))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        model(x, y)
    copies = sum(n for n, dtype, shape in saved.values() if dtype == torch.bfloat16 and shape in weight_shapes)
    assert copies == 2 * matmul_params(cfg)  # autocast's bf16 weight copies (counted apart from activations)
    assert sum(n for n, *_ in saved.values()) - copies == activation_bytes(cfg, b, transient=False)


def test_saunshi_8b_needs_fsdp():
    "The 8B model does not fit one 80 GB GPU under DDP, and fits under FSDP on 8."
    usable = USABLE_MEMORY * GPUS["h100"].memory_gib
    t = plan_table("saunshi", gpus=8, gpu="h100").set_index("run")
    for run in ("8B baseline", "8B midas b=9 Prop-2"):
        assert t.loc[run, "ddp_GiB"] > usable and t.loc[run, "ddp+ckpt_GiB"] > usable
        assert t.loc[run, "fsdp_GiB"] <= usable and t.loc[run, "fits"] == "fsdp"
    assert (t.loc[[r for r in t.index if not r.startswith("8B")], "fits"] == "ddp").all()
    cfg = stack_pretrain_config(override(PRESETS["saunshi"], **STACK_STUDIES["saunshi"][-1][1])).model
    one_gpu = memory_per_gpu(cfg, "adafactor", 1, gpus=1, checkpoint=True)
    assert sum(one_gpu.values()) > usable * GiB  # even alone (no DDP buckets), at one sequence, checkpointed
    assert one_gpu["weights"] + one_gpu["gradients"] + one_gpu["bf16_weights"] > usable * GiB


def test_gpu_peaks_are_the_devices():
    for g in GPUS.values():
        assert g.peak_flops == PEAK_FLOPS[g.key]


def test_measured_mfu_reads_results_md(tmp_path):
    results = tmp_path / "RESULTS.md"
    section = ("### 2026-12-01T00:00:00+00:00 · {dev} · 134M × 12 layers\n\n- hardware: {dev}\n\n"
               "| name          |   tokens_per_s |   step_ms | mfu_%   | peak_mem_GB   |\n"
               "|:--------------|---------------:|----------:|:--------|:--------------|\n"
               "| depthnb[band-cudnn-triton] |        400,000 |      80.1 | {mfu}   | 30.2          |\n"
               "| reference     |        380,000 |      84.0 | 33.0    | 31.0          |\n\n")
    results.write_text("# Benchmark results\n\n" + section.format(dev="CPU", mfu="–")
                       + section.format(dev="NVIDIA H100 80GB HBM3", mfu="35.5")
                       + section.format(dev="NVIDIA H100 80GB HBM3", mfu="41.25"))
    mfu, header = measured_mfu(GPUS["h100"], "134M", results=results)
    assert mfu == pytest.approx(0.4125) and "H100" in header  # the newest
    assert measured_mfu(GPUS["h200"], "134M", results=results) is None
    assert measured_mfu(GPUS["h100"], "374M", results=results) is None  # another size class: no record
    assert measured_mfu(GPUS["h100"], "134M", "depthnb[sdpa]", results=results) is None  # another attention
    assert measured_mfu(GPUS["h100"], "134M", results=tmp_path / "none.md") is None
    out = format_plan("paper", 8, "h100", results=results)  # each size class: its record, or assumed
    assert "MFU 41.2% for 134M, measured: benchmarks/RESULTS.md" in out
    assert "MFU 40% ASSUMED for 41M, 374M" in out
    t = plan_table("paper", 8, "h100", results=results).set_index("run")
    assert t.loc["134M L=4", "mfu"] == pytest.approx(0.4125) and t.loc["41M L=4", "mfu_source"] == "assumed"
    assert t.loc["134M L=4", "gpu_hours"] == pytest.approx(t.loc["134M L=4", "train_flops"] * 5 / (989e12 * 0.4125) / 3600)


def test_cli_plan_prints_the_plan(capsys):
    assert cli_plan(["--preset", "saunshi", "--gpus", "8", "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    assert "8B midas b=9 Prop-2" in out and "ASSUMED" in out and "no H100 measurement" in out
    assert cli_plan(["--preset", "paper", "--gpus", "16", "--gpu", "a100", "--mfu", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "MFU 30% (given with --mfu)" in out and "374M L=32" in out and "progressive" not in out  # 24/4 = 6 blocks


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "0"], "--gpus 0: out of range; allowed: integers from 1 to 65536"),
    (["--gpus", "x"], "argument --gpus: invalid int value: 'x'"),
    (["--gpu", "v100"], "--gpu v100: unknown GPU kind; kinds: h100, h200, a100"),
    (["--mfu", "1.5"], "--mfu 1.5: out of range"),
    (["--preset", "saunshi", "--gpus", "3"], "run '1B L=24': a batch of 512 sequences (PretrainConfig.batch_size) "
                                              "does not split evenly over 3 ranks"),
    (["--preset", "saunshi", "--gpus", "512"], "micro-batches of 2 (PretrainConfig.micro_batch_size) do not divide "
                                                "the 1 sequence per rank"),
    (["--preset", "nope"], "unknown preset 'nope'"),
])
def test_cli_plan_errors_are_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) if "invalid int" in message else _nothing():
        assert cli_plan(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("depthnb plan: error: ") and message in err and err.count("\n") == 1, err


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_prefix_lm_runs_are_planned_on_the_band_path():
    "attn_impl='auto' plans band attention on a GPU; UL2's prefix-LM batches too, with FlexAttention's prefix mask."
    cfg = ModelConfig()
    assert gpu_attn_impl(cfg) == CUDA_ATTN_IMPL and gpu_attn_impl(cfg, prefix_lm=True) == "band-flex"
    assert gpu_attn_impl(ModelConfig(attn_impl="sdpa"), prefix_lm=True) == "sdpa"
    dense = position_activation_bytes(ModelConfig(attn_impl="sdpa"), 1024)
    assert position_activation_bytes(cfg, 1024, prefix_lm=True) == 4 * cfg.n_heads * 1024 < dense  # the bias by distance
    assert all(r.prefix_lm for r in study_runs("saunshi")) and not any(r.prefix_lm for r in planned_family_runs("paper"))
