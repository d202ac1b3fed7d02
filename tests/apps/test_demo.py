"""`torchbert demo --quick`: every stage of the main job runs through the commands and leaves its outputs."""

import json
import shlex
from pathlib import Path

import pytest
from clihelp import cli

import torchbert.apps.demo
from torchbert.apps.demo import MARKER
from torchbert.cli import main
from torchbert.commands.demo import check_demo_out
from torchbert.errors import UserError


@pytest.mark.e2e
def test_quick_demo_runs_every_stage(tmp_path, capsys):
    from safetensors.torch import load_file

    from torchbert.apps.demo import QUICK, TASKS, checkpoint_model

    out = tmp_path / "demo"
    code, stdout, err = cli(capsys, "demo", "--quick", "--out", out)
    assert code == 0, err
    for path in (MARKER, "pretrain/vocab/vocab.txt", "pretrain/data/manifest.json",
                 "pretrain/data/heldout/manifest.json", "pretrain/bert/model.safetensors", "pretrain/bert/loss.png",
                 "pretrain/bert/accuracy.png", "pretrain/random/model.safetensors",
                 "pretrain/bert-step2/model.safetensors", "pretrain/bert-step4/vocab.txt", "summary.md",
                 "summary.json", "gain.png", "examples.predictions.jsonl"):
        assert (out / path).is_file(), path
    s = json.loads((out / "summary.json").read_text())
    # every plot the demo writes is named in its summary
    assert [Path(p).name for p in s["pretraining"]["plots"]] == ["loss.png", "accuracy.png", "learning.png"]
    assert "learning.png" in (out / "summary.md").read_text()
    steps = [0, 2, 4, QUICK.pretrain_steps]
    assert set(s["cells"]) == {f"{t}/{n}" for t in TASKS for n in [*steps, "continued"]}
    for key, c in s["cells"].items():
        name = {0: "random", None: "continued"}.get(c["steps"], f"bert{c['steps']}")
        assert len(c["test"]) == QUICK.seeds and c["lr"] in QUICK.grids[name.rstrip("0123456789")], key
        for seed in range(QUICK.seeds):  # every seed fine-tuned the model of its row and was scored on test
            run = out / "runs" / f"{c['task']}-low-{name}-lr{c['lr']:g}-seed{seed}"
            assert (run / "test_metrics.json").is_file() and (run / "model.safetensors").is_file(), run
    held = s["pretraining"]["heldout_by_step"]
    logged = {r["step"]: r for r in map(json.loads, (out / "pretrain/bert/metrics.jsonl").read_text().splitlines())
              if "eval_mlm_accuracy" in r}
    assert held["0"] is None
    for n in steps[1:]:  # each row is the held-out evaluation the run logged at that step, a share of its predictions
        assert held[str(n)]["mlm_accuracy"] == logged[n]["eval_mlm_accuracy"], n
        assert held[str(n)]["nsp_accuracy"] == logged[n]["eval_nsp_accuracy"], n
        assert 0 <= held[str(n)]["mlm_accuracy"] <= 1 and 0 <= held[str(n)]["nsp_accuracy"] <= 1
    assert len({held[str(n)]["mlm_loss"] for n in steps[1:]}) == len(steps) - 1  # the model changed between them
    for t in TASKS:
        gains = s["gains"][t]["by_step"]
        assert set(gains) == {"2", "4", "8"}
        last = s["cells"][f"{t}/8"]["mean"] - s["cells"][f"{t}/0"]["mean"]
        assert gains["8"]["gain"] == pytest.approx(last)
    assert [e["label"] in ("pos", "neg") for e in s["examples"]] == [True] * 5
    # MiniLM, grown with the corpus's characters and continued on it, beside the others
    c = s["continued"]
    assert c["steps"] == QUICK.continue_steps and 0 <= c["heldout_first"]["mlm_accuracy"] <= 1
    assert (out / "pretrain/continued-vocab/model.safetensors").is_file() and c["vocab_size"] >= 30522
    for t in TASKS:
        g = s["gains"][t]["continued"]
        assert g["gain"] == pytest.approx(s["cells"][f"{t}/continued"]["mean"] - s["cells"][f"{t}/0"]["mean"])
    assert f"| MiniLM + {QUICK.continue_steps} (continued) |" in (out / "summary.md").read_text()
    # each stage printed the command that runs it from a shell, and the command line takes it
    from torchbert.cli import build_parser

    printed = [x.split(": torchbert ", 1)[1] for x in stdout.splitlines() if x.startswith("== ")]
    assert len(printed) == stdout.count("\n== ") and printed[0].startswith("vocab ")
    for line in printed:
        build_parser().parse_args(shlex.split(line))
    md = (out / "summary.md").read_text()
    assert md.startswith("# torchbert demo") and "| pretraining steps |" in stdout
    # the default recipe, stated: rotary positions, and random weights of the same architecture
    assert s["settings"]["recipe"] == "rotary" and "rotary positions (RoFormer)" in md and "--recipe rotary" in md
    for model in ("bert", "bert-step2", "random"):
        assert json.loads((out / "pretrain" / model / "config.json").read_text())["model_type"] == "roformer", model
    assert md.count("\n| 0 (random weights) |") == 1 and "\n| 4 | " in md
    # a checkpoint exported as a model folder holds that step's weights: the last one is the final model
    checkpoint_model(out / "pretrain" / "bert", QUICK.pretrain_steps, tmp_path / "last")
    final, last = load_file(out / "pretrain/bert/model.safetensors"), load_file(tmp_path / "last/model.safetensors")
    assert final.keys() == last.keys() and all(final[k].equal(last[k]) for k in final)
    early = load_file(out / "pretrain/bert-step2/model.safetensors")
    assert not all(early[k].equal(final[k]) for k in final)


