"""The in-graph codec against the tokenizer (encode/decode) and Python's `re`."""

import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st
from hypothesis.extra.numpy import arrays
from transformers.convert_slow_tokenizer import bytes_to_unicode

from ragen_jax.envs.registry import make
from ragen_jax.envs.sokoban import SIMPLE_SOKOBAN
from ragen_jax.text import codec as C
from ragen_jax.text.answer_re import parse_answer_text
from ragen_jax.text.codec import TextCodec
from real_tokenizers import QWEN_VOCAB_SIZE
from text_helpers import encode, grid_text, read_generation, reference_reasoning, reference_stop, valid_ids

BOARDS = [("SimpleSokoban", (6, 6)), ("LargerSokoban", (8, 8)), ("FrozenLake", (4, 4))]
render = jax.jit(C.render_observation, static_argnames="final_newline")
detokenize = jax.jit(C.detokenize)
parse = jax.jit(C.parse_answer, static_argnames="prefix")
stop = jax.jit(C.ends_with_answer_close)


# ----------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("name,shape", BOARDS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_render_equals_encode_on_random_boards(tokenizer, codecs, name, shape, data):
    codec = codecs(tokenizer, name)
    grid = data.draw(arrays(np.int32, shape, elements=st.integers(0, len(codec.symbols) - 1)))
    final_newline = data.draw(st.booleans())
    ids, mask = render(codec, jnp.asarray(grid), final_newline=final_newline)
    assert ids.shape == (codec.observation_capacity(*shape),)
    text = grid_text(codec.symbols, grid) + "\n" * final_newline
    assert valid_ids(ids, mask) == encode(tokenizer, text)


def test_render_equals_env_render_text_on_real_states(tokenizer, codecs):
    sokoban, _ = make("SimpleSokoban")
    fixed = np.array([[0] * 6, [0, 1, 1, 2, 1, 0], [0, 1, 2, 1, 1, 0], [0, 2, 1, 1, 1, 0],
                      [0, 1, 1, 1, 1, 0], [0] * 6])
    room = fixed.copy()
    room[1, 3], room[2, 2], room[4, 2] = 3, 5, 4  # box on target, player on target, box
    room[4, 4] = 5
    frozen, params = make("FrozenLake")
    holes = np.zeros((4, 4), bool)
    holes[1, 1] = holes[2, 3] = True
    lake = frozen.state_from_map(holes, [0, 0], [3, 3])
    cases = [(sokoban, sokoban.state_from_rooms(fixed, room, SIMPLE_SOKOBAN), SIMPLE_SOKOBAN),
             (frozen, lake, params), (frozen, lake.replace(player=jnp.array([1, 1])), params),
             (frozen, lake.replace(player=jnp.array([3, 3])), params)]
    for env, state, p in cases:
        codec = codecs(tokenizer, "SimpleSokoban" if env is sokoban else "FrozenLake")
        ids, mask = render(codec, env.symbol_grid(state, p))
        assert valid_ids(ids, mask) == encode(tokenizer, env.render_text(state, p, "grid"))


def coordinate_cases():
    """(env, params, state) with render_format="grid_coord": a Sokoban room with the player on the
    target, an 8×8 room with two boxes (one on a target), and lakes with holes and without."""
    sokoban, simple = make("SimpleSokoban", render_format="grid_coord")
    _, larger = make("LargerSokoban", render_format="grid_coord")
    fixed = np.array([[0] * 6, [0, 1, 1, 1, 1, 0], [0, 1, 2, 1, 1, 0], [0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 0], [0] * 6])
    room = fixed.copy()
    room[2, 2], room[4, 2] = 5, 4  # player on the target, box
    big_fixed = np.pad(np.ones((6, 6), np.int32), 1)
    big_fixed[6, 1] = big_fixed[2, 5] = 2
    big_room = big_fixed.copy()
    big_room[2, 5], big_room[5, 6], big_room[6, 6] = 3, 4, 5  # box on a target, box, player
    lake, lake_params = make("FrozenLake", render_format="grid_coord")
    holes = np.zeros((4, 4), bool)
    holes[1, 1] = holes[2, 3] = holes[3, 0] = True
    return [(sokoban, simple, sokoban.state_from_rooms(fixed, room, simple)),
            (sokoban, larger, sokoban.state_from_rooms(big_fixed, big_room, larger)),
            (lake, lake_params, lake.state_from_map(holes, [0, 0], [3, 3])),
            (lake, lake_params, lake.state_from_map(np.zeros((4, 4), bool), [3, 3], [0, 2]))]


