"""`python -m ragen_jax.plan --config configs/<real-model config>.py (--mesh DATAxFSDPxTENSOR | --target v5e-1)`

Per-device memory and FLOPs of the train step for a model size and a device mesh, compiled on
fake CPU devices with no weight allocated (`ragen_jax.analysis.planner` says how); with
`--target`, compiled by XLA's TPU compiler for that Cloud TPU slice on any machine
(`pip install "ragen-jax[tpu]"`): whether it fits the chip, and the compiler's step-time estimate.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from ragen_jax.analysis.planner import PIECES, PlanError, parse_mesh, plan, report, use_fake_devices
from ragen_jax.analysis.tpu_targets import TargetError, parse_target
from ragen_jax.core import quiet
from ragen_jax.core.errors import ConfigError
from ragen_jax.core.files import check_writable_dir, write_atomically

EXIT_USAGE = 2


def main(argv=None) -> int:
    quiet.commands()
    parser = argparse.ArgumentParser(description="Per-device memory and FLOPs of the train step for a model size "
                                                 "and mesh, compiled on fake CPU devices (no weights allocated), or "
                                                 "by the TPU compiler for a Cloud TPU slice (--target).")
    parser.add_argument("--config", required=True, help="a config file, e.g. configs/sokoban_qwen2p5_3b.py")
    parser.add_argument("--mesh", default=None, help="DATAxFSDPxTENSOR, e.g. 1x8x1 (with --target: default the "
                                                     "config's mesh over all the slice's chips)")
    parser.add_argument("--target", default=None, help="a Cloud TPU accelerator type to compile for with the TPU "
                                                       "compiler: v5e-1, v5e-4, v5e-8, v6e-1, v6e-8, v4-8, v5p-8, …")
    parser.add_argument("--model", default=None, help="plan a preset's shapes (qwen2.5-0.5b … qwen2.5-7b) when the "
                                                      "config has no model.path")
    parser.add_argument("--no-step", action="store_true", help="skip compiling the whole train step")
    parser.add_argument("--pieces", default=None,
                        help=f"pieces to compile, comma-separated from {','.join(PIECES)} (or 'none'); default all "
                             "of them; with --target the decode step's cost (add update for the step-time estimate: minutes "
                             "more for a real model)")
    parser.add_argument("--programs", action="store_true", help="instead of the plan: compile every program the "
                        "commands run (train step, validation, evaluation's diagnostics, the supervised fit's step) "
                        "and say whether each fits")
    parser.add_argument("--json", default=None, help="also write the plan as JSON to this file")
    args, rest = parser.parse_known_args(argv)
    try:
        target = parse_target(args.target) if args.target else None
        if args.mesh is None and target is None:
            raise PlanError("--mesh DATAxFSDPxTENSOR is required without --target (e.g. --mesh 1x8x1 or --target v5e-1)")
        mesh = parse_mesh(args.mesh) if args.mesh else None
        if args.json:  # before minutes of compiling, not after
            check_writable_dir(Path(args.json).parent, "--json's folder")
    except (PlanError, TargetError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    # before jax is imported (by ragen_jax.run.config): the CPU plan's fake devices; a target's
    # compile needs none (one CPU device hosts the compiles)
    use_fake_devices(math.prod(mesh) if target is None else 1)
    from ragen_jax.run import config as config_lib

    overrides = config_lib.split_overrides(rest, parser.error)
    try:
        config = config_lib.apply_overrides(config_lib.load_config_file(args.config), overrides)
        if args.pieces is None:
            pieces = PIECES if target is None else ("decode",)
        else:
            pieces = tuple(p for p in args.pieces.split(",") if p and p != "none")
        if set(pieces) - set(PIECES):
            raise PlanError(f"--pieces={args.pieces!r}: allowed {','.join(PIECES)} or none")
        log = lambda m: print(m, file=sys.stderr)
        if args.programs:
            return _programs(config, mesh, args.model, target, args.json, log)
        result = plan(config, mesh, args.model, compile_step=not args.no_step, pieces=pieces, log=log, target=target)
    except (PlanError, TargetError, config_lib.ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(report(result))
    if args.json:
        write_atomically(Path(args.json), json.dumps(result.to_json(), indent=2))
    return 0


def _programs(config, mesh, preset, target, json_path, log) -> int:
    """`--programs`: compile every program for the target (or the devices present) and print
    one line each; exit 0 whether or not they fit (the lines say)."""
    import dataclasses

    from ragen_jax.analysis.programs import compile_programs
    from ragen_jax.analysis.tpu_targets import compile_only_devices

    devices = compile_only_devices(target) if target is not None else None
    compiled = compile_programs(config, mesh, preset, devices, log)
    where = f"for {target.name}, by the TPU compiler" if target is not None else "for the devices present"
    print(f"every program of the commands, compiled {where}:")
    for name, result in compiled.items():
        print(result.line(name))
    if json_path:
        write_atomically(Path(json_path), json.dumps({
            "target": target.name if target else None, "fits": all(c.memory for c in compiled.values()),
            "programs": {n: dataclasses.asdict(c) for n, c in compiled.items()}}, indent=2))
    return 0

if __name__ == "__main__":
    sys.exit(quiet.run_program(main))
