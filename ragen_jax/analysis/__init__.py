"""Reading runs and sizes: the study's statistics, task ceilings, reasoning checks, the planner, curves."""
