"""Fine-tuning: task files -> examples -> model inputs with windows -> packed batches (batches.py),
through one module per task family (text.py, tagging.py, qa.py, choice.py, embedding.py,
reranker.py), each registered by name
in families.py; what they share: reading tables and presets (formats.py), encoded rows (encode.py),
label maps (examples.py), hub splits (hub.py); the tagger on frozen features (feature_tagger.py);
`evaluate` and `predict` on a run folder (predict.py)."""

# the built-in task families register themselves, in the order --help and errors list them
from . import text  # noqa: F401, I001
from . import tagging  # noqa: F401
from . import qa  # noqa: F401
from . import choice  # noqa: F401
from . import embedding  # noqa: F401
from . import reranker  # noqa: F401
