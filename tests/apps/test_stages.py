"""The studies' stages (apps/stages.py): each calls the library with settings objects and prints the
command line that runs the same; parsed back by the command line's own parser, that line gives
equal objects, so what a demo or compare ran can be run again from a shell."""

import json
import shlex
from dataclasses import replace

import pytest

from torchbert.train.recipes import RECIPES
from torchbert.apps.stages import RECORD, Stages, claim_folder
from torchbert.cli import build_parser, given_flags
from torchbert.commands.common import settings_from
from torchbert.commands.pretrain import objective_settings
from torchbert.errors import Interrupted, RunFailed, StudyInterrupted, UserError


def test_each_stage_says_where_the_study_stands_and_the_time_left_once_it_has_a_pace(tmp_path, monkeypatch):
    import torchbert.apps.stages as stages

    clock = iter(range(0, 10_000, 60))  # each call of the clock: a minute later
    monkeypatch.setattr(stages.time, "perf_counter", lambda: float(next(clock)))
    logged = []
    r = Stages(tmp_path, logged.append, total=10)
    for name, verb in (("vocab", "vocab"), ("pretrain", "pretrain"), ("a", "finetune"), ("a test", "evaluate"),
                       ("b", "finetune")):
        r.run(name, [verb], lambda: None)
    heads = [line.split(": torchbert")[0].strip() for line in logged if line.startswith("\n==")]
    assert heads == ["== vocab (stage 1 of 10)", "== pretrain (stage 2 of 10)", "== a (stage 3 of 10)",
                     "== a test (stage 4 of 10)", "== b (stage 5 of 10, about 6 min left)"]  # 6 stages x 60 s
    clock = iter(range(0, 10_000, 40))  # 40 s a stage: under 90 s left, the time is in seconds
    r = Stages(tmp_path, logged.append, total=4, keep=False)
    for name in ("a", "b", "c"):
        r.run(name, ["finetune"], lambda: None)
    assert logged[-1].startswith("\n== c (stage 3 of 4, about 80 s left): ")
    r = Stages(tmp_path, logged.append, keep=False)  # a study that does not count its stages
    r.run("one", ["vocab"], lambda: None)
    assert logged[-1].startswith("\n== one (stage 1): ")


def test_the_stages_seconds_are_kept_for_a_resumed_study_and_a_bad_record_is_started_again(tmp_path, monkeypatch):
    import torchbert.apps.stages as stages

    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(stages.time, "perf_counter", lambda: float(next(clock)))
    finished = []
    r = Stages(tmp_path, print, total=5, on_done=lambda: finished.append(r.done))
    r.run("vocab", ["vocab"], lambda: None)
    r.run("pretrain", ["pretrain"], lambda: None)
    r.found(2)  # two more whose results were on disk
    assert finished == [1, 2, 4] and r.done == 4
    saved = json.loads((tmp_path / RECORD).read_text(encoding="utf-8"))
    assert saved["stages"] == {"vocab": 10.0, "pretrain": 10.0} and saved["seconds"] > 0
    again = Stages(tmp_path, print)  # --resume: the seconds so far go on from the record's
    assert again.times == saved["stages"] and again.seconds() >= saved["seconds"] + 10
    worker = Stages(tmp_path, print, keep=False)  # a worker's: the record neither read nor written
    assert worker.times == {} and worker.seconds() < saved["seconds"]
    worker.run("x", ["finetune"], lambda: None)
    assert json.loads((tmp_path / RECORD).read_text(encoding="utf-8")) == saved
    (tmp_path / "w").mkdir()
    for bad in ("{", '{"stages": [], "seconds": 3}', '{"stages": {}, "seconds": "3"}', "[1]"):
        (tmp_path / "w" / RECORD).write_text(bad, encoding="utf-8")
        fresh = Stages(tmp_path / "w", print)
        assert fresh.times == {} and fresh.seconds() < 100, bad


def test_a_stage_is_complete_when_all_its_outputs_are_there(tmp_path):
    logged = []
    r = Stages(tmp_path, logged.append)
    assert not r.complete(tmp_path, "done.json", "model.safetensors") and logged == []  # its last output missing
    (tmp_path / "done.json").write_text("{}")
    assert not r.complete(tmp_path, "done.json", "model.safetensors")  # another is: deleted since
    assert logged == [f"{tmp_path}: model.safetensors missing; its stage runs again"]
    (tmp_path / "model.safetensors").write_text("x")
    logged.clear()
    assert r.complete(tmp_path, "done.json", "model.safetensors") and logged == []
    assert not r.complete(tmp_path, "done.json", "model.safetensors", "config.json", "vocab.txt")
    assert logged == [f"{tmp_path}: config.json, vocab.txt missing; its stage runs again"]


