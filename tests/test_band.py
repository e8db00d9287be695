"Band attention (nbs/01_model/00_band.ipynb): the T5 bias detached in a fused kernel plus its band gradient equals the dense path."
import importlib.util
import os
import re
import subprocess
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.utils._python_dispatch import TorchDispatchMode

import depthnb.model
from depthnb.attention.band import (BAND_COMPOSITION_ENV, BAND_STEP_CONFIGS, BAND_STEPS, DTYPE_KEYS, KERNELS, PassMask,
                          aligned_causal, band_attention, band_bias_grad, band_bias_grad_masked, band_bias_grad_triton,
                          band_step_autotuned, band_step_kernel, band_step_launch, band_variant, band_width,
                          bias_score_mod, causal_bias, cpu_kernel, dense_kernel, masked_kernel)
from depthnb.config import ATTN_IMPLS, BAND_IMPLS, ModelConfig
from depthnb.model import BandMask, DecoderLM, layer_mask, relative_position_bucket
from depthnb.presets import CPU_CLASS, PRESETS, SAUNSHI_CLASSES, SIZE_CLASSES, TINY_CLASS, resolve_size_class

from _interpreted import assert_interpreted

CLASSES = [*SIZE_CLASSES.values(), *SAUNSHI_CLASSES.values(), *map(resolve_size_class, (TINY_CLASS, CPU_CLASS))]
HEAD_WIDTHS = sorted({sc.d_attn // sc.n_heads for sc in CLASSES})


def dense_attention(q, k, v, band):
    "The reference: causal softmax attention with the band's bias (zero beyond it) in plain operators, bias with grad."
    return dense_kernel(q, k, v, F.pad(band, (0, max(q.shape[-2] - band.shape[-1], 0)))[:, :q.shape[-2]])[0]


def values_and_grads(fn, q, k, v, band, d_out):
    leaves = [x.detach().requires_grad_() for x in (q, k, v, band)]
    out = fn(*leaves)
    out.backward(d_out)
    return [out.detach()] + [x.grad for x in leaves]


def assert_matches(fn, q, k, v, band, d_out, eps, ref=dense_attention):
    names = ("output", "dq", "dk", "dv", "dband")
    for name, mine, ref in zip(names, values_and_grads(fn, q, k, v, band, d_out),
                               values_and_grads(ref, q, k, v, band, d_out)):
        err = (mine - ref).abs().max().item() / max(1.0, ref.abs().max().item())
        assert err < eps, f"{name}: relative error {err:.2e} >= {eps:.0e}"


def test_head_widths_cover_the_size_classes():
    assert min(HEAD_WIDTHS) == 16 and max(HEAD_WIDTHS) == 128, HEAD_WIDTHS


@pytest.mark.parametrize("kernel", ["dense", "cpu", "split"])
@pytest.mark.parametrize("dtype, eps", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("t", [37, 128, 300])  # shorter than the band, one query block, not a multiple of it
def test_band_equals_dense(kernel, dtype, eps, t):
    for d in HEAD_WIDTHS:
        torch.manual_seed(d + t)
        q, k, v, d_out = (torch.randn(2, 3, t, d, dtype=dtype) for _ in range(4))
        band = torch.randn(3, 113, dtype=dtype)
        assert_matches(lambda *a: band_attention(*a, kernel=KERNELS[kernel]), q, k, v, band, d_out, eps)


def test_split_kernel_covers_a_band_wider_than_its_block():
    "A band of 200 distances: the near part spans 256 (split_span), so the far part still needs no bias."
    torch.manual_seed(3)
    q, k, v, d_out = (torch.randn(1, 2, 600, 16, dtype=torch.float64) for _ in range(4))
    band = torch.randn(2, 200, dtype=torch.float64)
    assert_matches(lambda *a: band_attention(*a, kernel=KERNELS["split"]), q, k, v, band, d_out, 1e-12)


@pytest.mark.parametrize("t", [256, 300])  # whole blocks (the inputs used as they are), and padded
def test_split_kernel_on_the_models_layout(t):
    "q, k, v as the model hands them over: (b, t, h, d) transposed to (b, h, t, d), not contiguous."
    torch.manual_seed(t)
    q, k, v, d_out = (torch.randn(2, t, 3, 16, dtype=torch.float64).transpose(1, 2) for _ in range(4))
    band = torch.randn(3, 113, dtype=torch.float64)
    assert_matches(lambda *a: band_attention(*a, kernel=KERNELS["split"]), q, k, v, band, d_out, 1e-12)


@pytest.mark.parametrize("t", [37, 500, 1000])  # not a multiple of 8 (padded), and one that is (as it is)
def test_aligned_causal_is_exact(t):
    "The padding cudnn_kernel gives a length that is not a multiple of 8, with the CPU kernel in cuDNN's place."
    torch.manual_seed(t)
    q, k, v, d_out = (torch.randn(1, 2, t, 8, dtype=torch.float64) for _ in range(4))
    band = torch.randn(2, 113, dtype=torch.float64)
    assert_matches(lambda *a: band_attention(*a, kernel=lambda *x: aligned_causal(cpu_kernel, *x[:4], 8)),
                   q, k, v, band, d_out, 1e-12)
    calls = []
    aligned_causal(lambda *x: calls.append(x[0].shape[-2]) or (x[0], x[0][..., 0]), q, k, v,
                   F.pad(band, (0, t))[:, :t], 8)
    assert calls == [t + (-t % 8)]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_band_step_tunes_per_dtype():
    "The autotuner keys its choice on the inputs' dtype too (bf16 and fp16 pick apart), whatever Triton does itself."
    assert band_step_autotuned().keys == ["n_bh", "t", "w", "D", "dtype_key"]
    assert "dtype_key" in band_step_kernel().arg_names and len(set(DTYPE_KEYS.values())) == len(DTYPE_KEYS)


class Allocations(TorchDispatchMode):
    """Tensors shaped like q (last dim `d`, at least `numel` elements) that ops other than the fused CPU kernel
    allocate: copies and temporaries, not views, not in-place results, not what the kernel itself returns."""
    FUSED = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
             torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward)

    def __init__(self, d: int, numel: int):
        super().__init__()
        self.d, self.numel, self.sizes = d, numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in self.FUSED or func.overloadpacket is torch.ops.aten._unsafe_view:  # a view
            return out
        for ret, x in zip(func._schema.returns, out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(x, torch.Tensor) and ret.alias_info is None and x.shape[-1] == self.d and x.numel() >= self.numel:
                self.sizes.append(x.numel())
        return out


@pytest.mark.parametrize("t, forward, backward", [(512, 3 * 3 + 3, 5 * 3), (500, 3 * 4 + 3 * 3 + 3, 4 * 4 + 5 * 3)])
def test_split_kernel_copies(t, forward, backward):
    """What the split kernel allocates beside the fused calls, in quarters of a (b, h, t, d) tensor (4 blocks), with
    q, k, v in the model's layout: forward, the shifted blocks' q, k, v (3/4 each) and the merge's one temporary;
    backward, the shifted blocks' dO, q, k, v and O. With a ragged end, padded copies (4/4) of q, k, v (and dO)."""
    b, h, d = 2, 4, 64
    torch.manual_seed(t)
    q, k, v, d_out = (torch.randn(b, t, h, d, dtype=torch.float64).transpose(1, 2).requires_grad_(i < 3)
                      for i in range(4))
    bias, quarter = F.pad(torch.randn(h, 113, dtype=torch.float64), (0, t - 113)), b * h * 128 * d  # the band
    with Allocations(d, quarter) as fwd:
        out, lse = KERNELS["split"](q, k, v, bias)
    with Allocations(d, quarter) as bwd:
        grads = torch.autograd.grad(out, (q, k, v), d_out)
    assert (sum(fwd.sizes) / quarter, sum(bwd.sizes) / quarter) == pytest.approx((forward, backward), rel=0.03), \
        (fwd.sizes, bwd.sizes)
    ref = dense_kernel(q, k, v, bias)[0]
    for mine, theirs in zip(grads, torch.autograd.grad(ref, (q, k, v), d_out)):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.slow  # compiling: ~15 s on two cores
def test_split_kernel_compiles_whole():
    "torch.compile traces the split kernel's forward and backward in one graph (as a compiled model calls it on CUDA)."
    torch.manual_seed(4)
    q, k, v, d_out = (torch.randn(1, 2, 300, 16) for _ in range(4))
    band = torch.randn(2, 113)
    compiled = torch.compile(lambda *a: band_attention(*a, kernel=KERNELS["split"]), fullgraph=True)
    assert_matches(compiled, q, k, v, band, d_out, 1e-5)


def test_bucket_fact_for_every_preset_context():
    "Every distance from the band on is in the last bucket, for each context length the presets train at."
    for preset in PRESETS.values():
        cfg = preset.pretrain.model
        buckets = relative_position_bucket(torch.arange(cfg.n_ctx), cfg.rel_buckets, cfg.rel_max_distance)
        width = band_width(buckets, cfg.rel_buckets)
        if width is None:
            assert (buckets < cfg.rel_buckets - 1).any()
            continue
        assert (buckets[width:] == cfg.rel_buckets - 1).all() and (width == 0 or buckets[width - 1] != cfg.rel_buckets - 1)


def model_trains_as_the_dense_path(impl):
    """Loss, logits and every parameter's gradient (the bias table's included) of `impl` equal the sdpa path's, in
    float32, with each layer's mask what the variant's composition names (`band_variant`)."""
    cfg = ModelConfig(d_model=64, d_attn=64, n_heads=4, d_ff=96, n_layers=2, n_vocab=97, n_ctx=256)
    torch.manual_seed(0)
    dense, band = DecoderLM(cfg), DecoderLM(replace(cfg, attn_impl=impl))
    band.load_state_dict(dense.state_dict())
    tokens = torch.randint(0, cfg.n_vocab, (2, 230))
    pos = torch.arange(230)
    kernel, step = band_variant(impl, "cpu")
    mask = layer_mask(band, pos, pos)
    assert mask.kernel is KERNELS[kernel] and mask.step is step, (impl, mask)
    losses = []
    for m in (dense, band):
        loss = m(tokens, tokens)[1]
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    for (name, p), q in zip(band.named_parameters(), dense.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
    assert band.rel_bias.table.weight.grad[-1].abs().sum() > 0  # the last bucket gets minus the band's sum


@pytest.mark.parametrize("impl", [i for i in BAND_IMPLS if ATTN_IMPLS[i].step != "triton"])
@pytest.mark.parametrize("composition", ["0", "1"])
def test_model_trains_as_the_dense_path(impl, composition, monkeypatch):
    "Each variant as the CPU runs it by default (the CPU kernel, the PyTorch step) and in its CUDA composition."
    monkeypatch.setenv(BAND_COMPOSITION_ENV, composition)
    expected = ATTN_IMPLS[impl].cpu_kernel if composition == "1" else "cpu"
    assert band_variant(impl, "cpu")[0] == expected
    model_trains_as_the_dense_path(impl)


@pytest.mark.parametrize("impl", ["band-split", "band-cudnn-triton"])
def test_prefix_lm_and_padded_batches_train_as_the_dense_path(impl, monkeypatch):
    """UL2's prefix-LM batches (`prefix_len`, as `optim.train_step` hands them to the model) and a padded batch take
    the band path: loss and every gradient equal the sdpa path's, in float32."""
    cfg = ModelConfig(d_model=64, d_attn=64, n_heads=4, d_ff=96, n_layers=2, n_vocab=97, n_ctx=256)
    torch.manual_seed(0)
    dense, band = DecoderLM(cfg), DecoderLM(replace(cfg, attn_impl=impl))
    band.load_state_dict(dense.state_dict())
    tokens = torch.randint(0, cfg.n_vocab, (3, 230))
    padding = torch.ones(3, 230, dtype=torch.long)
    padding[2, 200:] = 0
    calls = []

    def counted(q, *a, **kw):
        calls.append(q.shape)
        return masked_kernel(q, *a, **kw)
    monkeypatch.setattr(depthnb.model, "masked_kernel", counted)
    for kwargs in (dict(prefix_len=torch.tensor([0, 57, 230])), dict(attention_mask=padding)):
        losses, calls[:] = [], []
        for m in (dense, band):
            m.zero_grad()
            loss = m(tokens, tokens, **kwargs)[1]
            loss.backward()
            losses.append(loss.item())
        assert calls == [(3, 4, 230, 16)] * cfg.n_layers, calls  # each layer of the band model on the band path
        assert losses[0] == pytest.approx(losses[1], rel=1e-6)
        for (name, p), q in zip(band.named_parameters(), dense.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


def check_model_compositions_interpreted():
    "What the next test runs in a fresh process under Triton's interpreter: the `-triton` variants' compositions."
    for impl in BAND_IMPLS:
        if ATTN_IMPLS[impl].step == "triton":
            assert band_variant(impl, "cpu")[1] is band_bias_grad_triton
            model_trains_as_the_dense_path(impl)


@pytest.mark.slow  # the Triton step interpreted in 2 layers × 2 variants: ~20 s on one core
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_model_trains_as_the_dense_path_with_the_triton_step():
    "The `-triton` variants' CUDA compositions (split or the CPU fused op, the Triton step interpreted) in the model."
    assert_interpreted("test_band", "check_model_compositions_interpreted", timeout=900, **{BAND_COMPOSITION_ENV: "1"})


def masked_dense_attention(q, k, v, band, mask):
    "The reference of a prefix-LM or padded pass: the bias along its diagonals (the distance-0 value after the query), -inf where the mask forbids."
    t = q.shape[-2]
    flat = F.pad(band, (0, max(t - band.shape[-1], 0)))[:, :t]
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + causal_bias(flat, t, q.dtype)
    return torch.softmax(scores.masked_fill(~mask.allowed(t, q.device), float("-inf")), -1) @ v


@pytest.mark.parametrize("t", [37, 128, 300])  # shorter than the band, one block, not a multiple of it
@pytest.mark.parametrize("dtype, eps", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_prefix_and_padded_band_equal_dense(t, dtype, eps):
    "Prefixes of several lengths (none, 1, within and beyond the band, the whole pass), padding keys, every head width."
    for d in HEAD_WIDTHS:
        torch.manual_seed(d + t)
        q, k, v, d_out = (torch.randn(4, 2, t, d, dtype=dtype) for _ in range(4))
        band = torch.randn(2, 113, dtype=dtype)
        real = torch.ones(4, t, dtype=torch.bool)
        real[1, :t // 3] = False  # left padding
        real[3, t - t // 4:] = False  # right padding
        lengths = [(0, 1, t // 2, t), (min(113, t), min(129, t), t - 1, 5)]
        for prefix, key_real in ((lengths[0], None), (lengths[1], real), (None, real)):
            mask = PassMask(None if prefix is None else torch.tensor(prefix), key_real)
            assert_matches(lambda *a: band_attention(*a, kernel=masked_kernel, step=band_bias_grad_masked, mask=mask),
                           q, k, v, band, d_out, eps, ref=lambda *a: masked_dense_attention(*a, mask))


def test_exact_paths_where_the_identity_does_not_hold():
    cfg = ModelConfig(d_model=32, d_attn=32, n_heads=2, d_ff=48, n_layers=2, n_vocab=50, n_ctx=256, attn_impl="band-flex")
    torch.manual_seed(1)
    band, dense = DecoderLM(cfg).eval(), DecoderLM(replace(cfg, attn_impl="sdpa")).eval()
    dense.load_state_dict(band.state_dict())
    pos = torch.arange(150)
    assert isinstance(layer_mask(band, pos, pos), BandMask)
    prefix = layer_mask(band, pos, pos, prefix_len=torch.tensor([20, 140]))  # UL2's passes: the band path
    assert isinstance(prefix, BandMask) and prefix.kernel is masked_kernel and prefix.mask.prefix_len.tolist() == [20, 140]
    padded = layer_mask(band, pos, pos, key_padding=torch.ones(2, 150))
    assert isinstance(padded, BandMask) and padded.mask.key_real.all()
    # a cached prefix (a decoding step: 1 query, 151 keys): the exact dense path
    assert isinstance(layer_mask(band, pos[-1:], torch.arange(151), key_padding=torch.ones(2, 151)), torch.Tensor)
    prompt = torch.randint(0, cfg.n_vocab, (2, 150))
    assert torch.equal(band.generate(prompt, 8), dense.generate(prompt, 8))  # cached decoding: the dense path
    padding = torch.ones(2, 150, dtype=torch.long)
    padding[0, :30] = 0  # a left-padded prompt: its pass on the band path, its steps dense
    assert torch.equal(band.generate(prompt, 8, attention_mask=padding), dense.generate(prompt, 8, attention_mask=padding))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        short = DecoderLM(replace(cfg, n_ctx=100))  # the last bucket starts at 113: no band below n_ctx
    assert short.band_width is None and len(caught) == 1 and "exact dense path" in str(caught[0].message)


@pytest.mark.slow  # compiling the kernel: ~30 s on two cores
def test_compiled_flex_forward_with_the_shifted_score_mod():
    "FlexAttention has no CPU backward and no CPU log-sum-exp: its compiled forward with the band's score_mod, checked here."
    t, d = 160, 16
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 2, t, d) for _ in range(3))
    bias = F.pad(torch.randn(2, 113), (0, t - 113))
    block_mask = create_block_mask(lambda b, h, qi, ki: ki <= qi, None, None, t, t, device="cpu")
    out = torch.compile(flex_attention, dynamic=False)(q, k, v, score_mod=bias_score_mod(bias), block_mask=block_mask)
    torch.testing.assert_close(out, dense_kernel(q, k, v, bias)[0], rtol=1e-5, atol=1e-5)


def check_triton_step_interpreted():
    """What the next test runs in a fresh process under Triton's interpreter: the Triton step against the PyTorch step
    (the op, then every launch configuration the GPU's autotuner may choose), then the whole path."""
    for t, d, w in ((40, 16, 24), (130, 32, 113), (70, 24, 128), (17, 16, 128), (200, 64, 113)):
        torch.manual_seed(t)
        q, k, v, do = (torch.randn(2, 2, t, d) for _ in range(4))
        band = torch.randn(2, w)
        out, lse = dense_kernel(q, k, v, F.pad(band, (0, max(t - w, 0)))[:, :t])
        ref = band_bias_grad(q, k, v, out, lse, do, w, d ** -0.5, band)
        tol = 1e-5 * max(1.0, ref.abs().max().item())
        err = (band_bias_grad_triton(q, k, v, out, lse, do, w, d ** -0.5, band) - ref).abs().max().item()
        assert err < tol, (t, d, w, err)
        if t in (40, 130):  # one band narrower than a block, one wider than the smallest
            for config in BAND_STEP_CONFIGS[1:]:
                err = (band_step_launch(q, k, v, out, lse, do, w, d ** -0.5, band, config) - ref).abs().max().item()
                assert err < tol, (t, d, w, config, err)
    assert_matches(lambda *a: band_attention(*a, kernel=cpu_kernel, step=band_bias_grad_triton), q, k, v, band, do, 1e-5)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_triton_band_step_equals_the_pytorch_step_under_the_interpreter():
    "The Triton band step in float32 under Triton's interpreter, in a fresh process (Triton picks it when first imported)."
    assert_interpreted("test_band", "check_triton_step_interpreted")


def stack_bytes(cubin: bytes, tmp_path) -> int | None:
    "A kernel's stack frame (bytes; more than 0 where registers spill) by the CUDA toolkit's `cuobjdump`, None without it."
    tool = Path(importlib.util.find_spec("triton").origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return None
    path = tmp_path / "kernel.cubin"
    path.write_bytes(cubin)
    usage = subprocess.run([str(tool), "-res-usage", str(path)], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"STACK:(\d+)", usage)[1])


@pytest.mark.slow  # a Triton compile per head width and configuration: ~1-3 s each on two cores
def test_triton_band_step_compiles_for_hopper(tmp_path):
    """The Triton band step compiles to a cubin for sm_90 (H100, H200) in bf16 at every head width in every launch
    configuration the autotuner may choose, with no GPU here; and at every width one of them keeps its values in
    registers (no stack frame: no spills), so that the autotuner has one to choose."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Triton's interpreter is on in this process: it compiles nothing")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile
    kernel = band_step_kernel()
    names = kernel.arg_names
    for d in HEAD_WIDTHS:
        stacks = {}
        for config in BAND_STEP_CONFIGS:
            const = dict(H=12, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_W=128, IEEE=False,
                         UNROLL=config.unroll, D=d, BLOCK_D=max(16, 1 << (d - 1).bit_length()))
            sig = {n: "constexpr" if n in const else "*bf16" if i < 5 else "*fp32" if i < 8 else "fp32" if n == "scale"
                   else "i32" for i, n in enumerate(names)}
            src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(n),): v for n, v in const.items()})
            options = {"num_warps": config.warps, "enable_fp_fusion": True}
            cubin = compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["cubin"]
            assert cubin, (d, config)
            stacks[config] = stack_bytes(cubin, tmp_path)
        if None not in stacks.values():
            assert min(stacks.values()) == 0, f"head width {d}: every configuration spills: {stacks}"


@pytest.mark.gpu
@pytest.mark.parametrize("impl", BAND_IMPLS)
def test_cuda_kernels_match_fp32_dense(impl):
    "On CUDA, in bf16: each fused kernel's values and gradients (the band step's in PyTorch or Triton) against the fp32 dense path."
    from depthnb.model import causal_block_mask
    for t, d in ((t, d) for t in (1024, 1000) for d in HEAD_WIDTHS):  # 1000: rows not 16-element aligned
        torch.manual_seed(d)
        q, k, v, d_out = (torch.randn(2, 4, t, d, device="cuda") for _ in range(4))
        band = torch.randn(4, 113, device="cuda")
        kernel = ATTN_IMPLS[impl].kernel  # as the model runs the variant on CUDA (band.band_variant)
        extra = {"block_mask": causal_block_mask(t, "cuda")} if kernel == "flex" else {}
        extra["step"] = BAND_STEPS[ATTN_IMPLS[impl].step]
        mine = values_and_grads(lambda q, k, v, b: band_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), b,
                                                                  kernel=KERNELS[kernel], **extra).float(),
                                q, k, v, band, d_out)
        ref = values_and_grads(dense_attention, q, k, v, band, d_out)
        for name, a, b in zip(("output", "dq", "dk", "dv", "dband"), mine, ref):
            err = ((a - b).norm() / b.norm()).item()
            assert err < 2e-2, f"{impl}, t {t}, d_head {d}, {name}: relative error {err:.2e}"


@pytest.mark.gpu
def test_cuda_prefix_and_padded_band_match_fp32_dense():
    "On CUDA, in bf16: a prefix-LM and padded pass (FlexAttention under the pass's block mask, the masked band step)."
    from depthnb.attention.band import pass_block_mask
    for t, d in ((t, d) for t in (1024, 1000) for d in HEAD_WIDTHS):
        torch.manual_seed(d)
        q, k, v, d_out = (torch.randn(3, 4, t, d, device="cuda") for _ in range(4))
        band = torch.randn(4, 113, device="cuda")
        real = torch.ones(3, t, dtype=torch.bool, device="cuda")
        real[2, t - 100:] = False
        mask = PassMask(torch.tensor([0, 300, t], device="cuda"), real)
        block_mask = pass_block_mask(mask, t, "cuda")
        mine = values_and_grads(lambda q, k, v, b: band_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), b,
                                                                  kernel=masked_kernel, block_mask=block_mask,
                                                                  step=band_bias_grad_masked, mask=mask).float(),
                                q, k, v, band, d_out)
        ref = values_and_grads(lambda *a: masked_dense_attention(*a, mask), q, k, v, band, d_out)
        for name, a, b in zip(("output", "dq", "dk", "dv", "dband"), mine, ref):
            err = ((a - b).norm() / b.norm()).item()
            assert err < 2e-2, f"t {t}, d_head {d}, {name}: relative error {err:.2e}"


@pytest.mark.gpu
def test_cuda_band_step_configurations_agree():
    "On CUDA, in bf16: every launch configuration of the Triton band step against the PyTorch step, at every head width."
    for d in HEAD_WIDTHS:
        torch.manual_seed(d)
        q, k, v, d_out = (torch.randn(2, 4, 1000, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        band = torch.randn(4, 113, device="cuda")
        out, lse = KERNELS["cudnn"](q, k, v, F.pad(band, (0, 1000 - 113)))
        ref = band_bias_grad(q, k, v, out, lse, d_out, 113, d ** -0.5, band)
        for config in BAND_STEP_CONFIGS:
            mine = band_step_launch(q, k, v, out, lse, d_out, 113, d ** -0.5, band, config)
            err = ((mine - ref).norm() / ref.norm()).item()
            assert err < 1e-2, f"d_head {d}, {config}: relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["cudnn", "split"])
def test_cuda_kernels_take_float32(impl):
    "cuDNN takes half precision only: float32 inputs (training with bf16=False) get the memory-efficient kernel."
    torch.manual_seed(5)
    q, k, v, d_out = (torch.randn(2, 4, 300, 64, device="cuda") for _ in range(4))
    band = torch.randn(4, 113, device="cuda")
    assert_matches(lambda *a: band_attention(*a, kernel=KERNELS[impl]), q, k, v, band, d_out, 1e-3)


@pytest.mark.gpu
def test_default_model_trains_as_sdpa_on_cuda():
    "attn_impl='auto' (band attention on CUDA, q/k/v as the model lays them out) against 'sdpa', bf16 autocast."
    cfg = ModelConfig(d_model=128, d_attn=128, n_heads=4, d_ff=256, n_layers=2, n_vocab=97, n_ctx=512)
    torch.manual_seed(0)
    auto, dense = DecoderLM(cfg).cuda(), DecoderLM(replace(cfg, attn_impl="sdpa")).cuda()
    dense.load_state_dict(auto.state_dict())
    tokens = torch.randint(0, cfg.n_vocab, (4, 500), device="cuda")
    losses = []
    for m in (auto, dense):
        with torch.autocast("cuda", torch.bfloat16):
            loss = m(tokens, tokens)[1]
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-2)
    for (name, p), q in zip(auto.named_parameters(), dense.parameters()):
        err = ((p.grad - q.grad).norm() / q.grad.norm()).item()
        assert err < 3e-2, f"{name}: relative gradient error {err:.2e}"


def test_attention_check_rehearses_on_the_cpu(tmp_path):
    "benchmarks/attention_check.py at small shapes on the CPU: every variant's errors, time and the pick."
    import importlib.util
    import json
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "attention_check.py"
    spec = importlib.util.spec_from_file_location("attention_check", path)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    record = tmp_path / "RESULTS.md"
    argv = ["--device", "cpu", "--shrink", "--no-bench", "--shapes", "374M", "--variants", "reference,sdpa,band-flex",
            "--iters", "2", "--record", str(record), "--out", str(tmp_path)]
    assert check.main(argv) == 0
    result = json.loads((tmp_path / "attention_check.json").read_text())
    rows = {r["variant"]: r for r in result["rows"]}
    assert rows["band-flex"]["correct"] and rows["band-flex"]["dtable"] < 1e-5 and rows["sdpa"]["dtable"] < 1e-6
    assert result["lengths"] == [256, 180] and result["block"] == 128
    for length, n_blocks in (("256", 2), ("180", 2)):  # 180: a short last block
        assert all(len(rows["band-flex"]["blocks"][length][key]) == n_blocks for key in ("out", "dq", "dk", "dv"))
    assert rows["band-flex"]["backend"] == "cpu (SDPA flash, CPU) + band step (PyTorch)"  # flex's CPU stand-in
    assert "t 180" in rows["band-flex"]["worst"] or "t 256" in rows["band-flex"]["worst"]
    assert check.BAND_COMPOSITION_ENV not in os.environ  # set for the check only
    assert result["fastest_correct"] == "band-flex" and "fastest correct band variant: band-flex" in record.read_text()
    with pytest.raises(SystemExit):
        check.parse_args(["--variants", "nope"])


def load_attention_check():
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "attention_check.py"
    spec = importlib.util.spec_from_file_location("attention_check", path)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    return check


class _WrongBlock(torch.autograd.Function):
    "Identity whose backward scales the gradient of positions 384-511 (block 3) by 1.04: a bug confined to one block."
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        grad[:, :, 384:512] *= 1.04
        return grad


def test_attention_check_finds_one_wrong_block(monkeypatch):
    "A variant wrong by 4% in one block of dq passes a global norm at 1,024 tokens, not the per-block comparison."
    check = load_attention_check()
    call = check.variant_call

    def wrong(name, *a, **kw):
        fn, table = call(name, *a, **kw)
        return (lambda q, k, v: fn(_WrongBlock.apply(q), k, v)), table
    monkeypatch.setattr(check, "variant_call", wrong)
    row = check.check_lengths("band-split", "134M", (1024,), 1, torch.device("cpu"), torch.float32)
    dq = row["blocks"]["1024"]["dq"]
    assert len(dq) == 8 and max(range(8), key=dq.__getitem__) == 3 and dq[3] > 2e-2 and row["dq"] == dq[3]
    assert max(dq[:3] + dq[4:]) < 1e-5 and row["worst"].startswith("dq, t 1024, block 3")
    whole = (sum(e ** 2 for e in dq) / len(dq)) ** 0.5  # about the global norm's error: each block has a like norm
    assert whole < 2e-2, whole
