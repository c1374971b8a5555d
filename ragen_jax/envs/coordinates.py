"""The `grid_coord` observation: a board's size and the cells of its pieces as lines above the grid.

    Board size: 6 rows x 6 cols
    Targets: (4, 3)
    Boxes: (3, 3)
    Player: (2, 4)

A view that offers it (`TextView.coordinate_labels`, `coordinate_cells`) gets the host text
(`TextView.coordinate_lines`) and the same text as token ids in the graph from here. Each listed
cell is one piece with its delimiter (`" (2, 4),"` or `" (2, 4)\n"`), which is where the
byte-level BPEs split such a line, so the pieces joined are `tokenizer.encode` of the lines;
`coordinate_tables` checks that on sample lines and refuses a tokenizer for which it is not.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

RENDER_FORMATS = ("grid", "grid_coord")  # the board games' observation texts


def render_format(params: Any) -> str:
    """The observation text `params` ask for (`render_format`, a static field of the board games'
    params; "grid" for params without one)."""
    return getattr(params, "render_format", "grid")


def cell_mask(shape: tuple[int, int], cell) -> jax.Array:
    """bool[R, C], true at `cell` (row, col) only."""
    return (jnp.arange(shape[0])[:, None] == cell[0]) & (jnp.arange(shape[1])[None, :] == cell[1])


def coordinate_tables(tokenizer, shape: tuple[int, int], labels: tuple[str, ...], symbols: tuple[str, ...]) -> dict:
    """The pieces of the `grid_coord` lines of a board of `shape` under `tokenizer`: the size line,
    each label ("Player:"), each cell " (r, c)" followed by "," or by the line's newline, and
    " none\n". Refuses a tokenizer whose tokens of sample lines (and of the last line followed
    by a board of `symbols`) are not the pieces joined."""
    def encode(text):
        return list(tokenizer.encode(text, add_special_tokens=False))

    rows, cols = shape
    size = encode(f"Board size: {rows} rows x {cols} cols\n")
    label_ids = [encode(f"{label}:") for label in labels]
    items = [[[encode(f" ({r}, {c})" + ("\n" if last else ",")) for last in (0, 1)] for c in range(cols)]
             for r in range(rows)]
    none = encode(" none\n")
    last_cell = (rows - 1, cols - 1)
    checks = [(f"Board size: {rows} rows x {cols} cols\n{labels[0]}:", size + label_ids[0])]
    checks += [(f"{labels[-1]}: none\n{s}", label_ids[-1] + none + encode(s)) for s in symbols]
    checks += [(f"{labels[-1]}: (0, 0)\n{s}", label_ids[-1] + items[0][0][1] + encode(s)) for s in symbols]
    for k, label in enumerate(labels):  # a line of none, one, two and three cells, then the next line
        for cells in ([], [(0, 0)], [last_cell, (0, 0)], [(0, 0), last_cell, (rows // 2, cols // 2)]):
            text = f"{label}:" + (",".join(f" ({r}, {c})" for r, c in cells) or " none") + "\n" + f"{labels[0]}:"
            pieces = label_ids[k] + ([i for n, (r, c) in enumerate(cells) for i in items[r][c][n == len(cells) - 1]]
                                     if cells else none) + label_ids[0]
            checks.append((text, pieces))
    for text, pieces in checks:
        if encode(text) != pieces:
            raise ValueError(f"the tokenizer merges tokens across the pieces of the coordinate lines {text!r}; "
                             f"render_format='grid_coord' renders them piece by piece")
    width = max(len(p) for row in items for cell in row for p in cell)
    item_ids = np.zeros((rows, cols, 2, width), np.int32)
    item_lens = np.zeros((rows, cols, 2), np.int32)
    for r in range(rows):
        for c in range(cols):
            for last in (0, 1):
                item_ids[r, c, last, :len(items[r][c][last])] = items[r][c][last]
                item_lens[r, c, last] = len(items[r][c][last])
    label_width = max(map(len, label_ids))
    labels_table = np.array([ids + [0] * (label_width - len(ids)) for ids in label_ids], np.int32)
    return {"coord_size": jnp.asarray(size, jnp.int32), "coord_labels": jnp.asarray(labels_table),
            "coord_label_lens": jnp.asarray([len(ids) for ids in label_ids], jnp.int32),
            "coord_items": jnp.asarray(item_ids), "coord_item_lens": jnp.asarray(item_lens),
            "coord_none": jnp.asarray(none, jnp.int32)}


def coordinate_tokens(cells: list[tuple[jax.Array, int]], cols: int, tables: dict) -> tuple[jax.Array, jax.Array]:
    """The lines' token ids in the graph: (ids, valid), holes anywhere. `cells`: per label, the
    bool[R, C] of its cells and the most it can list (`TextView.coordinate_cells`); `tables`:
    `coordinate_tables`' pieces."""
    items, item_lens = tables["coord_items"], tables["coord_item_lens"]
    width = items.shape[-1]
    ids, valid = [tables["coord_size"]], [jnp.ones(tables["coord_size"].shape, bool)]
    for k, (mask, most) in enumerate(cells):
        flat = jnp.asarray(mask).reshape(-1)
        count = flat.sum()
        (where,) = jnp.nonzero(flat, size=most, fill_value=0)
        order = jnp.arange(most)
        last = (order == count - 1).astype(jnp.int32)
        row, col = where // cols, where % cols
        ids += [tables["coord_labels"][k], items[row, col, last].reshape(-1), tables["coord_none"]]
        valid += [jnp.arange(tables["coord_labels"].shape[1]) < tables["coord_label_lens"][k],
                  ((order < count)[:, None] & (jnp.arange(width) < item_lens[row, col, last][:, None])).reshape(-1),
                  jnp.broadcast_to(count == 0, tables["coord_none"].shape)]
    return jnp.concatenate(ids).astype(jnp.int32), jnp.concatenate(valid)


def format_cells(mask) -> str:
    """`(row, col)` of every true cell, 0-based, comma-separated (the `grid_coord` lists)."""
    return ", ".join(f"({r}, {c})" for r, c in zip(*np.nonzero(np.asarray(mask))))
