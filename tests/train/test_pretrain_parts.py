"""pretrain's checks and choices, tested without a real run: the model's config from a preset or a
file, a --recipe against the flags beside it, the objective a run or a resume trains, the settings
that shape a model against what its objective takes, a resumed run's config, the held-out batches and
the report's lines; then one tiny run of one step per model family."""

import json
import shutil
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from torchbert.cli import main
from torchbert.config import BertConfig, ELMoConfig, GPTConfig
from torchbert.errors import UserError
from torchbert.heads import BertForPreTraining
from torchbert.io.record import RunRecord, write_record
from torchbert.train.loop import TrainConfig
from torchbert.train.objectives import PRETRAINING, ElectraSettings
from torchbert.train.pretrain import (PretrainSettings, check_options, check_resumed, chosen_objective, evaluator,
                                      heldout_batches, model_config, report_lines, resumed_config, run_objective,
                                      run_pretraining, run_settings, with_dropout, with_recipe)


def test_the_models_config_comes_from_a_preset_or_a_file_and_fits_the_data(tmp_path):
    bert = model_config("tiny", 1000, 128)
    assert isinstance(bert, BertConfig) and bert.vocab_size == 1000 and bert.num_hidden_layers == 2
    gpt = model_config("tiny", 1000, 128, "gpt")  # a preset sizes GPT as BERT: the same shape
    assert isinstance(gpt, GPTConfig) and (gpt.n_layer, gpt.n_embd, gpt.vocab_size) == (2, 128, 1000)
    assert isinstance(model_config("tiny", 1000, 128, "elmo"), ELMoConfig)
    gpt.save(tmp_path / "gpt.json")
    assert model_config(str(tmp_path / "gpt.json"), 1000, 128, "gpt") == gpt
    with pytest.raises(ValueError, match=r"gpt.json: a gpt config; pretrain it with --model gpt"):
        model_config(str(tmp_path / "gpt.json"), 1000, 128)
    bert.save(tmp_path / "bert.json")
    with pytest.raises(ValueError, match=r"bert.json: vocab_size 1000 does not match the data's 999"):
        model_config(str(tmp_path / "bert.json"), 999, 128)
    with pytest.raises(ValueError, match=r"--config tiny: 512 positions are fewer than the data's max_seq_len 513"):
        model_config("tiny", 1000, 513)
    assert model_config("tiny", 1000, 512).max_position_embeddings == 512


def test_a_recipe_fills_in_its_settings_and_refuses_others(tmp_path):
    s, cfg = PretrainSettings(data=["d"], out=tmp_path), TrainConfig()
    assert with_recipe(s, cfg) == (s, cfg)
    assert with_recipe(replace(s, recipe="rotary"), cfg)[0].positions == "rotary"
    assert with_recipe(replace(s, recipe="paper"), cfg)[0].positions == "absolute"
    assert with_recipe(replace(s, recipe="rotary", positions="rotary"), cfg)[0].positions == "rotary"
    with pytest.raises(UserError, match="--positions absolute: --recipe rotary is positions rotary; give one of the two"):
        with_recipe(replace(s, recipe="rotary", positions="absolute"), cfg)
    with pytest.raises(UserError, match="--recipe paper sets a fresh model's positions; an --init model keeps"):
        with_recipe(replace(s, recipe="paper", init=tmp_path), cfg)


def test_the_continue_recipe_fills_in_what_was_not_given(tmp_path):
    from torchbert.train.recipes import CONTINUE

    s, cfg = PretrainSettings(data=["d"], out=tmp_path, init=tmp_path, recipe="continue"), TrainConfig()
    got, loop = with_recipe(s, cfg)  # from Python: a field left at its default is filled in
    assert (got.objective, loop.lr, loop.warmup_steps) == (CONTINUE["objective"], CONTINUE["lr"],
                                                           CONTINUE["warmup_steps"])
    assert loop.steps == cfg.steps and got.init == s.init
    # from the command line: a flag given beside the recipe wins, the others are the recipe's
    given = replace(s, objective="mlm+nsp", given=("objective", "lr", "recipe", "init"))
    got, loop = with_recipe(given, replace(cfg, lr=3e-4))
    assert (got.objective, loop.lr, loop.warmup_steps) == ("mlm+nsp", 3e-4, CONTINUE["warmup_steps"])
    with pytest.raises(UserError, match="--recipe continue continues a checkpoint: give it as --init"):
        with_recipe(replace(s, init=None), cfg)


