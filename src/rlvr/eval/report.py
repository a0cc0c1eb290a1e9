"""`rlvr report RUN_DIR`: one self-contained HTML page about a run, plus its plots as PNG files.

Reads what a run leaves behind, each part optional:

    metrics.jsonl   -> plots over steps (reward and eval avg@k, response length, loss, entropy,
                       KL, clip fraction, sampler-trainer logprob gap, stacked time breakdown)
                       and a table of the eval metrics
    summary.json    -> shown as is
    config.yaml     -> the resolved config, shown as is
    eval/**/*.jsonl -> per sample file: metrics with standard errors, the per-problem table,
                       the best and worst samples by reward

and writes run_dir/report.html (PNGs inlined as base64 data URIs, no scripts, no external
files, so it can be mailed or archived) and the same PNGs under run_dir/plots/. Only metrics
that were logged are plotted.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

# Figure renders through the Agg canvas without touching pyplot's global backend state.
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from rlvr.eval.metrics import METRIC_NAMES
from rlvr.eval.rollouts_file import SampleRow, read_samples, summarize_rows
from rlvr.tracking.metrics_log import read_metrics

EVAL_METRIC = re.compile(r"^eval/(?P<set>[^/]+)/(?P<metric>(?:avg|pass|maj)@\d+)$")
N_EXAMPLES = 3  # best and worst samples shown per sample file


@dataclass(frozen=True)
class PlotSpec:
    """One figure: the metric keys it shows (a regex over the flat names) and how."""

    name: str  # file name stem of the PNG
    title: str
    keys: str
    stacked: bool = False  # stacked bars: the series are parts of a whole (the time breakdown)
    ylabel: str = ""


PLOTS = (
    PlotSpec("reward", "Reward and eval avg@k", r"^reward/mean$|^eval/[^/]+/avg@\d+$"),
    PlotSpec("response_length", "Response length", r"^response/length"),
    PlotSpec("loss", "Loss", r"^loss$"),
    PlotSpec("entropy", "Policy entropy", r"^policy/entropy$"),
    PlotSpec("kl", "KL to the reference policy", r"^policy/kl$"),
    PlotSpec("clip_fraction", "Clip fraction", r"^policy/clip_fraction$"),
    PlotSpec(
        "logprob_gap",
        "Engine-trainer logprob gap: each step's rollouts, the sync probe",
        r"^sync/(sampler_trainer_gap|logprob_gap)$",
    ),
    PlotSpec("time", "Time per step", r"^time/", stacked=True, ylabel="seconds"),
)

Series = dict[str, dict[int, float]]  # metric -> step -> value (a later line wins)


def _series(rows: list[dict]) -> Series:
    series: Series = {}
    for row in rows:
        for key, value in row.items():
            if key != "step":
                series.setdefault(key, {})[row["step"]] = value
    return {key: dict(sorted(points.items())) for key, points in series.items()}


def _natural_key(path: Path) -> list:
    """Sort "step_9" before "step_10"."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def _one_avg_per_set(keys: list[str]) -> list[str]:
    """Keep only the largest k of eval/<set>/avg@k: avg@k does not depend on k (see eval.metrics)."""
    avg = {}  # key -> (set, k)
    for key in keys:
        match = EVAL_METRIC.match(key)
        if match and match["metric"].startswith("avg@"):
            avg[key] = (match["set"], int(match["metric"][len("avg@") :]))
    largest = {}
    for key, (set_name, k) in avg.items():
        if k > avg.get(largest.get(set_name), (None, -1))[1]:
            largest[set_name] = key
    return [key for key in keys if key not in avg or key in largest.values()]


