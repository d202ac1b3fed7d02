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
    assert set(s["cells"]) == {f"{t}/{n}" for t in TASKS for n in steps}
    for key, c in s["cells"].items():
        assert len(c["test"]) == QUICK.seeds and c["lr"] in QUICK.grids["bert"], key
        for seed in range(QUICK.seeds):  # every seed fine-tuned the model of its row and was scored on test
            run = out / "runs" / f"{c['task']}-low-{'random' if c['steps'] == 0 else 'bert%d' % c['steps']}" \
                f"-lr{c['lr']:g}-seed{seed}"
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
