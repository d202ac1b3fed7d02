"""torchbert: BERT on PyTorch, complete and fast."""

from .config import BertConfig
from .model import BertModel, BertOutput
from .tokenizer import BertTokenizer

__all__ = ["BertConfig", "BertModel", "BertOutput", "BertTokenizer"]
__version__ = "0.1.0"
