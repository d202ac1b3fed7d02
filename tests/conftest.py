import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import realdata  # noqa: E402

# Parity tests compare fp32 numbers; keep every test deterministic and single-process friendly.
torch.manual_seed(0)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return realdata.minilm_dir()
