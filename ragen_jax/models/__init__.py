"""Qwen2-family models in Flax NNX, Hugging Face I/O and the KV-cache sampler."""
