"""cli.py's own pieces, each on its own: how an error and an interrupt are told in one line, the command
line that resumes a run, the flags a command line gives, and what main does around a command (the
folder's lock, the CPU governor, the SIGTERM handler). The commands themselves are tested end to end
in test_cli.py, test_failures.py and each command's tests."""

import argparse
import errno
import signal
import sys
import threading
import time

import pytest

from torchbert import cli
from torchbert.commands.prepare import PrepareInterrupted
from torchbert.errors import Interrupted, OutOfSpace, RunFailed, StudyInterrupted, Terminated, UserError
from torchbert.fast import threads
from torchbert.io.files import hold


def last_error(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


# -- one line for an exception, and its exit status ---------------------------------------------------

def test_each_kind_of_error_is_one_line_with_its_exit_status(tmp_path):
    disk = str(tmp_path / "run" / "model.safetensors")
    for code in (errno.ENOSPC, errno.EDQUOT):  # a full disk or a spent quota: the folder it was writing
        assert cli.describe(OSError(code, "No space left on device", disk)) == (1, str(OutOfSpace(tmp_path / "run")))
    assert cli.describe(OSError(errno.ENOSPC, "No space left on device")) == (1, str(OutOfSpace("the disk")))
    assert cli.describe(PermissionError(errno.EACCES, "Permission denied", "/etc/x")) == (2, "/etc/x: Permission denied")
    assert cli.describe(OSError(errno.EIO, "Input/output error", "/dev/sdz")) == (1, "/dev/sdz: Input/output error")
    assert cli.describe(ValueError("data.jsonl:3: not valid JSON\n   expected an object\n")) == \
        (2, "data.jsonl:3: not valid JSON expected an object")  # one line, whatever the message spans
    assert cli.describe(UserError("--out x: in use")) == (2, "--out x: in use")
    assert cli.describe(ValueError()) == (2, "ValueError")  # a message-less error still says something
    assert cli.describe(RunFailed("the loss diverged")) == (1, "the loss diverged")
    assert cli.describe(OSError("the server closed the connection")) == (1, "the server closed the connection")
    code, text = cli.describe(KeyError("input_ids"))
    assert code == 1 and text.startswith("unexpected KeyError: 'input_ids' (a bug in torchbert: please report it")


# -- interrupts -----------------------------------------------------------------------------------------

def args(command: str, out=None) -> argparse.Namespace:
    return argparse.Namespace(command=command, out=None if out is None else str(out))


def test_resume_repeats_the_command_line_with_resume_in_place_of_overwrite_and_debug():
    argv = ["pretrain", "--data", "my data", "--out", "run", "--overwrite", "--debug", "--resume"]
    assert cli.resume_command(argv) == "torchbert pretrain --data 'my data' --out run --resume"


def test_each_interrupt_says_what_it_kept_and_how_to_continue(tmp_path):
    argv = ["pretrain", "--out", str(tmp_path / "run")]
    again = cli.resume_command(argv)
    work = tmp_path / "d.partial"
    interrupted = PrepareInterrupted(work)
    assert cli._interrupted(interrupted, args("prepare"), argv) == (
        f"interrupted; {work} keeps the finished pieces and blocks; continue with: {again}")
    try:  # stopped by SIGTERM: prepare's interrupt raised while handling it
        try:
            raise Terminated()
        except Terminated:
            raise PrepareInterrupted(work)
    except PrepareInterrupted as e:
        assert cli._interrupted(e, args("prepare"), argv).startswith(f"stopped by SIGTERM; {work} keeps")
    study = args("demo", tmp_path / "demo")
    assert cli._interrupted(StudyInterrupted(2, 5), study, argv).startswith(
        f"interrupted after 2 of 5 stages; {tmp_path / 'demo'} keeps the finished ones; continue with: ")
    assert cli._interrupted(StudyInterrupted(2, None), study, argv).startswith("interrupted after 2 stages; ")
    saved = tmp_path / "run" / "checkpoints" / "step-00000040"
    assert cli._interrupted(Interrupted("SIGINT", 40, saved), args("pretrain", tmp_path / "run"), argv) == (
        f"SIGINT: stopped at step 40 and saved {saved}; continue with: {again}")


def test_an_interrupt_of_a_compare_keeps_its_runs_only_once_it_has_settings(tmp_path):
    out = tmp_path / "compare"
    argv = ["compare", "--out", str(out)]
    assert cli._interrupted(KeyboardInterrupt(), args("compare", out), argv) == \
        "interrupted; no output was written"  # stopped before it wrote a thing
    out.mkdir()
    (out / "settings.json").write_text("{}")
    assert cli._interrupted(KeyboardInterrupt(), args("compare", out), argv) == (
        f"interrupted; {out} keeps the runs that finished; continue with: {cli.resume_command(argv)}")


def test_an_interrupt_of_a_command_without_a_run_writes_nothing_and_says_which_signal(tmp_path):
    assert cli._interrupted(KeyboardInterrupt(), args("embed"), []) == "interrupted; no output was written"
    assert cli._interrupted(Terminated(), args("embed"), []) == "stopped by SIGTERM; no output was written"


def test_a_second_ctrl_c_in_a_run_names_its_newest_checkpoint(tmp_path):
    run = tmp_path / "run"
    argv = ["finetune", "--out", str(run)]
    assert cli._interrupted(KeyboardInterrupt(), args("finetune", run), argv) == (
        f"interrupted before the first checkpoint; {run} is as it was before this run")
    for step in ("step-00000010", "step-00000020"):
        (run / "checkpoints" / step).mkdir(parents=True)
        (run / "checkpoints" / step / "manifest.json").write_text("{}")
    (run / "checkpoints" / "step-00000030").mkdir()  # no manifest: not a whole checkpoint
    assert cli._interrupted(KeyboardInterrupt(), args("finetune", run), argv) == (
        f"interrupted; {run / 'checkpoints' / 'step-00000020'} is kept; continue with: {cli.resume_command(argv)}")
    # the loop's own interrupt without a checkpoint says nothing of the checkpoints of an earlier run
    assert cli._interrupted(Interrupted("SIGINT", 3, None), args("finetune", run), argv).startswith(
        "interrupted before the first checkpoint")


# -- the command line ---------------------------------------------------------------------------------

def test_given_flags_are_the_settings_a_command_line_names_and_no_defaults():
    argv = ["--debug", "finetune", "--task", "token", "--model", "m", "--train", "t", "--out", "o", "--epo", "3",
            "--lr=1e-4"]
    assert cli.given_flags(argv) == ("epochs", "lr", "model", "out", "task", "train")
    assert cli.given_flags(["pretrain", "--data", "d", "--out", "o"]) == ("data", "out")


def test_a_flag_after_debug_or_a_bare_argument_is_still_its_commands_error(capsys):
    with pytest.raises(SystemExit):  # --debug before the command
        cli.main(["--debug", "finetune", "--task", "token", "--trian", "t.conll"])
    assert last_error(capsys) == "torchbert finetune: error: unrecognized argument: --trian; did you mean --train?"
    with pytest.raises(SystemExit):  # a word no flag takes, then a one-dash flag near one it takes
        cli.main(["inspect-data", "d", "stray", "-json=1"])
    assert last_error(capsys) == ("torchbert inspect-data: error: unrecognized arguments: stray -json=1; did you mean "
                                  "--jsonl?")
    with pytest.raises(SystemExit):  # the hint is a long flag, never -h
        cli.main(["inspect-data", "d", "-jh"])
    assert last_error(capsys) == "torchbert inspect-data: error: unrecognized argument: -jh (see torchbert inspect-data --help)"


@pytest.mark.parametrize("argv, hint", [
    (["evaluate", "--model", "m", "--input", "x"], "--input; did you mean --data?"),  # not --int8, spelled near
    (["predict", "--model", "m", "--data", "x", "--out", "y"], "--data; did you mean --input?"),
    (["vocab", "--input", "x", "--vocab-size", "9", "--out", "y"], "--input; did you mean --corpus?"),
    (["finetune", "--task", "token", "--data", "x"], "--data; did you mean --train?"),
    (["evaluate", "--model", "m", "--data", "x", "--epocs", "3"], "--epocs (see torchbert evaluate --help)"),
])
def test_a_flag_another_command_names_the_input_by_points_at_this_commands_own(argv, hint, capsys):
    """predict's --input is evaluate's --data, vocab's --corpus and finetune's --train; and --help is never
    offered as the flag a misspelling meant."""
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert last_error(capsys) == f"torchbert {argv[0]}: error: unrecognized argument: {hint}"


def test_after_a_double_dash_a_word_that_looks_like_a_flag_is_an_argument(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "--data").mkdir()
    assert cli.main(["inspect-data", "--", "--data"]) == 2  # the folder named --data, not a flag
    assert capsys.readouterr().err.strip() == "torchbert: error: --data: no manifest.json (not a folder written by " \
                                               "torchbert prepare)"


def test_debug_from_the_environment_is_off_for_0(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TORCHBERT_DEBUG", "0")
    assert cli.main(["inspect-data", str(tmp_path / "none")]) == 2  # one line, not a traceback
    assert last_error(capsys).startswith(f"torchbert: error: {tmp_path / 'none'}")
    monkeypatch.setenv("TORCHBERT_DEBUG", "1")
    with pytest.raises(UserError, match="no manifest.json"):  # the traceback: the error itself
        cli.main(["inspect-data", str(tmp_path / "none")])


# -- around a command ------------------------------------------------------------------------------------

def test_only_process_0_of_torchrun_holds_the_folder(tmp_path, monkeypatch):
    out = tmp_path / "run"
    with hold(out, "process 0"):  # the lock process 0 takes; the other ranks write into its folder
        monkeypatch.setenv("RANK", "1")
        with cli._holding(args("pretrain", out), ["pretrain"]):
            pass
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(UserError, match="in use by"):
            with cli._holding(args("pretrain", out), ["pretrain"]):
                pass


def test_a_long_command_line_is_cut_in_the_lock_that_names_it(tmp_path):
    out = tmp_path / "run"
    argv = ["finetune", "--train", "x" * 500, "--out", str(out)]
    with cli._holding(args("finetune", out), argv):
        with pytest.raises(UserError) as e:
            with hold(out, "second"):
                pass
    held = str(e.value).split("(", 1)[1]
    assert held.startswith("torchbert finetune --train xxx") and "x" * 250 in held
    assert "..., since" in held and "x" * 300 not in held


def test_only_the_commands_that_compute_share_the_cores():
    with cli._governed(argparse.Namespace(command="inspect-data")):
        assert threads._governor is None  # reading a folder's statistics takes no share of the cores
    with cli._governed(argparse.Namespace(command="embed", threads=1)):
        assert threads._governor is not None
    assert threads._governor is None


def test_sigterm_interrupts_the_command_and_the_handler_before_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with cli._sigterm_interrupts():
        with pytest.raises(Terminated):
            signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before
    errors = []

    def in_a_thread():  # only the main thread may set a handler: a command run in a thread sets none
        try:
            with cli._sigterm_interrupts():
                pass
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=in_a_thread)
    t.start()
    t.join()
    assert errors == []


class _SignalledWhileCollected:
    """An object whose finalizer is where SIGTERM's or SIGINT's handler runs (as when the garbage
    collector runs a weak reference's callback at the moment the signal comes)."""

    def __init__(self, signum):
        self.signum = signum

    def __del__(self):
        signal.raise_signal(self.signum)  # the handler runs here, inside the finalizer


@pytest.fixture
def pythons_sigint():
    """Ctrl-C as a shell's command gets it, Python's own handler (a pytest-xdist worker ignores SIGINT)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("signum, raised", [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)])
def test_an_interrupt_that_a_finalizer_swallows_is_sent_again_and_stops_the_command(signum, raised, pythons_sigint):
    hook = sys.unraisablehook
    with pytest.raises(raised):
        with cli._sigterm_interrupts():
            _SignalledWhileCollected(signum)  # dropped at once: Python prints "Exception ignored" and goes on
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # ordinary code, where the signal sent again lands
                pass
    assert sys.unraisablehook is hook
    # another exception in a finalizer still goes to the hook before, and stops nothing
    seen = []
    sys.unraisablehook = seen.append
    try:
        with cli._sigterm_interrupts():
            bad = type("Bad", (), {"__del__": lambda self: 1 / 0})()
            del bad
    finally:
        sys.unraisablehook = hook
    assert len(seen) == 1 and isinstance(seen[0].exc_value, ZeroDivisionError)


class _SignalledWhileConverted:
    """A number whose conversion is where SIGTERM's or SIGINT's handler runs: inside C++ code converting a
    call's arguments (pybind11, as when matplotlib draws a plot), which clears the KeyboardInterrupt and
    raises a TypeError of its own."""

    def __init__(self, signum):
        self.signum = signum

    def __float__(self):
        signal.raise_signal(self.signum)
        return 0.0


def _converted_while_signalled(signum):
    from matplotlib import _path
    from matplotlib.transforms import Affine2D

    _path.affine_transform([[_SignalledWhileConverted(signum), 0.0]], Affine2D().get_matrix())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupt_that_cpp_code_turns_into_an_error_stops_the_command_as_an_interrupt(tmp_path, monkeypatch,
                                                                                          signum, capsys,
                                                                                          pythons_sigint):
    from torchbert.commands import embed

    with cli._sigterm_interrupts(), pytest.raises(TypeError, match="incompatible function arguments"):
        _converted_while_signalled(signum)  # what the command saw: no KeyboardInterrupt, a TypeError
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's own, given back
    monkeypatch.setattr(embed, "run", lambda args: _converted_while_signalled(signum))
    assert cli.main(["embed", "--model", "m", "--input", "i", "--out", str(tmp_path / "e.npy")]) == 130
    assert capsys.readouterr().err.strip().endswith("no output was written")
    monkeypatch.setattr(embed, "run", lambda args: 1 / 0)  # an error with no signal since the command began
    assert cli.main(["embed", "--model", "m", "--input", "i", "--out", str(tmp_path / "e.npy")]) == 1
    assert "a bug in torchbert" in capsys.readouterr().err


def test_main_gives_a_command_the_flags_given_its_outs_target_and_sigterm_unless_it_serves(tmp_path, monkeypatch):
    from torchbert.commands import finetune, serve

    seen = {}

    def record(args):
        seen[args.command] = (args, signal.getsignal(signal.SIGTERM))

    for module in (finetune, serve):
        monkeypatch.setattr(module, "run", record)
    target = tmp_path / "runs" / "a"
    target.mkdir(parents=True)
    (tmp_path / "link").symlink_to(target)
    assert cli.main(["finetune", "--task", "token", "--model", "m", "--train", "t", "--out", str(tmp_path / "link"),
                     "--epochs", "2"]) == 0
    args, handler = seen["finetune"]
    assert args.given == ("epochs", "model", "out", "task", "train")  # a resumed run keeps the others from the run
    assert args.out == str(target)  # a link names its target: the link itself is never replaced
    before = signal.getsignal(signal.SIGTERM)
    assert handler is not before and signal.getsignal(signal.SIGTERM) is before
    assert cli.main(["serve", "--model", "m"]) == 0
    assert seen["serve"][1] is before  # uvicorn shuts the server down on SIGTERM by its own handler
