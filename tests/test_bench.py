"The benchmark CLI at a CI-sized shape, and the attention paths it compares (FlexAttention vs SDPA)."
import json
from dataclasses import replace

import pytest
import torch

from depthnb.tools.scenarios import BenchConfig, bench_model_config
from depthnb.tools.bench import summarize
from depthnb.cli.bench import cli_bench
from depthnb.config import ModelConfig
from depthnb.model import CAUSAL, DecoderLM, FlexMask, attention_mask_bias, flex_mask, layer_mask
from depthnb.solver import flops_per_token
from depthnb.devices import PEAK_FLOPS

SMALL = ModelConfig(d_model=48, d_attn=48, n_heads=4, d_ff=64, n_layers=2, n_vocab=101, n_ctx=64)


def test_cli_bench_cpu_records_both_models(tmp_path):
    results, out = tmp_path / "RESULTS.md", tmp_path / "run.json"
    argv = ["--device", "cpu", "--n-ctx", "32", "--batch", "2", "--steps", "1", "--rounds", "2", "--decode-rounds", "2",
            "--new-tokens", "4", "--record", str(results), "--json", str(out), "--note", "pytest"]
    assert cli_bench(argv) == 0
    run = json.loads(out.read_text())
    summary = {row["name"]: row for row in run["summary"]}
    assert set(summary) == {"depthnb[sdpa]", "reference"}
    assert len(run["train"]) == 2 * 2 and [r["name"] for r in run["train"][:2]] == ["depthnb[sdpa]", "reference"]
    for row in summary.values():
        assert row["tokens_per_s"] > 0 and row["decode_tokens_per_s"] > 0 and row["mfu"] is None  # no MFU on CPU
    ours, ref = summary["depthnb[sdpa]"], summary["reference"]
    assert ours["ratio"] == pytest.approx(ours["tokens_per_s"] / ref["tokens_per_s"])
    assert ours["decode_ratio"] == pytest.approx(ours["decode_tokens_per_s"] / ref["decode_tokens_per_s"])
    assert run["config"]["n_ctx"] == 32 and run["config"]["size_class"] == "tiny"
    text = results.read_text()
    assert text.startswith("# Benchmark results") and f"torch {torch.__version__}" in text and "pytest" in text
    assert "torch.compile off (default on the CPU for runs of >= 300 steps; this one has 3)" in text
    assert "eager (no torch.compile)" in text  # decoding
    assert cli_bench(argv[:-2]) == 0  # a second run appends a second section
    assert results.read_text().count("\n### ") == 2


