"""The in-batch cross-scoring matrix: log p(z_i | x_j) for every reasoning z_i and prompt x_j.

Naively every pair is a forward over [x_j | z_i]: N·M sequences of |x|+|z| tokens. Here each
prompt is prefilled once into a KV cache, and all M reasoning traces are then scored on top of
that cache (docs/architecture.md#cross-scoring-shares-prefixes): N prefills of |x| tokens plus
N·M·|z| scored tokens. Columns are processed one at a time (`lax.map`), so memory holds one
column's M rows.

Inputs are left-aligned: prompt j is `prompts[j]` where `prompt_mask[j]` (holes allowed, they
are skipped); reasoning i is the first `reasoning_mask[i].sum()` tokens of `reasoning[i]`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ragen_jax.diagnostics.mi import MIEmaState, equivalent_columns, mi_metrics
from ragen_jax.models.cache import DecodeContext, init_cache, positions_from_mask
from ragen_jax.models.decoder import Decoder
from ragen_jax.models.head import token_logprobs
from ragen_jax.models.sampling import prefill


def cross_score(
    model: Decoder,
    prompts: jax.Array,
    prompt_mask: jax.Array,
    reasoning: jax.Array,
    reasoning_mask: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """(L, Ls): f32[M, N] token-mean and token-sum log-likelihoods of reasoning i under prompt j.

    prompts [N, P], reasoning [M, Z]; rows with empty reasoning get 0 (leave them out with the
    `valid` argument of `mi_metrics`).
    """
    num_prompts, prompt_len = prompts.shape
    num_samples, z_len = reasoning.shape
    prompt_mask = prompt_mask.astype(bool)
    reasoning_mask = reasoning_mask.astype(bool)
    cache = init_cache(model.cfg, num_prompts, prompt_len + z_len)
    cache, first_logits = prefill(model, cache, prompts, prompt_mask, 0)
    prompt_tokens = prompt_mask.sum(axis=1).astype(jnp.int32)

    def score_under(j):
        """Log-probs of every reasoning token [M, Z] given prompt j (from its cached prefix)."""
        def rows_of_prompt(a, axis):
            one = jax.lax.dynamic_slice_in_dim(a, j, 1, axis=axis)
            return jnp.broadcast_to(one, a.shape[:axis] + (num_samples,) + a.shape[axis + 1 :])

        column = cache.replace(k=rows_of_prompt(cache.k, 1), v=rows_of_prompt(cache.v, 1), mask=rows_of_prompt(cache.mask, 0))
        positions = positions_from_mask(reasoning_mask, prompt_tokens[j])
        hidden, _ = model(reasoning, positions, reasoning_mask, DecodeContext(column, prompt_len))
        # z_0 is predicted by the prompt's last token; z_t (t >= 1) by the slot before it.
        first = jax.nn.log_softmax(first_logits[j])[reasoning[:, 0]]
        rest = token_logprobs(model, hidden[:, :-1], reasoning[:, 1:])
        return jnp.concatenate([first[:, None], rest], axis=1)

    logprobs = jax.lax.map(score_under, jnp.arange(num_prompts))  # [N, M, Z]
    picked = jnp.where(reasoning_mask[None], logprobs, 0.0)
    sums = picked.sum(axis=-1).T  # [M, N]
    lengths = reasoning_mask.sum(axis=1, keepdims=True).astype(jnp.float32)
    return sums / jnp.maximum(lengths, 1.0), sums


def reasoning_mi(
    model: Decoder,
    prompts: jax.Array,
    prompt_mask: jax.Array,
    reasoning: jax.Array,
    reasoning_mask: jax.Array,
    true_column: jax.Array,
    ema: MIEmaState | None = None,
) -> tuple[dict[str, jax.Array], MIEmaState]:
    """The whole diagnostic for one batch: cross-score, then every MI metric.

    Usable from any training loop: pass the N prompt columns (up to and including `<think>`),
    the M reasoning traces and which column each was sampled from; keep the returned EMA state
    for the next call.
    """
    scores, scores_sum = cross_score(model, prompts, prompt_mask, reasoning, reasoning_mask)
    equivalent = equivalent_columns(prompts, prompt_mask)
    valid = reasoning_mask.any(axis=1)
    return mi_metrics(scores, scores_sum, true_column, equivalent, valid, ema or MIEmaState.create())
