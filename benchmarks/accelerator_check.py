"""One table of what the real-size train step does on whatever device jax has (CPU, GPU, TPU).

    python benchmarks/accelerator_check.py                 # Qwen2.5-0.5B shapes, random weights
    python benchmarks/accelerator_check.py --tiny          # the built-in tiny model, in seconds
    python benchmarks/accelerator_check.py --model qwen2.5-1.5b --peak-tflops 989 --json out.json
    python benchmarks/accelerator_check.py --set model.attention=cudnn   # any config key, to A/B it

The paper's setting (`configs/sokoban_qwen2p5_0p5b.py`: 8 groups × 16, 5 turns of up to 120
tokens, bfloat16 compute, layers scanned) on one device, with random weights from the preset
(no download) and every group kept by the filter, so each step runs a full update. Printed:
the backend and device; compile seconds of the whole step; the rollout alone (generated
tokens per second); seconds per train step with the diagnostics (step 1) and without; MFU =
the step's analytic FLOPs (`ragen_jax.analysis.planner.analytic_flops`: every decode to its full length)
/ seconds / the device's dense bfloat16 peak (a table of known devices; `--peak-tflops` for others); peak device memory
(`memory_stats()` where the backend has it, else the compiled step's memory analysis); and the
largest difference between this device's logits of a few tokens and a float32 CPU forward of
the same weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

# Dense bfloat16 peak TFLOP/s by device kind (the vendors' figures, without sparsity).
PEAK_TFLOPS = {
    "H200": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0,
    "TPU v6": 918.0, "TPU v5p": 459.0, "TPU v5 lite": 197.0, "TPU v5e": 197.0, "TPU v4": 275.0,
}


def peak_tflops(device_kind: str) -> float | None:
    """The known peak whose name the device kind contains (the longest such name)."""
    names = [name for name in PEAK_TFLOPS if name.lower() in device_kind.lower()]
    return PEAK_TFLOPS[max(names, key=len)] if names else None


def build_config(tiny: bool, model: str, overrides: dict[str, str] | None = None):
    """The paper's setting with a preset's random weights; `tiny`: the built-in tiny model on
    a short rollout (the same programs, sized for a CPU); then `overrides` (`--set KEY=VALUE`)."""
    from ragen_jax.run.config import apply_overrides, paper_config

    config = paper_config("SimpleSokoban", fsdp=False)
    config.model.preset = "tiny" if tiny else model
    config.filter.strategy = "none"  # every group updated: the step's full cost
    config.mesh.update(data=1, fsdp=1, tensor=1)
    if tiny:
        config.model.update(dtype="float32", vocab_chunk=256)
        config.rollout.update(num_groups=2, group_size=4, max_turns=2, max_new_tokens=16)
        config.algo.update(mini_batch_size=8, micro_batch_size=4)
        config.diagnostics.update(num_samples=4, per_turn_samples=2, answer_tokens=8, score_rows=2)
    return apply_overrides(config, overrides or {})


def logits_difference(model, tokens) -> float:
    """Max |logits on this device (compute dtype) − logits of a float32 CPU forward| of the
    same weights."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from ragen_jax.models.cache import positions_from_mask
    from ragen_jax.models.decoder import Decoder

    def forward(m, ids):
        mask = jnp.ones(ids.shape, bool)
        hidden, _ = m(ids, positions_from_mask(mask), mask)
        return m.logits(hidden)

    here = jax.jit(forward)(model, tokens)
    cpu = jax.devices("cpu")[0]
    cfg32 = dataclasses.replace(model.cfg, dtype="float32", param_dtype="float32")
    graph, state = nnx.split(model)
    reference = nnx.eval_shape(lambda: Decoder(cfg32, rngs=nnx.Rngs(0)))
    _, ref_state = nnx.split(reference)
    values = jax.tree.map(lambda x: jax.device_put(x.astype(jnp.float32), cpu), nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(ref_state, values)
    reference = nnx.merge(nnx.graphdef(reference), ref_state)
    with jax.default_device(cpu):
        want = jax.jit(forward)(reference, jax.device_put(tokens, cpu))
    return float(jnp.max(jnp.abs(jax.device_get(here).astype(jnp.float32) - jax.device_get(want))))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the built-in tiny model on a short rollout (seconds)")
    parser.add_argument("--model", default="qwen2.5-0.5b", help="a preset's shapes (default qwen2.5-0.5b)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's dense bfloat16 peak, when the table does not know it")
    parser.add_argument("--steps", type=int, default=2, help="timed steps after the first (default 2)")
    parser.add_argument("--json", default=None, help="also write the figures as JSON to this file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override, e.g. model.attention=cudnn (repeatable)")
    args = parser.parse_args(argv)
    for item in args.set:
        if "=" not in item:
            parser.error(f"--set {item!r}: expected KEY=VALUE")
    if args.steps < 1:
        parser.error(f"--steps={args.steps} must be >= 1")

    import jax
    import jax.numpy as jnp
    import numpy as np

    from ragen_jax.analysis import planner
    from ragen_jax.rollout.layout import buffer_layout
    from ragen_jax.run import config as config_lib
    from ragen_jax.run.experiment import make_experiment

    try:
        config = build_config(args.tiny, args.model, dict(item.split("=", 1) for item in args.set))
        exp = make_experiment(config, jax.devices()[:1])
        started = time.perf_counter()
        exp = exp.for_training()  # algo.micro_batch_size=auto: chosen here (compiles)
        auto_s = time.perf_counter() - started
    except (config_lib.ConfigError, ValueError) as err:
        parser.error(str(err).splitlines()[0])
    device = jax.devices()[0]
    trainer = exp.trainer()
    layout = buffer_layout(exp.env, exp.env_params, exp.codec, exp.prompt, exp.run.step.rollout)
    flops = planner.analytic_flops(exp.model.cfg, exp.run.step, layout)
    diagnostics_flops = planner.diagnostics_flops(exp.model.cfg, exp.run.step.diagnostics, exp.run.step.rollout, layout)
    row = {"backend": jax.default_backend(), "device": device.device_kind, "model": exp.model.cfg.num_params(),
           "overrides": " ".join(args.set) or "none", "micro_batch": trainer.config.algo.micro_batch,
           "micro_batch_s": auto_s}

    state = trainer.init_state(jax.random.key(0), exp.model)
    started = time.perf_counter()
    compiled = jax.jit(trainer.step_fn, donate_argnums=0).lower(state, exp.codec, exp.prompt).compile()
    row["compile_s"] = time.perf_counter() - started

    rollout = jax.jit(trainer.play_rollout).lower(state.policy, jax.random.key(1), exp.codec, exp.prompt).compile()
    jax.block_until_ready(rollout(state.policy, jax.random.key(1), exp.codec, exp.prompt))
    started = time.perf_counter()
    traj = jax.block_until_ready(rollout(state.policy, jax.random.key(2), exp.codec, exp.prompt))
    seconds = time.perf_counter() - started
    row["rollout_s"] = seconds
    row["rollout_tokens_per_s"] = float(np.sum(np.asarray(traj.gen_lengths))) / seconds
    del traj

    times = []
    for _ in range(args.steps + 1):  # step 1 runs the diagnostics
        started = time.perf_counter()
        state, metrics = compiled(state, exp.codec, exp.prompt)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - started)
    row["step1_s"], row["step_s"] = times[0], float(np.median(times[1:]))
    row["kept_rows"] = float(metrics["update/kept_rows"])
    step_flops = flops["rollout"] + flops["update"]
    peak = args.peak_tflops or peak_tflops(device.device_kind)
    row["peak_tflops"] = peak
    row["mfu"] = step_flops / row["step_s"] / (peak * 1e12) if peak else None
    row["mfu_step1"] = (step_flops + diagnostics_flops) / row["step1_s"] / (peak * 1e12) if peak else None

    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "peak_bytes_in_use" in stats:
        row["peak_memory_gib"], row["memory_source"] = stats["peak_bytes_in_use"] / 2 ** 30, "memory_stats"
    else:
        m = compiled.memory_analysis()
        total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
        row["peak_memory_gib"], row["memory_source"] = total / 2 ** 30, "compiled analysis"

    from flax import nnx

    model = nnx.merge(trainer.policy_graph, state.policy)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, model.cfg.vocab_size, (2, 16)), jnp.int32)
    row["logits_max_abs_diff"] = logits_difference(model, tokens)

    print(table(row))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(row, fh, indent=2)
    return 0


