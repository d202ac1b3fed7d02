"""Pretraining data: a corpus as users hold it (sources.py) -> sentence pairs -> masked instances
(pretraining.py, masking.py), streamed in blocks on every core or a cluster (pipeline.py) ->
memory-mapped shards and batches (shards.py). Fine-tuning data lives in `torchbert.tasks`."""

from importlib import import_module

__all__ = ["Batch", "PrepareSettings", "PretrainingData", "prepare"]
_HOMES = {"Batch": ".shards", "PrepareSettings": ".pretraining", "PretrainingData": ".shards", "prepare": ".pipeline"}


def __getattr__(name: str):  # imported on first use: prepare's worker processes never load torch
    if name in _HOMES:
        return getattr(import_module(_HOMES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
