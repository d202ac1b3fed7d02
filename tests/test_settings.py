"""Settings declared once (settings.py): a field's default, help and bounds make the command line's flag,
and the Python API refuses what the command line refuses."""

from __future__ import annotations  # annotations as text, as the settings modules write them

import re
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from torchbert.apps.batcher import Limits
from torchbert.cli import build_parser, main
from torchbert.data.pretraining import PrepareSettings
from torchbert.settings import Checked, SettingError, add_flags, choices_of, from_args, setting
from torchbert.tasks.families import TaskSettings
from torchbert.train.finetune import LOOP_DEFAULTS, LOOP_DERIVED, FinetuneSettings
from torchbert.train.loop import TrainConfig
from torchbert.train.pretrain import PretrainSettings

SRC = Path(__file__).resolve().parents[1] / "src" / "torchbert"
CLI = [SRC / "cli.py", *sorted((SRC / "commands").glob("*.py"))]


@dataclass
class Example(Checked):
    name: str = setting(help="a required one")
    count: int = setting(3, "how many", low=1)
    share: float = setting(0.5, "a share", low=0, below=1)
    rate: float | None = setting(None, "unset is fine", above=0, high=2)
    kind: str = setting("a", "one of two", choices=("a", "b"))
    on: bool = setting(True, "turn it off", flag="--no-on")
    seconds: float = setting(1.0, "a flag of another name", above=0, flag="--timeout")


@pytest.mark.parametrize("given,message", [
    (dict(count=0), "count must be >= 1, got 0"),
    (dict(share=1.0), "share must be in [0, 1), got 1"),
    (dict(share=-0.1), "share must be in [0, 1), got -0.1"),
    (dict(rate=0.0), "rate must be in (0, 2], got 0"),
    (dict(rate=float("nan")), "rate must be a finite number, got nan"),
    (dict(kind="c"), "kind must be one of a, b, got 'c'"),
    (dict(count=True), "count must be a finite number, got True"),
])
def test_a_value_out_of_its_bounds_is_refused_by_the_dataclass_itself(given, message):
    with pytest.raises(SettingError, match=re.escape(message)):
        Example(name="x", **given)
    Example(name="x", rate=None)  # unset passes every bound
    Example(name="x", share=0.0, rate=2.0)  # the closed ends are inside


def test_the_flags_are_the_fields_with_their_defaults_help_and_names():
    import argparse

    p = argparse.ArgumentParser()
    add_flags(p, Example)
    args = p.parse_args(["--name", "n"])
    assert vars(args) == {"name": "n", "count": 3, "share": 0.5, "rate": None, "kind": "a", "on": True, "seconds": 1.0}
    args = p.parse_args(["--name", "n", "--count", "7", "--no-on", "--timeout", "2.5", "--kind", "b"])
    assert from_args(Example, args) == Example(name="n", count=7, on=False, seconds=2.5, kind="b")
    text = p.format_help()
    assert "how many (default: 3)" in text and "unset is fine" in text and "(default: None)" not in text
    with pytest.raises(SystemExit):
        p.parse_args([])  # --name is required: it has no default
    err = pytest.raises(SettingError, from_args, Example, p.parse_args(["--name", "n", "--timeout", "0"])).value
    assert err.as_flag() == "--timeout must be > 0, got 0"  # named as the user typed it


@dataclass
class Shapes(Checked):
    """Settings of the shapes the command line also takes: choices any iterable gives (once), a list
    of values each within the bounds, a bound from above only, a tuple, a type whose name holds another's."""

    letter: str = setting("a", "from a generator", choices=(c for c in "ab"))
    found: str = setting("a", "from a registry asked when checked", choices=lambda: (c for c in "ab"))
    sizes: list[int] | None = setting(None, "one or more", low=1, metavar="N")
    under: float = setting(1.0, "below five", below=5)
    at_most: int = setting(1, "five or fewer", high=5)
    betas: tuple[float, float] = setting((0.9, 0.999), "two rates", metavar=("B1", "B2"))
    checkpoint: Checkpoint | None = setting(None, "a type whose name holds int")


class Checkpoint:
    """A type named in an annotation: its name holds "int", and it is no whole number."""


