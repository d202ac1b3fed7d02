"""fast/threads.py: a job computes with all its cores alone and with its share beside other busy jobs;
an idle job, a killed one and a library call without a command change nothing."""

import os
import subprocess
import sys

import pytest
import torch

from torchbert.fast import threads
from torchbert.fast.threads import Governor


@pytest.fixture
def registry(tmp_path):
    return tmp_path / "jobs"


def other_job(registry, busy: bool = True) -> subprocess.Popen:
    """Another process that holds (busy) or only has (idle) its lock file in the registry."""
    code = (f"import fcntl, os, sys, time; os.makedirs({str(registry)!r}, exist_ok=True); "
            f"fd = os.open(os.path.join({str(registry)!r}, str(os.getpid())), os.O_RDWR | os.O_CREAT); "
            + ("fcntl.flock(fd, fcntl.LOCK_EX); " if busy else "") + "print('ready', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_alone_all_cores_beside_a_busy_job_half_and_back_when_it_ends(registry, monkeypatch):
    monkeypatch.setattr(threads, "cores", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    g = Governor(where=registry)
    try:
        with g.busy():
            assert g.busy_jobs() == 1 and g.threads == 4 and torch.get_num_threads() == 4
            other = other_job(registry)
            try:
                g.tick()  # within EVERY seconds of the last look: unchanged
                assert g.threads == 4
                g.tick(force=True)
                assert g.busy_jobs() == 2 and g.threads == 2 and torch.get_num_threads() == 2
            finally:
                other.kill()
                other.wait()
            g.tick(force=True)  # the kernel dropped the killed job's lock: it no longer counts
            assert g.threads == 4
            assert not (registry / str(other.pid)).exists()  # and its file is gone
    finally:
        g.close()
    assert torch.get_num_threads() == before and not (registry / str(os.getpid())).exists()


def test_an_idle_job_takes_nothing_and_the_users_cap_and_threads_hold(registry, monkeypatch):
    monkeypatch.setattr(threads, "cores", lambda: 4)
    idle = other_job(registry, busy=False)
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        g = Governor(where=registry)
        with g.busy():
            assert g.busy_jobs() == 1 and g.threads == 3  # the user's cap; the idle server takes nothing
        g.close()
        fixed = Governor(fixed=1, where=registry)
        with fixed.busy():
            assert fixed.threads == 1
        fixed.close()
    finally:
        idle.kill()
        idle.wait()


def test_a_busy_job_is_seen_by_another_process(registry):
    """The lock is what the other process sees, not this one's own bookkeeping."""
    g = Governor(where=registry)
    code = ("import sys; from pathlib import Path; from torchbert.fast.threads import Governor; "
            f"g = Governor(where=Path({str(registry)!r}))\nwith g.busy(): print(g.busy_jobs())")
    try:
        with g.busy():
            seen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            assert seen.stdout.strip() == "2"  # itself, computing, and this one
        seen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert seen.stdout.strip() == "1"  # this one idle now: itself alone
    finally:
        g.close()


def test_a_planted_link_is_never_followed_and_nothing_outside_is_deleted(tmp_path, monkeypatch, capsys):
    """Issue 59: the folder a symlink to another (here with files named like dead jobs' pids): not
    used, one warning, the job computes alone, the target's files stay."""
    monkeypatch.setattr(threads, "cores", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("99999990", "4000000", "12"):
        (victim / name).write_text("keep me")
    (tmp_path / "jobs").symlink_to(victim)
    threads._warned.clear()
    g = Governor(where=tmp_path / "jobs")
    try:
        with g.busy():
            assert g.busy_jobs() == 1 and g.threads == 4
            g.tick(force=True)
    finally:
        g.close()
    assert sorted(p.name for p in victim.iterdir()) == ["12", "4000000", "99999990"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "jobs is a link or not a folder: not used; this job computes as if alone" in err


def test_hostile_entries_in_the_folder_neither_fail_hang_nor_count(registry, tmp_path, monkeypatch):
    """Names too long for a pid, a pipe named like a pid (opening it would wait), a link named like a
    dead pid, a folder: passed over; a real dead job's file is cleared; the folder is made 0700."""
    monkeypatch.setattr(threads, "cores", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    registry.mkdir(mode=0o755)
    registry.chmod(0o755)
    (registry / "99999999999999999999").write_text("")
    os.mkfifo(registry / "4000001")
    target = tmp_path / "target"
    target.write_text("keep me")
    (registry / "4000002").symlink_to(target)
    (registry / "4000003").mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (registry / dead.stdout.strip()).write_text("")  # a job that ended without removing its file
    g = Governor(where=registry)
    try:
        with g.busy():
            assert g.busy_jobs() == 1 and g.threads == 4
    finally:
        g.close()
    assert target.read_text() == "keep me" and (registry / "4000002").is_symlink()
    assert (registry / "4000001").exists() and (registry / "99999999999999999999").exists()
    assert not (registry / dead.stdout.strip()).exists()
    assert registry.stat().st_mode & 0o777 == 0o700
    assert threads.job_pid("0123") is None and threads.job_pid(str(threads.PID_MAX + 1)) is None
    assert threads.job_pid("4194304") == 4194304


def test_another_users_folder_is_not_used(registry, monkeypatch, capsys):
    registry.mkdir(mode=0o700)
    monkeypatch.setattr(threads.os, "getuid", lambda: os.stat(registry).st_uid + 1)
    threads._warned.clear()
    assert threads.private_folder(registry) is None
    assert "owned by another user" in capsys.readouterr().err


def test_the_folder_is_the_users_runtime_folder_where_there_is_one(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert threads.folder() == tmp_path / "torchbert-jobs"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert threads.folder().name.startswith("torchbert-jobs-")


def test_library_calls_change_no_threads_without_a_command():
    assert threads._governor is None
    before = torch.get_num_threads()
    with threads.busy():
        threads.tick()
    assert torch.get_num_threads() == before


def test_a_command_governs_for_its_time_only(tmp_path, capsys, minilm_dir, monkeypatch):
    from clihelp import cli

    seen = []
    real = Governor.tick

    def tick(self, force=False):
        real(self, force)
        seen.append(self.threads)

    monkeypatch.setattr(Governor, "tick", tick)
    (tmp_path / "t.txt").write_text("one text\nanother\n")
    before = torch.get_num_threads()
    code, _, err = cli(capsys, "embed", "--model", minilm_dir, "--input", tmp_path / "t.txt", "--out",
                       tmp_path / "e.npy", "--threads", "1", "--quiet")
    assert code == 0, err
    assert seen and set(seen) == {1} and torch.get_num_threads() == before and threads._governor is None
    code, _, err = cli(capsys, "embed", "--model", minilm_dir, "--input", tmp_path / "t.txt", "--out",
                       tmp_path / "e.npy", "--threads", "0")
    assert code == 2 and "--threads must be >= 1" in err


@pytest.mark.e2e
def test_two_jobs_side_by_side_each_compute_with_half_the_cores(tmp_path):
    """Two real `torchbert embed` commands at once: each sees the other and takes its share."""
    texts = tmp_path / "t.txt"
    texts.write_text("".join(f"text number {i} with a few words in it\n" for i in range(3000)))
    env = {**os.environ, "TORCHBERT_DEBUG": ""}
    env.pop("OMP_NUM_THREADS", None)
    probe = ("import sys, torchbert.fast.threads as t; real = t.Governor.tick\n"
             "def tick(self, force=False):\n    real(self, force)\n    print('threads', self.threads, file=sys.stderr)\n"
             "t.Governor.tick = tick\nfrom torchbert.cli import main\nsys.exit(main(sys.argv[1:]))")
    procs = [subprocess.Popen([sys.executable, "-c", probe, "embed", "--model", "minilm", "--input", str(texts),
                               "--out", str(tmp_path / f"e{k}.npy"), "--quiet"], env=env, stderr=subprocess.PIPE,
                              text=True) for k in range(2)]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    if threads.cores() < 2:
        pytest.skip("one core: nothing to share")
    shares = [{int(line.split()[1]) for line in e.splitlines() if line.startswith("threads ")} for e in errs]
    assert any(threads.cores() // 2 in s for s in shares), shares  # while both computed, a half
