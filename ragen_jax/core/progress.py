"""The commands' progress bar (`train`, `sft`): tqdm on stderr with the steps done of the total,
the time spent and left, and the fields the command sets; lines said while it runs go above it
rather than onto its line. `--config.logging.progress=false` turns it off (the callers check)."""

from __future__ import annotations

import sys


def progress_bar(total: int, desc: str, initial: int = 0):
    """A tqdm bar on stderr, as wide as the terminal, starting at `initial` of `total` steps."""
    from tqdm import tqdm  # imported when a bar is wanted only

    return tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, file=sys.stderr)


def tell(message: str, bar, log=None) -> None:
    """`message` through `log` (default: a line on stderr), above the progress bar when there
    is one (not appended to it)."""
    log = log or (lambda line: print(line, file=sys.stderr))
    if bar is None:
        log(message)
        return
    with bar.external_write_mode(file=sys.stderr):  # clears the bar, draws it again after
        log(message)