def test_the_gain_is_clear_only_beyond_twice_its_standard_error():
    from torchbert.apps.demo import gain_table

    def c(mean, std):
        return {"mean": mean, "std": std, "test": [0.0] * 3}

    cells = {"t/0": c(0.60, 0.03), "t/100": c(0.62, 0.03), "t/200": c(0.70, 0.03), "t/400": c(0.75, 0.0)}
    g = gain_table(cells, "t", [0, 100, 200, 400])
    se = (2 * 0.03 ** 2 / 3) ** 0.5
    assert g["by_step"]["100"] == {"gain": pytest.approx(0.02), "standard_error": pytest.approx(se), "clear": False,
                                   "clear_loss": False}
    assert g["by_step"]["200"]["clear"] and g["crossover_step"] == 200
    cells["t/200"] = c(0.60 + 2 * se - 1e-9, 0.03)
    assert gain_table(cells, "t", [0, 100, 200, 400])["crossover_step"] == 400
    assert gain_table({"t/0": c(0.6, 0.0), "t/5": c(0.6, 0.0)}, "t", [0, 5])["crossover_step"] is None
    worse = gain_table({"t/0": c(0.66, 0.005), "t/5": c(0.57, 0.03)}, "t", [0, 5])["by_step"]["5"]
    assert worse["clear_loss"] and not worse["clear"]


