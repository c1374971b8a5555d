"""Sampling throughput: generated tokens/s, ours vs transformers `generate` vs tunix's sampler.

    python benchmarks/sampling_throughput.py [--models tiny small] [--tunix-python PY] [--unroll-inference]

Batch 64, prompt 128, 64 new tokens, temperature-1 sampling, no early stop (every engine
generates exactly batch x new tokens). Same weights in all engines: ours are randomly
initialised, exported with `save_pretrained` for transformers and copied into tunix's Qwen2.
Compile time (first call minus a steady call) is reported apart from steady throughput. Ours
samples with `for_inference(model)`, the copy the rollout samples with: `--unroll-inference`
(`model.unroll_inference`) unrolls a scanned preset's layers there (the Qwen2.5 presets scan).

Then both engines again, data-parallel over `--cpu-devices` workers (default: one per core):
ours with `generate(mesh=...)` over that many jax CPU devices (a fresh process started with
`--xla_force_host_platform_device_count`), transformers as that many one-thread processes,
each with its share of the rows, started together (a round ends when the last is done). On a
small CPU one worker per core beats one process spreading every op over the cores, for both.

tunix (google-tunix) pins its own dependency set, so it is not a project dependency. It is
run in a subprocess with `--tunix-python`, a Python where `pip install google-tunix
--no-deps` (plus jaxtyping, etils, sentencepiece, absl-py) sits beside our jax, e.g. a venv
made with `--system-site-packages`. Without it, the tunix line says why it was skipped.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ragen_jax.core import sharding  # noqa: E402
from ragen_jax.models import hf, sampling  # noqa: E402
from ragen_jax.models.config import DecoderConfig  # noqa: E402
from ragen_jax.models.decoder import init_model  # noqa: E402
from ragen_jax.models.stacking import for_inference  # noqa: E402
from ragen_jax.text.build_tokenizer import corpus  # noqa: E402


def make_prompts(batch: int, length: int, seed: int = 0):
    """`batch` project-style prompts of exactly `length` tokens (ids [B, L] and their text):
    conversations joined until a prompt is long enough, kept where the text re-encodes to the
    same ids (tunix takes text)."""
    tok = hf.load_tokenizer()
    ids, texts, text = [], [], ""
    for conversation in corpus(batch * (4 + length // 64), seed):
        text += conversation
        row = tok.encode(text, add_special_tokens=False)
        if len(row) < length:
            continue
        row, text = row[:length], ""
        piece = tok.decode(row)
        if tok.encode(piece, add_special_tokens=False) == row:
            ids.append(row)
            texts.append(piece)
        if len(ids) == batch:
            return tok, np.asarray(ids, np.int32), texts
    raise RuntimeError("corpus too short for the requested prompts")


def timed(fn, repeats: int):
    """(first-call seconds, fastest steady seconds: the least disturbed run on a shared CPU)."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return first, min(times)


def bench_ours(model, ids, new, repeats, mesh=None):
    prompt, mask = jnp.asarray(ids), jnp.ones(ids.shape, bool)
    params = sampling.SamplingParams(temperature=1.0)
    keys = iter(jax.random.split(jax.random.key(0), repeats + 1))
    model = for_inference(model)  # as the rollout runs it (unrolled with model.unroll_inference)

    def run():
        out = sampling.generate(model, prompt, mask, next(keys), max_new_tokens=new, params=params, mesh=mesh)
        jax.block_until_ready(out)
        assert int(out.lengths.min()) == new

    return timed(run, repeats)


