"""Countdown: the in-graph evaluator against Python's own parser and `Fraction` arithmetic, the
generator (every target reachable), rewards, and the state's tokens against the tokenizer."""

import ast
import re
from collections import Counter
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ragen_jax.envs import registry
from ragen_jax.envs.countdown import COUNTDOWN, MAX_ANSWER_BYTES, CountdownParams, CountdownState, evaluate
from ragen_jax.models.hf import load_tokenizer
from ragen_jax.text.codec import TextCodec

BATCH = 64
evaluate_batch = jax.jit(jax.vmap(evaluate, in_axes=(0, 0, 0, 0, 0)))


# ----------------------------------------------------------------------------- the reference


def reference(answer: bytes, numbers, target):
    """(valid, reward) by Python: the module's grammar checked with `ast`, values as Fractions."""
    try:
        text = answer.decode("ascii")
    except UnicodeDecodeError:
        return False, 0.0
    if not re.fullmatch(r"[0-9+\-*/() \t\n\r\x0b\x0c]*", text) or re.search(r"(?<![0-9])0[0-9]", text):
        return False, 0.0
    try:
        tree = ast.parse(re.sub(r"[\t\n\r\x0b\x0c]", " ", text).strip(), mode="eval")
    except SyntaxError:
        return False, 0.0
    literals = []

    def walk(node):  # collect the literals; anything outside the grammar is malformed
        if isinstance(node, ast.Constant) and type(node.value) is int:
            literals.append(node.value)
        elif isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult, ast.Div):
            walk(node.left)
            walk(node.right)
        else:
            raise ValueError(ast.dump(node))

    try:
        walk(tree.body)
    except ValueError:
        return False, 0.0
    if Counter(literals) != Counter(numbers):
        return True, 0.0
    try:
        result = _frac(tree.body)
    except ZeroDivisionError:
        return False, 0.0
    return True, 1.0 if result == target else 0.1


def in_graph(answers, episodes):
    """Rewards of byte strings under (numbers, target) episodes, padded to one compiled batch."""
    assert len(answers) <= BATCH
    data = np.zeros((BATCH, MAX_ANSWER_BYTES), np.uint8)
    lengths = np.zeros(BATCH, np.int32)
    numbers = np.zeros((BATCH, 4), np.int32)
    counts, targets = np.full(BATCH, 3, np.int32), np.ones(BATCH, np.int32)
    for i, (answer, (nums, target)) in enumerate(zip(answers, episodes)):
        assert len(answer) <= MAX_ANSWER_BYTES
        data[i, :len(answer)] = list(answer)
        data[i, len(answer):] = list((b"+1*(2" * 20)[:MAX_ANSWER_BYTES - len(answer)])  # past the length: ignored
        lengths[i], numbers[i, :len(nums)], counts[i], targets[i] = len(answer), nums, len(nums), target
    valid, right, hit = (np.asarray(x) for x in evaluate_batch(jnp.asarray(data), jnp.asarray(lengths),
                                                                jnp.asarray(numbers), jnp.asarray(counts),
                                                                jnp.asarray(targets)))
    reward = np.where(right, np.where(hit, 1.0, 0.1), 0.0)
    return [(bool(valid[i]), float(reward[i])) for i in range(len(answers))]


# ----------------------------------------------------------------------------- strategies

numbers_st = st.lists(st.integers(1, 100), min_size=3, max_size=4)
SPACE = st.sampled_from(["", "", "", " ", "  ", "\t", "\n", "\r\n"])
OPS = st.sampled_from("+-*/")


@st.composite
def expression(draw, leaves):
    """A random well-formed expression over `leaves` (in some order, random grouping)."""
    items = [str(n) for n in leaves]
    while len(items) > 1:
        i = draw(st.integers(0, len(items) - 2))
        left, right = items[i], items[i + 1]
        op = draw(OPS)
        wrap = draw(st.booleans())
        joined = f"{left}{draw(SPACE)}{op}{draw(SPACE)}{right}"
        items[i:i + 2] = [f"({draw(SPACE)}{joined}{draw(SPACE)})" if wrap else joined]
    return f"{draw(SPACE)}{items[0]}{draw(SPACE)}"


