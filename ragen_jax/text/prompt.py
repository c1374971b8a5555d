"""The prompt (docs/method.md#the-prompt) as host-side text, and as token ids a jitted rollout
assembles turns from.

A trajectory's buffer is [system | turn 1 obs | turn 1 gen | turn 2 obs | ...]
(docs/architecture.md#static-shapes-slots-with-holes). `PromptTemplate.system_text()` is the
system segment (the chat-wrapped system message, up to where the first user content starts);
`observation_text(turn, ...)` is a turn's observation segment: the end of the previous
assistant message and the start of the user message (turns > 1), `Reward:\\n{r}\\n` and the
warning line (turns > 1), the user content, then the generation prompt and the `<think>`
prefix. The text of the whole conversation is the tokenizer's chat template over those
messages plus `<think>`, when the template renders past assistant messages verbatim. Some do
not (Qwen3's drops the `<think>...</think>` of earlier turns): the buffer still keeps every
generation as it was sampled after the `<think>` prefix, so from turn 2 on it differs from such
a template's rendering by that prefix and reasoning; `ChatPieces.verbatim_history` says which
kind a template is.

The observation of a later turn starts by closing the assistant message (Decoder:
`<|im_end|>`). When the generation already ended with that token (decode stops on eos), pass
`closed=True` and it is not repeated; `end_of_message_id` is that token (-1 without one).

In JAX, `observation_ids` builds a turn's ids from precomputed pieces:

    [user_open | "Reward:\\n" | reward chars | "\\n" | warning | "Turn " | turn digits |
     ":\\nState:\\n" | board (render_observation, with its final "\\n") | "You have " |
     digits | " actions left. ... <think>"]

The pieces' ids concatenate to `tokenizer.encode(observation_text(...))` exactly when no
token spans a split point. Every character of a number is one token: Qwen2's regex makes each
digit its own pre-token; GPT-2's (SmolLM2's) keeps " 10" together, but such vocabularies hold
no token mixing a digit with anything else. The board starts after "State:\\n" and keeps its
final newline, which a punctuation cell swallows under Qwen2's regex (` #\\n` is one pre-token),
so the suffix starts at "You have". `build` encodes the pieces in context for every character a
number can place next to each of its possible neighbours, and the env's sample states, and
refuses a tokenizer that merges across a split point.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ragen_jax.text.codec import THINK_PREFIX, TextCodec, pack, render_observation
from ragen_jax.text.interface import GameText

FORMAT_PROMPT = ("Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer> "
                 "with no extra text. Strictly follow this format.")
INVALID_WARNING = "Your previous response was invalid. No valid action was found in your answer."
ACTION_SEP = "||"
INT_DIGITS = 4  # turn numbers and actions left render up to 9999
REWARD_DIGITS = 6  # a reward's integer part renders up to 999999
CHARS = "0123456789-."  # every character a rendered number uses


def system_content(env: GameText, max_actions_per_turn: int) -> str:
    """The system message: greeting, the env's rules, its actions, the budget and separator
    (the last three only for envs whose answers name actions)."""
    actions = env.action_names if env.answer_kind == "actions" else None
    return system_message(env.instructions(), actions, max_actions_per_turn)


def system_message(instructions: str, action_names=None, max_actions_per_turn: int = 1) -> str:
    """The system message's text for a game's `instructions` and, when its answers name
    actions, `action_names` (None for a game answered in text)."""
    if action_names is None:
        return f"You're a helpful assistant. {instructions}"
    return (f"You're a helpful assistant. {instructions}\nYour available actions are:\n"
            f"{', '.join(action_names)}\nYou can make up to {max_actions_per_turn} actions per "
            f"turn, separated by the action separator \" {ACTION_SEP} \"")


def format_reward(reward) -> str:
    """A reward as the prompt shows it: float32, rounded to 0.01, no trailing zeros ("-0.1", "1").

    This is what the in-graph renderer can produce digit by digit (it sees float32 rewards).
    """
    hundredths = int(np.round(np.float32(reward) * np.float32(100)))
    if not abs(hundredths) < 10 ** (REWARD_DIGITS + 2):
        raise ValueError(f"reward={reward} is out of range: |reward| must be < {10 ** REWARD_DIGITS}")
    whole, frac = divmod(abs(hundredths), 100)
    text = f"{'-' if hundredths < 0 else ''}{whole}"
    return text + f".{frac:02d}".rstrip("0") if frac else text


def _check_int(name: str, value: int, low: int) -> None:
    if not low <= value < 10 ** INT_DIGITS:
        raise ValueError(f"{name}={value} must be in [{low}, {10 ** INT_DIGITS - 1}]")


def user_content(turn: int, state: str, actions_left: int, reward=None, warning: bool = False) -> str:
    """Turn `turn`'s user message; turns after the first report the previous turn's reward and,
    after a turn without a valid action, the warning line."""
    _check_int("turn", turn, 1)
    _check_int("actions_left", actions_left, 0)
    if (turn == 1) != (reward is None):
        raise ValueError(f"reward={reward!r} for turn {turn}: the first turn has none, later turns need one")
    if warning and turn == 1:
        raise ValueError("warning=True for turn 1: the warning follows an invalid turn")
    head = "" if reward is None else f"Reward:\n{format_reward(reward)}\n"
    if warning:
        head += INVALID_WARNING + "\n"
    return (f"{head}Turn {turn}:\nState:\n{state}\nYou have {actions_left} actions left. "
            f"{FORMAT_PROMPT}")


@dataclasses.dataclass(frozen=True)
class ChatPieces:
    """The chat template's text around message contents (plain newlines without a template)."""

    system_open: str = ""  # before the system content
    first_user_open: str = "\n"  # between the system content and the first user content
    generation_open: str = "\n"  # after a user content, where the assistant starts writing
    user_open: str = "\n"  # after an assistant content, up to the next user content
    # Whether the template renders a past assistant message verbatim, `<think>...</think>`
    # included (see the module docstring; Qwen3's drops the reasoning).
    verbatim_history: bool = True

    @classmethod
    def from_tokenizer(cls, tokenizer) -> ChatPieces:
        """Cut the template's rendering of a marked-up conversation at the markers."""
        if not getattr(tokenizer, "chat_template", None):
            return cls()
        marks = ["@@SYSTEM@@", "@@USER1@@", "@@ASSISTANT1@@", "@@USER2@@"]
        roles = ["system", "user", "assistant", "user"]
        text = tokenizer.apply_chat_template([{"role": r, "content": m} for r, m in zip(roles, marks)],
                                             tokenize=False, add_generation_prompt=True)
        pieces, rest = [], text
        for mark in marks:
            if rest.count(mark) != 1:
                raise ValueError(f"chat template does not render message content {mark!r} verbatim once")
            before, rest = rest.split(mark)
            pieces.append(before)
        system_open, first_user_open, generation_open, user_open = pieces
        if rest != generation_open:
            raise ValueError(f"chat template opens the generation with {rest!r} but past assistant "
                             f"messages with {generation_open!r}; the rollout needs them equal")
        answer = f"{THINK_PREFIX}@@REASONING@@</think> <answer>@@ANSWER@@</answer>"
        history = [{"role": r, "content": answer if r == "assistant" else m} for r, m in zip(roles, marks)]
        verbatim = answer in tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
        return cls(system_open, first_user_open, generation_open, user_open, verbatim)


