"""Scores of fine-tuned models: classification, regression, entity-level tagging and SQuAD (metrics.py)."""