def test_cli_bench_rejects_bad_arguments(capsys):
    for argv, message in [(["--attn-impl", "xformers"], "'xformers' is not one of"),
                          (["--parts", "train,fly"], "unknown part 'fly'; parts: train, decode, cogs, midas"),
                          (["--batch", "3", "--paper-batch"], "must divide the paper's global batch 128")]:
        assert cli_bench(["--device", "cpu", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("depthnb bench: error: ") and message in err and err.count("\n") == 1, err


def test_cli_bench_midas_and_cogs_parts(tmp_path):
    out = tmp_path / "run.json"
    gen = tmp_path / "gen.tsv"
    gen.write_text("A cat ran .\tcat ( x _ 1 ) AND run . agent ( x _ 2 , x _ 1 )\tcat\nEmma slept .\tsleep . agent ( x _ 1 , Emma )\tx\n")
    assert cli_bench(["--device", "cpu", "--parts", "midas,cogs", "--layers", "2", "--midas-steps", "3",
                      "--cogs-tsv", str(gen), "--cogs-batch", "2", "--json", str(out)]) == 0
    extra = json.loads(out.read_text())["extra"]
    midas = extra["midas_wall_clock"]
    assert [(s["depth"], s["steps"]) for s in midas["stages"]] == [(1, 1), (2, 2)]  # Prop-1 over 3 steps
    assert midas["wall_speedup"] == pytest.approx(midas["baseline_s"] / midas["stacked_s"])
    cogs = extra["cogs_gen_decoding"]
    assert "whitespace token counts" in cogs["source"]
    assert cogs["depthnb"]["decoded_tokens"] == 2 * (19 + 1) and cogs["depthnb"]["batches"] == 1  # longest answer + <eos>


def test_mfu_uses_solver_flops_and_peak_table():
    import pandas as pd
    bc = BenchConfig(size_class="134M", n_layers=12, n_ctx=1024, batch=16, steps=10)
    train = pd.DataFrame(dict(round=[0], name=["reference"], seconds=[2.0], peak_bytes=[None]))
    s = summarize(bc, train, pd.DataFrame(), peak=PEAK_FLOPS["H100"])
    tokens_per_s = 10 * 16 * 1024 / 2.0
    expected = tokens_per_s * flops_per_token(bench_model_config(bc), 1024).train / 989e12
    assert s.loc["reference", "mfu"] == pytest.approx(expected)


def test_layer_mask_chooses_the_fast_path_only_where_it_is_exact():
    pos = torch.arange(10)
    flex = DecoderLM(replace(SMALL, attn_impl="flex"))
    assert isinstance(layer_mask(flex, pos, pos), torch.Tensor)  # FlexAttention acts on CUDA only
    rope = DecoderLM(replace(SMALL, pos_emb="rope"))
    assert layer_mask(rope, pos, pos) == CAUSAL
    assert isinstance(layer_mask(rope, pos, pos, key_padding=torch.ones(1, 10)), torch.Tensor)  # padding
    assert isinstance(layer_mask(rope, pos[9:], pos), torch.Tensor)  # a cached decoding step
    assert isinstance(layer_mask(DecoderLM(SMALL), pos, pos), torch.Tensor)  # the T5 bias under SDPA


def test_causal_fast_path_matches_additive_mask_in_training():
    torch.manual_seed(0)
    m = DecoderLM(replace(SMALL, pos_emb="rope"))
    idx = torch.randint(0, SMALL.n_vocab, (2, 16))
    loss = m(idx, targets=idx)[1]
    grads = torch.autograd.grad(loss, list(m.parameters()))
    pos = torch.arange(16)
    x = m.embed(idx)
    mask = attention_mask_bias(m, pos, pos)
    for layer in m.layers:
        x = layer(x, mask, pos)
    ref = torch.nn.functional.cross_entropy(m.lm_head(m.norm(x)).flatten(0, 1), idx.flatten())
    ref_grads = torch.autograd.grad(ref, list(m.parameters()))
    torch.testing.assert_close(loss, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-4)


@pytest.fixture(scope="module")
def compiles():
    try:
        torch.compile(lambda x: x * 2)(torch.ones(2))
    except Exception as e:  # no C++ compiler, unsupported platform, ...
        pytest.skip(f"torch.compile is unavailable here: {type(e).__name__}: {e}")


def _layers(model, idx, mask):
    "Logits of `model` with every layer attending under `mask`."
    pos = torch.arange(idx.shape[1])
    x = model.embed(idx)
    for layer in model.layers:
        x = layer(x, mask, pos)
    return model.lm_head(model.norm(x))


@pytest.mark.parametrize("opts", [dict(), dict(pos_emb="rope", share_layers=True)], ids=["t5", "rope-looped"])
def test_flex_forward_matches_sdpa_on_cpu(compiles, opts):
    torch.manual_seed(0)
    cfg = replace(SMALL, d_attn=96, n_heads=2, attn_impl="flex", **opts)  # d_head 48: not a power of two
    model = DecoderLM(cfg).eval()
    if model.rel_bias is not None:
        torch.nn.init.normal_(model.rel_bias.table.weight, std=1.0)  # a bias large enough to matter
    idx = torch.randint(0, cfg.n_vocab, (2, 40))
    with torch.no_grad():
        flex = _layers(model, idx, flex_mask(model, 40, torch.device("cpu")))
        torch.testing.assert_close(flex, model(idx)[0], atol=1e-4, rtol=1e-4)  # model(): SDPA on the CPU


def test_compiled_training_matches_eager_on_cpu(compiles):
    # compiled, the projections run as one product and the loss is F.cross_entropy (nbs/02_model): same values
    torch.manual_seed(0)
    model = DecoderLM(replace(SMALL, n_ctx=64))
    torch.nn.init.normal_(model.rel_bias.table.weight, std=1.0)
    idx = torch.randint(0, SMALL.n_vocab, (2, 64))
    targets = idx.clone()
    targets[:, :8] = -100  # positions that do not count, as in fine-tuning
    results = []
    for forward in (model, torch.compile(model)):
        loss = forward(idx, targets=targets)[1]
        results.append((loss, torch.autograd.grad(loss, list(model.parameters()))))
    (eager, eager_grads), (compiled, compiled_grads) = results
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
    for (name, _), g, r in zip(model.named_parameters(), compiled_grads, eager_grads):
        torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-4, msg=lambda m: f"{name}: {m}")


# ---- CUDA (skipped without a GPU) -------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("d_attn,n_heads", [(384, 4), (256, 16)], ids=["d_head96", "d_head16"])
def test_flex_training_matches_sdpa_on_cuda(d_attn, n_heads):
    torch.manual_seed(0)
    cfg = replace(SMALL, d_model=128, d_attn=d_attn, n_heads=n_heads, n_ctx=256, n_vocab=512)
    with torch.device("cuda"):
        sdpa, flex = DecoderLM(cfg), DecoderLM(replace(cfg, attn_impl="flex"))
    torch.nn.init.normal_(sdpa.rel_bias.table.weight, std=1.0)
    flex.load_state_dict(sdpa.state_dict())
    idx = torch.randint(0, cfg.n_vocab, (2, 256), device="cuda")
    assert isinstance(layer_mask(flex, torch.arange(256, device="cuda"), torch.arange(256, device="cuda")), FlexMask)
    losses = [m(idx, targets=idx)[1] for m in (sdpa, flex)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0], atol=1e-4, rtol=1e-4)
    for (name, p), q in zip(sdpa.named_parameters(), flex.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-4, rtol=2e-3, msg=lambda m: f"{name}: {m}")


