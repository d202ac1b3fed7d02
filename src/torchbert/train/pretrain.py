"""`torchbert pretrain`: prepared data -> a pretrained BERT in a Hugging Face folder.

The run folder ends up holding config.json, model.safetensors and the tokenizer files (so
`transformers.BertForPreTraining.from_pretrained(run)` loads it), metrics.jsonl (one line per log
step), metrics.json (the summary and the final held-out figures), loss.png and accuracy.png, and
checkpoints/ with the newest training states for --resume.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import PRESETS, BertConfig
from ..data.shards import PretrainingData
from ..errors import UserError
from ..eval.plots import plot_pretraining
from ..heads import BertForPreTraining
from ..io.checkpoint import list_checkpoints, no_checkpoint
from ..io.files import atomic_copy, atomic_write_text
from .distributed import Dist, full_state_dict, wrap
from .loop import PretrainingTask, TrainConfig, train
from .rundir import RunFolder

TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json")


@dataclass
class PretrainSettings:
    data: Path
    out: Path
    config: str | None = None  # a preset name or a config.json path (None: small, or the resumed run's)
    init: Path | None = None  # start from this checkpoint (two-phase training)
    eval_data: Path | None = None
    eval_batches: int = 20
    compile: bool = False
    resume: bool = False
    overwrite: bool = False


def model_config(name_or_path: str, vocab_size: int, max_seq_len: int) -> BertConfig:
    if name_or_path in PRESETS:
        config = BertConfig.from_name(name_or_path, vocab_size=vocab_size)
    else:
        config = BertConfig.load(name_or_path)
    if config.vocab_size != vocab_size:
        raise ValueError(f"--config {name_or_path}: vocab_size {config.vocab_size} "
                         f"does not match the data's {vocab_size}")
    if config.max_position_embeddings < max_seq_len:
        raise ValueError(f"--config {name_or_path}: max_position_embeddings {config.max_position_embeddings} "
                         f"is shorter than the data's max_seq_len {max_seq_len}")
    return config


def evaluator(eval_data: PretrainingData, batch_size: int, max_batches: int, device: torch.device):
    """Held-out MLM loss and accuracy and NSP accuracy over a fixed set of batches."""
    task = PretrainingTask()

    batch_size = max(1, min(batch_size, len(eval_data)))  # a small held-out set still gives a batch

    def evaluate(model) -> dict[str, float]:
        sums = {"mlm": [0.0, 0, 0], "nsp": [0.0, 0, 0]}
        for i, batch in enumerate(eval_data.batches(batch_size, epoch=0)):
            if i == max_batches:
                break
            batch = batch.to(device)
            parts, counts = task.forward(model, batch), task.counts(batch)
            for p in sums:
                sums[p][0] += float(parts[p][0])
                sums[p][1] += int(parts[p][1])
                sums[p][2] += counts[p]
        if not sums["nsp"][2]:
            raise ValueError(f"{eval_data.folder}: fewer instances than one batch of {batch_size}")
        return {"mlm_loss": sums["mlm"][0] / sums["mlm"][2], "mlm_accuracy": sums["mlm"][1] / sums["mlm"][2],
                "nsp_loss": sums["nsp"][0] / sums["nsp"][2], "nsp_accuracy": sums["nsp"][1] / sums["nsp"][2]}

    return evaluate


def run_pretraining(s: PretrainSettings, cfg: TrainConfig, device: torch.device, log=print,
                    dist: Dist | None = None) -> dict:
    """Everything is read and checked before the run folder is touched (rundir.RunFolder); a
    resumed run takes its model config from the run folder."""
    dist = dist or Dist()
    config_path = s.config if s.config is not None and s.config not in PRESETS else None
    folder = RunFolder(s.out, s.resume, s.overwrite, {"--data": s.data, "--init": s.init, "--eval-data": s.eval_data,
                                                      "--config": config_path}, log=log)
    data = PretrainingData(s.data, seed=cfg.seed, rank=dist.rank, world_size=dist.world_size)
    if s.resume:
        config = resumed_config(s, data)
        model = BertForPreTraining(config)  # the checkpoint brings the weights
    elif s.init is not None:
        data.check_vocab(s.init)
        model = BertForPreTraining.from_pretrained(s.init)
        if model.config.max_position_embeddings < data.max_seq_len:
            raise ValueError(f"--init {s.init}: max_position_embeddings {model.config.max_position_embeddings} "
                             f"is shorter than the data's max_seq_len {data.max_seq_len}")
    else:
        torch.manual_seed(cfg.seed)
        model = BertForPreTraining(model_config(s.config or "small", data.vocab_size, data.max_seq_len))
    config = model.config
    evaluate = None
    if s.eval_data is None and (s.data / "heldout" / "manifest.json").is_file():
        s.eval_data = s.data / "heldout"  # prepare --heldout-docs put it there
    if s.eval_data is not None:
        eval_data = PretrainingData(s.eval_data, seed=cfg.seed, shuffle=False)
        data.check_vocab(s.eval_data)
        evaluate = evaluator(eval_data, cfg.batch_size, s.eval_batches, device)
    if s.compile:  # in place, so parameter names (and checkpoints) stay those of the plain model
        model.compile(dynamic=True)
        # sizes read from the batch (tokens per sequence, masked tokens) end the traced graphs by
        # design; the compiler's advice on each such .item() is not for our users
        logging.getLogger("torch._dynamo.variables.tensor").setLevel(logging.ERROR)
    model = wrap(model.to(device), dist, device)

    with folder.opened(dist):
        if dist.is_main and not s.resume:
            config.save(s.out / "config.json")  # what --resume builds the model from
        summary = train(model, data, PretrainingTask(), cfg, s.out, resume=s.resume, evaluate=evaluate,
                        device=device, log=log, dist=dist, on_checkpoint=folder.commit)
        state = full_state_dict(model, dist)  # every process takes part under FSDP
        if not dist.is_main:
            return summary
        final = BertForPreTraining(config)
        final.load_state_dict(state)
        final.save_pretrained(s.out)
        for name in TOKENIZER_FILES:
            if (s.data / name).is_file():
                atomic_copy(s.data / name, s.out / name)
        summary["data"] = str(s.data)
        atomic_write_text(s.out / "metrics.json", json.dumps(summary, indent=2) + "\n")
        plot_pretraining(s.out)
    return summary


def architecture(config: BertConfig) -> dict:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "extra"}


def resumed_config(s: PretrainSettings, data: PretrainingData) -> BertConfig:
    """The config the run in s.out started with; a --config that says otherwise is an error."""
    if not list_checkpoints(s.out):
        raise no_checkpoint(s.out)
    saved = s.out / "config.json"
    if not saved.is_file():
        raise UserError(f"--resume: {saved} is missing; the run was started by an older torchbert: pass the "
                        "--config it started with and copy its config.json there, or start again with --overwrite")
    config = BertConfig.load(saved)
    if s.config is not None:
        given = model_config(s.config, data.vocab_size, data.max_seq_len)
        if architecture(given) != architecture(config):
            raise UserError(f"--config {s.config} differs from the config the run in {s.out} started with; "
                            "leave --config out to resume it")
    if config.vocab_size != data.vocab_size:
        raise UserError(f"--data {s.data}: vocab size {data.vocab_size} differs from the run's {config.vocab_size}; "
                        "resume with the data the run started with")
    return config
