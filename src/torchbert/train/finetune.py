"""`torchbert finetune`: a pretrained BERT + a task file -> a fine-tuned model.

The flow (BERT paper, section 4): the task's family (families.py) reads and validates the task
files (tasks/formats.py) and tokenizes them into model inputs (tasks/encode.py: windows for long token
sequences and QA contexts); a head goes on the encoder (heads.py), and it trains with the same loop
as pretraining (train/loop.py: AdamW without decay on biases and LayerNorm, warmup + schedule,
gradient accumulation, checkpoints, resume, DDP). After each epoch the dev set is predicted
(predict.py) and scored; the best epoch's weights are kept in RUN/best and become the run folder's
model.safetensors at the end. With `frozen` settings (token tasks only) the encoder is not trained:
a feature-based tagger on its hidden layers is (feature_tagger.py, BERT paper 5.3).

The run folder is a Hugging Face checkpoint of the task model (config.json with id2label/label2id,
model.safetensors, the tokenizer files), its run record torchbert.json (io/record.py: the task
settings, which evaluate, predict and serve read), metrics.json, metrics.jsonl, loss.png, dev.png
and dev_predictions.jsonl. A frozen run's folder holds the encoder as a plain BertModel checkpoint
and the tagger in tagger.safetensors, its settings in that file's metadata.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..architectures import architecture_of, architecture_of_folder, encoder_tensor, load_config
from ..config import BertConfig
from ..errors import UserError
from ..eval.plots import plot_finetuning
from ..io.checkpoint import PREFIX, latest_checkpoint
from ..io.files import atomic_copy, atomic_folder, atomic_write_text
from ..io.record import RunRecord, read_record, with_training, write_record
from ..settings import MAX_EPOCHS, Checked, setting
from ..tasks.batches import TaskData
from ..tasks.encode import cut_note
from ..tasks.examples import LabelMap
from ..tasks.families import TaskSettings, family, resolve_task, task_settings
from ..tasks.feature_tagger import FeatureTagger, TaggerSettings
from ..tasks.predict import id2label, predict
from ..tokenizer import BertTokenizer
from .distill import (TEACHER_CACHE, DistillSettings, DistillTask, cached_teacher_outputs, check_student,
                      distill_texts, fresh_student_config, mark_unlabelled, outputs_key, placeholder, save_teacher_outputs, soft_targets,
                      student_of, taken_layers, teacher_outputs, unlabeled_examples)
from .distributed import Dist, unwrap
from .loop import TrainConfig, train
from .objectives import FinetuneTask, targets_per_step
from .rundir import RunFolder, fixed, resumed, sha256
from .rundir import resumed_config as resumed_settings


@dataclass
class FinetuneSettings(Checked):
    """What `finetune` trains, declared once: its flags are made from these fields (and TrainConfig's,
    and the task families' settings: TaskSettings and each family's own)."""

    task: str = setting(help="task type or preset (see below): a task type (tasks/families.py FAMILIES) or a "
                             "preset name (tasks/formats.py TASK_PRESETS)")
    model: Path = setting(help="pretrained checkpoint folder, `minilm`, or a hub id")
    train: Path = setting(help="training file")
    out: Path = setting(help="run folder")
    dev: Path | None = setting(None, "dev file, scored after each epoch (without it the last weights are kept)")
    epochs: float = setting(3.0, "passes over the training data", above=0, high=MAX_EPOCHS)
    warmup_ratio: float = setting(0.1, "share of the steps in warmup", low=0, below=1)
    eval_batch_size: int = setting(64, "dev sequences per batch", low=1)
    lm_coef: float | None = setting(None, "GPT models: the weight of the next-token loss on the task's text, "
                                          "L3 = L2 + LAMBDA * L1 (default: 0.5, as the GPT paper; 0 trains the task "
                                          "loss alone)", low=0, metavar="LAMBDA")
    resume: bool = setting(False, "continue the run in out from its newest checkpoint", cli=False)
    overwrite: bool = setting(False, "delete an existing out and start again", cli=False)
    # how the task's text is read and trained on: its family's settings (tasks/families.py TaskSettings or
    # the family's subclass; None: the family's defaults); its type and layout are --task's
    task_settings: TaskSettings | None = None
    frozen: TaggerSettings | None = None  # train a tagger on the frozen encoder's features instead
    # distil: `model` is a fine-tuned teacher, and a student of fewer of its layers learns its outputs
    distill: DistillSettings | None = None
    given: tuple[str, ...] | None = None  # the flags the command line gave (None: every setting was given)
    command_line: str | None = None  # the command that runs it, for the run record

    def resolve(self, **loop: Any) -> tuple[FinetuneSettings, TrainConfig]:
        """These settings and the loop's (`loop`: TrainConfig fields) as `torchbert finetune` runs them,
        what is left out (or None) filled in with fine-tuning's own defaults, which are not pretraining's:
        seed 42; lr 5e-5 (the BERT paper's appendix A.3 tries 5e-5 to 2e-5), or 1e-3 for a task model
        trained from scratch on frozen features (`frozen`, or an ELMo), each architecture's own
        (architectures.py); the task's settings as its family's class (`task_settings`: the family's
        defaults for those not given). `run_finetuning(settings)` without a TrainConfig runs exactly this."""
        loop = {**LOOP_DEFAULTS, **{k: v for k, v in loop.items() if v is not None}}
        if loop["lr"] is None:
            arch = architecture_of_folder(self.model)  # None: run_finetuning says what is wrong with the folder
            loop["lr"] = 1e-3 if self.frozen is not None else arch.finetune_lr if arch is not None else 5e-5
        resolved = dataclasses.replace(self, task_settings=task_settings(self.task, self.task_settings))
        return resolved, TrainConfig(**loop)


# fine-tuning's own defaults of the loop's settings (FinetuneSettings.resolve: lr None is decided there)
LOOP_DEFAULTS = {"seed": 42, "lr": None}
# the loop's settings that fine-tuning derives (steps and warmup from epochs and warmup_ratio,
# evaluation every epoch) or fixes (AdamW, the best and the last checkpoint kept): not flags
LOOP_DERIVED = ("steps", "warmup_steps", "eval_every", "optimizer", "keep")


def report_lines(result: dict[str, Any], out: Path | str) -> list[str]:
    """A fine-tuning run in a line or two: its speed, and the dev scores of its best epoch."""
    shown = {k: v for k, v in result.items() if isinstance(v, float) and k not in
             ("epochs", "train_seconds", "eval_seconds", "tokens_per_second", "best_epoch", "peak_memory_gb",
              "memory_growth_gb") and not k.endswith("total")}
    what = f"trained a {result['tagger']['kind']} tagger on frozen features" if "tagger" in result else "fine-tuned"
    peak = f"; peak memory {result['peak_memory_gb']:.1f} GB" if "peak_memory_gb" in result else ""
    lines = [f"{what} {result['steps']} steps in {result['train_seconds']:.0f}s "
             f"({result['tokens_per_second']:,.0f} tokens/s; dev scoring {result['eval_seconds']:.0f}s more{peak}) -> {out}"]
    if shown:
        lines.append(f"dev (best epoch {result['best_epoch']}): " + ", ".join(f"{k} {v:.4f}" for k, v in shown.items()))
    return lines


# -- building the model ------------------------------------------------------------------------------

def task_config(model_dir: Path, ts: TaskSettings, label_map) -> BertConfig:
    config = load_config(model_dir)
    old = config.extra
    for key in ("torchbert_task", "torchbert_objective", "torchbert_generator_size"):  # an older torchbert's record
        old.pop(key, None)
    fam = family(ts.type)
    if label_map is not None:
        saved = old.get("id2label")
        earlier = read_record(model_dir)
        if saved and old.get("architectures", [None])[0] == fam.model_for(config).__name__ and earlier is not None \
                and earlier.fine_tuned:
            have = [saved[str(i)] if str(i) in saved else saved[i] for i in range(len(saved))]
            if have != label_map.labels:
                raise ValueError(f"--model {model_dir}: it was fine-tuned for the labels {have}, but the training "
                                 f"data has {label_map.labels}; start from the pretrained model instead")
    return fam.configure(config, label_map, ts, model_dir)


def load_task_model(model_dir: Path, config: BertConfig, ts: TaskSettings, log=print,
                    lm_coef: float | None = None) -> nn.Module:
    """The task model on the encoder in `model_dir`, built with what it trains by: its family's
    settings (head_arguments) and, for an architecture with a language-model loss, its weight."""
    fam = family(ts.type)
    cls = fam.model_for(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reported below in one line
        model = cls.from_pretrained(model_dir, config=config, **fam.head_arguments(ts),
                                    **({"lm_coef": lm_coef} if lm_coef is not None else {}))
    fresh = [k for k in model.load_report["missing"] if not encoder_tensor(k)]
    if fresh:
        log(f"{cls.__name__}: a new head ({', '.join(sorted({k.split('.')[0] for k in fresh}))}) on the encoder "
            f"of {model_dir}")
    return model


# -- the command -------------------------------------------------------------------------------------

def run_finetuning(s: FinetuneSettings, cfg: TrainConfig | None = None, device: torch.device | str = "cpu",
                   log=print, dist: Dist | None = None) -> dict[str, Any]:
    """Fine-tune as `torchbert finetune` does; cfg None: the loop's settings fine-tuning's defaults
    give (FinetuneSettings.resolve)."""
    dist = dist or Dist()
    device = torch.device(device)
    s, cfg = s.resolve() if cfg is None else (s, cfg)
    ts = task_settings(s.task, s.task_settings)
    if s.resume:  # the run's own settings and files: given otherwise, an error (rundir.resumed)
        mine = {"epochs": s.epochs, "warmup_ratio": s.warmup_ratio, "lm_coef": s.lm_coef, **ts.flags(),
                **(asdict(s.distill) if s.distill is not None else {})}
        cfg, kept = resumed_settings(s.out, cfg, s.given, mine, world_size=dist.world_size)
        s = dataclasses.replace(s, epochs=kept["epochs"], warmup_ratio=kept["warmup_ratio"], lm_coef=kept["lm_coef"])
        ts = dataclasses.replace(ts, **{k: kept[k] for k in ts.flags()})
        if s.distill is not None:
            s = dataclasses.replace(s, distill=DistillSettings(**{k: kept[k] for k in asdict(s.distill)}))
    record = {**fixed(cfg, dist.world_size), "epochs": s.epochs, "warmup_ratio": s.warmup_ratio, "lm_coef": s.lm_coef,
              **ts.flags(), **(asdict(s.distill) if s.distill is not None else {})}
    made = "distill" if s.distill is not None else "finetune"
    task_type, preset = resolve_task(s.task)
    fam = family(task_type)
    if s.frozen is not None and not fam.per_word:
        raise ValueError(f"--frozen trains a tagger on a frozen BERT's token features: it needs a token task, "
                         f"but --task {s.task} is {task_type}")
    folder = RunFolder(s.out, s.resume, s.overwrite, {"--model": s.model, "--train": s.train, "--dev": s.dev,
                                                      "--unlabeled": s.distill.unlabeled if s.distill else None}, log=log)
    tokenizer = BertTokenizer.from_pretrained(s.model)
    fam.model_for(load_config(s.model))  # a task without a model for this encoder is an error before any reading
    texts_alone = s.distill is not None and not soft_targets(fam).labelled  # an embedding student's texts
    train_examples = distill_texts(s.train, log) if texts_alone else fam.read(s.train, ts.layout)
    dev_examples = fam.read(s.dev, ts.layout) if s.dev is not None else None
    more = s.distill.unlabeled if s.distill is not None else None  # texts without labels, the teacher's to label
    unlabeled = unlabeled_examples(fam, more, ts.layout, log) if more else []
    if s.resume:  # the files read (so they are files): the ones the run started with?
        resumed(s.out, {"train": s.train, "dev": s.dev, **({"unlabeled": Path(more)} if more else {})}, None)
    record.update(train_sha256=sha256(s.train), **({"dev_sha256": sha256(s.dev)} if s.dev is not None else {}),
                  **({"unlabeled_sha256": sha256(Path(more))} if more else {}))
    label_map = fam.label_map(train_examples)
    if label_map is not None and s.distill is not None:  # the teacher's labels: --train may hold some of them
        saved = load_config(s.model).extra.get("id2label")
        label_map = LabelMap.from_config(saved) if saved else label_map
        label_map.check(train_examples)
    if label_map is not None and dev_examples is not None:
        label_map.check(dev_examples)
    config = task_config(s.model, ts, label_map)
    fam.model_for(config)  # a task without a head for this model is an error before any work
    arch = architecture_of(config)
    if s.frozen is not None and not arch.frozen_features:
        raise ValueError(f"--frozen reads a BERT's hidden layers; the model in {s.model} is {arch.title}"
                         + (" (ELMo's task models always read its features frozen)" if arch.name == "elmo"
                            else ""))
    if s.lm_coef is not None and not arch.lm_coef:
        raise ValueError(f"--lm-coef weighs GPT's next-token loss during fine-tuning; {s.model} is a {arch.title}")
    if s.resume:
        check_resumed_task(s.out, config, ts)
    if ts.max_length > config.max_position_embeddings:
        raise ValueError(f"--max-length {ts.max_length} is longer than the model's max_position_embeddings "
                         f"{config.max_position_embeddings}")
    if s.frozen is not None:
        try:
            s.frozen.feature_size(config)
        except ValueError as e:
            raise ValueError(f"--features {s.frozen.strategy}: {e}") from None
    if s.distill is not None:
        if arch.name != "bert":
            raise ValueError(f"--teacher {s.model}: distill takes a fine-tuned BERT as the teacher, not a {arch.title}")
        s.distill.one_student()
        if s.distill.student_layers is not None:
            layers = taken_layers(config.num_hidden_layers, s.distill.student_layers)
        elif s.distill.student is not None:  # a pretrained student of its own: the teacher's task on its encoder
            layers, student_config = None, task_config(Path(s.distill.student), ts, label_map)
            check_student(f"--student {s.distill.student}", student_config, config, s.distill,
                          BertTokenizer.from_pretrained(s.distill.student).vocab == tokenizer.vocab, ts.max_length)
        else:  # fresh weights of a size
            layers, student_config = None, fresh_student_config(s.distill.student_config, config)
            check_student(f"--student-config {s.distill.student_config}", student_config, config, s.distill, True,
                          ts.max_length)
        if unlabeled and config.extra.get("problem_type") == "multi_label_classification":
            raise ValueError(f"--unlabeled {more}: a multi-label student learns from its labelled examples alone")

    started = time.perf_counter()
    # the unlabelled texts after the labelled examples, each target UNLABELLED (train/distill.py)
    encoded = fam.encode(tokenizer, [*train_examples, *(placeholder(e, label_map) for e in unlabeled)], ts, label_map,
                         training=True)
    first_unlabelled = mark_unlabelled(encoded, len(train_examples)) if unlabeled else None
    train_data = TaskData(encoded, fam, seed=cfg.seed, rank=dist.rank, world_size=dist.world_size)
    dev_data = None
    if dev_examples is not None:
        dev_data = TaskData(fam.encode(tokenizer, dev_examples, ts, label_map, training=False), fam)
    log(f"{s.train}: {len(train_examples):,} examples -> {len(train_data.encoded.input_ids):,} sequences"
        + (f" ({len(unlabeled):,} of them {more}'s texts, without labels)" if unlabeled else "")
        + (f"; {s.dev}: {len(dev_examples):,} examples" if dev_examples is not None else "")
        + f" (tokenized in {time.perf_counter() - started:.1f}s)")
    cut = "" if fam.windows else cut_note(ts.max_length, config.max_position_embeddings, train_data.encoded,
                                          dev_data.encoded if dev_data is not None else None)
    if cut:  # a long text loses its end: say how often, so that --max-length is chosen knowingly
        log(cut)

    per_epoch = math.ceil(train_data.batches_per_epoch(cfg.batch_size) / cfg.grad_accum)
    if per_epoch < 1:
        raise ValueError(f"--train {s.train}: {len(train_data)} examples are fewer than one global batch of "
                         f"{cfg.batch_size * dist.world_size}")
    steps = max(1, round(s.epochs * per_epoch))  # fine-tuning counts epochs; the loop, steps
    cfg = dataclasses.replace(cfg, steps=steps, warmup_steps=round(s.warmup_ratio * steps), eval_every=per_epoch,
                              log_every=min(cfg.log_every, per_epoch))

    torch.manual_seed(cfg.seed)
    teacher, teacher_cache = None, None
    if s.distill is not None:
        teacher = load_task_model(s.model, config, ts, log).to(device)
        sizes = f"parameters, the teacher {sum(p.numel() for p in teacher.parameters()):,}"
        if layers is None:
            c = student_config
            model = (load_task_model(Path(s.distill.student), c, ts, log) if s.distill.student is not None else
                     fam.model_for(c)(c, **fam.head_arguments(ts))).to(device)
            log(f"{type(model).__name__}: the student {s.distill.student or s.distill.student_config + ', fresh'} "
                f"({c.num_hidden_layers} layers of {c.hidden_size}; {sum(p.numel() for p in model.parameters()):,} "
                f"{sizes})")
        else:
            model = student_of(teacher, s.distill.student_layers, **fam.head_arguments(ts)).to(device)
            log(f"{type(model).__name__}: a student of {len(layers)} layer{'s' if len(layers) > 1 else ''} (the "
                f"teacher's {', '.join(map(str, layers))} of {config.num_hidden_layers}; "
                f"{sum(p.numel() for p in model.parameters()):,} {sizes}), its embeddings and head the teacher's")
        config = model.config
    elif s.frozen is not None:
        model = FeatureTagger.from_encoder(s.model, config, s.frozen).to(device)
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log(f"FeatureTagger: a new {s.frozen.kind} tagger ({trained:,} parameters) on {s.frozen.strategy} features "
            f"of the frozen encoder of {s.model}")
    else:
        model = load_task_model(s.model, config, ts, log, s.lm_coef).to(device)
    from .distributed import wrap

    model = wrap(model, dist, device)
    with folder.opened(dist):
        if dist.is_main and not s.resume:
            config.save(s.out / "config.json")  # what --resume checks the labels against
            task = {**asdict(ts), **({"tagger": asdict(s.frozen)} if s.frozen is not None else {})}
            # what evaluate etc. read, and the settings and files it trains with (a resumed run's, once saved)
            write_record(s.out, RunRecord(made, task=task, training=record, command=s.command_line))

        def saved(checkpoint: Path) -> None:
            with_training(s.out, record, made)
            folder.commit(checkpoint)
        scoring = fam.scoring(label_map)
        best = _Best(s.out, fam.best_metric(label_map, preset, dev_examples), dist)
        evaluations = {"step": 0}
        if s.resume:
            ckpt = latest_checkpoint(s.out)
            evaluations["step"] = int(ckpt.name.removeprefix(PREFIX)) if ckpt is not None else 0
            best.resumed_at(evaluations["step"])

        def evaluate(m: nn.Module) -> dict[str, float]:
            # the loop evaluates after every epoch's last step and after the last step
            step = min(cfg.steps, (evaluations["step"] // per_epoch + 1) * per_epoch)
            evaluations["step"] = step
            records = predict(unwrap(m), dev_data, dev_examples, ts, id2label(config), s.eval_batch_size, device)
            scores = fam.score(records, dev_examples, label_map)
            epoch = step // per_epoch if step % per_epoch == 0 else round(step / per_epoch, 2)
            best.offer(unwrap(m), scores, records, step=step, epoch=epoch)
            return scores

        per_step = targets_per_step(train_data, cfg.batch_size * dist.world_size * cfg.grad_accum)
        if teacher is not None:  # the teacher's outputs on every training row, once; then it is let go
            started, teacher_cache, key = time.perf_counter(), s.out / TEACHER_CACHE, outputs_key(train_data, s.model)
            outputs = cached_teacher_outputs(teacher_cache, fam, key) if s.resume else None
            if outputs is not None:
                log(f"the teacher's outputs on {len(train_data.encoded.input_ids):,} training sequences, as this "
                    f"run saved them ({teacher_cache.name})")
            else:
                outputs = teacher_outputs(teacher, train_data, s.eval_batch_size, device)
                log(f"the teacher's outputs on {len(train_data.encoded.input_ids):,} training sequences in "
                    f"{time.perf_counter() - started:.1f}s")
                if dist.is_main:  # for --resume, until the run has finished
                    save_teacher_outputs(teacher_cache, outputs, key)
            rows = len(train_data.encoded.input_ids)  # the layer losses' count: sequences
            units = cfg.batch_size * dist.world_size * cfg.grad_accum
            first_unit = None if first_unlabelled is None else \
                int(np.searchsorted(train_data.unit_start, first_unlabelled))  # an example, for multiple choice
            task = DistillTask(fam, outputs, s.distill, config, per_step=per_step, labelled_rows=first_unlabelled,
                               teacher_model=teacher if s.distill.layer_losses else None,
                               rows_per_step=rows * min(units, len(train_data)) / len(train_data),
                               labelled_units=first_unit, units=len(train_data))
            teacher = None  # let go, unless the task keeps it for the layer losses
        else:
            task = FinetuneTask(fam, per_step=per_step)
        summary = train(model, train_data, task, cfg, s.out, resume=s.resume,
                        evaluate=evaluate if dev_data is not None else None, device=device, log=log, dist=dist,
                        on_checkpoint=saved)
        if not dist.is_main:
            return summary
        if teacher_cache is not None:  # finished: nothing left to resume
            teacher_cache.unlink(missing_ok=True)
        final_dir = best.folder if best.exists() else None
        if final_dir is not None:  # every file the best model saved (a tagger's, sentence-transformers')
            for path in sorted(p for p in final_dir.rglob("*") if p.is_file()):
                (s.out / path.relative_to(final_dir)).parent.mkdir(parents=True, exist_ok=True)
                atomic_copy(path, s.out / path.relative_to(final_dir))
        else:  # no dev set: the last weights
            unwrap(model).save_pretrained(s.out)
        # the length it was trained with, where transformers and sentence-transformers' CrossEncoder cut
        tokenizer.model_max_length = ts.max_length
        tokenizer.save_pretrained(s.out)
        result = {"task": s.task, "type": task_type, **({"scoring": scoring} if scoring else {}),
                  **(best.metrics() or {}),
                  "best_epoch": best.epoch(), "epochs": s.epochs, "steps": summary["steps"],
                  "train_seconds": summary["train_seconds"], "eval_seconds": summary["eval_seconds"],
                  "tokens": summary["tokens"],
                  "tokens_per_second": summary["tokens_per_second"], "train_examples": len(train_examples),
                  "dev_examples": len(dev_examples) if dev_examples is not None else 0, "history": best.history(),
                  **{k: summary[k] for k in ("peak_memory_gb", "memory_growth_gb") if k in summary},
                  "config": summary["config"]}
        if s.frozen is not None:
            result["tagger"] = asdict(s.frozen)
        if s.distill is not None:
            result["distill"] = {**asdict(s.distill), "teacher": str(s.model), "layers": layers,
                                 **({"unlabeled_examples": len(unlabeled)} if unlabeled else {}),
                                 "teacher_layers": load_config(s.model).num_hidden_layers}
        atomic_write_text(s.out / "metrics.json", json.dumps(result, indent=2) + "\n")
        plot_finetuning(s.out, best.name)
        return result


def check_resumed_task(out: Path, config: BertConfig, ts: TaskSettings) -> None:
    """--resume continues the same task with the same labels; anything else is an error here,
    not a page of state-dict mismatches later."""
    path = out / "config.json"
    if not path.is_file():
        return  # a run started by an older torchbert: the checkpoint's shapes are checked on load
    saved = load_config(path).extra
    run = read_record(out)
    old = (run.task or {}).get("type") if run is not None else None
    if old != ts.type:
        raise UserError(f"--resume: the run in {out} fine-tunes a {old} task, not {ts.type}; "
                        "resume with the --task it started with")
    labels = [saved.get("id2label", {}).get(str(i)) for i in range(len(saved.get("id2label", {})))]
    have = [config.extra.get("id2label", {}).get(str(i)) for i in range(len(config.extra.get("id2label", {})))]
    if labels != have:
        raise UserError(f"--resume: the run in {out} was started with the labels {labels}, but --train has {have}; "
                        "resume with the training file it started with, or start again with --overwrite")


class _Best:
    """The best dev score so far, its weights in RUN/best (written atomically, kept across --resume)."""

    def __init__(self, out: Path, name: str, dist: Dist):
        self.out, self.name, self.dist = out, name, dist
        self.folder = out / "best"
        self.state_file = out / "best.json"
        self.state = json.loads(self.state_file.read_text()) if self.state_file.is_file() else {"history": []}

    def resumed_at(self, step: int) -> None:
        """Forget evaluations after the checkpoint a resumed run starts from (they will be made again)."""
        self.state["history"] = [h for h in self.state["history"] if h["step"] <= step]

    def better(self, value: float) -> bool:
        old = self.state.get("metrics", {}).get(self.name)
        lower_is_better = self.name in ("mse",)
        return old is None or (value < old if lower_is_better else value > old)

    def offer(self, model: nn.Module, scores: dict[str, float], records: list[dict], step: int,
              epoch: float) -> None:
        self.state["history"].append({"epoch": epoch, "step": step, **scores})
        if self.better(scores[self.name]):
            self.state.update(metrics=scores, epoch=epoch)
            if self.dist.is_main:
                with atomic_folder(self.folder) as tmp:  # the earlier best stays until the new one is whole
                    model.save_pretrained(tmp)
                    (tmp / "dev_predictions.jsonl").write_text(
                        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        if self.dist.is_main:
            atomic_write_text(self.state_file, json.dumps(self.state, indent=2) + "\n")

    def exists(self) -> bool:
        return (self.folder / "model.safetensors").is_file()

    def metrics(self) -> dict[str, float] | None:
        return self.state.get("metrics")

    def epoch(self) -> int | None:
        return self.state.get("epoch")

    def history(self) -> list[dict]:
        return self.state["history"]
