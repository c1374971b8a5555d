"""Countdown in pure JAX: combine the given numbers into an expression that equals the target.

An episode shows 3–4 numbers in [1, `max_number`] and a target. The target is the value of a
random expression tree over all the numbers, drawn inside jit: pick two live values, combine
them with a random operator (either order), repeat until one value is left; a tree whose value
is not an integer in [1, `max_target`], or that divides by zero, is redrawn (try t uses
`fold_in(key, t)`, so `reset_batch(keys)[i] == reset(keys[i])`). So every target is reachable.

One answer ends the episode. The answer (the `<answer>` group, read as text) must be an
expression over decimal integers with `+ - * /` and parentheses (no unary signs, no leading
zeros, ASCII whitespace anywhere between tokens, at most `MAX_ANSWER_BYTES` bytes). The
evaluator parses and evaluates it in JAX with exact rational arithmetic (`evaluate`):

- malformed, too long, or dividing by zero -> not a valid answer (`action_is_valid` False;
  the rollout applies the format penalty and the episode continues);
- numbers right (the literals are exactly the given numbers, each used once) and value equal
  to the target -> reward 1 (success); numbers right, value wrong -> 0.1; otherwise 0.

The order of the checks follows from exactness: an expression whose numbers are wrong scores 0
without being evaluated (its literals may be arbitrarily large); with the right numbers every
intermediate numerator and denominator is bounded by 2^(n-1)·max_number^n (n ≤ 4 leaves,
max_number ≤ 100: < 2^31), so int32 arithmetic is exact and a division by zero is seen exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ragen_jax.envs.base import Info, TextAnswerEnvironment
from ragen_jax.text.codec import pack

MAX_ANSWER_BYTES = 64
NUMBERS_OPEN, NUMBER_SEP, TARGET_OPEN, STATE_CLOSE = "Numbers: [", ", ", "]\nTarget: ", "\n"
NUMBER_DIGITS, TARGET_DIGITS = 3, 4  # max_number <= 100, max_target <= 9999
BIG = 10 ** 8  # literals saturate here (larger than any given number; no int32 overflow)

# Operator codes of the evaluator's stack; OPEN is "(" (precedence 0 stops reductions).
PLUS, MINUS, TIMES, DIVIDE, OPEN = 1, 2, 3, 4, 5
PRECEDENCE = np.array([0, 1, 1, 2, 2, 0], np.int32)
WHITESPACE = tuple(map(ord, " \t\n\r\x0b\x0c"))


@struct.dataclass
class CountdownParams:
    """Static settings (they fix array shapes, so jit specialises on them)."""

    min_numbers: int = struct.field(pytree_node=False, default=3)
    max_numbers: int = struct.field(pytree_node=False, default=4)
    max_number: int = struct.field(pytree_node=False, default=100)  # numbers are drawn from [1, max_number]
    max_target: int = struct.field(pytree_node=False, default=999)  # targets lie in [1, max_target]
    max_steps: int = struct.field(pytree_node=False, default=1)  # unused: one valid answer ends the episode

    def __post_init__(self):
        if not 2 <= self.min_numbers <= self.max_numbers <= 4:
            raise ValueError(f"min_numbers={self.min_numbers}, max_numbers={self.max_numbers}: need "
                             f"2 <= min_numbers <= max_numbers <= 4")
        if not 1 <= self.max_number <= 100:
            raise ValueError(f"max_number={self.max_number} must be in [1, 100] (exact int32 arithmetic)")
        if not 1 <= self.max_target < 10 ** TARGET_DIGITS:
            raise ValueError(f"max_target={self.max_target} must be in [1, {10 ** TARGET_DIGITS - 1}]")
        if self.max_steps != 1:
            raise ValueError(f"max_steps={self.max_steps}: Countdown episodes are one answer; allowed: 1")


@struct.dataclass
class CountdownState:
    numbers: jax.Array  # int32[max_numbers], 0 past `count`
    count: jax.Array  # int32
    target: jax.Array  # int32
    done: jax.Array  # bool
    success: jax.Array  # bool


# ----------------------------------------------------------------------------- arithmetic


def _combine(op, an, ad, bn, bd):
    """(an/ad) op (bn/bd) for op codes PLUS..DIVIDE: (numerator, denominator, divides by zero)."""
    n = jnp.select([op == PLUS, op == MINUS, op == TIMES], [an * bd + bn * ad, an * bd - bn * ad, an * bn], an * bd)
    d = jnp.where(op == DIVIDE, ad * bn, ad * bd)
    return n, d, (op == DIVIDE) & (bn == 0)


def _equals(n, d, value):
    """n/d == value exactly (d may be negative; d == 0 is never equal)."""
    safe = jnp.where(d == 0, 1, d)
    return (d != 0) & (n % safe == 0) & (n // safe == value)


# ----------------------------------------------------------------------------- generation


def _try(key, params: CountdownParams):
    """One random episode and whether its expression tree gives a usable target."""
    size = params.max_numbers
    k_count, k_numbers, k_pick, k_ops = jax.random.split(key, 4)
    count = jax.random.randint(k_count, (), params.min_numbers, params.max_numbers + 1)
    slots = jnp.arange(size)
    numbers = jnp.where(slots < count, jax.random.randint(k_numbers, (size,), 1, params.max_number + 1), 0)
    scores = jax.random.uniform(k_pick, (size - 1, 2, size))
    ops = jax.random.randint(k_ops, (size - 1,), PLUS, DIVIDE + 1)
    num, den, alive, bad = numbers, jnp.ones(size, jnp.int32), slots < count, jnp.array(False)
    for s in range(size - 1):
        go = s < count - 1
        i = jnp.argmax(jnp.where(alive, scores[s, 0], -1.0))
        j = jnp.argmax(jnp.where(alive & (slots != i), scores[s, 1], -1.0))
        n, d, zero = _combine(ops[s], num[i], den[i], num[j], den[j])
        num = jnp.where(go, num.at[i].set(n), num)
        den = jnp.where(go, den.at[i].set(d), den)
        alive = jnp.where(go, alive.at[j].set(False), alive)
        bad = bad | (go & zero)
    last = jnp.argmax(alive)
    n, d = num[last], den[last]
    safe = jnp.where(d == 0, 1, d)
    target = n // safe
    ok = ~bad & (d != 0) & (n % safe == 0) & (target >= 1) & (target <= params.max_target)
    state = CountdownState(numbers=numbers.astype(jnp.int32), count=count.astype(jnp.int32),
                           target=target.astype(jnp.int32), done=jnp.array(False), success=jnp.array(False))
    return state, ok


# ----------------------------------------------------------------------------- the evaluator


@struct.dataclass
class _Parse:
    nums: jax.Array  # int32[D] operand stack: numerators
    dens: jax.Array  # int32[D] ... denominators
    sp: jax.Array  # operands on the stack
    ops: jax.Array  # int32[D] operator stack (PLUS..OPEN)
    osp: jax.Array
    expect: jax.Array  # an operand (number or "(") comes next
    in_number: jax.Array
    current: jax.Array  # the number being read (saturates at BIG)
    error: jax.Array
    div_zero: jax.Array
    used: jax.Array  # bool[N] given numbers matched by a literal
    foreign: jax.Array  # a literal matched no unused given number


def _top(p: _Parse):
    return jnp.where(p.osp > 0, p.ops[jnp.maximum(p.osp - 1, 0)], 0)


def _reduce(p: _Parse, go) -> _Parse:
    """Pop an operator and two operands, push the result (where `go`)."""
    a, b = jnp.maximum(p.sp - 2, 0), jnp.maximum(p.sp - 1, 0)
    n, d, zero = _combine(_top(p), p.nums[a], p.dens[a], p.nums[b], p.dens[b])
    return p.replace(nums=jnp.where(go, p.nums.at[a].set(n), p.nums), dens=jnp.where(go, p.dens.at[a].set(d), p.dens),
                     sp=p.sp - go, osp=p.osp - go, div_zero=p.div_zero | (go & zero))


def _reduce_above(p: _Parse, go, precedence) -> _Parse:
    """Reduce while the top operator binds at least as tightly as `precedence` (not past "(").
    Within one parenthesis level the stack holds at most a +/- then a * or /, so two rounds do."""
    table = jnp.asarray(PRECEDENCE)
    for _ in range(2):
        top = _top(p)
        p = _reduce(p, go & (p.osp > 0) & (top != OPEN) & (table[top] >= precedence))
    return p


def _finish_number(p: _Parse, go, numbers, count) -> _Parse:
    """Push the number being read as n/1 and match it against an unused given number."""
    go = go & p.in_number
    free = (numbers == p.current) & ~p.used & (jnp.arange(numbers.shape[0]) < count)
    at = jnp.minimum(p.sp, p.nums.shape[0] - 1)
    return p.replace(
        nums=jnp.where(go, p.nums.at[at].set(p.current), p.nums), dens=jnp.where(go, p.dens.at[at].set(1), p.dens),
        sp=p.sp + go, in_number=p.in_number & ~go, expect=p.expect & ~go,
        used=jnp.where(go & free.any(), p.used.at[jnp.argmax(free)].set(True), p.used),
        foreign=p.foreign | (go & ~free.any()))


def evaluate(answer: jax.Array, length, numbers: jax.Array, count, target):
    """The Countdown answer `answer[:length]` (uint8 bytes) against the episode:
    (valid, numbers_right, value_right) as bools. See the module docstring for the grammar.

    Equals, on every byte string, the reference in the tests: Python's `ast` parse of the
    string (after the character, leading-zero and whitespace rules) evaluated with `Fraction`.
    """
    width = answer.shape[0]
    depth = width + 2
    p = _Parse(nums=jnp.zeros(depth, jnp.int32), dens=jnp.ones(depth, jnp.int32), sp=jnp.int32(0),
               ops=jnp.zeros(depth, jnp.int32), osp=jnp.int32(0), expect=jnp.array(True),
               in_number=jnp.array(False), current=jnp.int32(0), error=jnp.array(False),
               div_zero=jnp.array(False), used=jnp.zeros(numbers.shape, bool), foreign=jnp.array(False))
    table = jnp.asarray(PRECEDENCE)

    def read(p: _Parse, x):
        byte, inside = x
        byte = byte.astype(jnp.int32)
        digit = inside & (byte >= ord("0")) & (byte <= ord("9"))
        code = jnp.select([byte == ord("+"), byte == ord("-"), byte == ord("*"), byte == ord("/")],
                          [PLUS, MINUS, TIMES, DIVIDE], 0)
        operator = inside & (code > 0)
        opening, closing = inside & (byte == ord("(")), inside & (byte == ord(")"))
        space = inside & jnp.isin(byte, jnp.asarray(WHITESPACE))
        other = inside & ~(digit | operator | opening | closing | space)

        p = _finish_number(p, inside & ~digit, numbers, count)
        # a digit: continues the number (no leading zero), or starts one where an operand is due
        error = p.error | other | (digit & ~p.in_number & ~p.expect) | (digit & p.in_number & (p.current == 0))
        current = jnp.where(p.in_number, jnp.minimum(p.current * 10 + byte - ord("0"), BIG), byte - ord("0"))
        p = p.replace(current=jnp.where(digit, current, p.current), in_number=p.in_number | digit,
                      error=error | (operator & p.expect) | (opening & ~p.expect) | (closing & p.expect))
        # an operator: reduce what binds at least as tightly, then push it
        p = _reduce_above(p, operator, table[code])
        at = jnp.minimum(p.osp, depth - 1)
        push = operator | opening
        p = p.replace(ops=jnp.where(push, p.ops.at[at].set(jnp.where(operator, code, OPEN)), p.ops),
                      osp=p.osp + push, expect=p.expect | push)
        # ")": reduce down to its "(" and drop it
        p = _reduce_above(p, closing, 0)
        matched = (p.osp > 0) & (_top(p) == OPEN)
        p = p.replace(osp=p.osp - (closing & matched), error=p.error | (closing & ~matched))
        return p, None

    p, _ = jax.lax.scan(read, p, (answer, jnp.arange(width) < length))
    p = _finish_number(p, jnp.array(True), numbers, count)
    p = _reduce_above(p, jnp.array(True), 0)
    valid_syntax = ~p.error & ~p.expect & (p.osp == 0) & (p.sp == 1)
    numbers_right = ~p.foreign & jnp.all(p.used == (jnp.arange(numbers.shape[0]) < count))
    valid = valid_syntax & ~(numbers_right & p.div_zero)
    return valid, valid & numbers_right, valid & numbers_right & _equals(p.nums[0], p.dens[0], target)


# ----------------------------------------------------------------------------- the environment


def _digits(value, width: int):
    """Decimal digits of a non-negative integer right-aligned in `width` slots, and which slots show."""
    value = jnp.clip(jnp.asarray(value, jnp.int32), 0, 10 ** width - 1)
    powers = jnp.asarray([10 ** (width - 1 - j) for j in range(width)], jnp.int32)
    shown = 1 + sum((value >= 10 ** k).astype(jnp.int32) for k in range(1, width))
    return (value // powers) % 10, jnp.arange(width) >= width - shown


class Countdown(TextAnswerEnvironment):
    name = "Countdown"
    max_answer_bytes = MAX_ANSWER_BYTES
    render_formats = ("text",)

    def default_params(self) -> CountdownParams:
        return CountdownParams()

    def reset(self, key: jax.Array, params: CountdownParams) -> CountdownState:
        def retry(carry):
            t, _, _ = carry
            state, ok = _try(jax.random.fold_in(key, t), params)
            return t + 1, state, ok

        state, ok = _try(jax.random.fold_in(key, 0), params)
        _, state, _ = jax.lax.while_loop(lambda c: ~c[2], retry, (jnp.int32(1), state, ok))
        return state

    def step(self, key, state, action, params):
        raise TypeError("Countdown reads its answer as text: call step_text (answer_kind = 'text')")

    def step_text(self, key, state: CountdownState, answer, length, params: CountdownParams, tables=None):
        valid, numbers_right, value_right = evaluate(answer, length, state.numbers, state.count, state.target)
        live = ~state.done
        reward = jnp.where(live & numbers_right, jnp.where(value_right, 1.0, 0.1), 0.0).astype(jnp.float32)
        success = state.success | (live & value_right)
        new = state.replace(done=state.done | valid, success=success)
        info: Info = {"success": success, "action_is_valid": valid, "action_is_effective": live & valid,
                      "truncated": jnp.array(False)}
        return new, reward, new.done, info

    def instructions(self) -> str:
        return ("You are solving the Countdown puzzle. Combine the given numbers with +, -, *, / and "
                "parentheses into an expression that equals the target, using each number exactly once. "
                "The answer should be the expression, like <answer> (12 + 3) * 2 </answer>.")

    # ------------------------------------------------------------------ text

    def render_text(self, state: CountdownState, params: CountdownParams, fmt: str = "text") -> str:
        if fmt not in self.render_formats:
            raise ValueError(f"render format {fmt!r} is not supported by {self.name}; allowed: {self.render_formats}")
        numbers = np.asarray(jax.device_get(state.numbers))[: int(state.count)]
        return f"{NUMBERS_OPEN}{NUMBER_SEP.join(str(int(n)) for n in numbers)}{TARGET_OPEN}{int(state.target)}"

    def boundary_samples(self) -> list[str]:
        return [f"{NUMBERS_OPEN}1{NUMBER_SEP}23{NUMBER_SEP}100{TARGET_OPEN}4567", f"{NUMBERS_OPEN}9{TARGET_OPEN}0"]

    def text_tables(self, tokenizer, params=None) -> dict:
        def encode(text):
            return list(tokenizer.encode(text, add_special_tokens=False))

        digits = [encode(str(d)) for d in range(10)]
        if any(len(ids) != 1 for ids in digits):
            raise ValueError("the tokenizer does not encode every digit as one token; Countdown renders "
                             "numbers digit by digit")
        pieces = {name: encode(text) for name, text in (("open", NUMBERS_OPEN), ("sep", NUMBER_SEP),
                                                          ("target", TARGET_OPEN), ("close", STATE_CLOSE))}
        for sample in self.boundary_samples():
            body, target = sample[len(NUMBERS_OPEN):].split(TARGET_OPEN)
            numbers = body.split(NUMBER_SEP)
            joined = pieces["open"] + [i for k, n in enumerate(numbers)
                                       for i in (pieces["sep"] if k else []) + [digits[int(c)][0] for c in n]]
            joined += pieces["target"] + [digits[int(c)][0] for c in target] + pieces["close"]
            if encode(sample + STATE_CLOSE) != joined:
                raise ValueError(f"the tokenizer merges tokens across the pieces of {sample!r}; Countdown "
                                 f"renders it piece by piece")
        out = {f"countdown_{name}": jnp.asarray(ids, jnp.int32) for name, ids in pieces.items()}
        out["countdown_digits"] = jnp.asarray([ids[0] for ids in digits], jnp.int32)
        return out

    def state_tokens(self, state: CountdownState, params: CountdownParams, codec):
        t = codec.env_tables

        def fixed(ids, show=True):
            return ids, jnp.broadcast_to(jnp.asarray(show), ids.shape)

        def number(value, width, show=True):
            digits, shown = _digits(value, width)
            return t["countdown_digits"][digits], shown & show

        pieces = [fixed(t["countdown_open"])]
        for k in range(params.max_numbers):
            present = k < state.count
            if k:
                pieces.append(fixed(t["countdown_sep"], present))
            pieces.append(number(state.numbers[k], NUMBER_DIGITS, present))
        pieces += [fixed(t["countdown_target"]), number(state.target, TARGET_DIGITS), fixed(t["countdown_close"])]
        ids = jnp.concatenate([p[0] for p in pieces]).astype(jnp.int32)
        return pack(ids, jnp.concatenate([p[1] for p in pieces]))


COUNTDOWN = Countdown()
