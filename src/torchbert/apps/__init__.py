"""What users run on top of the library: `serve` (serve.py), `export` (export.py), `convert`
(convert.py), `compare` and its pretraining recipes (compare.py, recipes.py), `demo` (demo.py) and the
sample data sets that packages ship (samples.py). Each is a command of `torchbert.cli`."""
