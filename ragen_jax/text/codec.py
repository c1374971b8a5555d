"""The tokenizer compiled into tables, so text lives inside the jitted graph
(docs/architecture.md#text-in-the-graph).

`TextCodec.build(tokenizer, env, max_actions_per_turn)` runs once on the host. In JAX:

- `render_observation(codec, grid)`: board token ids = gathered per-cell pieces, packed;
- `detokenize(codec, ids, mask)`: the UTF-8 bytes of generated tokens, packed;
- `parse_answer(codec, text, length)`: the answer regex, split, strip and action lookup on
  bytes (docs/method.md#parsing-the-answer);
- `ends_with_answer_close(codec, tokens, lengths)`: the decode loop's `stop_fn`.

Board pieces. Under Qwen2's pre-tokenizer regex every space-separated cell is its own
pre-token, but a punctuation cell swallows the newline after it (` #\\n` is one pre-token)
while a letter cell does not (` P`, `\\n`); under GPT-2's (SmolLM2's) no cell takes the
newline. So a piece is the unit string (leading space?, symbol, trailing newline?) tokenized
once: whichever way the newline goes, the unit's ids are exactly what the full text gives
there. `build` checks this on every ordered pair of cells (so a tokenizer that merges across
cells is refused); tests pin it against `tokenizer.encode` on random boards, with the
built-in, Qwen's and SmolLM2's tokenizers.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ragen_jax.text.interface import GameText

THINK_PREFIX = "<think>"  # ends the prompt (docs/method.md#the-prompt); the parser reads it again
THINK_OPEN, THINK_CLOSE = b"<think>", b"</think>"
ANSWER_OPEN, ANSWER_CLOSE = b"<answer>", b"</answer>"
ACTION_SEP = b"||"
# The characters Python's `re` matches with \s in a str pattern, the same set str.strip()
# removes (str.isspace); as UTF-8 so the parser can find them in bytes. A test pins the set.
WHITESPACE = tuple(chr(c).encode() for c in (
    0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0, 0x1680,
    *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000))


def byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the character a byte-level BPE token uses for each byte.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes are shifted to 256, 257, ...
    in byte order.
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: b for b in printable}
    shifted = [b for b in range(256) if b not in chars]
    chars.update({b: 256 + k for k, b in enumerate(shifted)})
    return {chr(c): b for b, c in chars.items()}


def token_bytes(tokenizer, vocab_size: int | None = None) -> list[bytes]:
    """The bytes of every id in [0, vocab_size): added tokens are their literal text, ids the
    tokenizer does not know (a model's padded vocabulary) are empty."""
    size = len(tokenizer)
    vocab_size = size if vocab_size is None else vocab_size
    if vocab_size < size:
        raise ValueError(f"vocab_size={vocab_size} is smaller than the tokenizer's {size} tokens")
    added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
    decoder = byte_decoder()
    out = []
    for i, token in enumerate(tokenizer.convert_ids_to_tokens(list(range(size)))):
        if i in added:
            out.append(added[i].encode())
        elif token is None:
            out.append(b"")
        else:
            try:
                out.append(bytes(decoder[c] for c in token))
            except KeyError:
                raise ValueError(f"token {i} ({token!r}) is not byte-level BPE; the codec needs a "
                                 f"byte-level tokenizer (GPT-2/Qwen2 style)") from None
    return out + [b""] * (vocab_size - size)


def _pad(rows: list, width: int, dtype) -> np.ndarray:
    table = np.zeros((len(rows), max(width, 1)), dtype)
    for r, row in enumerate(rows):
        table[r, :len(row)] = list(row)
    return table


def _check_pieces(encode, symbols, pieces) -> None:
    """Refuse a tokenizer for which concatenated pieces differ from encoding the text."""
    for a, sa in enumerate(symbols):
        for b, sb in enumerate(symbols):
            for lead in (0, 1):
                for newline in (0, 1):
                    for tail in (0, 1):
                        text = " " * lead + sa + ("\n" if newline else " ") + sb + "\n" * tail
                        joined = pieces[a][lead][newline] + pieces[b][1 - newline][tail]
                        if encode(text) != joined:
                            raise ValueError(
                                f"the tokenizer encodes board text {text!r} as {encode(text)}, not as "
                                f"its cells {joined}; each cell must be its own pre-token")


@struct.dataclass
class TextCodec:
    """Host-built tables; a pytree, so it is passed into jitted functions as an argument."""

    piece_ids: jax.Array  # int32[S, 2, 2, P]: symbol, leading space, trailing newline -> ids
    piece_lens: jax.Array  # int32[S, 2, 2]
    byte_table: jax.Array  # uint8[V, B]: the bytes of every token id
    byte_lens: jax.Array  # int32[V]
    action_bytes: jax.Array  # uint8[A, L]: lower-case action names
    action_lens: jax.Array  # int32[A]
    # Tables an environment's in-graph text needs (`env.text_tables`): Countdown's number
    # pieces, a QA dataset's tokenized questions and answers. Empty for the board games.
    env_tables: dict = struct.field(default_factory=dict)
    symbols: tuple[str, ...] = struct.field(pytree_node=False, default=())
    action_names: tuple[str, ...] = struct.field(pytree_node=False, default=())
    max_actions_per_turn: int = struct.field(pytree_node=False, default=2)

    @classmethod
    def build(cls, tokenizer, env: GameText, max_actions_per_turn: int, vocab_size: int | None = None,
              env_params=None) -> TextCodec:
        """Tables for `env`'s symbols and actions under `tokenizer` (a transformers tokenizer).

        `vocab_size` pads the byte table to the model's embedding size when it is larger than
        the tokenizer's (the extra ids decode to nothing). `env_params`: the env's text tables
        for these params (a board's coordinate lines need them; None: the plain grid).
        """
        if max_actions_per_turn < 1:
            raise ValueError(f"max_actions_per_turn={max_actions_per_turn} must be >= 1")
        for symbol in env.symbols:
            if not symbol or any(c.isspace() for c in symbol):
                raise ValueError(f"board symbol {symbol!r} must be non-empty and without whitespace")
        for name in env.action_names:
            if not name or not name.isascii() or name != name.strip() or "|" in name:
                raise ValueError(f"action name {name!r} must be non-empty ASCII without "
                                 f"surrounding whitespace or '|'")

        lowered = [n.lower() for n in env.action_names]
        if len(set(lowered)) != len(lowered):
            raise ValueError(f"action names {env.action_names} are not distinct ignoring case")

        def encode(text):
            return list(tokenizer.encode(text, add_special_tokens=False))

        pieces = [[[encode(" " * lead + s + "\n" * newline) for newline in (0, 1)] for lead in (0, 1)]
                  for s in env.symbols]
        _check_pieces(encode, env.symbols, pieces)
        flat = [p for per_symbol in pieces for per_lead in per_symbol for p in per_lead]
        width = max((len(p) for p in flat), default=1)
        piece_ids = _pad(flat, width, np.int32).reshape(len(env.symbols), 2, 2, width)
        piece_lens = np.array([len(p) for p in flat], np.int32).reshape(len(env.symbols), 2, 2)

        table = token_bytes(tokenizer, vocab_size)
        names = [n.encode() for n in lowered]
        return cls(
            piece_ids=jnp.asarray(piece_ids), piece_lens=jnp.asarray(piece_lens),
            byte_table=jnp.asarray(_pad(table, max(map(len, table)), np.uint8)),
            byte_lens=jnp.asarray([len(t) for t in table], jnp.int32),
            action_bytes=jnp.asarray(_pad(names, max(map(len, names), default=1), np.uint8)),
            action_lens=jnp.asarray([len(n) for n in names], jnp.int32),
            env_tables=env.text_tables(tokenizer, env_params),
            symbols=tuple(env.symbols), action_names=tuple(env.action_names),
            max_actions_per_turn=int(max_actions_per_turn),
        )

    @property
    def max_piece_len(self) -> int:
        return self.piece_ids.shape[-1]

    def observation_capacity(self, rows: int, cols: int) -> int:
        return rows * cols * self.max_piece_len


# ----------------------------------------------------------------------------- packing


def pack(values: jax.Array, valid: jax.Array, capacity: int | None = None):
    """Move the valid entries of a 1-D array to the front, in order: (packed, mask).

    Entries past `capacity` are dropped; the rest of the output is 0.
    """
    capacity = values.shape[0] if capacity is None else capacity
    pos = jnp.cumsum(valid) - 1
    out = jnp.zeros((capacity,), values.dtype).at[jnp.where(valid, pos, capacity)].set(values, mode="drop")
    return out, jnp.arange(capacity) < valid.sum()


# ----------------------------------------------------------------------------- rendering


def render_observation(codec: TextCodec, grid: jax.Array, final_newline: bool = False):
    """Token ids of a board of symbol ids [R, C]: (ids int32[R*C*P], mask), valid ids first.

    Equals `tokenizer.encode(env.render_grid(...))`; with `final_newline` the text is the
    board followed by "\\n" (the last cell may swallow it, which is why it is an option and
    not a separate piece).
    """
    rows, cols = grid.shape
    row, col = jnp.arange(rows)[:, None], jnp.arange(cols)[None, :]
    lead = jnp.broadcast_to(col > 0, grid.shape).astype(jnp.int32)
    newline = ((col == cols - 1) & ((row < rows - 1) | final_newline)).astype(jnp.int32)
    ids = codec.piece_ids[grid, lead, newline]  # [R, C, P]
    lens = codec.piece_lens[grid, lead, newline]
    valid = jnp.arange(codec.max_piece_len) < lens[..., None]
    return pack(ids.reshape(-1), valid.reshape(-1))


def _byte_lens(codec: TextCodec, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """Byte length of each masked-in token; 0 for ids outside the vocabulary."""
    known = mask & (ids >= 0) & (ids < codec.byte_lens.shape[0])
    return jnp.where(known, codec.byte_lens[jnp.where(known, ids, 0)], 0)


def detokenize(codec: TextCodec, ids: jax.Array, mask: jax.Array):
    """UTF-8 bytes of the masked-in tokens of `ids` [n]: (bytes uint8[n*B], length).

    Same bytes as the tokenizer's decode before its lossy UTF-8 step; ids outside the
    vocabulary contribute nothing.
    """
    lens = _byte_lens(codec, ids, mask)
    table = codec.byte_table[jnp.where(lens > 0, ids, 0)]  # [n, B]
    valid = jnp.arange(table.shape[1]) < lens[:, None]
    text, _ = pack(table.reshape(-1), valid.reshape(-1))
    return text, lens.sum().astype(jnp.int32)


def reasoning_length(codec: TextCodec, ids: jax.Array, mask: jax.Array, detokenized=None) -> jax.Array:
    """How many generated tokens come before the first `</think>`: the reasoning z
    (docs/method.md#pairs).

    ids [n] are one turn's generated tokens (valid where `mask`, left-aligned); the prompt
    already ended with `<think>`. The token holding the start of `</think>` is not reasoning.
    0 when the generation has no `</think>` (no reasoning to score). Pass `detokenized`
    (the `detokenize` result) when the caller already has it.
    """
    lens = _byte_lens(codec, ids, mask)
    text, length = detokenized if detokenized is not None else detokenize(codec, ids, mask)
    close = _matches(text, length, THINK_CLOSE)
    ends = jnp.cumsum(lens)
    count = jnp.sum(mask & (ends <= _first(close)))
    return jnp.where(close.any(), count, 0).astype(jnp.int32)


# ----------------------------------------------------------------------------- parsing


def _matches(text: jax.Array, length, pattern: bytes) -> jax.Array:
    """bool[n]: `pattern` occurs at position i, entirely before `length`."""
    n = text.shape[0]
    padded = jnp.concatenate([text, jnp.zeros((len(pattern),), text.dtype)])
    hit = jnp.arange(n) + len(pattern) <= length
    for j, byte in enumerate(pattern):
        hit &= padded[j:j + n] == byte
    return hit


def _first(mask: jax.Array) -> jax.Array:
    """Index of the first True, or len(mask) when there is none."""
    return jnp.where(mask.any(), jnp.argmax(mask), mask.shape[0]).astype(jnp.int32)


def _shift(x: jax.Array, k: int) -> jax.Array:
    """x[i - k] at i (False/0 for i < k)."""
    return jnp.concatenate([jnp.zeros((k,), x.dtype), x[:-k]])


def _whitespace(text: jax.Array, length):
    """Per position, the byte length of a whitespace character starting there (0: none), and
    whether the byte belongs to a whitespace character.

    Every pattern starts with an ASCII or UTF-8 lead byte, and a decoder always restarts at
    those, so byte matches are exactly the whitespace characters of the decoded text (invalid
    bytes decode to U+FFFD, which is not whitespace, here as in Python).
    """
    size = jnp.zeros(text.shape, jnp.int32)
    for w in WHITESPACE:
        size = jnp.where(_matches(text, length, w), len(w), size)
    covered = (size > 0) | _shift(size > 1, 1) | _shift(size > 2, 2)
    return size, covered


def _skip_whitespace(size: jax.Array) -> jax.Array:
    """int32[n+1]: from each position, the position after the run of whitespace starting there.

    Pointer doubling: each round squares the jump, so log2(n) gathers cover any run.
    """
    n = size.shape[0]
    jump = jnp.concatenate([jnp.arange(n) + size, jnp.array([n])]).astype(jnp.int32)
    for _ in range(max(1, math.ceil(math.log2(n + 1)))):
        jump = jump[jump]
    return jump


def _answer_span(text: jax.Array, length, prefix: str):
    """The answer regex (docs/method.md#parsing-the-answer) on `prefix` + text[:length]: (the
    prefixed bytes, start and end of the answer group, which bytes belong to whitespace
    characters). end = len(bytes): no match."""
    if prefix:
        prefix_bytes = jnp.asarray(np.frombuffer(prefix.encode(), np.uint8))
        text = jnp.concatenate([prefix_bytes, text.astype(jnp.uint8)])
        length = length + len(prefix_bytes)
    text = text.astype(jnp.uint8)
    n = text.shape[0]
    idx = jnp.arange(n)
    size, covered = _whitespace(text, length)
    after_space = _skip_whitespace(size)

    # re.search: the first <think> works whenever any does; the lazy first group ends at the
    # first </think> followed by \s* and <answer>; the lazy second group at the next </answer>.
    # If that </answer> is missing, a later </think> cannot help: its <answer> lies further on.
    think = _first(_matches(text, length, THINK_OPEN))
    answer_open = jnp.concatenate([_matches(text, length, ANSWER_OPEN), jnp.array([False])])
    answer_at = after_space[jnp.minimum(idx + len(THINK_CLOSE), n)]
    close = _matches(text, length, THINK_CLOSE) & (idx >= think + len(THINK_OPEN)) & answer_open[answer_at]
    t = _first(close)
    start = jnp.where(t < n, answer_at[jnp.minimum(t, n - 1)] + len(ANSWER_OPEN), n)
    end = _first(_matches(text, length, ANSWER_CLOSE) & (idx >= start))
    return text, start, end, covered


def answer_text(text: jax.Array, length, width: int, prefix: str = THINK_PREFIX):
    """The answer group of the answer regex, for environments that read the answer as text
    (Countdown, QA): (bytes uint8[width], length, ok).

    With the regex of `parse_answer`, `m.group(2).encode()` is bytes[:length]; ok is False
    when the regex does not match or the group is longer than `width` bytes (then the bytes
    are all 0 and length 0).
    """
    text, start, end, _ = _answer_span(text, length, prefix)
    n = text.shape[0]
    size = end - start
    ok = (end < n) & (size <= width)
    pos = start + jnp.arange(width)
    out = jnp.where(ok & (jnp.arange(width) < size), text[jnp.clip(pos, 0, n - 1)], 0).astype(jnp.uint8)
    return out, jnp.where(ok, size, 0).astype(jnp.int32), ok


def parse_answer(codec: TextCodec, text: jax.Array, length, prefix: str = THINK_PREFIX):
    """The answer parser (docs/method.md#parsing-the-answer) on the bytes of one generation:
    (actions int32[M], num_actions, format_ok).

    The parsed text is `prefix` + text[:length]; with the default the generation is read
    after the `<think>` the prompt ended with; pass prefix="" for text that carries its own.
    The result is what this Python gives on that text decoded as UTF-8 with errors="replace"
    (the tests compare against it):

        m = re.search(r"<think>(.*?)</think>\\s*<answer>(.*?)</answer>", text, re.DOTALL)
        parts = [p.strip() for p in m.group(2).split("||")] if m else []
        parts = [p for p in parts if p][:max_actions_per_turn]
        ids = [1 + lowered_names.index(p.lower()) if p.lower() in lowered_names else 0 for p in parts]
        format_ok = bool(ids) and 0 not in ids

    Where the regex leaves a choice: empty parts (as in "Up ||") are not actions and are
    dropped, as RAGEN does; the first `max_actions_per_turn` parts are kept and the rest
    ignored unread; the turn is invalid (format_ok False: the caller applies the penalty and
    steps nothing) when the regex does not match, no action remains, or any kept action is
    unknown. Then actions are all 0 and num_actions 0; otherwise actions holds the 1-based ids
    then 0 padding.
    Case-insensitivity is ASCII's: Python's lower() also maps U+212A KELVIN SIGN to "k",
    which matters only for action names containing a k (none do).
    """
    text, start, end, covered = _answer_span(text, length, prefix)
    n = text.shape[0]
    idx = jnp.arange(n)
    matched = end < n
    inside = (idx >= start) & (idx < end)

    # str.split("||") takes separators left to right: in a run of pipes, every other one.
    pipe = text == ord("|")
    run_start = jax.lax.cummax(jnp.where(pipe & ~_shift(pipe, 1), idx, -1))
    sep = _matches(text, end, ACTION_SEP) & inside & ((idx - run_start) % 2 == 0)
    part = jnp.cumsum(sep)  # part number of every byte (separator bytes are dropped below)
    kept = inside & ~sep & ~_shift(sep, 1) & ~covered  # non-whitespace bytes of the parts
    first = jax.ops.segment_min(jnp.where(kept, idx, n), part, num_segments=n + 1)
    last = jax.ops.segment_max(jnp.where(kept, idx + 1, 0), part, num_segments=n + 1)
    nonempty = first < last  # the stripped part [first, last) is not empty

    m = codec.max_actions_per_turn
    rank = jnp.cumsum(nonempty) - 1
    slot = nonempty[None, :] & (rank[None, :] == jnp.arange(m)[:, None])  # [M, parts]
    present = slot.any(axis=1)
    p = jnp.argmax(slot, axis=1)
    begin, span = first[p], last[p] - first[p]
    width = codec.action_bytes.shape[1]
    window = text[jnp.clip(begin[:, None] + jnp.arange(width), 0, n - 1)]  # [M, L]
    window = jnp.where((window >= ord("A")) & (window <= ord("Z")), window + 32, window)
    same = (window[:, None, :] == codec.action_bytes[None]) | (jnp.arange(width) >= codec.action_lens[:, None])
    equal = same.all(axis=-1) & (span[:, None] == codec.action_lens[None, :])  # [M, A]
    action = jnp.where(equal.any(axis=1), jnp.argmax(equal, axis=1) + 1, 0)

    count = present.sum()
    format_ok = matched & (count > 0) & jnp.all(~present | (action > 0))
    actions = jnp.where(format_ok & present, action, 0).astype(jnp.int32)
    return actions, jnp.where(format_ok, count, 0).astype(jnp.int32), format_ok


def ends_with_answer_close(codec: TextCodec, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
    """Stop check for `sampling.decode`: bool[B], true when `</answer>` ends in the last token.

    tokens [B, n] hold each row's generated ids so far, lengths [B] how many."""
    return _last_token_completes(codec, ANSWER_CLOSE, tokens, lengths)


def action_starts_next(codec: TextCodec, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
    """Switch check for `sampling.decode`: bool[B], true when `<answer>` or the action separator
    `||` ends in the last token, so the next token begins an action (a move's name)."""
    return (_last_token_completes(codec, ANSWER_OPEN, tokens, lengths)
            | _last_token_completes(codec, ACTION_SEP, tokens, lengths))


def _last_token_completes(codec: TextCodec, marker: bytes, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
    """bool[B]: `marker` ends inside each row's last generated token. Only the bytes of the
    last len(marker) tokens are looked at: each token has at least one byte, so they hold any
    occurrence that the last token completes."""
    k = len(marker)

    def one(row, length):
        pos = length - k + jnp.arange(k)
        ids = row[jnp.clip(pos, 0, row.shape[0] - 1)]
        text, total = detokenize(codec, ids, pos >= 0)
        before = _byte_lens(codec, ids[:-1], pos[:-1] >= 0).sum()  # bytes before the last token
        hit = _matches(text, total, marker) & (jnp.arange(text.shape[0]) + k > before)
        return hit.any() & (length > 0)

    return jax.vmap(one)(tokens, lengths)


def stop_fn(codec: TextCodec):
    """`ends_with_answer_close` bound to `codec`, for `decode(..., stop_fn=...)` (a static
    argument: build it once and reuse it, or each new one compiles again)."""
    return functools.partial(ends_with_answer_close, codec)