@pytest.mark.parametrize("given,message", [
    (dict(letter="c"), "letter must be one of a, b, got 'c'"),
    (dict(found="c"), "found must be one of a, b, got 'c'"),
    (dict(sizes=[2, 0]), "sizes must be >= 1, got 0"),
    (dict(under=5), "under must be < 5, got 5"),
    (dict(at_most=6), "at_most must be <= 5, got 6"),
])
def test_settings_of_every_shape_are_checked(given, message):
    for _ in range(2):  # a generator's choices are kept, not used up by the first check
        Shapes(letter="b", found="b", sizes=[1, 3])
    with pytest.raises(SettingError, match=f"^{re.escape(message)}$"):
        Shapes(**given)


@dataclass(kw_only=True)
class Words(Checked):
    """A positional argument (optional: it has a default), a field without help, and help with a %."""

    level: int = setting(2)
    share: float = setting(0.5, "a share of 100% or less", low=0, high=1)
    where: str = setting(".", "the folder", flag="where")
    name: str = setting(help="required")


def test_positional_arguments_bare_defaults_and_the_words_that_give_them():
    """add_flags' flags, and as_flags' words for an object: positional arguments first, then each flag
    whose value differs from its default (a command's own defaults count), in field order or `only`'s."""
    import argparse

    from torchbert.settings import as_flags

    p = argparse.ArgumentParser()
    add_flags(p, Words)
    assert vars(p.parse_args(["--name", "n"])) == {"where": ".", "level": 2, "share": 0.5, "name": "n"}
    assert p.parse_args(["runs", "--name", "n"]).where == "runs"
    helps = {a.dest: a.help for a in p._actions}
    assert helps["level"] == "(default: 2)" and "100%% or less (default: 0.5)" in helps["share"]
    assert "a share of 100% or less" in p.format_help()
    words = Words(where="runs", level=3, share=0.25, name="n")
    assert as_flags(words) == ["runs", "--level", "3", "--share", "0.25", "--name", "n"]
    assert as_flags(Words(name="n")) == ["--name", "n"]  # the required one, always
    assert as_flags(words, only=["share", "level"]) == ["--share", "0.25", "--level", "3"]
    assert as_flags(words, only=["share", "level"], skip=["level"]) == ["--share", "0.25"]
    assert as_flags(words, skip=["where"], defaults={"name": "n", "level": 3}) == ["--share", "0.25"]
    args = p.parse_args(as_flags(words))
    assert from_args(Words, args) == words  # the words give the object back


def test_flags_of_every_shape_and_readable_numbers():
    import argparse

    from torchbert.settings import readable_number

    p = argparse.ArgumentParser()
    add_flags(p, Shapes)
    text = " ".join(p.format_help().split())
    assert "two rates (default: 0.9 0.999)" in text and "--letter {a,b}" in text
    args = p.parse_args(["--sizes", "2", "3", "--betas", "0.8", "0.99", "--checkpoint", "step-100"])
    assert (args.sizes, args.betas, args.checkpoint) == ([2, 3], [0.8, 0.99], "step-100")
    assert from_args(Shapes, args).betas == (0.8, 0.99)
    with pytest.raises(KeyError, match="Shapes has no setting 'colour' for the command line"):
        add_flags(argparse.ArgumentParser(), Shapes, only=["colour"])
    assert [readable_number(x) for x in (1_048_576, -2_000_000, 999_999, 0.5, 2.5e-05)] == [
        "1,048,576", "-2,000,000", "999999", "0.5", "2.5e-05"]


@pytest.mark.parametrize("cls", [TrainConfig, PretrainSettings, FinetuneSettings, TaskSettings, Limits,
                                 PrepareSettings])
def test_the_python_api_refuses_what_the_command_line_refuses(cls):
    bounded = [f for f in fields(cls) if f.metadata and (f.metadata["low"] is not None or f.metadata["above"] is not None)]
    assert bounded, cls
    required = {f.name: "x" for f in fields(cls) if f.metadata and f.default is f.default_factory}  # MISSING both
    for f in bounded:
        bad = (f.metadata["low"] if f.metadata["low"] is not None else f.metadata["above"]) - 1
        with pytest.raises(SettingError, match=f"^{f.name} must be"):
            cls(**{**required, f.name: bad})


