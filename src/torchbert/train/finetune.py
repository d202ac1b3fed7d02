"""`torchbert finetune / evaluate / predict`: a pretrained BERT + a task file -> a fine-tuned model.

The flow (BERT paper, section 4): read and validate the task files (data/tasks.py), tokenize them
into model inputs (data/encode.py: windows for long token sequences and QA contexts), put a head on
the encoder (heads.py), and train with the same loop as pretraining (train/loop.py: AdamW without
decay on biases and LayerNorm, warmup + schedule, gradient accumulation, checkpoints, resume, DDP).
After each epoch the dev set is scored; the best epoch's weights are kept in RUN/best and become
the run folder's model.safetensors at the end. With `frozen` settings (token tasks only) the encoder
is not trained: a feature-based tagger on its hidden layers is (feature_tagger.py, BERT paper 5.3).

The run folder is a Hugging Face checkpoint of the task model (config.json with id2label/label2id
and the task settings under `torchbert_task`, model.safetensors, the tokenizer files), plus
metrics.json, metrics.jsonl, loss.png, dev.png and dev_predictions.jsonl. A frozen run's folder holds
the encoder as a plain BertModel checkpoint and the tagger in tagger.safetensors, its settings in
config.json under torchbert_task.tagger.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..config import BertConfig
from ..data import encode as enc
from ..data import tasks
from ..data.taskdata import TaskBatch, TaskData
from ..errors import UserError
from ..eval import metrics
from ..eval.plots import plot_finetuning
from ..feature_tagger import TAGGER_FILE, FeatureTagger, TaggerSettings
from ..heads import (
    IGNORE,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from ..io.checkpoint import PREFIX, latest_checkpoint
from ..io.files import atomic_copy, atomic_folder, atomic_write_text
from ..io.hf import with_labels
from ..tokenizer import BertTokenizer
from .distributed import Dist, unwrap
from .loop import TrainConfig, train
from .rundir import RunFolder

MODEL_CLASSES = {
    "classification": BertForSequenceClassification,
    "pair": BertForSequenceClassification,
    "regression": BertForSequenceClassification,
    "token": BertForTokenClassification,
    "qa": BertForQuestionAnswering,
    "qa-v2": BertForQuestionAnswering,
    "multiple-choice": BertForMultipleChoice,
}
LABELLED_TYPES = ("classification", "pair", "token")  # tasks whose label set is stored in config.json


@dataclass
class TaskSettings:
    """How a task's text becomes model inputs; stored in config.json so evaluate/predict reuse it."""

    type: str
    preset: str | None = None
    layout: str = "auto"
    max_length: int = 128
    doc_stride: int = 128
    max_query_length: int = 64
    label_all_subtokens: bool = False
    n_best: int = 20
    max_answer_length: int = 30
    null_threshold: float = 0.0

    @classmethod
    def from_config(cls, config: BertConfig, where: str) -> TaskSettings:
        saved = config.extra.get("torchbert_task")
        if not isinstance(saved, dict) or saved.get("type") not in MODEL_CLASSES:
            raise ValueError(f"{where}: not a model fine-tuned by torchbert (its config.json has no torchbert_task); "
                             "fine-tune it first with torchbert finetune")
        return cls(**{k: v for k, v in saved.items() if k in cls.__dataclass_fields__})


@dataclass
class FinetuneSettings:
    task: str  # a task type (data/examples.py TASK_TYPES) or a preset name (data/tasks.py PRESETS)
    model: Path
    train: Path
    out: Path
    dev: Path | None = None
    epochs: float = 3.0
    warmup_ratio: float = 0.1
    eval_batch_size: int = 64
    resume: bool = False
    overwrite: bool = False
    encoding: dict[str, Any] = field(default_factory=dict)  # TaskSettings fields given on the command line
    frozen: TaggerSettings | None = None  # train a tagger on the frozen encoder's features instead


# -- from files to batches ---------------------------------------------------------------------------

