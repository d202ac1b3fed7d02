"""fine-tune a BERT on a task (classification, tagging, QA, multiple choice)

Fine-tune a pretrained BERT with a task head, scoring the dev set every epoch."""

from __future__ import annotations

import dataclasses
from functools import partial
from dataclasses import dataclass

from ..errors import UserError
from ..settings import Checked, SettingError, add_flags, setting
from .common import command, resolve_model, run_training, settings_from, shared_flags

WRITES_FOLDER = True
COMPUTES = True
TRAINS_RUN = True
EPILOG = """\
examples:
  torchbert finetune --task token --model minilm --train wnut_train.conll --dev wnut_dev.conll --out ./ner
  torchbert finetune --task sst2 --model ./my-bert --train SST-2/train.tsv --dev SST-2/dev.tsv --out ./sst2
  torchbert finetune --task qa-v2 --model ./my-bert --train train-v2.0.json --dev dev-v2.0.json --out ./squad2 \\
      --max-length 384 --doc-stride 128 --epochs 2 --lr 3e-5
  torchrun --nproc-per-node 4 -m torchbert finetune --task mnli --model ./my-bert --train ... --dev ... --out ...
  torchbert finetune --task conll2003 --model ./my-bert --train train.txt --dev valid.txt --out ./ner-features \\
      --frozen --features concat_last_four --epochs 10

--task is a task type or a preset that fixes the type, the file layout and the metric the best epoch
is chosen by:
{families}
  presets: cola sst2 mrpc stsb qqp mnli qnli rte wnli (GLUE TSVs), snli (JSONL), squad, squad_v2,
           conll2003, swag
Labels come from the training file and are stored in config.json (id2label); a dev label that
training never had is an error naming its line. Long token sequences and QA contexts are cut into
overlapping windows (--doc-stride), never truncated; any other text longer than --max-length loses
its end, and finetune says how many training and dev sequences reach it. The dev set is scored
after every epoch; the best epoch's weights are the run's model.

--train, --dev (and evaluate's --data, predict's --input) also take a Hugging Face hub split as
hf:NAME[:CONFIG]:SPLIT, e.g. hf:nyu-mll/glue:sst2:train or hf:conll2003:validation. It needs
`pip install datasets` and a network; the split is written in the task's layout and read like a file.

The run folder: config.json + model.safetensors (transformers' BertFor<Task> loads it), the
tokenizer, metrics.json (dev metrics of the best epoch, train_seconds (the steps alone), eval_seconds (dev
scoring), tokens, tokens_per_second, peak_memory_gb (the process's), memory_growth_gb (after the first
tenth of the steps)), metrics.jsonl (memory_gb: the process's resident memory at that step),
loss.png, dev.png, dev_predictions.jsonl, best/ and checkpoints/ (for --resume).

--frozen (token tasks) is the feature-based approach of the BERT paper (section 5.3, Table 7): BERT
is not trained (no gradient, no dropout); a tagger learns from --features of its hidden layers:
embeddings, last, second_to_last, sum_all, sum_last_four, concat_last_four (the default, 4H wide)
or a layer index. --tagger bilstm (the default: two layers, 256 per direction) or linear. The
run folder then holds the encoder as a plain BertModel checkpoint and the tagger in
tagger.safetensors; evaluate and predict read both.

A GPT (pretrain --model gpt) fine-tunes on every task type through the same commands, as the GPT
paper does: each sequence's last token ([SEP]) is the extract token; classification reads its final
state, regression (similarity) reads each pair in both orders and sums the two, multiple choice
scores each `context [SEP] choice [SEP]`; tagging and QA read every token's state, which has seen
the tokens before it only. The loss adds the next-token loss on the task's text (--lm-coef, 0.5).

An ELMo (pretrain --model elmo) stays frozen, as in the ELMo paper: a scalar mix of its layers,
learned with the task, feeds a two-layer BiLSTM tagger (token tasks) or a BiLSTM with max pooling
(classification, pairs read as one sequence, regression). Other task types need BERT or GPT.
"""


