"""The precision probe (torchbert/probe.py): its figures measured once per machine, thread count and
shape, kept in the cache file, a corrupt or foreign cache ignored; and the real measurement on a small
shape (figures only checked to be figures: no test depends on this host's speed)."""

import json
import math

import torch

from torchbert import hardware, probe
from torchbert.probe import measure as real_measure  # conftest replaces probe.measure in every test

XEON = hardware.CPU("Intel(R) Xeon(R) Platinum 8375C", frozenset("avx2 avx512f avx512_bf16".split()))


def counting(monkeypatch, figures=None):
    calls = []

    def measure(precisions, hidden, intermediate, threads):
        calls.append((precisions, hidden, intermediate, threads))
        return {p: (figures or {"fp32": 100.0, "bf16": 50.0, "int8": 150.0})[p] for p in precisions}

    monkeypatch.setattr(probe, "measure", measure)
    return calls


def new_process():
    """What a new process knows: the cache file only."""
    probe._memory.cache_clear()


def test_measured_once_and_read_back_by_the_next_process(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHBERT_CACHE", str(tmp_path))
    calls = counting(monkeypatch)
    assert probe.gflops(("fp32", "bf16"), 384, 1536, XEON, threads=2) == {"fp32": 100.0, "bf16": 50.0}
    assert probe.gflops(("fp32", "bf16"), 384, 1536, XEON, threads=2) == {"fp32": 100.0, "bf16": 50.0}
    assert calls == [(("fp32", "bf16"), 384, 1536, 2)]
    new_process()
    assert probe.gflops(("bf16",), 384, 1536, XEON, threads=2) == {"bf16": 50.0} and len(calls) == 1
    # INT8 asked later: every figure again, timed in turns with the others
    assert probe.gflops(("int8",), 384, 1536, XEON, threads=2) == {"int8": 150.0}
    assert calls[1] == (("fp32", "bf16", "int8"), 384, 1536, 2)
    # another thread count, shape or CPU is another entry
    probe.gflops(("fp32", "bf16"), 384, 1536, XEON, threads=1)
    probe.gflops(("fp32", "bf16"), 768, 3072, XEON, threads=2)
    probe.gflops(("fp32", "bf16"), 384, 1536, hardware.CPU("AMD EPYC 7R13", frozenset({"avx2"})), threads=2)
    assert len(calls) == 5
    data = json.loads(probe.cache_file().read_text(encoding="utf-8"))
    assert data["version"] == probe.VERSION and len(data["entries"]) == 4
    assert list(tmp_path.iterdir()) == [probe.cache_file()]  # written whole: no temporary file left


def test_a_corrupt_or_foreign_cache_is_measured_again_and_written_over(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHBERT_CACHE", str(tmp_path))
    calls = counting(monkeypatch)
    path = probe.cache_file()
    probe.gflops(("fp32", "bf16"), 384, 1536, XEON, threads=2)
    (key,) = json.loads(path.read_text(encoding="utf-8"))["entries"]
    for text in ("{not json", json.dumps([1, 2]), json.dumps({"version": probe.VERSION + 1, "entries": {}}),
                 json.dumps({"version": probe.VERSION, "entries": {key: {"fp32": "fast", "bf16": 1}}}),
                 json.dumps({"version": probe.VERSION, "entries": {key: {"fp32": -1.0, "bf16": 1.0}}}),
                 json.dumps({"version": probe.VERSION, "entries": {key: ["fp32", 100]}})):
        path.write_text(text, encoding="utf-8")
        new_process()
        before = len(calls)
        assert probe.gflops(("fp32", "bf16"), 384, 1536, XEON, threads=2) == {"fp32": 100.0, "bf16": 50.0}, text
        assert len(calls) == before + 1, text
        assert json.loads(path.read_text(encoding="utf-8"))["entries"][key] == {"fp32": 100.0, "bf16": 50.0}


def test_a_cache_folder_that_cannot_be_written_keeps_the_figures_in_memory(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder", encoding="utf-8")
    monkeypatch.setenv("TORCHBERT_CACHE", str(blocker / "torchbert"))
    calls = counting(monkeypatch)
    assert probe.gflops(("fp32", "bf16"), 384, 1536, XEON, threads=2)["bf16"] == 50.0
    assert probe.gflops(("fp32", "bf16"), 384, 1536, XEON, threads=2)["bf16"] == 50.0
    assert len(calls) == 1 and blocker.read_text(encoding="utf-8") == "not a folder"


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHBERT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert probe.cache_file() == tmp_path / "xdg" / "torchbert" / "precision-probe.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert probe.cache_file() == tmp_path / "home" / ".cache" / "torchbert" / "precision-probe.json"


def test_the_real_probe_gives_a_figure_for_each_precision_and_leaves_the_threads_as_they_were():
    threads = torch.get_num_threads()
    figures = real_measure(("fp32", "bf16", "int8"), 64, 256, 1)
    assert set(figures) == {"fp32", "bf16", "int8"}
    assert all(math.isfinite(v) and v > 0 for v in figures.values()), figures
    assert torch.get_num_threads() == threads


def test_an_encoder_layers_int8_speed_counts_its_fp32_down_projection():
    """At BERT's shape (intermediate 4x hidden) the down projection is a third of a layer's products:
    INT8 products at 3x fp32's make the layer 1 / (1/3 + 2/3 / 3) = 1.8x; bf16 counts all of them."""
    figures = {"fp32": 100.0, "bf16": 250.0, "int8": 300.0}
    assert math.isclose(probe.encoder_speed(figures, "int8", 768, 3072), 1.8)
    assert math.isclose(probe.encoder_speed(figures, "bf16", 768, 3072), 2.5)
    assert math.isclose(probe.encoder_speed({"fp32": 1.0, "int8": 1.0}, "int8", 384, 1536), 1.0)