def table(row: dict) -> str:
    mfu = lambda v: "n/a (no known peak: --peak-tflops)" if v is None else f"{100 * v:.1f}%"
    lines = [
        "| quantity | value |", "| --- | --- |",
        f"| backend / device | {row['backend']} / {row['device']} |",
        f"| model | {row['model'] / 1e9:.3f}B parameters, random weights |",
        f"| config overrides | {row['overrides']} |",
        f"| micro-batch | {row['micro_batch']} rows (building the trainer: {row['micro_batch_s']:.1f} s) |",
        f"| whole step compile | {row['compile_s']:.1f} s |",
        f"| rollout alone | {row['rollout_s']:.2f} s, {row['rollout_tokens_per_s']:,.0f} generated tokens/s |",
        f"| train step (with diagnostics, step 1) | {row['step1_s']:.2f} s, MFU {mfu(row['mfu_step1'])} |",
        f"| train step | {row['step_s']:.2f} s, MFU {mfu(row['mfu'])} ({row['kept_rows']:.0f} rows updated) |",
        f"| where a step's time goes | rollout {row['rollout_s']:.2f} s, the rest (filter, advantages, update) "
        f"{row['step_s'] - row['rollout_s']:.2f} s, diagnostics (step 1 − step) {row['step1_s'] - row['step_s']:.2f} s |",
        f"| peak device memory ({row['memory_source']}) | {row['peak_memory_gib']:.2f} GiB |",
        f"| logits vs float32 CPU forward | max abs diff {row['logits_max_abs_diff']:.3g} |",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
