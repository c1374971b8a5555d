"""KV-cache sampler: greedy parity with transformers' generate, cache == full forward,
holes == compacted text, stop conditions, and the sampling filters against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ragen_jax.models import hf, sampling
from ragen_jax.models.cache import init_cache, positions_from_mask
from ragen_jax.models.head import logprobs_at

from hf_reference import VOCAB

NEW = 32


@pytest.fixture(scope="module")
def untied(hf_models):
    torch_model, path = hf_models["untied"]
    return torch_model, hf.load_pretrained(path)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    ids = rng.integers(3, VOCAB, size=(4, 12)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    mask[1, :5] = False
    mask[3, :2] = False
    ids[~mask] = 0
    return ids, mask


def hf_generate(torch_model, ids, mask, eos=None):
    with torch.no_grad():
        out = torch_model.generate(input_ids=torch.as_tensor(ids, dtype=torch.long),
                                   attention_mask=torch.as_tensor(mask, dtype=torch.long),
                                   max_new_tokens=NEW, do_sample=False, eos_token_id=eos, pad_token_id=0)
    out = out[:, ids.shape[1]:].numpy()
    return np.pad(out, ((0, 0), (0, NEW - out.shape[1])))  # generate stops early when all hit eos


@pytest.fixture(scope="module")
def greedy_ours(untied, prompts):
    ids, mask = prompts
    return sampling.generate(untied[1], jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0),
                             max_new_tokens=NEW, params=sampling.GREEDY)


def test_greedy_matches_transformers_generate(untied, prompts, greedy_ours):
    ids, mask = prompts
    ref = hf_generate(untied[0], ids, mask)
    np.testing.assert_array_equal(np.asarray(greedy_ours.tokens), ref)
    np.testing.assert_array_equal(np.asarray(greedy_ours.lengths), [NEW] * 4)


def test_greedy_with_a_prompt_longer_than_the_prefill_block_matches_transformers(untied):
    """`generate` prefills its prompt in query blocks of PREFILL_BLOCK slots, each reading only
    the keys before its end; with left padding and 45-token prompts the tokens stay transformers'."""
    from ragen_jax.models.config import PREFILL_BLOCK

    rng = np.random.default_rng(5)
    length = PREFILL_BLOCK + 13
    ids = rng.integers(3, VOCAB, size=(3, length)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    mask[1, :PREFILL_BLOCK + 2] = False  # the first block holds only padding
    mask[2, :7] = False
    ids[~mask] = 0
    out = sampling.generate(untied[1], jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0),
                            max_new_tokens=NEW, params=sampling.GREEDY)
    np.testing.assert_array_equal(np.asarray(out.tokens), hf_generate(untied[0], ids, mask))


def test_greedy_stops_at_eos_like_transformers(untied, prompts, greedy_ours):
    ids, mask = prompts
    tokens = np.asarray(greedy_ours.tokens)
    eos = int(tokens[0, 9])  # a token the model really emits mid-sequence
    ref = hf_generate(untied[0], ids, mask, eos=eos)
    out = sampling.generate(untied[1], jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0),
                            max_new_tokens=NEW, params=sampling.GREEDY, eos_ids=(eos,))
    np.testing.assert_array_equal(np.asarray(out.tokens), ref)
    want_len = [int(np.argmax(row == eos)) + 1 if (row == eos).any() else NEW for row in tokens]
    np.testing.assert_array_equal(np.asarray(out.lengths), want_len)
    assert want_len[0] <= 10


def test_decode_logprobs_equal_full_forward(untied, prompts):
    """Log-probs recorded while sampling (through the cache) equal a training-style full
    forward over the same buffer, holes included
    (docs/architecture.md#static-shapes-slots-with-holes)."""
    model = untied[1]
    ids, mask = (jnp.asarray(x) for x in prompts)
    params = sampling.SamplingParams(temperature=0.7, top_k=50)
    out = sampling.generate(model, ids, mask, jax.random.key(3), max_new_tokens=NEW, params=params,
                            eos_ids=(5, 6, 7))
    gen_mask = jnp.arange(NEW)[None] < out.lengths[:, None]
    tokens = jnp.concatenate([ids, out.tokens], 1)
    full_mask = jnp.concatenate([mask, gen_mask], 1)
    p = ids.shape[1]
    # token at slot p+i is predicted by the last valid slot before it: p-1+i (no holes after p)
    query = p - 1 + jnp.arange(NEW)[None].repeat(4, 0)
    hidden, _ = model(tokens, positions_from_mask(full_mask), full_mask)
    logits = model.logits(jnp.take_along_axis(hidden, query[..., None], 1)) / params.temperature
    want = jnp.take_along_axis(jax.nn.log_softmax(logits), out.tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(jnp.where(gen_mask, want, 0)), atol=1e-5)
    assert np.asarray(out.lengths).min() >= 1


