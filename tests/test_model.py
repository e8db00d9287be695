"Properties of DecoderLM beyond the notebook's examples."
import importlib.util
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from depthnb.presets import SIZE_CLASSES
from depthnb.config import ModelConfig
from depthnb.inference import KVCache
from depthnb.model import (DecoderLM, attend, attention_mask_bias, cache_masks, causal_attention, cross_entropy, extra_params,
                           project)
from depthnb.solver import model_config, model_params

from _interpreted import assert_interpreted

SMALL = ModelConfig(d_model=32, d_attn=32, n_heads=4, d_ff=48, n_layers=3, n_vocab=97, n_ctx=64)


@pytest.mark.parametrize("name", list(SIZE_CLASSES))
def test_num_params_matches_solver_on_meta(name):
    sc = SIZE_CLASSES[name]
    for n in sc.depths:
        for pos in ("t5", "rope"):
            with torch.device("meta"):
                m = DecoderLM(model_config(sc, n, ModelConfig(pos_emb=pos)))
            assert m.num_params() == model_params(sc, n, m.cfg.d_ff) + extra_params(m.cfg)


def test_layers_are_one_modulelist_and_independent():
    m = DecoderLM(SMALL)
    assert isinstance(m.layers, torch.nn.ModuleList) and len(m.layers) == 3
    assert m.layers[0].ffn.wi_0.weight.data_ptr() != m.layers[1].ffn.wi_0.weight.data_ptr()
    assert all(not isinstance(mod, torch.nn.Linear) or mod.bias is None for mod in m.modules())


def test_looped_model_shares_one_layer():
    m = DecoderLM(replace(SMALL, share_layers=True))
    assert len({id(l) for l in m.layers}) == 1
    unshared = DecoderLM(SMALL)
    per_layer = sum(p.numel() for p in unshared.layers[0].parameters())
    assert unshared.num_params() - m.num_params() == 2 * per_layer


def test_target_masking_ignores_minus_100():
    torch.manual_seed(0)
    m = DecoderLM(SMALL)
    idx = torch.randint(0, SMALL.n_vocab, (2, 10))
    targets = idx.clone()
    targets[:, :6] = -100
    logits, loss = m(idx, targets=targets)
    ref = torch.nn.functional.cross_entropy(logits[:, 6:].reshape(-1, SMALL.n_vocab), idx[:, 6:].reshape(-1))
    torch.testing.assert_close(loss, ref)


@settings(max_examples=12, deadline=None)
@given(pos=st.sampled_from(["t5", "rope"]), shared=st.booleans(), lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4),
       seed=st.integers(0, 10_000), eos=st.booleans())
def test_cached_and_uncached_generation_agree(pos, shared, lengths, seed, eos):
    torch.manual_seed(seed)
    m = DecoderLM(replace(SMALL, pos_emb=pos, share_layers=shared)).eval()
    t = max(lengths)
    idx = torch.zeros(len(lengths), t, dtype=torch.long)
    mask = torch.zeros_like(idx)
    for i, n in enumerate(lengths):
        idx[i, t - n:] = torch.randint(3, SMALL.n_vocab, (n,))
        mask[i, t - n:] = 1
    kw = dict(max_new_tokens=10, attention_mask=mask, eos_id=1 if eos else None)
    assert torch.equal(m.generate(idx, **kw), m.generate(idx, use_cache=False, **kw))


def test_generated_ids_are_ordinary_tensors_and_stacked_weights_serve_no_grad_later():
    "`generate` runs in inference mode; what it returns and leaves behind works outside it."
    torch.manual_seed(0)
    m = DecoderLM(SMALL).eval()
    idx = torch.randint(3, SMALL.n_vocab, (2, 5))
    out = m.generate(idx, 4)
    assert not out.is_inference()
    out[:, 0] = 0  # in place, outside inference mode
    m.train()
    m(out, targets=out)[1].backward()  # generated ids as training input
    with torch.no_grad():  # the weights stacked during generation, reused outside inference mode
        torch.testing.assert_close(m.layers[0].attn(m.embed(out), None, torch.arange(9)),
                                   m.layers[0].attn.o(torch.nn.functional.scaled_dot_product_attention(
                                       *(lin(m.embed(out)).view(2, 9, SMALL.n_heads, -1).transpose(1, 2)
                                         for lin in (m.layers[0].attn.q, m.layers[0].attn.k, m.layers[0].attn.v))
                                   ).transpose(1, 2).reshape(2, 9, -1)))


