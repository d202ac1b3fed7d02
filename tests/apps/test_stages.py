"""The studies' stages (apps/stages.py): each calls the library with settings objects and prints the
command line that runs the same; parsed back by the command line's own parser, that line gives
equal objects, so what a demo or compare ran can be run again from a shell."""

import shlex
from dataclasses import replace

import pytest

from torchbert.train.recipes import RECIPES
from torchbert.apps.stages import Stages
from torchbert.cli import build_parser
from torchbert.commands.common import settings_from
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


class Printed(Stages):
    """Stages that print their command lines and run nothing."""

    def run(self, name, argv, call):
        self.argv = [str(a) for a in argv]
        return {}


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
