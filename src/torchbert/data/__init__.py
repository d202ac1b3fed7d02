"""Pretraining data: corpus -> instances (pretraining.py) -> memory-mapped shards and batches (shards.py)."""

from .pretraining import PrepareSettings, prepare
from .shards import Batch, PretrainingData

__all__ = ["Batch", "PrepareSettings", "PretrainingData", "prepare"]
