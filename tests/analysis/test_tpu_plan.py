"""`plan --target`: the train step compiled by XLA's TPU compiler for a Cloud TPU slice on this
CPU machine (libtpu, the `tpu` extra; the compile tests skip without it). The step is the tiny
model's, cut to one short turn without diagnostics, for one v5e chip and for a 2×2 v5e slice
split over data × fsdp. The accelerator types' topologies and the compiler's out-of-memory
messages are checked against Cloud TPU's published slice shapes and the compiler's own words."""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from ragen_jax.analysis import planner, tpu_targets
from ragen_jax.cli import plan
from ragen_jax.run import config as config_lib

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "sokoban_tiny.py")
REDUCED = {"rollout.num_groups": "8", "rollout.group_size": "2", "rollout.max_turns": "1",
           "rollout.max_new_tokens": "8", "algo.mini_batch_size": "16", "algo.micro_batch_size": "8",
           "diagnostics.enabled": "false", "model.init": "None"}
needs_libtpu = pytest.mark.skipif(not tpu_targets.libtpu_available(),
                                  reason="the TPU compiler is not installed (pip install -e '.[tpu]')")


@pytest.mark.parametrize("name, topology, chips, host", [
    ("v5e-1", "v5e:1x1", 1, (1, 1, 1)),  # Colab's TPU
    ("v5litepod-4", "v5e:2x2", 4, (2, 2, 1)),  # Cloud's name for v5e
    ("v5e-8", "v5e:2x4", 8, (2, 4, 1)),  # one host of 8 chips
    ("v5e-16", "v5e:4x4", 16, (2, 2, 1)),  # 4 hosts of 2×2
    ("v6e-1", "v6e:1x1", 1, (1, 1, 1)),
    ("v6e-8", "v6e:2x4", 8, (2, 4, 1)),
    ("v4-8", "v4:2x2x1", 4, (2, 2, 1)),  # v4 and v5p count TensorCores, two per chip
    ("v4-16", "v4:2x2x2", 8, (2, 2, 1)),
    ("v5p-8", "v5p:2x2x1", 4, (2, 2, 1)),
    ("v5p-32", "v5p:2x2x4", 16, (2, 2, 1)),
])
def test_accelerator_types_become_their_topologies(name, topology, chips, host):
    target = tpu_targets.parse_target(name)
    assert (target.topology, target.chips, target.host_bounds) == (topology, chips, host)


@pytest.mark.parametrize("name", ["v5e-2", "v5e-3", "v4-4", "v4-6", "v5p-9", "v7x-8", "tpu", "v5e", "v5e-0"])
def test_unknown_slices_are_refused(name):
    with pytest.raises(tpu_targets.TargetError, match=f"--target '{name}'"):
        tpu_targets.parse_target(name)


def test_the_compilers_out_of_memory_messages_give_need_and_capacity():
    used = ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
            "Used 15.88G of 15.75G hbm. Exceeded hbm capacity by 137.60M.")
    temps = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
             "(22.20G) exceeds available HBM (15.75G).")
    g = 2 ** 30
    assert tpu_targets.out_of_memory(used) == (int(15.88 * g), int(15.75 * g), True)
    assert tpu_targets.out_of_memory(temps) == (int(22.20 * g), int(15.75 * g), False)  # a lower bound
    assert tpu_targets.out_of_memory("INVALID_ARGUMENT: something else") is None


def reduced_tiny(**extra):
    return config_lib.apply_overrides(config_lib.load_config_file(TINY), {**REDUCED, **extra})


@pytest.fixture(scope="module")
def one_chip():
    return planner.plan(reduced_tiny(), None, target=tpu_targets.parse_target("v5e-1"),
                        pieces=("update", "decode"))


@needs_libtpu
def test_the_step_compiles_for_one_v5e_chip_and_fits(one_chip):
    p = one_chip
    assert p.target == "v5e-1" and p.chip["device_kind"] == "TPU v5 lite" and p.mesh == (1, 1, 1)
    assert p.fits is True and p.does_not_fit == {}
    state = sum(p.memory[k] for k in ("parameters", "optimiser", "critic", "critic optimiser", "reference"))
    assert state <= p.step["argument"] < state + 2 ** 20  # the train state plus the text tables
    assert 0 <= p.step["output"] - p.step["alias"] < 2 ** 16  # the state is donated (updated in place): the metrics
    assert p.step["argument"] <= p.peak_bytes < p.chip["hbm_bytes"]
    # the compiler's cost of the pieces: the decode step within 10% of the analytic FLOPs
    xla, analytic = p.xla_flops["decode step (last turn)"]
    assert 0.9 < xla / analytic < 1.1
    estimate = p.step_time()
    assert estimate["seconds"] > estimate["decode seconds"] > 0 and 0 < estimate["mfu"] < 1
    text = planner.report(p)
    assert "fits one TPU v5 lite chip" in text and "compiled by the TPU compiler" in text


