"""torchbert <verb>: the command line. The commands live in commands/<verb>.py, one module each
(commands/__init__.py says what a command module holds); this file makes the parser from them and
runs one, with the error handling every command shares.

Every expected failure is one line on standard error, `torchbert: error: ...`, naming the file or
argument (errors.py): exit status 2 for bad input, 1 for a run that could not finish (a full disk, a
diverged loss), 130 for an interrupt. Nothing is written unless the whole job succeeded, outputs are
checked before any work, and standard output holds only the result. `torchbert --debug COMMAND`
(or TORCHBERT_DEBUG=1) shows the traceback behind an error.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import shlex
import sys
import warnings
from pathlib import Path
from types import ModuleType

from .commands import COMMANDS
from .commands.common import check_shared
from .errors import (Interrupted, OutOfSpace, RunFailed, StudyInterrupted, Terminated, UserError, interrupt_raised,
                     interrupts, one_line_warning)


def commands() -> dict[str, ModuleType]:
    """The command modules by verb, in the order of `torchbert --help`."""
    return {name.replace("_", "-"): importlib.import_module(f".commands.{name}", __package__) for name in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(
        prog="torchbert",
        description="BERT on PyTorch: tokenize, embed, pretrain and fine-tune; reads and writes "
                    "Hugging Face checkpoints.")
    p.add_argument("--version", action="version", version=f"torchbert {__version__}")
    p.add_argument("--debug", action="store_true",
                   help="show the traceback behind an error (also: TORCHBERT_DEBUG=1)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in commands().values():
        module.add(sub)
    return p


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The command line; an argument the command does not take is its command's error (with its usage),
    and a flag near one it takes names that one: `finetune ... --epocs 3` says "did you mean --epochs"."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    name = next((a for a in argv if not a.startswith("-")), None)
    if name in commands:  # a flag the command does not know, before argparse asks for the required ones
        command = commands[name]
        flags = [o for a in command._actions for o in a.option_strings]
        tail = argv[argv.index(name) + 1:]
        tail = tail[:tail.index("--")] if "--" in tail else tail
        unknown = [x for x in tail if x.startswith("--") and not any(f.startswith(x.split("=", 1)[0]) for f in flags)]
        if unknown:
            _unrecognized(command, name, flags, unknown)
    args, extra = parser.parse_known_args(argv)
    if extra:
        command = commands[args.command]
        _unrecognized(command, args.command, [o for a in command._actions for o in a.option_strings], extra)
    return args


# flags that name one thing in different commands: the file a command reads is predict's and embed's
# --input, evaluate's --data, vocab's and prepare's --corpus, finetune's --train; one given to a command
# that names it otherwise is pointed at that command's own name before any flag spelled like it
KIN = (("--input", "--data", "--corpus", "--train"),)


def _unrecognized(command: argparse.ArgumentParser, name: str, flags: list[str], extra: list[str]) -> None:
    import difflib

    unknown = next((x.split("=", 1)[0] for x in extra if x.startswith("-")), extra[0])
    kin = [f for group in KIN if unknown in group for f in group if f in flags]
    spelled = [f for f in flags if f.startswith("--") and f != "--help"]  # --help is no flag's misspelling
    near = kin[:1] or difflib.get_close_matches(unknown, spelled, n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]}?" if near else f" (see torchbert {name} --help)"
    command.error(f"unrecognized argument{'s' if len(extra) > 1 else ''}: {' '.join(extra)}{hint}")


BAD_INPUT = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
             PermissionError, UnicodeError)


def describe(e: BaseException) -> tuple[int, str]:
    """(exit status, one line) for an exception that ended a command."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return 1, str(OutOfSpace(os.path.dirname(e.filename) if e.filename else "the disk"))
    if isinstance(e, OSError) and e.errno is not None and e.filename:  # the system's own words
        return (2 if isinstance(e, BAD_INPUT) else 1), f"{e.filename}: {e.strerror}"
    if isinstance(e, RuntimeError) and str(e).startswith("Symlink loop from "):  # pathlib's resolve, Python < 3.13
        return 2, f"{str(e)[len('Symlink loop from '):].strip(chr(39))}: a symbolic link that loops (it never reaches a file)"
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
    if isinstance(e, RunFailed):
        return 1, text
    if isinstance(e, BAD_INPUT):
        return 2, text
    if isinstance(e, OSError):
        return 1, text
    return 1, (f"unexpected {type(e).__name__}: {text} (a bug in torchbert: please report it with the output of "
               "`torchbert --debug ...`, which shows where it happened)")


