"""The documentation's links, references and commands point at things that exist.

Plain file reading only (no jax import), so this runs in well under a second.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Written in two pieces so that this file does not contain what it looks for.
FORBIDDEN = ("SPEC" + " §", "DESIGN" + " decision")
# `python -m` modules that are not this package's (installed tools named in the README).
OTHER_MODULES = {"pytest", "pip"}
SOURCE_FOLDERS = ("ragen_jax", "tests", "configs", "benchmarks", "docs", "notebooks")

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def code_blocks(text: str) -> list[str]:
    """The contents of the fenced code blocks."""
    blocks, current = [], None
    for line in text.splitlines():
        if FENCE.match(line):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: the rendered text (links reduced to their text, code marks
    and emphasis dropped), lower-cased, every character other than a letter, digit, space, '-'
    or '_' removed, then each space turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, repeated headings numbered as GitHub does."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = github_anchor(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def relative_links(path: Path) -> list[str]:
    """Link targets in a Markdown file that are not URLs (images included)."""
    targets = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        for match in LINK.finditer(INLINE_CODE.sub("``", line)):
            target = match.group(1)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                targets.append(target)
    return targets


def test_anchor_rule():
    assert github_anchor("The reward-variance filter") == "the-reward-variance-filter"
    assert github_anchor("Scale-out (`distributed.py`, `plan.py`)") == "scale-out-distributedpy-planpy"
    assert github_anchor("Real sizes — `python -m ragen_jax.plan`") == "real-sizes--python--m-ragen_jaxplan"
    assert github_anchor("Rewards, format penalty and episode end") == "rewards-format-penalty-and-episode-end"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    broken = []
    for target in relative_links(doc):
        file_part, _, anchor = target.partition("#")
        destination = (doc.parent / file_part).resolve() if file_part else doc
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def project_files() -> list[Path]:
    """The repository's Python and Markdown files (not virtual environments or caches in it)."""
    paths = [p for p in ROOT.iterdir() if p.is_file()]
    for folder in SOURCE_FOLDERS:
        paths += (ROOT / folder).rglob("*")
    return sorted(p for p in paths if p.suffix in (".py", ".md") and "__pycache__" not in p.parts)


def test_no_references_to_unpublished_documents():
    found = []
    for path in project_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if any(word in line for word in FORBIDDEN):
                found.append(f"{path.relative_to(ROOT)}:{number}")
    assert not found, "references to documents outside the repository: " + ", ".join(found)


def readme_commands() -> list[list[str]]:
    """The shell commands of README.md's code blocks (continuation lines joined, comments
    dropped), each split into words, one command per `&&` / `;` / `|` segment."""
    commands = []
    for block in code_blocks((ROOT / "README.md").read_text(encoding="utf-8")):
        for line in block.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:  # not shell (Python code in a block)
                continue
            segment = []
            for word in words + ["&&"]:
                if word in ("&&", "||", ";", "|"):
                    if segment:
                        commands.append(segment)
                    segment = []
                else:
                    segment.append(word)
    return commands


def python_targets() -> list[tuple[str, str]]:
    """("-m", module) and ("file", path) for every `python ...` command in the README."""
    targets = []
    for words in readme_commands():
        for i, word in enumerate(words):
            if not re.fullmatch(r"(\S*/)?python3?", word) or i + 1 >= len(words):
                continue
            if words[i + 1] == "-m" and i + 2 < len(words):
                targets.append(("-m", words[i + 2]))
            elif words[i + 1].endswith(".py"):
                targets.append(("file", words[i + 1]))
            break
    return targets


def test_readme_commands_name_existing_modules_and_files():
    targets = python_targets()
    assert ("-m", "ragen_jax.train") in targets  # the parser found the quickstart
    missing = []
    for kind, name in targets:
        if kind == "file":
            if not (ROOT / name).is_file():
                missing.append(f"python {name}")
        elif name.split(".")[0] == "ragen_jax":
            base = ROOT.joinpath(*name.split("."))
            if not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
                missing.append(f"python -m {name}")
        elif name not in OTHER_MODULES:
            missing.append(f"python -m {name} (not a ragen_jax module)")
    assert not missing, "README commands name what does not exist: " + ", ".join(missing)
