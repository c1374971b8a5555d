"""Rollout throughput: the in-graph rollout vs a host loop that handles text in Python.

    python benchmarks/rollout_throughput.py [--model tiny] [--max-new-tokens 64]

Both use the same model, the same KV-cache sampler (jitted prefill and decode, each turn
reading only the cache slots written so far) and the same buffer layout; they differ in what RAGEN does on the host between turns: render the board
to text, build the prompt, `tokenizer.encode`, `tokenizer.decode` the answers, parse them with
Python's `re` and step the environments one by one. Ours does all of that inside one jitted
function. 8 groups x 16 trajectories x 5 turns on SimpleSokoban; prints env steps/s,
generated tokens/s and the ratio.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.envs import registry
from ragen_jax.models import hf, sampling
from ragen_jax.models.cache import init_cache
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import init_model
from ragen_jax.rollout.layout import buffer_layout
from ragen_jax.rollout.play import RolloutConfig, initial_states, rollout
from ragen_jax.rollout.policies import model_policy
from ragen_jax.text.answer_re import parse_answer_text
from ragen_jax.text.codec import TextCodec, stop_fn
from ragen_jax.text.prompt import PromptTemplate


def host_loop(key, model, env, params, tok, codec, prompt, config):
    """RAGEN-style rollout: text and env on the host, the model through jitted prefill/decode."""
    batch, gen_len = config.batch, config.max_new_tokens
    states = initial_states(jax.random.split(key)[0], env, params, config)
    states = [jax.tree.map(lambda a, b=b: a[b], states) for b in range(batch)]
    layout = buffer_layout(env, params, codec, prompt, config)
    system = np.asarray(prompt.system_ids)
    cache = init_cache(model.cfg, batch, layout.length)
    cache, logits = sampling.prefill_jit(model, cache, jnp.broadcast_to(system, (batch, len(system))),
                                         jnp.ones((batch, len(system)), bool), 0)
    stop = stop_fn(codec)
    eos = (prompt.end_of_message_id,)
    step = jax.jit(env.step, static_argnums=3)
    taken = [0] * batch
    done = [False] * batch
    last_reward, warning, closed = [None] * batch, [False] * batch, [False] * batch
    steps = tokens_generated = 0
    for t in range(config.max_turns):
        ids = np.zeros((batch, layout.observation), np.int32)
        mask = np.zeros((batch, layout.observation), bool)
        for b in range(batch):
            if done[b]:
                continue
            text = prompt.observation_text(t + 1, env.render_text(states[b], params),
                                           config.max_actions_per_traj - taken[b], last_reward[b], warning[b], closed[b])
            row = tok.encode(text, add_special_tokens=False)
            ids[b, : len(row)], mask[b, : len(row)] = row, True
        cache, logits = sampling.prefill_jit(model, cache, jnp.asarray(ids), jnp.asarray(mask),
                                             layout.observation_offset(t), logits)
        key, sub = jax.random.split(key)
        cache, out = sampling.decode_jit(model, cache, logits, layout.generation_offset(t), sub, num_steps=gen_len,
                                         params=config.sampling, eos_ids=eos, stop_fn=stop, done=jnp.asarray(done),
                                         key_limit=layout.generation_offset(t) + gen_len)
        logits = out.logits
        generated, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
        tokens_generated += int(lengths.sum())
        for b in range(batch):
            if done[b]:
                continue
            gen = list(generated[b, : lengths[b]])
            actions, valid = parse_answer_text(tok.decode(gen), env.action_names, config.max_actions_per_turn)
            reward = 0.0 if valid else config.format_penalty
            for a in actions:
                if bool(states[b].done) or taken[b] >= config.max_actions_per_traj:
                    break
                states[b], r, _, _ = step(jax.random.key(0), states[b], a, params)
                reward += float(r)
                taken[b] += 1
                steps += 1
            last_reward[b], warning[b] = np.float32(reward), not valid
            closed[b] = bool(gen) and int(gen[-1]) == prompt.end_of_message_id
            done[b] = bool(states[b].done) or taken[b] >= config.max_actions_per_traj
    return steps, tokens_generated


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    env, params = registry.make("SimpleSokoban")
    tok = hf.load_tokenizer()
    config = RolloutConfig(num_groups=8, group_size=16, max_turns=5, max_new_tokens=args.max_new_tokens,
                           sampling=sampling.SamplingParams(temperature=1.0))
    codec = TextCodec.build(tok, env, config.max_actions_per_turn)
    prompt = PromptTemplate.build(tok, env, config.max_actions_per_turn)
    model = init_model(DecoderConfig.preset(args.model), jax.random.key(0))
    ours = jax.jit(lambda k, m: rollout(k, model_policy(m, codec, prompt, config), env, params, codec, prompt, config))

    def run_ours(seed):
        traj = jax.block_until_ready(ours(jax.random.key(seed), model))
        return int(traj.num_actions.sum()), int(traj.gen_lengths.sum())

    def best(fn):
        start = time.perf_counter()
        fn(0)
        first = time.perf_counter() - start
        times, counts = [], None
        for r in range(args.repeats):
            start = time.perf_counter()
            counts = fn(r + 1)
            times.append(time.perf_counter() - start)
        return first - min(times), min(times), counts

    print(f"# rollout: 8 groups x 16 trajectories x 5 turns, {args.model} model, max_new_tokens "
          f"{args.max_new_tokens}, SimpleSokoban; jax {jax.__version__} on {jax.devices()[0].platform}")
    c_ours, t_ours, (steps_o, toks_o) = best(run_ours)
    c_host, t_host, (steps_h, toks_h) = best(lambda s: host_loop(jax.random.key(s), model, env, params, tok, codec,
                                                                  prompt, config))
    print(f"ours (one jitted function) {t_ours:7.2f}s  {toks_o / t_ours:9.0f} gen tok/s  {steps_o / t_ours:7.1f} env steps/s"
          f"  (compile {c_ours:.1f}s)")
    print(f"host loop (text in Python) {t_host:7.2f}s  {toks_h / t_host:9.0f} gen tok/s  {steps_h / t_host:7.1f} env steps/s"
          f"  (compile {c_host:.1f}s)")
    print(f"ratio (wall time per rollout) {t_host / t_ours:.2f}x")


if __name__ == "__main__":
    main()
