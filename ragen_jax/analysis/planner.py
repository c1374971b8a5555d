"""The planner (`python -m ragen_jax.plan --config configs/<real-model config>.py --mesh DATAxFSDPxTENSOR`,
or `--target v5e-1` for a Cloud TPU slice).

Memory and FLOPs of the real train step for a model size and a device mesh, without
allocating a single weight: the model is built with `nnx.eval_shape`, the train state is a
tree of `jax.ShapeDtypeStruct`s carrying the mesh's shardings, and the step is compiled
ahead of time (`jax.jit(...).lower(...).compile()`) on fake CPU devices laid out as the target
mesh (`--xla_force_host_platform_device_count`), or with `--target` by XLA's TPU compiler for
that slice's chips (`tpu_targets`: no TPU needed). The compiler's buffer assignment then says
what one device holds (`memory_analysis()`), and its cost model counts FLOPs (`cost_analysis()`).
A TPU compile that does not fit the chip's HBM fails with the compiler's figures, which the
plan reports ("does not fit: needs X of Y").

The model's shapes and tokenizer come from `model.path` (a local Hugging Face directory or a
Hub id: only its config.json and tokenizer files are read, never the weights), or from a
built-in preset (`--model qwen2.5-7b`), in which case the built-in tokenizer lays out the token
buffer.

Printed per device: parameters, optimiser state, critic, reference (exact, from the
shardings, next to the analytic count); the rollout's KV cache and the diagnostics'
cross-scoring cache and working set (analytic); one micro-batch's forward+backward with and
without rematerialisation (compiled temporaries; and analytic in the compute dtype);
the whole compiled step (arguments, outputs, temporaries, peak); an estimated peak. FLOPs per
step are the analytic count of what the implementation computes, next to the compiler's count
of the pieces it repeats (one micro-batch forward+backward, one decode step): XLA's cost
analysis counts a loop body once, whatever its trip count, so the step's total cannot be read
from it. For a TPU the compiler's optimal seconds of those pieces give an estimated step time
and MFU.

The CPU compiler runs bfloat16 as float32 and does not schedule rematerialisation for memory,
so its figures are not a TPU's (nor an upper bound of them: TPU layouts are tiled and padded);
`--target` gives the TPU compiler's own. Called from Python on a TPU/GPU host, `plan` compiles
for those devices. docs/scaling.md has the plans for Qwen2.5 0.5B–7B.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import sys
import time

from ragen_jax.rollout.layout import BufferLayout, buffer_layout
from ragen_jax.core.host_devices import with_device_count


class PlanError(ValueError):
    """A user mistake (printed as one line, exit code 2)."""


def parse_mesh(text: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"(\d+)x(\d+)x(\d+)", text.strip())
    if not match or min(int(g) for g in match.groups()) < 1:
        raise PlanError(f"--mesh {text!r} must be DATAxFSDPxTENSOR with three sizes >= 1, e.g. 1x8x1")
    return tuple(int(g) for g in match.groups())


def use_fake_devices(count: int) -> None:
    """Before jax is imported: `count` CPU devices. Afterwards jax keeps what it has."""
    if "jax" in sys.modules:
        return
    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), count)
    os.environ["JAX_PLATFORMS"] = "cpu"


# ----------------------------------------------------------------------------- analytic model


def matmul_params(cfg) -> int:
    """Weights of the transformer blocks' matmuls (what a token's forward multiplies by)."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return cfg.num_layers * (2 * cfg.hidden_size * q + 2 * cfg.hidden_size * kv
                             + 3 * cfg.hidden_size * cfg.intermediate_size)


def forward_flops(cfg, tokens: int, context: int, projected: int) -> float:
    """Forward FLOPs of `tokens` query slots each attending `context` key slots (holes
    included: the implementation computes masked scores too), `projected` of them projected
    to the vocabulary."""
    attention = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context  # QKᵀ and PV per token
    return tokens * (2 * matmul_params(cfg) + attention) + projected * 2 * cfg.hidden_size * cfg.vocab_size


def analytic_flops(cfg, step_config, layout: BufferLayout) -> dict[str, float]:
    """Whole-batch FLOPs of one train step, by phase, every group kept (the filter can only
    lower the update's share) and every decode running its full `max_new_tokens` (an early
    stop of all rows ends a turn sooner)."""
    r, algo = step_config.rollout, step_config.algo
    b, s, k = r.batch, layout.length, layout.turns * layout.generation
    rollout = forward_flops(cfg, b * layout.system, layout.system, b)
    for t in range(layout.turns):
        obs_end = layout.observation_offset(t) + layout.observation
        rollout += forward_flops(cfg, b * layout.observation, obs_end, b)
        rollout += forward_flops(cfg, b * layout.generation, layout.generation_offset(t) + layout.generation,
                                 b * layout.generation)
    # Training forwards run over the whole buffer; backward ≈ 2 × forward; rematerialised
    # blocks run their forward once more. The vocabulary projection's chunks are always
    # rematerialised (token_logprobs).
    block = forward_flops(cfg, b * s, s, 0)
    head = forward_flops(cfg, 0, 0, b * k)
    passes = 4 if cfg.remat else 3
    update = algo.epochs * (passes * block + 4 * head)
    if algo.uses_reference:
        update += algo.epochs * (block + head)
    if algo.uses_critic:
        update += block + algo.epochs * passes * block  # the value pass, then the critic's steps
    out = {"rollout": rollout, "update": update}
    d = step_config.diagnostics
    if d is not None:
        out["diagnostics"] = diagnostics_flops(cfg, d, r, layout) / d.compute_freq
    out["total"] = sum(out.values())
    return out


