"""Writing outputs so that a user's data is never half-written, overwritten by accident, or lost.

- `atomic_write(path, write)`: a file appears whole or not at all (a temporary sibling, fsynced,
  renamed over the name), and a failure leaves the old file as it was.
- `atomic_folder(final)`: a folder is built in a temporary sibling, fsynced, and swapped in whole.
  An older folder of that name is exchanged with the new one in one rename (Linux's renameat2),
  else moved aside first and deleted only once the new one is in place.
- Files and folders made here get the permissions the umask gives (as `open` would), not the
  0600/0700 of mkstemp/mkdtemp, so other users and containers can read a saved model.
- `writing(folder)`: a full disk, in whatever form the writer reports it, becomes OutOfSpace
  naming the folder.
- `check_apart` / `check_output_file`: an output may not be, hold, or sit inside an input, and an
  output file that exists must be a regular file (never a device, FIFO or socket: writing over
  /dev/null as root would replace it for the whole system).
- `output_path(path)`: an --out that is a symbolic link names its target (a link is never replaced
  by what is written through it); a link that loops is a one-line error.
- `MARK` / `check_replaceable`: every folder torchbert writes carries a mark, and --overwrite
  replaces only an empty folder or a marked one, never a folder of the user's own files.
- `hold(folder, what)`: one writer per output folder. An OS advisory lock (flock) on `.NAME.lock`
  beside the folder, held while the block runs; a second process is refused with the holder's pid
  and command. The kernel drops the lock when its process dies, however it dies, so a lock file
  left by a killed process never blocks: the next run takes it over, and removes the temporary
  folders (`.NAME.*.tmp`) that the killed run was building beside it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ..errors import OutOfSpace, UserError

_FULL = (errno.ENOSPC, errno.EDQUOT)


def cache_folder() -> Path:
    """torchbert's own cache: $TORCHBERT_CACHE, else $XDG_CACHE_HOME/torchbert, else ~/.cache/torchbert."""
    return Path(os.environ.get("TORCHBERT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                                                          "torchbert"))


def umask() -> int:
    """The process's umask, read without changing it (Linux), else by setting and restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _open_mode(path: str | os.PathLike, folder: bool) -> None:
    os.chmod(path, (0o777 if folder else 0o666) & ~umask())


def _fsync(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def writing(folder: str | os.PathLike) -> Iterator[None]:
    """Turn the writers' ways of saying 'disk full' into OutOfSpace(folder)."""
    try:
        yield
    except OutOfSpace:
        raise
    except OSError as e:
        # numpy's writers say a short write in words ("18816 requested and 5088 written"), no errno
        short = e.errno is None and "requested and" in str(e) and "written" in str(e)
        if e.errno in _FULL or short:
            raise OutOfSpace(folder) from e
        raise
    except Exception as e:  # torch.save: RuntimeError "unexpected pos"; safetensors: SafetensorError
        text = str(e)
        torch_writer = "inline_container" in text or "PytorchStreamWriter" in text
        if "os error 28" in text or "No space left" in text or (torch_writer and _nearly_full(folder)):
            raise OutOfSpace(folder) from e
        raise


def _nearly_full(folder: str | os.PathLike) -> bool:
    try:
        return shutil.disk_usage(folder).free < 64 << 20
    except OSError:
        return False


@contextlib.contextmanager
def _parents(folder: Path) -> Iterator[None]:
    """mkdir -p folder; the folders it made are removed again (when empty) if the block fails."""
    top = None
    for p in (folder, *folder.parents):
        if p.exists():
            break
        top = p
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        if top is not None:
            for p in (folder, *folder.parents):
                with contextlib.suppress(OSError):
                    p.rmdir()
                if p == top:
                    break
        raise


MARK = ".torchbert"  # in every folder torchbert writes: --overwrite may replace it
MARKS = (MARK, ".torchbert-demo", ".torchbert-compare")  # the demo's and compare's marks count too


def mark(folder: str | os.PathLike) -> None:
    """Mark `folder` as torchbert's own, so that a later --overwrite may replace it."""
    (Path(folder) / MARK).write_text("a folder written by torchbert: --overwrite may replace it\n", encoding="utf-8")


def check_replaceable(out: str | os.PathLike, name: str = "--out") -> None:
    """UserError unless folder `out` (if it exists) may be replaced: it is empty, or torchbert wrote
    it (its mark is in it). A folder of the user's own files is never deleted by --overwrite."""
    out = Path(out)
    if not out.is_dir():
        return
    entries = sorted(out.iterdir())
    if not entries or any((out / m).is_file() for m in MARKS):
        return
    shown = ", ".join(p.name + ("/" if p.is_dir() else "") for p in entries[:4])
    more = f" and {len(entries) - 4} more" if len(entries) > 4 else ""
    raise UserError(f"{name} {out}: holds {shown}{more}, which torchbert did not write (no {MARK} mark in it); "
                    f"--overwrite replaces only an empty folder or one of torchbert's: move those files "
                    f"yourself, or choose another {name}")


def output_path(path: str | os.PathLike, name: str = "--out") -> Path:
    """The path an output is written at: a symbolic link's target (so the link stays a link and its
    target keeps its type, checked by the callers), else `path` as given."""
    path = Path(path)
    if not path.is_symlink():
        return path
    try:
        target = Path(os.path.realpath(path, strict=True)) if path.exists() else path.resolve()
    except (RuntimeError, OSError):  # a loop: Python 3.11 says RuntimeError, later ones OSError(ELOOP)
        raise UserError(f"{name} {path}: a symbolic link that loops (it never reaches a file or folder)") from None
    return target


def kind(path: Path) -> str | None:
    """What a path that exists and is neither a regular file nor a folder is, in words; else None."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, words in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return None


def _remove_leftovers(folder: Path) -> None:
    """Temporary folders a killed writer of `folder` left beside it, removed by the writer that holds the
    folder now (nobody else may be writing them): only atomic_folder's own, named `.NAME.` + mkdtemp's
    eight characters + `.tmp` and carrying torchbert's mark, never a folder of the user's."""
    import re

    own = re.compile(re.escape(f".{folder.name}.") + r"[a-z0-9_]{8}\.tmp")
    left = [p for p in folder.parent.glob(f".{folder.name}.*.tmp")
            if own.fullmatch(p.name) and p.is_dir() and not p.is_symlink() and (p / MARK).is_file()]
    if not left:
        return
    size = sum(f.stat().st_size for p in left for f in p.rglob("*") if f.is_file() and not f.is_symlink())
    for p in left:
        shutil.rmtree(p, ignore_errors=True)
    print(f"torchbert: note: removed {len(left)} unfinished temporary folder(s) ({size / 1e6:,.1f} MB) that an "
          f"interrupted run left beside {folder}", file=sys.stderr)


def lock_path(folder: str | os.PathLike) -> Path:
    """Where `hold` locks a folder: a hidden sibling, so that moving the folder aside (--overwrite)
    or replacing it whole keeps the lock where the next writer looks."""
    folder = Path(folder)
    return folder.parent / f".{folder.name}.lock"


def _holder(fd: int, wait: float = 2.0) -> str:
    """The line a lock's holder wrote into its file; a holder that has only just taken the lock
    writes it a moment later, so an unfinished line is read again for up to `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        try:
            text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        except OSError:
            return ""
        if text.endswith("\n") or time.monotonic() > deadline:
            return text.strip()
        time.sleep(0.02)


@contextlib.contextmanager
def hold(folder: str | os.PathLike, what: str, name: str = "--out") -> Iterator[None]:
    """The folder's lock while the block runs (see the module's docstring); `what` (the command)
    is written into the lock file for whoever is refused. Released (and its file removed) at the
    end of the block; folders made for the lock file are removed again if they stayed empty."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no advisory locks to take
        yield
        return
    folder = Path(folder)
    path = lock_path(folder)
    made = [p for p in path.parents if not p.exists()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{name} {folder}: cannot make {path.parent} ({e.strerror})") from None
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            raise UserError(f"{name} {folder}: cannot make its lock file {path} ({e.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UserError(f"{name} {folder}: in use by {holder or 'another process'}; a folder takes one "
                            f"writer at a time: wait for that one to end, or choose another {name}") from None
        except BaseException:
            os.close(fd)
            raise
        # the file locked must still be the one at the path: a holder that was ending removed it
        # between our open and our lock, and a third process may have made a new one since
        with contextlib.suppress(FileNotFoundError):
            st, now = os.fstat(fd), os.stat(path)
            if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                break
        os.close(fd)
    try:
        line = (f"process {os.getpid()} on {socket.gethostname()} ({what}, since "
                f"{time.strftime('%Y-%m-%d %H:%M:%S')})\n").encode()
        os.pwrite(fd, line, 0)
        os.ftruncate(fd, len(line))
        _remove_leftovers(folder)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still held: a process that opened it meanwhile sees it gone and retries
        os.close(fd)
        for p in made:  # innermost first
            with contextlib.suppress(OSError):
                p.rmdir()


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)`, then rename tmp_path over `path` (same folder, so same filesystem)."""
    path = output_path(path)
    if kind(path) is not None:
        raise UserError(f"{path}: is {kind(path)}, not a regular file; torchbert writes only regular files")
    with writing(path.parent), _parents(path.parent):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            with writing(path.parent):  # judged before the partial file goes: its removal frees the disk
                write(tmp)
                _open_mode(tmp, folder=False)
                _fsync(tmp)
                os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        _fsync(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write)


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    atomic_write(dst, lambda tmp: shutil.copyfile(src, tmp))


@contextlib.contextmanager
def atomic_folder(final: str | os.PathLike, marked: bool = False) -> Iterator[Path]:
    """Yield an empty temporary sibling of `final`; when the block ends without error it becomes
    `final` in one step (an older `final` is replaced whole). On error it is removed and `final`
    is untouched. `marked`: the folder carries torchbert's mark (a command's --out)."""
    final = output_path(final)
    with writing(final.parent), _parents(final.parent):
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
        try:
            with writing(final.parent):  # judged before the partial folder goes: its removal frees the disk
                _open_mode(tmp, folder=True)
                if marked:
                    mark(tmp)
                yield tmp
                for root, _, names in os.walk(tmp):
                    for name in names:
                        _fsync(os.path.join(root, name))
                    _fsync(root)
                swap_in(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def swap_in(new: Path, final: Path) -> None:
    """Rename folder `new` to `final`; an existing `final` is replaced and then deleted."""
    if not final.exists():
        os.rename(new, final)
    elif _exchange(new, final):
        shutil.rmtree(new)  # it holds the old folder now
    else:
        aside = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=final.parent))
        os.rename(final, aside / final.name)
        os.rename(new, final)
        shutil.rmtree(aside)
    _fsync(final.parent)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one rename (renameat2 RENAME_EXCHANGE); False where the system cannot."""
    func = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if func is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if func(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def _relation(out: Path, other: Path) -> str | None:
    a, b = out.resolve(), other.resolve()
    if a == b:
        return "is"
    if a in b.parents:
        return "holds"
    if b in a.parents:
        return "sits inside"
    return None


Inputs = dict[str, str | os.PathLike | None] | Iterable[tuple[str, str | os.PathLike | None]]


def check_apart(out: str | os.PathLike, inputs: Inputs, out_name: str = "--out") -> None:
    """UserError when output `out` is, holds, or sits inside one of the named inputs."""
    for name, path in inputs.items() if isinstance(inputs, dict) else inputs:
        if path is None:
            continue
        relation = _relation(Path(out), Path(path))
        if relation is not None:
            raise UserError(f"{out_name} {out} {relation} the input {name} {path}; write the output somewhere else")


MODEL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "vocab.txt", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "tagger.safetensors")


def model_inputs(model_dir: str | os.PathLike) -> list[tuple[str, Path]]:
    """The files of a model folder that a command reads: an output may not replace one of them."""
    return [("--model", Path(model_dir) / name) for name in MODEL_FILES]


def check_output_file(path: str | os.PathLike, name: str = "--out", inputs: Inputs = ()) -> None:
    """Before any work: `path` can be written as a file (no folder in its place, its parent a folder
    or creatable, writable), and it is none of the inputs."""
    path = output_path(path, name)
    if path.is_dir():
        raise UserError(f"{name} {path}: is a folder; give a file name")
    if kind(path) is not None:
        raise UserError(f"{name} {path}: is {kind(path)}, not a regular file; torchbert writes its output only "
                        "to a regular file (write to a file, then copy it where it should go)")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{name} {path}: {parent} is a file, so no folder can be made there")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{name} {path}: no permission to write in {parent}")
    for input_name, other in inputs.items() if isinstance(inputs, dict) else inputs:
        if other is not None and _relation(path, Path(other)) == "is":
            raise UserError(f"{name} {path} is the input {input_name} {other}; write the output somewhere else")
