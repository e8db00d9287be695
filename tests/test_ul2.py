"""UL2 (Saunshi et al. App. A): mode rates, determinism per (seed, step), loss masks, bidirectional prefixes in the
model, resuming onto the same batches, and the `clm` objective unchanged."""
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _train_common import TEST_DATA, Crash, DataHook, assert_resumed_like, small_config, small_data  # noqa: E402

from depthnb.config import ModelConfig, PretrainConfig  # noqa: E402
from depthnb.inference import KVCache  # noqa: E402
from depthnb.model import CAUSAL, DecoderLM, PrefixMask, flex_mask, layer_mask  # noqa: E402
from depthnb.runs import load_model  # noqa: E402
from depthnb.cli.pretrain import cli_pretrain  # noqa: E402
from depthnb.train import pretrain, pretrain_hooks  # noqa: E402
from depthnb.runspecs import pretrain_config  # noqa: E402
from depthnb.config import UL2_RESERVED_IDS, reserved_ids  # noqa: E402
from depthnb.ul2 import MODES, UL2  # noqa: E402

V = TEST_DATA.vocab_size


@pytest.fixture(scope="module")
def data():
    return small_data()


@pytest.fixture(scope="module")
def ul2():
    return UL2(V, seed=0, n_vocab=V + UL2_RESERVED_IDS)


def test_rates_over_10000_blocks(data, ul2):
    batch = ul2(data.train.batch(0, 10_000), step=0)
    rates = np.bincount(batch.mode.numpy(), minlength=3) / 10_000
    assert np.abs(rates - np.array([0.6, 0.2, 0.2])).max() <= 0.02, dict(zip(MODES, rates))
    skewed = UL2(V, rates=(0.2, 0.3, 0.5))(data.train.batch(0, 10_000), step=0)
    assert np.abs(np.bincount(skewed.mode.numpy(), minlength=3) / 10_000 - [0.2, 0.3, 0.5]).max() <= 0.02


def test_a_batch_is_a_function_of_seed_step_and_blocks(data, ul2):
    blocks = data.train.batch(7, 64)
    a, b = ul2(blocks, step=7), UL2(V, seed=0)(blocks.clone(), step=7)
    for f in ("inputs", "targets", "prefix_len", "mode"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    halves = [ul2(blocks[r * 32:(r + 1) * 32], step=7, first_row=r * 32) for r in range(2)]  # two ranks
    assert torch.equal(torch.cat([h.targets for h in halves]), a.targets)
    chunks = a.micro_batches(16)
    assert torch.equal(torch.cat([c[1] for c in chunks]), a.targets)
    assert torch.equal(torch.cat([c[2] for c in chunks]), a.prefix_len)
    assert not torch.equal(ul2(blocks, step=8).targets, a.targets)
    assert not torch.equal(UL2(V, seed=1)(blocks, step=7).targets, a.targets)


def test_loss_masks_and_layouts(data, ul2):
    blocks = data.train.batch(3, 512)
    b = ul2(blocks, step=3)
    n = blocks.shape[1] - 1
    assert b.inputs.shape == b.targets.shape == (512, n)
    assert int(b.inputs.max()) < V + UL2_RESERVED_IDS and int(b.targets.max()) < V + UL2_RESERVED_IDS
    pos = torch.arange(n)
    for i in range(512):
        mode, p, x, y = MODES[int(b.mode[i])], int(b.prefix_len[i]), b.inputs[i], b.targets[i]
        if mode == "clm":
            assert p == 0 and torch.equal(x, blocks[i, :-1]) and torch.equal(y, blocks[i, 1:])
            continue
        counted = (y != -100).nonzero()[:, 0]
        first = ul2.token_id("[S2S]" if mode == "prefix" else "[NLU]")
        assert int(x[0]) == first and 2 <= p <= n
        assert int(counted[0]) == p - 1, "the loss starts at the last prefix position (predicting the first target)"
        assert torch.equal(counted, pos[p - 1:p - 1 + len(counted)]), "one contiguous run of loss positions"
        if mode == "prefix":
            assert torch.equal(x[1:], blocks[i, :n - 1]) and len(counted) == n - p + 1
            assert torch.equal(y[p - 1:], blocks[i, p - 1:n])
        else:
            real = int(counted[-1]) + 2
            seq = torch.cat([x, y[-1:]])[:real].tolist()
            inputs, targets = seq[1:p], seq[p:]
            sentinels = [t for t in inputs if ul2.name(t)]
            assert sentinels == [ul2.sentinel(k) for k in range(len(sentinels))] and targets[0] == sentinels[0]
            assert [t for t in targets if ul2.name(t)] == sentinels
            spans, k = {}, None
            for t in targets:
                k = t if ul2.name(t) else k
                if not ul2.name(t):
                    spans.setdefault(k, []).append(t)
            restored = [u for t in inputs for u in (spans[t] if ul2.name(t) else [t])]
            assert restored == blocks[i, :len(restored)].tolist()
            noise = sum(map(len, spans.values()))
            assert abs(noise / len(restored) - 0.15) < 0.02 and (y[real - 1:] == -100).all()


@pytest.mark.parametrize("pos_emb", ["t5", "rope"])
def test_prefix_attention_is_bidirectional_then_causal(pos_emb):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, d_attn=32, n_heads=2, d_ff=64, n_layers=2, n_vocab=64, n_ctx=80, pos_emb=pos_emb)
    model = DecoderLM(cfg).eval()
    a = torch.randint(0, 64, (2, 80))
    plen = torch.tensor([70, 10])
    with torch.no_grad():
        ref = model(a, prefix_len=plen)[0]
        b = a.clone()
        b[:, 60] = (b[:, 60] + 1) % 64  # row 0: inside the prefix; row 1: after it
        out = model(b, prefix_len=plen)[0]
        assert ((out[0, :60] - ref[0, :60]).abs().amax(-1) > 1e-4).all(), "an earlier prefix position must see it"
        torch.testing.assert_close(out[1, :60], ref[1, :60], rtol=0, atol=1e-6)
        c = a.clone()
        c[:, 75] = (c[:, 75] + 1) % 64  # after both prefixes: causal
        torch.testing.assert_close(model(c, prefix_len=plen)[0][:, :75], ref[:, :75], rtol=0, atol=1e-6)
        cache = KVCache(cfg.n_layers, 2, cfg.n_heads, 80, cfg.d_attn // cfg.n_heads)
        first = model(a[:, :72], cache=cache, attention_mask=torch.ones(2, 72, dtype=torch.long), prefix_len=plen)[0]
        steps = [model(a[:, i:i + 1], cache=cache)[0] for i in range(72, 80)]
        torch.testing.assert_close(torch.cat([first, *steps], 1), ref, rtol=0, atol=1e-5)
    model.train()
    grads = []
    for p in (None, torch.zeros(2, dtype=torch.long)):  # a zero-length prefix is the causal LM (another kernel)
        model.zero_grad()
        model(a, a, prefix_len=p)[1].backward()
        grads.append(model.embed.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-7)


@pytest.mark.slow
def test_flex_prefix_mask_matches_the_additive_mask():
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(d_model=32, d_attn=32, n_heads=2, d_ff=64, n_layers=2, n_vocab=64, n_ctx=64)).eval()
    idx, pos, plen = torch.randint(0, 64, (2, 64)), torch.arange(64), torch.tensor([20, 45])
    with torch.no_grad():
        x_sdpa = x_flex = model.embed(idx)
        for layer in model.layers:
            x_sdpa = layer(x_sdpa, layer_mask(model, pos, pos, prefix_len=plen), pos)
            x_flex = layer(x_flex, flex_mask(model, 64, pos.device, plen), pos)
    torch.testing.assert_close(x_flex, x_sdpa, rtol=0, atol=1e-4)