def diagnostics_flops(cfg, d, r, layout: BufferLayout) -> float:
    """One diagnostics run (every `compute_freq` steps): the prefill of the batch's buffers
    and the cross-scoring of every pair set (each continuation of W = max_new_tokens + 1 slots
    re-run under each of its columns, over the prompt cache plus itself). Approximate: the
    prompt width of the trajectory and per-turn sets is taken as the last turn's offset."""
    b, w = r.batch, layout.generation + 1
    width = layout.generation_offset(layout.turns - 1)
    flops = forward_flops(cfg, b * width, width, 0)
    first, last = layout.generation_offset(0), width
    m = min(d.num_samples, b)
    pairs = [(m * r.num_groups, first), (m * m, last)]  # first-turn, trajectory
    if d.per_turn:
        pairs.append((layout.turns * d.per_turn_samples ** 2, last))
    if d.action_grounding:
        pairs.append((b * r.group_size, first + w))
    for count, prompt in pairs:
        flops += forward_flops(cfg, count * w, prompt + w, count * w)
    return flops


def activation_bytes(cfg, rows: int, length: int, projected: int, remat: bool, sharded: bool = False,
                     chunk: int = 128, query_block: int = 128) -> float:
    """Analytic bytes of one micro-batch's forward+backward on one device (`rows` buffers of
    `length` slots, `projected` vocabulary positions each) in the compute dtype, as a
    TPU/GPU compiler lays it out: without remat every layer keeps its activations for the
    backward pass — the linear ones and the attention scores (f32 scores and compute-dtype
    probabilities, [heads, length, length]: this implementation materialises them); with remat
    every layer keeps only its input, one layer's activations exist at a time, and of its
    attention one query block's scores (each block is recomputed in its own backward pass).
    Plus one block of vocabulary logits (f32 logits, exponentials, gradient: [rows × chunk
    positions, vocab_chunk or the whole vocabulary]; `token_logprobs`). `sharded` (FSDP /
    tensor): the weights gathered for compute — one layer's at a time with remat, every
    layer's kept for the backward pass without — and the embedding/head matrices."""
    import numpy as np

    c = np.dtype(cfg.dtype).itemsize if cfg.dtype != "bfloat16" else 2
    d, q, kv, i = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    linear = rows * length * (6 * d + 3 * q + 2 * kv + 4 * i) * c
    queries = min(query_block, length) if remat else length
    scores = rows * cfg.num_heads * queries * length * (4 + c)
    block = linear + scores
    vocab = min(cfg.vocab_chunk, cfg.vocab_size) if cfg.vocab_chunk else cfg.vocab_size
    head = 3 * rows * min(chunk, projected) * vocab * 4 + rows * projected * d * c
    kept = cfg.num_layers * rows * length * d * c + block if remat else cfg.num_layers * block
    if sharded:
        tables = (1 if cfg.tie_word_embeddings else 2) * cfg.vocab_size * d
        kept += (matmul_params(cfg) // (cfg.num_layers if remat else 1) + tables) * c
    return kept + head


def cross_scoring_bytes(cfg, d, r, layout: BufferLayout) -> float:
    """Analytic working set of the diagnostics' largest pair set on one device, beyond the
    prefilled cache: each column step gathers its rows' prompt caches (`score_rows` rows at a
    time, else all M, × prompt + continuation slots), runs the continuation (attention scores
    [rows, heads, W, slots]) and projects W tokens per row to the vocabulary (f32 logits,
    exponentials, log-probs; `vocab_chunk` entries at a time). Taken as not split over devices
    (rows are gathered by data-dependent indices): an upper bound."""
    c = 2 if cfg.dtype == "bfloat16" else 4
    kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * c
    vocab = min(cfg.vocab_chunk, cfg.vocab_size) if cfg.vocab_chunk else cfg.vocab_size
    w = layout.generation + 1
    first, last = layout.generation_offset(0), layout.generation_offset(layout.turns - 1)
    m = min(d.num_samples, r.batch)
    sets = [(m, first, w), (m, last, w)]
    if d.per_turn:
        sets.append((d.per_turn_samples, last, w))
    if d.action_grounding:
        sets.append((r.batch, first + layout.generation, d.answer_tokens + 1))
    sets = [(min(rows, d.score_rows or rows), prompt, width) for rows, prompt, width in sets]
    return max(rows * (prompt + width) * kv + rows * cfg.num_heads * width * (prompt + width) * (4 + c)
               + 3 * rows * width * vocab * 4 for rows, prompt, width in sets)


# ----------------------------------------------------------------------------- the plan


@dataclasses.dataclass
class Plan:
    """Everything `plan` measured and estimated (bytes are per device)."""

    model: str
    num_params: int
    mesh: tuple[int, int, int]
    dtype: str
    param_dtype: str
    remat: bool
    micro_batch: int
    layout: BufferLayout
    memory: dict  # name -> bytes per device
    analytic: dict  # name -> bytes per device (what the formulas predict)
    step: dict | None  # the compiled step's memory_analysis (bytes per device) and compile seconds
    flops: dict  # analytic FLOPs per step by phase (whole mesh)
    xla_flops: dict  # piece -> (XLA per device × devices, analytic) for the compiled pieces
    seconds: dict  # compile seconds per piece
    target: str | None = None  # the TPU slice compiled for (`--target v5e-1`), None: the devices present
    chip: dict | None = None  # the target chip's published figures (hbm_bytes, peak_bf16_flops, …)
    costs: dict = dataclasses.field(default_factory=dict)  # piece -> the compiler's cost (per device)
    does_not_fit: dict = dataclasses.field(default_factory=dict)  # program -> {need, available, whole}
    kv_cache: str = "heads_major"  # the stacked KV cache's layout the programs were compiled with (KV_LAYOUTS)

    def estimate(self) -> dict:
        """Peak bytes per device from the parts: the train state, plus the largest of the
        phases' working sets — the rollout's KV cache, the diagnostics' cross-scoring cache
        (both with the compute-dtype copy of the weights they run on), the update's gradients (summed over micro-batches, plus the optimiser's update of the
        same size) and one micro-batch's activations. All analytic (compute dtype, remat as
        configured): XLA's CPU compiler computes bfloat16 in float32 and does not schedule for
        memory the way the TPU/GPU compilers do, so its temporaries are an upper bound."""
        m, a = self.memory, self.analytic
        state = sum(m[k] for k in ("parameters", "optimiser", "critic", "critic optimiser", "reference"))
        phases = {"rollout": a["rollout KV cache"] + a["inference weights"],
                  "diagnostics": a["cross-scoring cache"] + a["cross-scoring working set"] + a["inference weights"],
                  "update": 3 * a["gradients"] + a[f"activations, remat {'on' if self.remat else 'off'}"]}
        phase = max(phases, key=phases.get)
        return {"state": state, "phase": phase, "working set": phases[phase], "peak": state + phases[phase]}

    @property
    def fits(self) -> bool | None:
        """Whether every compiled program fitted the target chip's memory (None: no target)."""
        if self.target is None:
            return None
        return not self.does_not_fit

    @property
    def peak_bytes(self) -> int | None:
        """The whole step's peak per device as its compiler counts it (the need it reported when
        the step did not fit); None when the step was not compiled."""
        if "train step" in self.does_not_fit:
            return self.does_not_fit["train step"]["need"]
        return self.step["peak"] if self.step else None

    def step_time(self) -> dict | None:
        """The compiler's estimate of one step's time on the target (`costs` of the decode step
        and the micro-batch forward+backward, both compiled with every loop unrolled): each
        decode step of the rollout at the decode step's optimal seconds, every other FLOP at the
        rate the compiler gives the forward+backward. None without both pieces or a target."""
        decode, update = self.costs.get("decode step (last turn)"), self.costs.get("micro-batch fwd+bwd")
        if self.chip is None or not decode or not update:
            return None
        devices = math.prod(self.mesh)
        steps = self.layout.turns * self.layout.generation
        decode_flops = steps * self.xla_flops["decode step (last turn)"][1]
        rest = max(self.flops["total"] - decode_flops, 0.0) / devices
        decode_seconds = steps * self.piece_seconds(decode)
        seconds = decode_seconds + rest * self.piece_seconds(update) / update["flops"]
        mfu = self.flops["total"] / devices / seconds / self.chip["peak_bf16_flops"]
        return {"seconds": seconds, "decode seconds": decode_seconds, "mfu": mfu}

    def piece_seconds(self, cost: dict) -> float:
        """A piece's time on the target chip: the compiler's optimal seconds where it gives them
        (it answers a negative number where it has none), else the roofline of its FLOPs and
        bytes accessed against the chip's bfloat16 peak and HBM bandwidth."""
        if cost["optimal_seconds"] > 0:
            return cost["optimal_seconds"]
        return max(cost["flops"] / self.chip["peak_bf16_flops"], cost["bytes accessed"] / self.chip["hbm_bytes_per_second"])

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["layout"]["length"] = self.layout.length
        out["estimate"] = self.estimate()
        out["fits"] = self.fits
        out["peak_bytes"] = self.peak_bytes
        out["step_time_estimate"] = self.step_time()
        return out


_ABSTRACT = {}


def abstract_model(cfg):
    """`nnx.eval_shape` of the policy `Decoder` of model config `cfg` (cached: tracing the
    initialisers of a 7B model takes seconds)."""
    from flax import nnx

    from ragen_jax.models.decoder import Decoder

    if cfg not in _ABSTRACT:
        _ABSTRACT[cfg] = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    return _ABSTRACT[cfg]


def _bytes(tree) -> int:
    """Bytes one device holds of a tree of ShapeDtypeStructs with shardings."""
    from ragen_jax.core.sharding import device_bytes

    return device_bytes(tree)


def _text_setup(run, cfg):
    """env, env params, codec and prompt for the run, with the model's tokenizer."""
    from ragen_jax.envs import registry
    from ragen_jax.models import hf
    from ragen_jax.core.errors import ConfigError
    from ragen_jax.text.codec import TextCodec
    from ragen_jax.text.prompt import PromptTemplate

    env, env_params = registry.make(run.env_name, **run.env_overrides)
    try:
        path = run.settings.model.path
        tokenizer = hf.load_tokenizer(path) if path else hf.load_tokenizer()
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.path={path!r}: {str(err).splitlines()[0]}") from None
    per_turn = run.step.rollout.max_actions_per_turn
    codec = TextCodec.build(tokenizer, env, per_turn, vocab_size=cfg.vocab_size, env_params=env_params)
    prompt = PromptTemplate.build(tokenizer, env, per_turn)
    return env, env_params, codec, prompt


def model_config(config, preset: str | None):
    """The model's shapes: `model.path`'s config (config.json or a GGUF file's metadata; no
    weights read), or a preset."""
    from ragen_jax.models import hf
    from ragen_jax.models.config import PRESETS, DecoderConfig
    from ragen_jax.run.config import ConfigError, model_options

    m = config.model
    numerics = model_options(config)
    if m.path:
        try:
            hf_config, _, where = hf.open_checkpoint(m.path)
        except (OSError, ValueError) as err:
            raise ConfigError(f"model.path={m.path!r}: {str(err).splitlines()[0]}") from None
        try:
            return hf.config_from_hf(hf_config, where, **numerics), os.path.basename(m.path.rstrip("/"))
        except (ValueError, KeyError) as err:
            raise ConfigError(f"{where}: {err}") from None
    name = preset or (m.preset if m.preset in PRESETS else "")
    if not name:
        raise ConfigError("model.path is required by this config: a local Hugging Face checkpoint directory (only "
                          "its config.json and tokenizer are read), or plan a preset's shapes with --model "
                          f"{'|'.join(n for n in PRESETS if n.startswith('qwen'))}")
    if name not in PRESETS:
        raise ConfigError(f"--model {name!r} is not a known preset; allowed: {', '.join(PRESETS)}")
    return DecoderConfig.preset(name, **numerics), name


PIECES = ("remat-on", "remat-off", "update", "decode")


def plan(config, mesh_shape, preset: str | None = None, compile_step: bool = True, pieces=PIECES,
         log=lambda *a: None, target=None) -> Plan:
    """Build the train step of `config` abstractly on a `mesh_shape` mesh and measure it. The
    mesh is of the devices present (fake CPU devices from `main`), or with `target` (a
    `tpu_targets.Target`) of that TPU slice's chips, compiled by the TPU compiler; `mesh_shape`
    None there: the config's mesh over all its chips. `pieces`: which of the micro-batch
    forward+backward's memory ("remat-on", "remat-off") and the compiler's cost of it
    ("update") and of a decode step ("decode") to compile (`_pieces`)."""
    import jax

    from ragen_jax.analysis import tpu_targets

    if target is not None:
        with not_written_to_disk_cache():
            return _plan(config, mesh_shape, preset, compile_step, pieces, log, target,
                         tpu_targets.compile_only_devices(target))
    devices = jax.devices()  # the devices present; on a TPU host, its slice
    return _plan(config, mesh_shape, preset, compile_step, pieces, log, tpu_targets.attached_target(devices),
                 devices)


@contextlib.contextmanager
def not_written_to_disk_cache():
    """Programs compiled for devices that are not attached cannot be loaded back from jax's
    persistent compilation cache (reading one warns): none is written there meanwhile."""
    import jax

    before = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
    try:
        yield
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before)