def test_every_dropout_of_a_config_is_set():
    bert = with_dropout(BertConfig.from_name("tiny"), 0.0)
    assert bert.hidden_dropout_prob == bert.attention_probs_dropout_prob == 0.0
    gpt = with_dropout(GPTConfig.like(BertConfig.from_name("tiny")), 0.25)
    assert gpt.resid_pdrop == gpt.embd_pdrop == gpt.attn_pdrop == 0.25


def run_folder(tmp_path, config, objective: str | None = None, settings: dict | None = None):
    out = tmp_path / "run"
    (out / "checkpoints" / "step-00000004").mkdir(parents=True)
    config.save(out / "config.json")
    if objective is not None:
        write_record(out, RunRecord("pretrain", objective=objective, settings=settings or {}))
    return out


def test_the_objective_of_a_fresh_run_and_of_a_resumed_one(tmp_path):
    s = PretrainSettings(data=["d"], out=tmp_path / "run")
    assert chosen_objective(s, None).name == "mlm+nsp"
    assert chosen_objective(replace(s, model="gpt"), None).name == "gpt"
    assert chosen_objective(replace(s, objective="electra"), None).name == "electra"
    with pytest.raises(UserError, match="--objective"):
        chosen_objective(replace(s, model="gpt", objective="mlm"), None)
    bert = BertConfig.from_name("tiny")
    run_folder(tmp_path, bert, "mlm")
    assert chosen_objective(s, bert).name == "mlm" and chosen_objective(replace(s, objective="mlm"), bert).name == "mlm"
    with pytest.raises(UserError, match=r"--model gpt: the run in .* pretrains bert; leave --model out to resume it"):
        chosen_objective(replace(s, model="gpt"), bert)
    with pytest.raises(UserError, match=r"--objective electra: the run in .* pretrains mlm; leave --objective out"):
        chosen_objective(replace(s, objective="electra"), bert)
    gpt = GPTConfig.like(bert)
    write_record(s.out, RunRecord("pretrain", objective="gpt"))
    with pytest.raises(UserError, match=r"--objective is BERT's; gpt has its own \(leave --objective out\)"):
        chosen_objective(replace(s, objective="mlm"), gpt)


def test_an_older_runs_objective_and_settings_are_read_from_its_config(tmp_path):
    bert = BertConfig.from_name("tiny")
    out = run_folder(tmp_path, bert)  # no run record: a torchbert older than it
    assert run_objective(out, bert) == "mlm+nsp"
    assert run_objective(out, replace(bert, extra={"architectures": ["BertForMaskedLM"]})) == "mlm"
    assert run_objective(out, GPTConfig.like(bert)) == "gpt"
    electra = PRETRAINING["electra"]
    older = replace(bert, extra={"torchbert_generator_size": 0.5})
    assert run_settings(out, older, electra) == ElectraSettings(generator_size=0.5)
    assert run_settings(out, older, PRETRAINING["mlm"]) is None
    write_record(out, RunRecord("pretrain", objective="electra", settings={"generator_size": 0.75}))
    assert run_objective(out, bert) == "electra"
    assert run_settings(out, older, electra) == ElectraSettings(generator_size=0.75)  # the record's first


def test_the_settings_that_shape_a_model_against_its_objective(tmp_path):
    s = PretrainSettings(data=["d"], out=tmp_path)
    check_options(replace(s, positions="rotary"), PRETRAINING["mlm"])
    with pytest.raises(UserError, match=r"--positions rotary is not supported with --objective electra "
                                        r"\(it takes absolute\)"):
        check_options(replace(s, positions="rotary"), PRETRAINING["electra"])
    with pytest.raises(UserError, match=r"--positions rotary is not supported with --model gpt \(it keeps its own\)"):
        check_options(replace(s, positions="rotary"), PRETRAINING["gpt"])
    with pytest.raises(UserError, match="--init is not supported with --objective electra"):
        check_options(replace(s, init=tmp_path), PRETRAINING["electra"])
    with pytest.raises(UserError, match="--generator-size: a setting of --objective electra; --objective mlm does "
                                        "not read it"):
        check_options(replace(s, objective_settings=ElectraSettings()), PRETRAINING["mlm"])


