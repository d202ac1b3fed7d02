"""Settings declared once. A dataclass field made by `setting` carries its default, its help text and
its bounds; `Checked` runs the bounds when the dataclass is made, so the Python API refuses what the
command line refuses; `add_flags` makes a command's flags from the fields, and `from_args` the
dataclass from the parsed flags. A field named `batch_size` is the flag `--batch-size`.

    @dataclass
    class TrainConfig(Checked):
        batch_size: int = setting(32, "sequences per micro-batch", low=1)

    TrainConfig(batch_size=0)   # SettingError: batch_size must be >= 1, got 0
    add_flags(parser, TrainConfig)   # --batch-size N   sequences per micro-batch (default: 32)

A SettingError names the field; the command line reports it as its flag (`--batch-size must be ...`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, field, fields
from pathlib import Path
from typing import Any


class SettingError(ValueError):
    """A setting out of its bounds: `name` is the field, the message says what it must be."""

    def __init__(self, name: str, message: str, flag: str | None = None):
        super().__init__(f"{name} {message}")
        self.name, self.message, self.flag = name, message, flag

    def as_flag(self) -> str:
        return f"{self.flag or '--' + self.name.replace('_', '-')} {self.message}"


def setting(default: Any = MISSING, help: str = "", *, low: float | None = None, high: float | None = None,
            above: float | None = None, below: float | None = None,
            choices: Iterable[str] | Callable[[], Iterable[str]] | None = None,
            flag: str | None = None, aliases: tuple[str, ...] = (), metavar: str | tuple[str, ...] | None = None,
            cli: bool = True) -> Any:
    """A dataclass field with its help and bounds: low <= value <= high, above < value < below (numbers
    are also finite), value in choices (or in what a function gives when asked: the names of a registry
    that may grow after the field is declared). None passes every bound (a setting that is unset). flag: the
    command line's name when it is not the field's (a name without dashes is a positional argument);
    aliases: more names for the same flag. A bool that defaults to False is a switch (--NAME); one
    that defaults to True or None (unset) takes --NAME and --no-NAME, and one with its own `flag`
    that defaults to True is turned off by that flag. cli=False: no flag (set by the program, not the
    user)."""
    meta = {"help": help, "low": low, "high": high, "above": above, "below": below, "flag": flag,
            "aliases": tuple(aliases),
            "choices": choices if choices is None or callable(choices) else tuple(choices),
            "metavar": metavar, "cli": cli}
    return field(default=default, metadata=meta)


SEED_MAX = 2**32 - 1  # numpy's and torch's seeds alike; a seed and the runs after it stay far below torch's 2**64
MAX_EPOCHS = 10_000  # passes over a training set (finetune, benchmark): the step count they make stays a number


def seed_setting(default: int, help: str) -> Any:
    """The one seed flag of every command: a whole number in [0, SEED_MAX], checked when the flags are
    read (numpy refuses a negative seed only when the run draws its first number)."""
    return setting(default, help, low=0, high=SEED_MAX, metavar="SEED")


def choices_of(f: Field) -> tuple | None:
    """The values a setting may take (None: any)."""
    choices = f.metadata.get("choices")
    return tuple(choices()) if callable(choices) else choices


def check_field(f: Field, value: Any) -> None:
    m = f.metadata
    if value is None or not m:
        return
    if isinstance(value, list):  # each value of a list setting, against the field's bounds
        for v in value:
            check_field(f, v)
        return
    choices = choices_of(f)
    if choices is not None and value not in choices:
        raise SettingError(f.name, f"must be one of {', '.join(map(str, choices))}, got {value!r}", m["flag"])
    lower = ("[", m["low"]) if m["low"] is not None else ("(", m["above"]) if m["above"] is not None else None
    upper = ("]", m["high"]) if m["high"] is not None else (")", m["below"]) if m["below"] is not None else None
    if lower is None and upper is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SettingError(f.name, f"must be a finite number, got {value!r}", m["flag"])
    low_ok = lower is None or (value >= lower[1] if lower[0] == "[" else value > lower[1])
    high_ok = upper is None or (value <= upper[1] if upper[0] == "]" else value < upper[1])
    if low_ok and high_ok:
        return
    if lower is not None and upper is not None:
        want = f"in {lower[0]}{readable_number(lower[1])}, {readable_number(upper[1])}{upper[0]}"
    elif lower is not None:
        want = f"{'>=' if lower[0] == '[' else '>'} {readable_number(lower[1])}"
    else:
        want = f"{'<=' if upper[0] == ']' else '<'} {readable_number(upper[1])}"
    raise SettingError(f.name, f"must be {want}, got {readable_number(value)}", m["flag"])


def readable_number(value: float) -> str:
    """A bound or value as people read it: 0.5, 65535, 1,048,576 (a whole number of a million or more
    with its thousands marked, not 1.04858e+06)."""
    return f"{value:,}" if isinstance(value, int) and abs(value) >= 10**6 else f"{value:g}"


class Checked:
    """A dataclass mixin: every `setting` field is checked against its bounds when the object is made
    (and by `check()` after a field was changed)."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            check_field(f, getattr(self, f.name))