def test_a_study_folder_is_claimed_with_its_settings_and_refuses_others(tmp_path):
    out = tmp_path / "study"
    claim_folder(out, ".torchbert-demo", "demo", '{"seed": 1}', "--seed")
    assert (out / "settings.json").read_text(encoding="utf-8") == '{"seed": 1}'
    assert "torchbert demo" in (out / ".torchbert-demo").read_text(encoding="utf-8")
    claim_folder(out, ".torchbert-demo", "demo", '{"seed": 1}', "--seed")  # the same: a resume
    with pytest.raises(UserError, match=r"--out .*study: the earlier demo there ran with other settings \(--seed\)"):
        claim_folder(out, ".torchbert-demo", "demo", '{"seed": 2}', "--seed")
    assert (out / "settings.json").read_text(encoding="utf-8") == '{"seed": 1}'


def test_a_failed_stage_is_a_run_failure_not_a_bug_and_keeps_the_stages_before_it(tmp_path):
    logged = []
    r = Stages(tmp_path, logged.append, total=5)
    assert r.run("first", ["vocab", "--out", tmp_path / "v"], lambda: 7) == 7
    assert logged[-1] == f"\n== first (stage 1 of 5): torchbert vocab --out {tmp_path / 'v'}" and r.done == 1

    def bad_input():
        raise UserError("data.tsv line 3: no label")

    with pytest.raises(RunFailed, match=r"stage 'second' failed \(torchbert finetune: data.tsv line 3: no label\); "
                                        r"the 1 stage\(s\) before it are kept"):
        r.run("second", ["finetune"], bad_input)

    def interrupted():
        raise KeyboardInterrupt

    def stopped_after_saving():  # a training run's own answer to a signal (train/loop.py)
        raise Interrupted("SIGTERM", 3, tmp_path / "checkpoints" / "step-00000003")

    for stop in (interrupted, stopped_after_saving):
        with pytest.raises(StudyInterrupted) as e:
            r.run("third", ["pretrain"], stop)
        assert (e.value.done, e.value.total) == (1, 5)

    def bug():
        raise TypeError("a bug")

    with pytest.raises(TypeError):  # a bug is reported as one, not as a stage that failed on its input
        r.run("fourth", ["pretrain"], bug)

    for error, text in ((ValueError("a bad line"), "a bad line"), (OSError(28, "No space left on device"),
                                                                  "No space left on device"), (UserError(""), "UserError")):
        def fails(error=error):
            raise error

        with pytest.raises(RunFailed, match=rf"stage 'fifth' failed \(torchbert evaluate: .*{text}"):
            r.run("fifth", ["evaluate"], fails)


def test_an_interrupt_that_came_as_another_error_stops_the_study_after_the_stages_done(tmp_path):
    from torchbert.errors import interrupt_raised

    def signalled_then_mangled():  # a signal's handler raised, and C++ code made a TypeError of it (errors.py)
        interrupt_raised()
        raise TypeError("incompatible function arguments")

    r = Stages(tmp_path, lambda m: None, total=4)
    r.run("first", ["vocab"], lambda: None)
    with pytest.raises(StudyInterrupted) as e:
        r.run("second", ["prepare"], signalled_then_mangled)
    assert (e.value.done, e.value.total) == (1, 4)
    for between in (signalled_then_mangled, lambda: (_ for _ in ()).throw(KeyboardInterrupt)):
        with pytest.raises(StudyInterrupted) as e:  # the study's own code between two stages
            with r.stopping():
                r.found()
                between()
        assert e.value.done == r.done
    with pytest.raises(ZeroDivisionError):  # an error with no signal is what it is
        with r.stopping():
            1 / 0


def test_a_stage_that_finished_before_an_interrupt_is_found_by_its_seconds_and_outputs(tmp_path):
    r = Stages(tmp_path, lambda m: None, total=4)
    run = tmp_path / "run"

    def finetune():
        run.mkdir()
        (run / "metrics.json").write_text("{}")

    r.run("tune", ["finetune"], finetune)
    again = Stages(tmp_path, lambda m: None, total=4)  # --resume
    assert again.finished("tune", run, "metrics.json")
    assert not again.finished("test", run, "metrics.json")  # its seconds are not in the record: it did not end
    (run / "metrics.json").unlink()
    assert not again.finished("tune", run, "metrics.json")  # its output is gone