def test_chunked_prefill_with_holes_equals_compacted(untied):
    """Prefill two chunks with holes at different offsets, then decode: same tokens and
    log-probs as one prefill of the compacted text."""
    model = untied[1]
    rng = np.random.default_rng(5)
    text = rng.integers(3, VOCAB, size=(2, 14)).astype(np.int32)
    # layout per row: chunk A (8 slots) then chunk B (8 slots), holes anywhere
    mask_a = np.array([[1, 1, 0, 1, 1, 0, 0, 1], [1, 1, 1, 1, 1, 1, 1, 0]], bool)
    mask_b = np.array([[1, 0, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1, 1]], bool)
    chunk_a, chunk_b = np.zeros((2, 8), np.int32), np.zeros((2, 8), np.int32)
    for b in range(2):
        n_a = mask_a[b].sum()
        chunk_a[b, mask_a[b]] = text[b, :n_a]
        chunk_b[b, mask_b[b]] = text[b, n_a:n_a + mask_b[b].sum()]
    lengths = mask_a.sum(1) + mask_b.sum(1)
    assert (lengths == [12, 13]).all()
    cache = init_cache(model.cfg, 2, 16 + 8)
    cache, logits = sampling.prefill_jit(model, cache, jnp.asarray(chunk_a), jnp.asarray(mask_a), 0)
    cache, logits = sampling.prefill_jit(model, cache, jnp.asarray(chunk_b), jnp.asarray(mask_b), 8, logits)
    cache, out = sampling.decode_jit(model, cache, logits, 16, jax.random.key(0), num_steps=8,
                                     params=sampling.GREEDY)
    assert bool(cache.mask[:, 16:].all())
    for b in range(2):
        compact = jnp.asarray(text[b:b + 1, :lengths[b]])
        ref = sampling.generate(model, compact, jnp.ones_like(compact, bool), jax.random.key(0),
                                max_new_tokens=8, params=sampling.GREEDY)
        np.testing.assert_array_equal(np.asarray(out.tokens[b]), np.asarray(ref.tokens[0]))
        np.testing.assert_allclose(np.asarray(out.logprobs[b]), np.asarray(ref.logprobs[0]), atol=1e-5)


def prompts_with_holes(rows: int, seed: int):
    """[rows, 12] random prompts, row 1 left-padded and row 4 with two holes."""
    ids = np.random.default_rng(seed).integers(3, VOCAB, size=(rows, 12)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    mask[1, :4] = False
    mask[4, [3, 7]] = False
    return ids, mask


def assert_same_generation(out, ref):
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs), atol=1e-5)


def test_generate_fills_its_cache_a_few_sequences_at_a_time(untied, monkeypatch):
    """On one CPU device `generate` prefills a few sequences at a time into a cache already in
    the decode loop's per-layer form (`in_row_chunks` over the batch); forced here on 5 prompts
    in chunks of 2 (the last one padded): the same tokens and log-probs as one piece, greedy and
    sampled, so no row's cache or logits land in another's place."""
    from ragen_jax.models import cpu_tuning

    model = untied[1]
    ids, mask = prompts_with_holes(5, seed=8)
    run = lambda params: jax.jit(  # a new function each time: traced with the current CHUNK_FLOATS
        lambda m, t, k: sampling.generate.__wrapped__(m, t, k, jax.random.key(3), max_new_tokens=NEW,
                                                      params=params))(model, jnp.asarray(ids), jnp.asarray(mask))
    params = (sampling.GREEDY, sampling.SamplingParams(temperature=1.0))
    whole = [run(p) for p in params]
    floats_per_row = ids.shape[1] * model.cfg.intermediate_size
    monkeypatch.setattr(cpu_tuning, "CHUNK_FLOATS", 2 * floats_per_row)
    monkeypatch.setattr(cpu_tuning, "on_cpu_per_device", lambda: True)  # the suite has 8 fake devices
    assert cpu_tuning.row_chunk(5, floats_per_row) == 2
    for p, ref in zip(params, whole):
        assert_same_generation(run(p), ref)


