"""The hardware decision: what /proc/cpuinfo says, and the precision `--precision auto` picks from it,
with the CPU mocked as one with AMX, one with AVX512-BF16 and one without native bf16."""

import os
import sys

import pytest
import torch

from torchbert import hardware
from torchbert.hardware import CPU, inference_precision, read_cpuinfo

SAPPHIRE = CPU("Intel(R) Xeon(R) Platinum 8480+", frozenset("avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_int8 "
                                                             "amx_tile".split()))
ZEN4 = CPU("AMD EPYC 9654", frozenset("avx2 avx512f avx512_bf16 avx512_vnni".split()))
SKYLAKE = CPU("Intel(R) Xeon(R) Gold 6148", frozenset("avx2 avx512f avx512bw".split()))
ZEN2 = CPU("AMD EPYC 7R32", frozenset("avx2 fma".split()))
CASCADE = CPU("Intel(R) Xeon(R) Gold 6248", frozenset("avx2 avx512f avx512_vnni".split()))


def test_read_cpuinfo_takes_the_first_processors_name_and_flags():
    text = ("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
            "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_vnni\n\n"
            "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n")
    c = read_cpuinfo(text)
    assert c.name == "Intel(R) Xeon(R) Platinum 8480+"
    assert c.amx and c.native_bf16 and c.native_int8
    assert c.units() == "AMX bf16, AMX int8, AVX512-BF16, AVX512-VNNI, AVX512, AVX2"
    empty = read_cpuinfo("")
    assert not empty.native_bf16 and not empty.native_int8 and empty.units() == "none known"


@pytest.mark.parametrize("machine, picked", [(SAPPHIRE, "bf16"), (ZEN4, "bf16"), (SKYLAKE, "fp32"), (ZEN2, "fp32")])
def test_auto_is_bf16_only_where_the_cpu_multiplies_it_natively(monkeypatch, machine, picked):
    monkeypatch.setattr(hardware, "cpu", lambda: machine)
    precision, why = inference_precision("auto", torch.device("cpu"))
    assert precision == picked
    assert ("natively" in why) if picked == "bf16" else ("no native bf16" in why and "slower" in why)
    # fp32 and bf16 are what was asked, whatever the CPU; bf16 without native support says its cost
    assert inference_precision("fp32", torch.device("cpu"))[0] == "fp32"
    precision, why = inference_precision("bf16", torch.device("cpu"))
    assert precision == "bf16" and (("emulated, 2x to 6x slower" in why) == (picked == "fp32"))
    with pytest.raises(ValueError, match="precision must be one of auto, fp32, bf16"):
        inference_precision("fp16", torch.device("cpu"))


def test_the_commands_follow_the_decision(monkeypatch, capsys, tmp_path, minilm_dir):
    """embed --precision auto computes in bf16 on a CPU with native bf16, in fp32 on one without;
    `torchbert env` says which and why."""
    from clihelp import cli

    src = tmp_path / "in.txt"
    src.write_text("one line\n另一行中文\n", encoding="utf-8")
    for machine, precision in ((ZEN2, "fp32"), (SAPPHIRE, "bf16")):
        monkeypatch.setattr(hardware, "cpu", lambda machine=machine: machine)
        code, out, err = cli(capsys, "embed", "--model", minilm_dir, "--input", src, "--out", tmp_path / "e.npy",
                             "--quiet", "--device", "cpu")
        assert code == 0, err
        assert f"computed in {precision})" in out
        assert ("note: computing in bf16 (--precision auto: this CPU multiplies bf16 natively" in err) == \
               (precision == "bf16")
        code, out, _ = cli(capsys, "env")
        assert code == 0 and f"cpu: {machine.name}" in out
        assert f"inference on the cpu (--precision auto): {precision}:" in out
        assert ("--int8: refused: this CPU multiplies bf16 natively" in out) == (precision == "bf16")
        assert ("--int8: runs: this CPU has no 8-bit dot products" in out) == (precision == "fp32")
        assert out.splitlines()[-1].startswith("memory allocator: ")
    code, _, err = cli(capsys, "embed", "--model", minilm_dir, "--input", src, "--out", tmp_path / "f.npy",
                       "--precision", "bf16", "--int8")
    assert code == 2 and "--precision bf16 and --int8 exclude each other" in err
    for machine in (SAPPHIRE, ZEN4):  # INT8 is refused where bf16 is native: bf16 is faster and closer there
        monkeypatch.setattr(hardware, "cpu", lambda machine=machine: machine)
        code, _, err = cli(capsys, "embed", "--model", minilm_dir, "--input", src, "--out", tmp_path / "f.npy",
                           "--int8", "--device", "cpu")
        assert code == 2 and "--int8: this CPU multiplies bf16 natively" in err and "leave --int8 out" in err
    assert not (tmp_path / "f.npy").exists()


