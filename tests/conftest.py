import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import realdata  # noqa: E402
from torchbert.cli import main  # noqa: E402

# Parity tests compare fp32 numbers; keep every test deterministic and single-process friendly.
torch.manual_seed(0)


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
