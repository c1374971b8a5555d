"""The scanned model (layers stacked, one block's program run by `lax.scan`) against
transformers and against the per-layer model: logits, KV-cache decoding with holes, gradients
under every remat policy, Hugging Face load/export and checkpoints across the two layouts; the
forward-only programs on an unrolled copy of a scanned model (`model.unroll_inference`)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import Qwen2ForCausalLM

from ragen_jax.models import hf, lora, sampling
from ragen_jax.models.cache import positions_from_mask
from ragen_jax.models.config import REMAT_POLICIES, DecoderConfig, LoraConfig
from ragen_jax.models.decoder import init_model
from ragen_jax.models.layers import Linear
from ragen_jax.models.stacking import for_inference, stack_layers, stacked_layout, unstack_layers

from hf_reference import VOCAB, hf_logits

TOL_HF = 1e-4  # against transformers (float32)
TOL_UNROLLED = 1e-5  # against our per-layer model


@pytest.fixture(scope="module")
def models(hf_models):
    """(transformers model, per-layer model, scanned model) of the untied checkpoint."""
    torch_model, path = hf_models["untied"]
    return torch_model, hf.load_pretrained(path), hf.load_pretrained(path, scan_layers=True)


@pytest.fixture(scope="module")
def holey():
    """Token ids and masks with left and right padding and holes inside, 150 slots (past one
    128-slot query block)."""
    rng = np.random.default_rng(7)
    ids = rng.integers(3, VOCAB, size=(3, 150)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    mask[0, 140:] = False
    mask[1, :9] = False
    mask[1, 60:71] = False
    mask[2, [5, 6, 90, 131]] = False
    return ids, mask


def logits(model, ids, mask):
    mask = jnp.asarray(mask)
    hidden, _ = model(jnp.asarray(ids), positions_from_mask(mask), mask)
    return np.asarray(model.logits(hidden))


def test_scanned_weights_are_the_layers_stacked(models):
    _, unrolled, scanned = models
    state = nnx.to_pure_dict(nnx.state(scanned))
    assert stacked_layout(state) and not stacked_layout(nnx.to_pure_dict(nnx.state(unrolled)))
    assert state["layers"]["mlp"]["up_proj"]["kernel"].shape == (2, 64, 160)
    spec = nnx.get_partition_spec(nnx.state(scanned.layers))["mlp"]["up_proj"]["kernel"].get_value()
    assert tuple(spec) == (None, "fsdp", "tensor")  # the layer axis is never sharded
    per_layer = nnx.to_pure_dict(nnx.state(unrolled))
    np.testing.assert_array_equal(state["layers"]["self_attn"]["q_proj"]["bias"][1],
                                  per_layer["layers"][1]["self_attn"]["q_proj"]["bias"])


def test_scanned_logits_match_transformers_and_the_unrolled_model(models, holey):
    torch_model, unrolled, scanned = models
    ids, mask = holey
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    got = logits(scanned, ids, mask)
    assert np.abs(got - hf_logits(torch_model, ids, mask, positions))[mask].max() <= TOL_HF
    assert np.abs(got - logits(unrolled, ids, mask))[mask].max() <= TOL_UNROLLED


def test_random_init_equals_the_per_layer_models_stacked():
    cfg = DecoderConfig.preset("tiny")
    per_layer = nnx.to_pure_dict(nnx.state(init_model(cfg, jax.random.key(3))))
    scanned = nnx.to_pure_dict(nnx.state(init_model(dataclasses.replace(cfg, scan_layers=True), jax.random.key(3))))
    for a, b in zip(jax.tree.leaves(stack_layers(per_layer)), jax.tree.leaves(scanned)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_scanned_kv_cache_decoding_equals_the_unrolled_model(models, holey, temperature):
    """Prefill of holey prompts and decoding through the stacked KV cache: the same tokens as
    the per-layer model (which decodes through its per-layer buffers), log-probs within 1e-5."""
    _, unrolled, scanned = models
    ids, mask = (jnp.asarray(x[:, :40]) for x in holey)
    params = sampling.SamplingParams(temperature=temperature) if temperature else sampling.GREEDY
    run = lambda m: sampling.generate(m, ids, mask, jax.random.key(4), max_new_tokens=24, params=params)
    a, b = run(unrolled), run(scanned)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=TOL_UNROLLED)
    np.testing.assert_array_equal(np.asarray(a.lengths), np.asarray(b.lengths))


def test_scanned_decode_into_a_buffer_matches_a_full_forward(models):
    """A chunk prefilled at an offset behind a hole-filled gap, then decoded with a static
    `key_limit` into the stacked cache: the recorded log-probs are a full forward's."""
    _, _, model = models
    rng = np.random.default_rng(8)
    b, p, gap, new = 2, 12, 6, 10
    prompt = jnp.asarray(rng.integers(3, VOCAB, size=(b, p)), jnp.int32)
    from ragen_jax.models.cache import init_cache

    cache = init_cache(model.cfg, b, p + gap + new + 5)
    cache, first = sampling.prefill(model, cache, prompt, jnp.ones((b, p), bool), 0)
    cache, out = sampling.decode(model, cache, first, p + gap, jax.random.key(1), num_steps=new,
                                 params=sampling.SamplingParams(temperature=1.0), key_limit=p + gap + new)
    tokens = jnp.concatenate([prompt, jnp.zeros((b, gap), jnp.int32), out.tokens], 1)
    valid = jnp.concatenate([jnp.ones((b, p), bool), jnp.zeros((b, gap), bool), jnp.ones((b, new), bool)], 1)
    hidden, _ = model(tokens, positions_from_mask(valid), valid)
    query = jnp.concatenate([jnp.array([p - 1]), p + gap + jnp.arange(new - 1)])
    want = jax.nn.log_softmax(model.logits(hidden[:, query]))
    want = jnp.take_along_axis(want, out.tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(want), atol=TOL_UNROLLED)