def parse(*argv):
    return build_parser().parse_args([str(a) for a in argv])


def test_the_command_lines_defaults_are_the_dataclasses_defaults():
    """The drift this replaced: pretrain's --warmup-steps said 100 while TrainConfig said 0."""
    from torchbert.commands.common import settings_from

    args = parse("pretrain", "--data", "d", "--out", "o")
    assert settings_from(TrainConfig, args) == TrainConfig()
    assert settings_from(PretrainSettings, args) == PretrainSettings(data=Path("d"), out=Path("o"))
    args = parse("finetune", "--task", "ner", "--model", "m", "--train", "t", "--out", "o")
    ours = settings_from(TrainConfig, args, lr=5e-5)
    assert ours == TrainConfig(**{**LOOP_DEFAULTS, "lr": 5e-5})  # fine-tuning's own seed, and nothing else
    assert all(not hasattr(args, name) for name in LOOP_DERIVED)  # derived from --epochs, not flags
    assert settings_from(TaskSettings, args, type="token", doc_stride=42) == TaskSettings(type="token", doc_stride=42)
    args = parse("serve", "--model", "m")
    assert settings_from(Limits, args) == Limits()
    args = parse("prepare", "--corpus", "c", "--tokenizer", "t", "--out", "o")
    assert settings_from(PrepareSettings, args) == PrepareSettings()
    args = parse("prepare", "--corpus", "c", "--tokenizer", "t", "--out", "o", "--mask-replace", "1", "0")
    assert settings_from(PrepareSettings, args).mask_replace == (1.0, 0.0)  # a tuple, as the field's default


def test_the_command_line_copies_no_field_list():
    """The commands make these settings through settings_from alone: they never call their constructors
    with a copy of their fields (`TrainConfig(steps=args.steps, ...)`, as cli.py did)."""
    import ast

    classes = {"TrainConfig", "PretrainSettings", "FinetuneSettings", "TaskSettings", "Limits", "PrepareSettings"}
    calls = [f"{file.name}:{node.lineno}" for file in CLI
             for node in ast.walk(ast.parse(file.read_text(encoding="utf-8")))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) in classes]
    assert calls == [], f"a settings class built by hand at {calls}"
    assert "settings_from(TrainConfig, args" in (SRC / "commands" / "pretrain.py").read_text()  # the walk reads them


def test_no_command_checks_a_bound_by_hand():
    """Issue 49: a bound is declared once, on its setting; no command writes `must be >= 1` itself (the
    model-dependent --max-length limit, which no setting can know, is the one exception)."""
    hand = [f"{file.name}: {line.strip()}" for file in CLI for line in file.read_text(encoding="utf-8").splitlines()
            if re.search(r"must be (>|<|in \[)", line) and "for this model" not in line]
    assert hand == []


def test_every_command_is_a_module_with_its_help_settings_and_run():
    from torchbert.cli import commands

    found = commands()
    assert list(found)[:2] == ["embed", "serve"] and "inspect-data" in found
    for verb, module in found.items():
        assert module.__doc__ and "\n\n" in module.__doc__, f"{verb}: a docstring of a help line and a description"
        assert callable(module.add) and callable(module.run), verb
    help_text = build_parser().format_help()
    assert all(verb in help_text for verb in found)