def resume_command(argv: list[str]) -> str:
    """The command line that continues an interrupted run: the same, with --resume."""
    args = [a for a in argv if a not in ("--overwrite", "--resume", "--debug")]
    return shlex.join(["torchbert", *args, "--resume"])


def _interrupted(e: BaseException | None, args: argparse.Namespace, argv: list[str]) -> str:
    from .commands.prepare import PrepareInterrupted

    if isinstance(e, PrepareInterrupted):
        return (f"{'stopped by SIGTERM' if isinstance(e.__context__, Terminated) else 'interrupted'}; {e.work} keeps "
                f"the finished pieces and blocks; continue with: {resume_command(argv)}")
    if isinstance(e, StudyInterrupted):
        done = f"{e.done} of {e.total}" if e.total else f"{e.done}"
        return (f"interrupted after {done} stages; {args.out} keeps the finished ones; continue with: "
                f"{resume_command(argv)}")
    if isinstance(e, Interrupted) and e.checkpoint is not None:
        return (f"{e.signal_name}: stopped at step {e.step} and saved {e.checkpoint}; continue with: "
                f"{resume_command(argv)}")
    if args.command in ("compare", "benchmark") and (Path(args.out) / "settings.json").is_file():
        return f"interrupted; {args.out} keeps the runs that finished; continue with: {resume_command(argv)}"
    if not trains_run(args.command):
        return f"{'stopped by SIGTERM' if isinstance(e, Terminated) else 'interrupted'}; no output was written"
    out = Path(args.out)
    # by name only: torch may be half imported when the interrupt came
    saved = sorted((out / "checkpoints").glob("step-*/manifest.json")) if not isinstance(e, Interrupted) else []
    if saved:  # a second Ctrl-C in a run that had saved checkpoints
        return f"interrupted; {saved[-1].parent} is kept; continue with: {resume_command(argv)}"
    return f"interrupted before the first checkpoint; {out} is as it was before this run"


def trains_run(command: str) -> bool:
    """Whether the command trains in a run folder with checkpoints: --resume continues it with the
    settings it started with, those not given again."""
    return getattr(commands()[command], "TRAINS_RUN", False)


def writes_folder(command: str) -> bool:
    """Whether the command writes a folder (--out): it holds it for as long as it runs (io/files.hold),
    so that two of them started on one folder cannot mix their runs."""
    return getattr(commands()[command], "WRITES_FOLDER", False)


def _holding(args: argparse.Namespace, argv: list[str]):
    from .io.files import hold

    if not writes_folder(args.command) or os.environ.get("RANK", "0") != "0":  # under torchrun, process 0 holds it
        return contextlib.nullcontext()
    command = " ".join(["torchbert", *argv])
    return hold(Path(args.out), command if len(command) <= 300 else command[:297] + "...")


def _governed(args: argparse.Namespace):
    """The commands that compute share the CPUs with the other torchbert jobs (fast/threads.py)."""
    if not getattr(commands()[args.command], "COMPUTES", False):
        return contextlib.nullcontext()
    from .fast.threads import governed

    return governed(getattr(args, "threads", None))