def encode_split(tokenizer: BertTokenizer, examples: list, ts: TaskSettings, label_map, training: bool,
                 use_labels: bool = True):
    """Examples -> enc.Encoded rows for the model, as the task type wants them (without their labels
    when use_labels is False: prediction inputs may carry labels the model never saw)."""
    if not use_labels and ts.type not in ("qa", "qa-v2"):
        attr = "tags" if ts.type == "token" else "label"
        examples = [replace(e, **{attr: None}) for e in examples]
    label2id = label_map.label2id() if label_map is not None else None
    labelled = training or _has_labels(examples, ts.type)
    if ts.type in ("classification", "pair", "regression"):
        return enc.encode_texts(tokenizer, examples, ts.max_length, label2id if labelled else None,
                                regression=ts.type == "regression")
    if ts.type == "token":
        return enc.encode_tokens(tokenizer, examples, ts.max_length, ts.doc_stride, label2id if labelled else None,
                                 label_all_subtokens=ts.label_all_subtokens)
    if ts.type in ("qa", "qa-v2"):
        return enc.encode_qa(tokenizer, examples, ts.max_length, ts.doc_stride, ts.max_query_length,
                             training=training, v2=ts.type == "qa-v2")
    return enc.encode_choices(tokenizer, examples, ts.max_length)


def _has_labels(examples: list, task_type: str) -> bool:
    if task_type in ("qa", "qa-v2"):
        return True  # answers are read with the examples; encode_qa needs none for prediction
    attr = "tags" if task_type == "token" else "label"
    return all(getattr(e, attr) is not None for e in examples)


# -- the training task for train/loop.py -------------------------------------------------------------

