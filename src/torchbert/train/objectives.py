"""What a batch's loss is, for every model the loop trains: the objectives of pretraining (BERT's
MLM + NSP, MLM alone, ELECTRA's replaced-token detection, MLM beside a teacher's relations (general
distillation), GPT's next token, ELMo's two directions)
and of fine-tuning (a task family's loss), side by side. The loop (train/loop.py) knows a model only
through its objective.

An objective says what a batch's loss parts are: `counts(batch)` (targets per part, known on the
host before the forward) and `forward(model, batch)` (per part: the summed loss and the number of
correct predictions); the step's loss is the sum of the parts' means, each times the objective's
`weights` (ELECTRA's discriminator: 50; 1 where it names none). An objective may also fix
`per_step`, the targets of an average step per part: each step's summed loss is then divided by
that instead of by its own count, so that every target weighs the same even when steps hold very
different counts (length-sorted batches of labelled tokens).

A pretraining objective is registered by name (PRETRAINING, at the end): its model, its loss, the
data it reads and the options it takes, declared once; `pretrain` looks it up.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from ..baselines.elmo import ELMoBiLM
from ..baselines.gpt import OpenAIGPTLMHeadModel
from ..config import POSITIONS, BertConfig, ELMoConfig, GPTConfig
from ..electra import GENERATOR_SIZE, RTD_WEIGHT, ElectraForPreTraining
from ..heads import BertForMaskedLM, BertForPreTraining
from ..losses import next_tokens, previous_tokens
from ..settings import Checked, setting
from ..tasks.batches import TaskBatch, TaskData
from ..tasks.families import TaskFamily
from .distill_losses import last_layer_relations


class Objective(Protocol):
    parts: tuple[str, ...]
    per_step: dict[str, float] | None
    # where a part is not weighed 1 or has no accuracy: `weights` {part: w} and `unscored` (read with getattr)

    def counts(self, batch) -> dict[str, int]: ...

    def forward(self, model: nn.Module, batch) -> dict[str, tuple[Tensor, Tensor]]: ...


class PretrainingTask:
    """MLM + NSP on packed batches (torchbert.data.shards.Batch)."""

    parts = ("mlm", "nsp")
    per_step = None  # each step's own count: a step of k micro-batches is one big batch

    def counts(self, batch) -> dict[str, int]:
        return {"mlm": int(batch.mlm_labels.numel()), "nsp": int(batch.nsp_labels.numel())}

    def forward(self, model: nn.Module, batch) -> dict[str, tuple[Tensor, Tensor]]:
        out = model(batch.input_ids, token_type_ids=batch.token_type_ids, cu_seqlens=batch.cu_seqlens,
                    max_seqlen=batch.max_seqlen, mlm_positions=batch.mlm_positions, mlm_labels=batch.mlm_labels,
                    next_sentence_label=batch.nsp_labels)
        m, b = batch.mlm_labels.numel(), batch.nsp_labels.numel()
        mlm_sum = out.mlm_loss.float() * m if m else out.mlm_logits.sum() * 0.0
        mlm_correct = (out.mlm_logits.argmax(-1) == batch.mlm_labels).sum()
        nsp_correct = (out.nsp_logits.argmax(-1) == batch.nsp_labels).sum()
        return {"mlm": (mlm_sum, mlm_correct), "nsp": (out.nsp_loss.float() * b, nsp_correct)}


class MaskedLMTask:
    """MLM alone on the same packed batches (BertForMaskedLM: no pooler, no NSP head); Cramming and
    RoBERTa dropped NSP, which costs a pooler pass and teaches little."""

    parts = ("mlm",)
    per_step = None

    def counts(self, batch) -> dict[str, int]:
        return {"mlm": int(batch.mlm_labels.numel())}

    def forward(self, model: nn.Module, batch) -> dict[str, tuple[Tensor, Tensor]]:
        out = model(batch.input_ids, token_type_ids=batch.token_type_ids, cu_seqlens=batch.cu_seqlens,
                    max_seqlen=batch.max_seqlen, mlm_positions=batch.mlm_positions, mlm_labels=batch.mlm_labels)
        m = batch.mlm_labels.numel()
        mlm_sum = out.mlm_loss.float() * m if m else out.mlm_logits.sum() * 0.0
        return {"mlm": (mlm_sum, (out.mlm_logits.argmax(-1) == batch.mlm_labels).sum())}


class ElectraTask:
    """ELECTRA's replaced-token detection on the masked batches (electra.ElectraForPreTraining): the
    generator's MLM and the discriminator's verdict on every token, weighted 1 and 50 (the paper's
    lambda) in the loss; the logged losses are each part's own mean."""

    parts = ("mlm", "rtd")
    per_step = None
    weights = {"rtd": RTD_WEIGHT}

    def counts(self, batch) -> dict[str, int]:
        return {"mlm": int(batch.mlm_labels.numel()), "rtd": batch.num_tokens}

    def forward(self, model: nn.Module, batch) -> dict[str, tuple[Tensor, Tensor]]:
        out = model(batch.input_ids, token_type_ids=batch.token_type_ids, cu_seqlens=batch.cu_seqlens,
                    max_seqlen=batch.max_seqlen, mlm_positions=batch.mlm_positions, mlm_labels=batch.mlm_labels)
        m, n = batch.mlm_labels.numel(), batch.num_tokens
        mlm_correct = (out.mlm_logits.argmax(-1) == batch.mlm_labels).sum()
        rtd_correct = ((out.rtd_logits > 0).float() == out.rtd_labels).sum()
        return {"mlm": (out.mlm_loss.float() * m, mlm_correct), "rtd": (out.rtd_loss.float() * n, rtd_correct)}