def test_generation_stops_when_all_rows_emit_eos():
    m = DecoderLM(SMALL).eval()
    with torch.no_grad():
        m.lm_head.weight.zero_()  # all logits tie at 0, so greedy decoding always picks token 0
    idx = torch.randint(3, SMALL.n_vocab, (3, 4))
    assert m.generate(idx, 20).shape == (3, 24)
    out = m.generate(idx, 20, eos_id=0)
    assert out.shape == (3, 5) and (out[:, 4] == 0).all()


def test_backward_reaches_bias_table_and_every_layer():
    m = DecoderLM(SMALL)
    idx = torch.randint(0, SMALL.n_vocab, (2, 12))
    m(idx, targets=idx)[1].backward()
    assert m.rel_bias.table.weight.grad.abs().sum() > 0
    assert all(l.attn.q.weight.grad.abs().sum() > 0 for l in m.layers)


def test_cpu_training_attention_matches_sdpa_values_and_bias_gradient():
    "`attend`'s own softmax attention (a trained bias on the CPU) computes what SDPA's math path computes."
    torch.manual_seed(0)
    m = DecoderLM(SMALL)
    torch.nn.init.normal_(m.rel_bias.table.weight, std=1.0)
    q, k, v = (torch.randn(2, SMALL.n_heads, 10, 8, requires_grad=True) for _ in range(3))
    pos = torch.arange(10)
    inputs = [q, k, v, m.rel_bias.table.weight]
    ours = attend(q, k, v, attention_mask_bias(m, pos, pos))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask_bias(m, pos, pos))
    torch.testing.assert_close(ours, ref)
    for g, r in zip(torch.autograd.grad(ours.square().sum(), inputs), torch.autograd.grad(ref.square().sum(), inputs)):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("t", [1, 9, 64, 65])
def test_causal_halves_match_sdpa_with_padding_and_bias_gradient(t):
    "The two-halves path (queries of the first half see only the first half's keys) is SDPA's attention."
    torch.manual_seed(t)
    m = DecoderLM(SMALL)
    torch.nn.init.normal_(m.rel_bias.table.weight, std=1.0)
    q, k, v = (torch.randn(3, SMALL.n_heads, t, 8, requires_grad=True) for _ in range(3))
    pos, padding = torch.arange(t), torch.ones(3, t, dtype=torch.long)
    padding[1, :t // 2] = 0  # a left-padded row
    inputs = [q, k, v, m.rel_bias.table.weight]
    ours = causal_attention(q, k, v, attention_mask_bias(m, pos, pos, padding))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask_bias(m, pos, pos, padding))
    torch.testing.assert_close(ours, ref)
    for g, r in zip(torch.autograd.grad(ours.square().sum(), inputs), torch.autograd.grad(ref.square().sum(), inputs)):
        torch.testing.assert_close(g, r)


