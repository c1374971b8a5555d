"""Rotary position embeddings as transformers computes them: the inverse frequencies of each RoPE
type (default, linear, yarn, llama3), the cos/sin tables of integer positions, and the
rotate-half rotation of queries and keys."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.models.config import DecoderConfig


def rope_frequencies(cfg: DecoderConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies [head_dim/2] and the cos/sin scale, as transformers computes them."""
    dim, base = cfg.head_dim, cfg.rope_theta
    extra = dict(cfg.rope_scaling)
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    inv_freq = inv_freq.astype(np.float32)
    if cfg.rope_type == "default":
        return inv_freq, 1.0
    factor = float(extra["factor"]) if extra.get("factor") is not None else None
    if cfg.rope_type == "linear":
        return (inv_freq / np.float32(factor)).astype(np.float32), 1.0
    if cfg.rope_type == "llama3":
        # Llama 3.1: wavelengths past orig / low_freq_factor divided by factor, those below
        # orig / high_freq_factor kept, a linear blend between
        orig = np.float32(extra.get("original_max_position_embeddings") or cfg.max_position_embeddings)
        low, high = np.float32(extra["low_freq_factor"]), np.float32(extra["high_freq_factor"])
        factor = np.float32(factor)
        wavelen = np.float32(2 * math.pi) / inv_freq
        scaled = np.where(wavelen > orig / low, inv_freq / factor, inv_freq)
        smooth = (orig / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= orig / high) & (wavelen <= orig / low)
        return np.where(medium, smoothed, scaled).astype(np.float32), 1.0
    # yarn: blend interpolated and extrapolated frequencies with a linear ramp.
    orig = extra.get("original_max_position_embeddings") or cfg.max_position_embeddings
    if factor is None:
        factor = cfg.max_position_embeddings / orig

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = extra.get("attention_factor")
    if attn is None:
        m, m_all = extra.get("mscale"), extra.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if (m and m_all) else mscale(factor)
    beta_fast, beta_slow = extra.get("beta_fast") or 32, extra.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if extra.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = 1.0 - ramp
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv.astype(np.float32), float(attn)


def rope_tables(cfg: DecoderConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos/sin tables [B, T, head_dim] in f32 for integer positions [B, T]."""
    inv_freq, scale = rope_frequencies(cfg)
    freqs = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * scale, jnp.sin(emb) * scale


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate-half RoPE on x [B, T, heads, head_dim]."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos, sin = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin
