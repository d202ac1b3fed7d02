"""The commands of `torchbert`, one module each (commands/<verb>.py, `inspect_data` for inspect-data).

A command module holds everything of its verb: its docstring (the first paragraph is its line in
`torchbert --help`, the rest its description), EPILOG (examples and figures, shown after the flags),
its settings as dataclasses of `setting` fields (flags, defaults, help and bounds declared once),
`add(subparsers)` that makes its parser, and `run(args)` that runs it. Markers tell `main` what to do
around it: WRITES_FOLDER (it writes --out, held against a second writer), COMPUTES (it shares the
CPUs with the other torchbert jobs), TRAINS_RUN (a run folder with checkpoints: --resume keeps the
settings not given again, and an interrupt says how to continue) and STDOUT (`--out -` writes to
standard output; elsewhere it is refused, not made a file named "-"). To add a command, write its
module and add its name to COMMANDS (the order of `torchbert --help`).
"""

COMMANDS = ("embed", "serve", "convert", "export", "vocab", "prepare", "inspect_data", "pretrain", "finetune",
            "distill", "evaluate", "predict", "demo", "compare", "benchmark", "samples", "env")
