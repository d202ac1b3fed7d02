"""Pretraining data: corpus -> sentence pairs -> masked instances (pretraining.py, masking.py) ->
memory-mapped shards and batches (shards.py). Fine-tuning data lives in `torchbert.tasks`."""

from .pretraining import PrepareSettings, prepare
from .shards import Batch, PretrainingData

__all__ = ["Batch", "PrepareSettings", "PretrainingData", "prepare"]
