"""The answer parser (docs/method.md#parsing-the-answer) on host text, with Python's `re`.

For host-side loops (the RAGEN-style baseline in benchmarks/, checks on decoded text) and as
the plain reference the in-graph `codec.parse_answer` is compared with in tests.
"""

from __future__ import annotations

import re

ANSWER = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)


def parse_answer_text(generated: str, action_names, max_actions: int, prefix: str = "<think>"):
    """(actions 1-based, valid) for one generation read after `prefix`.

    The answer is split on `||`, parts stripped, empty parts dropped, truncated to
    `max_actions`, then matched case-insensitively; no match, no action or an unknown
    action makes the turn invalid (no actions).
    """
    match = ANSWER.search(prefix + generated)
    if not match:
        return [], False
    parts = [p.strip() for p in match.group(2).split("||")]
    parts = [p for p in parts if p][:max_actions]
    lower = [n.lower() for n in action_names]
    if not parts or any(p.lower() not in lower for p in parts):
        return [], False
    return [lower.index(p.lower()) + 1 for p in parts], True
