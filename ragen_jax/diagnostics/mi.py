"""Mutual-information proxies from the in-batch cross-scoring matrix
(docs/method.md#the-mi-diagnostics).

Given reasoning samples z_i and prompt columns x_j, `L[i, j]` is the token-mean
log-likelihood of z_i under x_j (`Ls` the token sum) and `c(i)` is the column z_i was sampled
from. If the reasoning depends on its input, z_i is much more likely under its own prompt
than under the others: `matched − marginal` estimates I(X; Z) (at most log N), and
retrieving the true column from a row is above chance. When the agent's reasoning collapses
into an input-agnostic template, every column scores a row alike: MI → 0, retrieval → chance.

Exact rules (docs/method.md#mi-estimates-retrieval-and-entropies): std(marginal) is the
population std; an EMA (decay 0.9, initialised to the first value) of it blends the current
value in before use, with separate states for the token-mean and token-sum versions;
retrieval ties go to the lower column; columns with identical prompt tokens are equivalent;
samples with empty reasoning are left out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

EMA_DECAY = 0.9
ZSCORE_EPS = 1e-3
RETRIEVAL_KS = (1, 2, 4, 8)


@struct.dataclass
class MIEmaState:
    """Running std(marginal) for `mi_zscore_ema` (token-mean) and `mi_zscore_ema_seq` (sum)."""

    std_marginal: jax.Array
    std_marginal_seq: jax.Array
    initialised: jax.Array

    @classmethod
    def create(cls) -> "MIEmaState":
        return cls(jnp.float32(0.0), jnp.float32(0.0), jnp.bool_(False))


def equivalent_columns(prompts: jax.Array, prompt_mask: jax.Array) -> jax.Array:
    """bool[N, N]: columns whose prompts are the same token sequence (same ids where valid)."""
    ids = jnp.where(prompt_mask, prompts, -1)
    return jnp.all(ids[:, None, :] == ids[None, :, :], axis=-1)


def _column_ranks(scores: jax.Array) -> jax.Array:
    """int[M, N]: rank of each column in its row, best first, ties to the lower column."""
    n = scores.shape[1]
    index = jnp.arange(n)
    better = scores[:, None, :] > scores[:, :, None]
    tied_before = (scores[:, None, :] == scores[:, :, None]) & (index[None, None, :] < index[None, :, None])
    return jnp.sum(better | tied_before, axis=-1)


def _masked_mean(x, valid, count):
    return jnp.sum(jnp.where(valid, x, 0.0)) / jnp.maximum(count, 1.0)


def _masked_std(x, valid, count):
    mean = _masked_mean(x, valid, count)
    return jnp.sqrt(_masked_mean(jnp.square(x - mean), valid, count))


def mi_metrics(
    scores: jax.Array,
    scores_sum: jax.Array,
    true_column: jax.Array,
    equivalent: jax.Array,
    valid: jax.Array,
    ema: MIEmaState,
) -> tuple[dict[str, jax.Array], MIEmaState]:
    """All the matrix metrics of docs/method.md#mi-estimates-retrieval-and-entropies.

    scores, scores_sum: f32[M, N] (L and Ls); true_column: int[M]; equivalent: bool[N, N];
    valid: bool[M] (non-empty reasoning). Returns (metrics, updated EMA state); with no valid
    sample every metric is 0 and the EMA is left as it was.
    """
    m, n = scores.shape
    valid = valid.astype(bool)
    count = valid.sum().astype(jnp.float32)
    any_valid = count > 0
    log_n = jnp.log(jnp.float32(n))

    def matched_marginal(s):
        s = s.astype(jnp.float32)
        matched = jnp.take_along_axis(s, true_column[:, None], axis=1)[:, 0]
        marginal = jax.nn.logsumexp(s, axis=1) - log_n
        return matched, marginal

    matched, marginal = matched_marginal(scores)
    matched_seq, marginal_seq = matched_marginal(scores_sum)
    gap, gap_seq = matched - marginal, matched_seq - marginal_seq
    std, std_seq = _masked_std(marginal, valid, count), _masked_std(marginal_seq, valid, count)

    def blend(old, new):
        return jnp.where(ema.initialised, EMA_DECAY * old + (1.0 - EMA_DECAY) * new, new)

    new_ema = MIEmaState(
        std_marginal=jnp.where(any_valid, blend(ema.std_marginal, std), ema.std_marginal),
        std_marginal_seq=jnp.where(any_valid, blend(ema.std_marginal_seq, std_seq), ema.std_marginal_seq),
        initialised=ema.initialised | any_valid,
    )

    def mean(x):
        return _masked_mean(x, valid, count)

    metrics = {
        "mi_estimate": mean(gap),
        "mi_seq_estimate": mean(gap_seq),
        "conditional_entropy_est": -mean(matched),
        "reasoning_entropy_est": -mean(marginal),
        "mi_zscore": mean(gap / (std + ZSCORE_EPS)),
        "mi_zscore_seq": mean(gap_seq / (std_seq + ZSCORE_EPS)),
        "mi_zscore_ema": mean(gap / (new_ema.std_marginal + ZSCORE_EPS)),
        "mi_zscore_ema_seq": mean(gap_seq / (new_ema.std_marginal_seq + ZSCORE_EPS)),
        "valid_thinking_rate": count / m,
    }

    # Retrieval: is one of the k best columns equivalent to the true one?
    ranks = _column_ranks(scores.astype(jnp.float32))
    is_true = equivalent[true_column]  # [M, N]: columns equivalent to each row's own
    chance = mean(is_true.sum(axis=1) / n)
    for k in RETRIEVAL_KS:
        hit = jnp.any(is_true & (ranks < k), axis=1).astype(jnp.float32)
        suffix = "" if k == 1 else f"@{k}"
        metrics[f"retrieval_acc{suffix}"] = mean(hit)
        metrics[f"retrieval_chance{suffix}"] = jnp.where(any_valid, jnp.minimum(1.0, chance * k), 0.0)
    metrics["retrieval_above_chance"] = metrics["retrieval_acc"] - metrics["retrieval_chance"]
    return metrics, new_ema


def reasoning_stats(token_entropy: jax.Array, reasoning_mask: jax.Array) -> dict[str, jax.Array]:
    """Token-level policy entropy of the reasoning tokens and mean reasoning length (tokens),
    over samples [M, T]; a shrinking length is an early warning of collapse."""
    mask = reasoning_mask.astype(jnp.float32)
    lengths = mask.sum(axis=1)
    return {
        "reasoning_token_entropy": jnp.sum(token_entropy * mask) / jnp.maximum(mask.sum(), 1.0),
        "reasoning_length_mean": lengths.mean(),
    }
