"""The Qwen2 / Llama decoder family in Flax NNX, Hugging Face and GGUF checkpoint I/O, and the KV-cache sampler."""