def test_data_parallel_generate_gives_the_tokens_of_one_device(untied, monkeypatch):
    """`generate(mesh=...)` splits the batch over the mesh's devices, each generating its own
    rows (filled in row chunks, forced here to 2 of each device's 3 rows, the last padded): the
    tokens, lengths and log-probs of the same call on one device, sampled with early stops."""
    from ragen_jax.models import cpu_tuning
    from ragen_jax.core import sharding

    model = untied[1]
    ids, mask = prompts_with_holes(6, seed=9)
    params = sampling.SamplingParams(temperature=1.0)
    args = (model, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(5))
    ref = sampling.generate(*args, max_new_tokens=NEW, params=params)
    eos = int(np.asarray(ref.tokens)[2, 6])  # stops row 2 (at the latest) early
    ref = sampling.generate(*args, max_new_tokens=NEW, params=params, eos_ids=(eos,))
    assert int(np.asarray(ref.lengths).min()) < NEW
    monkeypatch.setattr(cpu_tuning, "CHUNK_FLOATS", 2 * ids.shape[1] * model.cfg.intermediate_size)
    out = sampling.generate(*args, max_new_tokens=NEW, params=params, eos_ids=(eos,),
                            mesh=sharding.make_mesh((2, 1, 1)))
    assert_same_generation(out, ref)
    with pytest.raises(ValueError, match="batch 6 must be divisible by the mesh's 4 devices"):
        sampling.generate(*args, max_new_tokens=NEW, params=params, mesh=sharding.make_mesh((2, 2, 1)))


def test_stop_condition_and_holes_after_stop(untied, prompts, greedy_ours):
    model = untied[1]
    ids, mask = prompts
    tokens = np.asarray(greedy_ours.tokens)
    stop_seq = [int(tokens[2, 4]), int(tokens[2, 5])]  # row 2 generates this pair at steps 4-5
    stop = sampling.stop_on_suffix([stop_seq, [VOCAB + 5]])
    b, p = ids.shape
    cache = init_cache(model.cfg, b, p + NEW)
    cache, logits = sampling.prefill_jit(model, cache, jnp.asarray(ids), jnp.asarray(mask), 0)
    cache, out = sampling.decode_jit(model, cache, logits, p, jax.random.key(0), num_steps=NEW,
                                     params=sampling.GREEDY, stop_fn=stop, pad_id=0)
    lengths = np.asarray(out.lengths)
    for row in range(b):
        hits = [i + 2 for i in range(NEW - 1) if list(tokens[row, i:i + 2]) == stop_seq]
        want = hits[0] if hits else NEW
        assert lengths[row] == want
        np.testing.assert_array_equal(np.asarray(out.tokens[row, :want]), tokens[row, :want])
        assert (np.asarray(out.tokens[row, want:]) == 0).all()
        # slots after the stop are holes; the stop token itself is in the cache
        np.testing.assert_array_equal(np.asarray(cache.mask[row, p:]), np.arange(NEW) < want)
    assert lengths[2] <= 6


def numpy_filter(logits, temperature, top_k, top_p):
    x = logits / temperature
    if top_k:
        kth = np.sort(x, -1)[:, -top_k][:, None]
        x = np.where(x < kth, -np.inf, x)
    out = np.full_like(x, -np.inf)
    for b in range(x.shape[0]):
        order = np.argsort(-x[b], kind="stable")
        p = np.exp(x[b, order] - x[b, order[0]])
        p /= p.sum()
        keep = np.cumsum(p) - p < top_p
        out[b, order[keep]] = x[b, order[keep]]
    return out


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 0.9), (0.5, 5, 1.0), (2.0, 7, 0.6)])
def test_filter_logits_matches_numpy(temperature, top_k, top_p):
    logits = np.random.default_rng(6).normal(size=(3, 40)).astype(np.float32) * 3
    params = sampling.SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    got = np.asarray(sampling.filter_logits(jnp.asarray(logits), params))
    want = numpy_filter(logits, temperature, top_k, top_p)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_allclose(got[~np.isinf(got)], want[~np.isinf(want)], rtol=1e-6)


def test_kth_largest_matches_a_sort_with_ties_and_minus_inf():
    """The k-th largest, duplicates counted, for every k on both sides of SMALL_TOP_K (plain
    reductions below it, XLA's top-k above)."""
    rng = np.random.default_rng(9)
    x = rng.integers(-3, 4, size=(5, 40)).astype(np.float32)  # many ties
    x[1, :38] = -np.inf  # fewer finite entries than k
    x[2] = rng.normal(size=40)
    for k in (1, 2, 4, 7, sampling.SMALL_TOP_K, sampling.SMALL_TOP_K + 1, 40):
        got = np.asarray(sampling._kth_largest(jnp.asarray(x), k))[:, 0]
        np.testing.assert_array_equal(got, np.sort(x, axis=-1)[:, -k], err_msg=f"k={k}")


@pytest.mark.parametrize("vocab", [6, 40, 211])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.6, 0, 1.0), (1.0, 5, 1.0), (1.3, 0, 0.8),
                                                     (0.8, 4, 0.95)])