@pytest.mark.gpu
def test_compiled_flex_trains_in_bf16_on_cuda():
    from depthnb.devices import autocast
    from depthnb.optim import make_optimizer, train_step
    torch.manual_seed(0)
    cfg = replace(SMALL, d_model=128, d_attn=128, n_heads=4, n_ctx=256, n_vocab=512)
    dev = torch.device("cuda")
    with torch.device(dev):
        sdpa, flex = DecoderLM(cfg), DecoderLM(replace(cfg, attn_impl="flex"))
    flex.load_state_dict(sdpa.state_dict())
    x = torch.randint(0, cfg.n_vocab, (4, 257), device=dev)
    batches = [(x[:, :-1], x[:, 1:])]
    losses = {}
    for name, m in (("sdpa", sdpa), ("flex", flex)):
        opt = make_optimizer(m, lr=1e-3, fused=True)
        fwd = torch.compile(m)
        losses[name] = [train_step(fwd, opt, batches, 1.0, lambda: autocast(dev, True))[0].item() for _ in range(5)]
    assert losses["flex"][-1] < losses["flex"][0]
    assert losses["flex"] == pytest.approx(losses["sdpa"], rel=2e-2)


@pytest.mark.gpu
def test_cli_bench_cuda_tiny(tmp_path):
    out = tmp_path / "run.json"
    assert cli_bench(["--device", "cuda", "--size-class", "tiny", "--layers", "2", "--n-ctx", "256", "--batch", "4",
                      "--steps", "2", "--warmup", "2", "--rounds", "2", "--decode-rounds", "1", "--json", str(out)]) == 0
    summary = {row["name"]: row for row in json.loads(out.read_text())["summary"]}
    assert set(summary) == {"depthnb[sdpa]", "depthnb[flex]", "reference"}
    assert all(row["peak_mem_GB"] > 0 for row in summary.values())


def test_generation_is_unchanged_by_flex_config():
    "Decoding never takes the flex path (it passes a padding mask), so it matches the SDPA model token for token."
    torch.manual_seed(0)
    sdpa = DecoderLM(SMALL).eval()
    flex = DecoderLM(replace(SMALL, attn_impl="flex")).eval()
    flex.load_state_dict(sdpa.state_dict())
    idx = torch.randint(3, SMALL.n_vocab, (2, 5))
    assert torch.equal(flex.generate(idx, 6), sdpa.generate(idx, 6))
    assert torch.equal(flex.generate(idx, 6), flex.generate(idx, 6, use_cache=False))
