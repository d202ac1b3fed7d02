"""What users run on top of the library: `serve` (serve.py), `export` (export.py), `convert`
(convert.py), `compare` (compare.py), `demo` (demo.py), the
stages both run (stages.py: the library called with settings objects, each stage printed as the command
line that runs it) and the sample data sets that packages ship (samples.py). Each is a command of
`torchbert.cli`."""