@pytest.mark.parametrize("policy", [None, *REMAT_POLICIES])
def test_scanned_gradients_equal_the_unrolled_models_under_every_remat_policy(hf_models, holey, policy):
    path = hf_models["tied"][1]
    ids, mask = (jnp.asarray(x[:, :48]) for x in holey)
    pos = positions_from_mask(mask)
    remat = dict(remat=policy is not None, remat_policy=policy or "full")
    unrolled = hf.load_pretrained(path)
    scanned = hf.load_pretrained(path, scan_layers=True, **remat)

    def loss(m):
        hidden, _ = m(ids, pos, mask)
        return jnp.mean(jnp.where(mask, jax.nn.log_softmax(m.logits(hidden))[..., 5], 0.0))

    g_unrolled = nnx.to_pure_dict(nnx.grad(loss)(unrolled))
    g_scanned = nnx.to_pure_dict(nnx.grad(loss)(scanned))
    for a, b in zip(jax.tree.leaves(stack_layers(g_unrolled)), jax.tree.leaves(g_scanned)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=TOL_UNROLLED)
    assert float(jnp.abs(g_scanned["layers"]["mlp"]["down_proj"]["kernel"]).max()) > 0


def test_scanned_model_exports_per_layer_tensors_that_transformers_loads(models, holey, tmp_path):
    torch_model, unrolled, scanned = models
    hf.save_pretrained(scanned, tmp_path / "scanned")
    hf.save_pretrained(unrolled, tmp_path / "unrolled")
    a = hf.SafetensorsFile(tmp_path / "scanned" / "model.safetensors")
    b = hf.SafetensorsFile(tmp_path / "unrolled" / "model.safetensors")
    assert sorted(a.keys()) == sorted(b.keys())
    for name in a.keys():
        np.testing.assert_array_equal(a.array(name), b.array(name))
    reloaded = Qwen2ForCausalLM.from_pretrained(tmp_path / "scanned").eval()
    ids, mask = holey
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    np.testing.assert_allclose(hf_logits(reloaded, ids, mask, positions), hf_logits(torch_model, ids, mask, positions),
                               atol=1e-6)


def test_stacked_load_onto_a_mesh_reads_each_shard(hf_models, holey):
    from ragen_jax.core import sharding

    mesh = sharding.make_mesh((1, 4, 2), jax.devices()[:8])
    path = hf_models["untied"][1]
    model = hf.load_pretrained(path, mesh, scan_layers=True)
    kernel = model.layers.mlp.up_proj.kernel[...]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    reference = hf.load_pretrained(path, scan_layers=True)
    np.testing.assert_array_equal(np.asarray(kernel), np.asarray(reference.layers.mlp.up_proj.kernel[...]))


