"Properties of DecoderLM beyond the notebook's examples."
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from depthnb.config import SIZE_CLASSES, ModelConfig
from depthnb.model import DecoderLM, extra_params
from depthnb.solver import model_config, model_params

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
