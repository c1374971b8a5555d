"""The planner on the real Qwen2.5-0.5B shapes over 8 fake CPU devices (tests/conftest.py):
nothing is allocated, one micro-batch's forward+backward of the scanned model (the real-size
configs scan their layers) is compiled on an FSDP mesh, and
the per-device parameter bytes — sharded abstract state and compiled executable alike —
agree with the analytic count. The rollout is cut to one short turn to keep the compile
quick; the model's shapes are the real ones."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from ragen_jax.analysis import planner
from ragen_jax.cli import plan
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import Decoder
from ragen_jax.training import micro_batch
from ragen_jax.run import config as config_lib

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "sokoban_qwen2p5_0p5b.py")
SHORT = {"rollout.num_groups": "8", "rollout.group_size": "2", "rollout.max_turns": "1",
         "rollout.max_new_tokens": "8", "algo.mini_batch_size": "16", "algo.micro_batch_size": "8",
         "diagnostics.enabled": "false"}


@pytest.fixture(scope="module")
def result():
    config = config_lib.apply_overrides(config_lib.load_config_file(CONFIG), SHORT)
    return planner.plan(config, (1, 8, 1), preset="qwen2.5-0.5b", compile_step=False, pieces=("remat-on", "update"))


def test_parameter_bytes_match_the_analytic_count(result):
    cfg = DecoderConfig.preset("qwen2.5-0.5b")
    assert result.num_params == cfg.num_params() == 494_032_768  # Qwen2.5-0.5B's published count
    # Under FSDP over 8 devices every matrix is split 8 ways; biases and norms (0.01% of the
    # weights) stay whole on every device.
    d, kv = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
    replicated = cfg.num_layers * (d + 2 * kv + 2 * d) + d
    exact = ((cfg.num_params() - replicated) // 8 + replicated) * 4  # float32 storage
    assert result.memory["parameters"] == exact
    assert result.memory["parameters"] == pytest.approx(result.analytic["parameters"], rel=2e-3)
    assert result.memory["optimiser"] == pytest.approx(2 * exact, abs=64)  # AdamW moments (+ a step count)
    assert result.memory["critic"] == exact + d * 4 // 8  # + the value head, split over fsdp too
    # The compiled executable holds exactly that on each device: its arguments are the
    # parameter shards plus the micro-batch's rows; its outputs the gradient shards.
    compiled = result.memory["micro-batch arguments"] - result.memory["micro-batch inputs"]
    assert compiled == exact
    assert result.memory["gradients"] == pytest.approx(exact, rel=1e-5)  # + the output tuple's bookkeeping


def test_costs_counted_on_small_models_are_the_whole_models():
    """The pieces' FLOPs come from the model cut to one or two unrolled layers and a smaller
    vocabulary (`_by_shape`): the same as compiling the whole model unrolled."""
    cfg = dataclasses.replace(DecoderConfig.preset("tiny"), scan_layers=False, vocab_chunk=0)
    batch = micro_batch.micro_batch_inputs(4, 64, 16, None)

    def compile_with(layers, vocab):
        model = nnx.eval_shape(lambda: Decoder(dataclasses.replace(cfg, num_layers=layers, vocab_size=vocab),
                                               rngs=nnx.Rngs(0)))
        return micro_batch.compile_gradient(nnx.graphdef(model), micro_batch.abstract_params(nnx.state(model), None),
                                            batch, None)

    by_shape, whole = planner._by_shape(5, 3000, compile_with), planner._cost(compile_with(5, 3000))
    assert by_shape["flops"] == pytest.approx(whole["flops"], rel=1e-3)
    assert by_shape["bytes accessed"] == pytest.approx(whole["bytes accessed"], rel=0.05)


def test_flops_and_activations_are_reported(result):
    xla, analytic = result.xla_flops["micro-batch fwd+bwd"]
    assert 0.9 < xla / analytic < 1.2
    assert result.memory["activations, remat on"] > 0
    assert result.flops["total"] == pytest.approx(result.flops["rollout"] + result.flops["update"])
    assert np.isfinite(result.estimate()["peak"])
    assert "parameters" in planner.report(result)


def test_the_whole_step_compiles_and_takes_the_train_state_as_arguments():
    """The whole-step path (`--no-step` not given), on the tiny model with its layers scanned (as
    the paper-sized configs run): its compiled arguments are the sharded train state plus the
    text tables, nothing replicated by mistake. (Unrolled layers on a mesh:
    tests/core/test_sharding.py.)"""
    tiny = config_lib.apply_overrides(config_lib.load_config_file(str(ROOT / "configs" / "sokoban_tiny.py")),
                                      {**SHORT, "algo.micro_batch_size": "0", "model.init": "None",
                                       "model.scan_layers": "true"})
    result = planner.plan(tiny, (2, 1, 1), compile_step=True, pieces=())
    state = sum(result.memory[k] for k in ("parameters", "optimiser", "critic", "critic optimiser"))
    assert state <= result.step["argument"] < state + 2**20  # + the codec's and prompt's tables
    assert result.step["peak"] >= result.step["argument"]
    s = result.step  # on the CPU the peak is the parts' sum (XLA CPU's own peak leaves temporaries out)
    assert s["peak"] == s["argument"] + s["output"] - s["alias"] + s["temp"]
    # its compile time in two parts, as the report prints them
    t = result.seconds
    assert t["train step: tracing to HLO"] > 0 and t["train step: XLA compiler"] > 0
    assert t["train step: tracing to HLO"] + t["train step: XLA compiler"] == pytest.approx(t["train step"])
    assert (f"compiled ({t['train step']:.0f} s: {t['train step: tracing to HLO']:.0f} s tracing to HLO, "
            f"{t['train step: XLA compiler']:.0f} s in XLA's compiler)") in planner.report(result)


@pytest.mark.parametrize("args, message", [
    (["--config", CONFIG, "--mesh", "3x3"], "--mesh '3x3' must be DATAxFSDPxTENSOR"),
    (["--config", CONFIG, "--mesh", "1x16x1"], "needs 16 devices"),
    (["--config", CONFIG, "--mesh", "1x8x1"], "model.path is required"),
    (["--config", CONFIG, "--mesh", "1x8x1", "--model", "qwen9"], "--model 'qwen9' is not a known preset"),
    (["--config", CONFIG, "--mesh", "1x8x1", "--config.model.path=/no/such/dir"], "model directory not found: /no/such/dir"),
    (["--config", CONFIG, "--mesh", "1x8x1", "--json", f"{__file__}/plan.json"], "--json's folder"),  # before compiling
])
def test_bad_input_gives_one_line_and_exit_2(args, message, capsys):
    code = plan.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_lora_state_holds_the_base_in_the_compute_dtype_and_moments_of_the_adapters(result):
    config = config_lib.apply_overrides(config_lib.load_config_file(CONFIG), {**SHORT, "model.lora.rank": "16"})
    lora = planner.plan(config, (1, 8, 1), preset="qwen2.5-0.5b", compile_step=False, pieces=())
    for key in ("parameters", "critic", "optimiser", "critic optimiser"):
        assert lora.memory[key] == pytest.approx(lora.analytic[key], rel=2e-3), key
    # the frozen base in bfloat16: half the bytes of full fine-tuning's float32 weights, plus the adapters
    adapters = lora.memory["optimiser"] / 2  # float32, as their two Adam moments each
    assert lora.memory["parameters"] == pytest.approx(result.memory["parameters"] / 2 + adapters, rel=1e-3)
    assert lora.memory["optimiser"] < result.memory["optimiser"] / 50


def test_bfloat16_moments_halve_the_optimiser_state_as_counted(result):
    config = config_lib.apply_overrides(config_lib.load_config_file(CONFIG), {**SHORT, "algo.adam_moments": "bfloat16"})
    half = planner.plan(config, (1, 8, 1), preset="qwen2.5-0.5b", compile_step=False, pieces=())
    for key in ("optimiser", "critic optimiser"):
        assert half.memory[key] == pytest.approx(result.memory[key] / 2, rel=1e-3), key
        assert half.analytic[key] == pytest.approx(half.memory[key], rel=2e-3), key
