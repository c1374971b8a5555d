"""The notebooks run top to bottom on CPU with the tiniest settings, in order, sharing one
workdir: 01 trains 2 steps, 02 trains its toy policies and reads that run's MI metrics back,
03 restores, evaluates and exports that run's checkpoint.

Parameters are injected the way papermill does it: a cell inserted right after the cell tagged
"parameters" reassigns its names. A probe cell appended at the end writes the notebook's own
results (its variables) to a JSON file for the assertions. Kernels run in a subprocess without
the 8 fake CPU devices of the test session (one CPU device, like a laptop)."""

import json
import math
import os
import time
from pathlib import Path

import pytest
from xla_flags import flags_for

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = ("01_quickstart.ipynb", "02_template_collapse.ipynb", "03_evaluate_checkpoint.ipynb")
STEPS = 2
# The smallest run that still exercises everything: rollout, MI diagnostics at every step (first
# turn, trajectory, per turn, action grounding), a PPO update on every group, checkpoints. No
# filtering: 8 tokens never hold a whole answer, so every trajectory earns the same format penalty
# and the default filter would keep no group. Random initial weights instead of the warm start: it
# changes nothing that 8 tokens can show, and a run from the warm start compiles its step twice
# (step 2 as slow as step 1, about 30 s here).
TINY_RUN = {"rollout.num_groups": 2, "rollout.group_size": 2, "rollout.max_turns": 1, "rollout.max_new_tokens": 8,
            "model.init": None, "algo.mini_batch_size": 4, "filter.strategy": "none", "diagnostics.num_samples": 4,
            "diagnostics.per_turn_samples": 2, "diagnostics.answer_tokens": 4, "diagnostics.compute_freq": 1,
            "train.val_every": 0, "eval.num_envs": 2, "mesh.data": 1, "logging.progress": False}
SECONDS = {}  # notebook -> execution time, reported at the end of the module


