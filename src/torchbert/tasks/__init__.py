"""Fine-tuning: task files -> examples (formats.py, examples.py; hub.py fetches the GLUE/SQuAD/CoNLL
sets) -> model inputs with windows (encode.py) -> packed batches (batches.py); one class per task
family that ties reading, the head's targets and the scores together (families.py); the tagger on
frozen features (feature_tagger.py); `evaluate` and `predict` on a run folder (predict.py)."""