def _plan(config, mesh_shape, preset, compile_step, pieces, log, target, devices) -> Plan:
    """`plan` on `devices`, those of `target` (None: not a TPU slice)."""
    from ragen_jax.models.cache import stores_heads_minor

    cfg, name, mesh, trainer, layout, _ = abstract_trainer(config, mesh_shape, preset, devices)
    mesh_shape = tuple(mesh.shape[a] for a in ("data", "fsdp", "tensor"))
    step_config, algo = trainer.config, trainer.config.algo
    state = trainer.abstract_state(abstract_model(cfg))  # weights and moments placed by the mesh's rules
    memory = {
        "parameters": _bytes(state.policy),
        "optimiser": _bytes(state.policy_opt),
        "critic": _bytes(state.critic) if state.critic is not None else 0,
        "critic optimiser": _bytes(state.critic_opt) if state.critic is not None else 0,
        "reference": _bytes(state.reference) if state.reference is not None else 0,
    }
    analytic = _analytic_memory(cfg, step_config, layout, mesh)
    seconds, xla_flops, costs, does_not_fit = {}, {}, {}, {}
    if pieces:
        log(f"compiling the pieces ({', '.join(pieces)}) ...")
        piece = _pieces(cfg, mesh, state.policy, layout, algo.micro_batch, step_config.rollout.batch, seconds,
                        pieces)
        memory.update(piece["memory"])
        xla_flops.update(piece["flops"])
        costs.update(piece["costs"])
        does_not_fit.update(piece["does_not_fit"])
    step = None
    if compile_step:
        where = f"for {target.name}" if target is not None else f"on {mesh.size} devices"
        log(f"compiling the whole train step {where} (--no-step skips it) ...")
        step, oom = compile_train_step(trainer, state, mesh, seconds)
        if oom:
            does_not_fit["train step"] = oom
    chip = None
    if target is not None:
        chip = {"name": target.chip.generation, "device_kind": mesh.devices.flat[0].device_kind,
                "chips": target.chips, "hbm_bytes": target.chip.hbm_bytes,
                "peak_bf16_flops": target.chip.peak_bf16_flops,
                "hbm_bytes_per_second": target.chip.hbm_bytes_per_second}
    return Plan(model=name, num_params=cfg.num_params(), mesh=tuple(mesh_shape), dtype=cfg.dtype,
                param_dtype=cfg.param_dtype, remat=cfg.remat, micro_batch=algo.micro_batch, layout=layout,
                memory=memory, analytic=analytic, step=step, flops=analytic_flops(cfg, step_config, layout),
                xla_flops=xla_flops, seconds=seconds, target=target.name if target is not None else None,
                chip=chip, costs=costs, does_not_fit=does_not_fit,
                kv_cache="heads_minor" if stores_heads_minor(cfg) else "heads_major")