def test_demo_replaces_only_its_own_folder(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(UserError, match="--overwrite"):
        check_demo_out(mine, overwrite=False)
    assert (mine / "notes.txt").read_text() == "keep"
    with pytest.raises(UserError, match="torchbert did not write"):  # issue 46: not even with --overwrite
        check_demo_out(mine, overwrite=True)
    assert (mine / "notes.txt").read_text() == "keep"
    earlier = tmp_path / "demo"
    earlier.mkdir()
    (earlier / MARKER).write_text("")
    with pytest.raises(UserError, match="holds an unfinished demo; pass --resume"):  # issue 46: kept for --resume
        check_demo_out(earlier, overwrite=False)
    assert not check_demo_out(earlier, overwrite=False, resume=True)
    (earlier / "summary.json").write_text("{}")
    assert check_demo_out(earlier, overwrite=False)  # a finished demo is replaced
    assert not check_demo_out(tmp_path / "none", overwrite=False)
    with pytest.raises(UserError, match="no earlier demo to resume"):
        check_demo_out(mine, overwrite=False, resume=True)


def test_a_failed_demo_puts_the_earlier_one_back(tmp_path, capsys, monkeypatch):
    earlier = tmp_path / "demo"
    earlier.mkdir()
    (earlier / MARKER).write_text("")
    (earlier / "summary.json").write_text("old")  # a finished demo: replaced without --overwrite

    def fails(out, **kw):
        (out / "vocab").mkdir()
        raise ValueError("the corpus broke")

    monkeypatch.setattr(torchbert.apps.demo, "run_demo", fails)
    assert main(["demo", "--out", str(earlier)]) == 2
    assert "the corpus broke" in capsys.readouterr().err
    assert sorted(p.name for p in earlier.iterdir()) == sorted([MARKER, "summary.json"])
    assert (earlier / "summary.json").read_text() == "old"
    assert not list(tmp_path.glob(".demo*"))  # nothing left aside


def test_an_overwriting_demo_keeps_the_earlier_one_only_until_its_first_stage(tmp_path, capsys, monkeypatch):
    """Issue 46: a demo that fails after a stage keeps what it did (for --resume); before its first stage
    the earlier demo is put back (the test above)."""
    earlier = tmp_path / "demo"
    earlier.mkdir()
    (earlier / MARKER).write_text("")
    (earlier / "summary.json").write_text("old")

    def fails_after_a_stage(out, on_done, **kw):
        (out / MARKER).write_text("")
        (out / "settings.json").write_text("{}")
        (out / "data").mkdir()
        on_done()  # the first stage finished
        raise KeyboardInterrupt

    monkeypatch.setattr(torchbert.apps.demo, "run_demo", fails_after_a_stage)
    assert main(["demo", "--out", str(earlier)]) == 130
    assert (earlier / "data").is_dir() and not (earlier / "summary.json").exists()
    assert not list(tmp_path.glob(".demo*"))  # the earlier one is gone, not left aside


# -- the demo's parts on figures written by hand -----------------------------------------------------------


def test_a_demo_counts_its_stages_before_it_starts():
    from dataclasses import replace

    from torchbert.apps.demo import FULL, QUICK, stage_count

    # vocab, prepare, pretrain; 2 tasks x 4 models (random, 1/4, 1/2, all), each run a finetune and a test:
    # a grid of 2 learning rates with the first seed, then 2 more seeds; predict
    # and MiniLM continued: its vocab --extend, prepare and pretrain, then its runs on the 2 tasks
    assert stage_count(FULL) == 3 + 2 * 4 * 2 * (2 + 3 - 1) + 3 + 2 * 2 * (2 + 3 - 1) + 1 == 87
    assert stage_count(QUICK) == 3 + 2 * 4 * 2 * (1 + 2 - 1) + 3 + 2 * 2 * (1 + 2 - 1) + 1 == 47
    assert stage_count(replace(QUICK, pretrain_steps=2)) == 47 - 2 * 2 * 2  # a quarter of 2 steps is none


def test_a_signal_between_two_stages_is_a_study_interrupted_with_the_count(tmp_path, monkeypatch):
    from torchbert.errors import StudyInterrupted

    def interrupted(out, r, *args):
        r.done = 5
        raise KeyboardInterrupt

    monkeypatch.setattr(torchbert.apps.demo, "_stages", interrupted)
    with pytest.raises(StudyInterrupted) as e:
        torchbert.apps.demo.run_demo(tmp_path / "demo", quick=True, log=lambda m: None)
    assert (e.value.done, e.value.total) == (5, 47)


def test_the_held_out_figures_of_a_step_are_those_logged_with_it(tmp_path):
    from torchbert.apps.demo import held_out_at

    rows = [{"step": 2, "loss": 3.0}, {"step": 2, "eval_mlm_accuracy": 0.1, "eval_mlm_loss": 5.0},
            {"step": 4, "eval_nsp_accuracy": 0.6}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert held_out_at(tmp_path, 2) == {"mlm_accuracy": 0.1, "mlm_loss": 5.0}
    assert held_out_at(tmp_path, 4) is None and held_out_at(tmp_path, 8) is None  # no MLM figures: none


def summary(quick=False, ner_clear_from=None, sentiment_loss=True, model_accuracy=0.193):
    """A demo's summary.json, by hand: checkpoints at 2,000 and 4,000 pretraining steps."""
    def cell(task, steps, mean, std, lr):
        return {"task": task, "steps": steps, "mean": mean, "std": std, "lr": lr, "test": [mean] * 3}

    cells = {"sentiment/0": cell("sentiment", 0, 0.70, 0.01, 5e-4),
             "sentiment/2000": cell("sentiment", 2000, 0.69, 0.01, 2e-3),
             "sentiment/4000": cell("sentiment", 4000, 0.64, 0.01, 2e-3),
             "ner/0": cell("ner", 0, 0.10, 0.02, 2e-3), "ner/2000": cell("ner", 2000, 0.30, 0.02, 5e-4),
             "ner/4000": cell("ner", 4000, 0.34, 0.02, 5e-4)}

    def gain(g, se, clear, loss):
        return {"gain": g, "standard_error": se, "clear": clear, "clear_loss": loss}

    return {
        "quick": quick, "labelled_examples": 200, "seconds": 559.4, "stage_seconds": {"pretrain bert": 301.2},
        "settings": {"preset": "tiny", "pretrain_steps": 4000, "pretrain_batch": 32, "max_seq_len": 128, "dev": 500,
                     "seeds": 3, "recipe": "paper"},
        "pretraining": {"tokens": 16_384_000, "train_seconds": 300.4, "tokens_per_second": 54_540.2,
                        "heldout": {"mlm_accuracy": model_accuracy},
                        "yardsticks": {"masked": 12_345, "unigram": 0.046, "left": 0.053, "neighbours": 0.112},
                        "heldout_by_step": {"0": None, "2000": {"mlm_accuracy": 0.15}, "4000": {"mlm_accuracy": 0.193}},
                        "plots": ["run/loss.png", "run/accuracy.png"]},
        "cells": cells,
        "gains": {"sentiment": {"by_step": {"2000": gain(-0.01, 0.008, False, False),
                                            "4000": gain(-0.06, 0.008, False, sentiment_loss)}, "crossover_step": None},
                  "ner": {"by_step": {"2000": gain(0.2, 0.016, True, False), "4000": gain(0.24, 0.016, True, False)},
                          "crossover_step": ner_clear_from}},
        "examples": [{"text": "早餐丰富", "label": "pos", "probability": 0.8123}],
    }


def test_the_summary_says_what_the_figures_say():
    from torchbert.apps.demo import summary_markdown

    md = summary_markdown(summary(ner_clear_from=2000))
    lines = md.splitlines()
    assert lines[0] == "# torchbert demo: what pretraining buys a small BERT on Chinese text"
    assert lines[2] == ("Pretraining: tiny preset, 4,000 steps of 32 x 128 (16,384,000 tokens in 300 s, 54,540 tokens/s), "
                        "whole-word masking; the paper's recipe: learned absolute positions, MLM + NSP (--recipe paper).")
    measured = summary(ner_clear_from=2000)
    measured["pretraining"]["peak_memory_gb"] = 1.234
    assert summary_markdown(measured).splitlines()[2].startswith(
        "Pretraining: tiny preset, 4,000 steps of 32 x 128 (16,384,000 tokens in 300 s, 54,540 tokens/s, peak memory "
        "1.2 GB), whole-word masking;")
    assert lines[4] == ("Held-out MLM accuracy after pretraining 0.193 on 12,345 masked tokens; tables of token counts "
                        "from the pretraining data score 0.046 the most frequent token, 0.053 given the nearest unmasked "
                        "token on the left, 0.112 given both nearest unmasked neighbours on the same masks: the model is "
                        "above all three.")
    rows = [x for x in lines if x.startswith("| ") and x[2].isdigit()]
    assert rows == ["| 0 (random weights) | - | 0.700 ± 0.010 | - | 0.100 ± 0.020 | - |",
                    "| 2,000 | 0.150 | 0.690 ± 0.010 | -0.010 | 0.300 ± 0.020 | +0.200 ✓ |",
                    "| 4,000 | 0.193 | 0.640 ± 0.010 | -0.060 ✗ | 0.340 ± 0.020 | +0.240 ✓ |"]
    assert ("- sentiment: no gain within 4,000 steps; at the end worse than random weights (-0.060, standard error "
            "0.008).") in md
    assert "- ner: pretraining pays from 2,000 steps on; after 4,000 the gain is +0.240 (standard error 0.016)." in md
    assert ("Learning rates chosen: sentiment/0 0.0005; sentiment/2000 0.002; sentiment/4000 0.002; ner/0 0.002; "
            "ner/2000 0.0005; ner/4000 0.0005.") in md
    assert "Total: 559 s (pretraining 301 s). Plots: gain.png, run/loss.png, run/accuracy.png. Runs: runs/." in md
    assert lines[-1] == "- pos (0.812): 早餐丰富"
    s = summary(ner_clear_from=2000)  # as the demo holds it before it is written as JSON: steps as numbers
    s["pretraining"]["heldout_by_step"] = {int(k): v for k, v in s["pretraining"]["heldout_by_step"].items()}
    assert summary_markdown(s) == md
    quick = summary_markdown(summary(quick=True, sentiment_loss=False, model_accuracy=0.112))
    assert quick.startswith("# torchbert demo (--quick): ")
    assert "at the end no difference beyond the seeds' noise (-0.060" in quick
    assert "- ner: no gain within 4,000 steps" in quick  # no crossover step: no clear gain is claimed
    assert "the model is not above the table given both nearest unmasked neighbours." in quick  # a tie is not above


def test_the_continued_checkpoint_is_the_tables_last_row_with_its_gain(tmp_path, monkeypatch):
    from torchbert.apps.demo import gain_table, plot_gain, summary_markdown
    from torchbert.eval import plots

    s = summary(ner_clear_from=2000)
    s["settings"]["extend_add"] = 4000
    s["cells"]["sentiment/continued"] = {"task": "sentiment", "steps": None, "mean": 0.75, "std": 0.01, "lr": 5e-5,
                                         "test": [0.75] * 3}
    s["cells"]["ner/continued"] = {"task": "ner", "steps": None, "mean": 0.05, "std": 0.02, "lr": 2e-4,
                                   "test": [0.05] * 3}
    s["gains"] = {t: gain_table(s["cells"], t, [0, 2000, 4000]) for t in ("sentiment", "ner")}
    s["continued"] = {"steps": 200, "train_seconds": 412.3, "vocab_size": 33_000, "parameters": {"body": 10_621_440},
                      "heldout_first": {"mlm_accuracy": 0.0}, "heldout": {"mlm_accuracy": 0.41}}
    g = s["gains"]["sentiment"]["continued"]
    assert g["gain"] == pytest.approx(0.05) and g["standard_error"] == pytest.approx((2 * 0.01 ** 2 / 3) ** 0.5)
    assert g["clear"] and s["gains"]["ner"]["continued"]["clear_loss"]  # -0.05 against a standard error of 0.016
    md = summary_markdown(s)
    rows = [x for x in md.splitlines() if x.startswith("| ")]
    assert rows[-1] == "| MiniLM + 200 (continued) | 0.000 → 0.410 | 0.750 ± 0.010 | +0.050 ✓ | 0.050 ± 0.020 | -0.050 ✗ |"
    assert ("- continued: MiniLM (all-MiniLM-L6-v2, 10,621,440 non-embedding parameters, 4,000 of the corpus's "
            "characters and words offered to its vocabulary: vocab_size 33,000), its pretraining continued for 200 "
            "steps on the same corpus in 412 s: sentiment +0.050 (standard error 0.008), ner -0.050 (standard error "
            "0.016) over random weights.") in md
    drawn = []
    monkeypatch.setattr(plots, "errorbar_panels", lambda path, panels: drawn.append(panels))
    plot_gain(tmp_path, s)
    assert drawn[0][1]["series"]["fine-tuned BERT"][0] == [0, 2000, 4000]  # steps only: no row without a step


def test_the_yardsticks_are_said_only_beside_a_held_out_accuracy():
    from torchbert.apps.demo import yardstick_lines

    p = summary()["pretraining"]
    assert yardstick_lines({**p, "heldout": {}}) == [] and yardstick_lines({**p, "yardsticks": None}) == []
    assert "the model is not above the table given the nearest unmasked token on the left." in yardstick_lines(
        {**p, "heldout": {"mlm_accuracy": 0.05}})[0]  # above the first table only: the next is named


def test_the_gain_plot_has_a_panel_per_task_against_random_weights(tmp_path, monkeypatch):
    from torchbert.apps.demo import plot_gain
    from torchbert.eval import plots

    drawn = []
    monkeypatch.setattr(plots, "errorbar_panels", lambda path, panels: drawn.append((path, panels)))
    plot_gain(tmp_path, summary())
    (path, panels), = drawn
    assert path == tmp_path / "gain.png" and [p["title"] for p in panels] == ["sentiment (200 examples, test)",
                                                                            "ner (200 examples, test)"]
    assert panels[1]["series"] == {"fine-tuned BERT": ([0, 2000, 4000], [0.10, 0.30, 0.34], [0.02, 0.02, 0.02])}
    assert panels[1]["baseline"] == (0.10, "random weights") and panels[0]["baseline"] == (0.70, "random weights")
