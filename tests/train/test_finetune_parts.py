"""finetune's pieces, tested without a real run: the loop's defaults as `finetune` resolves them, the
lines it prints at the end, what a --resume of another task or other labels is told, the best epoch
kept; then one tiny run for what finetune derives from its epochs."""

import json
import re

import pytest

from torchbert.config import BertConfig
from torchbert.errors import UserError
from torchbert.io.record import RunRecord, write_record
from torchbert.tasks.families import TaskSettings
from torchbert.tasks.feature_tagger import TaggerSettings
from torchbert.train.distributed import Dist
from torchbert.train.finetune import FinetuneSettings, _Best, check_resumed_task, report_lines


def settings(tmp_path, model_type: str = "bert", **more) -> FinetuneSettings:
    folder = tmp_path / model_type
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}), encoding="utf-8")
    return FinetuneSettings(task="token", model=folder, train=tmp_path / "train.conll", out=tmp_path / "run", **more)


def test_finetunes_own_defaults_fill_in_what_was_not_given(tmp_path):
    """seed 42 and lr 5e-5 (the paper's appendix A.3), 1e-3 for a tagger trained on frozen features and
    for an ELMo (its architecture's own); a value given, or given as None, as the command line gives it."""
    s, cfg = settings(tmp_path).resolve()
    assert (cfg.seed, cfg.lr) == (42, 5e-5) and s.task_settings.type == "token"
    assert settings(tmp_path, frozen=TaggerSettings()).resolve()[1].lr == 1e-3
    assert settings(tmp_path, "torchbert-elmo").resolve()[1].lr == 1e-3
    _, cfg = settings(tmp_path).resolve(lr=2e-5, seed=None, batch_size=16)
    assert (cfg.seed, cfg.lr, cfg.batch_size) == (42, 2e-5, 16)
    (tmp_path / "empty").mkdir()  # no config.json: run_finetuning says what is wrong with the folder
    assert FinetuneSettings(task="token", model=tmp_path / "empty", train=tmp_path / "t", out=tmp_path / "o").resolve(
        )[1].lr == 5e-5


def test_the_report_shows_the_best_epochs_scores_and_not_the_bookkeeping():
    result = {"steps": 30, "train_seconds": 12.4, "eval_seconds": 3.0, "tokens_per_second": 5120.0, "epochs": 3.0,
              "best_epoch": 2, "accuracy": 0.8125, "f1": 0.5, "dev_total": 64.0, "history": []}
    assert report_lines(result, "run") == [
        "fine-tuned 30 steps in 12s (5,120 tokens/s; dev scoring 3s more) -> run",
        "dev (best epoch 2): accuracy 0.8125, f1 0.5000"]
    tagger = {**result, "tagger": {"kind": "bilstm"}}
    assert report_lines(tagger, "run")[0].startswith("trained a bilstm tagger on frozen features 30 steps")
    assert len(report_lines({k: v for k, v in result.items() if k not in ("accuracy", "f1")}, "run")) == 1
    assert report_lines({**result, "best_epoch": 1.5}, "run")[1] == "dev (best epoch 1.5): accuracy 0.8125, f1 0.5000"
    assert report_lines({**result, "peak_memory_gb": 5.96, "memory_growth_gb": 1.077}, "run") == [
        "fine-tuned 30 steps in 12s (5,120 tokens/s; dev scoring 3s more; peak memory 6.0 GB) -> run",
        "dev (best epoch 2): accuracy 0.8125, f1 0.5000"]