class CausalLMTask:
    """GPT's objective on packed batches of unmasked instances (shards.PretrainingData(masked=False)):
    every token predicts the next one of its sequence."""

    parts = ("lm",)
    per_step = None

    def counts(self, batch) -> dict[str, int]:
        return {"lm": batch.num_tokens - (batch.cu_seqlens.numel() - 1)}  # all but each sequence's last token

    def forward(self, model: nn.Module, batch) -> dict[str, tuple[Tensor, Tensor]]:
        out = model(batch.input_ids, cu_seqlens=batch.cu_seqlens, max_seqlen=batch.max_seqlen, labels=batch.input_ids)
        n = self.counts(batch)["lm"]
        correct = (out.logits.argmax(-1) == next_tokens(batch.input_ids, batch.cu_seqlens)).sum()
        return {"lm": (out.loss.float() * n if n else out.logits.sum() * 0.0, correct)}


class BiLMTask:
    """ELMo's objective on the same packed batches as CausalLMTask's: every token predicts the next
    one of its sequence (forward) and the one before it (backward); the loss is their sum."""

    parts = ("forward", "backward")
    per_step = None

    def counts(self, batch) -> dict[str, int]:
        n = batch.num_tokens - (batch.cu_seqlens.numel() - 1)  # all but one token of each sequence, each way
        return {"forward": n, "backward": n}

    def forward(self, model: nn.Module, batch) -> dict[str, tuple[Tensor, Tensor]]:
        out = model(batch.input_ids, cu_seqlens=batch.cu_seqlens, max_seqlen=batch.max_seqlen, labels=batch.input_ids)
        n = self.counts(batch)["forward"]
        want = {"forward": next_tokens(batch.input_ids, batch.cu_seqlens),
                "backward": previous_tokens(batch.input_ids, batch.cu_seqlens)}
        parts = {}
        for p, loss, logits in (("forward", out.forward_loss, out.forward_logits),
                                ("backward", out.backward_loss, out.backward_logits)):
            parts[p] = (loss.float() * n if n else logits.sum() * 0.0, (logits.argmax(-1) == want[p]).sum())
        return parts


