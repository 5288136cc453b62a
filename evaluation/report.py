"""Evaluation report: summary rows (model x problem set), the printed table, markdown, and PNG plots.

Usage:
    rows = summary_rows(records, ks=[1, 3])
    print(format_summary_table(rows))
    eff = efficiency_rows(records, teacher="teacher")
    md = summary_markdown(rows, eff)               # for the Prefect markdown artifact
    curves = tts_curves(records, max_k=3)          # pass@k and majority@k per model
    figures = save_plots(rows, eff, curves, out_dir)   # accuracy.png, efficiency.png, tts.png
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # headless: plots are files, never windows
import matplotlib.pyplot as plt  # noqa: E402

from evaluation.efficiency import compare_efficiency  # noqa: E402
from evaluation.metrics import (  # noqa: E402
    accuracy, exact_match_rate, failure_breakdown, group_by_problem, majority_at_k_curve, mean, mean_f1,
    pass_at_k_curve, pass_at_k_over_problems,
)
from evaluation.records import EvalRecord  # noqa: E402
from training.rewards import normalize_answer  # noqa: E402

# Columns of the printed table around the pass@k columns (rows hold more: EM, F1, failure shares).
LEAD_COLUMNS = ("model", "set", "problems", "samples", "accuracy")
TAIL_COLUMNS = ("tokens/problem", "tool_calls/problem", "format_error_rate")
ACTION_COLUMNS = ("model", "acted_when_needed", "abstained_when_not", "needs_tool_episodes", "facts_given_episodes")
EFFICIENCY_COLUMNS = ("model", "common_solved", "tokens_per_solved", "teacher_tokens_per_solved", "token_reduction_pct",
                      "tool_calls_per_solved", "teacher_tool_calls_per_solved", "tool_call_reduction_pct")


def table_columns(rows: Sequence[dict]) -> tuple[str, ...]:
    """Lead columns, pass@k for every k > 1 the rows carry (pass@1 is the accuracy column), tail columns."""
    ks = dict.fromkeys(key for row in rows for key in row if key.startswith("pass@") and key != "pass@1")
    return LEAD_COLUMNS + tuple(ks) + TAIL_COLUMNS


def _by_set_and_model(records: Sequence[EvalRecord]) -> dict[tuple[str, str], list[EvalRecord]]:
    """{(set, model): records}, sets in first-seen order and, within a set, models in first-seen order, so a
    table lists every model of one set next to each other."""
    groups: dict[tuple[str, str], list[EvalRecord]] = {}
    for rec in records:
        groups.setdefault((rec.problem_set, rec.model), []).append(rec)
    sets = list(dict.fromkeys(r.problem_set for r in records))
    models = list(dict.fromkeys(r.model for r in records))
    return {(s, m): groups[(s, m)] for s in sets for m in models if (s, m) in groups}


def summary_rows(records: Sequence[EvalRecord], ks: Sequence[int]) -> list[dict]:
    """One row per (problem set, model), grouped by set. pass@k is given for every k <= samples per
    problem (None above it: it cannot be estimated without bias)."""
    rows = []
    for (pset, model), recs in _by_set_and_model(records).items():
        outcomes = group_by_problem(recs)
        n_min = min(o.n for o in outcomes)
        row = {
            "model": model, "set": pset, "problems": len(outcomes), "samples": n_min,
            "accuracy": round(accuracy(recs), 4), "em": round(exact_match_rate(recs), 4),
            "f1": round(mean_f1(recs), 4),
        }
        for k in ks:
            row[f"pass@{k}"] = round(pass_at_k_over_problems(outcomes, k), 4) if k <= n_min else None
        row["tokens/problem"] = round(mean([r.tokens for r in recs]), 1)
        row["tool_calls/problem"] = round(mean([r.tool_calls for r in recs]), 2)
        failures = failure_breakdown(recs)
        row["format_error_rate"] = round(failures["format_error"], 4)
        row.update({f"failure.{cat}": round(share, 4) for cat, share in failures.items()})
        rows.append(row)
    return rows


def efficiency_rows(records: Sequence[EvalRecord], teacher: str) -> list[dict]:
    """Each non-teacher model against the teacher on problems both solved (all sets pooled); [] without a
    teacher in `records`."""
    teacher_recs = [r for r in records if r.model == teacher]
    if not teacher_recs:
        return []
    models = list(dict.fromkeys(r.model for r in records if r.model != teacher))
    return [compare_efficiency([r for r in records if r.model == m], teacher_recs).to_row() for m in models]


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def format_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """Fixed-width text table of `columns` (a missing key prints as '-')."""
    cells = [[_cell(row.get(col)) for col in columns] for row in rows]
    widths = [max([len(col)] + [len(r[i]) for r in cells]) for i, col in enumerate(columns)]
    line = lambda items: "  ".join(item.ljust(w) for item, w in zip(items, widths))  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells])


def format_action_table(rates: dict[str, dict], models: Sequence[str] = ()) -> str:
    """AutoCoA's when-to-act columns, a row per model ({model: evaluation/when_to_act.py action_rates}): rates
    over the needs-tool episodes and the facts-given ones. `models` orders the rows (the eval table's order);
    models it leaves out follow."""
    order = [m for m in models if m in rates] + [m for m in rates if m not in models]
    return format_table([{"model": m, **rates[m]} for m in order], ACTION_COLUMNS)


def format_summary_table(rows: Sequence[dict], efficiency: Sequence[dict] = ()) -> str:
    """The table `afm eval` prints: models side by side per set, then the efficiency reduction vs the teacher."""
    text = format_table(rows, table_columns(rows))
    if efficiency:
        text += "\n\nEfficiency vs teacher (problems both solved; negative % = less than the teacher):\n"
        text += format_table(efficiency, EFFICIENCY_COLUMNS)
    return text


def _markdown_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "\n".join("| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows)


def summary_markdown(rows: Sequence[dict], efficiency: Sequence[dict] = ()) -> str:
    """Markdown version of the summary (for a Prefect markdown artifact or an MLflow text artifact)."""
    text = "## Evaluation summary\n\n" + _markdown_table(rows, table_columns(rows)) + "\n"
    if efficiency:
        text += ("\n## Efficiency vs teacher (problems both solved; negative % = less than the teacher)\n\n"
                 + _markdown_table(efficiency, EFFICIENCY_COLUMNS) + "\n")
    return text


def accuracy_figure(rows: Sequence[dict]):
    """Grouped bars: accuracy per problem set, one bar per model."""
    sets = list(dict.fromkeys(r["set"] for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(sets) + 2), 3.5))
    width = 0.8 / max(len(models), 1)
    for i, model in enumerate(models):
        values = [next((r["accuracy"] for r in rows if r["model"] == model and r["set"] == s), 0.0) for s in sets]
        ax.bar([x + i * width for x in range(len(sets))], values, width, label=model)
    ax.set_xticks([x + width * (len(models) - 1) / 2 for x in range(len(sets))], sets)
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def efficiency_figure(efficiency: Sequence[dict]):
    """Bars: tokens and tool calls per problem solved by both, each model next to the teacher (0 when the two
    solved no problem in common)."""
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.5))
    labels = [row["model"] for row in efficiency]
    for ax, key, teacher_key, title in (
        (axes[0], "tokens_per_solved", "teacher_tokens_per_solved", "tokens / solved problem"),
        (axes[1], "tool_calls_per_solved", "teacher_tool_calls_per_solved", "tool calls / solved problem"),
    ):
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], [row[key] or 0.0 for row in efficiency], 0.4, label="model")
        ax.bar([x + 0.2 for x in xs], [row[teacher_key] or 0.0 for row in efficiency], 0.4,
               label="teacher")
        ax.set_xticks(list(xs), labels)
        ax.set_title(title)
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def tts_curves(records: Sequence[EvalRecord], max_k: int) -> dict[str, dict[str, dict[int, float]]]:
    """Test-time scaling per model: {"pass@k": {k: value}, "majority@k": {k: value}} for k = 1 .. min(max_k,
    samples per problem). pass@k is oracle best-of-k (a perfect verifier); majority@k is self-consistency over
    SQuAD-normalized answers (no verifier needed)."""
    curves = {}
    for model in dict.fromkeys(r.model for r in records):
        recs = [r for r in records if r.model == model]
        ks = list(range(1, min(max_k, min(o.n for o in group_by_problem(recs))) + 1))
        curves[model] = {"pass@k": pass_at_k_curve(recs, ks),
                         "majority@k": majority_at_k_curve(recs, ks, normalize_answer)}
    return curves


def tts_figure(curves: dict[str, dict[str, dict[int, float]]]):
    """pass@k (solid) and majority@k (dashed) against k, one colour per model."""
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    for i, (model, curve) in enumerate(curves.items()):
        color = f"C{i % 10}"
        ks = list(curve["pass@k"])
        ax.plot(ks, [curve["pass@k"][k] for k in ks], marker="o", color=color, label=f"{model} pass@k")
        ax.plot(ks, [curve["majority@k"][k] for k in ks], linestyle="--", color=color, label=f"{model} maj@k")
    max_k = max((max(c["pass@k"]) for c in curves.values()), default=1)
    ax.set_xticks(range(1, max_k + 1))
    ax.set_xlabel("k (samples)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    return fig


def save_plots(rows: Sequence[dict], efficiency: Sequence[dict], curves: dict, out_dir: Path) -> dict[str, object]:
    """Write accuracy.png, tts.png and (with a teacher) efficiency.png under `out_dir`; returns
    {file name: figure} so the caller can also log them to MLflow (then close them)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = {"accuracy.png": accuracy_figure(rows), "tts.png": tts_figure(curves)}
    if efficiency:
        figures["efficiency.png"] = efficiency_figure(efficiency)
    for name, fig in figures.items():
        fig.savefig(out_dir / name, dpi=100)
    return figures
