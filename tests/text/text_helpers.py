"""Small helpers shared by the text tests."""

import jax
import numpy as np

from ragen_jax.text import codec as C


def encode(tokenizer, text):
    return list(tokenizer.encode(text, add_special_tokens=False))


def grid_text(symbols, grid):
    """What Environment.render_grid draws for a symbol-id grid."""
    return "\n".join(" ".join(symbols[int(s)] for s in row) for row in np.asarray(grid))


def valid_ids(ids, mask):
    ids, mask = np.asarray(ids), np.asarray(mask)
    assert (np.sort(mask)[::-1] == mask).all()  # valid entries are packed at the front
    return [int(i) for i in ids[mask]]


@jax.jit
def read_generation(codec, ids, mask):
    """The rollout's reading of one turn's generated ids [n] (valid where `mask`): the parsed
    answer (actions, count, format_ok), the reasoning length and the `</answer>` stop check."""
    text, length = C.detokenize(codec, ids, mask)
    actions, count, ok = C.parse_answer(codec, text, length)
    reasoning = C.reasoning_length(codec, ids, mask, (text, length))
    stopped = C.ends_with_answer_close(codec, ids[None], mask.sum()[None])[0]
    return actions, count, ok, reasoning, stopped


def reference_reasoning(table, ids):
    """How many tokens end before the first `</think>` of the generation's bytes (0 without one)."""
    data = b"".join(table[i] for i in ids)
    close = data.find(b"</think>")
    ends = np.cumsum([len(table[i]) for i in ids])
    return 0 if close < 0 else int(np.sum(ends <= close))


def reference_stop(table, row, length):
    """`</answer>` occurs in the text and ends inside the last token's bytes."""
    text = b"".join(table[i] for i in row[:length])
    before = len(text) - len(table[row[length - 1]]) if length else 0
    return length > 0 and b"</answer>" in text[max(0, before - 8):]
