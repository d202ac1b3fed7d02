"""`torchbert demo --quick`: every stage of the main job runs through the commands and leaves its outputs."""

import json

import pytest
from clihelp import cli

import torchbert.demo
from torchbert.cli import UserError, check_demo_out, main
from torchbert.demo import MARKER


def test_quick_demo_runs_every_stage(tmp_path, capsys):
    out = tmp_path / "demo"
    code, stdout, err = cli(capsys, "demo", "--quick", "--out", out)
    assert code == 0, err
    for path in (MARKER, "vocab/vocab.txt", "pretraining-data/manifest.json", "pretraining-data/heldout/manifest.json",
                 "bert/model.safetensors", "bert/loss.png", "bert/accuracy.png", "random-init/model.safetensors",
                 "summary.md", "summary.json", "examples.predictions.jsonl"):
        assert (out / path).is_file(), path
    s = json.loads((out / "summary.json").read_text())
    assert s["pretraining"]["heldout_mlm_accuracy"] > 0
    runs = s["finetuning"]
    assert set(runs) == {f"finetune-{r}-{i}" for r in ("all", "low") for i in ("pretrained", "random")}
    for name, r in runs.items():
        assert (out / name / "model.safetensors").is_file() and (out / name / "dev.png").is_file(), name
    majority = s["data"]["dev_majority_accuracy"]
    assert runs["finetune-all-pretrained"]["dev_accuracy"] > majority  # it learned beyond the majority class
    assert [e["label"] in ("pos", "neg") for e in s["examples"]] == [True] * 5
    assert "| training reviews |" in stdout and (out / "summary.md").read_text().startswith("# torchbert demo")


def test_demo_replaces_only_its_own_folder(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(UserError, match="--overwrite"):
        check_demo_out(mine, overwrite=False)
    assert (mine / "notes.txt").read_text() == "keep"
    earlier = tmp_path / "demo"
    earlier.mkdir()
    (earlier / MARKER).write_text("")
    assert check_demo_out(earlier, overwrite=False) and check_demo_out(mine, overwrite=True)
    assert not check_demo_out(tmp_path / "none", overwrite=False)


def test_a_failed_demo_puts_the_earlier_one_back(tmp_path, capsys, monkeypatch):
    earlier = tmp_path / "demo"
    earlier.mkdir()
    (earlier / MARKER).write_text("")
    (earlier / "summary.md").write_text("old")

    def fails(out, main, **kw):
        (out / "vocab").mkdir()
        raise ValueError("the corpus broke")

    monkeypatch.setattr(torchbert.demo, "run_demo", fails)
    assert main(["demo", "--out", str(earlier)]) == 2
    assert "the corpus broke" in capsys.readouterr().err
    assert sorted(p.name for p in earlier.iterdir()) == sorted([MARKER, "summary.md"])
    assert (earlier / "summary.md").read_text() == "old"
    assert not list(tmp_path.glob(".demo*"))  # nothing left aside
