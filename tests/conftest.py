import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import realdata  # noqa: E402

from torchbert.cli import main  # noqa: E402
from torchbert.heads import BertForMaskedLM, BertForNextSentencePrediction, BertForPreTraining  # noqa: E402
from torchbert.tokenizer import BertTokenizer  # noqa: E402

# Parity tests compare fp32 numbers; keep every test deterministic and single-process friendly.
torch.manual_seed(0)
# The precision probe's figures (torchbert/probe.py) go to a folder of the test run's, never the user's
# cache; commands that tests run as subprocesses inherit it.
os.environ["TORCHBERT_CACHE"] = tempfile.mkdtemp(prefix="torchbert-test-cache.")


def figures_by_flags(precisions, hidden, intermediate, threads):
    """The probe's figures as the CPU's flags suggest them (bf16 2.7x fp32's where it is native, a
    quarter where it is emulated; INT8 2x or 1.2x with or without 8-bit dot products): tests that mock
    `hardware.cpu` get the machine they ask for, and none depends on this host's speed."""
    from torchbert import hardware

    c = hardware.cpu()
    figures = {"fp32": 100.0, "bf16": 270.0 if c.native_bf16 else 25.0, "int8": 200.0 if c.native_int8 else 120.0}
    return {p: figures[p] for p in precisions}


@pytest.fixture(autouse=True)
def cpu_speed(monkeypatch):
    from torchbert import probe

    monkeypatch.setattr(probe, "measure", figures_by_flags)
    monkeypatch.setenv("TORCHBERT_CACHE", str(Path(os.environ["TORCHBERT_CACHE"]) / "in-process"))
    probe._memory.cache_clear()
    yield
    probe._memory.cache_clear()


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return realdata.minilm_dir()


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    """A small Chinese corpus (documents of five paragraphs), its vocab and two prepared folders."""
    root = tmp_path_factory.mktemp("pd")
    lines = realdata.peoples_daily_lines()[:600]
    docs = ["\n".join(lines[i:i + 5]) for i in range(0, len(lines), 5)]
    (root / "train.txt").write_text("\n\n".join(docs[:100]) + "\n", encoding="utf-8")
    (root / "eval.txt").write_text("\n\n".join(docs[100:]) + "\n", encoding="utf-8")
    assert main(["vocab", "--corpus", str(root / "train.txt"), "--vocab-size", "3000", "--out", str(root / "tok")]) == 0
    for name, corpus, length in (("data", "train.txt", 64), ("eval", "eval.txt", 64), ("data128", "train.txt", 128)):
        assert main(["prepare", "--corpus", str(root / corpus), "--tokenizer", str(root / "tok"), "--out",
                     str(root / name), "--max-seq-len", str(length), "--dupe-factor", "2", "--quiet"]) == 0
    return root


@pytest.fixture(scope="session")
def real_batch(minilm_dir):
    """Sentence pairs of real text, 15% of the non-special tokens masked, NSP labels mixed."""
    tok = BertTokenizer.from_pretrained(minilm_dir)
    en = list(realdata.english_texts()[300:306])
    zh = list(realdata.peoples_daily_sentences()[300:306])
    enc = tok(en + zh, zh + en, truncation=True, max_length=96, padding=True, return_tensors="pt")
    g = torch.Generator().manual_seed(0)
    special = (enc["input_ids"] == tok.cls_token_id) | (enc["input_ids"] == tok.sep_token_id)
    chosen = (torch.rand(enc["input_ids"].shape, generator=g) < 0.15) & enc["attention_mask"].bool() & ~special
    labels = torch.where(chosen, enc["input_ids"], -100)
    inputs = torch.where(chosen, tok.mask_token_id, enc["input_ids"])
    nsp = torch.tensor([0, 1] * 6)
    return dict(input_ids=inputs, attention_mask=enc["attention_mask"], token_type_ids=enc["token_type_ids"]), labels, nsp


@pytest.fixture(scope="session")
def minilm_with_heads(minilm_dir, tmp_path_factory):
    """MiniLM's encoder plus freshly initialized heads, saved by us for each model class."""
    folders = {}
    for ours_cls in (BertForPreTraining, BertForMaskedLM, BertForNextSentencePrediction):
        torch.manual_seed(0)
        with pytest.warns(UserWarning, match="fresh initialization"):
            model = ours_cls.from_pretrained(minilm_dir)
        assert model.load_report["missing"]  # the heads were not in MiniLM's file
        folder = tmp_path_factory.mktemp(ours_cls.__name__)
        model.save_pretrained(folder)
        folders[ours_cls] = folder
    return folders