def test_layout_conversions_round_trip():
    cfg = DecoderConfig.preset("tiny")
    per_layer = nnx.to_pure_dict(nnx.state(init_model(cfg, jax.random.key(0))))
    stacked = stack_layers(per_layer)
    back = unstack_layers(stacked, cfg.num_layers)
    assert jax.tree.structure(back) == jax.tree.structure(per_layer)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(per_layer)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("saved_scanned", [False, True])
def test_a_checkpoint_restores_its_policy_into_either_layout(tmp_path, saved_scanned):
    from ragen_jax.run.checkpoint import Checkpoints
    from ragen_jax.training.step import TrainState

    cfg = DecoderConfig.preset("tiny", scan_layers=saved_scanned)
    saved = init_model(cfg, jax.random.key(0))
    state = TrainState(step=jnp.int32(3), key=jax.random.key(0), policy=nnx.state(saved), policy_opt=None,
                       critic=None, critic_opt=None, reference=None, empty_streak=jnp.int32(0), diagnostics=None)
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save(state)
    checkpoints.close()
    for scanned in (False, True):
        other_cfg = dataclasses.replace(cfg, scan_layers=scanned)
        model = init_model(other_cfg, jax.random.key(9))
        nnx.update(model, Checkpoints(tmp_path, read_only=True).restore_policy(3, nnx.state(model)))
        want = nnx.state(init_model(other_cfg, jax.random.key(0)))
        for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------------------- unrolled for inference


def tiny_scanned(unroll: bool, adapters: bool = False):
    """The scanned tiny model (`unroll_inference` as given); with `adapters`, LoRA adapters moved
    off their start (B nonzero, as training leaves them)."""
    cfg = DecoderConfig.preset("tiny", scan_layers=True, unroll_inference=unroll,
                               lora=LoraConfig(rank=4, alpha=8.0) if adapters else LoraConfig())
    model = init_model(cfg, jax.random.key(0))
    if adapters:
        leaves, tree = jax.tree.flatten(nnx.state(model, lora.LoRAParam))
        keys = jax.random.split(jax.random.key(1), len(leaves))
        nnx.update(model, jax.tree.unflatten(tree, [x + 0.05 * jax.random.normal(k, x.shape, x.dtype)
                                                   for x, k in zip(leaves, keys)]))
    return model


def tiny_prompts():
    rng = np.random.default_rng(5)
    ids = jnp.asarray(rng.integers(3, 1024, size=(4, 10)), jnp.int32)
    return ids, jnp.asarray(np.arange(10)[None] >= np.array([[0], [3], [0], [6]]))  # left padding


def test_unroll_inference_off_changes_nothing():
    """Off (the default): `for_inference` of a scanned model is the same graph and weights, so
    the same programs and numbers as before the key existed."""
    model = tiny_scanned(False)
    copy = for_inference(model)
    assert nnx.graphdef(copy) == nnx.graphdef(model) and copy.cfg.scan_layers
    for a, b in zip(jax.tree.leaves(nnx.state(copy)), jax.tree.leaves(nnx.state(model))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ids, mask = tiny_prompts()
    run = lambda m: sampling.generate(m, ids, mask, jax.random.key(2), max_new_tokens=6, params=sampling.GREEDY)
    a, b = run(copy), run(model)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_unrolled_copy_holds_the_stacked_weights_slices():
    """Layer l's every weight (adapters included) is the stacked weight's [l] (NumPy indexing),
    its partition spec the stacked one's without the layer axis; adapters switched off stay off."""
    model = tiny_scanned(True, adapters=True)
    copy = for_inference(model)
    assert model.cfg.scan_layers and not copy.cfg.scan_layers and len(copy.layers) == 3
    assert all(not block.self_attn.cfg.scan_layers for block in copy.layers)
    stacked = nnx.to_flat_state(nnx.state(model.layers))
    specs = nnx.to_flat_state(nnx.get_partition_spec(nnx.state(model.layers)))
    assert any("lora_b" in path for path, _ in stacked)
    for i, block in enumerate(copy.layers):
        layer = dict(nnx.to_flat_state(nnx.state(block)))
        layer_specs = dict(nnx.to_flat_state(nnx.get_partition_spec(nnx.state(block))))
        assert len(layer) == len(stacked)
        for (path, var), (_, spec) in zip(stacked, specs):
            np.testing.assert_array_equal(np.asarray(layer[path][...]), np.asarray(var[...])[i])
            assert tuple(layer_specs[path].get_value()) == tuple(spec.get_value())[1:]
    off = for_inference(lora.adapters_off(tiny_scanned(True, adapters=True)))
    linears = [node for _, node in nnx.iter_graph(off.layers) if isinstance(node, Linear)]
    assert len(linears) == 21 and not any(node.adapted for node in linears)


@pytest.mark.parametrize("adapters", [False, True])
def test_unrolled_sampling_equals_the_scanned_models(adapters):
    """`sampling.generate` on the unrolled copy: the scanned model's tokens (greedy and sampled
    with a fixed key), log-probs within 1e-5 (float32); with trained LoRA adapters too."""
    model = tiny_scanned(True, adapters)
    copy = for_inference(model)
    ids, mask = tiny_prompts()
    for params in (sampling.GREEDY, sampling.SamplingParams(temperature=0.8)):
        run = lambda m: sampling.generate(m, ids, mask, jax.random.key(3), max_new_tokens=8, params=params)
        want, got = run(model), run(copy)
        np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
        np.testing.assert_array_equal(np.asarray(got.lengths), np.asarray(want.lengths))
        np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(want.logprobs), atol=TOL_UNROLLED)


