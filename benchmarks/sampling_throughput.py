"""Sampling throughput: generated tokens/s, ours vs transformers `generate` vs tunix's sampler.

    python benchmarks/sampling_throughput.py [--models tiny small] [--tunix-python PY]

Batch 64, prompt 128, 64 new tokens, temperature-1 sampling, no early stop (every engine
generates exactly batch x new tokens). Same weights in all engines: ours are randomly
initialised, exported with `save_pretrained` for transformers and copied into tunix's Qwen2.
Compile time (first call minus a steady call) is reported apart from steady throughput.

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

from ragen_jax.models import hf, sampling  # noqa: E402
from ragen_jax.models.qwen2 import Qwen2Config, init_model  # noqa: E402
from ragen_jax.text.build_tokenizer import corpus  # noqa: E402


def make_prompts(batch: int, length: int, seed: int = 0):
    """`batch` project-style prompts of exactly `length` tokens (ids [B, L] and their text)."""
    tok = hf.load_tokenizer()
    ids, texts = [], []
    for text in corpus(batch * 4, seed):
        row = tok.encode(text, add_special_tokens=False)[:length]
        piece = tok.decode(row)
        if len(row) == length and tok.encode(piece, add_special_tokens=False) == row:
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


def bench_ours(model, ids, new, repeats):
    prompt, mask = jnp.asarray(ids), jnp.ones(ids.shape, bool)
    params = sampling.SamplingParams(temperature=1.0)
    keys = iter(jax.random.split(jax.random.key(0), repeats + 1))

    def run():
        out = sampling.generate(model, prompt, mask, next(keys), max_new_tokens=new, params=params)
        jax.block_until_ready(out)
        assert int(out.lengths.min()) == new

    return timed(run, repeats)


def bench_transformers(model, ids, new, repeats, threads=2):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(model, tmp)
        torch_model = AutoModelForCausalLM.from_pretrained(tmp).eval()
    prompt = torch.as_tensor(ids, dtype=torch.long)
    mask = torch.ones_like(prompt)

    def run():
        with torch.no_grad():
            out = torch_model.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=new,
                                       min_new_tokens=new, do_sample=True, temperature=1.0, top_k=0,
                                       top_p=1.0, eos_token_id=None, pad_token_id=0)
        assert out.shape[1] == ids.shape[1] + new

    return timed(run, repeats)


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


def tunix_in_subprocess(python, name, args):
    cmd = [python, __file__, "--engine", "tunix", "--models", name, "--batch", str(args.batch),
           "--prompt", str(args.prompt), "--new", str(args.new), "--repeats", str(args.repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
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
    parser.add_argument("--tunix-python", default=None,
                        help="a Python with google-tunix beside jax (default: this one, if it imports)")
    parser.add_argument("--engine", default="all", choices=["all", "tunix"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    tok, ids, texts = make_prompts(args.batch, args.prompt)
    tokens = args.batch * args.new
    print(f"# sampling throughput: batch {args.batch}, prompt {args.prompt}, {args.new} new tokens, "
          f"temperature 1.0; {jax.device_count()} {jax.devices()[0].platform} device(s), jax {jax.__version__}")
    for name in args.models:
        model = init_model(Qwen2Config.preset(name), jax.random.key(0))
        if args.engine == "tunix":
            first, steady = bench_tunix(model, tok, texts, args.prompt, args.new, args.repeats)
            print(json.dumps({"first": first, "steady": steady}))
            continue
        first, steady = bench_ours(model, ids, args.new, args.repeats)
        ours_tps = tokens / steady
        print(f"{name:6s} ragen_jax     {ours_tps:9.0f} tok/s  (steady {steady:.3f}s, compile {first - steady:.1f}s)")
        t_first, t_steady = bench_transformers(model, ids, args.new, args.repeats, args.torch_threads)
        print(f"{name:6s} transformers  {tokens / t_steady:9.0f} tok/s  (steady {t_steady:.3f}s)  "
              f"ratio ours/transformers {t_steady / steady:.1f}x")
        result, why = None, None
        if args.tunix_python:
            result, why = tunix_in_subprocess(args.tunix_python, name, args)
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
                  f"ratio ours/tunix {result['steady'] / steady:.1f}x")


if __name__ == "__main__":
    main()
