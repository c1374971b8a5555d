"""The TPU plans behind README's and docs/scaling.md's fits table: each goal's train step in the
paper's setting (8 groups × 16, 5 turns of 120 tokens, bfloat16, MI diagnostics on) compiled
by the TPU compiler for its Cloud TPU slice (`python -m ragen_jax.plan --target`), one process
each, its JSON under results/tpu_plans/; then the settings tried for the goals that did not fit.

    python benchmarks/tpu_plans.py                   # every plan (hours on 2 CPU cores)
    python benchmarks/tpu_plans.py 0.5b-grpo-v5e-1   # some of them
    python benchmarks/tpu_plans.py --table           # the markdown table of the JSON files present

Needs the TPU compiler: pip install -e ".[tpu]".
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "tpu_plans"
S05, S3 = "configs/sokoban_qwen2p5_0p5b.py", "configs/sokoban_qwen2p5_3b.py"
GRPO, LORA = "--config.algo.name=grpo", "--config.model.lora.rank=16"
BF16_MOMENTS, MICRO4 = "--config.algo.adam_moments=bfloat16", "--config.algo.micro_batch_size=4"
M05, M15, M3, M7 = (["--model", f"qwen2.5-{size}"] for size in ("0.5b", "1.5b", "3b", "7b"))

# name -> (model and algorithm, setting, config, target, the plan's other arguments)
PLANS = {
    "0.5b-grpo-v5e-1": ("0.5B GRPO", "every weight", S05, "v5e-1", [*M05, GRPO]),
    "0.5b-grpo-v5e-1-micro4": ("0.5B GRPO", "every weight, micro-batch 4", S05, "v5e-1", [*M05, GRPO, MICRO4]),
    "0.5b-grpo-v5e-1-bf16moments": ("0.5B GRPO", "every weight, bfloat16 moments", S05, "v5e-1",
                                    [*M05, GRPO, BF16_MOMENTS]),
    "0.5b-ppo-v5e-1": ("0.5B PPO", "every weight", S05, "v5e-1", M05),
    "0.5b-ppo-v5e-1-bf16moments-micro4": ("0.5B PPO", "every weight, bfloat16 moments, micro-batch 4", S05,
                                          "v5e-1", [*M05, BF16_MOMENTS, MICRO4]),
    "0.5b-ppo-v5e-1-bf16moments-nodiag": ("0.5B PPO", "every weight, bfloat16 moments, MI diagnostics off", S05,
                                          "v5e-1", [*M05, BF16_MOMENTS, "--config.diagnostics.enabled=false"]),
    "0.5b-ppo-v5e-1-lora": ("0.5B PPO", "LoRA rank 16", S05, "v5e-1", [*M05, LORA]),
    "0.5b-ppo-v5e-1-bf16-stochastic": ("0.5B PPO", "every weight, bfloat16 weights (stochastic rounding) and moments",
                                       S05, "v5e-1", [*M05, "--config.model.param_dtype=bfloat16", BF16_MOMENTS,
                                                      "--config.algo.weight_rounding=stochastic"]),
    "1.5b-grpo-lora-v5e-1": ("1.5B GRPO", "LoRA rank 16", S05, "v5e-1", [*M15, GRPO, LORA]),
    "3b-ppo-lora-v6e-1": ("3B PPO", "LoRA rank 16", S3, "v6e-1", [*M3, LORA]),
    "3b-ppo-v5e-8": ("3B PPO", "every weight, FSDP", S3, "v5e-8", M3),
    "3b-ppo-v5e-4": ("3B PPO", "every weight, FSDP", S3, "v5e-4", M3),
    "3b-ppo-v5e-4-bf16moments-micro4": ("3B PPO", "every weight, FSDP, bfloat16 moments, micro-batch 4", S3,
                                        "v5e-4", [*M3, BF16_MOMENTS, MICRO4]),
    "3b-ppo-v5e-4-lora": ("3B PPO", "LoRA rank 16, FSDP", S3, "v5e-4", [*M3, LORA]),
    "3b-ppo-v5e-4-bf16-stochastic": ("3B PPO", "every weight, bfloat16 weights (stochastic rounding) and moments, "
                                     "fsdp 2 × tensor 2", "configs/sokoban_qwen2p5_3b_v5e4.py", "v5e-4", M3),
    "7b-grpo-v5e-8": ("7B GRPO", "every weight, FSDP", S3, "v5e-8", [*M7, GRPO]),
    "7b-grpo-v5e-8-bf16moments-micro4": ("7B GRPO", "every weight, FSDP, bfloat16 moments, micro-batch 4", S3,
                                         "v5e-8", [*M7, GRPO, BF16_MOMENTS, MICRO4]),
    "7b-grpo-v5e-8-lora": ("7B GRPO", "LoRA rank 16, FSDP", S3, "v5e-8", [*M7, GRPO, LORA]),
    "7b-ppo-v5e-8-lora": ("7B PPO", "LoRA rank 16, FSDP", S3, "v5e-8", [*M7, LORA]),
    "7b-ppo-v5e-8-lora-micro4": ("7B PPO", "LoRA rank 16, FSDP, micro-batch 4", S3, "v5e-8", [*M7, LORA, MICRO4]),
    "7b-ppo-v5e-8-lora-micro2-score8": ("7B PPO", "LoRA rank 16, FSDP, micro-batch 2, MI scored 8 rows at a time",
                                        S3, "v5e-8", [*M7, LORA, "--config.algo.micro_batch_size=2",
                                                      "--config.diagnostics.score_rows=8"]),
}


def command(name: str) -> list[str]:
    _, _, config, target, args = PLANS[name]
    return [sys.executable, "-m", "ragen_jax.plan", "--config", config, "--target", target, "--pieces=none", *args,
            "--json", str(OUT / f"{name}.json")]


def gib(n: float) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


def row(name: str, plan: dict) -> str:
    """One table row: model and algorithm, setting, slice, the KV cache's layout, the per-chip
    figure, the compile time."""
    model, setting, _, target, _ = PLANS[name]
    seconds = plan["seconds"]["train step"]
    if plan["fits"]:
        step = plan["step"]
        verdict = (f"**fits**: peak {gib(plan['peak_bytes'])} (state {gib(step['argument'])}, "
                   f"temporaries {gib(step['temp'])})")
    else:
        oom = plan["does_not_fit"]["train step"]
        verdict = f"does not fit: needs {'' if oom['whole'] else '> '}{gib(oom['need'])} of {gib(oom['available'])}"
    kv_cache = plan.get("kv_cache", "heads_major").replace("_", "-")  # plans that predate the key: heads-major
    return f"| {model} | {setting} | {target} | {kv_cache} | {verdict} | {seconds:.0f} s |"


def table() -> str:
    lines = ["| model, algorithm | setting | slice | KV cache | per chip, the TPU compiler | compile |",
             "| --- | --- | --- | --- | --- | ---: |"]
    for name in PLANS:
        path = OUT / f"{name}.json"
        if path.exists():
            lines.append(row(name, json.loads(path.read_text())))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if "--table" in argv:
        print(table())
        return 0
    names = argv or list(PLANS)
    unknown = set(names) - set(PLANS)
    if unknown:
        print(f"error: unknown plan(s) {', '.join(sorted(unknown))}; allowed: {', '.join(PLANS)}", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names:
        started = time.perf_counter()
        print(f"== {name}: {' '.join(command(name)[1:])}", flush=True)
        done = subprocess.run(command(name), cwd=ROOT)
        print(f"== {name}: exit {done.returncode} after {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