class Printed(Stages):
    """Stages that print their command lines and run nothing."""

    def run(self, name, argv, call):
        self.argv = [str(a) for a in argv]
        return {}


def pretrain_settings(args):
    from torchbert.train.pretrain import PretrainSettings

    return settings_from(PretrainSettings, args, objective_settings=objective_settings(args))


def parsed(argv):
    args = build_parser().parse_args(argv)
    assert shlex.split(shlex.join(argv)) == argv  # what is printed is what a shell gives back
    return args


def test_the_printed_pretrain_command_gives_the_same_settings(tmp_path):
    from torchbert.train.loop import TrainConfig
    from torchbert.train.pretrain import PretrainSettings

    for recipe, overrides in RECIPES.items():
        for resume in (False, True):
            s = PretrainSettings(data=[str(tmp_path / "data")], out=tmp_path / "bert", model="bert", config="tiny",
                                 resume=resume, overwrite=not resume, **overrides)
            cfg = TrainConfig(steps=8, batch_size=8, lr=1e-3, warmup_steps=1, log_every=1, eval_every=2,
                              save_every=2, keep=4, seed=3, progress=False, fast=False)
            r = Printed(tmp_path)
            r.pretrain("pretrain", s, cfg)
            args = parsed(r.argv)
            assert args.command == "pretrain" and args.quiet and args.resume is resume and args.overwrite is not resume
            assert settings_from(PretrainSettings, args) == replace(s, command_line=None), recipe
            assert settings_from(TrainConfig, args, progress=not args.quiet) == cfg
            assert s.command_line == shlex.join(["torchbert", *r.argv])  # the run record's
    # an objective's own settings, and a run that shows its progress
    from torchbert.train.objectives import ElectraSettings

    s = PretrainSettings(data=[str(tmp_path / "data")], out=tmp_path / "e", objective="electra",
                         objective_settings=ElectraSettings(generator_size=0.5))
    r = Printed(tmp_path)
    r.pretrain("pretrain", s, TrainConfig(steps=8, progress=True))
    args = parsed(r.argv)
    args.given = given_flags(r.argv)
    assert "--generator-size" in r.argv and not args.quiet
    assert replace(pretrain_settings(args), given=None) == replace(s, command_line=None)


def test_the_printed_finetune_command_gives_the_same_settings(tmp_path):
    from torchbert.commands.finetune import settings
    from torchbert.tasks.families import TaskSettings
    from torchbert.tasks.tagging import TokenSettings
    from torchbert.train.finetune import FinetuneSettings

    (tmp_path / "random").mkdir()
    (tmp_path / "random" / "config.json").write_text("{}")  # a model folder, as --model must be
    for task, lr, ts in (("classification", 5e-4, TaskSettings(type="classification", max_length=64)),
                         ("token", None, TokenSettings(type="token", max_length=32, doc_stride=7,
                                                       label_all_subtokens=True))):
        s, cfg = FinetuneSettings(task=task, model=tmp_path / "random", train=tmp_path / "train.tsv",
                                  dev=tmp_path / "dev.tsv", out=tmp_path / "run", epochs=15,
                                  task_settings=ts).resolve(lr=lr, batch_size=16, seed=2, progress=False)
        r = Printed(tmp_path)
        r.finetune("run", s, cfg)
        args = parsed(r.argv)
        s2, cfg2 = settings(args)
        assert replace(s2, given=None) == replace(s, command_line=None)
        assert cfg2 == cfg


