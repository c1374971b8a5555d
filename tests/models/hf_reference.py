"""Reference models and logits from transformers, shared by the model tests."""

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

VOCAB = 211


def make_hf_model(tie: bool, rope: dict | None = None, seed: int = 0, **shape) -> Qwen2ForCausalLM:
    """A random Qwen2ForCausalLM with non-zero biases and a weight scale large enough that
    greedy decoding has clear argmax margins."""
    torch.manual_seed(seed)
    fields = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie,
                  initializer_range=0.08, pad_token_id=0, eos_token_id=None,
                  rope_parameters=rope or {"rope_type": "default", "rope_theta": 10000.0})
    fields.update(shape)
    model = Qwen2ForCausalLM(Qwen2Config(**fields)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
            if "layernorm" in name or name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def make_hf_llama(tie: bool, rope: dict | None = None, seed: int = 0, **shape) -> LlamaForCausalLM:
    """A random LlamaForCausalLM (no biases) with the same shapes and weight scale as
    `make_hf_model`'s Qwen2: clear argmax margins for greedy decoding."""
    torch.manual_seed(seed)
    fields = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie,
                  initializer_range=0.08, pad_token_id=0, bos_token_id=None, eos_token_id=None,
                  rms_norm_eps=1e-5, rope_parameters=rope or {"rope_type": "default", "rope_theta": 10000.0})
    fields.update(shape)
    model = LlamaForCausalLM(LlamaConfig(**fields)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name or name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def hf_logits(model, ids, mask, positions=None):
    with torch.no_grad():
        kwargs = dict(input_ids=torch.as_tensor(np.asarray(ids), dtype=torch.long),
                      attention_mask=torch.as_tensor(np.asarray(mask), dtype=torch.long))
        if positions is not None:
            kwargs["position_ids"] = torch.as_tensor(np.asarray(positions), dtype=torch.long)
        return model(**kwargs).logits.float().numpy()


def long_batch(length=301):
    """Two rows longer than a query block, padding at both ends and a hole inside."""
    rng = np.random.default_rng(2)
    ids = rng.integers(1, VOCAB, size=(2, length)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    mask[0, length - 30:] = False
    mask[1, :17] = False
    mask[1, 140:150] = False
    return ids, mask
