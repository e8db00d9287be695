"""depthnb with Hugging Face causal LMs: growth of Llama, Qwen2 and GPT-2 models built from configs (nothing is
downloaded), their optimizer state, stagewise training with resumption, and the equal-parameter solver."""
import pytest

pytest.importorskip("transformers")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config  # noqa: E402

from depthnb.growth import grow, grow_layout  # noqa: E402
from depthnb.hf import (HFCausalLM, build_hf, decoder_layers, ffn_field, ffn_width, hf_config_with,  # noqa: E402
                        hf_depth_config, hf_family, hf_param_count, load_hf_config)

TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)
CONFIGS = {
    "llama": lambda: LlamaConfig(**TINY),
    "qwen2": lambda: Qwen2Config(**TINY),  # tied embeddings, q/k/v biases
    # sliding-window attention on the upper half of the layers: per-layer types and windows
    "qwen2-sliding": lambda: Qwen2Config(**TINY, use_sliding_window=True, sliding_window=3, max_window_layers=2),
    "gpt2": lambda: GPT2Config(vocab_size=97, n_embd=32, n_layer=4, n_head=4, n_positions=64, bos_token_id=0,
                               eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
}
CASES = [(arch, op, b) for arch in CONFIGS for op, b in (("midas", 1), ("midas", 2), ("gradstack", 2), ("progressive", None))]


def model_of(arch: str, seed: int = 0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(CONFIGS[arch]()).eval()


def layer_type_list(config):
    return list(config.layer_types) if getattr(config, "layer_types", None) is not None else None


@pytest.mark.parametrize("arch,op,b", CASES)
def test_grown_layers_config_and_layer_indices(arch, op, b):
    model = model_of(arch)
    name, layers = decoder_layers(model)
    layout = grow_layout(4, op, b)
    grown = grow(model, op, b)
    _, new_layers = decoder_layers(grown)
    assert type(grown) is type(model) and len(new_layers) == len(layout)
    assert grown.config.num_hidden_layers == len(layout) and model.config.num_hidden_layers == 4
    for j, s in enumerate(layout):
        a, b_ = new_layers[j].state_dict(), layers[s].state_dict()
        assert a.keys() == b_.keys() and all(torch.equal(a[k], b_[k]) for k in a), (j, s)
        assert all(p.data_ptr() != q.data_ptr() for p in new_layers[j].parameters() for q in model.parameters())
        assert {m.layer_idx for m in new_layers[j].modules() if hasattr(m, "layer_idx")} == {j}
    if layer_type_list(model.config) is not None:
        assert layer_type_list(grown.config) == [model.config.layer_types[s] for s in layout]
    # everything outside the layers is carried over unchanged
    outside = {k: v for k, v in model.state_dict().items() if not k.startswith(name + ".")}
    assert all(torch.equal(grown.state_dict()[k], v) for k, v in outside.items())


@pytest.mark.parametrize("arch", CONFIGS)
def test_grown_model_runs_generates_with_the_cache_and_reloads(arch, tmp_path):
    grown = grow(model_of(arch), "midas", 1)
    idx = torch.randint(1, 97, (2, 7))
    with torch.no_grad():
        logits = grown(input_ids=idx).logits
        assert logits.shape == (2, 7, 97) and torch.isfinite(logits).all()
        kw = dict(max_new_tokens=8, do_sample=False, min_new_tokens=8, pad_token_id=0)
        cached = grown.generate(idx, use_cache=True, **kw)
        plain = grown.generate(idx, use_cache=False, **kw)
    assert cached.shape == (2, 15) and torch.equal(cached, plain)  # the KV cache's slots follow the layers
    grown.save_pretrained(tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert back.config.num_hidden_layers == 5 and layer_type_list(back.config) == layer_type_list(grown.config)
    with torch.no_grad():
        assert torch.equal(back(input_ids=idx).logits, logits)


def test_sliding_window_layers_keep_their_windows():
    model = model_of("qwen2-sliding")
    assert model.config.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
    for op, layout in (("midas", [0, 1, 0, 1, 2, 3]), ("gradstack", [0, 1, 2, 3, 2, 3])):
        assert grow_layout(4, op, 2) == layout
        grown = grow(model, op, 2)
        windows = [layer.self_attn.sliding_window for layer in decoder_layers(grown)[1]]
        assert windows == [None if s < 2 else 3 for s in layout]
        assert grown.config.layer_types == [model.config.layer_types[s] for s in layout]


@pytest.mark.parametrize("arch", CONFIGS)
def test_optimizer_state_moves_with_the_copied_layers(arch):
    torch.manual_seed(1)
    model = HFCausalLM(model_of(arch).train(), n_ctx=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    idx = torch.randint(1, 97, (2, 9))
    for _ in range(3):
        model(idx[:, :-1], idx[:, 1:])[1].backward()
        opt.step()
        opt.zero_grad()
    layout = grow_layout(4, "midas", 2)
    grown, new = grow(model, "midas", 2, opt)
    assert isinstance(grown, HFCausalLM) and grown.cfg.n_layers == 6 and grown.n_ctx == 16
    prefix, _ = decoder_layers(model.hf)
    parent = dict(model.named_parameters())
    for name, p in grown.named_parameters():
        part = name.split(".")
        if name.startswith(f"hf.{prefix}."):
            depth = len(f"hf.{prefix}".split("."))
            part[depth] = str(layout[int(part[depth])])
        source = parent[".".join(part)]
        assert torch.equal(p, source)
        for k, v in opt.state[source].items():
            assert torch.equal(new.state[p][k], v) and new.state[p][k].data_ptr() != v.data_ptr(), (name, k)
    assert len(new.state) == len(list(grown.parameters()))
    _, fresh = grow(model, "midas", 2, opt, reset_optimizer=True)
    assert len(fresh.state) == 0
    loss = grown(idx[:, :-1], idx[:, 1:])[1]
    loss.backward()
    new.step()  # the carried state steps the grown model


def test_growth_refuses_what_it_cannot_copy():
    g = GPT2Config(vocab_size=97, n_embd=32, n_layer=4, n_head=4, scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(ValueError, match="scaling"):
        grow(AutoModelForCausalLM.from_config(g), "midas", 1)
    with pytest.raises(TypeError, match="neither a DecoderLM nor a transformers model"):
        grow(torch.nn.Linear(2, 2), "midas", 1)
    llama = model_of("llama")
    llama.config.num_hidden_layers = 3  # no layer list matches the config any more
    with pytest.raises(ValueError, match="LlamaForCausalLM: no single nn.ModuleList of its 3 decoder layers"):
        grow(llama, "midas", 1)


@pytest.mark.parametrize("arch", CONFIGS)
def test_equal_parameter_family_within_one_percent(arch):
    config = CONFIGS[arch]()
    target = hf_param_count(config)
    assert target == sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    fam = hf_family(config, [1, 2, 3, 4, 5, 6])
    assert (fam.rel_diff.abs() < 0.01).all(), fam
    assert fam.set_index("n_layers").d_ff[4] == ffn_width(config) and fam.baseline.sum() == 1
    assert fam.d_ff.is_monotonic_decreasing
    for n, count in zip(fam.n_layers, fam.n_params):
        member = build_hf(hf_depth_config(config, n))
        assert sum(p.numel() for p in member.parameters()) == count
        assert abs(count / target - 1) < 0.01


def test_family_of_a_larger_config_and_too_deep():
    config = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4)  # a 41M-parameter Llama-style model
    fam = hf_family(config, [2, 4, 8, 16, 24])
    assert (fam.rel_diff.abs() < 0.01).all(), fam
    with pytest.raises(ValueError, match="too deep"):
        hf_family(config, [200])


def test_config_files_and_names(tmp_path):
    CONFIGS["qwen2"]().save_pretrained(tmp_path)
    assert load_hf_config(tmp_path / "config.json").model_type == "qwen2"
    with pytest.raises(ValueError, match="local Hugging Face cache"):
        load_hf_config("no-such-org/no-such-model-depthnb")


# --- stagewise training of a transformers model through depthnb's loop ---------------------------------------------
sys.path.insert(0, str(Path(__file__).parent))
from _stack_script import STACK_STEPS  # noqa: E402
from _train_common import Crash, DataHook, records, small_config, small_data  # noqa: E402

from depthnb.config import StackConfig  # noqa: E402
from depthnb.hf import load_hf_model, read_hf_config  # noqa: E402
from depthnb.runs import is_done, latest_checkpoint, read_metrics  # noqa: E402
from depthnb.stacking import stack_train  # noqa: E402

HF_STACK = {"llama": lambda: LlamaConfig(vocab_size=10, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                         num_attention_heads=2, max_position_embeddings=64),
            "gpt2": lambda: GPT2Config(vocab_size=10, n_embd=32, n_layer=3, n_head=2, n_positions=64)}  # with dropout
MIDAS = StackConfig(method="midas", block_size=1)


@pytest.fixture(scope="module")
def data():
    return small_data()


@pytest.fixture(scope="module")
def hf_runs(data, tmp_path_factory):
    "Uninterrupted MIDAS runs of a 3-layer Llama and GPT-2 on the test corpus (one thread)."
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hfstack")
    for arch, make in HF_STACK.items():
        stack_train(small_config(**STACK_STEPS), MIDAS, root / arch, data=data, progress=False, hf_config=make())
    return {arch: root / arch for arch in HF_STACK}


def same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("arch", HF_STACK)
def test_hf_stacking_run_trains_in_stages(hf_runs, arch):
    run = hf_runs[arch]
    stages = read_metrics(run, "stage")
    assert stages.n_layers.tolist() == [1, 2, 3] and stages.step.tolist() == [5, 15, 30] and is_done(run)
    train = read_metrics(run, "train")
    assert train.step.tolist() == list(range(5, 31, 5)) and train.loss.iloc[-1] < train.loss.iloc[0] - 0.5
    model = load_hf_model(run)
    assert model.hf.config.num_hidden_layers == 3 and model.hf.config.vocab_size == 512
    assert [read_hf_config(run / s).num_hidden_layers for s in ("stage1_L1", "stage2_L2", "stage3_L3")] == [1, 2, 3]
    snap = read_metrics(run, "snapshot").path.iloc[-1]
    assert load_hf_model(run / snap).hf.config.num_hidden_layers == int(snap.split("_L")[1][0])
    record = json.loads((run / "config.json").read_text())
    assert record["hf_config"]["model_type"] == arch and record["config"]["model"]["n_layers"] == 3


@pytest.mark.parametrize("arch,crash_at", [("llama", 12), ("gpt2", 12), ("gpt2", 15)])
def test_hf_stacking_resumes_bit_identically(hf_runs, data, tmp_path, arch, crash_at):
    "Interrupted in stage 2 after its step-10 checkpoint, or at the first step of stage 3: the rerun ends identical."
    torch.set_num_threads(1)
    run = tmp_path / "crashed"
    with pytest.raises(Crash):
        stack_train(small_config(**STACK_STEPS), MIDAS, run, data=DataHook(data, crash_at=crash_at), progress=False,
                    hf_config=HF_STACK[arch]())
    assert is_done(run / "stage1_L1") and not is_done(run)
    if crash_at == 12:
        assert latest_checkpoint(run / "stage2_L2")[1]["step"] == 10
    model = stack_train(small_config(**STACK_STEPS), MIDAS, run, data=data, progress=False, hf_config=HF_STACK[arch]())
    reference = load_hf_model(hf_runs[arch])
    assert same_weights(model, reference) and same_weights(load_hf_model(run), reference)
    assert records(run) == records(hf_runs[arch])
    with pytest.raises(ValueError, match="hf_config"):  # a different architecture is not this run's
        stack_train(small_config(**STACK_STEPS), MIDAS, run, data=data, progress=False,
                    hf_config=HF_STACK["llama" if arch == "gpt2" else "gpt2"]())


def test_without_transformers_a_command_says_what_to_install(monkeypatch, tmp_path, capsys):
    from depthnb.cli.stack import cli_stack
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    assert cli_stack(["--preset", "tiny", "--set", f"runs_dir={tmp_path}", "--hf-config", "gpt2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install depthnb[hf]" in err[0], err


def test_cli_names_a_missing_config_in_one_line(tmp_path, capsys):
    from depthnb.cli.stack import cli_stack
    assert cli_stack(["--preset", "tiny", "--set", f"runs_dir={tmp_path}", "--hf-config", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "local Hugging Face cache" in err[0], err


def decoder_only_configs():
    "(model_type, config) of every causal LM architecture the installed transformers ships that is not encoder-decoder, at 2 layers."
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    out = []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            config = AutoConfig.for_model(model_type)
        except Exception:  # a config that needs arguments (or a backend) to be built at all
            continue
        if getattr(config, "is_encoder_decoder", False) or not hasattr(config, "num_hidden_layers"):
            continue
        try:
            config = hf_config_with(config, num_hidden_layers=2)
        except Exception:
            continue
        out.append((model_type, config))
    return out


@pytest.mark.slow
def test_ffn_width_of_every_decoder_only_architecture():
    # the width is measured on the built MLP modules, the field found by trying; an architecture that cannot be
    # supported gets one line saying why; the common ones, Falcon's ffn_hidden_size among them, are supported
    supported, refused = {}, {}
    for model_type, config in decoder_only_configs():
        try:
            hf_param_count(config)
        except Exception:  # its default config does not build a model on the meta device: nothing of ours to test
            continue
        try:
            width, field = ffn_width(config), ffn_field(config)
        except ValueError as e:
            assert str(e) and "\n" not in str(e), e
            refused[model_type] = str(e)
            continue
        supported[model_type] = (width, field)
        wider = hf_config_with(config, **{field: width + 3})
        assert ffn_width(wider) == width + 3, model_type
        assert hf_param_count(config, 1, width + 1) > hf_param_count(config, 1, width), model_type
    print(f"{len(supported)} supported, {len(refused)} refused:", *[f"{k}: {v}" for k, v in refused.items()], sep="\n")
    known = {"llama": "intermediate_size", "qwen2": "intermediate_size", "qwen3": "intermediate_size",
             "gemma2": "intermediate_size", "mistral": "intermediate_size", "gpt2": "n_inner",
             "falcon": "ffn_hidden_size", "opt": "ffn_dim", "gpt_neox": "intermediate_size", "phi3": "intermediate_size"}
    assert {k: supported.get(k, (None, refused.get(k)))[1] for k in known} == known


# --- stagewise training keeps the target's per-layer layout ----------------------------------------------------------
from depthnb.growth import grow  # noqa: E402
from depthnb.hf import hf_stage_config, per_layer_fields  # noqa: E402
from transformers import Gemma2Config, Qwen3Config  # noqa: E402

SLIDING, FULL = "sliding_attention", "full_attention"
LAYOUT_TARGETS = {  # 4 layers whose kinds no config class would derive at another depth
    "gemma2": lambda: Gemma2Config(vocab_size=10, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
                                   max_position_embeddings=64, layer_types=[SLIDING, FULL, SLIDING, FULL]),
    "qwen3": lambda: Qwen3Config(vocab_size=10, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                 num_attention_heads=2, num_key_value_heads=1, head_dim=16, use_sliding_window=True,
                                 sliding_window=4, max_window_layers=2, max_position_embeddings=64)}


def grown_stagewise(target, op: str, block_size: int = 1, device: str = "cpu"):
    "The model stagewise growth ends at (no training): stage 1 at one block, grown by `op` up to the target's depth."
    with torch.device(device):
        model = build_hf(hf_stage_config(target, block_size))
        while model.config.num_hidden_layers < target.num_hidden_layers:
            model = grow(model, op, block_size, target=target)
    return model


@pytest.mark.parametrize("arch", LAYOUT_TARGETS)
def test_stagewise_growth_keeps_the_target_layout(arch, tmp_path):
    target = LAYOUT_TARGETS[arch]()
    assert target.layer_types == ([SLIDING, FULL] * 2 if arch == "gemma2" else [FULL, FULL, SLIDING, SLIDING])
    assert [hf_stage_config(target, n).layer_types for n in (1, 2, 3)] == [target.layer_types[:n] for n in (1, 2, 3)]
    baseline = build_hf(target).config.to_dict()
    for op in ("midas", "gradstack"):
        model = grown_stagewise(target, op)
        assert model.config.to_dict() == baseline, op
        windows = [layer.self_attn.sliding_window for layer in decoder_layers(model)[1]]
        assert windows == [4 if t == SLIDING else None for t in target.layer_types], (op, windows)
        model.save_pretrained(tmp_path / op)  # saved and loaded, it computes as grown: config and modules agree
        again = type(model).from_pretrained(tmp_path / op).eval()
        idx = torch.randint(0, 10, (1, 12))
        with torch.no_grad():
            assert torch.equal(model.eval()(idx).logits, again(idx).logits), op


def layered_configs():
    "(model_type, 4-layer config) of every decoder-only architecture installed whose config has a per-layer list."
    out = []
    for model_type, config in decoder_only_configs():
        try:
            config = hf_config_with(config, num_hidden_layers=4)
        except Exception:
            continue
        if per_layer_fields(config):
            out.append((model_type, config))
    return out


@pytest.mark.slow
def test_stagewise_growth_keeps_every_installed_layout():
    # on the meta device, every decoder-only architecture with a per-layer list: MIDAS and GradStack end at the
    # baseline's config; an architecture grow cannot copy is refused in one line
    done, refused = [], {}
    for model_type, target in layered_configs():
        try:
            with torch.device("meta"):
                baseline = build_hf(target).config.to_dict()
        except Exception:  # its default config builds no model: nothing of ours to test
            continue
        try:
            ends = {op: grown_stagewise(target, op, device="meta").config.to_dict() for op in ("midas", "gradstack")}
        except ValueError as e:
            assert str(e) and "\n" not in str(e), e
            refused[model_type] = str(e)
            continue
        assert ends == {"midas": baseline, "gradstack": baseline}, model_type
        done.append(model_type)
    print(f"{len(done)} kept their layout: {', '.join(done)}", *[f"{k}: {v}" for k, v in refused.items()], sep="\n")
    assert {"gemma2", "qwen3"} <= set(done)


@pytest.mark.slow
@pytest.mark.parametrize("arch", LAYOUT_TARGETS)
def test_stack_train_final_configs_equal_across_methods(arch, data, tmp_path):
    torch.set_num_threads(1)
    configs = {}
    for method in ("baseline", "midas", "gradstack"):
        run = tmp_path / method
        stack_train(small_config(**{**STACK_STEPS, "model__n_layers": 4}), StackConfig(method=method, block_size=1), run,
                    data=data, progress=False, hf_config=LAYOUT_TARGETS[arch]())
        configs[method] = read_hf_config(run).to_dict()
        if method != "baseline":
            assert [read_hf_config(s).layer_types for s in sorted(run.glob("stage*_L*"))] == \
                [LAYOUT_TARGETS[arch]().layer_types[:n] for n in (1, 2, 3, 4)]
    assert configs["midas"] == configs["baseline"] == configs["gradstack"]
    assert configs["baseline"]["layer_types"] == LAYOUT_TARGETS[arch]().layer_types
