"""The table of a benchmark (apps/benchmark.py): summary.md in the paper's layout (a row per model, a
column per task's figure, the average as the suite computes it, published rows in italics beside
ours), scores.png, and the table as TensorBoard scalars.
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import Any


def columns_of(plan: Any) -> list[dict[str, Any]]:
    """The table's columns: each task's own (`plan` a benchmark.Plan), in the plan's order."""
    return [{"title": c.title, "task": t.name, "split": c.split, "metric": c.metric,
             "averaged": t.averaged and c.averaged} for t in plan.tasks for c in t.columns]


def averages(plan: Any, results: dict[str, dict]) -> dict[str, float | None]:
    """Each model's mean over the averaged columns (the paper's: GLUE's nine without WNLI), in percent;
    None where one of them is missing; {} for a suite without an average (SQuAD)."""
    out: dict[str, float | None] = {}
    if not plan.suite.averaged:
        return out
    for model, tasks in results.items():
        values = [tasks[c["task"]]["columns"].get(c["title"], {}).get("value") for c in columns_of(plan)
                  if c["averaged"]]
        out[model] = None if not values or None in values else 100 * statistics.fmean(values)
    return out


def summary_markdown(s: dict[str, Any]) -> str:
    cols = s["columns"]
    p = s["protocol"]
    lines = [f"# torchbert benchmark {s['suite']}: {s['title']}", "",
             f"Protocol: {s['protocol_text']}.", ""]
    splits = sorted({c["split"] for c in cols})
    lines.append(f"Scores in percent on {', '.join(splits)} ({', '.join(sorted({c['metric'] for c in cols}))}); "
                 + ("± is the standard deviation over the runs at the chosen setting." if p else
                    "each model's own sentence embeddings, nothing fine-tuned.")
                 + (f" Training sets cut to their first {s['max_train']:,} examples." if s["max_train"] else "")
                 + (f" Trained in {s['precision']}, scored in fp32." if s.get("precision", "fp32") != "fp32"
                    else ""))
    average = s["suite_averaged"]
    lines += ["", "| model | " + " | ".join(c["title"] for c in cols) + (" | Average |" if average else " |"),
              "|---|" + "---:|" * (len(cols) + average)]

    def row(name: str, values: list[str], avg: str | None) -> str:
        return f"| {name} | " + " | ".join(values) + (f" | {avg} |" if average else " |")

    for model, tasks in s["results"].items():
        cells = []
        for c in cols:
            x = tasks[c["task"]]["columns"].get(c["title"])
            if x is None:
                cells.append("–")
            else:
                spread = f" ± {100 * x['std']:.1f}" if len(x["values"]) > 1 else ""
                cells.append(f"{100 * x['value']:.1f}{spread}")
        avg = s["averages"].get(model)
        lines.append(row(model, cells, "–" if avg is None else f"{avg:.1f}"))
    for pub in s["published"]:  # as published, in italics; their average over the same columns
        values = [pub["scores"].get(c["title"]) for c in cols]
        averaged = [pub["scores"].get(c["title"]) for c in cols if c["averaged"]]
        avg = statistics.fmean(averaged) if averaged and None not in averaged else None
        lines.append(row(f"*{pub['name']}*", ["–" if v is None else f"*{v:.1f}*" for v in values],
                         "–" if avg is None else f"*{avg:.1f}*"))
    if average and not all(c["averaged"] for c in cols):
        lines += ["", "Average: the mean of " + ", ".join(c["title"] for c in cols if c["averaged"]) + "."]
    if s["published"]:
        lines += ["", "*Italic rows*: published figures, not run here (" +
                  "; ".join(f"{x['name']}: {x['source']}" for x in s["published"]) + ")."]
    tuned = [(model, task, x) for model, tasks in s["results"].items() for task, x in tasks.items() if "lr" in x]
    if tuned:
        lines += ["", "Chosen settings (learning rate, batch; dev scores of the grid with the first seed):", ""]
    for model, task, x in tuned:
        grid = ", ".join(f"{k} {100 * v:.1f}" for k, v in x["grid_dev"].items())
        how = f"best of {len(x['runs'])} restarts on dev" if x["restarts"] else \
            f"{p['statistic']} of {len(x['runs'])} seed(s)"
        lines.append(f"- {model} {task}: lr {x['lr']:g}, batch {x['batch_size']} ({grid}); {how}; "
                     f"{x['seconds']:.0f} s")
    subs = [f for tasks in s["results"].values() for x in tasks.values() for f in x["submission"]]
    if subs:
        lines += ["", f"Leaderboard files: {len(subs)} in submission/ (the chosen runs' test predictions)."]
    lines += ["", f"Time: {s['seconds']:.0f} s in this process and those before --resume. Runs: runs/; "
              "every figure with its run folder: summary.json; plot: scores.png."]
    return "\n".join(lines) + "\n"


def suite_scalars(folder: Path, s: dict[str, Any]) -> None:
    """The table as TensorBoard scalars, a run per model (folder/MODEL), a tag per column and the
    average, in percent: `tensorboard --logdir OUT` shows them beside every fine-tuning run's own."""
    from torch.utils.tensorboard import SummaryWriter

    if folder.is_dir():
        shutil.rmtree(folder)
    for model, tasks in s["results"].items():
        writer = SummaryWriter(str(folder / model))
        try:
            for c in s["columns"]:
                x = tasks[c["task"]]["columns"].get(c["title"])
                if x is not None:
                    writer.add_scalar(f"{s['suite']}/{c['title']}", 100 * x["value"], 0)
            if s["averages"].get(model) is not None:
                writer.add_scalar(f"{s['suite']}/Average", s["averages"][model], 0)
        finally:
            writer.close()


def scores_plot(path: Path, s: dict[str, Any]) -> None:
    """A bar per model in each column, its spread as an error bar; published rows as hollow bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io.files import atomic_write

    cols = s["columns"]
    rows = [(m, [(t["columns"].get(c["title"]) or {}) for c, t in ((c, tasks[c["task"]]) for c in cols)])
            for m, tasks in s["results"].items()]
    n = len(rows) + len(s["published"])
    width = 0.8 / max(1, n)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(cols) + 2), 3.8))
    xs = range(len(cols))
    for i, (model, values) in enumerate(rows):
        ax.bar([x + i * width for x in xs], [100 * v.get("value", 0.0) for v in values], width,
               yerr=[100 * v.get("std", 0.0) for v in values], capsize=2, label=model)
    for j, row in enumerate(s["published"]):
        ax.bar([x + (len(rows) + j) * width for x in xs], [row["scores"].get(c["title"], 0.0) for c in cols], width,
               fill=False, hatch="//", label=f"{row['name']} (published)")
    ax.set_xticks([x + width * (n - 1) / 2 for x in xs], [c["title"] for c in cols], rotation=30)
    ax.set_ylabel("score (%)")
    ax.set_title(f"torchbert benchmark {s['suite']}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
    plt.close(fig)
