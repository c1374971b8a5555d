"""Train the built-in byte-level BPE tokenizer on the texts this project produces.

    python -m ragen_jax.text.build_tokenizer [--out DIR] [--vocab-size 1024] [--seed 0]

The corpus is generated from templates: system prompts and instructions, Sokoban/FrozenLake
boards (cells separated by single spaces, rows by newlines), turn headers, rewards, warnings,
templated reasoning and answers, Countdown prompts. Pre-tokenization is Qwen2's (the regex
split followed by ByteLevel), so every board cell is its own pre-token exactly as with a real
Qwen2 checkpoint, and the special tokens and chat template follow Qwen2's conventions. The
result (tokenizer.json + tokenizer_config.json) ships in ragen_jax/text/assets and is loaded
through `ragen_jax.models.hf.load_tokenizer`, like any checkpoint's tokenizer.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from ragen_jax.text.prompt import FORMAT_PROMPT, system_message, user_content

ASSETS = Path(__file__).resolve().parent / "assets"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
# Qwen2's pre-tokenization regex (as in its tokenizer.json).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

SOKOBAN_ACTIONS = ["Up", "Down", "Left", "Right"]
FROZENLAKE_ACTIONS = ["Left", "Down", "Right", "Up"]
SOKOBAN_RULES = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to "
    "targets. When you are right next to a box, you can push it by moving in the same "
    "direction. You cannot push a box through a wall, and you cannot pull a box. The answer "
    "should be a sequence of actions, like <answer> Right || Right || Up </answer>.\n"
    "The meaning of each symbol in the state is:\n"
    "#: wall, _: empty, O: target, √: box on target, X: box, P: player, S: player on target"
)
FROZENLAKE_RULES = (
    "You are walking on a frozen lake. You need to reach the goal without falling into a hole. "
    "The ice is slippery, so you may not always move in the direction you intend. The answer "
    "should be a sequence of actions, like <answer> Right || Down </answer>.\n"
    "The meaning of each symbol in the state is:\n"
    "P: player, _: frozen, O: hole, G: goal, X: player in hole, √: player on goal"
)
REWARDS = [-0.1, -0.2, 0.9, 10.9, -1.1, 0.0, 1.0, 0.8, 9.8]
DIRECTION_WORDS = {"Up": "above", "Down": "below", "Left": "to the left of", "Right": "to the right of"}


def sokoban_board(rng: random.Random) -> tuple[str, list[list[str]]]:
    rows, cols = rng.choice([(6, 6), (6, 6), (8, 8), (7, 7), (5, 7)])
    grid = [["#"] * cols for _ in range(rows)]
    for r in range(1, rows - 1):
        for c in range(1, cols - 1):
            grid[r][c] = "#" if rng.random() < 0.15 else "_"
    cells = [(r, c) for r in range(1, rows - 1) for c in range(1, cols - 1)]
    rng.shuffle(cells)
    for symbol in rng.choice([["P", "X", "O"], ["S", "X"], ["P", "√", "X", "O"], ["P", "X", "X", "O", "O"]]):
        r, c = cells.pop()
        grid[r][c] = symbol
    return "\n".join(" ".join(row) for row in grid), grid


def frozenlake_board(rng: random.Random) -> tuple[str, list[list[str]]]:
    n = rng.choice([3, 4, 4, 5, 6, 8])
    grid = [["O" if rng.random() < 0.2 else "_" for _ in range(n)] for _ in range(n)]
    cells = [(r, c) for r in range(n) for c in range(n)]
    rng.shuffle(cells)
    ending = rng.random()
    (pr, pc), (gr, gc) = cells[0], cells[1]
    grid[gr][gc] = "G"
    grid[pr][pc] = "X" if ending < 0.1 else "P"
    if ending > 0.9:
        grid[gr][gc], grid[pr][pc] = "√", "_"
    return "\n".join(" ".join(row) for row in grid), grid


def coordinates(grid, symbols) -> str:
    found = [f"({r}, {c})" for r, row in enumerate(grid) for c, s in enumerate(row) if s in symbols]
    return ", ".join(found) or "none"


def grid_coord(board: str, grid) -> str:
    return (f"Board size: {len(grid)} rows x {len(grid[0])} cols\n"
            f"Targets: {coordinates(grid, 'O√S')}\nBoxes: {coordinates(grid, 'X√')}\n"
            f"Player: {coordinates(grid, 'PS')}\n{board}")


# Extra plain-language sentences so the reasoning vocabulary is not only the few templates.
GENERAL = [
    "Let me think step by step about where everything is.",
    "First I look at the board and find the player, the boxes and the targets.",
    "My plan is to reach the other side of the box and then push it toward the target.",
    "This move would trap the box against the wall, which makes the puzzle unsolvable.",
    "I should avoid corners because a box in a corner can never be moved again.",
    "The shortest path goes along the edge of the room.",
    "After this action the box will be next to the target, so one more push finishes it.",
    "I made a mistake in the previous turn, so now I need to correct my position.",
    "The previous action did not change the state, probably because I walked into a wall.",
    "Both boxes are far from their targets; I will start with the closer one.",
    "The reward was negative, which means the action was not useful.",
    "The reward was positive, so the last push placed a box on a target.",
    "Going around the hole is longer but much safer than walking straight.",
    "Because the surface is slippery, I might slide sideways instead of forward.",
    "The goal is in the bottom right corner, so I mainly need to go down and right.",
    "I can see two possible routes, and the upper route has fewer holes.",
    "I will keep the same strategy as before since it is working well.",
    "Only a few actions are left, so I must choose carefully and finish quickly.",
    "The position of the player changed, and now the box is directly in front of me.",
    "There is enough space behind the box for me to stand and push it.",
    "Check the row and the column of the box before deciding the direction.",
    "To solve this level I need to count the steps between the player and the target.",
    "It is better to move the box horizontally first and vertically afterwards.",
    "Nothing blocks the way, so the direct path should work.",
    "Remember that pulling is impossible, so the player must always be behind the box.",
    "The numbers can be combined with addition, subtraction, multiplication or division.",
    "Multiplying the two largest numbers gives a value close to the target.",
    "The difference between the result and the target is small, so adjust with the last number.",
    "This equation uses every number exactly once and evaluates to the target.",
]


def reasoning(rng: random.Random, game: str) -> str:
    a, b = rng.choice(SOKOBAN_ACTIONS), rng.choice(SOKOBAN_ACTIONS)
    r, c = rng.randrange(8), rng.randrange(8)
    templates = [
        f"The box is {DIRECTION_WORDS[a]} me, push it {a.lower()}.",
        f"The target is {DIRECTION_WORDS[a]} the box. I should move {b.lower()} first, then push {a.lower()}.",
        f"I am at ({r}, {c}). The box is at ({r + 1}, {c}) and the target is at ({r + 2}, {c}).",
        f"There is a wall {DIRECTION_WORDS[a]} me, so I cannot move {a.lower()}. I will go {b.lower()}.",
        f"Moving {a.lower()} brings me closer to the box.",
        "The box is already on the target. I am done.",
        f"I need to go around the box to push it {a.lower()}.",
        f"If I push the box {a.lower()} it gets stuck in the corner, so I move {b.lower()}.",
    ]
    if game == "frozenlake":
        templates = [
            f"The goal is {DIRECTION_WORDS[a]} me. I should move {a.lower()}.",
            f"There is a hole {DIRECTION_WORDS[a]} me, so I avoid moving {a.lower()} and go {b.lower()}.",
            f"I am at ({r}, {c}) and the goal is at ({r + 1}, {c + 2}). Go {a.lower()} then {b.lower()}.",
            "The ice is slippery, so I take the safest path away from the holes.",
            f"Moving {a.lower()} keeps me away from the holes and closer to the goal.",
            "I reached the goal.",
        ]
    if rng.random() < 0.5:
        templates = templates + rng.sample(GENERAL, 2)
    return " ".join(rng.sample(templates, rng.choice([1, 1, 2, 3])))


def answer(rng: random.Random, actions: list[str], budget: int) -> str:
    chosen = [rng.choice(actions) for _ in range(rng.randint(1, budget))]
    if rng.random() < 0.1:
        chosen = [a.lower() for a in chosen]
    sep = rng.choice([" || ", " || ", "||", " ||"])
    think, ans = (" ", " ") if rng.random() < 0.8 else ("", "")
    return (f"<think>{think}{reasoning(rng, 'sokoban' if actions is SOKOBAN_ACTIONS else 'frozenlake')}"
            f"{think}</think> <answer>{ans}{sep.join(chosen)}{ans}</answer>")


def episode(rng: random.Random) -> list[dict]:
    """A multi-turn conversation as the rollout renders it (chat roles, no special tokens)."""
    game = rng.choice(["sokoban", "frozenlake"])
    rules, actions, board_fn = ((SOKOBAN_RULES, SOKOBAN_ACTIONS, sokoban_board) if game == "sokoban"
                                else (FROZENLAKE_RULES, FROZENLAKE_ACTIONS, frozenlake_board))
    budget, total = rng.choice([1, 2, 2, 3]), rng.choice([5, 10, 10, 20])
    messages = [{"role": "system", "content": system_message(rules, actions, budget)}]
    for turn in range(1, rng.randint(2, 5)):
        board, grid = board_fn(rng)
        state = grid_coord(board, grid) if rng.random() < 0.3 else board
        reward, warning = (None, False) if turn == 1 else (rng.choice(REWARDS), rng.random() < 0.2)
        left = max(total - (turn - 1) * budget, 1)
        messages.append({"role": "user", "content": user_content(turn, state, left, reward, warning)})
        messages.append({"role": "assistant", "content": answer(rng, actions, budget)})
    return messages


def countdown(rng: random.Random) -> list[dict]:
    nums = [rng.randint(1, 100) for _ in range(rng.choice([3, 4]))]
    target = rng.randint(10, 999)
    expr = f" {rng.choice('+-*/')} ".join(str(n) for n in nums)
    return [
        {"role": "system", "content": system_message("You are solving the Countdown puzzle.")},
        {"role": "user", "content": f"Using the numbers {nums}, create an equation that equals {target}. "
                                    f"You can use basic arithmetic operations (+, -, *, /) and each number "
                                    f"can only be used once. {FORMAT_PROMPT}"},
        {"role": "assistant", "content": f"<think> {rng.choice(GENERAL[-4:])} Let me try {expr}. </think> "
                                         f"<answer> ({expr}) </answer>"},
    ]


def corpus(num_conversations: int, seed: int):
    """Rendered conversations, chat markup included except the special tokens themselves."""
    rng = random.Random(seed)
    for _ in range(num_conversations):
        messages = countdown(rng) if rng.random() < 0.1 else episode(rng)
        yield "".join(f"{m['role']}\n{m['content']}\n" for m in messages)


def build(vocab_size: int = 1024, seed: int = 0, num_conversations: int = 20000) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(num_conversations, seed), trainer=trainer)
    return tok


def tokenizer_config(model_max_length: int = 4096) -> dict:
    added = {str(i): {"content": t, "lstrip": False, "rstrip": False, "normalized": False,
                      "single_word": False, "special": True} for i, t in enumerate(SPECIAL_TOKENS)}
    return {
        "tokenizer_class": "Qwen2Tokenizer", "added_tokens_decoder": added,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "chat_template": CHAT_TEMPLATE, "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False, "errors": "replace", "split_special_tokens": False,
        "add_prefix_space": False,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ASSETS))
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-conversations", type=int, default=20000)
    args = parser.parse_args(argv)
    if not 512 <= args.vocab_size <= 2048:
        parser.error(f"--vocab-size={args.vocab_size} must be in [512, 2048]")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build(args.vocab_size, args.seed, args.num_conversations)
    if tok.get_vocab_size() != args.vocab_size:
        print(f"warning: the corpus only supports {tok.get_vocab_size()} tokens, not {args.vocab_size}")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2, ensure_ascii=False))
    print(f"wrote {out}/tokenizer.json (vocab {tok.get_vocab_size()}) and tokenizer_config.json")


if __name__ == "__main__":
    main()