@pytest.mark.parametrize("machine, runs, says", [(SAPPHIRE, False, "multiplies bf16 natively"),
                                                 (ZEN4, False, "multiplies bf16 natively"),
                                                 (SKYLAKE, True, "no 8-bit dot products"),
                                                 (ZEN2, True, "no 8-bit dot products"),
                                                 (CASCADE, True, "has 8-bit dot products")])
def test_int8_is_refused_where_bf16_is_native_and_says_its_speed_elsewhere(monkeypatch, machine, runs, says):
    monkeypatch.setattr(hardware, "cpu", lambda: machine)
    ran, why = hardware.int8_choice()
    assert ran == runs and says in why and machine.units() in why
    assert ("fp32's speed" in why) == (says == "no 8-bit dot products")  # the figures measured on such a CPU


def test_bf16_runs_bert_encoders_only(monkeypatch, tmp_path):
    """A GPT folder on a CPU with native bf16: auto computes in fp32, an explicit bf16 is refused."""
    import argparse

    from torchbert.commands.common import inference_precision as for_command
    from torchbert.config import GPTConfig
    from torchbert.errors import UserError

    monkeypatch.setattr(hardware, "cpu", lambda: SAPPHIRE)
    GPTConfig(vocab_size=50, n_positions=16, n_embd=32, n_layer=1, n_head=2).save(tmp_path)
    auto = argparse.Namespace(precision="auto", int8=False)
    assert for_command(auto, torch.device("cpu"), tmp_path) == "fp32"
    with pytest.raises(UserError, match="--precision bf16: runs BERT encoders"):
        for_command(argparse.Namespace(precision="bf16", int8=False), torch.device("cpu"), tmp_path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/statm")
def _status_kb(*fields: str) -> int:
    """The sum of /proc/self/status's fields (kB), as the kernel counts them."""
    with open("/proc/self/status") as f:
        return sum(int(line.split()[1]) for line in f if line.split(":")[0] in fields)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux's /proc")
def test_resident_memory_is_read_now_and_at_its_peak():
    """resident_bytes is the kernel's resident count now (VmRSS), which grows by the pages the process
    writes; peak_resident_bytes is at least that. The pages are a mapping of their own: a bytearray may
    come from memory malloc kept resident after an earlier test freed it (keep_memory, or another job's
    pattern in the same worker), which added nothing (RSS unchanged after writing 256 MB, in the parallel
    fast lane). Beside other jobs the kernel may also take back pages of the files the process maps
    (RssFile), so the growth is judged net of those, read in the same moment."""
    import mmap

    from torchbert.hardware import peak_resident_bytes, resident_bytes

    size = 256 << 20
    before, files_before = resident_bytes(), _status_kb("RssFile") << 10
    block = mmap.mmap(-1, size)  # new (shared, anonymous: RssShmem): no page resident until written
    try:
        for at in range(0, size, mmap.PAGESIZE):
            block[at] = 1
        now, vm_rss = resident_bytes(), _status_kb("VmRSS") << 10
        files = _status_kb("RssFile") << 10
        assert abs(now - vm_rss) < 64 << 20, (now, vm_rss)  # the resident count, not the mapped size
        assert now - before - (files - files_before) > 200 << 20, (before, now, files_before, files)
        assert peak_resident_bytes() >= now - (1 << 20)  # the kernel's per-thread counts lag by a few pages
    finally:
        block.close()


@pytest.mark.parametrize("machine, noted", [(ZEN2, True), (SKYLAKE, True), (ZEN4, False), (SAPPHIRE, False)])
def test_training_in_bf16_says_so_where_the_cpu_only_emulates_it(monkeypatch, capsys, tmp_path, machine, noted):
    """pretrain/finetune --precision bf16 on a CPU without native bf16 runs, 2x to 6x slower than fp32, with a
    note that says so; nothing is said where bf16 is native, or for fp32."""
    import argparse

    from torchbert.commands.common import run_training

    monkeypatch.setattr(hardware, "cpu", lambda: machine)
    for precision in ("bf16", "fp32"):
        ran = []
        run_training(argparse.Namespace(device="cpu", out=tmp_path),
                     argparse.Namespace(precision=precision, fast=False),
                     lambda device, log, dist: ran.append(device.type) or {}, lambda result, out: None)
        err = capsys.readouterr().err
        assert ran == ["cpu"]
        assert ("note: --precision bf16: this CPU has no native bf16" in err and "fp32 is faster here" in err) == \
               (noted and precision == "bf16"), err