class RelationDistillTask:
    """General distillation beside MLM, on the masked batches: the student (BertForMaskedLM) learns the
    masked tokens and, at every token, a pretrained teacher's self-attention relations of the last
    layer (MiniLMv2, Wang et al. 2021: train/distill_losses.py relation_loss, summed over the
    sequences). The teacher reads the same masked input, in eval mode without gradients, on the
    batch's device from its first batch on. Parts "mlm" and "relation" (no accuracy), weighed 1 and
    relation_weight."""

    parts = ("mlm", "relation")
    per_step = None
    unscored = ("relation",)

    def __init__(self, teacher: str = "minilm", relation_weight: float = 1.0):
        from ..io.hf import resolve_model
        from ..model import BertModel

        self.folder = resolve_model(teacher, "--teacher")
        self.teacher = BertModel.from_pretrained(self.folder).eval().requires_grad_(False)
        self.weights = {"relation": relation_weight}

    def check_data(self, data) -> None:
        """The data is in the teacher's vocabulary and fits its positions (ValueError naming both)."""
        data.check_vocab(self.folder)
        if self.teacher.config.max_position_embeddings < data.max_seq_len:
            raise ValueError(f"--teacher {self.folder}: {self.teacher.config.max_position_embeddings} positions, fewer "
                             f"than the data's max_seq_len {data.max_seq_len}")

    def counts(self, batch) -> dict[str, int]:
        return {"mlm": int(batch.mlm_labels.numel()), "relation": batch.cu_seqlens.numel() - 1}

    def forward(self, model: nn.Module, batch) -> dict[str, tuple[Tensor, Tensor]]:
        inputs = dict(token_type_ids=batch.token_type_ids, cu_seqlens=batch.cu_seqlens, max_seqlen=batch.max_seqlen)
        out = model(batch.input_ids, **inputs, mlm_positions=batch.mlm_positions, mlm_labels=batch.mlm_labels,
                    output_hidden_states=True)
        if self.teacher.embeddings.word.weight.device != batch.input_ids.device:
            self.teacher.to(batch.input_ids.device)
        with torch.no_grad():
            theirs = self.teacher(batch.input_ids, **inputs, output_hidden_states=True).hidden_states
        relation = last_layer_relations(model, out.hidden_states, self.teacher, theirs, batch.cu_seqlens,
                                        batch.max_seqlen)
        m = batch.mlm_labels.numel()
        mlm_sum = out.mlm_loss.float() * m if m else out.mlm_logits.sum() * 0.0
        return {"mlm": (mlm_sum, (out.mlm_logits.argmax(-1) == batch.mlm_labels).sum()),
                "relation": (relation, torch.zeros((), device=relation.device))}