def compiled_or_oom(compile_fn):
    """(compile_fn(), None), or (None, {need, available, whole, compiler}) when the TPU compiler found
    that the program does not fit the chip's memory; other errors propagate."""
    from ragen_jax.analysis.tpu_targets import out_of_memory

    try:
        return compile_fn(), None
    except Exception as err:  # jax raises its runtime error type for compiler failures
        oom = out_of_memory(str(err))
        if oom is None:
            raise
        need, available, whole = oom
        # the compiler's account (its largest allocations, where it gives them) for the JSON
        return None, {"need": need, "available": available, "whole": whole, "compiler": str(err)[:20000]}


def _cost(compiled) -> dict:
    """The compiler's cost analysis of a compiled program (per device): FLOPs, bytes accessed
    and, from the TPU compiler, its optimal seconds."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0]
    return {"flops": float(analysis.get("flops", math.nan)),
            "bytes accessed": float(analysis.get("bytes accessed", math.nan)),
            "optimal_seconds": float(analysis.get("optimal_seconds", math.nan))}


def abstract_trainer(config, mesh_shape, preset: str | None, devices=None):
    """The run of `config` on a `mesh_shape` mesh of the first of `devices` (default: the
    devices present; `mesh_shape` None: the config's mesh over all of them), with the model
    built abstractly: (model config, model name, mesh, `Trainer`, token-buffer layout, the
    built run config)."""
    import jax

    from ragen_jax.core import sharding
    from ragen_jax.models.cache import layout_for
    from ragen_jax.run.config import ConfigError, build
    from ragen_jax.run.experiment import resolved_micro_batch
    from ragen_jax.training.step import Trainer

    devices = list(devices if devices is not None else jax.devices())
    if mesh_shape is not None:
        need = math.prod(mesh_shape)
        if need > len(devices):
            fresh = "" if devices[0].platform == "tpu" else (
                " (run the plan in a fresh process: it makes as many fake CPU devices as the mesh needs)")
            raise ConfigError(f"--mesh {'x'.join(map(str, mesh_shape))} needs {need} devices; "
                              f"{'the target has' if devices[0].platform == 'tpu' else 'this process has'} "
                              f"{len(devices)}{fresh}")
        devices = devices[:need]
    config = config.copy_and_resolve_references()
    with config.unlocked():  # "auto" as the target's backend would pick it (this process may be a CPU's)
        if config.model.get("kv_layout", "auto") == "auto":
            config.model.kv_layout = layout_for(devices[0].platform)
    cfg, name = model_config(config, preset)
    with config.unlocked():
        if mesh_shape is not None:
            config.mesh.update(data=mesh_shape[0], fsdp=mesh_shape[1], tensor=mesh_shape[2])
        if not config.model.path:
            config.model.preset = name
    run = build(config, len(devices))
    mesh = sharding.make_mesh(run.mesh_shape, devices)
    env, env_params, codec, prompt = _text_setup(run, cfg)
    model = abstract_model(cfg)
    run = resolved_micro_batch(run, model, env, env_params, codec, prompt, mesh)  # "auto": the number it compiles with
    trainer = Trainer(run.step, model, env, env_params, codec, prompt, mesh)
    return cfg, name, mesh, trainer, buffer_layout(env, env_params, codec, prompt, run.step.rollout), run


def _analytic_memory(cfg, step_config, layout: BufferLayout, mesh) -> dict:
    """What the formulas predict one device holds: the train state's parts, the rollout's KV
    cache, the compute-dtype weights, the diagnostics' cache and working set, the gradients
    and one micro-batch's activations with and without remat."""
    import jax.numpy as jnp

    from ragen_jax.core import sharding

    rcfg, algo, diagnostics = step_config.rollout, step_config.algo, step_config.diagnostics
    row_shards = sharding.row_shards(mesh)
    local_rows = rcfg.batch // row_shards
    model_shards = mesh.shape["fsdp"] * mesh.shape["tensor"]
    compute = jnp.dtype(cfg.dtype).itemsize
    kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * compute  # bytes per cached slot and row
    param_bytes = jnp.dtype(cfg.param_dtype).itemsize
    head_params = (1 if cfg.tie_word_embeddings else 2) * cfg.vocab_size * cfg.hidden_size
    from ragen_jax.models import lora

    adapters = lora.adapter_count(cfg) * param_bytes / model_shards  # LoRA's trained weights (0 without)
    base_bytes = compute if cfg.lora.rank else param_bytes  # LoRA keeps the frozen base in the compute dtype
    params = cfg.num_params() * base_bytes / model_shards + adapters
    critic = (cfg.num_params() * base_bytes + cfg.hidden_size * param_bytes) / model_shards + adapters \
        if algo.uses_critic else 0
    trained = adapters if cfg.lora.rank else params  # what the optimiser and the gradients cover
    # the moments in the parameters' dtype, or in bfloat16 (`algo.adam_moments`)
    moment_share = 2 / param_bytes if algo.adam_moments == "bfloat16" else 1
    critic_trained = (adapters + cfg.hidden_size * param_bytes / model_shards if cfg.lora.rank else critic)
    analytic = {
        "parameters": params,
        "optimiser": 2 * trained * moment_share,  # AdamW: two moments
        "critic": critic,
        "critic optimiser": 2 * critic_trained * moment_share if algo.uses_critic else 0,
        "reference": params if algo.uses_reference and not cfg.lora.rank else 0,
        "rollout KV cache": local_rows * layout.length * kv,
        # the copy of the weights in the compute dtype the rollout and diagnostics run on (`for_inference`)
        # (stored in the compute dtype: no copy; the embedding/head whole on every device)
        "inference weights": ((((lora.adapter_count(cfg) if cfg.lora.rank else cfg.num_params()) / model_shards)
                               if cfg.param_dtype != cfg.dtype else 0)
                              + head_params * (1 - 1 / model_shards)) * compute,
        "cross-scoring cache": (local_rows * layout.generation_offset(layout.turns - 1) * kv
                                if diagnostics is not None else 0),
        "cross-scoring working set": (cross_scoring_bytes(cfg, diagnostics, rcfg, layout)
                                      if diagnostics is not None else 0),
        "gradients": trained,
    }
    micro_rows = max(1, algo.micro_batch // row_shards)
    for remat in (True, False):
        analytic[f"activations, remat {'on' if remat else 'off'}"] = activation_bytes(
            cfg, micro_rows, layout.length, layout.turns * layout.generation, remat, sharded=model_shards > 1)
    return analytic


def compile_train_step(trainer, state, mesh, seconds: dict) -> tuple[dict | None, dict | None]:
    """Compile the whole train step for `state`'s shardings: (its `memory_figures` or None, and
    None or what the TPU compiler said it needs when it does not fit). Adds to `seconds` its
    compile time and the two parts of it: tracing the step into HLO (this project's Python) and
    XLA's compiler."""
    import jax

    from ragen_jax.core import sharding

    shardings = jax.tree.map(lambda x: x.sharding, state)
    started = time.perf_counter()
    with sharding.tracing_on(mesh):
        lowered = jax.jit(trainer.step_fn, donate_argnums=0, out_shardings=(shardings, sharding.replicated(mesh))
                          ).lower(state, trainer.codec, trainer.prompt)
    seconds["train step: tracing to HLO"] = time.perf_counter() - started
    compiled, oom = compiled_or_oom(lowered.compile)
    seconds["train step"] = time.perf_counter() - started
    seconds["train step: XLA compiler"] = seconds["train step"] - seconds["train step: tracing to HLO"]
    if compiled is None:
        return None, oom
    return memory_figures(compiled), None


def _compile_seconds(seconds: dict) -> str:
    """"412 s: 35 s tracing to HLO, 377 s in XLA's compiler" (the parts where they were timed)."""
    whole = f"{seconds.get('train step', 0):.0f} s"
    if "train step: tracing to HLO" not in seconds:
        return whole
    return (f"{whole}: {seconds['train step: tracing to HLO']:.0f} s tracing to HLO, "
            f"{seconds['train step: XLA compiler']:.0f} s in XLA's compiler")


def memory_figures(compiled) -> dict:
    """A compiled program's memory per device from its compiler: arguments, outputs, aliased,
    temporaries, and the peak — for a TPU the compiler's own (`peak_memory_in_bytes`: the
    buffers live at once), elsewhere arguments + outputs − aliased + temporaries (XLA CPU's
    `peak_memory_in_bytes` leaves the temporaries out)."""
    import jax

    stats = compiled.memory_analysis()
    memory = {name: int(getattr(stats, f"{name}_size_in_bytes")) for name in ("argument", "output", "alias", "temp")}
    shardings = jax.tree.leaves(compiled.input_shardings)
    on_tpu = bool(shardings) and next(iter(shardings[0].device_set)).platform == "tpu"
    compiler_peak = int(getattr(stats, "peak_memory_in_bytes", 0)) if on_tpu else 0
    memory["peak"] = compiler_peak or memory["argument"] + memory["output"] - memory["alias"] + memory["temp"]
    return memory


def _pieces(cfg, mesh, policy, layout: BufferLayout, micro: int, batch: int, seconds: dict, which) -> dict:
    """Compile the pieces the step repeats. "remat-on" / "remat-off": the policy's
    forward+backward on one micro-batch as configured (scanned layers, chunked vocabulary), with
    and without rematerialisation: its per-device temporaries, arguments and gradients.
    "update" and "decode": the compiler's cost (FLOPs, bytes accessed, optimal seconds) of that
    forward+backward and of one decode step of the rollout at the last turn, next to the
    analytic FLOPs (whole mesh).

    XLA counts a loop's body once, so costs are counted with every loop of the model unrolled
    (layers not scanned, the vocabulary in one piece): the decode step as it is, the
    forward+backward on the model cut to one or two layers and a vocabulary of 1,024 or 2,048
    entries, from which the real model's cost follows (`_by_shape`): three small compiles take a
    fraction of the time of one of the whole model."""
    import jax
    from flax import nnx

    from ragen_jax.core import sharding
    from ragen_jax.training import micro_batch

    devices = mesh.size
    rows = sharding.ROWS if micro % sharding.row_shards(mesh) == 0 else None
    s, k = layout.length, layout.turns * layout.generation

    def array(shape, dtype, split_rows=True):
        spec = jax.sharding.PartitionSpec(rows if split_rows else None, *([None] * (len(shape) - 1)))
        return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.NamedSharding(mesh, spec))

    mb = micro_batch.micro_batch_inputs(micro, s, k, mesh)
    memory, flops, costs, does_not_fit = {}, {}, {}, {}

    def params_of(model_cfg):
        if model_cfg == dataclasses.replace(cfg, remat=model_cfg.remat):
            return policy
        return micro_batch.abstract_params(nnx.state(abstract_model(model_cfg)), mesh)

    def micro_batch_gradient(model_cfg):
        return micro_batch.compile_gradient(nnx.graphdef(abstract_model(model_cfg)), params_of(model_cfg), mb,
                                            mesh, lora=model_cfg.lora.rank > 0)

    def unrolled(layers, vocab):
        return dataclasses.replace(cfg, scan_layers=False, vocab_chunk=0, num_layers=layers, vocab_size=vocab)

    for remat in (True, False):
        if f"remat-{'on' if remat else 'off'}" not in which:
            continue
        started = time.perf_counter()
        compiled, oom = compiled_or_oom(lambda: micro_batch_gradient(dataclasses.replace(cfg, remat=remat)))
        seconds[f"micro-batch fwd+bwd (remat={remat})"] = time.perf_counter() - started
        if compiled is None:
            does_not_fit[f"micro-batch fwd+bwd, remat {'on' if remat else 'off'}"] = oom
            continue
        stats = compiled.memory_analysis()
        memory[f"activations, remat {'on' if remat else 'off'}"] = int(stats.temp_size_in_bytes)
        if remat == cfg.remat:  # what the compiled piece holds besides its temporaries
            memory["micro-batch arguments"] = int(stats.argument_size_in_bytes)
            memory["micro-batch inputs"] = _bytes(mb)
            memory["gradients"] = int(stats.output_size_in_bytes)

    if "update" in which:
        started = time.perf_counter()
        costs["micro-batch fwd+bwd"] = _by_shape(cfg.num_layers, cfg.vocab_size,
                                                 lambda n, v: micro_batch_gradient(unrolled(n, v)))
        seconds["micro-batch fwd+bwd cost"] = time.perf_counter() - started
        fwd = forward_flops(cfg, micro * s, s, 0)
        head = forward_flops(cfg, 0, 0, micro * k)
        flops["micro-batch fwd+bwd"] = (costs["micro-batch fwd+bwd"]["flops"] * devices,
                                        (4 if cfg.remat else 3) * fwd + 4 * head)
    if "decode" in which:  # the whole model: a decode step compiles quickly, and fuses unlike a shallow one
        started = time.perf_counter()
        whole = unrolled(cfg.num_layers, cfg.vocab_size)
        costs["decode step (last turn)"] = _cost(_compile_decode_step(whole, mesh, params_of(whole), array, rows,
                                                                      layout, batch))
        seconds["decode step cost"] = time.perf_counter() - started
        offset = layout.generation_offset(layout.turns - 1) + layout.generation - 1
        flops["decode step (last turn)"] = (costs["decode step (last turn)"]["flops"] * devices,
                                            forward_flops(cfg, batch, offset + 1, batch))
    return {"memory": memory, "flops": flops, "costs": costs, "does_not_fit": does_not_fit}


def _by_shape(layers: int, vocab: int, compile_with) -> dict:
    """The compiler's cost of a model of `layers` identical layers and a `vocab`-entry
    vocabulary, from small models of the same widths: every layer costs the same, and the
    embedding and head cost in proportion to the vocabulary, so with c(n, v) the _cost of
    `compile_with(n, v)`, cost = c(1, v1) + (layers − 1) Δlayer + (vocab − v1) Δentry, the
    deltas from c(2, v1) and c(1, v2). FLOPs come out within 0.1%; bytes accessed roughly (the
    compiler fuses a small model differently: the 0.5B forward+backward's within 12% on a TPU). An optimal-seconds figure the compiler does not
    give (negative) stays negative."""
    v1 = min(1024, vocab)
    v2 = min(2 * v1, vocab)
    base = _cost(compile_with(1, v1))
    per_layer = _delta(_cost(compile_with(2, v1)), base, 1) if layers > 1 else dict.fromkeys(base, 0.0)
    per_entry = _delta(_cost(compile_with(1, v2)), base, v2 - v1) if v2 > v1 else dict.fromkeys(base, 0.0)
    out = {key: base[key] + (layers - 1) * per_layer[key] + (vocab - v1) * per_entry[key] for key in base}
    if base["optimal_seconds"] < 0:
        out["optimal_seconds"] = -1.0
    return out


def _delta(bigger: dict, base: dict, units: int) -> dict:
    return {key: (bigger[key] - base[key]) / units for key in base}


def _compile_decode_step(cfg, mesh, params, array, rows, layout: BufferLayout, batch: int):
    """One decode step of the rollout at the last turn over the whole batch, compiled for the
    model `cfg` (`params` of it); `array` makes a row-split input, `rows` is the mesh axis the
    rows are split over (or None)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from ragen_jax.models.cache import DecodeContext, init_cache

    graph = nnx.graphdef(abstract_model(cfg))
    kv = jax.eval_shape(lambda: init_cache(cfg, batch, layout.length))
    kv_rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, rows))  # [layers, B, ...]
    cache = kv.replace(k=jax.ShapeDtypeStruct(kv.k.shape, kv.k.dtype, sharding=kv_rows),
                       v=jax.ShapeDtypeStruct(kv.v.shape, kv.v.dtype, sharding=kv_rows), mask=array(kv.mask.shape, bool))
    offset = layout.generation_offset(layout.turns - 1) + layout.generation - 1

    def decode_step(params, cache, token, position, active):
        model = nnx.merge(graph, params)
        hidden, cache = model(token, position, active, DecodeContext(cache, offset, key_limit=offset + 1))
        return model.logits(hidden[:, 0]), cache

    i32 = jnp.int32
    return jax.jit(decode_step).lower(params, cache, array((batch, 1), i32), array((batch, 1), i32),
                                      array((batch, 1), bool)).compile()


# ----------------------------------------------------------------------------- report


def _gib(n: float) -> str:
    return f"{n / 2 ** 30:8.2f} GiB" if n >= 2 ** 28 else f"{n / 2 ** 20:8.1f} MiB"


def _where(p: Plan) -> str:
    d, f, t = p.mesh
    devices = d * f * t
    if p.target is None:
        return f"mesh data={d} fsdp={f} tensor={t} ({devices} fake CPU devices)"
    return (f"mesh data={d} fsdp={f} tensor={t} on {p.target} ({devices} of its {p.chip['chips']} chips, "
            f"{p.chip['device_kind']}, {p.chip['hbm_bytes'] / 2 ** 30:.0f} GiB HBM each; compiled by the TPU compiler)")


def _fit_line(p: Plan) -> list[str]:
    """Whether the target chip holds every compiled program."""
    if p.target is None:
        return []
    if p.fits:
        peak = f": the step's peak {_gib(p.peak_bytes).strip()}" if p.peak_bytes is not None else ""
        return ["", f"fits one {p.chip['device_kind']} chip{peak} (HBM {p.chip['hbm_bytes'] / 2 ** 30:.0f} GiB)"]
    lines = [""]
    for program, oom in p.does_not_fit.items():
        need = _gib(oom["need"]).strip()
        lines.append(f"does not fit: the {program} needs {'' if oom['whole'] else 'more than '}{need} of "
                     f"{_gib(oom['available']).strip()} per chip (the TPU compiler)")
    return lines


def report(p: Plan) -> str:
    compiled_by = "XLA CPU temporaries, bfloat16 run as float32" if p.target is None else "the TPU compiler's temporaries"
    lines = [f"{p.model}: {p.num_params / 1e9:.3f}B parameters ({p.param_dtype}), compute {p.dtype}, remat "
             f"{'on' if p.remat else 'off'}, micro-batch {p.micro_batch}, KV cache {p.kv_cache}; {_where(p)}",
             f"token buffer: {p.layout.length} slots = system {p.layout.system} + {p.layout.turns} turns × "
             f"(observation {p.layout.observation} + generation {p.layout.generation})",
             "", "memory per device             compiled / sharded      analytic"]
    for name in ("parameters", "optimiser", "critic", "critic optimiser", "reference"):
        lines.append(f"  {name:26s} {_gib(p.memory[name])}   {_gib(p.analytic[name])}")
    for name in ("rollout KV cache", "inference weights", "cross-scoring cache", "cross-scoring working set", "gradients",
                 "activations, remat on", "activations, remat off"):
        measured = _gib(p.memory[name]) if name in p.memory else f"{'':12s}"
        lines.append(f"  {name:26s} {measured}   {_gib(p.analytic[name])}")
    lines.append(f"  (activations: one micro-batch's forward+backward; compiled = {compiled_by})")
    e = p.estimate()
    lines += ["", f"estimated peak per device (analytic): {_gib(e['peak']).strip()} = state {_gib(e['state']).strip()} "
                  f"+ the {e['phase']} phase's working set {_gib(e['working set']).strip()}"]
    if p.step:
        s = p.step
        lines += ["", f"whole train step, compiled ({_compile_seconds(p.seconds)}): arguments "
                      f"{_gib(s['argument']).strip()}, outputs {_gib(s['output']).strip()} (aliased "
                      f"{_gib(s['alias']).strip()}), temporaries {_gib(s['temp']).strip()}; peak "
                      f"{_gib(s['peak']).strip()} per device"]
    elif "train step" in p.does_not_fit:
        lines += ["", f"whole train step: compile ended after {_compile_seconds(p.seconds)}, out of memory"]
    lines += _fit_line(p)
    lines += ["", "FLOPs per step (analytic, whole mesh; every group kept, full-length decodes)"]
    for name, value in p.flops.items():
        lines.append(f"  {name:26s} {value:10.3e}" + ("   (one run / compute_freq)" if name == "diagnostics" else ""))
    if p.xla_flops:
        lines += ["", "FLOPs of the compiled pieces          XLA cost analysis    analytic   ratio"]
        for name, (xla, ana) in p.xla_flops.items():
            lines.append(f"  {name:34s} {xla:12.3e} {ana:12.3e}   {xla / ana:5.3f}")
    if p.target is not None and p.costs:
        lines += ["", "the TPU compiler's cost per chip         FLOPs   bytes accessed   seconds"]
        for name, c in p.costs.items():
            how = "optimal" if c["optimal_seconds"] > 0 else "roofline"
            lines.append(f"  {name:34s} {c['flops']:10.3e}   {c['bytes accessed']:10.3e}   {p.piece_seconds(c):9.3e} ({how})")
        t = p.step_time()
        if t is None:
            lines.append("  (--pieces update,decode adds the update's cost and the step-time estimate)")
        else:
            lines.append(f"  step time, the compiler's estimate: {t['seconds']:.1f} s (decoding {t['decode seconds']:.1f} s); "
                         f"MFU {100 * t['mfu']:.0f}% of {p.chip['peak_bf16_flops'] / 1e12:.0f} TFLOP/s bf16")
    return "\n".join(lines)
