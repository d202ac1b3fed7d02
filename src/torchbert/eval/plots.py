"""The run folders' plots, drawn from metrics.jsonl (and best.json) with one helper."""

from __future__ import annotations

import json
from pathlib import Path

LINE_COLORS = ("gray", "tab:brown", "tab:olive", "tab:pink")  # reference lines (yardsticks), apart from the curves


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def line_plot(path: Path, title: str, xlabel: str, ylabel: str, series: dict[str, tuple[list, list, str]],
              lines: dict[str, float] | None = None) -> None:
    """One PNG: each series is (x, y, matplotlib format such as "-" or "o--"), named in the legend;
    `lines`: horizontal dashed lines, {label: y}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io.files import atomic_write

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, (x, y, style) in series.items():
        ax.plot(x, y, style, label=label)
    for (label, y), color in zip((lines or {}).items(), LINE_COLORS):
        ax.axhline(y, linestyle=":", color=color, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)


def errorbar_panels(path: Path, panels: list[dict]) -> None:
    """One PNG of side-by-side panels, each {"title", "xlabel", "series": {label: (x, mean, std)}, and
    optionally "baseline": (y, label), a dashed line, and "log_x": True}; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io.files import atomic_write

    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.5), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for label, (x, y, err) in panel["series"].items():
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=label)
        if panel.get("baseline"):
            y, label = panel["baseline"]
            ax.axhline(y, linestyle="--", color="gray", label=label)
        if panel.get("log_x"):
            ax.set_xscale("log")
        ticks = sorted({v for x, _, _ in panel["series"].values() for v in x})
        if len(ticks) <= 8:  # ticks at the points plotted, written plainly (200, 2,000, 16,000)
            ax.set_xticks(ticks, [f"{v:,}" for v in ticks])
            ax.minorticks_off()
        ax.set_title(panel["title"])
        ax.set_xlabel(panel["xlabel"])
    axes[0][0].legend()
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
    plt.close(fig)


def plot_pretraining(run_dir: Path, yardsticks: dict | None = None) -> None:
    """loss.png and accuracy.png: the training curves per log step, the held-out ones where evaluated;
    learning.png: held-out accuracy against tokens and against training seconds. `yardsticks`: the
    count tables' held-out MLM accuracy (eval/yardsticks.py), drawn as dashed lines."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    trained = [r for r in rows if "loss" in r]  # a continued checkpoint's step 0 holds its evaluation alone
    if not trained:
        return
    steps = [r["step"] for r in trained]
    parts = [k.removesuffix("_loss") for k in trained[0] if k.endswith("_loss") and not k.startswith("eval_")]
    lines = {f"count table: {k}": yardsticks[k] for k in ("unigram", "left", "neighbours")} if yardsticks else {}
    for name, keys in (("loss", ("loss", *[f"{p}_loss" for p in parts])),
                       ("accuracy", tuple(f"{p}_accuracy" for p in parts if f"{p}_accuracy" in trained[0]))):
        series = {}
        for k in keys:
            series[k] = (steps, [r[k] for r in trained], "-")
            evals = [(r["step"], r[f"eval_{k}"]) for r in rows if f"eval_{k}" in r]
            if evals:
                series[f"held-out {k}"] = (*map(list, zip(*evals)), "o--")
        line_plot(run_dir / f"{name}.png", f"pretraining {name}: {run_dir.name}", "step", name, series,
                  lines if name == "accuracy" else None)
    evals = [r for r in rows if any(k.startswith("eval_") and k.endswith("_accuracy") for k in r)]
    if evals:
        keys = [k for k in evals[-1] if k.startswith("eval_") and k.endswith("_accuracy")]
        panels = [(x, label, [r[x] for r in evals]) for x, label in (("tokens", "training tokens"),
                                                                       ("seconds", "training seconds"))]
        _panels(run_dir / "learning.png", f"held-out accuracy: {run_dir.name}",
                [(label, {k.removeprefix("eval_"): (xs, [r[k] for r in evals]) for k in keys}, lines)
                 for _, label, xs in panels])


def _panels(path: Path, title: str, panels: list[tuple[str, dict, dict]]) -> None:
    """One PNG of side-by-side line panels, each (x label, {label: (x, y)}, {label: y} dashed lines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io.files import atomic_write

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (xlabel, series, lines) in zip(axes[0], panels):
        for label, (x, y) in series.items():
            ax.plot(x, y, "o-", label=label)
        for (label, y), color in zip(lines.items(), LINE_COLORS):
            ax.axhline(y, linestyle="--", color=color, label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out accuracy")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)


def plot_finetuning(run_dir: Path, metric: str) -> None:
    """loss.png (training loss per log step) and dev.png (the dev scores per epoch)."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    if rows:
        line_plot(run_dir / "loss.png", f"fine-tuning loss: {run_dir.name}", "step", "loss",
                  {"training loss": ([r["step"] for r in rows], [r["loss"] for r in rows], "-")})
    best = run_dir / "best.json"
    history = json.loads(best.read_text(encoding="utf-8"))["history"] if best.is_file() else []
    if history:
        names = [k for k in history[0] if k not in ("epoch", "step", "mse") and not k.endswith("total")]
        line_plot(run_dir / "dev.png", f"dev scores: {run_dir.name} (best by {metric})", "epoch", "dev score",
                  {k: ([h["epoch"] for h in history], [h[k] for h in history], "o-") for k in names})
