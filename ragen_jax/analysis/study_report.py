"""The study's report: Markdown tables from the finished runs under a study's folder, and its figures.

`report_text` puts together, each where its runs exist: the per-arm table, the initial policy's
validation, the claims (paired per-seed differences between filters with bootstrap and t
intervals), the stochasticity trends (slip and reward noise), the diagnostics as predictors of
validation success, and the gradient norms by reward-std bucket. The statistics are
`ragen_jax.analysis.study`'s; a verdict is given only where the intervals exclude 0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ragen_jax.analysis import study as st
from ragen_jax.analysis.run_records import load_runs, records, write_whole
from ragen_jax.analysis.study_arms import ALGOS, ENVS, config_success_rate
from ragen_jax.analysis.study_figures import draw_figure

COMPARISONS = (("top_p", "none"), ("top_p", "top_k"), ("top_k", "none"))
PAPER_MID_RANGE = (0.05, 0.5)  # the random-reward fractions where the paper finds filtering helps most


def _fmt(value: float, digits: int = 3) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _signed(value: float, digits: int = 3) -> str:
    return "—" if math.isnan(value) else f"{value:+.{digits}f}"


def _interval(low: float, high: float, digits: int = 3) -> str:
    return "—" if math.isnan(low) else f"[{low:+.{digits}f}, {high:+.{digits}f}]"


def report(out: Path, figures: Path | None = None) -> None:
    """Markdown tables on stdout from the finished runs under `out`, and with `figures` a figure
    per env in that folder (main's arms: one line each)."""
    runs = load_runs(out)
    if not runs:
        raise SystemExit(f"no finished runs under {out} (expected <env>/<arm>/seed<k>/metrics.jsonl)")
    print(report_text(runs, out))
    if figures:
        for env in sorted({env for env, _ in runs}):
            start_file = out / env / "start_validation.json"  # a study's initial policy, shared by its arms
            start = json.loads(start_file.read_text())["success"] if start_file.exists() else None
            arms = {arm: list(seeds.values()) for (e, arm), seeds in runs.items() if e == env and "-" in arm
                    and arm.split("-", 1)[1] in ALGOS}
            if arms:
                path = draw_figure(env, arms, figures, start)
                print(f"\nfigure: {path}")


def write_report(out: Path) -> None:
    """`<out>/report.md` from the runs finished so far (the study calls it after every run)."""
    runs = load_runs(out)
    if runs:
        write_whole(out / "report.md", report_text(runs, out) + "\n")


def report_text(runs, out: Path) -> str:
    """The report of `runs` (`load_runs`'s) from the study folder `out`: its tables and trends,
    each one only where it has runs to show."""
    return "\n\n".join(part for part in (arm_table(runs), start_table(out), claims_table(runs), noise_trend(runs),
                                          reward_noise_trend(runs),
                                          predictors_table(runs), gradients_table(runs)) if part)


def arm_table(runs) -> str:
    """Per arm, over its finished seeds: mean with the seeds' range."""
    columns = ["final_validation", "first_success", "peak_success", "final_mi_zscore", "mean_retrieval_acc",
               "mean_kept_ratio", "mean_step_seconds"]
    lines = ["Per arm (finished seeds; mean, and the seeds' range). final_validation: the mean of a run's last "
             "3 validations.", "", "| env | arm | seeds | " + " | ".join(columns) + " |",
             "|" + " --- |" * (len(columns) + 3)]
    for (env, arm), seeds in sorted(runs.items()):
        rows = [{**st.summarise_run(r), "final_validation": st.final_validation(r)} for r in seeds.values()]
        cells = []
        for c in columns:
            values = [row[c] for row in rows if not math.isnan(row[c])]
            mean = sum(values) / len(values) if values else math.nan
            spread = f" ({_fmt(min(values))}–{_fmt(max(values))})" if len(values) > 1 else ""
            cells.append(_fmt(mean) + spread)
        lines.append(f"| {env} | {arm} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def start_table(out: Path) -> str:
    """The initial policy's validation (a study's, shared by its arms; or each learn run's, with
    where the run ended)."""
    starts = sorted(out.glob("**/start_validation.json"))
    if not starts:
        return ""
    lines = ["| run | start validation success (initial policy) | end validation success "
             "| reasoning's player cell right: start → end |", "| --- | ---: | ---: | --- |"]
    for path in starts:
        start = json.loads(path.read_text())
        right = _fmt(start.get("reasoning/player_right", math.nan))
        if not (path.parent / "metrics.jsonl").exists():  # a study's: one initial policy for every arm
            lines.append(f"| {path.parent.relative_to(out)} (initial policy of every arm) | "
                         f"{_fmt(start['success'])} | — | {right} |")
            continue
        end = [r for r in records(path.parent) if "val/success" in r]
        last = end[-1] if end else {}
        lines.append(f"| {path.parent.relative_to(out)} | {_fmt(start['success'])} | "
                     f"{_fmt(last.get('val/success', math.nan))} | "
                     f"{right} → {_fmt(last.get('val/reasoning/player_right', math.nan))} |")
    return "\n".join(lines)


def claims_table(runs) -> str:
    """Paired per-seed differences of final validation success between filters that share
    everything else (the arm's name after the filter), with bootstrap and t 95% intervals over
    seeds; a verdict only where both intervals lie on one side of 0."""
    finals = {key: {seed: st.final_validation(r) for seed, r in seeds.items()} for key, seeds in runs.items()}
    lines = ["Claims: arm A − arm B in final validation success (fixed levels), per seed (the same seed in "
             "both), with 95% intervals of the mean over seeds: the bootstrap's and Student's t (the bootstrap's "
             "is too narrow for a few seeds); the verdict needs both to exclude 0.", "",
             "| env | condition | A − B | seeds | per-seed differences | mean | bootstrap 95% | t 95% | verdict |",
             "| --- | --- | --- | ---: | --- | ---: | --- | --- | --- |"]
    rows = 0
    for env, condition in sorted({(env, arm.split("-", 1)[1]) for env, arm in runs if "-" in arm}):
        for a, b in COMPARISONS:
            if (env, f"{a}-{condition}") not in finals or (env, f"{b}-{condition}") not in finals:
                continue
            seeds, diffs = st.paired_differences(finals[env, f"{a}-{condition}"], finals[env, f"{b}-{condition}"])
            if not seeds:
                continue
            mean, low, high = st.mean_difference_interval(diffs)
            _, t_low, t_high = st.mean_t_interval(diffs)
            per_seed = ", ".join(f"{s}: {d:+.3f}" for s, d in zip(seeds, diffs))
            bounds = (low, high, t_low, t_high)
            wider = ((min(low, t_low), max(high, t_high)) if all(map(math.isfinite, bounds))
                     else (math.nan, math.nan))  # no verdict without both intervals
            lines.append(f"| {env} | {condition} | {a} − {b} | {len(seeds)} | {per_seed} | {mean:+.3f} | "
                         f"{_interval(low, high)} | {_interval(t_low, t_high)} | "
                         f"{st.verdict(*wider, f'{a} better', f'{b} better')} |")
            rows += 1
    return "\n".join(lines) if rows else ""


def noise_trend(runs) -> str:
    """The stochasticity claim over all the noise part's rates at once: the slope of Top-p − no
    filter (per seed, final validation) against the slip, 1 − `env.success_rate`, with its t
    interval. The config's own rate is main's arms (no suffix), as in `noise_arms`."""
    env, default = ENVS["noise"][0], config_success_rate()
    slips, diffs = [], []
    for e, arm in sorted(runs):
        suffix = arm[len("top_p-grpo"):]
        partner = "none-grpo" + suffix
        if (e != env or not arm.startswith("top_p-grpo") or (suffix and not suffix.startswith("-success"))
                or (env, partner) not in runs):
            continue
        rate = float(suffix[len("-success"):]) if suffix else default
        _, pairs = st.paired_differences(*({seed: st.final_validation(r) for seed, r in runs[env, key].items()}
                                           for key in (arm, partner)))
        slips += [1.0 - rate] * len(pairs)
        diffs += pairs.tolist()
    if len(set(slips)) < 2:
        return ""
    slope, low, high = st.slope_t_interval(slips, diffs)
    return (f"Stochasticity ({env}, GRPO): Top-p − none against the slip (1 − env.success_rate) over "
            f"{len(diffs)} seed pairs at {len(set(slips))} rates: slope {_signed(slope)} per unit of slip, "
            f"t 95% {_interval(low, high)}: " + st.verdict(low, high, "the filter's difference rises with the slip",
                                                          "the filter's difference falls with the slip"))


def reward_noise_trend(runs) -> str:
    """The paper's stochasticity axis at once: Top-p − no filter (per seed, final validation)
    against `env.reward_noise`: the mean difference per rate with its t interval and its t test's
    p, the paper's claim as one contrast (the paper's 5–50% rates minus the others, per seed at
    every rate), and the slope (p's unadjusted: Holm's correction is over the claims)."""
    env, slug = ENVS["reward_noise"][0], "-rnoise"
    per_rate = {}
    for e, arm in sorted(runs):
        if e != env or not arm.startswith("top_p-grpo" + slug) or (env, "none" + arm[len("top_p"):]) not in runs:
            continue
        q = float(arm.rsplit(slug, 1)[1])
        seeds, pairs = st.paired_differences(*({seed: st.final_validation(r) for seed, r in runs[env, key].items()}
                                               for key in (arm, "none" + arm[len("top_p"):])))
        per_rate[q] = dict(zip(seeds, pairs.tolist()))
    if not per_rate:
        return ""
    noise = [q for q, d in per_rate.items() for _ in d]
    diffs = [v for d in per_rate.values() for v in d.values()]

    def tested(d):
        mean, low, high = st.mean_t_interval(d)
        p = st.mean_t_p(d)
        return (f"{mean:+.3f} ({len(d)} seeds)" + ("" if math.isnan(low) else f", t 95% {_interval(low, high)}")
                + ("" if math.isnan(p) else f", p {p:.2g}"))

    rates = "; ".join(f"q = {q:g}: {tested(list(d.values()))}" for q, d in sorted(per_rate.items()))
    text = f"Random rewards ({env}, GRPO): Top-p − none, mean per rate: {rates}."
    seeds, contrast = st.mid_minus_ends(per_rate, *PAPER_MID_RANGE)
    if len(seeds) >= 2:
        mean, low, high = st.mean_t_interval(contrast)
        text += (f" Mid-range ({PAPER_MID_RANGE[0]:g} ≤ q ≤ {PAPER_MID_RANGE[1]:g}) − the other rates, per seed at "
                 f"every rate: {tested(contrast)}: " + st.verdict(low, high, "the gain peaks mid-range",
                                                                  "the gain is lower mid-range") + ".")
    if len(set(noise)) < 2 or len(diffs) < 3:
        return text
    slope, low, high = st.slope_t_interval(noise, diffs)
    return (text + f" Slope over {len(diffs)} seed pairs: {_signed(slope)} per unit of reward noise, t 95% "
            f"{_interval(low, high)}: " + st.verdict(low, high, "the filter's difference rises with the noise",
                                                     "the filter's difference falls with the noise"))


def predictors_table(runs) -> str:
    """Per env: each MI proxy and entropy against validation success, pooled over every finished
    run with both (main and noise), intervals by resampling runs; then whether first-turn
    MI-ZScore predicts better than each entropy (|ρ| difference on the same resamples). Each
    also centred on the step: runs that all improve make the raw correlation measure training
    progress; centred, it compares runs at the same step."""
    lines = []
    for env in sorted({env for env, _ in runs}):
        env_runs = [r for (e, _), seeds in sorted(runs.items()) if e == env for r in seeds.values()]
        rows = []
        for key, against, name, above, below in (
                *((key, None, key, "positive", "negative") for key in (*st.MI_PROXIES, *st.ENTROPIES)),
                *((st.MI_ZSCORE, entropy, f"\\|ρ(MI-ZScore)\\| − \\|ρ({entropy.rsplit('/', 1)[1]})\\|",
                   "MI-ZScore predicts better", "the entropy predicts better") for entropy in st.ENTROPIES)):
            rho, low, high, points, n = st.run_correlation(env_runs, key, against=against)
            if not points:
                continue
            c_rho, c_low, c_high, _, _ = st.run_correlation(env_runs, key, against=against, centre=True)
            rows.append(f"| {name} | {points} | {n} | {_signed(rho)} | {_interval(low, high)} | "
                        f"{st.verdict(low, high, above, below)} | {_signed(c_rho)} | {_interval(c_low, c_high)} | "
                        f"{st.verdict(c_low, c_high, above, below)} |")
        if rows:
            lines += [f"Diagnostics vs validation success ({env}; Spearman over the validation steps of every "
                      "finished run, pooled, and the same with both sides centred on the step's mean over the "
                      "runs; 95% intervals by resampling runs):", "",
                      "| predictor | points | runs | Spearman | 95% interval | sign | centred | 95% interval | sign |",
                      "| --- | ---: | ---: | ---: | --- | --- | ---: | --- | --- |", *rows, ""]
    return "\n".join(lines).strip()


def gradients_table(runs) -> str:
    """Per (env, arm) with a gradient analysis: the norms by reward-std bucket, and the
    regulariser's share of the gradient (`reg_share`) in the lowest and highest bucket with
    intervals over the measured steps."""
    lines = []
    for (env, arm), seeds in sorted(runs.items()):
        table = st.gradient_buckets(list(seeds.values()))
        if not table:
            continue
        lines += ["", f"Gradient norms by reward-std bucket ({env}, {arm}; 0 = lowest in-group reward std; "
                  "groups: pooled over the measured steps of its runs):", "",
                  "| bucket | steps | groups | task-gradient norm | regularisation-gradient norm | reg / (reg + task) |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: |"]
        steps = st.measured_steps(seeds.values())
        for row in table:
            task, reg = row.get("task_norm", math.nan), row.get("reg_norm", math.nan)
            lines.append(f"| {int(row['bucket'])} | {_fmt(row.get('measurements', math.nan), 0)} | "
                         f"{_fmt(row.get('groups_total', math.nan), 0)} | {_fmt(task, 4)} | {_fmt(reg, 4)} | "
                         f"{_fmt(st.reg_share(steps, int(row['bucket'])), 3)} |")
        low_bucket, high_bucket = int(table[0]["bucket"]), int(table[-1]["bucket"])
        share = lambda b: (lambda steps_: st.reg_share(steps_, b))  # noqa: E731
        cells = []
        for name, statistic in ((f"the regulariser's share in bucket {low_bucket}", share(low_bucket)),
                                (f"in bucket {high_bucket}", share(high_bucket)),
                                ("difference", lambda s: share(low_bucket)(s) - share(high_bucket)(s))):
            value, low, high = st.bootstrap_interval(steps, statistic)
            cells.append(f"{name} {_fmt(value)} {_interval(low, high)}")
        # the last interval is the difference's
        lines += ["", "; ".join(cells) + f" (95% intervals over the {len(steps)} measured steps): "
                  + st.verdict(low, high, "the regulariser weighs more in the low-variance groups",
                               "the regulariser weighs more in the high-variance groups")]
    return "\n".join(lines).strip()
