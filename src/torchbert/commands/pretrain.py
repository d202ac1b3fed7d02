"""pretrain a BERT (MLM + NSP), or the GPT baseline, on prepared data

Pretrain BertForPreTraining (or, with --model gpt, OpenAIGPTLMHeadModel) on a folder written by
`torchbert prepare`."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..errors import UserError
from ..settings import add_flags
from .common import command, run_training, settings_from, shared_flags

WRITES_FOLDER = True
COMPUTES = True
TRAINS_RUN = True
EPILOG = """\
examples:
  torchbert pretrain --data data/zh --out runs/zh-small --config small --steps 10000 --batch-size 32
  torchbert pretrain --data data/zh --out runs/zh-small --resume            # continue after a stop
  torchbert pretrain --data data/zh512 --out runs/phase2 --init runs/zh-small --steps 1000   # phase 2
  torchrun --nproc-per-node 4 -m torchbert pretrain --data data/zh --out runs/ddp --batch-size 32
  torchbert pretrain --data data/zh --out runs/zh-gpt --model gpt --config small   # the GPT baseline
  torchbert pretrain --data data/news:0.7 data/wiki:0.3 --out runs/blend   # two corpora at 70/30

--model gpt pretrains GPT (Radford et al., 2018), the left-to-right Transformer the BERT paper compares
against, on the same prepared data: each instance read as plain text ([CLS] A [SEP] B [SEP], unmasked),
every token predicting the next. A preset gives it BERT's layers, width and heads of that name; the
run folder is a Hugging Face OpenAIGPTLMHeadModel checkpoint.
--config takes a preset (tiny, mini, small, medium, base, large) or a config.json; the vocabulary
size comes from the data. The run folder is a Hugging Face checkpoint (config.json,
model.safetensors, vocab.txt) with metrics.jsonl (a line per --log-every steps: the losses and accuracies
since the last, lr, seconds, memory_gb), metrics.json (the run's figures: tokens_per_second,
peak_memory_gb, the held-out scores), loss.png and accuracy.png.
Checkpoints (model, optimizer, schedule, RNG states, data position) go to OUT/checkpoints every
--save-every steps; --resume continues from the newest whole one, bit for bit.
Under torchrun each process reads its own part of every batch, so --batch-size is per process and
the global batch is batch-size x processes x grad-accum; --fsdp shards the model with FSDP2.
Several --data folders are one blend: each drawn at its weight (FOLDER:WEIGHT; none given: by its
number of instances), upsampled when its weight is above its share, evaluated on their held-out
documents blended alike; they must share the tokenizer and the masking settings.
"""


def add(sub) -> None:
    from ..train.loop import TrainConfig
    from ..train.objectives import PRETRAINING, objectives
    from ..train.pretrain import PretrainSettings

    p = command(sub, __name__)
    mine = objectives()  # the registry's, each with its own words
    add_flags(p, PretrainSettings, helps={"objective": "BERT's: " + "; ".join(f"{n}, {PRETRAINING[n].about}" for n in mine)
                                                       + f" (default: {mine[0]}; with --resume: the run's own)"})
    for spec in PRETRAINING.values():  # an objective's own settings, under its name
        if spec.settings is not None:
            add_flags(p.add_argument_group(f"{spec.flag}"), spec.settings)
    add_flags(p, TrainConfig)
    shared_flags(p, "device", "threads", "resume", "overwrite", "quiet",
                 overwrite="delete an existing --out and start again")


def objective_settings(args):
    """The settings object of the objective whose own flags were given (None: none was); the run
    checks that it is its objective's. Flags of two objectives at once are an error."""
    from ..train.objectives import PRETRAINING

    given = getattr(args, "given", None)  # the flags the command line gave (cli.given_flags)
    found = None
    for spec in PRETRAINING.values():
        names = [n for n in getattr(spec.settings, "__dataclass_fields__", ()) if n in (given or ())]
        if names:
            if found is not None:
                raise UserError(f"--{names[0].replace('_', '-')} is a setting of {spec.flag}, and the others given are "
                                "another objective's: give one objective's settings")
            found = settings_from(spec.settings, args)
    return found


def run(args) -> None:
    from ..config import PRESETS
    from ..train.loop import TrainConfig
    from ..train.pretrain import PretrainSettings, run_pretraining

    cfg = settings_from(TrainConfig, args, progress=not args.quiet)
    settings = settings_from(PretrainSettings, args, objective_settings=objective_settings(args))
    if args.config is not None and args.config not in PRESETS and not Path(args.config).is_file():
        raise UserError(f"--config {args.config}: neither a preset ({', '.join(PRESETS)}) nor a config.json file")
    run_training(args, cfg, partial(run_pretraining, settings, cfg), report)


def report(summary: dict, out: str) -> None:
    from ..train.pretrain import report_lines

    print("\n".join(report_lines(summary, out)))