def test_clm_objective_is_unchanged(data):
    model = DecoderLM(small_config().model)
    pos = torch.arange(32)
    assert layer_mask(DecoderLM(replace(small_config().model, pos_emb="rope")), pos, pos) == CAUSAL
    assert not isinstance(layer_mask(model, pos, pos), PrefixMask)
    clm = pretrain_hooks(small_config(), data, torch.device("cpu")).batch(5)
    blocks = data.train.batch(5, 8)
    assert len(clm) == 1 and len(clm[0]) == 2
    assert torch.equal(clm[0][0], blocks[:, :-1]) and torch.equal(clm[0][1], blocks[:, 1:])
    # UL2 whose rows are all causal feeds the model exactly what `clm` does, through the same kernels
    causal = UL2(V, rates=(1.0, 0.0, 0.0))(blocks, step=5)
    assert causal.prefix_len is None
    assert torch.equal(causal.inputs, clm[0][0]) and torch.equal(causal.targets, clm[0][1])
    assert pretrain_config("tiny", None, 2).model.n_vocab == 2048
    assert pretrain_config("tiny", None, 2).objective == "clm"


def test_ul2_in_the_trainer(data):
    cfg = small_config(objective="ul2", model=replace(small_config().model, n_vocab=V + reserved_ids("ul2")))
    hooks = pretrain_hooks(replace(cfg, micro_batch_size=4), data, torch.device("cpu"))
    micro = hooks.batch(3)
    assert len(micro) == 2 and all(len(m) == 3 for m in micro)
    whole = UL2(V, seed=cfg.seed)(data.train.batch(3, 8), step=3)
    assert torch.equal(torch.cat([m[1] for m in micro]), whole.targets)
    with pytest.raises(ValueError, match=r"need n_vocab >= 640"):
        pretrain_hooks(small_config(objective="ul2"), data, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"PretrainConfig.objective='t5' is not one of \['clm', 'ul2'\]"):
        PretrainConfig(objective="t5")
    assert cli_pretrain(["--set", "pretrain.objective=t5"]) == 2


def test_ul2_resume_sees_the_same_batches(data, tmp_path):
    torch.set_num_threads(1)
    cfg = small_config(objective="ul2", model=replace(small_config().model, n_vocab=V + reserved_ids("ul2")))
    pretrain(cfg, tmp_path / "whole", data=data, progress=False, log=lambda *a: None)
    with pytest.raises(Crash):
        pretrain(cfg, tmp_path / "resumed", data=DataHook(data, crash_at=25), progress=False, log=lambda *a: None)
    pretrain(cfg, tmp_path / "resumed", data=data, progress=False, log=lambda *a: None)  # from step 20
    a, b = load_model(tmp_path / "whole").state_dict(), load_model(tmp_path / "resumed").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert_resumed_like(tmp_path / "resumed", tmp_path / "whole", at=[20])
