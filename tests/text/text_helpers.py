"""Small helpers shared by the text tests."""

import numpy as np


def encode(tokenizer, text):
    return list(tokenizer.encode(text, add_special_tokens=False))


def grid_text(symbols, grid):
    """What Environment.render_grid draws for a symbol-id grid."""
    return "\n".join(" ".join(symbols[int(s)] for s in row) for row in np.asarray(grid))


def valid_ids(ids, mask):
    ids, mask = np.asarray(ids), np.asarray(mask)
    assert (np.sort(mask)[::-1] == mask).all()  # valid entries are packed at the front
    return [int(i) for i in ids[mask]]