def test_a_resumed_run_keeps_its_config_and_refuses_settings_that_differ(tmp_path):
    s = PretrainSettings(data=["d"], out=tmp_path / "run")
    with pytest.raises(UserError, match="holds no whole checkpoint"):
        resumed_config(s)
    bert = replace(BertConfig.from_name("tiny", vocab_size=1000), hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0)
    out = run_folder(tmp_path, bert, "electra", {"generator_size": 0.25})
    assert resumed_config(s) == bert
    data = SimpleNamespace(vocab_size=1000, max_seq_len=128, folder=tmp_path / "data")
    check_resumed(replace(s, dropout=0.0, config="tiny", positions="absolute"), bert, data)
    check_resumed(replace(s, objective_settings=ElectraSettings(0.5), given=("data",)), bert, data)  # not given
    for changed, message in (
            (dict(dropout=0.1), r"--dropout 0.1 differs from the dropout the run in .* started with"),
            (dict(positions="rotary"), r"--positions rotary differs from the run's absolute; leave --positions out"),
            (dict(positions="rotary", recipe="rotary"), r"--recipe rotary \(positions rotary\) differs from the run's "
                                                        r"absolute; leave --recipe out"),
            (dict(config="small"), r"--config small differs from the config the run in .* started with"),
            (dict(objective_settings=ElectraSettings(0.5)), r"--generator-size 0.5 differs from the run's 0.25")):
        with pytest.raises(UserError, match=message):
            check_resumed(replace(s, **changed), bert, data)
    with pytest.raises(UserError, match=r"--data .*data: vocab size 999 differs from the run's 1000"):
        check_resumed(s, bert, SimpleNamespace(vocab_size=999, max_seq_len=128, folder=tmp_path / "data"))
    (out / "config.json").unlink()
    with pytest.raises(UserError, match=r"config.json is missing; the run was started by an older torchbert"):
        resumed_config(s)


class Batches:
    """A held-out set of n instances whose batches are their indices, whole batches only (as the
    prepared data's)."""

    folder = "heldout"

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def batches(self, batch_size, epoch):
        assert epoch == 0
        return iter(torch.arange(i, i + batch_size) for i in range(0, self.n - batch_size + 1, batch_size))


