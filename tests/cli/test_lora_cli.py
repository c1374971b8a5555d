"""A LoRA run through the commands: train (checkpoints hold the adapters), evaluate reads them,
export writes merged full weights that transformers loads with the adapted policy's logits, and
--adapters-only writes peft's layout whose merge is the merged export (a run without adapters is
refused: tests/cli/test_train_cli.py)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from ragen_jax.cli import evaluate, export, train
from ragen_jax.models import lora
from ragen_jax.models.cache import positions_from_mask

from commands import CONFIG, SMALL, one_error_line

LORA = ["--config.model.lora.rank=4", "--config.model.lora.alpha=8", "--config.model.scan_layers=true",
        "--config.algo.actor_lr=1e-2", "--config.algo.name=ppo"]  # PPO: GAE moves the adapters even at equal rewards


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("lora")
    assert train.main(["--config", CONFIG, "--workdir", str(workdir), "--config.train.steps=2",
                       "--config.train.save_every=2", "--config.train.val_every=0", *SMALL, *LORA]) == 0
    return workdir


def test_train_evaluate_export_a_lora_run(lora_run, tmp_path):
    from transformers import AutoModelForCausalLM

    from ragen_jax.run.experiment import restore_run

    saved = json.loads((lora_run / "config.json").read_text())
    assert saved["model"]["lora"]["rank"] == 4 and saved["model"]["preset"] == "tiny"  # names the base
    exp, step = restore_run(lora_run)
    assert step == 2 and exp.model.cfg.lora.rank == 4
    b = [x[...] for p, x in nnx.to_flat_state(nnx.state(exp.model, lora.LoRAParam)) if p[-1] == "lora_b"]
    assert b and all(np.abs(np.asarray(x)).max() > 0 for x in b)  # the trained adapters came back

    assert evaluate.main(["--workdir", str(lora_run), "--episodes", "2"]) == 0
    assert (lora_run / "eval_2.json").exists()

    out = tmp_path / "merged"
    assert export.main(["--workdir", str(lora_run), "--out", str(out)]) == 0
    torch_model = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = np.arange(3, 12, dtype=np.int32)[None]
    mask = jnp.ones(ids.shape, bool)
    hidden, _ = exp.model(jnp.asarray(ids), positions_from_mask(mask), mask)
    want = np.asarray(exp.model.logits(hidden))
    import torch

    with torch.no_grad():
        got = torch_model(input_ids=torch.as_tensor(ids, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    adapters = tmp_path / "adapters"
    assert export.main(["--workdir", str(lora_run), "--out", str(adapters), "--adapters-only"]) == 0
    config = json.loads((adapters / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["base_model_name_or_path"]
    tensors = load_file(adapters / "adapter_model.safetensors")
    merged = load_file(out / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    base = np.asarray(nnx.state(lora.adapters_off(exp.model), nnx.Not(lora.LoRAParam))["layers"]["mlp"]["down_proj"]
                      ["kernel"][...])[1].T
    prefix = "base_model.model.model.layers.1.mlp.down_proj"
    np.testing.assert_allclose(merged[name], base + 2.0 * tensors[prefix + ".lora_B.weight"] @ tensors[
        prefix + ".lora_A.weight"], rtol=1e-5, atol=1e-6)


def test_checkpoints_name_their_base_and_a_lora_run_is_no_initial_model(lora_run, tmp_path, capsys):
    base = json.loads((lora_run / "checkpoints" / "2" / "base.json").read_text())
    assert base["model"] == {"model.path": None, "model.init": "builtin:sokoban-tiny", "model.preset": "tiny"}
    assert len(base["fingerprint"]) > 0
    line = one_error_line(capsys, train.main(["--config", CONFIG, "--workdir", str(tmp_path / "w"), *SMALL,
                                              f"--config.model.init={lora_run}"]))
    assert "is a LoRA run: its checkpoints hold adapters" in line and "python -m ragen_jax.export" in line
    assert not (tmp_path / "w").exists()
