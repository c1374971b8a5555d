#!/usr/bin/env bash
# The reproduction study (benchmarks/reproduce.py study) on one CUDA card, for as long as allowed:
#   bash benchmarks/gpu_study.sh OUT_DIR [JOBS] [SECONDS] [STUDY_DIR]
# JOBS runs at a time share the card (default 8: of ten on an 80 GB card one ran out of memory, a run
# holding up to 5 GiB with 3 GiB more for a validation); after SECONDS (default 540) the runs are
# stopped: each ends after its current step (a first step compiles: minutes) with a checkpoint, and
# resumes from it when started again with the same STUDY_DIR.
# Every 30 s, and at the end, OUT_DIR/study.tar.gz is rewritten with what `reproduce.py report`
# reads (metrics, configs, start validations, matched k, the report) and the runs' logs;
# checkpoints stay in STUDY_DIR (default /tmp/study).
set -u
out=${1:?usage: gpu_study.sh OUT_DIR [JOBS] [SECONDS] [STUDY_DIR]}
jobs=${2:-8}
budget=${3:-540}
study=${4:-/tmp/study}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out" "$study"
export PYTHONUNBUFFERED=1

pack() {
  (cd "$study" && find . \( -name metrics.jsonl -o -name config.json -o -name '*.json' -o -name report.md \
    -o -name '*.log' \) -not -path '*/checkpoints/*' -print0 | tar --null -czf "$out/study.tar.gz.part" -T - \
    && mv "$out/study.tar.gz.part" "$out/study.tar.gz")
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/card.txt"
python3 "$here/reproduce.py" study --jobs "$jobs" --envs frozenlake sokoban --out "$study" >"$out/pool.log" 2>&1 &
pid=$!
while kill -0 $pid 2>/dev/null && [ $SECONDS -lt "$budget" ]; do
  sleep 30
  pack
  [ $SECONDS -ge 90 ] && [ $SECONDS -lt 121 ] && nvidia-smi >>"$out/card.txt" 2>&1
done
kill -TERM $pid 2>/dev/null  # the pool passes it on: each running run saves a checkpoint and ends
wait $pid
pack
tail -5 "$out/pool.log"
echo "gpu_study: ${SECONDS}s, $(grep -c ' done ' "$out/pool.log") runs done"