def test_unrolled_copy_keeps_the_layers_sharding_on_a_mesh():
    """Traced under a mesh that splits the model, each layer's weights come out sharded as the
    unrolled model declares them (the stacked spec without its layer axis)."""
    from ragen_jax.core import sharding

    mesh = sharding.make_mesh((1, 4, 2), jax.devices()[:8])
    model = sharding.shard_model(tiny_scanned(True), mesh)
    graph, state = nnx.split(model)
    layers = jax.jit(lambda s: nnx.state(for_inference(nnx.merge(graph, s)).layers))
    with sharding.tracing_on(mesh):
        out = layers(state)
    P = jax.sharding.PartitionSpec
    assert out[1]["mlp"]["up_proj"]["kernel"][...].sharding.spec == P("fsdp", "tensor")
    assert out[2]["self_attn"]["o_proj"]["kernel"][...].sharding.spec == P("tensor", "fsdp")
    np.testing.assert_array_equal(np.asarray(out[2]["mlp"]["down_proj"]["kernel"][...]),
                                  np.asarray(model.layers.mlp.down_proj.kernel[...])[2])


def test_train_step_rollout_with_unrolled_inference_equals_the_scanned_one():
    """The train step's rollout (`Trainer.play_rollout`, through `for_inference`) of a scanned
    LoRA policy: the same tokens, masks and lengths with the layers unrolled as scanned, float
    fields (log-probs) within 1e-5."""
    from ragen_jax.rl.algorithms import AlgoConfig
    from ragen_jax.rl.filtering import FilterConfig
    from ragen_jax.rollout.play import RolloutConfig
    from ragen_jax.training.step import StepConfig, Trainer

    from agent_setup import text_parts

    rollout = RolloutConfig(num_groups=2, group_size=2, max_turns=1, max_actions_per_turn=2,
                            max_actions_per_traj=2, max_new_tokens=8)
    env, params, _, codec, prompt = text_parts("SimpleSokoban", rollout.max_actions_per_turn)
    config = StepConfig(rollout=rollout, filter=FilterConfig(strategy="none"),
                        algo=AlgoConfig.preset("grpo", mini_batch_size=4))
    trajectories = []
    for unroll in (False, True):
        model = tiny_scanned(unroll, adapters=True)
        trainer = Trainer(config, model, env, params, codec, prompt)
        trajectories.append(trainer.play_rollout(nnx.state(model), jax.random.key(7), codec, prompt))
    want, got = trajectories
    assert int(np.asarray(want.gen_lengths).sum()) > 0
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        a, b = np.asarray(a), np.asarray(b)
        if np.issubdtype(b.dtype, np.floating):
            np.testing.assert_allclose(a, b, atol=TOL_UNROLLED)
        else:
            np.testing.assert_array_equal(a, b)
