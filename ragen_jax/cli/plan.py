"""`python -m ragen_jax.plan --config configs/<real-model config>.py --mesh DATAxFSDPxTENSOR`

Per-device memory and FLOPs of the train step for a model size and a device mesh, compiled on
fake CPU devices with no weight allocated (`ragen_jax.analysis.planner` says how).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from ragen_jax.analysis.planner import PIECES, PlanError, parse_mesh, plan, report, use_fake_devices
from ragen_jax.core import quiet

EXIT_USAGE = 2


def main(argv=None) -> int:
    quiet.commands()
    parser = argparse.ArgumentParser(description="Per-device memory and FLOPs of the train step for a model size "
                                                 "and mesh, compiled on fake CPU devices (no weights allocated).")
    parser.add_argument("--config", required=True, help="a config file, e.g. configs/sokoban_qwen2p5_3b.py")
    parser.add_argument("--mesh", required=True, help="DATAxFSDPxTENSOR, e.g. 1x8x1")
    parser.add_argument("--model", default=None, help="plan a preset's shapes (qwen2.5-0.5b … qwen2.5-7b) when the "
                                                      "config has no model.path")
    parser.add_argument("--no-step", action="store_true", help="skip compiling the whole train step")
    parser.add_argument("--pieces", default=",".join(PIECES),
                        help=f"pieces to compile, comma-separated from {','.join(PIECES)} (or 'none')")
    parser.add_argument("--json", default=None, help="also write the plan as JSON to this file")
    args, rest = parser.parse_known_args(argv)
    try:
        mesh = parse_mesh(args.mesh)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    use_fake_devices(math.prod(mesh))  # before jax is imported (by ragen_jax.run.config)
    from ragen_jax.run import config as config_lib

    overrides = config_lib.split_overrides(rest, parser.error)
    try:
        config = config_lib.apply_overrides(config_lib.load_config_file(args.config), overrides)
        pieces = tuple(p for p in args.pieces.split(",") if p and p != "none")
        if set(pieces) - set(PIECES):
            raise PlanError(f"--pieces={args.pieces!r}: allowed {','.join(PIECES)} or none")
        result = plan(config, mesh, args.model, compile_step=not args.no_step, pieces=pieces,
                      log=lambda m: print(m, file=sys.stderr))
    except (PlanError, config_lib.ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(report(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result.to_json(), fh, indent=2)
    return 0

if __name__ == "__main__":
    sys.exit(quiet.run_program(main))
