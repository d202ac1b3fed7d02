"""`torchbert evaluate / predict`: a fine-tuned model on a task file -> one record per example, and scores.

`predict` runs a task model over a TaskData's batches (longest first, packed) and lets the task's
family (families.py) read the head's outputs back into records; fine-tuning calls it on the dev set
after every epoch. `load_finetuned` opens a run folder written by `torchbert finetune` with the task
settings stored in its config.json, so that a file is read and tokenized as in training;
`finetuned_task` reads those settings alone, so that evaluate and predict read the file, and name
its faults, before the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..architectures import encoder_tensor, load_config
from ..config import BertConfig, check_ids
from .. import fast
from ..fast import threads
from ..io.hf import folder_max_length
from ..io.record import read_record
from ..settings import Checked, setting
from ..tokenizer import BertTokenizer
from .batches import TaskData
from .examples import LabelMap
from .families import TaskSettings, family, resolve_task, task_settings
from .feature_tagger import TAGGER_FILE, FeatureTagger


# what evaluate and predict read and write, beside the model and the shared flags (commands/common.py)
@dataclass(kw_only=True)
class EvaluateSettings(Checked):
    data: str = setting(help="labelled file in the task's layout")
    task: str | None = setting(None, "task type or preset (default: the one the model was fine-tuned for)")
    out: str | None = setting(None, "also write the metrics to this JSON file")
    first_stage: str | None = setting(None, "a reranker scored as a search: this embedding model (a folder, or "
                                            "minilm) finds each query's --top-k candidates among every passage of "
                                            "--data, the reranker reorders them; nDCG@10, MRR@10 and recall over "
                                            "the whole collection, before and after", metavar="MODEL")
    top_k: int = setting(20, "first-stage candidates the reranker reorders per query (with --first-stage)", low=1,
                         high=10_000)


@dataclass(kw_only=True)
class PredictSettings(Checked):
    input: str = setting(help="file in the task's layout (labels optional); for one text -> a label or a "
                              "score, also a .txt of one text a line")
    out: str = setting(help="output .jsonl; - writes the lines to standard output")


@torch.no_grad()
def predict(model: nn.Module, data: TaskData, examples: list, ts: TaskSettings, id2label: dict[int, str] | None,
            batch_size: int, device: torch.device, progress: bool = False) -> list[dict[str, Any]]:
    """One record per example, in input order: what `torchbert predict` writes."""
    fam = data.family
    was_training = model.training
    model.eval()
    outputs: list[Any] = [None] * len(data)  # per unit
    batches = data.all_batches(batch_size)
    if progress:
        from tqdm import tqdm

        batches = tqdm(batches, total=-(-len(data) // batch_size), desc="predict", unit="batch", leave=False)
    with threads.busy():  # this job computes: the other torchbert jobs count it (fast/threads.py)
        for batch in batches:
            threads.tick()  # this job's share of the CPUs, when a command governs them
            check_ids(model.config, batch.input_ids, batch.token_type_ids, batch.max_seqlen)
            extra = fam.predict_inputs(batch, data.encoded)
            out = model(**batch.to(device).model_inputs(),
                        **{k: v.to(device) if isinstance(v, Tensor) else v for k, v in extra.items()})
            check_finite(out, batch, data, examples)
            for unit, value in fam.outputs(out, batch, extra):
                outputs[unit] = value
    if was_training:
        model.train()
    return fam.records(examples, data.encoded, outputs, ts, id2label)


def check_finite(out, batch, data: TaskData, examples: list) -> None:
    """NonFiniteOutput when any of the model's outputs holds NaN or inf, naming the batch's first example:
    no record, score or answer is made from them (finite weights can still overflow)."""
    import dataclasses

    values = ([getattr(out, f.name) for f in dataclasses.fields(out) if f.name != "loss"]  # no labels: loss NaN
              if dataclasses.is_dataclass(out) else [out])
    if all(bool(torch.isfinite(v).all()) for v in values if isinstance(v, Tensor) and v.is_floating_point()):
        return
    from ..errors import NonFiniteOutput
    from .encode import where_of

    first = int(data.encoded.example_index[int(batch.rows[0])])
    others = len({data.encoded.example_index[int(r)] for r in batch.rows}) - 1
    raise NonFiniteOutput(f"{where_of(examples[first], first)}: the model's outputs hold NaN or inf for this example"
                          + (f" or one of the {others} others of its batch" if others else "")
                          + "; nothing was written (the weights are finite: something overflows)")


def id2label(config: BertConfig) -> dict[int, str] | None:
    saved = config.extra.get("id2label")
    return {int(k): v for k, v in saved.items()} if saved else None


def load_finetuned(model_dir: Path, task: str | None, device: torch.device, precision: str = "fp32"):
    """A model fine-tuned by torchbert: (model, tokenizer, TaskSettings, LabelMap or None), in
    `precision`: fp32; bf16, its encoder's weights in bfloat16 (fast/bf16.py); or int8, its encoder
    run by onnxruntime with 8-bit weights (CPU only, fast/int8.py)."""
    if precision not in ("fp32", "bf16", "int8"):
        raise ValueError(f"precision must be fp32, bf16 or int8, got {precision!r}")
    if precision == "int8" and device.type != "cpu":
        raise ValueError(f"--int8 runs on the CPU; got --device {device}")
    config, ts, label_map = finetuned_task(model_dir, task)
    fam = family(ts.type)
    if (Path(model_dir) / TAGGER_FILE).is_file():  # trained with --frozen
        model = FeatureTagger.from_pretrained(model_dir).to(device).eval()
    else:
        model = fam.model_for(config).from_pretrained(model_dir, **fam.head_arguments(ts)).to(device).eval()
        if any(not encoder_tensor(k) for k in model.load_report["missing"]):
            raise ValueError(f"{model_dir}: the checkpoint has no trained {ts.type} head; fine-tune it first")
    model = fast.at_precision(model, precision)
    return model, BertTokenizer.from_pretrained(model_dir), ts, label_map


def finetuned_task(model_dir: Path, task: str | None):
    """What a fine-tuned folder was trained for, read without its weights: (config, TaskSettings,
    LabelMap or None); `task` (a type or a preset) must agree with it, or names it for a folder
    that has no run record."""
    config = load_config(model_dir)
    record = read_record(model_dir)
    if task is not None and (record is None or not record.fine_tuned):
        ts = task_settings(task)
        own = folder_max_length(model_dir)  # a sentence-transformers folder's max_seq_length, as it embeds
        if own is not None:
            ts.max_length = min(own, config.max_position_embeddings)
    else:
        ts = TaskSettings.of(model_dir)
        if task is not None:
            task_type, preset = resolve_task(task)
            if task_type != ts.type:
                raise ValueError(f"--task {task} is a {task_type} task, but {model_dir} was fine-tuned for {ts.type}")
            if preset is not None:
                ts.layout = preset.layout
    fam = family(ts.type)
    label_map = None
    if fam.label_set:
        if not config.extra.get("id2label"):
            raise ValueError(f"{model_dir}: config.json has no id2label; the {ts.type} head's labels are unknown")
        label_map = LabelMap.from_config(config.extra["id2label"])
    return config, ts, label_map


def run_evaluate(model_dir: Path, data: Path, task: str | None, device: torch.device, batch_size: int = 64,
                 progress: bool = True, precision: str = "fp32") -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The metrics of a fine-tuned model on a labelled file, and its predictions (precision: fp32, bf16
    or int8, as load_finetuned)."""
    _, ts, label_map = finetuned_task(model_dir, task)  # the file is read, and found wanting, before the weights
    fam = family(ts.type)
    examples = fam.read(data, ts.layout)
    if label_map is not None:
        label_map.check(examples)
    model, tokenizer, ts, label_map = load_finetuned(model_dir, task, device, precision)
    encoded = fam.encode(tokenizer, examples, ts, label_map, training=False)
    records = predict(model, TaskData(encoded, fam), examples, ts, id2label(model.config), batch_size, device,
                      progress)
    scores = fam.score(records, examples, label_map)
    if "macro_f1" in scores and label_map is not None:  # binary: f1 is one label's (GLUE's), named here
        scores["f1_positive_label"] = next(label for label, i in label_map.label2id().items() if i == 1)
    return scores, records


def run_predict(model_dir: Path, data: Path, device: torch.device, batch_size: int = 64,
                progress: bool = True, precision: str = "fp32") -> list[dict[str, Any]]:
    """Predictions for an unlabelled (or labelled) file, one record per example in input order."""
    _, ts, _ = finetuned_task(model_dir, None)  # the file is read, and found wanting, before the weights
    fam = family(ts.type)
    examples = fam.read(data, ts.layout, labelled=False)
    model, tokenizer, ts, _ = load_finetuned(model_dir, None, device, precision)
    encoded = fam.encode(tokenizer, examples, ts, None, training=False, use_labels=False)
    return predict(model, TaskData(encoded, fam), examples, ts, id2label(model.config), batch_size, device, progress)
