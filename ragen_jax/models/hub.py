"""`model.path` as a Hugging Face Hub id, e.g. `Qwen/Qwen2.5-0.5B-Instruct`.

An `org/name` string that is not an existing local path is fetched with huggingface_hub into
the user's Hub cache, only the files the loaders read (config, generation config, tokenizer,
safetensors weights), and its snapshot directory is then loaded like any local checkpoint.
The first run downloads; later runs, and offline ones (HF_HUB_OFFLINE=1 or no network), read
the cache. Everything else is a local path and is returned as it is.
"""

from __future__ import annotations

import os
import re

# two segments of letters, digits, "-", "_" and "."; neither starts with "." (./x, ../x are paths)
_HUB_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*/[A-Za-z0-9_-][A-Za-z0-9_.-]*")

# what hf.open_checkpoint, hf.load_pretrained and hf.load_tokenizer read from a directory
FILES = [
    "config.json", "generation_config.json",
    "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
    "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json",
    "model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors",
]


def is_hub_id(path: str) -> bool:
    """Whether `path` is shaped like a Hub model id (`org/name`; a `.gguf` name is a file)."""
    return bool(_HUB_ID.fullmatch(path)) and not path.lower().endswith(".gguf")


def resolve(path: str | os.PathLike) -> str | os.PathLike:
    """The local snapshot directory of the Hub model `path` names (downloading what is missing),
    or `path` unchanged when it exists locally, is not a string, or is not shaped like `org/name`.
    Raises a one-line FileNotFoundError naming the id when it cannot be had (not cached and
    no Hub, no such model) and OSError for other answers of the Hub."""
    if not isinstance(path, str) or os.path.exists(path) or not is_hub_id(path):
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    cache, offline = cache_dir(), offline_mode()
    try:
        return snapshot_download(path, allow_patterns=FILES, cache_dir=cache, local_files_only=offline)
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached"
        raise FileNotFoundError(f"Hub model {path} is not (fully) in the Hugging Face cache ({cache}) and {why}; "
                                f"fetch it into that cache where the Hub can be reached: hf download {path}, "
                                "or set model.path to a local directory") from None
    except GatedRepoError:
        raise FileNotFoundError(f"Hub model {path} is gated: accept its terms on huggingface.co and log in "
                                "(hf auth login), or set model.path to a local directory") from None
    except RepositoryNotFoundError:
        raise FileNotFoundError(f"{path} is neither a local path nor a model on the Hugging Face Hub "
                                "(a private one needs hf auth login)") from None
    except HfHubHTTPError as err:
        raise OSError(f"Hub model {path}: {str(err).splitlines()[0]}") from None


def cache_dir() -> str:
    """The Hub cache the environment names now (huggingface_hub reads it once, when imported)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def offline_mode() -> bool:
    """Whether HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set now, as huggingface_hub reads it."""
    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    if flag is None:
        from huggingface_hub import constants

        return constants.HF_HUB_OFFLINE
    return flag.strip().upper() in {"1", "ON", "YES", "TRUE"}