def test_a_resumed_run_is_refused_another_task_or_other_labels(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    labels = {"id2label": {"0": "O", "1": "B-PER"}, "label2id": {"O": 0, "B-PER": 1}}
    BertConfig.from_name("tiny", extra=labels).save(out / "config.json")
    write_record(out, RunRecord("finetune", task={"type": "token"}))
    same = BertConfig.from_name("tiny", extra=labels)
    check_resumed_task(out, same, TaskSettings(type="token"))
    with pytest.raises(UserError, match=f"--resume: the run in {out} fine-tunes a token task, not classification"):
        check_resumed_task(out, same, TaskSettings(type="classification"))
    other = BertConfig.from_name("tiny", extra={"id2label": {"0": "O", "1": "B-LOC"}})
    with pytest.raises(UserError, match=r"started with the labels \['O', 'B-PER'\], but --train has \['O', 'B-LOC'\]"):
        check_resumed_task(out, other, TaskSettings(type="token"))
    (out / "config.json").unlink()  # a run started by an older torchbert: its checkpoint is checked on load
    check_resumed_task(out, other, TaskSettings(type="classification"))


def tiny_run(tmp_path, minilm_dir, name: str, max_length: int = 64, **more):
    """A tiny BERT (64 positions; its config.json holds an older torchbert's record key) fine-tuned on
    32 real reviews for 1.4 epochs of 4 batches: 6 steps, dev scored at steps 4 and 6."""
    from clihelp import tiny_bert

    from torchbert.apps.samples import sentiment_reviews
    from torchbert.train.finetune import run_finetuning

    model = tmp_path / "tiny"
    if not model.is_dir():
        tiny_bert(model, minilm_dir, positions=64)
        config = json.loads((model / "config.json").read_text(encoding="utf-8"))
        (model / "config.json").write_text(json.dumps({**config, "torchbert_objective": "mlm"}), encoding="utf-8")
        rows = sentiment_reviews()[:48]
        for split, part in (("train", rows[:32]), ("dev", rows[32:])):
            (tmp_path / f"{split}.tsv").write_text(
                "sentence\tlabel\n" + "".join(f"{t[:40]}\t{y}\n" for t, y in part), encoding="utf-8")
    logged = []
    s, cfg = FinetuneSettings(task="classification", model=model, train=tmp_path / "train.tsv",
                              dev=tmp_path / "dev.tsv", out=tmp_path / name, epochs=1.4,
                              task_settings=TaskSettings(type="classification", max_length=max_length), **more
                              ).resolve(batch_size=8, lr=1e-3, progress=False)
    result = run_finetuning(s, cfg, log=logged.append)
    return result, logged


def test_finetune_derives_the_loops_steps_from_its_epochs_and_repeats_itself(tmp_path, minilm_dir):
    """Steps: epochs x batches an epoch, rounded (1.4 x 4 = 5.6: 6); warmup warmup_ratio of them, rounded;
    dev scored after each epoch's last step and the last (steps 4 and 6: epochs 1 and 1.5), the loss
    logged at least once an epoch; the head starts from the run's seed (the same run twice: the same
    weights); the model's positions all usable (--max-length 64 of 64); an older record's keys dropped."""
    result, logged = tiny_run(tmp_path, minilm_dir, "a")
    c = result["config"]
    assert (c["steps"], c["warmup_steps"], c["eval_every"], c["log_every"]) == (6, 1, 4, 4)
    assert [(h["step"], h["epoch"]) for h in result["history"]] == [(4, 1), (6, 1.5)]
    assert any("BertForSequenceClassification: a new head (classifier) on the encoder of" in x for x in logged)
    assert "torchbert_objective" not in json.loads((tmp_path / "a" / "config.json").read_text(encoding="utf-8"))
    assert result["dev_examples"] == 16 and result["train_examples"] == 32
    # the best epoch's weights and its dev predictions become the run folder's
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "a" / "best" / "model.safetensors"
                                                                   ).read_bytes()
    assert len((tmp_path / "a" / "dev_predictions.jsonl").read_text(encoding="utf-8").splitlines()) == 16
    tiny_run(tmp_path, minilm_dir, "b")
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert not any("cuts what lies beyond" in x for x in logged)  # 40 characters fit in 64 tokens
    _, logged = tiny_run(tmp_path, minilm_dir, "c", max_length=24)  # they do not fit in 24: finetune says so
    (cut,) = [x for x in logged if "cuts what lies beyond" in x]
    assert re.fullmatch(r"--max-length 24 cuts what lies beyond it: (\d+) of 32 training sequences \(\d+%\) and "
                        r"(\d+) of 16 dev sequences \(\d+%\) reach it \(up to 64 keeps more of each text, at more "
                        r"cost per step\)", cut)


def test_the_best_epoch_on_dev_is_kept_the_first_on_a_tie_and_lower_mse_is_better(tmp_path):
    """finetune keeps the weights of its best dev evaluation in RUN/best: the highest score, the first
    one on a tie; for mse the lowest. A resumed run forgets the evaluations after its checkpoint."""
    class Saves:
        def __init__(self, epoch):
            self.epoch = epoch

        def save_pretrained(self, folder):
            (folder / "model.safetensors").write_text(str(self.epoch))

    for name, values, want in (("accuracy", [0.5, 0.7, 0.7, 0.6], 2), ("mse", [0.5, 0.3, 0.3, 0.4], 2)):
        out = tmp_path / name
        out.mkdir()
        best = _Best(out, name, Dist())
        for epoch, v in enumerate(values, 1):
            best.offer(Saves(epoch), {name: v}, [{"id": epoch, "label": "正面"}], step=10 * epoch, epoch=epoch)
        assert best.epoch() == want and best.metrics() == {name: values[want - 1]}
        assert (out / "best" / "model.safetensors").read_text() == str(want)
        assert (out / "best" / "dev_predictions.jsonl").read_text(encoding="utf-8") == '{"id": 2, "label": "正面"}\n'
        again = _Best(out, name, Dist())  # as --resume reads it, from step 20
        again.resumed_at(20)
        assert [h["step"] for h in again.history()] == [10, 20] and again.epoch() == want