def _draw(spec: PlotSpec, series: Series) -> bytes | None:
    """The PNG of one figure, or None when none of its metrics were logged."""
    keys = _one_avg_per_set([key for key in series if re.search(spec.keys, key)])
    if not keys:
        return None
    figure = Figure(figsize=(6.4, 3.4), dpi=100, layout="constrained")
    ax = figure.subplots()
    if spec.stacked:
        # Stacked bars, not areas: each step is its own total, nothing lies between steps.
        steps = sorted({step for key in keys for step in series[key]})
        width = 0.8 * (min(b - a for a, b in zip(steps, steps[1:])) if len(steps) > 1 else 1)
        bottom = [0.0] * len(steps)
        for key in keys:
            # A part missing at a step took no time there (e.g. time/eval between evals).
            heights = [series[key].get(s, 0.0) for s in steps]
            ax.bar(steps, heights, width, bottom=bottom, label=key)
            bottom = [b + h for b, h in zip(bottom, heights)]
    else:
        for key in keys:
            steps, values = list(series[key]), list(series[key].values())
            stderr = series.get(re.sub(r"^(eval/[^/]+)/", r"\1/stderr/", key)) if EVAL_METRIC.match(key) else None
            marker = "o" if len(steps) <= 30 else None
            if stderr:
                ax.errorbar(
                    steps, values, yerr=[stderr.get(s, 0.0) for s in steps], label=key, marker=marker, capsize=3
                )
            else:
                ax.plot(steps, values, label=key, marker=marker)
    ax.set_title(spec.title)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if spec.ylabel:
        ax.set_ylabel(spec.ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _eval_table(series: Series) -> str:
    """Eval metrics from metrics.jsonl: one row per (set, step), "value ± stderr" cells."""
    by_set: dict[str, dict[str, dict[int, float]]] = {}
    for key, points in series.items():
        match = EVAL_METRIC.match(key)
        if match:
            by_set.setdefault(match["set"], {})[match["metric"]] = points
    if not by_set:
        return ""
    parts = []
    for set_name, metrics in by_set.items():
        names = sorted(metrics, key=lambda m: (METRIC_NAMES.index(m.split("@")[0]), int(m.split("@")[1])))
        steps = sorted({s for points in metrics.values() for s in points})
        header = "".join(f"<th>{html.escape(m)}</th>" for m in names)
        body = []
        for step in steps:
            cells = []
            for m in names:
                value = metrics[m].get(step)
                stderr = series.get(f"eval/{set_name}/stderr/{m}", {}).get(step)
                cells.append(f"<td>{_value_with_error(value, stderr)}</td>")
            body.append(f"<tr><td>{step}</td>{''.join(cells)}</tr>")
        parts.append(f"<h3>{html.escape(set_name)}</h3><table><tr><th>step</th>{header}</tr>{''.join(body)}</table>")
    return "".join(parts)


def _value_with_error(value: float | None, stderr: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.3f}" if stderr is None else f"{value:.3f} ± {stderr:.3f}"


def _sample_file_section(path: Path, run_dir: Path) -> str:
    name = html.escape(str(path.relative_to(run_dir)))
    try:
        rows = read_samples(path)
        min_n = min(Counter(r.problem_id for r in rows).values())  # the largest k all problems allow
        summary = summarize_rows(rows, sorted({1, min_n}))
    except ValueError as e:
        return f"<details><summary>{name}</summary><p class='error'>{html.escape(str(e))}</p></details>"
    metric_names = [key for key in summary if "@" in key]
    metrics = " · ".join(
        f"{html.escape(m)} {_value_with_error(summary[m], summary['stderr'][m])}" for m in metric_names
    )
    problem_rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(v))}</td>" for v in (p["id"], f"{p['c']}/{p['n']}", p["majority"], p["reference"])
        )
        + "</tr>"
        for p in summary["problems"]
    )
    ranked = sorted(rows, key=lambda r: r.reward, reverse=True)
    each = min(N_EXAMPLES, (len(ranked) + 1) // 2)  # few rows: split them, show each once
    best, worst = ranked[:each], ranked[each:][::-1][:each]
    return (
        f"<details open><summary>{name} — {summary['n_problems']} problems</summary>"
        f"<p>{metrics}</p>"
        "<table><tr><th>problem</th><th>c/n</th><th>majority</th><th>reference</th></tr>"
        f"{problem_rows}</table>"
        f"<h4>Best samples</h4>{''.join(_sample_html(r) for r in best)}"
        f"<h4>Worst samples</h4>{''.join(_sample_html(r) for r in worst)}"
        "</details>"
    )


def _sample_html(row: SampleRow) -> str:
    facts = f"problem {row.problem_id}, sample {row.sample}, reward {row.reward:g}, status {row.status}, "
    facts += f"extracted {row.extracted!r}, reference {row.answer!r}"
    if row.turns is not None:
        facts += f", {row.turns} turns, {row.tool_calls} tool calls"
    return f"<div class='sample'><p>{html.escape(facts)}</p><pre>{html.escape(row.response or '')}</pre></div>"


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { margin-bottom: 0.2em; } .meta { color: #666; }
img { width: 100%; border: 1px solid #ddd; }
figure { display: inline-block; width: 48%; margin: 0.5%; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }
pre { background: #f6f6f6; padding: 0.6em; white-space: pre-wrap; max-height: 24em; overflow: auto; }
.sample { border-left: 3px solid #bbb; padding-left: 0.8em; margin-bottom: 0.8em; }
.error { color: #b00; }
"""


def write_report(run_dir: str | Path) -> Path:
    """Write run_dir/report.html and run_dir/plots/*.png; return the HTML's path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    rows = read_metrics(run_dir)
    series = _series(rows)

    plots_dir = run_dir / "plots"
    figures = []
    for spec in PLOTS:
        png = _draw(spec, series)
        if png is None:
            (plots_dir / f"{spec.name}.png").unlink(missing_ok=True)  # left by an older report
            continue
        plots_dir.mkdir(exist_ok=True)
        (plots_dir / f"{spec.name}.png").write_bytes(png)
        data_uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        figures.append(f"<figure><img src='{data_uri}' alt='{html.escape(spec.title)}'></figure>")

    sections = [f"<h2>Metrics over steps</h2>{''.join(figures) or '<p>No metrics logged yet.</p>'}"]
    eval_table = _eval_table(series)
    sample_files = sorted((run_dir / "eval").glob("**/*.jsonl"), key=_natural_key)
    if eval_table or sample_files:
        files = "".join(_sample_file_section(path, run_dir) for path in sample_files)
        sections.append(f"<h2>Evaluation</h2>{eval_table}{files}")
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        summary = json.dumps(json.loads(summary_path.read_text(encoding="utf-8")), indent=2)
        sections.append(f"<h2>Summary</h2><pre>{html.escape(summary)}</pre>")
    config_path = run_dir / "config.yaml"
    if config_path.exists():
        sections.append(f"<h2>Config</h2><pre>{html.escape(config_path.read_text(encoding='utf-8'))}</pre>")

    last_step = max((row["step"] for row in rows), default=None)
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    title = html.escape(f"rlvr run {run_dir.resolve().name}")
    page = (
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
        # an empty inline icon: the browser asks for no favicon file that is not there
        "<link rel='icon' href='data:,'>"
        f"<style>{STYLE}</style></head><body><h1>{title}</h1>"
        f"<p class='meta'>{len(rows)} metric lines, last step {last_step}, report made {made}</p>"
        f"{''.join(sections)}</body></html>\n"
    )
    out = run_dir / "report.html"
    out.write_text(page, encoding="utf-8")
    return out
