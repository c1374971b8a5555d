"""The training step (rollout → diagnostics → filter → advantages → update), validation, the loop
that runs it, and the supervised warm start."""