def test_coordinate_lines_in_the_graph_equal_encode(tokenizer):
    """render_format="grid_coord": the state's tokens (coordinate lines, then the grid) are
    `tokenizer.encode(render_text + "\n")`, with every tokenizer; the plain grid needs no tables."""
    for env, params, state in coordinate_cases():
        codec = TextCodec.build(tokenizer, env, 2, env_params=params)
        ids, mask = jax.jit(env.state_tokens, static_argnums=1)(state, params, codec)
        text = env.render_text(state, params)
        assert text.startswith("Board size: ") and valid_ids(ids, mask) == encode(tokenizer, text + "\n"), text
    assert TextCodec.build(tokenizer, env, 2, env_params=params.replace(render_format="grid")).env_tables == {}


def test_coordinate_tables_refuse_a_tokenizer_that_merges_across_cells(builtin_tokenizer):
    """A tokenizer reading "), (" as one piece would make the joined pieces differ from encode."""
    from ragen_jax.envs.coordinates import coordinate_tables

    class Merging(_MergingTokenizer):
        def encode(self, text, add_special_tokens=False):
            return self.tok.encode(text.replace("), (", ")_("), add_special_tokens=add_special_tokens)

    assert "coord_items" in coordinate_tables(builtin_tokenizer, (6, 6), ("Targets", "Player"), ("#", "_"))
    with pytest.raises(ValueError, match=r"merges tokens across the pieces of the coordinate lines 'Targets: \(5, 5"):
        coordinate_tables(Merging(builtin_tokenizer), (6, 6), ("Targets", "Player"), ("#", "_"))


def test_coordinate_lines_need_the_codec_of_their_params(builtin_tokenizer, codecs):
    env, params, state = coordinate_cases()[0]
    with pytest.raises(ValueError, match=r"render_format='grid_coord' needs the codec built with these env params"):
        env.state_tokens(state, params, codecs(builtin_tokenizer, "SimpleSokoban"))
    with pytest.raises(ValueError, match=r"^render_format='text' is not one of grid, grid_coord$"):
        make("SimpleSokoban", render_format="text")


def test_punctuation_cells_swallow_the_newline(builtin_tokenizer, codecs):
    """docs/architecture.md#text-in-the-graph, as the piece table records it: ` #\\n` is one
    token, ` P\\n` two."""
    codec = codecs(builtin_tokenizer, "SimpleSokoban")
    wall, player = codec.symbols.index("#"), codec.symbols.index("P")
    lens = np.asarray(codec.piece_lens)
    assert lens[wall, 1, 1] == 1 and lens[player, 1, 1] == 2
    assert encode(builtin_tokenizer, " √\n") == list(np.asarray(codec.piece_ids)[3, 1, 1, :lens[3, 1, 1]])


class _MergingTokenizer:
    """A tokenizer that does not keep cells apart: it reads "# #" as "#_#"."""

    def __init__(self, tok):
        self.tok = tok

    def encode(self, text, add_special_tokens=False):
        return self.tok.encode(text.replace("# #", "#_#"), add_special_tokens=add_special_tokens)


class _FakeEnv:
    def __init__(self, symbols=("#", "_"), action_names=("Up", "Down")):
        self.symbols, self.action_names = symbols, action_names