@dataclass(kw_only=True)
class FrozenFlags(Checked):
    """The flags of --frozen, made into the tagger's settings (TaggerSettings) when it is given."""

    frozen: bool = setting(False, "token tasks: keep BERT fixed and train a tagger on its features (see below)")
    features: str | None = setting(None, "--frozen: which hidden layers feed the tagger (default: concat_last_four)",
                                   metavar="STRATEGY")
    tagger: str | None = setting(None, "--frozen: the tagger (default: bilstm)", choices=("bilstm", "linear"))


def add(sub) -> None:
    from ..tasks.families import TaskSettings
    from ..train.finetune import LOOP_DEFAULTS, LOOP_DERIVED, FinetuneSettings
    from ..train.loop import TrainConfig

    p = command(sub, __name__, epilog=EPILOG.replace("{families}", family_lines()))
    add_flags(p, FinetuneSettings, helps={"task": "task type or preset (see below)"})
    add_flags(p, TaskSettings)  # what every task family reads
    for cls, types in family_settings().items():  # and each family's own, under the family
        add_flags(p.add_argument_group(f"{' and '.join(types)} tasks"), cls, only=cls.own_fields())
    add_flags(p, FrozenFlags)
    add_flags(p, TrainConfig, skip=LOOP_DERIVED, defaults=LOOP_DEFAULTS,
              helps={"lr": "peak learning rate (default: 5e-5; 1e-3 with --frozen and for ELMo)",
                     "batch_size": "sequences (multiple choice: examples) per micro-batch (default: 32)"})
    shared_flags(p, "device", "threads", "resume", "overwrite", "quiet",
                 overwrite="delete an existing --out and start again")


def family_settings() -> dict[type, list[str]]:
    """Each task family's settings class that has settings of its own, and the task types it serves."""
    from ..tasks.families import FAMILIES

    found: dict[type, list[str]] = {}
    for t, fam in FAMILIES.items():
        if fam.Settings.own_fields():
            found.setdefault(fam.Settings, []).append(t)
    return found


def family_lines() -> str:
    """A line per registered task family (types that share one description share the line)."""
    from ..tasks.families import FAMILIES

    about: dict[str, list[str]] = {}
    for t, fam in FAMILIES.items():
        about.setdefault(fam.about, []).append(t)
    return "\n".join(f"  {', '.join(types):<16} {text}" for text, types in about.items())


def settings(args):
    """finetune's settings and the loop's from the parsed flags, each checked before the model is read."""
    from ..tasks.families import family, resolve_task, task_settings
    from ..train.finetune import FinetuneSettings
    from ..train.loop import TrainConfig

    flags = settings_from(FrozenFlags, args)
    frozen = None
    if flags.frozen:
        from ..tasks.feature_tagger import TaggerSettings

        try:
            frozen = TaggerSettings(kind=flags.tagger or "bilstm", strategy=flags.features or "concat_last_four")
        except ValueError as e:
            raise UserError(f"--features: {e}") from None
    elif flags.features is not None or flags.tagger is not None:
        raise UserError("--features and --tagger set up the tagger of --frozen; add --frozen, or leave them out")
    try:
        task_type, _ = resolve_task(args.task)
    except ValueError as e:
        raise UserError(f"--task: {e}") from None
    own = family(task_type).Settings
    for cls, types in family_settings().items():  # another family's setting, given, is an error naming it
        for name in set(cls.own_fields()) - set(own.__dataclass_fields__):
            if getattr(args, name) != cls.__dataclass_fields__[name].default:
                raise UserError(f"--{name.replace('_', '-')} is a setting of {' and '.join(types)} tasks; a "
                                f"{task_type} task does not read it")
    ts = task_settings(args.task, settings_from(own, args, type=task_type))  # checked here, before the model is read
    s = settings_from(FinetuneSettings, args, task_settings=ts, frozen=frozen)
    loop = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    try:  # the loop's flags are checked here, before the model is read
        s, cfg = s.resolve(**loop, progress=not args.quiet)
    except SettingError as e:
        raise UserError(e.as_flag()) from None
    return dataclasses.replace(s, model=resolve_model(args.model)), cfg


def run(args) -> None:
    from ..train.finetune import run_finetuning

    s, cfg = settings(args)
    run_training(args, cfg, partial(run_finetuning, s, cfg), report)


def report(result: dict, out: str) -> None:
    from ..train.finetune import report_lines

    print("\n".join(report_lines(result, out)))