def test_sampling_frequencies_follow_filtered_softmax(temperature, top_k, top_p, vocab):
    """Many draws from one row: each token's frequency within 5 standard errors of its
    probability under the filtered softmax, removed and -inf entries never drawn, and the
    log-prob returned is log_softmax(logits / T) at the drawn token. Vocabularies of 6, 40
    and 211 give one, several, and padded blocks in the two-level draw."""
    rng = np.random.default_rng(vocab)
    logits = (rng.normal(size=(1, vocab)) * 1.5).astype(np.float32)
    logits[0, 3] = -np.inf
    n = 40000
    params = sampling.SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    keys = jax.random.split(jax.random.key(7), n)
    tokens, logp = jax.jit(jax.vmap(lambda k: sampling.sample_token(k, jnp.asarray(logits), params)))(keys)
    tokens = np.asarray(tokens[:, 0])
    freq = np.bincount(tokens, minlength=vocab) / n
    want = np.exp(numpy_filter(logits, temperature, top_k, top_p))[0]
    want /= want.sum()
    assert freq[want == 0].sum() == 0
    np.testing.assert_array_less(np.abs(freq - want), 5 * np.sqrt(want * (1 - want) / n) + 1e-12)
    full = np.asarray(jax.nn.log_softmax(jnp.asarray(logits[0]) / temperature))
    np.testing.assert_allclose(np.asarray(logp[:, 0]), full[tokens], rtol=1e-6)


def test_draw_never_returns_a_zero_weight_entry():
    """The CDF inversion at its edges: u = 0, u just below 1, and weights whose sums round."""
    weights = jnp.asarray([[0, 0, 1e-30, 0, 3, 0, 0, 0, 0],
                           [0, 1, 0, 0, 0, 0, 0, 0, 1e-8],
                           [5, 0, 0, 0, 0, 0, 0, 0, 0]], jnp.float32)
    for u in (0.0, 0.5, np.nextafter(np.float32(1), np.float32(0))):
        token = np.asarray(sampling._draw(jnp.full((3,), u, jnp.float32), weights))
        assert (np.asarray(weights)[np.arange(3), token] > 0).all(), (u, token)


def test_same_key_same_samples(untied, prompts):
    ids, mask = (jnp.asarray(x) for x in prompts)
    params = sampling.SamplingParams(temperature=1.0)
    run = lambda seed: sampling.generate(untied[1], ids, mask, jax.random.key(seed), max_new_tokens=NEW,
                                         params=params)
    a, b, c = run(11), run(11), run(12)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_array_equal(np.asarray(a.logprobs), np.asarray(b.logprobs))
    assert (np.asarray(a.tokens) != np.asarray(c.tokens)).any()


def test_bad_sampling_params():
    with pytest.raises(ValueError, match="top_p"):
        sampling.SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        sampling.SamplingParams(temperature=-1.0)


def _after_five(tokens, lengths):
    """A switch condition for the test below: true once a sequence has 5 tokens."""
    return lengths >= 5


def test_decode_switches_to_other_params_after_the_switch_condition(untied, prompts):
    """Tokens 1-5 are drawn at T 1.5 and scored at it; once `switch_fn` holds, the rest are the
    full forward's argmax (greedy `switch_params`) with log-probs at T 1, and `switched` marks them."""
    model = untied[1]
    ids, mask = (jnp.asarray(x) for x in prompts)
    b, p = ids.shape
    hot = sampling.SamplingParams(temperature=1.5)
    cache = init_cache(model.cfg, b, p + NEW)
    cache, logits = sampling.prefill_jit(model, cache, ids, mask, 0)
    _, out = sampling.decode_jit(model, cache, logits, p, jax.random.key(4), num_steps=NEW, params=hot,
                                 switch_fn=_after_five, switch_params=sampling.GREEDY)
    np.testing.assert_array_equal(np.asarray(out.switched), np.broadcast_to(np.arange(NEW) >= 5, (b, NEW)))
    tokens = jnp.concatenate([ids, out.tokens], 1)
    full_mask = jnp.concatenate([mask, jnp.ones_like(out.tokens, bool)], 1)
    hidden, _ = model(tokens, positions_from_mask(full_mask), full_mask)
    logits = np.asarray(model.logits(hidden[:, p - 1:p - 1 + NEW]), np.float64)
    got_tokens, got_logp = np.asarray(out.tokens), np.asarray(out.logprobs)
    for row in range(b):
        for i in range(NEW):
            t = 1.0 if i >= 5 else hot.temperature
            scaled = logits[row, i] / t
            logp = scaled - scaled.max() - np.log(np.exp(scaled - scaled.max()).sum())
            if i >= 5:
                assert got_tokens[row, i] == np.argmax(logits[row, i])
            np.testing.assert_allclose(got_logp[row, i], logp[got_tokens[row, i]], atol=1e-4)
    with pytest.raises(ValueError, match="switch_fn and switch_params"):
        sampling.decode(model, cache, logits, p, jax.random.key(4), num_steps=2, switch_fn=_after_five)
