"""The assembly of a run: the config's schema and files, building the pieces, checkpoints, the
training loop."""
