"""LoRA adapters (models/lora.py): config checks, the step-0 model equals its base bit for bit,
the adapters switched off give the base, scanned = unrolled, merging (and transformers loading
the merged export), peft's adapter layout, loading a Hugging Face base with adapters, and the
adapters' dropout (against a NumPy reference; off without a key; scanned = unrolled)."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM

from ragen_jax.models import hf, lora
from ragen_jax.models.cache import DecodeContext, init_cache, positions_from_mask
from ragen_jax.models.config import LORA_TARGETS, DecoderConfig, LoraConfig
from ragen_jax.models.cpu_tuning import CpuPath
from ragen_jax.models.decoder import init_model
from ragen_jax.models.layers import LayerInputs, Linear, dropout

from hf_reference import hf_logits

LORA = LoraConfig(rank=4, alpha=8.0)


def logits(model, ids, mask, dropout_key=None):
    mask = jnp.asarray(mask)
    hidden, _ = model(jnp.asarray(ids), positions_from_mask(mask), mask, dropout_key=dropout_key)
    return np.asarray(model.logits(hidden))


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 1024, size=(2, 9)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    mask[1, 6:] = False
    return ids, mask


def trained(model, seed=1):
    """`model` with its adapters moved off their start (as training would), in place."""
    state = nnx.state(model, lora.LoRAParam)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    nnx.update(model, jax.tree.unflatten(tree, [x + 0.05 * jax.random.normal(k, x.shape, x.dtype)
                                               for x, k in zip(leaves, keys)]))
    return model


@pytest.mark.parametrize("values, message", [
    (dict(rank=-1), "model.lora.rank=-1 must be an integer >= 0"),
    (dict(rank=4, targets="q_proj,qkv"), "unknown target 'qkv'"),
    (dict(rank=4, alpha=0.0), "model.lora.alpha=0.0 must be a finite number > 0"),
    (dict(rank=4, dropout=-0.1), "model.lora.dropout=-0.1 must be a number in [0, 1)"),
    (dict(rank=4, dropout=1.0), "model.lora.dropout=1.0 must be a number in [0, 1)"),
])
def test_bad_settings_are_one_line_errors(values, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        LoraConfig(**values)
    assert "\n" not in str(error.value)


def test_dropout_below_one_is_accepted_and_exported_to_peft():
    assert LoraConfig(rank=4, dropout=0.1).has_dropout
    assert not LoraConfig(rank=0, dropout=0.1).has_dropout and not LoraConfig(rank=4).has_dropout
    config = lora.peft_config(DecoderConfig.preset("tiny", lora=LoraConfig(rank=4, dropout=0.1)))
    assert config["lora_dropout"] == 0.1


def test_targets_by_name_or_all_linear():
    assert LoraConfig(rank=2).target_names() == LORA_TARGETS
    assert LoraConfig(rank=2, targets="v_proj, q_proj").target_names() == ("q_proj", "v_proj")
    assert LoraConfig(rank=2, targets=("down_proj",)).targets == "down_proj"
    model = init_model(DecoderConfig.preset("tiny", lora=LoraConfig(rank=2, targets="q_proj,down_proj")),
                       jax.random.key(0))
    names = {path[-2] for path, _ in nnx.to_flat_state(nnx.state(model, lora.LoRAParam))}
    assert names == {"q_proj", "down_proj"}


def test_rank_zero_adds_nothing():
    plain = init_model(DecoderConfig.preset("tiny"), jax.random.key(0))
    zero = init_model(DecoderConfig.preset("tiny", lora=LoraConfig(rank=0, alpha=3.0)), jax.random.key(0))
    assert jax.tree.structure(nnx.state(plain)) == jax.tree.structure(nnx.state(zero))
    assert not jax.tree.leaves(nnx.state(zero, lora.LoRAParam))


@pytest.mark.parametrize("scan", [False, True])
def test_step_zero_model_equals_its_base_bit_for_bit(batch, scan):
    base = init_model(DecoderConfig.preset("tiny", scan_layers=scan), jax.random.key(0))
    adapted = init_model(DecoderConfig.preset("tiny", scan_layers=scan, lora=LORA), jax.random.key(0))
    # the same base weights (the adapters are drawn after them), A random, B zero
    for a, b in zip(jax.tree.leaves(nnx.state(base)), jax.tree.leaves(nnx.state(adapted, nnx.Not(lora.LoRAParam)))):
        np.testing.assert_array_equal(a, b)
    a_leaves = [x for p, x in nnx.to_flat_state(nnx.state(adapted, lora.LoRAParam)) if p[-1] == "lora_a"]
    b_leaves = [x for p, x in nnx.to_flat_state(nnx.state(adapted, lora.LoRAParam)) if p[-1] == "lora_b"]
    assert all(np.abs(x[...]).max() > 0 for x in a_leaves) and all(not np.any(x[...]) for x in b_leaves)
    np.testing.assert_array_equal(logits(base, *batch), logits(adapted, *batch))


def test_adapters_off_is_the_base_and_scanned_equals_unrolled(batch):
    base = init_model(DecoderConfig.preset("tiny"), jax.random.key(0))
    unrolled = trained(init_model(DecoderConfig.preset("tiny", lora=LORA), jax.random.key(0)))
    moved = logits(unrolled, *batch)
    assert np.abs(moved - logits(base, *batch)).max() > 1e-3
    # the same weights with the adapters off: the base model exactly (no copy of the weights)
    off = lora.adapters_off(nnx.merge(*nnx.split(unrolled)))
    np.testing.assert_array_equal(logits(off, *batch), logits(base, *batch))
    np.testing.assert_allclose(logits(unrolled, *batch), moved)  # the original keeps its adapters
    # a scanned model draws layer l's adapter as the unrolled layer l's
    scanned = init_model(DecoderConfig.preset("tiny", scan_layers=True, lora=LORA), jax.random.key(0))
    from ragen_jax.models.stacking import stack_layers

    nnx.replace_by_pure_dict(state := nnx.state(scanned), stack_layers(nnx.to_pure_dict(nnx.state(unrolled))))
    nnx.update(scanned, state)
    np.testing.assert_allclose(logits(scanned, *batch), moved, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scan", [False, True])
def test_merged_export_loads_in_transformers_with_the_adapted_logits(batch, tmp_path, scan):
    model = trained(init_model(DecoderConfig.preset("tiny", scan_layers=scan, lora=LORA), jax.random.key(0)))
    want = logits(model, *batch)
    merged = lora.merged(model)
    assert not merged.cfg.lora.rank and not jax.tree.leaves(nnx.state(merged, lora.LoRAParam))
    np.testing.assert_allclose(logits(merged, *batch), want, rtol=1e-4, atol=1e-4)
    hf.save_pretrained(model, tmp_path)  # merges on the way out
    config = json.loads((tmp_path / "config.json").read_text())
    assert "lora" not in json.dumps(config)
    torch_model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    valid = batch[1]  # padding slots' outputs are nobody's
    np.testing.assert_allclose(hf_logits(torch_model, *batch)[valid], want[valid], rtol=1e-4, atol=1e-4)


def test_adapters_only_is_peft_layout_and_merges_to_the_merged_export(tmp_path):
    model = trained(init_model(DecoderConfig.preset("tiny", scan_layers=True, lora=LORA), jax.random.key(0)))
    hf.save_adapters(model, tmp_path / "adapters", base="some/base")
    config = json.loads((tmp_path / "adapters" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8.0
    assert config["base_model_name_or_path"] == "some/base" and config["target_modules"] == list(LORA_TARGETS)
    tensors = load_file(tmp_path / "adapters" / "adapter_model.safetensors")
    assert len(tensors) == 3 * 7 * 2
    a = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    assert a.shape == (4, 96) and b.shape == (96, 4)  # [r, in], [out, r]
    # base + alpha / r · B A (torch's [out, in]) reproduces the merged export's weights
    hf.save_pretrained(init_model(DecoderConfig.preset("tiny", scan_layers=True), jax.random.key(0)), tmp_path / "base")
    hf.save_pretrained(model, tmp_path / "merged")
    base, merged = load_file(tmp_path / "base" / "model.safetensors"), load_file(tmp_path / "merged" / "model.safetensors")
    for name in merged:
        if name.endswith("_proj.weight"):
            prefix = "base_model.model." + name[:-len(".weight")]
            want = base[name] + 2.0 * tensors[prefix + ".lora_B.weight"] @ tensors[prefix + ".lora_A.weight"]
            np.testing.assert_allclose(merged[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(merged[name], base[name])


def test_a_hugging_face_base_loads_with_fresh_adapters(batch, tmp_path):
    base = init_model(DecoderConfig.preset("tiny"), jax.random.key(3))
    hf.save_pretrained(base, tmp_path)
    for scan in (False, True):
        model = hf.load_pretrained(tmp_path, scan_layers=scan, lora=LORA)
        assert model.cfg.lora == LORA and len(jax.tree.leaves(nnx.state(model, lora.LoRAParam))) == 2 * 7 * (
            1 if scan else 3)
        np.testing.assert_allclose(logits(model, *batch), logits(base, *batch), rtol=1e-5, atol=1e-5)


def test_frozen_base_weights_are_kept_in_the_compute_dtype(batch, tmp_path):
    """bfloat16 compute: the base weights are stored in bfloat16 (every layer casts to it at use,
    so the step-0 outputs are the base's bit for bit), the adapters in float32; merging folds
    them in float32 and exports float32."""
    cfg = dict(dtype="bfloat16", scan_layers=True)
    base = init_model(DecoderConfig.preset("tiny", **cfg), jax.random.key(0))
    model = init_model(DecoderConfig.preset("tiny", **cfg, lora=LORA), jax.random.key(0))
    frozen, adapters = nnx.state(model, nnx.Not(lora.LoRAParam)), nnx.state(model, lora.LoRAParam)
    assert {x.dtype for x in jax.tree.leaves(frozen)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(adapters)} == {jnp.dtype(jnp.float32)}
    for want, got in zip(jax.tree.leaves(nnx.state(base)), jax.tree.leaves(frozen)):
        np.testing.assert_array_equal(np.asarray(want).astype(jnp.bfloat16), got)
    np.testing.assert_array_equal(logits(base, *batch), logits(model, *batch))
    trained(model)
    merged = lora.merged(model)
    assert {x.dtype for x in jax.tree.leaves(nnx.state(merged))} == {jnp.dtype(jnp.float32)}
    q = model.layers.self_attn.q_proj
    want = q.kernel[...].astype(jnp.float32) + 2.0 * jnp.einsum("lir,lro->lio", q.lora_a[...], q.lora_b[...])
    np.testing.assert_allclose(merged.layers.self_attn.q_proj.kernel[...], want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(merged.norm.weight[...], model.norm.weight[...].astype(jnp.float32))
    hf.save_pretrained(model, tmp_path)
    assert {x.dtype for x in load_file(tmp_path / "model.safetensors").values()} == {np.dtype(np.float32)}


# ----------------------------------------------------------------------------- dropout

DROPOUT = LoraConfig(rank=4, alpha=8.0, dropout=0.3)


def test_dropout_of_one_projection_matches_numpy():
    """x W + b + (alpha / rank) · ((x · mask / (1 − p)) A) B, the mask drawn by bernoulli(1 − p)
    from the forward's key folded with the layer, then the projection's index in LORA_TARGETS."""
    p, layer, name = 0.25, 2, "down_proj"
    cfg = DecoderConfig.preset("tiny")
    linear = Linear(cfg, nnx.Rngs(0), 64, 48, (None, None), bias=True)
    rng = np.random.default_rng(0)
    linear.bias.set_value(jnp.asarray(rng.normal(size=48), jnp.float32))
    linear.add_adapter(jnp.asarray(rng.normal(size=(64, 4)), jnp.float32), 8.0, jnp.float32, p)
    linear.lora_b.set_value(jnp.asarray(rng.normal(size=(4, 48)), jnp.float32))
    x = rng.normal(size=(3, 5, 64)).astype(np.float32)
    forward_key = jax.random.key(11)
    inputs = LayerInputs(cos=None, sin=None, attn_mask=None, offset=0, query_block=128, cpu=CpuPath(),
                         dropout_key=forward_key)
    key = inputs.lora_key(layer, name)
    mine = jax.random.fold_in(jax.random.fold_in(forward_key, layer), LORA_TARGETS.index(name))
    np.testing.assert_array_equal(jax.random.key_data(key), jax.random.key_data(mine))
    mask = np.asarray(jax.random.bernoulli(mine, 1 - p, x.shape)).astype(np.float64)
    assert 0 < mask.mean() < 1
    w, b = (np.asarray(v[...], np.float64) for v in (linear.kernel, linear.bias))
    a, bb = (np.asarray(v[...], np.float64) for v in (linear.lora_a, linear.lora_b))
    want = x @ w + b + 2.0 * ((x * mask / (1 - p)) @ a) @ bb
    np.testing.assert_allclose(np.asarray(linear(jnp.asarray(x), key)), want, rtol=1e-5, atol=1e-5)
    plain = x @ w + b + 2.0 * (x @ a) @ bb  # no key: no dropout
    np.testing.assert_allclose(np.asarray(linear(jnp.asarray(x))), plain, rtol=1e-5, atol=1e-5)


def test_dropout_zeroes_a_fraction_p_and_keeps_the_mean():
    """10^6 entries from a fixed key: the dropped fraction within 0.005 of p (> 7 standard
    deviations), the kept entries scaled by 1 / (1 − p)."""
    for p in (0.1, 0.5):
        out = np.asarray(dropout(jnp.ones((1000, 1000), jnp.float32), jax.random.key(0), p))
        kept = out != 0
        assert abs(1 - kept.mean() - p) < 0.005, (p, kept.mean())
        np.testing.assert_allclose(out[kept], 1 / (1 - p), rtol=1e-6)
        assert abs(out.mean() - 1) < 0.01


def test_model_dropout_needs_a_key_and_scanned_draws_the_unrolled_masks(batch):
    """Without a key (or at p = 0) the forward is the model without dropout bit for bit; with
    one the trained adapters' outputs change, the same key giving the same outputs, and a
    scanned model draws layer l's masks as the unrolled layer l."""
    plain = trained(init_model(DecoderConfig.preset("tiny", lora=LORA), jax.random.key(0)))
    model = trained(init_model(DecoderConfig.preset("tiny", lora=DROPOUT), jax.random.key(0)))
    want = logits(plain, *batch)
    np.testing.assert_array_equal(logits(model, *batch), want)
    key = jax.random.key(5)
    np.testing.assert_array_equal(logits(plain, *batch, dropout_key=key), want)  # p = 0: the key unused
    dropped = logits(model, *batch, dropout_key=key)
    assert np.abs(dropped - want).max() > 1e-3
    np.testing.assert_array_equal(logits(model, *batch, dropout_key=key), dropped)
    assert np.abs(logits(model, *batch, dropout_key=jax.random.key(6)) - dropped).max() > 1e-3
    scanned = init_model(DecoderConfig.preset("tiny", scan_layers=True, lora=DROPOUT), jax.random.key(0))
    from ragen_jax.models.stacking import stack_layers

    nnx.replace_by_pure_dict(state := nnx.state(scanned), stack_layers(nnx.to_pure_dict(nnx.state(model))))
    nnx.update(scanned, state)
    np.testing.assert_allclose(logits(scanned, *batch, dropout_key=key), dropped, rtol=1e-5, atol=1e-5)
    ids, mask = (jnp.asarray(a) for a in batch)  # a forward into a KV cache (rollout) draws no masks
    with pytest.raises(ValueError, match="without a KV cache"):
        model(ids, positions_from_mask(mask), mask, DecodeContext(init_cache(model.cfg, 2, 9)), dropout_key=key)