def _type(f: Field) -> str:
    """The field's type by name ('int', 'float', 'bool', 'str', 'tuple' of floats, or 'list' of one or
    more strings or whole numbers): annotations are strings here."""
    text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if text.startswith("tuple["):
        return "tuple"
    if text.startswith("list["):
        return "list"
    for name in ("bool", "int", "float"):
        if name in text.replace("|", " ").split():
            return name
    return "str"


def _default_text(value: Any) -> str:
    if isinstance(value, tuple):
        return " ".join(map(_default_text, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, *,
              only: Iterable[str] | None = None, skip: Iterable[str] = (),
              defaults: Mapping[str, Any] | None = None, helps: Mapping[str, str] | None = None) -> None:
    """A flag for each `setting` field of `cls` (in field order; `only` in its own order). defaults:
    a command's own default for a field (its help says so); helps: a command's own help of a field,
    where the field's own words do not fit it. A help that mentions its default keeps its words."""
    by_name = {f.name: f for f in fields(cls) if f.metadata.get("cli", False)}
    names = list(only) if only is not None else list(by_name)
    for name in names:
        if name in skip:
            continue
        if name not in by_name:
            raise KeyError(f"{cls.__name__} has no setting {name!r} for the command line")
        f, m = by_name[name], by_name[name].metadata
        default = (defaults or {}).get(name, f.default if f.default is not MISSING else None)
        text = (helps or {}).get(name, m["help"])
        kind = _type(f)
        flag = m["flag"] or f"--{name.replace('_', '-')}"
        names = (flag, *m["aliases"])
        if kind == "bool":
            if default and m["flag"]:
                parser.add_argument(*names, dest=name, action="store_false", help=text.replace("%", "%%"))
            elif default or default is None:  # on or unset: both forms
                parser.add_argument(*names, dest=name, action=argparse.BooleanOptionalAction, default=default,
                                    help=text.replace("%", "%%"))
            else:
                parser.add_argument(*names, dest=name, action="store_true", help=text.replace("%", "%%"))
            continue
        if default is not None and "default" not in text:
            text = f"{text} (default: {_default_text(default)})" if text else f"(default: {_default_text(default)})"
        kw: dict[str, Any] = {"dest": name, "default": default, "help": text.replace("%", "%%")}
        if kind in ("int", "float"):
            kw["type"] = int if kind == "int" else float
        if kind == "tuple":  # a fixed number of floats, one metavar each
            kw.update(type=float, nargs=len(m["metavar"]), metavar=tuple(m["metavar"]))
        elif kind == "list":  # one value or more (whole numbers for a list[int])
            kw.update(nargs="+", metavar=m["metavar"], **({"type": int} if "list[int]" in str(f.type) else {}))
        elif m["metavar"]:
            kw["metavar"] = m["metavar"]
        elif m["choices"] is not None:  # shown here, checked by the dataclass (a one-line error, not argparse's)
            kw["metavar"] = "{" + ",".join(map(str, choices_of(f))) + "}"
        required = f.default is MISSING and f.default_factory is MISSING and name not in (defaults or {})
        if not flag.startswith("-"):  # a positional argument: named by its place, required by being there
            del kw["dest"]
            parser.add_argument(name, **kw, **({} if required else {"nargs": "?"}))
            continue
        parser.add_argument(*names, required=required, **kw)


def from_args(cls: type, args: argparse.Namespace, **given: Any) -> Any:
    """`cls` from the parsed flags that are its fields, and `given` (what the command computed)."""
    paths = {f.name for f in fields(cls) if "Path" in str(f.type)}
    tuples = {f.name for f in fields(cls) if _type(f) == "tuple"}
    names = {f.name for f in fields(cls)}
    values = {k: Path(v) if k in paths and isinstance(v, str) else tuple(v) if k in tuples and v is not None else v
              for k, v in vars(args).items() if k in names}
    return cls(**{**values, **given})


def as_flags(obj: Any, *, only: Iterable[str] | None = None, skip: Iterable[str] = (),
             defaults: Mapping[str, Any] | None = None) -> list[str]:
    """The command-line words that give `obj`'s settings (the flags `add_flags(parser, type(obj), only=,
    skip=, defaults=)` made): each field that differs from its default, and every required one; positional
    arguments first. What the studies print so that each of their stages can be run from a shell."""
    by_name = {f.name: f for f in fields(obj) if f.metadata.get("cli", False)}
    names = [n for n in (list(only) if only is not None else list(by_name)) if n not in skip]
    positional: list[str] = []
    flags: list[str] = []
    for name in names:
        f, m = by_name[name], by_name[name].metadata
        value = getattr(obj, name)
        required = f.default is MISSING and f.default_factory is MISSING and name not in (defaults or {})
        default = (defaults or {}).get(name, f.default if f.default is not MISSING else None)
        if not required and (value == default or (value is None and default is None)):
            continue
        flag = m["flag"] or f"--{name.replace('_', '-')}"
        kind = _type(f)
        if kind == "bool":
            if default and m["flag"]:  # a store_false flag of its own
                flags.append(flag)
            else:
                flags.append(flag if value else f"--no-{flag[2:]}")
            continue
        words = [str(v) for v in value] if kind in ("tuple", "list") else [str(value)]  # str(0.1): 0.1
        if not flag.startswith("-"):
            positional += words
        else:
            flags += [flag, *words]
    return positional + flags