@st.composite
def case(draw):
    numbers = draw(numbers_st)
    kind = draw(st.integers(0, 5))
    if kind <= 1:  # the right numbers in a random order
        leaves = draw(st.permutations(numbers))
    elif kind == 2:  # wrong numbers: a subset, a repeat, a stranger, a leading zero or a big literal
        leaves = draw(st.lists(st.one_of(st.sampled_from(numbers), st.integers(0, 10 ** 12),
                                         st.sampled_from(["0", "00", "07", "010"])), min_size=1, max_size=5))
    else:
        leaves = list(numbers)
    text = draw(expression(leaves))
    if kind == 3:  # a mutation: insert, delete or replace one character
        pos = draw(st.integers(0, len(text)))
        char = draw(st.sampled_from(list("0123456789+-*/() .x\u00a0") + ["**", "//", "-", "()"]))
        how = draw(st.integers(0, 2))
        text = text[:pos] + char * (how != 1) + text[pos + (how != 0):]
    elif kind == 4:  # anything over the alphabet
        text = draw(st.text(alphabet="0123456789+-*/() \t\n", max_size=24))
    elif kind == 5:  # divisions by zero among the right numbers
        text = f"{numbers[0]}/({numbers[1]}-{numbers[1]})" + "".join(f"*{n}" for n in numbers[2:])
        numbers = numbers[:2] + [numbers[1]] + numbers[2:3]
    data = text.encode()
    if kind == 4 and draw(st.booleans()):
        data += draw(st.binary(max_size=3))
    target = draw(st.integers(1, 999))
    if kind <= 1 and draw(st.booleans()):  # make the value right when it is an integer
        ok, _ = reference(data[:MAX_ANSWER_BYTES], numbers, 1)
        if ok:
            value = eval_fraction(data.decode())
            if value is not None and value.denominator == 1 and 1 <= value <= 999:
                target = int(value)
    return data[:MAX_ANSWER_BYTES], numbers[:4], target


def eval_fraction(text):
    try:
        return _frac(ast.parse(re.sub(r"\s", " ", text).strip(), mode="eval").body)
    except ZeroDivisionError:
        return None


def _frac(node):
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    a, b = _frac(node.left), _frac(node.right)
    return {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b, ast.Div: lambda: a / b}[
        type(node.op)]()


# ----------------------------------------------------------------------------- evaluator


def test_reference_examples():
    """The reference itself on hand-checked cases, so the property test compares to the right thing."""
    n = [4, 6, 25]
    assert reference(b"(25 - 6 + 4)", n, 23) == (True, 1.0)
    assert reference(b"25*(6-4)", n, 23) == (True, 0.1)
    assert reference(b"25*6", n, 150) == (True, 0.0)  # a number unused
    assert reference(b"25*6*4*4", n, 1) == (True, 0.0)  # a number twice
    assert reference(b"-25+6+4", n, 1) == (False, 0.0)  # unary minus
    assert reference(b"25**6-4", n, 1) == (False, 0.0)
    assert reference(b"25//6+4", n, 1) == (False, 0.0)
    assert reference(b"025+6+4", n, 35) == (False, 0.0)
    assert reference(b"4/(6-6)+25", [4, 6, 6, 25], 1) == (False, 0.0)
    assert reference(b"4/(6-6)+25", n, 1) == (True, 0.0)  # wrong numbers: not evaluated
    assert reference(b"(4)(6)+25", n, 1) == (False, 0.0)
    assert reference(b"6/4*25", n, 1) == (True, 0.1)  # 37.5
    assert reference(b"\n6 *\t(25 - 4)\r\n", n, 126) == (True, 1.0)


def test_evaluator_examples():
    cases = [(b"(25 - 6 + 4)", 23), (b"25*(6-4)", 23), (b"25*6", 150), (b"", 1), (b"()", 1), (b"25+6+4)", 35),
             (b"((25+6)+4", 35), (b"25 6 4", 1), (b"25+6+4", 35), (b"25 + 6 + 4 ", 35), (b"4-6-25", -27),
             (b"4-(6-25)", 23), (b"6/4*25", 1), (b"25/(6-4)*1", 1), (b"4/(6-6)", 1), (b"\xe2\x80\x83 4+6+25", 35)]
    episodes = [([4, 6, 25], t) for _, t in cases]
    got = in_graph([c for c, _ in cases], episodes)
    assert got == [reference(c, n, t) for c, (n, t) in zip([c for c, _ in cases], episodes)]
    assert got[0] == (True, 1.0) and got[1] == (True, 0.1) and got[3] == (False, 0.0)