def settings_classes() -> list[type]:
    """Every settings dataclass of the package (a Checked class with a field made by `setting`)."""
    import importlib
    import pkgutil

    import torchbert

    for m in pkgutil.walk_packages(torchbert.__path__, "torchbert."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)
    found, todo = [], list(Checked.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__module__.startswith("torchbert.") and any(f.metadata for f in fields(cls)):
            found.append(cls)
    return sorted(set(found), key=lambda c: (c.__module__, c.__name__))


def test_the_settings_classes_are_found():
    from torchbert.data.vocabulary import VocabSettings
    from torchbert.tasks.predict import EvaluateSettings

    found = settings_classes()
    assert {VocabSettings, EvaluateSettings, TrainConfig, PretrainSettings, FinetuneSettings} <= set(found)
    # every command's flags come from some of them
    assert len(found) >= 15


@pytest.mark.parametrize("cls", settings_classes(), ids=lambda c: c.__name__)
def test_a_settings_class_refuses_what_its_flags_refuse(cls):
    """Each settings dataclass is Checked: its bounds hold from Python as from the command line."""
    def fits(f):  # a value a required setting takes
        m = f.metadata
        if m["choices"]:
            return choices_of(f)[0]
        return m["low"] if m["low"] is not None else m["above"] + 1 if m["above"] is not None else "x"

    required = {f.name: fits(f) for f in fields(cls) if f.metadata and f.default is f.default_factory}
    cls(**required)  # the defaults pass
    for f in fields(cls):
        m = f.metadata
        if m and m["choices"]:
            with pytest.raises(SettingError, match=f"^{f.name} must be one of"):
                cls(**{**required, f.name: "nothing of the kind"})
        elif m and (m["low"] is not None or m["above"] is not None):
            bad = (m["low"] if m["low"] is not None else m["above"]) - 1
            with pytest.raises(SettingError, match=f"^{f.name} must be"):
                cls(**{**required, f.name: bad})


def test_the_python_api_runs_what_the_command_line_runs(tmp_path):
    """FinetuneSettings.resolve fills in what `torchbert finetune` fills in: the settings and the loop's
    from Python equal the command line's, flag for flag."""
    from torchbert.commands.finetune import settings

    model = tmp_path / "bert"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "bert"}')
    argv = ["finetune", "--task", "token", "--model", model, "--train", "t", "--out", "o", "--max-length", "96"]
    args = parse(*argv, "--quiet")
    from_cli = settings(args)
    ours = FinetuneSettings(task="token", model=model, train=Path("t"), out=Path("o"),
                            task_settings=TaskSettings(type="token", max_length=96)).resolve(progress=False)
    assert ours[1] == from_cli[1] and ours[1].lr == 5e-5 and ours[1].seed == 42
    assert ours[0].task_settings.doc_stride == from_cli[0].task_settings.doc_stride == 32
    assert type(from_cli[0].task_settings).__name__ == "TokenSettings"
    assert ours[0].model == from_cli[0].model and ours[0].task == from_cli[0].task
    (model / "config.json").write_text('{"model_type": "torchbert-elmo"}')  # a task model on frozen features: a larger step
    assert settings(parse(*argv))[1].lr == FinetuneSettings(task="token", model=model, train=Path("t"),
                                                             out=Path("o")).resolve()[1].lr == 1e-3


@pytest.mark.parametrize("argv,message", [
    (["pretrain", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["pretrain", "--dropout", "1"], "--dropout must be in [0, 1), got 1"),
    (["pretrain", "--generator-size", "0"], "--generator-size must be in (0, 1], got 0"),
    (["pretrain", "--lr", "0"], "--lr must be > 0, got 0"),
    (["finetune", "--epochs", "0"], "--epochs must be in (0, 10000], got 0"),
    (["finetune", "--warmup-ratio", "1"], "--warmup-ratio must be in [0, 1), got 1"),
    (["finetune", "--max-length", "0"], "--max-length must be >= 1, got 0"),
    (["serve", "--body-timeout", "0"], "--body-timeout must be in (0, 86400], got 0"),
    (["prepare", "--masked-lm-prob", "1"], "--masked-lm-prob must be in (0, 1), got 1"),
    (["prepare", "--mask-replace", "0.8", "0.3"], "--mask-replace ([MASK] share, random share) must be >= 0 and add "
                                                  "up to at most 1, got 0.8, 0.3"),
    (["prepare", "--masking", "both"], "--masking must be one of static, dynamic, got 'both'"),
])
def test_the_command_line_names_the_flag_out_of_bounds(argv, message, tmp_path, capsys):
    required = {"pretrain": ["--data", tmp_path / "d", "--out", tmp_path / "o"],
                "finetune": ["--task", "classification", "--model", tmp_path / "m", "--train", tmp_path / "t",
                             "--out", tmp_path / "o"],
                "serve": ["--model", tmp_path / "m"],
                "prepare": ["--corpus", tmp_path / "c", "--tokenizer", tmp_path / "t", "--out", tmp_path / "o"]}[argv[0]]
    assert main([*argv, *map(str, required)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()