@needs_libtpu
def test_a_plan_that_does_not_fit_says_what_it_needs(one_chip):
    oom = {"need": int(17.5 * 2 ** 30), "available": int(15.75 * 2 ** 30), "whole": True}
    p = dataclasses.replace(one_chip, step=None, does_not_fit={"train step": oom})
    assert p.fits is False and p.peak_bytes == oom["need"]
    assert "does not fit: the train step needs 17.50 GiB of 15.75 GiB per chip" in planner.report(p)
    assert p.to_json()["fits"] is False


@needs_libtpu
def test_validation_lowers_for_a_chip_without_running_anything():
    """`plan --programs`' validation lowers for a v5e chip's compile-only devices, on which
    nothing runs, not even the seed's conversion to a key (compiling it for the chip takes
    minutes; the same code compiles for CPU devices in tests/analysis/test_programs.py)."""
    from ragen_jax.training.validation import Validator

    devices = tpu_targets.compile_only_devices(tpu_targets.parse_target("v5e-1"))
    cfg, _, mesh, trainer, _, run = planner.abstract_trainer(reduced_tiny(), None, None, devices)
    model = planner.abstract_model(cfg)
    state = trainer.abstract_state(model)
    validator = Validator(model, trainer.env, trainer.env_params, trainer.codec, trainer.prompt, run.settings.eval,
                          run.step.rollout, mesh)
    lowered = validator.lower(state.policy)
    assert {d.platform for d in mesh.devices.flat} == {"tpu"}
    assert "@main" in lowered.as_text()  # the rollout's program, lowered for the chip


@needs_libtpu
def test_the_compiler_refusing_a_program_too_large_for_the_chip_is_caught():
    """A program whose outputs alone exceed a v5e chip: the compiler's RESOURCE_EXHAUSTED becomes
    the figures, any other compile error still raises."""
    device = tpu_targets.compile_only_devices(tpu_targets.parse_target("v5e-1"))[0]
    big = jax.ShapeDtypeStruct((6 * 2 ** 18, 1024), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(device))
    compiled, oom = planner.compiled_or_oom(lambda: jax.jit(lambda a: (a + 1, a * 2)).lower(big).compile())
    assert compiled is None and oom["need"] >= 18 * 2 ** 30 and oom["available"] < 16 * 2 ** 30

    def broken():
        raise RuntimeError("INVALID_ARGUMENT: not a memory problem")

    with pytest.raises(RuntimeError, match="not a memory problem"):
        planner.compiled_or_oom(broken)


@needs_libtpu
def test_a_two_by_two_slice_splits_the_rows_and_the_weights():
    """v5e-4 on a data=2 × fsdp=2 mesh: each chip holds half of every matrix (the analytic count
    with the mesh's sharding), and the step compiles for the four chips."""
    p = planner.plan(reduced_tiny(), (2, 2, 1), target=tpu_targets.parse_target("v5e-4"), pieces=())
    assert p.mesh == (2, 2, 1) and p.fits
    assert p.memory["parameters"] == pytest.approx(p.analytic["parameters"], rel=0.02)
    whole = planner.plan(reduced_tiny(), (1, 1, 1), compile_step=False, pieces=())  # one CPU device
    assert p.memory["parameters"] < 0.6 * whole.memory["parameters"]
    assert p.step["argument"] < 0.6 * whole.memory["parameters"] * 3  # parameters + moments, halved


@needs_libtpu
def test_the_command_writes_target_fits_and_peak_to_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code = plan.main(["--config", TINY, "--target", "v5e-1", "--no-step", "--pieces", "decode", "--json", str(out),
                      *(f"--config.{k}={v}" for k, v in REDUCED.items())])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["target"] == "v5e-1" and data["fits"] is True and data["peak_bytes"] is None  # no step compiled
    assert data["chip"]["hbm_bytes"] == 16 * 2 ** 30
    assert "decode step (last turn)" in data["costs"]


@pytest.mark.parametrize("args, message", [
    (["--config", TINY, "--target", "v7x-8"], "--target 'v7x-8' is not a TPU accelerator type"),
    (["--config", TINY], "--mesh DATAxFSDPxTENSOR is required without --target"),
    pytest.param(["--config", TINY, "--target", "v5e-1", "--mesh", "1x2x1"], "needs 2 devices; the target has 1",
                 marks=needs_libtpu),
])
def test_bad_targets_give_one_line_and_exit_2(args, message, capsys):
    code = plan.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