def test_model_loss_and_gradients_match_autograd_cross_entropy():
    "The CPU loss with its own backward gives what F.cross_entropy gives, ignored targets included."
    torch.manual_seed(0)
    m = DecoderLM(replace(SMALL, n_ctx=80))
    idx = torch.randint(0, SMALL.n_vocab, (2, 80))
    targets = idx.roll(-1, 1)
    targets[0, :30] = -100
    logits, loss = m(idx, targets=targets)
    assert not logits.requires_grad  # given targets, the gradient goes through the loss only
    ref = torch.nn.functional.cross_entropy(m(idx)[0].flatten(0, 1), targets.flatten(), ignore_index=-100)
    assert loss.item() == ref.item()
    params = list(m.parameters())
    for g, r in zip(torch.autograd.grad(loss, params, retain_graph=True), torch.autograd.grad(ref, params)):
        torch.testing.assert_close(g, r)
    x, none = torch.randn(4, 7, requires_grad=True), torch.full((4,), -100)
    ours, ref = cross_entropy(x, none), torch.nn.functional.cross_entropy(x, none, ignore_index=-100)
    assert torch.isnan(ours) and torch.isnan(ref)  # no position counts: both are 0 / 0
    assert torch.equal(torch.autograd.grad(ours, x)[0], torch.autograd.grad(ref, x)[0])


def test_decoding_step_mask_is_the_row_of_the_additive_mask():
    torch.manual_seed(0)
    for pos_emb in ("t5", "rope"):
        m = DecoderLM(replace(SMALL, pos_emb=pos_emb))
        padding = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
        cache = KVCache(SMALL.n_layers, 2, SMALL.n_heads, 8, 8)
        cache_masks(m, cache, padding)
        full = torch.cat([padding, torch.ones(2, 3, dtype=torch.long)], 1)
        for p in range(5, 8):
            cache.length = p
            expected = attention_mask_bias(m, torch.tensor([p]), torch.arange(p + 1), full[:, :p + 1])
            assert torch.equal(cache.step_mask().expand_as(expected), expected)


def test_stacked_projections_match_separate_ones_and_follow_weight_updates():
    torch.manual_seed(0)
    m = DecoderLM(SMALL)
    layer, x = m.layers[0], torch.randn(2, 5, SMALL.d_model)
    with torch.no_grad():
        for mod, names in ((layer.attn, ("q", "k", "v")), (layer.ffn, ("wi_0", "wi_1"))):
            for y, name in zip(project(mod, names, x), names):
                torch.testing.assert_close(y, getattr(mod, name)(x))
        layer.attn.k.weight.add_(1.0)  # as an optimizer step does, in place
        torch.testing.assert_close(project(layer.attn, ("q", "k", "v"), x)[1], layer.attn.k(x))


def check_fused_loss_interpreted():
    """What the next test runs in a fresh process under Triton's interpreter: `loss_impl="liger"` against the plain
    loss, its loss and every parameter's gradient; in float32, and in float64 inputs (liger accumulates in float32)."""
    cfg = ModelConfig(d_model=32, d_attn=32, n_heads=2, d_ff=48, n_layers=2, n_vocab=97, n_ctx=64)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-5)):
        torch.manual_seed(0)
        plain = DecoderLM(cfg).to(dtype)
        fused = DecoderLM(replace(cfg, loss_impl="liger")).to(dtype)
        fused.load_state_dict(plain.state_dict())
        tokens = torch.randint(0, cfg.n_vocab, (2, 60))
        targets = tokens.roll(-1, 1)
        targets[0, :10] = -100  # not counted
        results = []
        for m in (plain, fused):
            logits, loss = m(tokens, targets)
            loss.backward()
            results.append((logits, loss.item()))
        assert results[1][0] is None and results[0][0] is not None  # the fused loss holds no logits
        assert abs(results[0][1] - results[1][1]) <= tol * abs(results[0][1]), (dtype, results)
        for (name, p), q in zip(fused.named_parameters(), plain.parameters()):
            err = ((p.grad - q.grad).norm() / q.grad.norm()).item()
            assert err < tol, (dtype, name, err)


@pytest.mark.slow  # Triton's interpreter in a fresh process: ~12 s on one core
@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None or importlib.util.find_spec("triton") is None,
                    reason="liger-kernel (the gpu extra) or Triton is not installed")
def test_fused_loss_equals_the_plain_loss_under_the_interpreter():
    "liger-kernel's fused projection + cross-entropy, under Triton's interpreter in a fresh process (Triton picks it when first imported)."
    assert_interpreted("test_model", "check_fused_loss_interpreted")