def transformers_model(model, threads, device="cpu"):
    """Our weights in transformers (exported with `save_pretrained`), in our compute dtype, on
    `device` ("cpu", "cuda")."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(model, tmp)
        dtype = getattr(torch, model.cfg.dtype)
        return AutoModelForCausalLM.from_pretrained(tmp, dtype=dtype).to(device).eval()


def transformers_generate(torch_model, ids, new):
    import torch

    prompt = torch.as_tensor(ids, dtype=torch.long, device=torch_model.device)
    with torch.no_grad():
        out = torch_model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                   min_new_tokens=new, do_sample=True, temperature=1.0, top_k=0,
                                   top_p=1.0, eos_token_id=None, pad_token_id=0)
    if out.is_cuda:
        torch.cuda.synchronize()
    assert out.shape[1] == ids.shape[1] + new


def bench_transformers(model, ids, new, repeats, threads=2, device="cpu"):
    torch_model = transformers_model(model, threads, device)
    return timed(lambda: transformers_generate(torch_model, ids, new), repeats)


def decode_bound(cfg, batch: int, prompt: int, new: int, bandwidth_tbps: float) -> float:
    """Generated tokens/s if every decode step only read the weights and the KV cache once at
    `bandwidth_tbps` (the memory-bandwidth bound of decoding; the prompt's prefill left out)."""
    size = np.dtype(jnp.dtype(cfg.dtype)).itemsize
    weights = cfg.num_params() * size
    per_slot = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * size  # K and V, one token
    cache = per_slot * batch * (prompt + (new + 1) / 2)  # the mean context over the decode steps
    return batch / ((weights + cache) / (bandwidth_tbps * 1e12))


def transformers_part(model, ids, new, part, parts):
    """One process of a data-parallel transformers run: rows part::parts on one thread, one
    `generate` per "go" line on stdin, "ready" / "done" on stdout."""
    torch_model = transformers_model(model, 1)
    rows = ids[part::parts]
    transformers_generate(torch_model, rows, new)  # warm-up
    print("ready", flush=True)
    for _ in sys.stdin:
        transformers_generate(torch_model, rows, new)
        print("done", flush=True)


def transformers_in_processes(name, args, parts):
    """transformers data-parallel: `parts` single-thread processes, each with its share of the
    rows, started together; a round lasts until the last one is done (first, fastest round)."""
    cmd = [sys.executable, __file__, "--engine", "transformers-part", "--models", name, "--parts", str(parts),
           "--batch", str(args.batch), "--prompt", str(args.prompt), "--new", str(args.new)]
    procs = [subprocess.Popen(cmd + ["--part", str(i)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for i in range(parts)]
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"transformers part exited with {proc.wait()}")

        def run():
            for proc in procs:
                proc.stdin.write("go\n")
                proc.stdin.flush()
            for proc in procs:
                if proc.stdout.readline().strip() != "done":
                    raise RuntimeError(f"transformers part exited with {proc.wait()}")

        return timed(run, args.repeats)
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.wait()


def import_tunix():
    """tunix's sampler and Qwen2 without `tunix/__init__` (which pulls in its trainers)."""
    if "tunix" in sys.modules:
        return importlib.import_module("tunix.generate.sampler"), importlib.import_module("tunix.models.qwen2.model")
    spec = importlib.util.find_spec("tunix")
    if spec is None:
        raise ImportError("google-tunix is not installed in this Python")
    package = types.ModuleType("tunix")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["tunix"] = package
    sampler = importlib.import_module("tunix.generate.sampler")
    model = importlib.import_module("tunix.models.qwen2.model")
    return sampler, model


def tunix_model_from_ours(ours, tunix_model_lib):
    from flax import nnx

    cfg = ours.cfg
    tcfg = tunix_model_lib.ModelConfig(
        num_layers=cfg.num_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.hidden_size,
        hidden_dim=cfg.intermediate_size, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
        num_kv_heads=cfg.num_kv_heads, rope_theta=int(cfg.rope_theta), norm_eps=cfg.rms_norm_eps,
        use_tied_embedding=cfg.tie_word_embeddings)
    model = tunix_model_lib.Qwen2(tcfg, rngs=nnx.Rngs(0))
    d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    model.embedder.input_embedding[...] = ours.embed_tokens[...]
    model.final_norm.w[...] = ours.norm.weight[...]
    if not cfg.tie_word_embeddings:
        model.lm_head.w[...] = ours.lm_head[...].T
    for theirs, mine in zip(model.layers, ours.layers):
        a, m = theirs.attn, mine.self_attn
        a.q_proj.w[...] = m.q_proj.kernel[...].reshape(d, n, h)
        a.k_proj.w[...] = m.k_proj.kernel[...].reshape(d, k, h)
        a.v_proj.w[...] = m.v_proj.kernel[...].reshape(d, k, h)
        a.o_proj.w[...] = m.o_proj.kernel[...].reshape(n, h, d)
        a.q_bias[...], a.k_bias[...], a.v_bias[...] = m.q_proj.bias[...], m.k_proj.bias[...], m.v_proj.bias[...]
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(theirs.mlp, name).kernel[...] = getattr(mine.mlp, name).kernel[...]
        theirs.input_layernorm.w[...] = mine.input_layernorm.weight[...]
        theirs.post_attention_layernorm.w[...] = mine.post_attention_layernorm.weight[...]
    return model


def bench_tunix(ours, tok, texts, prompt_len, new, repeats):
    sampler_lib, model_lib = import_tunix()
    model = tunix_model_from_ours(ours, model_lib)
    cfg = ours.cfg
    cache = sampler_lib.CacheConfig(cache_size=prompt_len + new, num_layers=cfg.num_layers,
                                    num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim)
    sampler = sampler_lib.Sampler(model, tok, cache)
    seeds = iter(range(repeats + 1))

    def run():
        out = sampler(texts, max_generation_steps=new, max_prompt_length=prompt_len, temperature=1.0,
                      top_p=1.0, eos_tokens=[-1], seed=next(seeds), pad_output=True)
        assert all(len(t) == new for t in out.tokens), [len(t) for t in out.tokens]

    return timed(run, repeats)


def engine_in_subprocess(python, engine, name, args, devices=None):
    """({"first", "steady"}, None) from `--engine engine` run by `python` in a fresh process, or
    (None, why). `devices`: that many CPU devices (jax fixes its device count when it starts)."""
    from ragen_jax.core.host_devices import with_device_count

    env = dict(os.environ)
    if devices is not None:
        env["XLA_FLAGS"] = with_device_count(env.get("XLA_FLAGS", ""), devices)
    cmd = [python, __file__, "--engine", engine, "--models", name, "--batch", str(args.batch),
           "--prompt", str(args.prompt), "--new", str(args.new), "--repeats", str(args.repeats)]
    cmd += ["--unroll-inference"] if args.unroll_inference else []
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        return None, (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return json.loads(lines[-1]), None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "small"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=2,
                        help="PyTorch threads for transformers (1 with `taskset -c 0` compares one core each: "
                             "2 OpenMP threads stall when other processes hold the cores)")
    parser.add_argument("--cpu-devices", type=int, default=os.cpu_count(),
                        help="also run each engine data-parallel over this many CPU workers: ours over as "
                             "many jax CPU devices, transformers in as many one-thread processes (1: skip)")
    parser.add_argument("--tunix-python", default=None,
                        help="a Python with google-tunix beside jax (default: this one, if it imports)")
    parser.add_argument("--engine", default="all", choices=["all", "tunix", "ours", "transformers-part"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="weights and compute dtype of both engines (default float32)")
    parser.add_argument("--attention", default="einsum", choices=["einsum", "xla", "cudnn"],
                        help="our model.attention (the prompt's prefill; decoding reads the cache) (default einsum)")
    parser.add_argument("--unroll-inference", action="store_true",
                        help="our model.unroll_inference: a scanned model's layers unrolled in the sampler")
    parser.add_argument("--torch-device", default="cpu", help="transformers' device: cpu (default) or cuda")
    parser.add_argument("--bandwidth-tbps", type=float, default=None,
                        help="the device's memory bandwidth: also print the decode's bandwidth bound")
    parser.add_argument("--part", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--parts", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    tok, ids, texts = make_prompts(args.batch, args.prompt)
    tokens = args.batch * args.new
    if args.engine == "all":
        print(f"# sampling throughput: batch {args.batch}, prompt {args.prompt}, {args.new} new tokens, "
              f"temperature 1.0, {args.dtype}; {jax.device_count()} {jax.devices()[0].platform} device(s) "
              f"({jax.devices()[0].device_kind}), jax {jax.__version__}; transformers on {args.torch_device}")
    for name in args.models:
        model = init_model(DecoderConfig.preset(name, dtype=args.dtype, param_dtype=args.dtype,
                                                         attention=args.attention,
                                                         unroll_inference=args.unroll_inference), jax.random.key(0))
        if args.engine != "all":
            if args.engine == "transformers-part":
                transformers_part(model, ids, args.new, args.part, args.parts)
                continue
            if args.engine == "tunix":
                first, steady = bench_tunix(model, tok, texts, args.prompt, args.new, args.repeats)
            else:  # ours over every device this process has
                mesh = sharding.make_mesh((jax.device_count(), 1, 1))
                first, steady = bench_ours(model, ids, args.new, args.repeats, mesh)
            print(json.dumps({"first": first, "steady": steady}))
            continue
        first, steady = bench_ours(model, ids, args.new, args.repeats)
        print(f"{name:6s} ragen_jax     {tokens / steady:9.0f} tok/s  (steady {steady:.3f}s, compile {first - steady:.1f}s)")
        if args.bandwidth_tbps:
            bound = decode_bound(model.cfg, args.batch, args.prompt, args.new, args.bandwidth_tbps)
            print(f"{name:6s} decode bound  {bound:9.0f} tok/s  (weights + KV cache once per step at "
                  f"{args.bandwidth_tbps} TB/s; ours at {tokens / steady / bound:.0%} of it)")
        t_first, t_steady = bench_transformers(model, ids, args.new, args.repeats, args.torch_threads,
                                               args.torch_device)
        print(f"{name:6s} transformers  {tokens / t_steady:9.0f} tok/s  (steady {t_steady:.3f}s)  "
              f"ratio ours/transformers {t_steady / steady:.2f}x")
        result, why = None, None
        if args.tunix_python:
            result, why = engine_in_subprocess(args.tunix_python, "tunix", name, args)
        else:
            try:
                first_t, steady_t = bench_tunix(model, tok, texts, args.prompt, args.new, args.repeats)
                result = {"first": first_t, "steady": steady_t}
            except ImportError as e:
                why = f"{type(e).__name__}: {e}"
        if result is None:
            print(f"{name:6s} tunix         skipped: cannot import beside jax {jax.__version__} ({why})")
        else:
            print(f"{name:6s} tunix         {tokens / result['steady']:9.0f} tok/s  (steady {result['steady']:.3f}s, "
                  f"compile {result['first'] - result['steady']:.1f}s)  "
                  f"ratio ours/tunix {result['steady'] / steady:.2f}x")
        if args.cpu_devices > 1 and args.batch % args.cpu_devices == 0:
            n = args.cpu_devices
            dp, why = engine_in_subprocess(sys.executable, "ours", name, args, devices=n)
            if dp is None:
                raise RuntimeError(f"ours over {n} CPU devices failed: {why}")
            _, tp_steady = transformers_in_processes(name, args, n)
            print(f"{name:6s} data-parallel over {n} CPU workers (ours: {n} jax devices; transformers: {n} "
                  f"one-thread processes)")
            print(f"{name:6s} ragen_jax     {tokens / dp['steady']:9.0f} tok/s  (steady {dp['steady']:.3f}s, "
                  f"compile {dp['first'] - dp['steady']:.1f}s)  ratio to transformers (above) "
                  f"{t_steady / dp['steady']:.2f}x")
            print(f"{name:6s} transformers  {tokens / tp_steady:9.0f} tok/s  (steady {tp_steady:.3f}s)  "
                  f"ratio ours/transformers, both data-parallel {tp_steady / dp['steady']:.2f}x")
        elif args.cpu_devices > 1:
            print(f"{name:6s} data-parallel skipped: batch {args.batch} is not divisible by --cpu-devices "
                  f"{args.cpu_devices}")


if __name__ == "__main__":
    main()
