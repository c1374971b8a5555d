"""`python -m ragen_jax.train --config configs/<name>.py [--config.key=value ...] [--workdir DIR]`

Train an agent (the loop, what it writes and how it resumes: `ragen_jax.run.loop`). The
workdir defaults to runs/<config name>. Exit codes: 0 done (or stopped early), 2 bad input
(config, workdir, checkpoints; one line, checked before any work), 1 a write that failed during
the run, 143 stopped by SIGTERM after a checkpoint, 130 interrupted (Ctrl-C). Several processes: `--coordinator HOST:PORT
--num-processes N --process-id I` on each (auto-detected on TPU pod slices and SLURM).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ragen_jax.cli.args import load_config, parse_args
from ragen_jax.core import compile_cache, distributed, host_devices, quiet
from ragen_jax.run.checkpoint import CheckpointError
from ragen_jax.core.errors import ConfigError
from ragen_jax.core.files import describe
from ragen_jax.run.loop import EXIT_FAILED, EXIT_USAGE, train

EXIT_INTERRUPTED = 130  # as a shell reports SIGINT


def main(argv=None) -> int:
    quiet.commands()
    args, overrides = parse_args(argv, "Train an LLM agent with multi-turn RL (RAGEN-2 in JAX).",
                                 workdir_required=False, multi_process=True)
    workdir = Path(args.workdir) if args.workdir else Path("runs") / Path(args.config).stem
    try:
        config = load_config(args.config, overrides)
        if args.coordinator is None and (count := host_devices.split_host(config)):  # before jax starts
            print(host_devices.note(count), file=sys.stderr)
        distributed.initialize(args.coordinator, args.num_processes, args.process_id)
        compile_cache.enable()
        return train(config, workdir)
    except (ConfigError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as err:  # a full disk (CheckpointWriteError among others): earlier checkpoints are intact
        print(f"error: {describe(err)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:  # Ctrl-C, while compiling or training: the saved checkpoints stay as they are
        print("interrupted; run the same command to resume from the last checkpoint", file=sys.stderr)
        return EXIT_INTERRUPTED

if __name__ == "__main__":
    sys.exit(quiet.run_program(main))
