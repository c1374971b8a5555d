"""Cross-scoring cost: prefix-shared (ours) vs naive full-sequence scoring, same values.

    python benchmarks/cross_scoring.py [--models tiny small] [--prompts 8] [--samples 16]

Naive is what RAGEN does: for every column j, one forward over [x_j | z_i] for every
reasoning trace i (N forwards of M sequences of |x| + |z| tokens). Ours prefills each prompt
once and scores all traces on its KV cache. Both are jitted; steady time is the fastest of
`--repeats` calls, compile time is reported apart. The script checks the two matrices agree.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.diagnostics.cross_scoring import cross_score
from ragen_jax.models.cache import positions_from_mask
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import init_model
from ragen_jax.models.head import token_logprobs


def naive_cross_score(model, prompts, prompt_mask, reasoning, reasoning_mask):
    """One full forward per column over the concatenated [x_j | z_i] of all M traces."""
    num_samples, z_len = reasoning.shape
    prompt_len = prompts.shape[1]

    def column(j):
        tokens = jnp.concatenate([jnp.broadcast_to(prompts[j], (num_samples, prompt_len)), reasoning], axis=1)
        mask = jnp.concatenate([jnp.broadcast_to(prompt_mask[j], (num_samples, prompt_len)), reasoning_mask], axis=1)
        hidden, _ = model(tokens, positions_from_mask(mask), mask)
        logprobs = token_logprobs(model, hidden[:, prompt_len - 1 : -1], reasoning)
        return jnp.where(reasoning_mask, logprobs, 0.0).sum(axis=1)

    sums = jax.lax.map(column, jnp.arange(prompts.shape[0])).T
    return sums / jnp.maximum(reasoning_mask.sum(axis=1, keepdims=True), 1), sums


def timed(fn, repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - start)
    return first - best, best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "small"])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=16, help="reasoning traces per prompt")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--reasoning-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n, m = args.prompts, args.prompts * args.samples
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(3, 1000, (n, args.prompt_len)))
    prompt_mask = jnp.ones((n, args.prompt_len), bool)
    reasoning = jnp.asarray(rng.integers(3, 1000, (m, args.reasoning_len)))
    lengths = rng.integers(args.reasoning_len // 2, args.reasoning_len + 1, m)
    reasoning_mask = jnp.asarray(np.arange(args.reasoning_len)[None] < lengths[:, None])
    print(
        f"# cross-scoring {n} prompts x {m} traces, |x|={args.prompt_len}, |z|<={args.reasoning_len}; "
        f"jax {jax.__version__} on {jax.devices()[0].platform}"
    )
    for name in args.models:
        model = init_model(DecoderConfig.preset(name), jax.random.key(0))
        inputs = (model, prompts, prompt_mask, reasoning, reasoning_mask)
        ours, naive = jax.jit(cross_score), jax.jit(naive_cross_score)
        ours_compile, ours_time = timed(lambda: ours(*inputs), args.repeats)
        naive_compile, naive_time = timed(lambda: naive(*inputs), args.repeats)
        difference = float(jnp.max(jnp.abs(ours(*inputs)[0] - naive(*inputs)[0])))
        print(
            f"{name:6s} prefix-shared {ours_time:7.3f}s  naive {naive_time:7.3f}s  ratio {naive_time / ours_time:5.2f}x  "
            f"(compile {ours_compile:.1f}s / {naive_compile:.1f}s, max |L difference| {difference:.1e})"
        )


if __name__ == "__main__":
    main()
