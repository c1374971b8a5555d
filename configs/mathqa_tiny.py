"""The CPU default on dataset-backed math QA: 1000 generated arithmetic word problems (no data
file needed; set --config.env.data_path=metamathqa.jsonl for MetaMathQA records), two attempts
per question (a correct answer pays 1, then 1/2), the built-in tiny model. Needs the optional
extra: pip install 'ragen-jax[datasets]'."""

from ragen_jax.run.config import tiny_cpu_config


def get_config():
    c = tiny_cpu_config("MathQA")
    c.env.update(num_records=1000, max_attempts=2)
    c.rollout.update(max_turns=2, max_actions_per_turn=1, max_actions_per_traj=2)
    return c
