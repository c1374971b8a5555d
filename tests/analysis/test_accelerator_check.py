"""benchmarks/accelerator_check.py --tiny: the real-size check's table on the CPU, with the tiny
model (the same programs: scanned layers, vocabulary chunks, blocked diagnostics)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import accelerator_check  # noqa: E402


def test_tiny_check_prints_every_figure(tmp_path, capsys):
    """With an override, as benchmarks/gpu_check.sh A/Bs one: the fused attention through the
    whole step (scanned layers, remat, diagnostics)."""
    out = tmp_path / "check.json"
    assert accelerator_check.main(["--tiny", "--steps", "1", "--peak-tflops", "0.17", "--json", str(out),
                                   "--set", "model.attention=xla"]) == 0
    row = json.loads(out.read_text())
    printed = capsys.readouterr().out
    for label in ("backend / device", "whole step compile", "rollout alone", "train step", "peak device memory",
                  "logits vs float32 CPU forward"):
        assert label in printed
    assert row["backend"] == "cpu" and row["compile_s"] > 0 and row["overrides"] == "model.attention=xla"
    assert row["rollout_tokens_per_s"] > 0 and row["step_s"] > 0 and row["step1_s"] > 0
    assert row["kept_rows"] == 8  # every group updated
    assert row["micro_batch"] == 4 and "micro-batch | 4 rows" in printed  # the tiny check's own number
    assert 0 < row["mfu"] and np.isfinite(row["mfu"])
    assert row["memory_source"] == "compiled analysis" and row["peak_memory_gib"] > 0
    assert row["logits_max_abs_diff"] <= 1e-4  # float32 compute on the CPU: the same forward


def test_known_peaks_match_device_kinds():
    assert accelerator_check.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert accelerator_check.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert accelerator_check.peak_tflops("TPU v5 lite") == 197.0
    assert accelerator_check.peak_tflops("cpu") is None


@pytest.mark.parametrize("argv, message", [(["--steps", "0"], "--steps=0 must be >= 1"),
                                           (["--model", "qwen9"], "qwen9"),
                                           (["--set", "model.attention"], "expected KEY=VALUE"),
                                           (["--tiny", "--set", "model.attention=flash"],
                                            "model.attention='flash' is not supported")])
def test_bad_arguments_end_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        accelerator_check.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
