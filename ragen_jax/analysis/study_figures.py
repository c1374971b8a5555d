"""The study's figure: one per env, validation success, training success and MI-ZScore over
steps, one line per arm (the mean over its seeds at each step)."""

from __future__ import annotations

from pathlib import Path

from ragen_jax.analysis import study as st

# The figure's panels (metric, title), left to right.
FIGURE_PANELS = ((st.VAL_SUCCESS, "validation success (fixed levels)"),
                 (st.SUCCESS, "training success (5-step mean)"), (st.MI_ZSCORE, "MI-ZScore (first turn)"))


def figure_lines(arms: dict[str, list[list[dict]]], start: float | None = None) -> dict[str, dict[str, tuple]]:
    """{metric: {arm: (steps, values)}} for the study figure: the mean over seeds at each step;
    training success as a 5-step moving average (single steps are noisy); validation success
    from the initial policy's `start` at step 0 when it is known (every arm starts there)."""
    import numpy as np

    lines: dict[str, dict[str, tuple]] = {key: {} for key, _ in FIGURE_PANELS}
    for arm, runs in sorted(arms.items()):
        for key, _ in FIGURE_PANELS:
            by_step: dict[int, list[float]] = {}
            for records in runs:
                for step, v in st.finite_series(st.trained(records), key):  # step 0: `start`, the same for all
                    by_step.setdefault(step, []).append(v)
            steps = sorted(by_step)
            values = [float(np.mean(by_step[s])) for s in steps]
            if key == st.SUCCESS and len(values) >= 5:
                values = list(np.convolve(values, np.ones(5) / 5, mode="valid"))
                steps = steps[4:]
            if key == st.VAL_SUCCESS and start is not None:
                steps, values = [0, *steps], [float(start), *values]
            lines[key][arm] = (steps, values)
    return lines


def draw_figure(env: str, arms: dict[str, list[list[dict]]], folder: Path, start: float | None = None) -> Path:
    """`folder/study_<env>.png`. Runs of one seed draw the same levels at each step, so the
    training success of all arms rises and falls together; validation is on fixed levels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = figure_lines(arms, start)
    fig, axes = plt.subplots(1, len(FIGURE_PANELS), figsize=(14, 3.6))
    for ax, (key, title) in zip(axes, FIGURE_PANELS):
        for arm, (steps, values) in lines[key].items():
            ax.plot(steps, values, label=arm, marker="o" if key != st.SUCCESS else None, markersize=3)
        ax.set(title=f"{env}: {title}", xlabel="step")
    if start is not None:
        axes[0].axhline(start, color="grey", linestyle=":", linewidth=1, label="initial policy")
    axes[0].legend(fontsize=8)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"study_{env}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
