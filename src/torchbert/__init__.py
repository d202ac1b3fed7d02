"""torchbert: BERT on PyTorch, complete and fast."""

from .config import BertConfig
from .model import BertModel, BertOutput

__all__ = ["BertConfig", "BertModel", "BertOutput"]
__version__ = "0.1.0"