@settings(max_examples=25, deadline=None)
@given(cases=st.lists(case(), min_size=BATCH, max_size=BATCH))
def test_evaluator_matches_python(cases):
    got = in_graph([c[0] for c in cases], [(c[1], c[2]) for c in cases])
    assert got == [reference(*c) for c in cases]


def test_the_largest_values_stay_exact():
    """4 numbers near 100 reach the bound 2^3·100^4 of the module docstring: still exact."""
    n = [99, 100, 97, 98]
    answers = [b"(99/100 + 97/98)", b"99*100*97*98", b"99/100/97/98", b"99/100-97/98", b"(99*100 - 97*98)",
               b"100/(98-98)*97", b"(99/98 - 100/97)"]
    episodes = [(n, 1), (n, 94109400), (n, 1), (n, 1), (n, 394), ([100, 98, 98, 97], 1), (n, 1)]
    got = in_graph(answers, episodes)
    assert got == [reference(a, *e) for a, e in zip(answers, episodes)]
    assert got == [(True, 0.1), (True, 1.0), (True, 0.1), (True, 0.1), (True, 1.0), (False, 0.0), (True, 0.1)]


# ----------------------------------------------------------------------------- generation


def reachable(numbers):
    """Every value of an expression that uses each number exactly once (Python, exact)."""
    def values(items):
        if len(items) == 1:
            return {Fraction(items[0])}
        out = set()
        for mask in range(1, 2 ** len(items) - 1):
            left = [x for i, x in enumerate(items) if mask >> i & 1]
            right = [x for i, x in enumerate(items) if not mask >> i & 1]
            for a in values(tuple(left)):
                for b in values(tuple(right)):
                    out |= {a + b, a - b, a * b}
                    if b:
                        out.add(a / b)
        return out

    return values(tuple(numbers))


@pytest.fixture(scope="module")
def episodes():
    params = CountdownParams()
    keys = jax.random.split(jax.random.key(7), 96)
    return keys, params, jax.jit(COUNTDOWN.reset_batch, static_argnums=1)(keys, params)


def test_every_generated_target_is_reachable(episodes):
    _, params, states = episodes
    numbers, counts, targets = (np.asarray(x) for x in (states.numbers, states.count, states.target))
    assert set(counts) == {3, 4}
    for nums, count, target in zip(numbers, counts, targets):
        assert np.all(nums[count:] == 0) and np.all((nums[:count] >= 1) & (nums[:count] <= params.max_number))
        assert 1 <= target <= params.max_target
        assert Fraction(int(target)) in reachable([int(x) for x in nums[:count]])
    assert len(set(map(int, targets))) > len(targets) // 2  # varied


# ----------------------------------------------------------------------------- text


@pytest.fixture(scope="module")
def codec():
    tok = load_tokenizer()
    return tok, TextCodec.build(tok, COUNTDOWN, 1)


@settings(max_examples=30, deadline=None)
@given(numbers=numbers_st, target=st.integers(0, 9999))
def test_state_tokens_equal_encode(codec, numbers, target):
    tok, cd = codec
    params = CountdownParams()
    state = CountdownState(numbers=jnp.asarray(numbers + [0] * (4 - len(numbers))), count=jnp.int32(len(numbers)),
                           target=jnp.int32(target), done=jnp.array(False), success=jnp.array(False))
    ids, mask = _state_tokens(state, params, cd)
    text = COUNTDOWN.render_text(state, params) + "\n"
    assert text == f"Numbers: [{', '.join(map(str, numbers))}]\nTarget: {target}\n"
    assert np.asarray(ids)[np.asarray(mask)].tolist() == tok.encode(text, add_special_tokens=False)


_state_tokens = jax.jit(COUNTDOWN.state_tokens, static_argnums=1)


def test_registry_and_params():
    env, params = registry.make("countdown", max_target=50)
    assert env is COUNTDOWN and params.max_target == 50 and env.answer_kind == "text"
    for bad, match in ((dict(max_numbers=5), "max_numbers=5"), (dict(max_number=101), "max_number=101"),
                       (dict(max_steps=2), "max_steps=2"), (dict(max_target=0), "max_target=0")):
        with pytest.raises(ValueError, match=match):
            registry.make("Countdown", **bad)