def test_build_rejects_bad_inputs(builtin_tokenizer):
    tok = builtin_tokenizer
    with pytest.raises(ValueError, match="max_actions_per_turn=0"):
        TextCodec.build(tok, _FakeEnv(), 0)
    with pytest.raises(ValueError, match="'a b'"):
        TextCodec.build(tok, _FakeEnv(symbols=("#", "a b")), 2)
    with pytest.raises(ValueError, match="'Up '"):
        TextCodec.build(tok, _FakeEnv(action_names=("Up ",)), 2)
    with pytest.raises(ValueError, match="not distinct"):
        TextCodec.build(tok, _FakeEnv(action_names=("Up", "UP")), 2)
    with pytest.raises(ValueError, match="each cell must be its own pre-token"):
        TextCodec.build(_MergingTokenizer(tok), _FakeEnv(), 2)
    with pytest.raises(ValueError, match="vocab_size=10"):
        TextCodec.build(tok, _FakeEnv(), 2, vocab_size=10)


# ----------------------------------------------------------------------------- bytes


def test_token_bytes_match_the_tokenizer(tokenizer, byte_tables):
    table = byte_tables(tokenizer)
    inverse = {c: b for b, c in bytes_to_unicode().items()}
    assert C.byte_decoder() == inverse
    specials = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
    for i, token in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        expected = specials[i].encode() if i in specials else bytes(inverse[c] for c in token)
        assert table[i] == expected
        assert table[i].decode("utf-8", errors="replace") == tokenizer.decode([i])


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_detokenize_equals_decode(tokenizer, codecs, byte_tables, data):
    size = len(tokenizer)
    codec = codecs(tokenizer, "SimpleSokoban", vocab_size=size + 5)  # a model's padded vocabulary
    ids = np.array(data.draw(st.lists(st.integers(0, size + 4), min_size=32, max_size=32)), np.int32)
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=32, max_size=32)))
    text, length = detokenize(codec, jnp.asarray(ids), jnp.asarray(mask))
    kept = [int(i) for i in ids[mask] if i < size]
    got = bytes(np.asarray(text)[:int(length)])
    table = byte_tables(tokenizer)
    assert got == b"".join(table[i] for i in kept)
    assert got.decode("utf-8", errors="replace") == tokenizer.decode(kept)
    assert not np.asarray(text)[int(length):].any()


# ----------------------------------------------------------------------------- parsing

PATTERN = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)


def reference_parse(data: bytes, names, max_actions, prefix="<think>"):
    """docs/method.md#parsing-the-answer in plain Python, on the text the generation decodes to."""
    text = (prefix.encode() + data).decode("utf-8", errors="replace")
    match = PATTERN.search(text)
    parts = [p.strip() for p in match.group(2).split("||")] if match else []
    parts = [p for p in parts if p][:max_actions]
    lowered = [n.lower() for n in names]
    ids = [lowered.index(p.lower()) + 1 if p.lower() in lowered else 0 for p in parts]
    ok = bool(ids) and 0 not in ids
    return (ids if ok else []), ok


def test_whitespace_table_is_pythons():
    chars = [chr(c) for c in range(sys.maxunicode + 1)]
    assert [c.encode() for c in chars if re.fullmatch(r"\s", c)] == list(C.WHITESPACE)
    assert [c.encode() for c in chars if c.isspace()] == list(C.WHITESPACE)


SPACES = ["", " ", "  ", "\n", "\t \n", "\r\n", "\xa0", "\u3000", "\u2009", "\x85", "\x1c", "\u2028"]
ACTIONS = ["Up", "up", "DOWN", "Left", "rIgHt", "Right", "down", "LEFT"]
WORDS = [*ACTIONS, "Jump", "", "up down", "Lef", "Rightt", "\u212aey", "Ｕp", "é", "√"]
SEPARATORS = ["||", "||", " || ", "|||", "||||", "| |", "|"]
FRAGMENTS = ["<think>", "</think>", "<answer>", "</answer>", "||", "|", "<", ">", "/", "think", "answer",
             "</", "<answer", *SPACES, *WORDS, "😀", "\ufffd"]
