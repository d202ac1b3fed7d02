"""Pretraining data: a corpus as users hold it (sources.py) -> sentence pairs -> masked instances
(pretraining.py, masking.py), streamed in blocks on every core or a cluster (pipeline.py) ->
memory-mapped shards and batches (shards.py). Fine-tuning data lives in `torchbert.tasks`."""

from .pipeline import prepare
from .pretraining import PrepareSettings
from .shards import Batch, PretrainingData

__all__ = ["Batch", "PrepareSettings", "PretrainingData", "prepare"]
