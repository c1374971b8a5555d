"""`python -m ragen_jax.export --workdir DIR --out HF_DIR [--step N] [--dtype bfloat16] [--adapters-only]`

Writes a training run's policy (latest checkpoint, or step N) as a Hugging Face checkpoint —
config.json, safetensors and the tokenizer — that `transformers` loads and generates with.
The output directory must be new or empty, and writable (checked before the checkpoint is
read); files are written under temporary names and renamed into place, so an interrupted
export leaves nothing that looks loadable, and a failed one (a full disk) removes what it
wrote. A damaged latest checkpoint is named and the newest one that restores is exported.

A LoRA run (`model.lora.rank` > 0) is exported merged: full weights W + alpha / rank · A B.
`--adapters-only` writes its adapters alone in peft's layout instead (adapter_config.json,
naming the base model, + adapter_model.safetensors) and the tokenizer.

Under several processes (`--coordinator/--num-processes/--process-id`, or auto-detected)
every process restores its shards and takes part in gathering each tensor; process 0 writes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from safetensors import SafetensorError

from ragen_jax.core import distributed, quiet
from ragen_jax.run.checkpoint import CheckpointError
from ragen_jax.core.errors import ConfigError
from ragen_jax.core.files import check_writable_dir, describe


def export(workdir: Path, out: Path, step: int | None = None, dtype: str | None = None,
           adapters_only: bool = False) -> int:
    from ragen_jax.models import hf
    from ragen_jax.run.experiment import restore_run

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} exists and is not an empty directory; choose a new one")
    if distributed.is_lead():
        check_writable_dir(out, "--out")
    exp, step = restore_run(workdir, step)
    if adapters_only and not exp.model.cfg.lora.rank:
        raise ConfigError(f"--adapters-only: {workdir} is not a LoRA run (model.lora.rank is 0)")
    created = not out.exists()
    try:
        if adapters_only:
            m = exp.run.settings.model
            hf.save_adapters(exp.model, out, base=m.path or m.init or f"ragen_jax preset {m.preset}")
            if distributed.is_lead():
                exp.tokenizer.save_pretrained(str(out))
        else:
            hf.save_pretrained(exp.model, out, dtype=dtype, tokenizer=exp.tokenizer)
    except (OSError, SafetensorError) as err:  # e.g. a full disk: --out is left as it was, absent or empty
        if distributed.is_lead() and out.is_dir():
            shutil.rmtree(out, ignore_errors=True)
            if not created:
                out.mkdir()
        raise OSError(f"nothing exported to {out}: {describe(err)}") from None
    return step


def main(argv=None) -> int:
    quiet.commands()
    parser = argparse.ArgumentParser(description="Export a trained policy as a Hugging Face checkpoint.")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", required=True, help="a new (or empty) directory")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                        help="weight dtype on disk (default: the model's parameter dtype)")
    parser.add_argument("--adapters-only", action="store_true",
                        help="a LoRA run: write only its adapters, in peft's layout (default: merged full weights)")
    distributed.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        distributed.initialize(args.coordinator, args.num_processes, args.process_id)
        step = export(Path(args.workdir), Path(args.out), args.step, args.dtype, args.adapters_only)
    except (ConfigError, CheckpointError) as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {describe(err)}", file=sys.stderr)
        return 1
    if not distributed.is_lead():
        return 0
    print(f"exported step {step} of {args.workdir} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(quiet.run_program(main))
