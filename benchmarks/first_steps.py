"""Fingerprint the first steps of the default runs, to check that a refactor changed no number.

    python benchmarks/first_steps.py --out before.json      # on the old commit
    python benchmarks/first_steps.py --out after.json       # on the new one
    python benchmarks/first_steps.py --compare before.json after.json

For each default config (Sokoban and FrozenLake, the built-in tiny model) it trains `--steps`
steps with the `train` command, exports the weights with `export`, and records a SHA-256 of
every step's metrics (timings left out) and of the exported weights. Equal fingerprints mean
the runs were bit for bit the same.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIGS = ("configs/sokoban_tiny.py", "configs/frozenlake_tiny.py")
ROOT = Path(__file__).resolve().parents[1]


def timing(key: str) -> bool:
    """Metrics that measure the machine, not the run."""
    return any(word in key for word in ("time", "seconds", "per_sec", "_s_", "elapsed", "minutes"))


def fingerprint(config: str, steps: int, scratch: Path) -> dict:
    work, out = scratch / Path(config).stem, scratch / (Path(config).stem + "_hf")
    for args in (["ragen_jax.train", "--config", config, "--workdir", str(work), f"--config.train.steps={steps}",
                  f"--config.train.save_every={steps}", "--config.logging.progress=false"],
                 ["ragen_jax.export", "--workdir", str(work), "--out", str(out)]):
        subprocess.run([sys.executable, "-m", *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in row.items() if not timing(k)} for row in rows]
    metrics = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()
    weights = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    return {"steps": steps, "metric_rows": len(rows), "metrics_sha256": metrics, "weights_sha256": weights}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the fingerprints here (JSON)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(Path(p).read_text()) for p in args.compare)
        same = before == after
        for config in sorted(set(before) | set(after)):
            print(f"{config}: {'same' if before.get(config) == after.get(config) else 'DIFFERENT'}")
        return 0 if same else 1
    if not args.out:
        parser.error("give --out FILE (or --compare BEFORE AFTER)")
    with tempfile.TemporaryDirectory() as scratch:
        prints = {config: fingerprint(config, args.steps, Path(scratch)) for config in CONFIGS}
    Path(args.out).write_text(json.dumps(prints, indent=2) + "\n")
    print(json.dumps(prints, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