noise = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=6).map("".join)
body = st.builds(lambda parts, sep: sep.join(parts),
                 st.lists(st.builds("{}{}{}".format, st.sampled_from(SPACES),
                                    st.one_of(st.sampled_from(ACTIONS), st.sampled_from(WORDS)),
                                    st.sampled_from(SPACES)), max_size=4),
                 st.sampled_from(SEPARATORS))
answers = st.builds("{}</think>{}<answer>{}</answer>{}".format, noise, st.sampled_from(SPACES), body, noise)
texts = st.one_of(answers, st.lists(st.one_of(answers, noise), max_size=3).map("".join),
                  st.lists(st.sampled_from(FRAGMENTS), max_size=24).map("".join))
raw_bytes = st.lists(st.one_of(texts.map(str.encode), st.binary(max_size=3)), max_size=4).map(b"".join)
BUFFER = 640
PADDING = b"</think><answer>Up</answer>" * 30  # after `length`: must be ignored


def parse_bytes(codec, data: bytes, prefix="<think>"):
    assert len(data) <= BUFFER
    buffer = np.frombuffer((data + PADDING)[:BUFFER], np.uint8)
    actions, count, ok = parse(codec, jnp.asarray(buffer), len(data), prefix=prefix)
    actions, count = np.asarray(actions), int(count)
    assert actions.shape == (codec.max_actions_per_turn,) and not actions[count:].any()
    return [int(a) for a in actions[:count]], bool(ok)


@pytest.mark.parametrize("name,max_actions", [("SimpleSokoban", 2), ("FrozenLake", 3)])
@settings(max_examples=300, deadline=None)
@given(data=st.one_of(texts.map(str.encode), raw_bytes))
def test_parse_answer_matches_python_re(builtin_tokenizer, codecs, name, max_actions, data):
    assume(len(data) <= BUFFER)
    codec = codecs(builtin_tokenizer, name, max_actions)
    expected = reference_parse(data, codec.action_names, max_actions)
    assert parse_bytes(codec, data) == expected


answer_text = jax.jit(C.answer_text, static_argnames=("width", "prefix"))


@settings(max_examples=150, deadline=None)
@given(data=st.one_of(texts.map(str.encode), raw_bytes))
def test_answer_text_matches_python_re(data):
    """The answer group as bytes (text envs): Python's `re` on the text, invalid UTF-8 kept as
    surrogates so the group encodes back to exactly the generated bytes."""
    assume(len(data) <= BUFFER)
    buffer = np.frombuffer((data + PADDING)[:BUFFER], np.uint8)
    match = PATTERN.search(("<think>".encode() + data).decode("utf-8", errors="surrogateescape"))
    group = match.group(2).encode("utf-8", errors="surrogateescape") if match else None
    for width in (8, 64):
        got, length, ok = (np.asarray(x) for x in answer_text(jnp.asarray(buffer), len(data), width=width))
        expect_ok = group is not None and len(group) <= width
        assert bool(ok) == expect_ok
        assert bytes(got[:int(length)]) == (group if expect_ok else b"") and not got[int(length):].any()


@settings(max_examples=60, deadline=None)
@given(data=st.one_of(texts.map(lambda t: ("<think>" + t).encode()), raw_bytes))
def test_parse_answer_without_prefix(builtin_tokenizer, codecs, data):
    assume(len(data) <= BUFFER)
    codec = codecs(builtin_tokenizer, "SimpleSokoban")
    assert parse_bytes(codec, data, prefix="") == reference_parse(data, codec.action_names, 2, prefix="")


