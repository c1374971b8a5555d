"""The commands: one module per `python -m ragen_jax.<command>` (train, evaluate, export, plot, plan, sft)."""