@struct.dataclass
class PromptTemplate:
    """Token ids of the fixed prompt pieces (a pytree) plus the host-side text functions."""

    system_ids: jax.Array  # int32[S]: the whole system segment
    user_open: jax.Array  # closes the previous assistant message, opens the user's (turns > 1)
    reward_open: jax.Array  # "Reward:\n"
    reward_close: jax.Array  # "\n"
    warning: jax.Array  # INVALID_WARNING + "\n"
    turn_open: jax.Array  # "Turn "
    state_open: jax.Array  # ":\nState:\n"
    left_open: jax.Array  # "You have "
    turn_close: jax.Array  # " actions left. " + FORMAT_PROMPT + generation prompt + "<think>"
    char_ids: jax.Array  # int32[len(CHARS)]: the one token of each number character
    chat: ChatPieces = struct.field(pytree_node=False, default=ChatPieces())
    end_of_message_id: int = struct.field(pytree_node=False, default=-1)  # special token user_open starts with
    end_of_message: str = struct.field(pytree_node=False, default="")  # its text
    system: str = struct.field(pytree_node=False, default="")  # the system message content

    @classmethod
    def build(cls, tokenizer, env: GameText, max_actions_per_turn: int) -> PromptTemplate:
        chat = ChatPieces.from_tokenizer(tokenizer)

        def encode(text):
            return list(tokenizer.encode(text, add_special_tokens=False))

        char_ids = [encode(c) for c in CHARS]
        for c, ids in zip(CHARS, char_ids):
            if len(ids) != 1:
                raise ValueError(f"the tokenizer encodes {c!r} as {len(ids)} tokens; numbers are rendered "
                                 f"one token per character")
        system = system_content(env, max_actions_per_turn)
        texts = _fixed_texts(chat)
        first = encode(chat.user_open)[:1]
        end_id = first[0] if first and first[0] in set(tokenizer.all_special_ids) else -1
        prompt = cls(**{name: jnp.asarray(encode(text), jnp.int32) for name, text in texts.items()},
                     system_ids=jnp.asarray(encode(chat.system_open + system + chat.first_user_open), jnp.int32),
                     char_ids=jnp.asarray([ids[0] for ids in char_ids], jnp.int32), chat=chat, system=system,
                     end_of_message_id=end_id, end_of_message=tokenizer.decode(first) if end_id >= 0 else "")
        def encode_batch(texts):
            return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]

        prompt._check_boundaries(encode_batch, env.boundary_samples())
        return prompt

    # ------------------------------------------------------------------ host-side text

    def system_text(self) -> str:
        return self.chat.system_open + self.system + self.chat.first_user_open

    def observation_text(self, turn: int, state: str, actions_left: int, reward=None,
                         warning: bool = False, closed: bool = False) -> str:
        """The text of turn `turn`'s observation segment (see the module docstring)."""
        text = "".join(self._segments(turn, state + "\n", actions_left, reward, warning))
        if closed and turn > 1 and self.end_of_message:
            return text[len(self.end_of_message):]
        return text

    def _segments(self, turn, board, actions_left, reward, warning) -> list[str]:
        """The observation's text in the pieces `observation_ids` concatenates (numbers per
        character, `board` with its final newline); joined, it is `observation_text`."""
        user_content(turn, "", actions_left, reward, warning)  # validates the arguments
        fixed = _fixed_texts(self.chat)
        head = []
        if turn > 1:
            head = [fixed["user_open"], fixed["reward_open"], *format_reward(reward), fixed["reward_close"]]
            head += [fixed["warning"]] if warning else []
        return [*head, fixed["turn_open"], *str(turn), fixed["state_open"], board,
                fixed["left_open"], *str(actions_left), fixed["turn_close"]]

    def _check_boundaries(self, encode_batch, states) -> None:
        """Every split point of `_segments` must be a token boundary: for the env's sample state
        texts (e.g. every symbol at the board's start and end), and for every character a number
        can put next to each neighbour it can have (each digit after "Turn ", "You have ",
        "Reward:\\n", "-" and "."; before ":", " actions", "." and "\\n"; every digit pair).
        `encode_batch` encodes a list of texts (one tokenizer call for the few hundred cases)."""
        cases = [(turn, state, left, reward, warning) for state in states
                 for turn, left, reward, warning in [(1, 0, None, False), (12, 10, -10.25, True),
                                                     (3, 7, 0.9, False), (2, 1234, 1, True)]]
        rewards = [float(f"{sign}{d}.{d}{(d + 1) % 10 or 1}") for d in range(10) for sign in ("", "-")]
        cases += [(turn, states[0], 5, None if turn == 1 else 0.5, False)
                  for turn in range(1, 110)]  # 1-9 first, every pair "ab" (10..99) and "0b" (100..109)
        cases += [(2, states[0], left, 0.5, False) for left in range(110)]
        cases += [(2, states[0], 5, reward, warning) for reward in [*rewards, 10, -10] for warning in (False, True)]
        split = [self._segments(turn, state + "\n", left, reward, warning)
                 for turn, state, left, reward, warning in cases]
        pieces = sorted({p for segments in split for p in segments})
        piece_ids = dict(zip(pieces, encode_batch(pieces)))
        for segments, ids in zip(split, encode_batch(["".join(segments) for segments in split])):
            if ids != [i for p in segments for i in piece_ids[p]]:
                raise ValueError(f"the tokenizer merges tokens across the prompt pieces of {''.join(segments)!r}")

    def observation_capacity(self, codec: TextCodec, rows: int, cols: int) -> int:
        """Static length of `observation_ids`' output for a rows x cols board."""
        fixed = sum(getattr(self, name).shape[0] for name in _fixed_texts(self.chat))
        return fixed + 2 * INT_DIGITS + REWARD_DIGITS + 4 + codec.observation_capacity(rows, cols)