def test_the_other_printed_commands_give_the_same_settings(tmp_path):
    from torchbert.commands.prepare import PrepareInputs
    from torchbert.data.pretraining import PrepareSettings
    from torchbert.data.vocabulary import VocabSettings
    from torchbert.tasks.predict import EvaluateSettings, PredictSettings

    r = Printed(tmp_path)
    v = VocabSettings(corpus=[str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], vocab_size=2000,
                      out=str(tmp_path / "vocab"), lowercase=False)
    r.vocab("vocab", v, overwrite=True)
    args = parsed(r.argv)
    assert settings_from(VocabSettings, args) == v and args.overwrite and "--no-lowercase" in r.argv

    p = PrepareSettings(whole_word=True, max_seq_len=32, heldout_docs=10, seed=0, mask_replace=(0.7, 0.2))
    r.prepare("prepare", [tmp_path / "corpus.txt"], tmp_path / "vocab", tmp_path / "data", p)
    args = parsed(r.argv)
    assert not args.overwrite
    r.prepare("prepare", [tmp_path / "corpus.txt"], tmp_path / "vocab", tmp_path / "data", p, overwrite=True)
    args = parsed(r.argv)
    assert args.overwrite
    assert settings_from(PrepareSettings, args) == p
    assert settings_from(PrepareInputs, args) == PrepareInputs(corpus=[str(tmp_path / "corpus.txt")],
                                                               tokenizer=str(tmp_path / "vocab"),
                                                               out=str(tmp_path / "data"))
    r.evaluate("test", tmp_path / "run", tmp_path / "test.tsv", tmp_path / "test.json")
    args = parsed(r.argv)
    assert settings_from(EvaluateSettings, args) == EvaluateSettings(data=str(tmp_path / "test.tsv"),
                                                                     out=str(tmp_path / "test.json"))
    assert args.model == str(tmp_path / "run") and args.quiet
    r.predict("predict", tmp_path / "run", tmp_path / "x.tsv", tmp_path / "x.jsonl")
    args = parsed(r.argv)
    assert settings_from(PredictSettings, args) == PredictSettings(input=str(tmp_path / "x.tsv"),
                                                                   out=str(tmp_path / "x.jsonl"))


def test_each_stage_calls_the_library_as_its_command_does(tmp_path, monkeypatch):
    """What each stage hands the library (--overwrite included) and what it writes and prints of the
    answer: the scores as JSON, the records as JSON lines in UTF-8, a training run's report."""
    import torchbert.data.pipeline as pipeline
    import torchbert.tasks.predict as predict
    import torchbert.train.finetune as finetune
    from torchbert.data.vocabulary import VocabSettings
    from torchbert.data.pretraining import PrepareSettings
    from torchbert.tasks.families import TaskSettings

    calls, logged = [], []
    monkeypatch.setattr(pipeline, "prepare", lambda *a, **kw: calls.append(kw) or
                        {"counts": {"instances": 3, "tokens": 40}})
    monkeypatch.setattr(predict, "run_evaluate", lambda *a, **kw: ({"accuracy": 0.75}, []))
    monkeypatch.setattr(predict, "run_predict", lambda *a, **kw: [{"id": "0", "label": "好评"}])
    monkeypatch.setattr(finetune, "run_finetuning", lambda s, cfg, **kw: {"dev": 0.5})
    monkeypatch.setattr(finetune, "report_lines", lambda result, out: [f"dev accuracy {result['dev']}"])
    r = Stages(tmp_path, logged.append)
    r.prepare("prepare", [tmp_path / "c.txt"], tmp_path / "vocab", tmp_path / "data", PrepareSettings(), overwrite=True)
    assert calls[-1]["overwrite"] is True and logged[-1] == f"wrote {tmp_path / 'data'}: 3 instances, 40 tokens"
    assert r.evaluate("test", tmp_path / "run", tmp_path / "t.tsv", tmp_path / "t.json") == {"accuracy": 0.75}
    assert json.loads((tmp_path / "t.json").read_text(encoding="utf-8")) == {"accuracy": 0.75}
    r.predict("predict", tmp_path / "run", tmp_path / "x.tsv", tmp_path / "x.jsonl")
    assert (tmp_path / "x.jsonl").read_text(encoding="utf-8") == '{"id": "0", "label": "好评"}\n'
    (tmp_path / "random").mkdir()
    (tmp_path / "random" / "config.json").write_text("{}")
    s, cfg = finetune.FinetuneSettings(task="classification", model=tmp_path / "random", train=tmp_path / "a.tsv",
                                       dev=tmp_path / "b.tsv", out=tmp_path / "ft",
                                       task_settings=TaskSettings(type="classification")).resolve(progress=False)
    assert r.finetune("finetune", s, cfg) == {"dev": 0.5} and logged[-1] == "dev accuracy 0.5"
    # --overwrite never replaces a folder of the user's own files: refused before any training
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    v = VocabSettings(corpus=[str(tmp_path / "c.txt")], vocab_size=100, out=str(tmp_path / "mine"))
    with pytest.raises(RunFailed, match="which torchbert did not write"):
        r.vocab("vocab", v, overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"
