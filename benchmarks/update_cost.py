"""Does SNR-aware filtering save update compute, and how well does the update use the chip?

In one run, on one fixed rollout batch (synthetic rewards decide which groups vary):
1. update time at keep ratios 1.0, 0.75, 0.5, 0.25 (`top_k` keeps exactly that fraction of
   groups) for each `filter.update` mode, against the unfiltered update of the same mode timed
   in the same run: `fewer_steps` runs fewer optimiser steps, `paper` the same steps on fewer
   rows each, and both skip the micro-batches of padding, so both should cost about the kept
   fraction (the paper cut per-step compute by 26–41%; target: time(0.5) ≤ 0.6 × time(1.0));
2. model-FLOPs utilisation of the update (analytic FLOPs / time) against a large f32 matmul
   timed in the same run;
3. the diagnostics' share of a whole train step at `compute_freq=1` (step with vs without;
   `--no-diagnostics` skips it).

    python benchmarks/update_cost.py [--model small] [--groups 8] [--group-size 8] [--micro-batch 4]

Compile time is excluded (each configuration runs once before timing); best of `--repeats`
rounds, each round timing every configuration once (a shared machine's load then falls on all
of them alike).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.diagnostics.diagnose import DiagnosticsConfig
from ragen_jax.envs import registry
from ragen_jax.models import hf
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import init_model
from ragen_jax.rl.algorithms import AlgoConfig
from ragen_jax.rl.filtering import FilterConfig
from ragen_jax.rollout.play import RolloutConfig, rollout
from ragen_jax.rollout.policies import model_policy
from ragen_jax.text.codec import TextCodec
from ragen_jax.text.prompt import PromptTemplate
from ragen_jax.training.step import StepConfig, Trainer


def best_time(fn, repeats):
    fn()  # compile / warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_peak(n=2048, repeats=5) -> float:
    """FLOP/s of an n×n f32 matmul: the machine's practical peak for the MFU ratio."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    return 2 * n**3 / best_time(lambda: f(a), repeats)


def update_flops(cfg: DecoderConfig, rows: int, seq: int, scored: int) -> float:
    """Forward + backward (≈ 3 × forward) FLOPs of the actor update over `rows` buffers of
    `seq` slots, vocabulary projection at `scored` positions per row. Holes are computed like
    tokens (the forward runs over the whole buffer)."""
    d, hd = cfg.hidden_size, cfg.head_dim
    per_layer = 2 * (d * (cfg.num_heads + 2 * cfg.num_kv_heads) * hd + cfg.num_heads * hd * d
                     + 3 * d * cfg.intermediate_size)
    attention = 2 * 2 * seq * cfg.num_heads * hd  # scores + weighted sum, per query slot
    forward = rows * (seq * cfg.num_layers * (per_layer + attention) + scored * 2 * d * cfg.vocab_size)
    return 3.0 * forward


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", choices=["tiny", "small"])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--mini-batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=4,
                        help="rows per forward/backward: the granularity at which padding is skipped")
    parser.add_argument("--modes", nargs="+", choices=["paper", "fewer_steps"], default=["paper", "fewer_steps"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-diagnostics", action="store_true", help="skip the diagnostics' share (part 3)")
    args = parser.parse_args()

    env, env_params = registry.make("SimpleSokoban")
    tok = hf.load_tokenizer()
    rcfg = RolloutConfig(num_groups=args.groups, group_size=args.group_size, max_turns=args.turns,
                         max_actions_per_turn=2, max_actions_per_traj=2 * args.turns, max_new_tokens=args.new_tokens)
    codec = TextCodec.build(tok, env, rcfg.max_actions_per_turn)
    prompt = PromptTemplate.build(tok, env, rcfg.max_actions_per_turn)
    model_cfg = DecoderConfig.preset(args.model)
    model = init_model(model_cfg, jax.random.key(0))
    traj = jax.jit(lambda k: rollout(k, model_policy(model, codec, prompt, rcfg), env, env_params, codec, prompt,
                                     rcfg))(jax.random.key(1))
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=rcfg.batch).astype(np.float32)  # every group varies
    traj = traj.with_episode_rewards(rewards, rewards > 0.5)
    seq, scored = traj.tokens.shape[1], args.turns * args.new_tokens
    print(f"{jax.devices()[0].device_kind} ×{jax.device_count()}; model {args.model} "
          f"({model_cfg.num_params() / 1e6:.1f}M params); batch {args.groups}×{args.group_size}, "
          f"buffer {seq} slots, {scored} generated slots per row, minibatch {args.mini_batch}, "
          f"micro-batch {args.micro_batch}")

    peak = matmul_peak()
    print(f"f32 matmul 2048³: {peak / 1e9:.1f} GFLOP/s")

    algo = AlgoConfig.preset("grpo", mini_batch_size=args.mini_batch, micro_batch_size=args.micro_batch)
    # Every configuration compiled and warmed up first, then timed in rounds that run each once:
    # on a shared machine a burst of other work then slows every configuration of a round, not
    # one configuration's every call, and the best of the rounds compares like with like.
    runs = {}
    for mode in args.modes:
        for ratio in (1.0, 0.75, 0.5, 0.25):
            filt = FilterConfig(strategy="top_k", rho=ratio, update=mode)
            trainer = Trainer(StepConfig(rollout=rcfg, filter=filt, algo=algo), model, env, env_params, codec, prompt)
            runs[mode, ratio] = {"trainer": trainer, "state": trainer.init_state(jax.random.key(0), model), "times": []}

    def update(run):
        start = time.perf_counter()
        run["state"], metrics = run["trainer"].update(run["state"], traj, jax.random.key(2))
        jax.block_until_ready(metrics)
        return time.perf_counter() - start, metrics

    for run in runs.values():
        _, run["metrics"] = update(run)  # compile / warm up
    for _ in range(args.repeats):
        for run in runs.values():
            run["times"].append(update(run)[0])
    for (mode, ratio), run in runs.items():
        seconds, metrics = min(run["times"]), run["metrics"]
        flops = update_flops(model_cfg, float(metrics["update/kept_rows"]), seq, scored)
        print(f"{mode:>11} keep {ratio:.2f}: {int(metrics['update/minibatches'])} optimiser steps, "
              f"{int(metrics['update/micro_batches'])} micro-batches, update {seconds * 1e3:8.1f} ms "
              f"= {seconds / min(runs[mode, 1.0]['times']):.2f}× the unfiltered update; "
              f"{flops / seconds / 1e9:6.1f} GFLOP/s, MFU {flops / seconds / peak:.0%} of the matmul peak")
    if args.no_diagnostics:
        return

    # The diagnostics' share of a whole step at compute_freq=1.
    filt = FilterConfig(strategy="none")
    plain = Trainer(StepConfig(rollout=rcfg, filter=filt, algo=algo), model, env, env_params, codec, prompt)
    diag = Trainer(StepConfig(rollout=rcfg, filter=filt, algo=algo,
                              diagnostics=DiagnosticsConfig(compute_freq=1, num_samples=min(64, rcfg.batch))),
                   model, env, env_params, codec, prompt)
    step_times = {}
    for name, trainer in (("without", plain), ("with", diag)):
        state = trainer.init_state(jax.random.key(0), model)

        def run():
            nonlocal state
            state, metrics = trainer.step(state)
            return metrics

        step_times[name] = best_time(run, args.repeats)
    share = 1 - step_times["without"] / step_times["with"]
    print(f"train step: {step_times['without']:.2f} s without diagnostics, {step_times['with']:.2f} s with "
          f"(compute_freq=1): diagnostics are {share:.0%} of the step")


if __name__ == "__main__":
    main()