def _fixed_texts(chat: ChatPieces) -> dict[str, str]:
    return {
        "user_open": chat.user_open, "reward_open": "Reward:\n", "reward_close": "\n",
        "warning": INVALID_WARNING + "\n", "turn_open": "Turn ", "state_open": ":\nState:\n",
        "left_open": "You have ",
        "turn_close": f" actions left. {FORMAT_PROMPT}{chat.generation_open}{THINK_PREFIX}",
    }


# ----------------------------------------------------------------------------- in JAX


def _integer_chars(value, width: int):
    """Character indices (into CHARS) of a non-negative integer, right-aligned in `width`
    slots, and which slots hold a digit. Values are clipped to [0, 10**width - 1]."""
    value = jnp.clip(jnp.asarray(value, jnp.int32), 0, 10 ** width - 1)
    powers = jnp.asarray([10 ** (width - 1 - j) for j in range(width)], jnp.int32)
    num_digits = 1 + sum((value >= 10 ** k).astype(jnp.int32) for k in range(1, width))
    return (value // powers) % 10, jnp.arange(width) >= width - num_digits


def _reward_chars(reward):
    """`format_reward` in JAX: sign, integer digits, "." and up to two decimals, as slots."""
    limit = 10 ** REWARD_DIGITS - 0.01
    hundredths = jnp.round(jnp.clip(jnp.asarray(reward, jnp.float32), -limit, limit) * 100).astype(jnp.int32)
    magnitude = jnp.abs(hundredths)
    whole, frac = magnitude // 100, magnitude % 100
    digits, shown = _integer_chars(whole, REWARD_DIGITS)
    minus, dot = CHARS.index("-"), CHARS.index(".")
    chars = jnp.concatenate([jnp.array([minus]), digits, jnp.array([dot]), jnp.stack([frac // 10, frac % 10])])
    valid = jnp.concatenate([jnp.stack([hundredths < 0]), shown,
                             jnp.stack([frac > 0, frac > 0, frac % 10 > 0])])
    return chars, valid


def observation_ids(prompt: PromptTemplate, codec: TextCodec, grid: jax.Array, turn, actions_left,
                    reward, warning, closed=False):
    """Token ids of a turn's observation: (ids int32[capacity], mask), valid ids first.

    Equals `tokenizer.encode(prompt.observation_text(turn, board_text, actions_left, reward,
    warning, closed))` where board_text is the grid's `render_grid` text. turn, actions_left
    (int32), reward (float32), warning and closed (bool) may be traced; reward, warning and
    closed are ignored on turn 1. Out-of-range numbers are clipped (the host-side text raises instead).
    """
    return turn_ids(prompt, render_observation(codec, grid, final_newline=True), turn, actions_left, reward,
                    warning, closed)


def turn_ids(prompt: PromptTemplate, state, turn, actions_left, reward, warning, closed=False):
    """`observation_ids` with the state given as token ids: state = (ids, mask) of the state
    text followed by its newline (`Environment.state_tokens`), valid ids first."""
    later = jnp.asarray(turn) > 1
    skip_end = jnp.asarray(closed, bool) & (prompt.end_of_message_id >= 0)
    user_open = later & ~(skip_end & (jnp.arange(prompt.user_open.shape[0]) == 0))

    def fixed(ids, show=True):
        return ids, jnp.broadcast_to(show, ids.shape)

    def number(chars, valid, show=True):
        return prompt.char_ids[chars], valid & show

    board = state
    pieces = [
        fixed(prompt.user_open, user_open), fixed(prompt.reward_open, later),
        number(*_reward_chars(reward), later), fixed(prompt.reward_close, later),
        fixed(prompt.warning, later & jnp.asarray(warning, bool)),
        fixed(prompt.turn_open), number(*_integer_chars(turn, INT_DIGITS)), fixed(prompt.state_open),
        board, fixed(prompt.left_open), number(*_integer_chars(actions_left, INT_DIGITS)),
        fixed(prompt.turn_close),
    ]
    ids = jnp.concatenate([p[0] for p in pieces]).astype(jnp.int32)
    return pack(ids, jnp.concatenate([p[1] for p in pieces]))