def test_parse_answer_examples(builtin_tokenizer, codecs):
    codec = codecs(builtin_tokenizer, "SimpleSokoban")  # Up, Down, Left, Right = 1..4
    cases = {
        " I push. </think> <answer> Right || up </answer>": ([4, 1], True),
        "x</think>\n\n<answer>left||LEFT||Down</answer>": ([3, 3], True),  # truncated to 2
        "x</think><answer>Up || Jump</answer>": ([], False),  # unknown action
        "x</think><answer>Up || Down || Jump</answer>": ([1, 2], True),  # Jump is cut unread
        "x</think><answer> || Up ||</answer>": ([1], True),  # empty parts are dropped
        "x</think><answer>  </answer>": ([], False),  # no action at all
        "x</think> oops <answer>Up</answer>": ([], False),  # text between the tags
        "x</think><answer>Up": ([], False),  # no closing tag
        "a</think>b</think> <answer>Down</answer>": ([2], True),  # lazy think, later close
        "x</think><answer>Up|||Down</answer>": ([], False),  # parts "Up", "|Down"
    }
    for text, expected in cases.items():
        assert reference_parse(text.encode(), codec.action_names, 2) == expected, text
        assert parse_bytes(codec, text.encode()) == expected, text


def test_parse_answer_vmaps(builtin_tokenizer, codecs):
    codec = codecs(builtin_tokenizer, "FrozenLake", 3)  # Left, Down, Right, Up
    rows = [b" a </think><answer>Up||Down</answer>", b"</think><answer>Left</answer>", b""]
    buffer = np.zeros((3, 64), np.uint8)
    for r, row in enumerate(rows):
        buffer[r, :len(row)] = list(row)
    lengths = jnp.asarray([len(r) for r in rows])
    actions, count, ok = jax.jit(jax.vmap(C.parse_answer, in_axes=(None, 0, 0)))(codec, buffer, lengths)
    assert np.asarray(actions).tolist() == [[4, 2, 0], [1, 0, 0], [0, 0, 0]]
    assert np.asarray(count).tolist() == [2, 1, 0] and np.asarray(ok).tolist() == [True, True, False]


GENERATION = 96  # generated-token slots


def check_generation(tok, codec, table, ids):
    """In-graph bytes, parse and reasoning length of `ids` == the tokenizer's decode, the
    project's Python parser (answer_re) and the byte reference."""
    buffer = np.zeros(GENERATION, np.int32)
    buffer[:len(ids)] = ids
    actions, count, ok, reasoning, _ = read_generation(codec, jnp.asarray(buffer), jnp.arange(GENERATION) < len(ids))
    text = tok.decode(ids)
    assert b"".join(table[i] for i in ids).decode("utf-8", errors="replace") == text
    expected = parse_answer_text(text, codec.action_names, codec.max_actions_per_turn)
    assert ([int(a) for a in np.asarray(actions)[:int(count)]], bool(ok)) == expected, text
    assert int(reasoning) == reference_reasoning(table, ids), text


def encoded_answer(tok, text):
    ids = encode(tok, text)
    assume(len(ids) <= GENERATION)
    return ids


@settings(max_examples=60, deadline=None)
@given(text=answers)
def test_encoded_answers_read_like_decoded_text(small_tokenizer, codecs, byte_tables, text):
    """Generated ids -> bytes -> actions, against decode -> re, on answers the tokenizer encodes."""
    codec = codecs(small_tokenizer, "SimpleSokoban")
    check_generation(small_tokenizer, codec, byte_tables(small_tokenizer), encoded_answer(small_tokenizer, text))


@settings(max_examples=25, deadline=None)
@given(text=answers)
def test_encoded_answers_read_like_decoded_text_real(real_tokenizer, codecs, byte_tables, text):
    codec = codecs(real_tokenizer, "SimpleSokoban")
    check_generation(real_tokenizer, codec, byte_tables(real_tokenizer), encoded_answer(real_tokenizer, text))


# What a sampled generation looks like to the parser: answer fragments as the tokenizer encodes
# them, mixed with arbitrary ids (multi-byte characters split across tokens, special tokens).
GENERATED_FRAGMENTS = ["<think>", "</think>", "<answer>", "</answer>", " </think>\n", "</think> <answer>",
                       " <answer> ", " </answer>", "||", " || ", "|", "Up", " up", "DOWN", " Left", " Right ",
                       "\n\n", " ", "\u3000", "\xa0", "√", "é", "😀", "</", "answer>", "think>"]


