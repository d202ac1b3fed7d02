"""The hardware decision: what /proc/cpuinfo says, and the precision `--precision auto` picks on it, by
the probe's figures (mocked both ways: conftest.figures_by_flags, and a CPU whose flags mislead)."""

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
def test_auto_is_bf16_where_its_products_measured_faster(monkeypatch, machine, picked):
    """With the probe's figures following the flags (conftest.figures_by_flags: bf16 2.7x fp32's where
    native, 0.25x where emulated)."""
    monkeypatch.setattr(hardware, "cpu", lambda: machine)
    precision, why = inference_precision("auto", torch.device("cpu"), (384, 1536))
    assert precision == picked
    assert f"on this CPU ({machine.units()})" in why
    assert ("measured 2.70x fp32's speed" in why) if picked == "bf16" else \
        ("measured 0.25x fp32's speed" in why and "bf16 would not be faster" in why)
    # fp32 and bf16 are what was asked, whatever the CPU; bf16 where it is slower says what it measured
    assert inference_precision("fp32", torch.device("cpu"))[0] == "fp32"
    precision, why = inference_precision("bf16", torch.device("cpu"))
    assert precision == "bf16" and (("as asked, though bf16 products measured 0.25x" in why) == (picked == "fp32"))
    with pytest.raises(ValueError, match="precision must be one of auto, fp32, bf16"):
        inference_precision("fp16", torch.device("cpu"))


def test_the_precision_help_names_the_bound_auto_holds_to(capsys):
    """--help's words follow hardware.BF16_PAYS: the figure lives in one place."""
    from clihelp import cli

    with pytest.raises(SystemExit) as exit:
        cli(capsys, "embed", "--help")
    out = capsys.readouterr().out
    assert exit.value.code == 0 and f"at least {hardware.BF16_PAYS}x fp32's" in " ".join(out.split())


@pytest.mark.parametrize("bf16, picked", [(50.0, "fp32"), (115.0, "fp32"), (125.0, "bf16"), (300.0, "bf16")])
def test_auto_follows_the_measurement_not_the_flags(monkeypatch, tmp_path, bf16, picked):
    """A CPU that shows avx512_bf16 but multiplies bf16 at half fp32's rate (a virtual Xeon) computes in
    fp32, and one whose flags say nothing of bf16 computes in bf16 where it measured faster: auto takes
    bf16 from 1.2x fp32's speed (BF16_PAYS), so a near tie stays fp32."""
    from torchbert import probe

    monkeypatch.setenv("TORCHBERT_CACHE", str(tmp_path))
    asked = []
    for machine in (CPU("Intel(R) Xeon(R) Platinum 8375C", frozenset("avx2 avx512f avx512_bf16 avx512_vnni".split())),
                    CPU("Unknown CPU", frozenset())):
        monkeypatch.setattr(hardware, "cpu", lambda machine=machine: machine)
        monkeypatch.setattr(probe, "measure", lambda precisions, h, i, threads: asked.append((precisions, h, i)) or
                            {"fp32": 100.0, "bf16": bf16, "int8": 150.0})
        assert inference_precision("auto", torch.device("cpu"), (384, 1536))[0] == picked
    assert asked == [(("fp32", "bf16"), 384, 1536)] * 2  # the model's own shape, each CPU measured once


def test_the_commands_follow_the_decision(monkeypatch, capsys, tmp_path, minilm_dir):
    """embed --precision auto computes in bf16 where bf16 measured faster, in fp32 where not;
    `torchbert env` prints the figures and says which and why; --int8 runs on every CPU and says what
    it measured there."""
    from clihelp import cli

    src = tmp_path / "in.txt"
    src.write_text("one line\n另一行中文\n", encoding="utf-8")
    for machine, precision in ((ZEN2, "fp32"), (SAPPHIRE, "bf16")):
        monkeypatch.setattr(hardware, "cpu", lambda machine=machine: machine)
        code, out, err = cli(capsys, "embed", "--model", minilm_dir, "--input", src, "--out", tmp_path / "e.npy",
                             "--quiet", "--device", "cpu")
        assert code == 0, err
        assert f"computed in {precision})" in out
        assert ("note: computing in bf16 (--precision auto: bf16 products measured 2.70x fp32's speed" in err) == \
               (precision == "bf16")
        code, out, _ = cli(capsys, "env")
        assert code == 0 and f"cpu: {machine.name}" in out
        assert f"inference on the cpu (--precision auto): {precision}:" in out
        bf16 = 270 if precision == "bf16" else 25
        assert f"matrix products measured (GFLOP/s, 256 x 768 x 3072, {torch.get_num_threads()} threads): fp32 100, " \
               f"bf16 {bf16}, int8 {200 if machine.native_int8 else 120}" in out
        assert "--int8: INT8 products measured" in out
        assert ("bf16's products are faster still here (2.70x)" in out) == (precision == "bf16")
        assert out.splitlines()[-1].startswith("memory allocator: ")
    code, _, err = cli(capsys, "embed", "--model", minilm_dir, "--input", src, "--out", tmp_path / "f.npy",
                       "--precision", "bf16", "--int8")
    assert code == 2 and "--precision bf16 and --int8 exclude each other" in err
    assert not (tmp_path / "f.npy").exists()


@pytest.mark.parametrize("machine, int8, faster_bf16", [(SAPPHIRE, 2.00, True), (ZEN4, 2.00, True),
                                                        (SKYLAKE, 1.20, False), (ZEN2, 1.20, False),
                                                        (CASCADE, 2.00, False)])
def test_int8_runs_everywhere_and_says_what_it_measured(monkeypatch, machine, int8, faster_bf16):
    """INT8's products against fp32's, and an encoder layer's, whose down projection (a third of its
    products at BERT's shape) stays fp32: 1 / (1/3 + 2/3 / 2) = 1.5x at 2x; where bf16 is faster still,
    it says so."""
    monkeypatch.setattr(hardware, "cpu", lambda: machine)
    why = hardware.int8_report((384, 1536))
    layer = 1 / (1 / 3 + 2 / 3 / int8)
    assert f"INT8 products measured {int8:.2f}x fp32's speed on this CPU ({machine.units()}), an encoder layer's " \
           f"{layer:.2f}x" in why
    assert ("bf16's products are faster still here" in why) == faster_bf16


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
def test_training_in_bf16_says_so_where_bf16_measured_slower(monkeypatch, capsys, tmp_path, machine, noted):
    """pretrain/finetune --precision bf16 where bf16's products measured slower than fp32's runs, with a
    note that says so; nothing is said where bf16 is faster, or for fp32."""
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
        assert ("note: --precision bf16: bf16 products measured 0.25x fp32's speed" in err and
                "fp32 is faster here" in err) == \
               (noted and precision == "bf16"), err
