"""Reading runs and sizes: the reproduction study (its runs, report and statistics), task
ceilings, the planner, training curves."""
