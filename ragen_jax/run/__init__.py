"""Running an experiment: the config, building the pieces, checkpoints, devices and meshes, files."""
