"""`torchbert pretrain`: prepared data -> a pretrained BERT (or GPT, or ELMo) in a checkpoint folder.

BERT learns MLM + NSP from the prepared instances; GPT (`--model gpt`, the BERT paper's left-to-right
baseline) reads the same instances unmasked, as text, and learns to predict each next token; ELMo
(`--model elmo`, its feature-based baseline) reads them the same way with a forward and a backward
LSTM language model.

The run folder ends up holding config.json, model.safetensors and the tokenizer files (so
`transformers.BertForPreTraining.from_pretrained(run)` loads it), metrics.jsonl (one line per log
step), metrics.json (the summary and the final held-out figures), loss.png and accuracy.png, and
checkpoints/ with the newest training states for --resume.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..architectures import architecture_of, load_config
from ..config import POSITIONS, PRESETS, BertConfig, ELMoConfig, GPTConfig, check_memory
from ..data.blend import BlendedData, open_data, parse_data
from ..data.shards import PretrainingData
from ..errors import UserError
from ..eval.plots import plot_pretraining
from ..eval.yardsticks import yardsticks
from ..io.checkpoint import list_checkpoints, no_checkpoint
from ..io.files import atomic_copy, atomic_write_text
from ..io.hf import resolve_model
from ..io.record import RunRecord, read_record, with_training, write_record
from ..settings import Checked, setting
from ..tokenizer import TOKENIZER_FILES
from .distributed import Dist, full_state_dict, wrap
from .loop import TrainConfig, train
from .objectives import PRETRAINING, PretrainingObjective, PretrainingTask, families, objectives, pretraining_objective
from .recipes import CONTINUE, RECIPES

TAPT_LENGTH = 128  # --tapt's tokens per instance (the --init model's positions where it has fewer)
from .rundir import RunFolder, fixed
from .rundir import resumed_config as resumed_settings


@dataclass
class PretrainSettings(Checked):
    """What `pretrain` trains, declared once: its flags are made from these fields (and TrainConfig's)."""

    out: Path = setting(help="run folder (a Hugging Face checkpoint at the end)")
    data: list[str] | None = setting(None, "folder written by torchbert prepare; several, each as FOLDER:WEIGHT, "
                                           "are read as one blend drawn at those weights (e.g. --data news:0.7 "
                                           "wiki:0.3; without weights, each folder by its number of instances)",
                                     metavar="FOLDER[:WEIGHT]")
    tapt: Path | None = setting(None, "task-adaptive pretraining: a fine-tuning file (.tsv, .csv, .jsonl, SQuAD "
                                      ".json, .conll) whose texts, labels left out, are the corpus, prepared with "
                                      "the --init checkpoint's tokenizer (a tenth held out; once per file, in "
                                      "torchbert's cache folder), in place of --data", metavar="FILE")
    config: str | None = setting(None, "preset name or config.json (default: small, L4 H512 A8; with --resume: "
                                       "the run's own)")
    model: str | None = setting(None, "bert: MLM + NSP (default); gpt: the left-to-right Transformer, next-token "
                                      "prediction; elmo: forward and backward LSTM language models; a preset --config "
                                      "sizes GPT as BERT and ELMo with as many non-embedding parameters (with "
                                      "--resume: the run's own)", choices=families)
    objective: str | None = setting(None, "BERT's objective (train/objectives.py PRETRAINING; default: the paper's "
                                          "MLM + NSP; with --resume: the run's own)", choices=objectives)
    dropout: float | None = setting(None, "every dropout probability of a fresh model (default: the config's, 0.1 "
                                          "in the presets; Cramming pretrains with 0)", low=0, below=1)
    recipe: str | None = setting(None, "a named recipe (train/recipes.py); for a fresh BERT: rotary, the paper's "
                                       "with RoFormer's rotary positions, recommended: it learned the most per second "
                                       "of the recipes measured here (bench/README.md, 'What pretraining learns'); "
                                       "paper, Devlin et al.'s as it is (what no --recipe gives); for an --init "
                                       "checkpoint: continue, the masked LM alone at a rate and warmup for "
                                       "continuing one (bench/README.md, 'Continuing a checkpoint'; a flag given "
                                       "beside it wins)",
                                 choices=(*RECIPES, "continue"))
    positions: str | None = setting(None, "a fresh BERT's positions: absolute, a learned table added to the "
                                          "embeddings (the paper's; default), or rotary, each head's queries and keys "
                                          "turned by their position (RoFormer: attention to neighbours from the "
                                          "first step; written as a RoFormer checkpoint, which transformers loads; "
                                          "its pooler then applies the model's activation, GELU, in place of tanh, "
                                          "as RoFormer's does); "
                                          "with --resume: the run's own", choices=POSITIONS)
    init: Path | None = setting(None, "start from this checkpoint folder (e.g. phase 2 at length 512), or a model by "
                                      "name as --model takes it (minilm, a hub id)")
    eval_data: Path | None = setting(None, "held-out data folder (default: DATA/heldout when prepare made one)")
    eval_batches: int = setting(20, "held-out batches (of --batch-size) per evaluation, the first of the held-out "
                                    "data (default: 20); the count yardsticks are scored on the same masks", low=1)
    compile: bool = setting(False, "torch.compile the model, for GPUs: a BERT-base step on an H100 in bf16 "
                                   "measured 1.25x (seq 128) to 1.38x (seq 512) faster, after about 40 s of "
                                   "compiling; on CPU the plain model measured faster (4-20% per step; "
                                   "bench/README.md)")
    fsdp: bool = setting(False, "shard the model with FSDP2 (under torchrun) instead of replicating it with DDP")
    resume: bool = setting(False, "continue the run in out from its newest checkpoint", cli=False)
    overwrite: bool = setting(False, "delete an existing out and start again", cli=False)
    # the objective's own settings (its spec's `settings` class, e.g. ElectraSettings; None: its defaults,
    # or a resumed run's); their flags are made from that class
    objective_settings: Any = None
    given: tuple[str, ...] | None = None  # the flags the command line gave (None: every setting was given)
    command_line: str | None = None  # the command that runs it, for the run record

    def __post_init__(self) -> None:
        if isinstance(self.data, (str, Path)):  # one folder, from Python
            self.data = [str(self.data)]
        self.data = [str(d) for d in self.data or ()]
        super().__post_init__()


def model_config(name_or_path: str, vocab_size: int, max_seq_len: int, model: str = "bert"):
    """A preset or a config.json. A BERT config gives GPT and ELMo their size: GPT the same shape,
    ELMo as many non-embedding parameters (config.py: GPTConfig.like, ELMoConfig.like)."""
    if name_or_path in PRESETS:
        config = BertConfig.from_name(name_or_path, vocab_size=vocab_size)
    else:
        config = load_config(name_or_path)
    if model != "bert" and architecture_of(config).name == "bert":
        config = pretraining_objective(model).config_class.like(config)
    elif architecture_of(config).name != model:
        raise ValueError(f"--config {name_or_path}: a {architecture_of(config).name} config; pretrain it with "
                         f"--model {architecture_of(config).name}")
    if config.vocab_size != vocab_size:
        raise ValueError(f"--config {name_or_path}: vocab_size {config.vocab_size} "
                         f"does not match the data's {vocab_size}")
    if config.max_position_embeddings < max_seq_len:
        raise ValueError(f"--config {name_or_path}: {config.max_position_embeddings} positions are fewer than the "
                         f"data's max_seq_len {max_seq_len}")
    return config


def heldout_batches(eval_data: PretrainingData | BlendedData, batch_size: int, max_batches: int) -> list:
    """The fixed held-out batches: the first max_batches of epoch 0, in the data's order (the
    evaluation and the count yardsticks both read these)."""
    batch_size = max(1, min(batch_size, len(eval_data)))  # a small held-out set still gives a batch
    return list(itertools.islice(eval_data.batches(batch_size, epoch=0), max_batches))


def evaluator(eval_data: PretrainingData | BlendedData, batch_size: int, max_batches: int, device: torch.device,
              task=None):
    """Held-out loss and accuracy of each part of the objective (BERT: MLM and NSP; GPT: the next
    token) over a fixed set of batches."""
    task = task or PretrainingTask()
    batches = heldout_batches(eval_data, batch_size, max_batches)

    def evaluate(model) -> dict[str, float]:
        sums = {p: [0.0, 0, 0] for p in task.parts}
        for batch in batches:
            batch = batch.to(device)
            parts, counts = task.forward(model, batch), task.counts(batch)
            for p in sums:
                sums[p][0] += float(parts[p][0])
                sums[p][1] += int(parts[p][1])
                sums[p][2] += counts[p]
        if not all(n for _, _, n in sums.values()):
            raise ValueError(f"{eval_data.folder}: no held-out targets in {len(batches)} batch(es)")
        unscored = getattr(task, "unscored", ())  # parts with a loss and no accuracy
        return {k: v for p, (loss, correct, n) in sums.items()
                for k, v in ((f"{p}_loss", loss / n), *(() if p in unscored else ((f"{p}_accuracy", correct / n),)))}

    return evaluate


def with_recipe(s: PretrainSettings, cfg: TrainConfig) -> tuple[PretrainSettings, TrainConfig]:
    """The settings a --recipe names, filled in: a fresh model's must agree with those given beside it;
    `continue` fills in what was not given (a flag given beside it wins)."""
    if s.recipe is None:
        return s, cfg
    if s.recipe == "continue":
        if s.init is None:
            raise UserError("--recipe continue continues a checkpoint: give it as --init (a folder, minilm, a hub "
                            "id); a fresh BERT takes --recipe " + " or ".join(RECIPES))
        mine = {k: v for k, v in CONTINUE.items() if k in PretrainSettings.__dataclass_fields__}
        loops = {k: v for k, v in CONTINUE.items() if k not in mine}
        return (dataclasses.replace(s, **{k: v for k, v in mine.items() if _unset(s, k, s)}),
                dataclasses.replace(cfg, **{k: v for k, v in loops.items() if _unset(s, k, cfg)}))
    implied = {"positions": "absolute", **RECIPES[s.recipe]}  # the paper's, which a recipe may change
    if s.init is not None:
        raise UserError(f"--recipe {s.recipe} sets a fresh model's {' and '.join(implied)}; an --init model keeps "
                        "its config's (--recipe continue suits continuing it)")
    for name, value in implied.items():
        given = getattr(s, name)
        if given is not None and given != value:
            raise UserError(f"--{name.replace('_', '-')} {given}: --recipe {s.recipe} is {name} {value}; give one "
                            "of the two")
    return dataclasses.replace(s, **implied), cfg  # on --resume, checked against the run's own (check_resumed)


def with_tapt(s: PretrainSettings, log, progress: bool, dist: Dist) -> PretrainSettings:
    """--tapt's file prepared as the run's --data (tasks/tapt.py): with the --init checkpoint's tokenizer,
    sentence pairs for an objective that learns from them, packed sentences for the others."""
    from ..tasks.tapt import tapt_data

    if s.data:
        raise UserError("--tapt FILE prepares its own corpus; give it or --data, not both")
    if s.init is None:
        raise UserError("--tapt continues a checkpoint on a task's text: give the checkpoint as --init (a folder, "
                        "minilm, a hub id)")
    spec = chosen_objective(s, resumed_config(s) if s.resume else None)
    max_seq_len = min(TAPT_LENGTH, load_config(s.init).max_position_embeddings)
    folder = None
    if dist.is_main:  # one process prepares; the others read what it wrote
        try:
            folder = tapt_data(s.tapt, s.init, max_seq_len, "nsp" if spec.pairs else "none", log, progress)
        except ValueError as e:
            raise UserError(str(e)) from None
    folder = dist.broadcast_object(folder)
    return dataclasses.replace(s, data=[str(folder)])


def _unset(s: PretrainSettings, name: str, settings) -> bool:
    """Whether a recipe may fill in `settings`' field `name`: not given on the command line, or (from
    Python, where every field counts as given) left at its default."""
    if s.given is not None:
        return name not in s.given
    return getattr(settings, name) == type(settings).__dataclass_fields__[name].default


def run_pretraining(s: PretrainSettings, cfg: TrainConfig, device: torch.device, log=print,
                    dist: Dist | None = None) -> dict:
    """Everything is read and checked before the run folder is touched (rundir.RunFolder); a
    resumed run takes its model config from the run folder."""
    dist = dist or Dist()
    s, cfg = with_recipe(s, cfg)
    if s.init is not None and not Path(s.init).is_dir():  # a model by name, as --model takes it (minilm, a hub id)
        s = dataclasses.replace(s, init=resolve_model(str(s.init), "--init"))
    if s.tapt is not None:
        s = with_tapt(s, log=log if dist.is_main else lambda _: None, progress=cfg.progress and dist.is_main,
                      dist=dist)
    elif not s.data:
        raise UserError("give --data (folders written by torchbert prepare) or --tapt (a fine-tuning file whose "
                        "text is the corpus)")
    config_path = s.config if s.config is not None and s.config not in PRESETS else None
    try:
        specs = parse_data(s.data)
    except ValueError as e:
        raise UserError(str(e)) from None
    folders = [f for f, _ in specs]
    folder = RunFolder(s.out, s.resume, s.overwrite, [*(("--data", f) for f in folders), ("--init", s.init),
                                                      ("--tapt", s.tapt),
                                                      ("--eval-data", s.eval_data), ("--config", config_path)], log=log)
    if s.dropout is not None and s.init is not None:
        raise UserError("--dropout sets a fresh model's dropout; an --init model keeps its config's (edit its "
                        "config.json)")
    if s.positions is not None and s.init is not None:
        raise UserError("--positions sets a fresh model's; an --init model keeps its config's")
    config = resumed_config(s) if s.resume else None
    if s.resume:  # the run's own learning rate, schedule, batch size...: given otherwise, an error
        cfg, _ = resumed_settings(s.out, cfg, s.given, world_size=dist.world_size)
    spec = chosen_objective(s, config)
    check_options(s, spec)
    data = open_data(specs, seed=cfg.seed, rank=dist.rank, world_size=dist.world_size, masked=spec.masked)
    if spec.pairs and data.manifest["settings"].get("pairs", "nsp") == "none":
        others = [f"--objective {n}" for n in objectives() if not PRETRAINING[n].pairs]
        raise UserError(f"--data {data.folder}: prepared with --pairs none (sentences packed end to end, no sentence "
                        f"pairs), which {spec.flag} cannot learn from: pretrain it with {' or '.join(others)}, or "
                        "prepare the corpus again with --pairs nsp")
    own = spec.own(s.objective_settings)  # its own settings (ELECTRA: the generator's size), or None
    if s.resume:
        own = run_settings(s.out, config, spec)
    objective = spec.objective(own)  # built once: a teacher it reads (general distillation) is loaded once
    if hasattr(objective, "check_data"):  # what it reads besides the model: a teacher of the data's vocabulary
        try:
            objective.check_data(data)
        except ValueError as e:
            raise UserError(str(e)) from None
    if s.resume:
        check_resumed(s, config, data)
        model = spec.model(config, own)  # the checkpoint brings the weights
    elif s.init is not None:
        data.check_vocab(s.init)
        model = spec.model_class.from_pretrained(s.init)
        if model.config.max_position_embeddings < data.max_seq_len:
            raise ValueError(f"--init {s.init}: {model.config.max_position_embeddings} positions are fewer than "
                             f"the data's max_seq_len {data.max_seq_len}")
    else:
        torch.manual_seed(cfg.seed)
        config = model_config(s.config or "small", data.vocab_size, data.max_seq_len, spec.family)
        if s.dropout is not None:
            config = with_dropout(config, s.dropout)
        if s.positions is not None:
            config = dataclasses.replace(config, position_embedding_type=s.positions)
        check_memory(config, f"--config {s.config or 'small'}", copies=4)
        model = spec.model(config, own)
    config = model.config
    evaluate = counts = None
    eval_specs = [(Path(s.eval_data), None)] if s.eval_data is not None else None
    if eval_specs is None and all((f / "heldout" / "manifest.json").is_file() for f in folders):
        eval_specs = [(f / "heldout", w) for f, w in specs]  # prepare --heldout-docs put it there; a blend's blended
    if eval_specs is not None:
        eval_data = open_data(eval_specs, seed=cfg.seed, shuffle=False, masked=spec.masked)
        for eval_folder, _ in eval_specs:
            data.check_vocab(eval_folder)
        evaluate = evaluator(eval_data, cfg.batch_size, s.eval_batches, device, objective)
        if spec.masked and dist.is_main:  # what tables of counts score on the same masks (eval/yardsticks.py)
            started = time.perf_counter()
            counts = yardsticks(data, heldout_batches(eval_data, cfg.batch_size, s.eval_batches))
            log(f"count yardsticks on {counts['masked']:,} held-out masked tokens (tables of {counts['counted']:,} "
                f"training tokens, {time.perf_counter() - started:.0f}s): the most frequent token {counts['unigram']:.3f}, "
                f"given the left neighbour {counts['left']:.3f}, given both neighbours {counts['neighbours']:.3f}; "
                "the model's held-out MLM accuracy should pass them")
    if s.compile:  # in place, so parameter names (and checkpoints) stay those of the plain model
        model.compile(dynamic=True)
        # sizes read from the batch (tokens per sequence, masked tokens) end the traced graphs by
        # design; the compiler's advice on each such .item() is not for our users
        logging.getLogger("torch._dynamo.variables.tensor").setLevel(logging.ERROR)
    model = wrap(model.to(device), dist, device)

    with folder.opened(dist):
        training = fixed(cfg, dist.world_size)  # what --resume trains with
        if dist.is_main and not s.resume:
            config.save(s.out / "config.json")  # what --resume builds the model from
            own_settings = asdict(own) if own is not None else {}  # what --resume builds its model with
            write_record(s.out, RunRecord("pretrain", objective=spec.name, settings=own_settings, training=training,
                                          command=s.command_line))

        def saved(checkpoint: Path) -> None:
            with_training(s.out, training, "pretrain")  # a resumed run's, once a checkpoint holds its work
            folder.commit(checkpoint)
        summary = train(model, data, objective, cfg, s.out, resume=s.resume, evaluate=evaluate,
                        device=device, log=log, dist=dist, on_checkpoint=saved, evaluate_first=s.init is not None)
        state = full_state_dict(model, dist)  # every process takes part under FSDP
        if not dist.is_main:
            return summary
        final = spec.model_class(config)
        final.load_state_dict(state)
        final.save_pretrained(s.out)
        for name in TOKENIZER_FILES:
            if (folders[0] / name).is_file():  # a blend's folders share the tokenizer (checked)
                atomic_copy(folders[0] / name, s.out / name)
        summary.update(data=s.data[0] if len(s.data) == 1 else data.manifest["blend"], model=spec.family,
                       objective=spec.name)
        if counts is not None:
            summary["yardsticks"] = counts
        atomic_write_text(s.out / "metrics.json", json.dumps(summary, indent=2) + "\n")
        plot_pretraining(s.out, counts)
    return summary


def report_lines(summary: dict, out: Path | str) -> list[str]:
    """What a pretraining run bought, in a few lines: its speed, its objective's held-out line, the count
    tables' scores on the same masks."""
    lines = [f"pretrained {summary['steps']} steps, {summary['tokens']:,} tokens in {summary['train_seconds']:.0f}s "
             f"({summary['tokens_per_second']:,.0f} tokens/s"
             + (f", peak memory {summary['peak_memory_gb']:.1f} GB" if "peak_memory_gb" in summary else "")
             + f") -> {out}"]
    if summary.get("eval_first"):  # a continued checkpoint: what it knew of this corpus before the first step
        lines.append("before the first step, " + PRETRAINING[summary["objective"]].held_out(summary["eval_first"]))
    if summary.get("eval"):
        lines.append(PRETRAINING[summary["objective"]].held_out(summary["eval"]))
    if "yardsticks" in summary:
        y = summary["yardsticks"]
        lines.append(f"count tables on the same {y['masked']:,} masked tokens: most frequent token {y['unigram']:.3f}, "
                     f"given the left neighbour {y['left']:.3f}, given both neighbours {y['neighbours']:.3f}")
    return lines


def with_dropout(config, p: float):
    """The config with every dropout probability set to p."""
    return dataclasses.replace(config, **dict.fromkeys(architecture_of(config).dropouts, p))


def chosen_objective(s: PretrainSettings, resumed: BertConfig | GPTConfig | ELMoConfig | None) -> PretrainingObjective:
    """The objective --model and --objective name; a resumed run's own, which they may only repeat."""
    if resumed is None:
        try:
            return pretraining_objective(s.model or "bert", s.objective)
        except ValueError as e:
            raise UserError(str(e)) from None
    run = PRETRAINING[run_objective(s.out, resumed)]
    if s.model is not None and s.model != run.family:
        raise UserError(f"--model {s.model}: the run in {s.out} pretrains {run.family}; leave --model out to resume it")
    if s.objective is not None and s.objective != run.name:
        if len(objectives(run.family)) == 1:
            raise UserError(f"--objective is BERT's; {run.family} has its own (leave --objective out)")
        raise UserError(f"--objective {s.objective}: the run in {s.out} pretrains {run.name}; leave --objective out "
                        "to resume it")
    return run


def run_objective(out: Path, config) -> str:
    """The objective of the run in `out`, as its run record says (torchbert.json, or an older
    torchbert's config.json). A run of a torchbert older still, by its config: the family by the
    config's class, a BERT's objective by the head its config.json names (none: the paper's)."""
    run = read_record(out)
    if run is not None and run.objective in PRETRAINING:
        return run.objective
    family = architecture_of(config).name
    if family != "bert":
        return objectives(family)[0]
    head = (config.extra.get("architectures") or ["BertForPreTraining"])[0]
    return next((n for n in objectives() if PRETRAINING[n].model_class.__name__ == head), objectives()[0])


def run_settings(out: Path, config, spec: PretrainingObjective) -> Any:
    """The objective's own settings a run trains with (its record; an older torchbert's config.json,
    which kept them as torchbert_NAME); None for an objective without any."""
    if spec.settings is None:
        return None
    run = read_record(out)
    saved = run.settings if run is not None else {}
    older = {f.name: config.extra[f"torchbert_{f.name}"] for f in dataclasses.fields(spec.settings)
             if f"torchbert_{f.name}" in config.extra}
    return spec.settings(**{k: v for k, v in {**older, **saved}.items() if k in spec.settings.__dataclass_fields__})


def check_options(s: PretrainSettings, spec: PretrainingObjective) -> None:
    """The settings that shape a model, against what the objective takes (its spec says)."""
    if s.positions is not None and s.positions not in spec.positions:
        takes = f" (it takes {' or '.join(spec.positions)})" if spec.positions else " (it keeps its own)"
        raise UserError(f"--positions {s.positions} is not supported with {spec.flag}{takes}")
    try:
        spec.own(s.objective_settings)
    except ValueError as e:
        raise UserError(str(e)) from None
    if s.init is not None and not spec.init:
        raise UserError(f"--init is not supported with {spec.flag}: it trains a part that would start from nothing")


def shape(config: BertConfig) -> dict:
    """What a config says of the model's shape (its fields, the free-form extra aside)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "extra"}


def resumed_config(s: PretrainSettings) -> BertConfig | GPTConfig | ELMoConfig:
    """The config the run in s.out started with."""
    if not list_checkpoints(s.out):
        raise no_checkpoint(s.out)
    saved = s.out / "config.json"
    if not saved.is_file():
        raise UserError(f"--resume: {saved} is missing; the run was started by an older torchbert: pass the "
                        "--config it started with and copy its config.json there, or start again with --overwrite")
    return load_config(saved)


def check_resumed(s: PretrainSettings, config: BertConfig | GPTConfig | ELMoConfig,
                  data: PretrainingData | BlendedData) -> None:
    """A --config, --data or model setting that says otherwise than the resumed run is an error."""
    family = architecture_of(config).name
    run = run_settings(s.out, config, PRETRAINING[run_objective(s.out, config)])
    if s.objective_settings is not None and run is not None:  # those given, against the run's
        for f in dataclasses.fields(run):
            flag = f"--{f.name.replace('_', '-')}"
            mine, theirs = getattr(s.objective_settings, f.name), getattr(run, f.name)
            if (s.given is None or f.name in s.given) and mine != theirs:
                raise UserError(f"{flag} {mine} differs from the run's {theirs}; leave it out to resume")
    if s.dropout is not None and with_dropout(config, s.dropout) != config:
        raise UserError(f"--dropout {s.dropout} differs from the dropout the run in {s.out} started with; "
                        "leave --dropout out to resume it")
    if s.positions is not None and s.positions != config.position_embedding_type:
        flag = f"--recipe {s.recipe} (positions {s.positions})" if s.recipe else f"--positions {s.positions}"
        raise UserError(f"{flag} differs from the run's {config.position_embedding_type}; leave "
                        f"{flag.split()[0]} out to resume it")
    if s.config is not None:
        given = model_config(s.config, data.vocab_size, data.max_seq_len, family)
        if s.dropout is not None:
            given = with_dropout(given, s.dropout)
        if s.positions is not None:
            given = dataclasses.replace(given, position_embedding_type=s.positions)
        if shape(given) != shape(config):
            raise UserError(f"--config {s.config} differs from the config the run in {s.out} started with; "
                            "leave --config out to resume it")
    if config.vocab_size != data.vocab_size:
        raise UserError(f"--data {data.folder}: vocab size {data.vocab_size} differs from the run's "
                        f"{config.vocab_size}; "
                        "resume with the data the run started with")
