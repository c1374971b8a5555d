"""`python -m ragen_jax.plot --workdir DIR [--out PNG]`: a run's training curves
(`ragen_jax.analysis.curves` draws them). Bad input ends with one line on stderr, exit code 2,
and nothing written."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from ragen_jax.analysis.curves import DEFAULT_OUT, METRICS_FILE, PlotError, plot_curves, read_metrics


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage block
        raise PlotError(f"{message} (see --help)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="python -m ragen_jax.plot",
                     description="Plot a training run's curves from DIR/metrics.jsonl into a PNG.")
    parser.add_argument("--workdir", required=True, help="the training workdir (holds metrics.jsonl)")
    parser.add_argument("--out", default=None, help=f"output PNG (default: DIR/{DEFAULT_OUT})")
    try:
        args = parser.parse_args(argv)
        workdir = Path(args.workdir)
        if not workdir.is_dir():
            raise PlotError(f"workdir {workdir} does not exist or is not a directory")
        out = Path(args.out) if args.out else workdir / DEFAULT_OUT
        if not out.parent.is_dir():
            raise PlotError(f"cannot write {out}: directory {out.parent} does not exist")
        if out.is_dir():
            raise PlotError(f"cannot write {out}: it is a directory")
        series = read_metrics(workdir / METRICS_FILE)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise PlotError("matplotlib is not installed: pip install matplotlib") from None
        try:
            drawn = plot_curves(series, out, title=str(workdir.resolve().name))
        except OSError as e:
            raise PlotError(f"cannot write {out}: {e.strerror or e}") from None
    except PlotError as e:
        print(f"ragen_jax.plot: error: {e}", file=sys.stderr)
        return 2
    missing = [title for title, names in drawn.items() if not names]
    print(f"wrote {out}" + (f" (not logged: {', '.join(missing)})" if missing else ""))
    return 0

if __name__ == "__main__":
    sys.exit(main())
