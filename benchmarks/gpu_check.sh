#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md on one CUDA card, A/B of the efficiency keys, in two
# parts that each fit one device call (a part's checks run only while its time allows):
#   bash benchmarks/gpu_check.sh OUT_DIR [BANDWIDTH_TBPS] [SECONDS] [PART]
# PART 1 (the first call; SECONDS default 540):
#   1. the real-size train step at Qwen2.5-0.5B's shapes (benchmarks/accelerator_check.py), today's defaults;
#   2. the sampler against transformers `generate` on the same card, same weights, bfloat16,
#      batch 128, a 600-token prompt, 120 new tokens, with the decode's memory-bandwidth bound,
#      scanned, then with the layers unrolled (--unroll-inference);
#   3. the step with cuDNN's fused attention (model.attention=cudnn).
# PART 2 (a second call into the same OUT_DIR):
#   4. the step with the rollout's, diagnostics' and validation's layers unrolled while training
#      scans (model.unroll_inference=true);
#   5. the step with the largest micro-batch the compiled memory analysis fits (algo.micro_batch_size=auto);
#   6. the step with XLA's GPU autotuning off (--xla_gpu_autotune_level=0): its compile time;
#   7. the step with the diagnostics scoring only the spans they read (diagnostics.span_buckets=4).
# PART all runs both in order. Each part ends with one table of every check in OUT_DIR so far:
# micro-batch, compile time, step time, MFU and peak memory side by side.
set -u
out=${1:?usage: gpu_check.sh OUT_DIR [BANDWIDTH_TBPS] [SECONDS] [PART: 1, 2 or all]}
bandwidth=${2:-3.0}
budget=${3:-540}
part=${4:-all}
case "$part" in 1|2|all) ;; *) echo "gpu_check: PART=$part must be 1, 2 or all" >&2; exit 2 ;; esac
mkdir -p "$out"
export PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")" && pwd)
left() { echo $((budget - SECONDS)); }

# check NAME MIN_SECONDS MAX_SECONDS [accelerator_check flags]: one step check, if MIN_SECONDS are left
check() {
  local name=$1 need=$2 most=$3
  shift 3
  if [ "$(left)" -lt "$need" ]; then echo "gpu_check: skipped $name ($(left)s left)"; return 1; fi
  local limit=$(( $(left) - 10 < most ? $(left) - 10 : most ))
  timeout "$limit" python3 "$here/accelerator_check.py" --json "$out/check_$name.json" "$@" 2>&1 \
    | tee "$out/check_$name.log"
}

# sample NAME [sampling_throughput flags]: the sampler against transformers, if 100 s are left
sample() {
  local name=$1
  shift
  if [ "$(left)" -le 100 ]; then echo "gpu_check: skipped $name ($(left)s left)"; return 1; fi
  timeout 150 python3 "$here/sampling_throughput.py" --models qwen2.5-0.5b --batch 128 --prompt 600 --new 120 \
    --repeats 3 --cpu-devices 1 --dtype bfloat16 --torch-device cuda --bandwidth-tbps "$bandwidth" \
    --attention einsum "$@" 2>&1 | tee "$out/$name.log"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/card.txt"
if [ "$part" != 2 ]; then
  check 0p5b 200 330
  sample sampling
  sample sampling_unrolled --unroll-inference
  check 0p5b_cudnn 200 330 --set model.attention=cudnn
fi
if [ "$part" != 1 ]; then
  check 0p5b_unrolled 200 330 --set model.unroll_inference=true
  check 0p5b_auto 260 420 --set algo.micro_batch_size=auto  # the search compiles a few forward+backward passes first
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" check 0p5b_autotune0 200 330
  check 0p5b_spans 200 330 --set diagnostics.span_buckets=4
fi
python3 - "$out" <<'PY'
import json, pathlib, sys
rows = [json.loads(p.read_text()) | {"name": p.stem[len("check_"):]} for p in sorted(pathlib.Path(sys.argv[1]).glob("check_*.json"))]
print("| check | overrides | micro-batch | compile s | step s | step 1 s | MFU | peak GiB |\n"
      "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    mfu = "n/a" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
    print(f"| {r['name']} | {r.get('overrides', 'none')} | {r.get('micro_batch', '?')} | {r['compile_s']:.0f} | "
          f"{r['step_s']:.2f} | {r['step1_s']:.2f} | {mfu} | {r['peak_memory_gib']:.1f} |")
PY
echo "gpu_check: done in ${SECONDS}s"
