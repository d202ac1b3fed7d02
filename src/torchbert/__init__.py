"""torchbert: BERT on PyTorch, complete and fast.

The names below are imported on first use, so that `torchbert --help` and an early Ctrl-C do not
wait for torch to load."""

from importlib import import_module

__all__ = ["BertConfig", "BertModel", "BertOutput", "BertTokenizer"]
__version__ = "0.1.0"
_HOMES = {"BertConfig": ".config", "BertModel": ".model", "BertOutput": ".model", "BertTokenizer": ".tokenizer"}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(import_module(_HOMES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
