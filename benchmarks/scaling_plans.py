"""Which mesh, micro-batch, remat and algorithm fit each Qwen2.5 size on each accelerator, and
how long a step should take: `python benchmarks/scaling_plans.py [--json out.json] [--pieces]`.

For every (model, accelerator) pair the candidate settings are planned in order of preference
(`ragen_jax.analysis.planner.plan`, abstract: no weights, 8 fake CPU devices, meshes over the first n) and
the first whose estimated peak per device fits in 90% of the device's memory is printed,
with the expected step time from the analytic FLOPs at the stated MFU and, for the rollout's
decoding, the memory-bandwidth floor (every decode step reads the full weights as stored and
the KV cache of its rows). `--pieces` also compiles, per model, one micro-batch's
forward+backward and one decode step on the 8-device mesh and prints XLA's FLOPs beside the
analytic count. Results: docs/scaling.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ragen_jax.run import config as config_lib  # noqa: E402
from ragen_jax.analysis import planner as plan_lib  # noqa: E402

MFU = 0.40
GiB = 2 ** 30
# devices, memory per device (GiB), dense bf16 peak FLOP/s per device, memory bandwidth B/s
HARDWARE = {
    "TPU v5e-8": (8, 16, 197e12, 819e9),
    "TPU v4-8": (4, 32, 275e12, 1228e9),
    "TPU v5p-8": (4, 95, 459e12, 2765e9),
    "1× H100": (1, 80, 989e12, 3350e9),
    "8× H100": (8, 80, 989e12, 3350e9),
}
MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b")


def candidates(n: int):
    """(label, mesh, overrides) in order of preference: the paper's PPO with data parallelism
    (no weight gathers), then FSDP with smaller micro-batches, then half the MI samples (the
    diagnostics' largest pair set), then GRPO (no critic: half the state)."""
    fsdp = "FSDP" if n > 1 else "one device"
    out = [("PPO, data parallel, micro 16" if n > 1 else "PPO, one device, micro 16", (n, 1, 1),
            {"algo.micro_batch_size": "16"})]
    for micro in (8, 4, 2):
        out.append((f"PPO, {fsdp}, micro {micro}", (1, n, 1), {"algo.micro_batch_size": str(micro)}))
    for micro in (4, 2):
        out.append((f"PPO, {fsdp}, micro {micro}, 32 MI samples", (1, n, 1),
                    {"algo.micro_batch_size": str(micro), "diagnostics.num_samples": "32"}))
    for samples in (64, 32):
        for micro in (4, 2):
            out.append((f"GRPO, {fsdp}, micro {micro}" + (", 32 MI samples" if samples == 32 else ""), (1, n, 1),
                        {"algo.name": "grpo", "algo.micro_batch_size": str(micro),
                         "diagnostics.num_samples": str(samples)}))
    return out


def config_for(overrides):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "sokoban_qwen2p5_3b.py")
    return config_lib.apply_overrides(config_lib.load_config_file(path), dict(overrides))


def step_seconds(p, peak: float, bandwidth: float, devices: int) -> dict:
    flops = p.flops
    compute = flops["total"] / (devices * peak * MFU)
    weights = p.num_params * (4 if p.param_dtype == "float32" else 2)  # read whole at every decode step
    kv_slot = p.analytic["rollout KV cache"] / p.layout.length  # bytes per slot on one device
    decode_steps = p.layout.turns * p.layout.generation
    mean_context = sum(p.layout.generation_offset(t) + p.layout.generation for t in range(p.layout.turns)) / p.layout.turns
    floor = decode_steps * (weights + kv_slot * mean_context) / bandwidth
    return {"compute": compute, "decode_floor": floor}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--pieces", action="store_true")
    parser.add_argument("--no-matrix", action="store_true", help="only the pieces")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated presets")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    results = []
    print("| model | accelerator | setting | mesh | state / device | working set (phase) | est. peak / device "
          "| FLOPs / step | step @ 40% MFU | decode floor |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for model in models if not args.no_matrix else ():
        for hw, (n, memory, peak, bandwidth) in HARDWARE.items():
            chosen = None
            for label, mesh, overrides in candidates(n):
                p = plan_lib.plan(config_for(overrides), mesh, preset=model, compile_step=False, pieces=())
                e = p.estimate()
                if e["peak"] <= 0.9 * memory * GiB:
                    chosen = (label, mesh, p, e)
                    break
            if chosen is None:
                print(f"| {model} | {hw} | does not fit (last tried: {label}: est. peak "
                      f"{e['peak'] / GiB:.1f} GiB) | | | | | | | |")
                results.append({"model": model, "hardware": hw, "fits": False, "last": label,
                                "estimate": e})
                continue
            label, mesh, p, e = chosen
            t = step_seconds(p, peak, bandwidth, n)
            print(f"| {model} | {hw} | {label} | {'x'.join(map(str, mesh))} | {e['state'] / GiB:.1f} GiB | "
                  f"{e['working set'] / GiB:.1f} GiB ({e['phase']}) | {e['peak'] / GiB:.1f} GiB | "
                  f"{p.flops['total']:.2e} | {t['compute']:.1f} s | {t['decode_floor']:.1f} s |", flush=True)
            results.append({"model": model, "hardware": hw, "fits": True, "setting": label, "plan": p.to_json(),
                            "seconds": t})
    if args.pieces:
        print("\n| model | mesh | micro-batch fwd+bwd: XLA / analytic FLOPs | decode step: XLA / analytic | "
              "XLA CPU temporaries, remat on / off |")
        print("| --- | --- | ---: | ---: | ---: |")
        for model in models:
            p = plan_lib.plan(config_for({"algo.micro_batch_size": "8"}), (1, 8, 1), preset=model, compile_step=False)
            (mx, ma), (dx, da) = p.xla_flops["micro-batch fwd+bwd"], p.xla_flops["decode step (last turn)"]
            print(f"| {model} | 1x8x1 | {mx:.3e} / {ma:.3e} ({mx / ma:.3f}) | {dx:.3e} / {da:.3e} ({dx / da:.3f}) | "
                  f"{p.memory['activations, remat on'] / GiB:.2f} / {p.memory['activations, remat off'] / GiB:.2f} "
                  f"GiB |", flush=True)
            results.append({"model": model, "pieces": p.to_json()})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