class FinetuneTask:
    """One loss part, "task": summed over its targets (sequences, labelled tokens or examples: the
    family's count).

    per_step: the targets of an average optimizer step over the training data. Batches of tokens
    hold from a few to many labelled tokens; dividing each step's loss by its own count would weigh a
    token of a short sentence several times more than one of a long sentence. Divided by the average,
    every target weighs the same."""

    parts = ("task",)

    def __init__(self, fam: TaskFamily, per_step: float | None = None):
        self.family = fam
        self.per_step = {"task": per_step} if per_step else None

    def counts(self, batch: TaskBatch) -> dict[str, int]:
        return {"task": batch.num_targets}  # counted on the host: no device sync

    def forward(self, model: nn.Module, batch: TaskBatch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        out = model(**batch.model_inputs(), **self.family.targets(batch))
        n = batch.num_targets
        # a micro-batch of token windows may hold no labelled token: its loss is then nan, count it as 0
        loss_sum = out.loss.float() * n if n else out.logits.sum() * 0.0
        return {"task": (loss_sum, self.family.correct(out, batch))}


def targets_per_step(data: TaskData, units_per_step: int) -> float:
    """The loss targets (FinetuneTask.counts) of an average step of `units_per_step` examples."""
    return data.family.total(data) * min(units_per_step, len(data)) / len(data)


# -- pretraining objectives, by name ----------------------------------------------------------------

@dataclass(frozen=True)
class PretrainingObjective:
    """A pretraining objective, declared once. `pretrain` finds it by name (PRETRAINING) and asks it
    what it needs; it never asks which objective it has. To add one: its loss (a class above) and a
    `register_objective(PretrainingObjective(...))` below (docs/architecture.md)."""

    name: str  # --objective for a BERT; for another model family, its --model name
    family: str  # the model family (--model): bert, gpt, elmo
    model_class: type  # the model it trains; its save_pretrained writes the Hugging Face layout
    config_class: type  # that family's config
    loss: Callable[..., Objective]  # a batch's loss parts (its settings' values, where they are the loss's)
    held_out: Callable[[dict], str]  # its line of held-out figures in pretrain's report
    masked: bool = True  # reads the prepared instances masked (MLM), or as plain text
    pairs: bool = False  # learns from sentence pairs: data prepared with --pairs none is refused
    positions: tuple[str, ...] = ()  # the --positions a fresh model may take
    init: bool = True  # may start from an --init checkpoint
    about: str = ""  # what it is, for --help
    # its own settings, a Checked dataclass of `setting` fields: `pretrain` shows them as flags under the
    # objective, and the run record keeps them for --resume; they are its model class's keyword arguments
    # (shapes_model: ELECTRA's generator size) or else its loss's
    settings: type | None = None
    shapes_model: bool = False

    @property
    def flag(self) -> str:
        """How the command line names it."""
        return f"--objective {self.name}" if self.family == "bert" else f"--model {self.name}"

    def own(self, given: Any = None) -> Any:
        """Its settings: `given` (of its class; another's is a ValueError naming whose it is), else its
        defaults; None when it has none."""
        if given is not None and type(given) is not self.settings:
            owner = next((o.flag for o in PRETRAINING.values() if o.settings is type(given)), type(given).__name__)
            flags = ", ".join(f"--{f.name.replace('_', '-')}" for f in fields(given))
            raise ValueError(f"{flags}: a setting of {owner}; {self.flag} does not read it")
        return given if given is not None else self.settings() if self.settings is not None else None

    def model(self, config, own: Any = None) -> nn.Module:
        """A fresh model of its class for `config`, shaped by its settings where they shape it."""
        return self.model_class(config, **(asdict(own) if self.shapes_model and own is not None else {}))

    def objective(self, own: Any = None) -> Objective:
        """Its loss, with its settings where they are the loss's."""
        return self.loss(**(asdict(own) if not self.shapes_model and own is not None else {}))


@dataclass
class ElectraSettings(Checked):
    """ELECTRA's own: the generator's width (it shapes the model that trains, not the BERT it saves)."""

    generator_size: float = setting(GENERATOR_SIZE, "ELECTRA's generator width as a share of the BERT's (the "
                                                    "paper: 1/4 to 1/2)", above=0, high=1)


@dataclass
class GeneralDistillSettings(Checked):
    """General distillation's own: the teacher whose relations the student learns, and their weight."""

    teacher: str = setting("minilm", "the pretrained BERT whose last layer's self-attention relations the student "
                                     "learns: a folder, minilm or a hub id; --data prepared in its vocabulary "
                                     "(prepare --tokenizer TEACHER)", metavar="FOLDER")
    relation_weight: float = setting(1.0, "the relation loss's weight beside MLM's 1", low=0, high=1000, metavar="W")


PRETRAINING: dict[str, PretrainingObjective] = {}  # by name; a family's first is its default


def register_objective(spec: PretrainingObjective) -> PretrainingObjective:
    if spec.name in PRETRAINING:
        raise ValueError(f"a pretraining objective named {spec.name!r} is registered already")
    PRETRAINING[spec.name] = spec
    return spec


def families() -> tuple[str, ...]:
    """The model families (--model), in the order they were registered."""
    return tuple(dict.fromkeys(spec.family for spec in PRETRAINING.values()))


def objectives(family: str = "bert") -> tuple[str, ...]:
    """A family's objectives (a BERT's --objective), its default first."""
    return tuple(name for name, spec in PRETRAINING.items() if spec.family == family)


def pretraining_objective(family: str, objective: str | None = None) -> PretrainingObjective:
    """The objective `--model family [--objective objective]` names; ValueError names the flag."""
    if family not in families():
        raise ValueError(f"--model {family}: expected one of {', '.join(families())}")
    mine = objectives(family)
    if objective is None:
        return PRETRAINING[mine[0]]
    if len(mine) == 1:
        raise ValueError(f"--objective is BERT's; {family} has its own (leave --objective out)")
    if objective not in mine:
        raise ValueError(f"--objective {objective}: expected one of {', '.join(mine)}")
    return PRETRAINING[objective]


def _mlm_line(ev: dict) -> str:
    nsp = f", NSP accuracy {ev['nsp_accuracy']:.3f}" if "nsp_accuracy" in ev else ""
    rtd = (f", replaced-token detection accuracy {ev['rtd_accuracy']:.3f} (the generator's MLM above)"
           if "rtd_accuracy" in ev else "")
    return f"held-out: MLM loss {ev['mlm_loss']:.3f}, MLM accuracy {ev['mlm_accuracy']:.3f}{nsp}{rtd}"


def _perplexity(loss: float) -> float:
    return math.exp(min(loss, 50))


register_objective(PretrainingObjective(
    "mlm+nsp", "bert", BertForPreTraining, BertConfig, PretrainingTask, _mlm_line, pairs=True, positions=POSITIONS,
    about="the paper's masked LM and next sentence prediction"))
register_objective(PretrainingObjective(
    "mlm", "bert", BertForMaskedLM, BertConfig, MaskedLMTask, _mlm_line, positions=POSITIONS,
    about="masked LM alone (BertForMaskedLM: no pooler and no NSP head, as Cramming and RoBERTa)"))
register_objective(PretrainingObjective(  # transformers' ELECTRA has absolute positions only; its generator
    "electra", "bert", ElectraForPreTraining, BertConfig, ElectraTask, _mlm_line, positions=("absolute",),
    settings=ElectraSettings, shapes_model=True, init=False,  # would start from nothing beside an --init discriminator
    about="replaced-token detection (a narrow generator fills the masks, the BERT learns from every token which "
          "ones it replaced; the run folder is that BERT)"))
register_objective(PretrainingObjective(
    "distill", "bert", BertForMaskedLM, BertConfig, RelationDistillTask,
    lambda ev: f"{_mlm_line(ev)}, relation KL to the teacher {ev['relation_loss']:.3f}", positions=POSITIONS,
    settings=GeneralDistillSettings,
    about="masked LM beside a pretrained teacher's self-attention relations (MiniLMv2's general distillation: a "
          "small BERT learns from --teacher over the corpus, then fine-tunes like any)"))
register_objective(PretrainingObjective(
    "gpt", "gpt", OpenAIGPTLMHeadModel, GPTConfig, CausalLMTask, masked=False,
    about="the left-to-right Transformer, next-token prediction",
    held_out=lambda ev: f"held-out: next-token loss {ev['lm_loss']:.3f} (perplexity {_perplexity(ev['lm_loss']):.1f}), "
                        f"accuracy {ev['lm_accuracy']:.3f}"))
register_objective(PretrainingObjective(
    "elmo", "elmo", ELMoBiLM, ELMoConfig, BiLMTask, masked=False,
    about="forward and backward LSTM language models",
    held_out=lambda ev: f"held-out: forward LM loss {ev['forward_loss']:.3f} (perplexity "
                        f"{_perplexity(ev['forward_loss']):.1f}), backward {ev['backward_loss']:.3f} (perplexity "
                        f"{_perplexity(ev['backward_loss']):.1f})"))