def generated_ids(tok, data):
    pieces = [encode(tok, f) for f in GENERATED_FRAGMENTS]
    chunks = st.one_of(st.sampled_from(pieces), st.integers(0, len(tok) - 1).map(lambda i: [i]))
    ids = [i for c in data.draw(st.lists(chunks, max_size=40)) for i in c]
    return ids[:GENERATION]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_generated_ids_read_like_decoded_text(small_tokenizer, codecs, byte_tables, data):
    codec = codecs(small_tokenizer, "SimpleSokoban")
    check_generation(small_tokenizer, codec, byte_tables(small_tokenizer), generated_ids(small_tokenizer, data))


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_generated_ids_read_like_decoded_text_real(real_tokenizer, codecs, byte_tables, data):
    codec = codecs(real_tokenizer, "SimpleSokoban")
    check_generation(real_tokenizer, codec, byte_tables(real_tokenizer), generated_ids(real_tokenizer, data))


def test_qwen_model_vocabulary_pads_the_byte_table(qwen_tokenizer, codecs, byte_tables):
    """Qwen's models have 151,936 embedding rows, more than the tokenizer's ids: the rows past
    the tokenizer decode to nothing, the rest to the tokenizer's bytes."""
    codec = codecs(qwen_tokenizer, "SimpleSokoban", vocab_size=QWEN_VOCAB_SIZE)
    size = len(qwen_tokenizer)
    assert codec.byte_table.shape[0] == QWEN_VOCAB_SIZE > size
    assert not np.asarray(codec.byte_lens)[size:].any()
    ids = np.array([size - 1, size, QWEN_VOCAB_SIZE - 1, 0], np.int32)
    text, length = detokenize(codec, jnp.asarray(ids), jnp.ones(4, bool))
    table = byte_tables(qwen_tokenizer)
    assert bytes(np.asarray(text)[:int(length)]) == table[size - 1] + table[0]


# ----------------------------------------------------------------------------- stop check


def check_stop(tok, codec, table, data):
    n, batch = 20, 8
    pieces = ["</answer>", " </answer>", "</", "answer", ">", "</answer>\n", "<answer>", " Up", " ||",
              "</think>", "<", "/", "a", "n", "s", "w", "e", "r", "</ans", "wer>", "x</answer>y"]
    chunks = st.one_of(st.sampled_from([encode(tok, p) for p in pieces]),
                       st.integers(0, len(tok) - 1).map(lambda i: [i]))
    rows = []
    for _ in range(batch):
        row = [i for c in data.draw(st.lists(chunks, min_size=n, max_size=n)) for i in c]
        rows.append(row[:n])
    lengths = data.draw(st.lists(st.integers(0, n), min_size=batch, max_size=batch))
    tokens = np.array(rows, np.int32)
    got = np.asarray(stop(codec, jnp.asarray(tokens), jnp.asarray(lengths, jnp.int32)))
    assert got.tolist() == [reference_stop(table, list(r), k) for r, k in zip(tokens, lengths)]


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_stop_check_matches_reference(small_tokenizer, codecs, byte_tables, data):
    check_stop(small_tokenizer, codecs(small_tokenizer, "SimpleSokoban"), byte_tables(small_tokenizer), data)


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_stop_check_matches_reference_real(real_tokenizer, codecs, byte_tables, data):
    check_stop(real_tokenizer, codecs(real_tokenizer, "SimpleSokoban"), byte_tables(real_tokenizer), data)


def test_stop_fn_is_a_decode_stop_fn(builtin_tokenizer, codecs):
    codec = codecs(builtin_tokenizer, "SimpleSokoban")
    ids = encode(builtin_tokenizer, "<think> go </think> <answer> Up </answer>")
    tokens = np.zeros((2, 24), np.int32)
    tokens[:, :len(ids)] = ids
    fn = C.stop_fn(codec)
    lengths = jnp.asarray([len(ids), len(ids) - 1])
    assert np.asarray(jax.jit(fn)(jnp.asarray(tokens), lengths)).tolist() == [True, False]
