#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md in one go, on one CUDA card (about 8 minutes on an H100):
#   bash benchmarks/gpu_check.sh OUT_DIR [BANDWIDTH_TBPS] [SECONDS]
# 1. the real-size train step at Qwen2.5-0.5B's shapes (benchmarks/accelerator_check.py);
# 2. the sampler against transformers `generate` on the same card, same weights, bfloat16,
#    batch 128, a 600-token prompt, 120 new tokens, with the decode's memory-bandwidth bound;
# 3. the train step at Qwen2.5-1.5B's shapes, if the time left allows (SECONDS in all, default 540).
set -u
out=${1:?usage: gpu_check.sh OUT_DIR [BANDWIDTH_TBPS] [SECONDS]}
bandwidth=${2:-3.0}
budget=${3:-540}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")" && pwd)
left() { echo $((budget - SECONDS)); }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/card.txt"
timeout 330 python3 "$here/accelerator_check.py" --json "$out/check_0p5b.json" 2>&1 | tee "$out/check_0p5b.log"
timeout 150 python3 "$here/sampling_throughput.py" --models qwen2.5-0.5b --batch 128 --prompt 600 --new 120 \
  --repeats 3 --cpu-devices 1 --dtype bfloat16 --torch-device cuda --bandwidth-tbps "$bandwidth" 2>&1 \
  | tee "$out/sampling.log"
if [ "$(left)" -gt 120 ]; then
  timeout $(($(left) - 10)) python3 "$here/accelerator_check.py" --model qwen2.5-1.5b --json "$out/check_1p5b.json" \
    2>&1 | tee "$out/check_1p5b.log"
fi
echo "gpu_check: done in ${SECONDS}s"