def parameters_index(nb) -> int:
    tagged = [i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1, f"expected one cell tagged 'parameters', found {len(tagged)}"
    return tagged[0]


def execute(name: str, parameters: dict, where: Path, probe: str | None = None):
    """Run notebook `name` with `parameters` in directory `where`; returns (notebook with outputs,
    the probe's JSON or None)."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    index = parameters_index(nb)
    source = "\n".join(f"{key} = {value!r}" for key, value in parameters.items())
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))
    probe_file = where / f"{Path(name).stem}.probe.json"
    if probe:
        nb.cells.append(nbformat.v4.new_code_cell(f"import json\nwith open({str(probe_file)!r}, 'w') as f:\n"
                                                  f"    json.dump({probe}, f)"))
    env = {**os.environ, "XLA_FLAGS": flags_for(None)}  # one device, as on a laptop
    env["JAX_PLATFORMS"] = "cpu"
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(where)}})
    started = time.perf_counter()
    client.execute(env=env)
    SECONDS[name] = time.perf_counter() - started
    return nb, (json.loads(probe_file.read_text()) if probe else None)


def outputs(nb, output_type=None):
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
            if output_type is None or out.output_type == output_type]


def has_image(nb) -> bool:
    return any("image/png" in out.get("data", {}) for out in outputs(nb))


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    where = tmp_path_factory.mktemp("notebooks")
    yield where
    if SECONDS:
        print("\nnotebook execution times: " + ", ".join(f"{name} {s:.0f} s" for name, s in SECONDS.items()))


@pytest.fixture(scope="module")
def quickstart(shared):
    """Notebook 01 with 2 tiny steps into shared/run (the run 02 and 03 read)."""
    run = shared / "run"
    nb, _ = execute(NAMES[0], {"WORKDIR": str(run), "STEPS": STEPS, "OVERRIDES": TINY_RUN}, shared)
    return nb, run


@pytest.mark.parametrize("name", NAMES)
def test_committed_with_outputs_cleared_and_one_parameters_cell(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    parameters_index(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{name}: clear the outputs before committing"
    first_code = next(cell for cell in nb.cells if cell.cell_type == "code")
    assert "pip" in first_code.source and "jax.devices()" in first_code.source and "make_mesh" in first_code.source
    assert f"colab.research.google.com/github/OWNER/ragen_jax/blob/main/notebooks/{name}" in nb.cells[0].source


def test_quickstart_trains_logs_checkpoints_and_plots(quickstart):
    nb, run = quickstart
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:  # an update and the diagnostics at every step
        assert record["filter/kept_ratio"] == 1.0 and math.isfinite(record["actor/pg_loss"])
        assert math.isfinite(record["mi/first_turn/mi_estimate"]) and "mi/action_reasoning/mi_estimate" in record
    assert json.loads((run / "config.json").read_text())["rollout"]["num_groups"] == 2
    assert str(STEPS) in {p.name for p in (run / "checkpoints").iterdir()}
    assert (run / "training_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert has_image(nb)  # the curves, shown inline
    text = "".join(out.get("text", "") for out in outputs(nb, "stream"))
    assert "exit code 0" in text and "mesh (data, fsdp, tensor) = (1, 1, 1)" in text
    # off a TPU, the plan cell names the command that plans Colab's TPU chip
    assert "cpu runtime: the plan for a TPU chip is `python -m ragen_jax.plan --config " \
           "configs/sokoban_qwen2p5_0p5b_v5e1.py --model qwen2.5-0.5b --target v5e-1`" in text


def test_template_collapse_contrast_and_run_metrics(quickstart, shared):
    _, run = quickstart
    nb, probe = execute(NAMES[1], {"WORKDIR": str(run)}, shared,
                        probe='{"results": results, "alarms": alarms, "mi_steps": mi_steps}')
    grounded, template = probe["results"]["grounded"], probe["results"]["template"]
    first = "mi/first_turn/"
    # the policy that reads its board: MI near log 4, its boards retrieved from its reasoning
    assert grounded[first + "mi_estimate"] > 0.8 * math.log(4)
    assert grounded[first + "retrieval_acc"] >= 0.9
    # the template: no MI at all, retrieval no better than chance, yet the higher entropy
    assert abs(template[first + "mi_estimate"]) < 1e-5
    assert template[first + "retrieval_above_chance"] < 0.2
    assert template[first + "reasoning_token_entropy"] > grounded[first + "reasoning_token_entropy"] + 0.5
    for metrics in (grounded, template):  # H(Z) = H(Z|X) + I(X;Z), as estimated
        assert metrics[first + "reasoning_entropy_est"] == pytest.approx(
            metrics[first + "conditional_entropy_est"] + metrics[first + "mi_estimate"], abs=1e-5)
    assert probe["alarms"] == [0.0, 0.0, 1.0]  # grounded, grounded, then the template: the alarm fires
    assert probe["mi_steps"] == list(range(1, STEPS + 1))  # part 2 read the run's MI metrics back
    assert has_image(nb)


def test_evaluate_checkpoint_shows_episodes_and_exports(quickstart, shared):
    import safetensors.numpy

    _, run = quickstart
    hf_dir = shared / "hf"
    nb, probe = execute(NAMES[2], {"WORKDIR": str(run), "EPISODES": 2, "SAMPLES": 2, "SHOW": 2,
                                   "EXPORT_DIR": str(hf_dir)}, shared,
                        probe='{"step": step, "logit_difference": logit_difference, "episodes": episodes, '
                              '"new_tokens": int(generated.shape[1] - len(ids))}')
    assert probe["step"] == STEPS
    result = json.loads((run / f"eval_{STEPS}.json").read_text())
    assert result["step"] == STEPS and result["episodes"] == 2 and result["samples_per_env"] == 2
    assert 0.0 <= result["metrics"]["success"] <= result["metrics"]["pass@k"] <= 1.0
    assert "mi/first_turn/mi_estimate" in result["metrics"]
    assert (run / f"eval_{STEPS}_trajectories.txt").is_file()
    assert probe["episodes"].count("Trajectory ") == 2 and "Turn 1" in probe["episodes"]
    assert has_image(nb)  # the starting boards
    # the export: a Hugging Face checkpoint that transformers loaded and ran, with the JAX model's logits
    assert {"config.json", "tokenizer.json"} <= {p.name for p in hf_dir.iterdir()}
    weights = {}
    for file in hf_dir.glob("*.safetensors"):
        weights.update(safetensors.numpy.load_file(file))
    assert "model.embed_tokens.weight" in weights
    assert probe["logit_difference"] < 1e-4
    assert probe["new_tokens"] > 0