def given_flags(argv: list[str]) -> tuple[str, ...]:
    """The settings (argparse dests) that `argv` gives, told apart from defaults by parsing it again
    with every default suppressed (abbreviations and --flag=value forms included)."""
    parser = build_parser()

    def suppress(p: argparse.ArgumentParser) -> None:
        p._defaults.clear()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    suppress(sub)
            elif action.dest != "help":
                action.default = argparse.SUPPRESS

    suppress(parser)
    return tuple(sorted(k for k in vars(parser.parse_args(argv)) if k not in ("command", "debug")))


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM raises Terminated (a KeyboardInterrupt) while the command runs, so that a command
    stopped by `timeout`, systemd, docker or Kubernetes cleans up as on Ctrl-C (temporary folders
    removed, an earlier folder put back); the handler before is restored after.

    Python runs a signal's handler at whatever instruction comes next, and when that is inside a
    finalizer (a __del__, a weak reference's callback: the garbage collector runs them anywhere), the
    exception it raises is printed as "Exception ignored" and dropped: the stop would be lost and a
    study would run on to its end. While the command runs, an interrupt dropped that way is sent again
    (sys.unraisablehook, the hook before restored after), to land in ordinary code. Both handlers (SIGTERM's,
    and Ctrl-C's where it is Python's own) count what they raise (errors.interrupts): an error that C++ code
    made of one is told as the interrupt."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        interrupt_raised()
        raise Terminated()

    def interrupt(signum, frame):  # Ctrl-C: Python's own KeyboardInterrupt, counted
        interrupt_raised()
        signal.default_int_handler(signum, frame)

    def redeliver(unraisable):
        if isinstance(unraisable.exc_value, KeyboardInterrupt):  # SIGTERM, Ctrl-C, a training run's second signal
            signum = signal.SIGTERM if isinstance(unraisable.exc_value, Terminated) else signal.SIGINT
            # from another thread, a moment later: sent from here, its handler would run in this hook and be
            # dropped again; should it land in a finalizer once more, this sends it once more
            later = threading.Timer(0.01, os.kill, (os.getpid(), signum))
            later.daemon = True
            later.start()
        else:
            hook(unraisable)

    old, hook = signal.signal(signal.SIGTERM, terminate), sys.unraisablehook
    old_int = signal.getsignal(signal.SIGINT)
    if old_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupt)
    sys.unraisablehook = redeliver
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
        if old_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, old_int)
        sys.unraisablehook = hook


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(build_parser(), argv)
    debug = args.debug or os.environ.get("TORCHBERT_DEBUG", "") not in ("", "0")
    signalled = interrupts()
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = one_line_warning
        try:
            if trains_run(args.command):  # a resumed run keeps the settings not given again
                args.given = given_flags(argv)
            if getattr(args, "out", None) == "-" and not getattr(commands()[args.command], "STDOUT", False):
                raise UserError(f"--out -: {args.command} writes {'a folder' if writes_folder(args.command) else 'a file'}"
                                ", not standard output; give a path")
            if getattr(args, "out", None) not in (None, "-"):  # a link names its target: the link is never replaced
                from .io.files import output_path

                args.out = str(output_path(args.out))
            check_shared(args)
            args.command_line = shlex.join(["torchbert", *argv])  # for a run record
            # serve: uvicorn takes SIGTERM for a graceful shutdown of its own
            terminating = _sigterm_interrupts() if args.command != "serve" else contextlib.nullcontext()
            with terminating, _holding(args, argv), _governed(args):
                args.func(args)
        except Interrupted as e:
            print(f"torchbert: {_interrupted(e, args, argv)}", file=sys.stderr)
            return 130
        except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM (Terminated), a study's stage (StudyInterrupted)
            print(f"torchbert: {_interrupted(e, args, argv)}", file=sys.stderr)
            return 130
        except Exception as e:
            if interrupts() > signalled and not debug:  # an interrupt that C++ code turned into an error
                print(f"torchbert: {_interrupted(None, args, argv)}", file=sys.stderr)
                return 130
            if debug:
                raise
            code, text = describe(e)
            print(f"torchbert: error: {text}", file=sys.stderr)
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