class FinetuneTask:
    """One loss part, "task": summed over its targets (sequences, labelled tokens or examples).

    per_step: the targets of an average optimizer step over the training data. Length-sorted batches
    of tokens hold from a few to many labelled tokens; dividing each step's loss by its own count
    would weigh a token of a short sentence several times more than one of a long sentence. Divided
    by the average, every target weighs the same, as in randomly drawn batches."""

    parts = ("task",)

    def __init__(self, task_type: str, per_step: float | None = None):
        self.type = task_type
        self.per_step = {"task": per_step} if per_step else None

    def counts(self, batch: TaskBatch) -> dict[str, int]:
        if self.type == "token":
            return {"task": int((batch.labels != IGNORE).sum())}
        if self.type == "multiple-choice":
            return {"task": int(batch.num_choices.numel())}
        return {"task": int(batch.cu_seqlens.numel() - 1)}

    def forward(self, model: nn.Module, batch: TaskBatch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        kw = {"labelled_only": True} if self.type == "token" else {}  # logits [M, C] of the labelled tokens
        out = model(**batch.model_inputs(), **targets(batch, self.type), **kw)
        n = self.counts(batch)["task"]
        if self.type in ("qa", "qa-v2"):
            correct = _span_correct(out, batch)
        elif self.type == "regression":
            correct = ((out.logits.squeeze(-1) - batch.labels).abs() < 0.5).sum()  # within half a point
        elif self.type == "token":
            correct = (out.logits.argmax(-1) == batch.labels[batch.labels != IGNORE]).sum()
        else:
            correct = (out.logits.argmax(-1) == batch.labels).sum()
        # a micro-batch of token windows may hold no labelled token: its loss is then nan, count it as 0
        loss_sum = out.loss.float() * n if n else out.logits.sum() * 0.0
        return {"task": (loss_sum, correct)}


def targets_per_step(data: TaskData, task_type: str, units_per_step: int) -> float:
    """The loss targets (FinetuneTask.counts) of an average step of `units_per_step` examples."""
    if task_type == "token":
        total = sum(sum(t != IGNORE for t in labels) for labels in data.encoded.labels)
    elif task_type == "multiple-choice":
        total = len(data)
    else:
        total = len(data.encoded.input_ids)  # sequences (QA: windows)
    return total * min(units_per_step, len(data)) / len(data)


def targets(batch: TaskBatch, task_type: str) -> dict:
    if task_type in ("qa", "qa-v2"):
        return dict(start_positions=batch.start_positions, end_positions=batch.end_positions)
    kw = dict(labels=batch.labels)
    if task_type == "multiple-choice":
        kw["num_choices"] = batch.num_choices
    return kw


def _span_correct(out, batch: TaskBatch) -> torch.Tensor:
    """Sequences whose argmax start and end (over their own tokens) are both the gold ones."""
    from ..packing import pad

    starts = pad(out.start_logits, batch.cu_seqlens, batch.max_seqlen, float("-inf")).argmax(-1)
    ends = pad(out.end_logits, batch.cu_seqlens, batch.max_seqlen, float("-inf")).argmax(-1)
    return ((starts == batch.start_positions) & (ends == batch.end_positions)).sum()


# -- prediction and scoring --------------------------------------------------------------------------

@torch.no_grad()
def predict(model: nn.Module, data: TaskData, examples: list, ts: TaskSettings, id2label: dict[int, str] | None,
            batch_size: int, device: torch.device, progress: bool = False) -> list[dict[str, Any]]:
    """One record per example, in input order: what `torchbert predict` writes."""
    was_training = model.training
    model.eval()
    e = data.encoded
    rows_out: list[Any] = [None] * len(e.input_ids)
    per_example: list[Any] = [None] * len(examples)
    batches = data.all_batches(batch_size)
    if progress:
        from tqdm import tqdm

        batches = tqdm(batches, total=-(-len(data) // batch_size), desc="predict", unit="batch", leave=False)
    for batch in batches:
        b = batch.to(device)
        kw = {"num_choices": b.num_choices} if ts.type == "multiple-choice" else {}
        if ts.type == "token":  # only the token that owns a word is read: the last layer runs for those alone
            owned = torch.tensor([w >= 0 for r in batch.rows for w in e.word_index[r]], device=device)
            kw = {"labels": torch.where(owned, 0, IGNORE), "labelled_only": True}
        out = model(**b.model_inputs(), **kw)
        lengths = batch.cu_seqlens.diff().tolist()
        if ts.type in ("qa", "qa-v2"):
            for r, s, t in zip(batch.rows, out.start_logits.float().cpu().split(lengths),
                               out.end_logits.float().cpu().split(lengths)):
                rows_out[r] = (s.numpy(), t.numpy())
        elif ts.type == "token":
            tags = torch.full(owned.shape, -1, dtype=torch.long)  # -1 where no word is read
            tags[owned.cpu()] = out.logits.argmax(-1).cpu()
            for r, x in zip(batch.rows, tags.split(lengths)):
                rows_out[r] = x.tolist()
        elif ts.type == "multiple-choice":
            probs = out.logits.float().softmax(-1).cpu()
            starts = data.unit_start
            for k, first in enumerate(batch.rows[np.r_[0, np.cumsum(batch.num_choices.numpy())[:-1]]]):
                ex = int(np.searchsorted(starts, first, side="right") - 1)
                per_example[ex] = probs[k, : int(batch.num_choices[k])].tolist()
        else:
            for r, x in zip(batch.rows, out.logits.float().cpu()):
                rows_out[r] = x
    if was_training:
        model.train()
    return _records(examples, e, rows_out, per_example, ts, id2label)


def _records(examples, e, rows_out, per_example, ts: TaskSettings, id2label) -> list[dict[str, Any]]:
    records = []
    if ts.type in ("classification", "pair"):
        for ex, logits in zip(examples, rows_out):  # text tasks: one row per example, in order
            p = logits.softmax(-1)
            k = int(p.argmax())
            records.append({"id": ex.id, "label": id2label[k], "probability": round(float(p[k]), 6),
                            "probabilities": {id2label[i]: round(float(v), 6) for i, v in enumerate(p)}})
    elif ts.type == "regression":
        for ex, logits in zip(examples, rows_out):  # text tasks: one row per example, in order
            records.append({"id": ex.id, "score": round(float(logits[0]), 6)})
    elif ts.type == "token":
        words = enc.words_from_tokens(e, rows_out, len(examples), [len(x.words) for x in examples])
        for ex, ids in zip(examples, words):
            records.append({"id": ex.id, "words": ex.words, "tags": [id2label[i] for i in ids]})
    elif ts.type in ("qa", "qa-v2"):
        starts = [r[0] for r in rows_out]
        ends = [r[1] for r in rows_out]
        answers = enc.postprocess_qa(examples, e, starts, ends, n_best=ts.n_best,
                                     max_answer_length=ts.max_answer_length, v2=ts.type == "qa-v2",
                                     null_threshold=ts.null_threshold)
        for ex in examples:
            a = answers[ex.id]
            rec = {"id": ex.id, "answer": a["text"], "score": round(float(a["score"]), 6), "start": a["start"]}
            if ts.type == "qa-v2":  # the best span even when "" wins, to choose --null-threshold on dev
                rec.update(null_score=round(float(a["null_score"]), 6), span=a["span"],
                           span_score=round(float(a["span_score"]), 6) if a["span"] else None)
            records.append(rec)
    else:
        for ex, probs in zip(examples, per_example):
            k = int(np.argmax(probs))
            records.append({"id": ex.id, "choice": k, "text": ex.choices[k], "probability": round(probs[k], 6),
                            "probabilities": [round(p, 6) for p in probs]})
    return records


def score(records: list[dict[str, Any]], examples: list, ts: TaskSettings, label_map) -> dict[str, float]:
    """The task's metrics of `records` (from predict) against the examples' gold labels."""
    if ts.type in ("classification", "pair"):
        l2i = label_map.label2id()
        return metrics.classification_scores([l2i[r["label"]] for r in records],
                                             [l2i[str(x.label)] for x in examples], len(l2i))
    if ts.type == "regression":
        return metrics.regression_scores([r["score"] for r in records], [float(x.label) for x in examples])
    if ts.type == "token":
        true, pred = [list(x.tags) for x in examples], [r["tags"] for r in records]
        if metrics.token_scoring(label_map.labels) == "tags":
            return metrics.tag_scores(true, pred)
        return metrics.entity_scores(true, pred)
    if ts.type in ("qa", "qa-v2"):
        gold = {x.id: [a.text for a in x.answers] for x in examples}
        scores = metrics.squad_scores(gold, {r["id"]: r["answer"] for r in records})
        if ts.type == "qa-v2":
            with_span = [r for r in records if r.get("span")]
            spans = {r["id"]: r["span"] for r in with_span}
            margins = {r["id"]: r["null_score"] - r["span_score"] for r in with_span}
            scores.update(metrics.squad_best_thresholds(gold, spans, margins))
        return scores
    return {"accuracy": metrics.accuracy([r["choice"] for r in records], [x.label for x in examples])}


# -- building the model ------------------------------------------------------------------------------

def task_config(model_dir: Path, ts: TaskSettings, label_map) -> BertConfig:
    config = BertConfig.load(model_dir)
    old = config.extra
    if label_map is not None:
        saved = old.get("id2label")
        cls = MODEL_CLASSES[ts.type].__name__
        if saved and old.get("architectures", [None])[0] == cls and "torchbert_task" in old:
            have = [saved[str(i)] if str(i) in saved else saved[i] for i in range(len(saved))]
            if have != label_map.labels:
                raise ValueError(f"--model {model_dir}: it was fine-tuned for the labels {have}, but the training "
                                 f"data has {label_map.labels}; start from the pretrained model instead")
        config = with_labels(config, label_map.labels)
    elif ts.type == "regression":
        config.extra.update(id2label={"0": "score"}, label2id={"score": 0}, problem_type="regression")
    config.extra["torchbert_task"] = asdict(ts)
    return config


def load_task_model(model_dir: Path, config: BertConfig, ts: TaskSettings, log=print) -> nn.Module:
    cls = MODEL_CLASSES[ts.type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reported below in one line
        model = cls.from_pretrained(model_dir, config=config)
    fresh = [k for k in model.load_report["missing"] if not k.startswith("bert.")]
    if fresh:
        log(f"{cls.__name__}: a new head ({', '.join(sorted({k.split('.')[0] for k in fresh}))}) on the encoder "
            f"of {model_dir}")
    return model


# -- the command -------------------------------------------------------------------------------------

def run_finetuning(s: FinetuneSettings, cfg: TrainConfig, device: torch.device, log=print,
                   dist: Dist | None = None) -> dict[str, Any]:
    dist = dist or Dist()
    task_type, preset = tasks.resolve_task(s.task)
    ts = TaskSettings(type=task_type, preset=preset.name if preset else None,
                      layout=preset.layout if preset else "auto", **s.encoding)
    if s.frozen is not None and task_type != "token":
        raise ValueError(f"--frozen trains a tagger on a frozen BERT's token features: it needs a token task, "
                         f"but --task {s.task} is {task_type}")
    folder = RunFolder(s.out, s.resume, s.overwrite, {"--model": s.model, "--train": s.train, "--dev": s.dev}, log=log)
    tokenizer = BertTokenizer.from_pretrained(s.model)
    train_examples = tasks.read_examples(s.train, task_type, ts.layout)
    dev_examples = tasks.read_examples(s.dev, task_type, ts.layout) if s.dev is not None else None
    label_map = None
    if task_type in LABELLED_TYPES:
        label_map = tasks.LabelMap.from_examples(train_examples)
        if dev_examples is not None:
            label_map.check(dev_examples)
    config = task_config(s.model, ts, label_map)
    if s.resume:
        check_resumed_task(s.out, config)
    if ts.max_length > config.max_position_embeddings:
        raise ValueError(f"--max-length {ts.max_length} is longer than the model's max_position_embeddings "
                         f"{config.max_position_embeddings}")
    if s.frozen is not None:
        config.extra["torchbert_task"]["tagger"] = asdict(s.frozen)
        try:
            s.frozen.feature_size(config)
        except ValueError as e:
            raise ValueError(f"--features {s.frozen.strategy}: {e}") from None

    started = time.perf_counter()
    train_data = TaskData(encode_split(tokenizer, train_examples, ts, label_map, training=True), task_type,
                          seed=cfg.seed, rank=dist.rank, world_size=dist.world_size)
    dev_data = None
    if dev_examples is not None:
        dev_data = TaskData(encode_split(tokenizer, dev_examples, ts, label_map, training=False), task_type)
    log(f"{s.train}: {len(train_examples):,} examples -> {len(train_data.encoded.input_ids):,} sequences"
        + (f"; {s.dev}: {len(dev_examples):,} examples" if dev_examples is not None else "")
        + f" (tokenized in {time.perf_counter() - started:.1f}s)")

    per_epoch = math.ceil(train_data.batches_per_epoch(cfg.batch_size) / cfg.grad_accum)
    if per_epoch < 1:
        raise ValueError(f"--train {s.train}: {len(train_data)} examples are fewer than one global batch of "
                         f"{cfg.batch_size * dist.world_size}")
    cfg.steps = max(1, round(s.epochs * per_epoch))
    cfg.warmup_steps = round(s.warmup_ratio * cfg.steps)
    cfg.eval_every = per_epoch
    cfg.log_every = min(cfg.log_every, per_epoch)

    torch.manual_seed(cfg.seed)
    if s.frozen is not None:
        model = FeatureTagger.from_encoder(s.model, config).to(device)
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log(f"FeatureTagger: a new {s.frozen.kind} tagger ({trained:,} parameters) on {s.frozen.strategy} features "
            f"of the frozen encoder of {s.model}")
    else:
        model = load_task_model(s.model, config, ts, log).to(device)
    from .distributed import wrap

    model = wrap(model, dist, device)
    with folder.opened(dist):
        if dist.is_main and not s.resume:
            config.save(s.out / "config.json")  # what --resume checks the task and labels against
        scoring = metrics.token_scoring(label_map.labels) if task_type == "token" else None
        metric = metrics.metric_names(task_type)[0] if preset is None else preset.metric
        best = _Best(s.out, metrics.TAG_METRICS[0] if scoring == "tags" else metric, dist)
        evaluations = {"step": 0}
        if s.resume:
            ckpt = latest_checkpoint(s.out)
            evaluations["step"] = int(ckpt.name.removeprefix(PREFIX)) if ckpt is not None else 0
            best.resumed_at(evaluations["step"])

        def evaluate(m: nn.Module) -> dict[str, float]:
            # the loop evaluates after every epoch's last step and after the last step
            step = min(cfg.steps, (evaluations["step"] // per_epoch + 1) * per_epoch)
            evaluations["step"] = step
            records = predict(m, dev_data, dev_examples, ts, _id2label(config), s.eval_batch_size, device)
            scores = score(records, dev_examples, ts, label_map)
            epoch = step // per_epoch if step % per_epoch == 0 else round(step / per_epoch, 2)
            best.offer(unwrap(m), scores, records, step=step, epoch=epoch)
            return scores

        task = FinetuneTask(task_type, per_step=targets_per_step(train_data, task_type, cfg.batch_size * dist.world_size
                                                                 * cfg.grad_accum))
        summary = train(model, train_data, task, cfg, s.out, resume=s.resume,
                        evaluate=evaluate if dev_data is not None else None, device=device, log=log, dist=dist,
                        on_checkpoint=folder.commit)
        if not dist.is_main:
            return summary
        final_dir = best.folder if best.exists() else None
        if final_dir is not None:
            for name in ("config.json", "model.safetensors", "dev_predictions.jsonl") + (
                    (TAGGER_FILE,) if s.frozen is not None else ()):
                atomic_copy(final_dir / name, s.out / name)
        else:  # no dev set: the last weights
            unwrap(model).save_pretrained(s.out)
        tokenizer.save_pretrained(s.out)
        result = {"task": s.task, "type": task_type, **({"scoring": scoring} if scoring else {}),
                  **(best.metrics() or {}),
                  "best_epoch": best.epoch(), "epochs": s.epochs, "steps": summary["steps"],
                  "train_seconds": summary["train_seconds"], "eval_seconds": summary["eval_seconds"],
                  "tokens": summary["tokens"],
                  "tokens_per_second": summary["tokens_per_second"], "train_examples": len(train_examples),
                  "dev_examples": len(dev_examples) if dev_examples is not None else 0, "history": best.history(),
                  "config": summary["config"]}
        if s.frozen is not None:
            result["tagger"] = asdict(s.frozen)
        atomic_write_text(s.out / "metrics.json", json.dumps(result, indent=2) + "\n")
        plot_finetuning(s.out, best.name)
        return result


def check_resumed_task(out: Path, config: BertConfig) -> None:
    """--resume continues the same task with the same labels; anything else is an error here,
    not a page of state-dict mismatches later."""
    path = out / "config.json"
    if not path.is_file():
        return  # a run started by an older torchbert: the checkpoint's shapes are checked on load
    saved = BertConfig.load(path).extra
    old, new = saved.get("torchbert_task", {}), config.extra["torchbert_task"]
    if old.get("type") != new["type"]:
        raise UserError(f"--resume: the run in {out} fine-tunes a {old.get('type')} task, not {new['type']}; "
                        "resume with the --task it started with")
    labels = [saved.get("id2label", {}).get(str(i)) for i in range(len(saved.get("id2label", {})))]
    have = [config.extra.get("id2label", {}).get(str(i)) for i in range(len(config.extra.get("id2label", {})))]
    if labels != have:
        raise UserError(f"--resume: the run in {out} was started with the labels {labels}, but --train has {have}; "
                        "resume with the training file it started with, or start again with --overwrite")


def load_finetuned(model_dir: Path, task: str | None, device: torch.device):
    """A model fine-tuned by torchbert: (model, tokenizer, TaskSettings, LabelMap or None)."""
    config = BertConfig.load(model_dir)
    if task is not None and "torchbert_task" not in config.extra:
        task_type, preset = tasks.resolve_task(task)
        ts = TaskSettings(type=task_type, preset=preset.name if preset else None,
                          layout=preset.layout if preset else "auto")
    else:
        ts = TaskSettings.from_config(config, str(model_dir))
        if task is not None:
            task_type, preset = tasks.resolve_task(task)
            if task_type != ts.type:
                raise ValueError(f"--task {task} is a {task_type} task, but {model_dir} was fine-tuned for {ts.type}")
            if preset is not None:
                ts.layout = preset.layout
    label_map = None
    if ts.type in LABELLED_TYPES:
        if not config.extra.get("id2label"):
            raise ValueError(f"{model_dir}: config.json has no id2label; the {ts.type} head's labels are unknown")
        label_map = tasks.LabelMap.from_config(config.extra["id2label"])
    if "tagger" in config.extra.get("torchbert_task", {}):  # trained with --frozen
        model = FeatureTagger.from_pretrained(model_dir).to(device).eval()
    else:
        model = MODEL_CLASSES[ts.type].from_pretrained(model_dir).to(device).eval()
        if any(not k.startswith("bert.") for k in model.load_report["missing"]):
            raise ValueError(f"{model_dir}: the checkpoint has no trained {ts.type} head; fine-tune it first")
    return model, BertTokenizer.from_pretrained(model_dir), ts, label_map


def run_evaluate(model_dir: Path, data: Path, task: str | None, device: torch.device, batch_size: int = 64,
                 progress: bool = True) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The metrics of a fine-tuned model on a labelled file, and its predictions."""
    model, tokenizer, ts, label_map = load_finetuned(model_dir, task, device)
    examples = tasks.read_examples(data, ts.type, ts.layout)
    if label_map is not None:
        label_map.check(examples)
    encoded = encode_split(tokenizer, examples, ts, label_map, training=False)
    records = predict(model, TaskData(encoded, ts.type), examples, ts, _id2label(model.config), batch_size, device,
                      progress)
    return score(records, examples, ts, label_map), records


def run_predict(model_dir: Path, data: Path, device: torch.device, batch_size: int = 64,
                progress: bool = True) -> list[dict[str, Any]]:
    """Predictions for an unlabelled (or labelled) file, one record per example in input order."""
    model, tokenizer, ts, label_map = load_finetuned(model_dir, None, device)
    examples = tasks.read_examples(data, ts.type, ts.layout, labelled=False)
    encoded = encode_split(tokenizer, examples, ts, None, training=False, use_labels=False)
    return predict(model, TaskData(encoded, ts.type), examples, ts, _id2label(model.config), batch_size, device,
                   progress)


def _id2label(config: BertConfig) -> dict[int, str] | None:
    saved = config.extra.get("id2label")
    return {int(k): v for k, v in saved.items()} if saved else None


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