def test_the_held_out_batches_are_the_first_of_epoch_0_and_a_small_set_still_gives_one():
    assert [b.tolist() for b in heldout_batches(Batches(10), 4, 2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [b.tolist() for b in heldout_batches(Batches(3), 8, 5)] == [[0, 1, 2]]

    class Task:  # each batch: a loss summed over its targets, those right, how many there were
        parts = ("mlm", "nsp")

        def __init__(self, targets):
            self.targets = targets

        def forward(self, model, batch):
            return {"mlm": (torch.tensor(3.0), torch.tensor(1)), "nsp": (torch.tensor(1.0), torch.tensor(2))}

        def counts(self, batch):
            return {"mlm": self.targets, "nsp": 2}

    scores = evaluator(Batches(4), 2, 5, torch.device("cpu"), Task(4))(None)  # the sums over the targets of both
    assert scores == {"mlm_loss": 0.75, "mlm_accuracy": 0.25, "nsp_loss": 0.5, "nsp_accuracy": 1.0}
    with pytest.raises(ValueError, match=r"heldout: no held-out targets in 2 batch\(es\)"):
        evaluator(Batches(4), 2, 5, torch.device("cpu"), Task(0))(None)


def test_the_report_says_what_the_run_bought():
    summary = {"steps": 10, "tokens": 12345, "train_seconds": 4.2, "tokens_per_second": 2939.3, "objective": "mlm+nsp",
               "eval": {"mlm_loss": 5.0, "mlm_accuracy": 0.2, "nsp_loss": 0.69, "nsp_accuracy": 0.5}}
    lines = report_lines(summary, "run")
    assert lines[0] == "pretrained 10 steps, 12,345 tokens in 4s (2,939 tokens/s) -> run" and len(lines) == 2
    assert lines[1] == PRETRAINING["mlm+nsp"].held_out(summary["eval"])
    assert report_lines({**summary, "peak_memory_gb": 3.02}, "run")[0] == \
        "pretrained 10 steps, 12,345 tokens in 4s (2,939 tokens/s, peak memory 3.0 GB) -> run"
    y = {"masked": 800, "unigram": 0.051, "left": 0.12, "neighbours": 0.2}
    assert report_lines({**summary, "eval": {}, "yardsticks": y}, "run")[1:] == [
        "count tables on the same 800 masked tokens: most frequent token 0.051, given the left neighbour 0.120, "
        "given both neighbours 0.200"]


def test_a_fresh_run_builds_the_model_its_flags_say_and_scores_its_held_out_set(prepared, tmp_path):
    """No --config: the small preset; --dropout and --positions in the saved config; the data's heldout/
    scored without --eval-data, with the count tables for a masked objective and without them for GPT;
    the same seed, the same first weights."""
    data = tmp_path / "data"
    assert main(["prepare", "--corpus", str(prepared / "train.txt"), "--tokenizer", str(prepared / "tok"), "--out",
                 str(data), "--max-seq-len", "32", "--heldout-docs", "10", "--quiet"]) == 0

    def run(name, **more):
        cfg = TrainConfig(steps=1, batch_size=4, warmup_steps=0, log_every=1, progress=False, seed=3)
        s = PretrainSettings(data=str(data), out=tmp_path / name, eval_batches=1, **more)  # one folder, as a str
        summary = run_pretraining(s, cfg, torch.device("cpu"), log=lambda _: None)
        return summary, json.loads((tmp_path / name / "config.json").read_text(encoding="utf-8"))

    summary, config = run("small", dropout=0.0, positions="rotary")
    assert (config["hidden_size"], config["num_hidden_layers"]) == (512, 4)
    assert config["hidden_dropout_prob"] == config["attention_probs_dropout_prob"] == 0.0
    assert config["model_type"] == "roformer" and summary["data"] == str(data)  # rotary: a RoFormer checkpoint
    assert summary["eval"]["mlm_accuracy"] >= 0 and summary["yardsticks"]["masked"] > 0
    summary, _ = run("gpt", model="gpt", config="tiny")
    assert "lm_loss" in summary["eval"] and "yardsticks" not in summary
    run("again", model="gpt", config="tiny")
    assert (tmp_path / "gpt" / "model.safetensors").read_bytes() == (tmp_path / "again" / "model.safetensors").read_bytes()
    # an --init model must hold the data's sequences
    short = tmp_path / "short"
    BertForPreTraining(BertConfig.from_name("tiny", vocab_size=config["vocab_size"], max_position_embeddings=16)
                       ).save_pretrained(short)
    shutil.copyfile(data / "vocab.txt", short / "vocab.txt")
    with pytest.raises(ValueError, match=f"--init {short}: 16 positions are fewer than the data's max_seq_len 32"):
        run("init", init=short)
    assert not (tmp_path / "init").exists()


def test_a_continued_checkpoint_is_scored_before_its_first_step_and_the_recipe_trains_it(prepared, tmp_path, capsys):
    """--init with held-out data: metrics.jsonl's first line is step 0, the checkpoint's own held-out figures
    (those the evaluator gives the checkpoint as it came), the report says them beside the last; --recipe
    continue trains the masked LM alone at its rate; a resumed run keeps the step-0 figures."""
    from torchbert.data import PretrainingData
    from torchbert.heads import BertForMaskedLM
    from torchbert.train.objectives import MaskedLMTask
    from torchbert.train.recipes import CONTINUE

    torch.manual_seed(0)
    start = tmp_path / "start"
    vocab = (prepared / "tok" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    BertForPreTraining(BertConfig.from_name("tiny", vocab_size=len(vocab))).save_pretrained(start)
    shutil.copyfile(prepared / "tok" / "vocab.txt", start / "vocab.txt")
    run = tmp_path / "run"
    args = ["pretrain", "--data", prepared / "data", "--eval-data", prepared / "eval", "--eval-batches", "2",
            "--out", run, "--init", start, "--recipe", "continue", "--batch-size", "4", "--log-every", "1", "--quiet"]
    code = main([str(a) for a in (*args, "--steps", "2", "--save-every", "1")])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and "loss" not in rows[0] and [r["step"] for r in rows] == [0, 1, 2]
    before = {k.removeprefix("eval_"): v for k, v in rows[0].items() if k.startswith("eval_")}
    summary = json.loads((run / "metrics.json").read_text())
    assert summary["eval_first"] == before and summary["objective"] == "mlm"
    assert summary["config"]["lr"] == CONTINUE["lr"] and summary["config"]["warmup_steps"] == CONTINUE["warmup_steps"]
    model = BertForMaskedLM.from_pretrained(start).eval()
    own = evaluator(PretrainingData(prepared / "eval", shuffle=False), 4, 2, torch.device("cpu"), MaskedLMTask())
    with torch.no_grad():
        direct = own(model)
    assert before.keys() == direct.keys()
    assert all(abs(before[k] - direct[k]) < 1e-5 for k in before), (before, direct)
    assert "before the first step, " + PRETRAINING["mlm"].held_out(before) in out
    assert (run / "learning.png").is_file()
    code = main([str(a) for a in (*args, "--steps", "3", "--resume")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert json.loads((run / "metrics.json").read_text())["eval_first"] == before
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]
