"""What can go wrong, sorted by who can put it right. The command line prints each as one line.

UserError    the input is wrong (a file, an argument): exit status 2, fix the input and run again.
RunFailed    the input was fine but the run could not finish (the loss diverged, the disk filled):
             exit status 1; what was saved before stays.
OutOfSpace   a RunFailed for a full disk, naming the folder that could not be written.
NonFiniteOutput  a RunFailed: the model's outputs hold NaN or inf (finite weights can overflow); nothing
             is written, scored or served from them.
Interrupted  SIGINT or SIGTERM stopped a run after it saved a checkpoint: exit status 130.
Terminated   SIGTERM anywhere in a command (what `timeout`, systemd, docker and Kubernetes send): raised
             as a KeyboardInterrupt, so every command cleans up on it as on Ctrl-C.
StudyInterrupted  a signal stopped `demo` or `compare`: the stages that finished are kept.

A signal's KeyboardInterrupt raised while C++ code converts a call's arguments (pybind11: matplotlib
drawing a plot) is cleared there and comes out as a TypeError ("incompatible function arguments"):
each handler that raises one counts it (`interrupt_raised`), so that an error after one reads as
the interrupt it was (`interrupts`), not as a bug.
"""

from __future__ import annotations


class UserError(ValueError):
    """An error in the user's input: printed as one line, exit status 2."""


class RunFailed(RuntimeError):
    """The run could not finish for a reason other than its input: one line, exit status 1."""


class OutOfSpace(RunFailed):
    def __init__(self, folder) -> None:
        super().__init__(f"no space left on {folder}: free some space there, or write to another disk, "
                         "and run again")
        self.folder = folder

    def __reduce__(self):
        return type(self), (self.folder,)


class NonFiniteOutput(RunFailed):
    """The model gave NaN or inf (its weights are finite: checked when loaded), for `where`."""


class Interrupted(Exception):
    """A signal stopped the run; `checkpoint` is the folder it saved before stopping (None: nothing)."""

    def __init__(self, signal_name: str, step: int, checkpoint) -> None:
        super().__init__(f"{signal_name} at step {step}")
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program was (cli.main installs the handler for the command's time)."""


_raised = 0  # the interrupts torchbert's signal handlers raised in this process


def interrupt_raised() -> None:
    """A signal handler is about to raise its KeyboardInterrupt (see the module's docstring)."""
    global _raised
    _raised += 1


def interrupts() -> int:
    """How many interrupts torchbert's signal handlers raised in this process: an exception that came
    while the count grew came from one."""
    return _raised


class StudyInterrupted(KeyboardInterrupt):
    """A signal stopped a study of many stages (demo, compare) after `done` of `total` stages."""

    def __init__(self, done: int, total: int | None) -> None:
        super().__init__(f"interrupted after {done} of {total or '?'} stages")
        self.done, self.total = done, total

    def __reduce__(self):  # pickled from a worker process (benchmark --jobs) with its own arguments
        return type(self), (self.done, self.total)


def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """warnings.showwarning for torchbert's own processes (the CLI, the server's worker): the message in
    one line, without the source path and code line Python adds (`--debug` keeps Python's)."""
    import sys

    print(f"torchbert: warning: {message}", file=sys.stderr)
