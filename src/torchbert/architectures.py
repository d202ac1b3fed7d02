"""The model architectures torchbert builds, found by name: BERT, and the two the paper defines it
against, GPT and ELMo (baselines/).

What differs between them outside their own model files is declared here, once, as data: the code
that fine-tunes, exports or serves a model asks `architecture_of(config)` what the model supports
and never which class it is. A folder's config.json is read as its architecture's config
(`load_config`, by model_type), and its weights through its architecture's checkpoint reader
(`HFCheckpoint`, the from_pretrained/save_pretrained of every model class). A task family names
its heads by architecture (tasks/families.py `heads`) and an architecture registered after the
families names its own by task type (`heads` here); a pretraining objective names its architecture
(train/objectives.py). A new architecture is one registration (and its config class, model and
heads): tests/test_architectures.py registers a one-layer encoder of its own and fine-tunes,
evaluates, predicts with and exports it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .config import CONFIG_BYTES, BertConfig, ELMoConfig, GPTConfig
from .io import hf
from .io.files import atomic_write
from .io.texts import read_json

# a checkpoint reader: (model, the file's tensors, the file's name) -> (state dict, missing, unused)
Reader = Callable[[nn.Module, dict[str, torch.Tensor], str], tuple[dict[str, torch.Tensor], list[str], list[str]]]
Writer = Callable[[nn.Module], dict[str, torch.Tensor]]  # a model -> the tensors its checkpoint holds


@dataclass(frozen=True)
class Architecture:
    name: str                        # as task families' `heads` and `pretrain --model` name it
    config_class: type               # its config.json's class (model_type: config_class.MODEL_TYPE)
    encoder: str                     # the attribute holding the encoder in a model with a head (its
    about: str                       # checkpoint keys' prefix); the bare encoder has none
    finetune_lr: float = 5e-5        # finetune's default learning rate
    frozen_features: bool = False    # its hidden layers feed a feature-based tagger (finetune --frozen)
    exports: bool = False            # `export` writes it as ONNX
    embeds: bool = False             # its encoder is a BertModel giving sentence embeddings (`embed`, serve's
    # /v1/embeddings) and exported bare
    both_orders: bool = False        # a similarity task reads each pair in both orders (the GPT paper)
    lm_coef: bool = False            # fine-tuning may add its language-model loss (finetune --lm-coef)
    dropouts: tuple[str, ...] = ()   # its config's dropout fields, all set by `pretrain --dropout`
    title: str = ""                  # as a sentence names it (BERT, GPT); the name in capitals by default
    no_head: str = ""                # why a task family may have no task model for it, said after "no X task model"
    bf16: bool = False               # inference may compute in bf16 (--precision auto picks it where the CPU has it)
    read: Reader = hf.convert_from_hf  # its checkpoint's tensors -> a model's, Hugging Face's names by default
    write: Writer = hf.convert_to_hf   # and back
    heads: dict[str, type[nn.Module]] = field(default_factory=dict)  # task type -> its task model, for
    # families that do not name one for this architecture themselves
    file_encoders: tuple[str, ...] = ()  # other prefixes its checkpoints keep the encoder under (RoFormer's)


ARCHITECTURES: dict[str, Architecture] = {}


def register_architecture(arch: Architecture) -> Architecture:
    if not arch.title:
        object.__setattr__(arch, "title", arch.name.upper())
    if arch.name in ARCHITECTURES:
        raise ValueError(f"architecture {arch.name!r} is registered twice")
    ARCHITECTURES[arch.name] = arch
    return arch


def architecture(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; choose from {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def architecture_of(config) -> Architecture:
    """The architecture a config builds."""
    for arch in ARCHITECTURES.values():
        if type(config) is arch.config_class:
            return arch
    raise ValueError(f"no registered architecture builds a {type(config).__name__}")


def encoder_of(model):
    """The encoder inside a model with a head (a pretraining or task model); None for a bare encoder
    or a model that holds none of its own (a feature tagger on a frozen one)."""
    config = getattr(model, "config", None)
    arch = next((a for a in ARCHITECTURES.values() if type(config) is a.config_class), None)
    return getattr(model, arch.encoder, None) if arch is not None else None


def encoder_tensor(name: str) -> bool:
    """Whether a checkpoint tensor belongs to an encoder (of any architecture) and not to a head on it."""
    return name.startswith(tuple(f"{p}." for a in ARCHITECTURES.values() for p in (a.encoder, *a.file_encoders)))


def _by_model_type(model_type: str | None) -> Architecture:
    """The architecture whose config.json says this model_type; BERT's for any other (Hugging Face's
    BERT folders name bert, roformer, or a descendant's own)."""
    return next((a for a in ARCHITECTURES.values() if a.config_class.MODEL_TYPE == model_type), ARCHITECTURES["bert"])


def architecture_of_folder(path: str | os.PathLike) -> Architecture | None:
    """The architecture of the model in a folder, from its config.json's model_type; None when there
    is no readable config.json (whoever loads the model says what is wrong with it)."""
    try:
        model_type = read_json(Path(path) / "config.json", dict, "config.json", CONFIG_BYTES).get("model_type")
    except (OSError, ValueError):
        return None
    return _by_model_type(model_type)


def load_config(path: str | os.PathLike):
    """A config.json (or the one in a folder) as its architecture's config class, by its model_type."""
    file = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    model_type = read_json(file, dict, "config.json", CONFIG_BYTES).get("model_type")
    return _by_model_type(model_type).config_class.load(path)


# -- checkpoints: every model class's from_pretrained and save_pretrained ------------------------

def load_pretrained(cls, path: str | os.PathLike, config=None, labels: Sequence[str] | None = None, **kwargs):
    """Build `cls` from a Hugging Face folder (config.json + weights), its tensors read by its
    architecture's reader. `labels` names the classes of a new classification head (stored as
    id2label and label2id, as transformers does)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a folder (expected a Hugging Face checkpoint folder)")
    config = config or cls.config_class.load(path)
    if labels is not None:
        config = hf.with_labels(config, labels)
    file = hf.find_weights(path)
    file_state = hf.read_weights(file)
    hf.check_against_weights(config, path, file, file_state)
    model = cls(config, **kwargs)
    state, missing, unused = architecture_of(config).read(model, file_state, str(file))
    model.load_state_dict(state, strict=False)
    if missing:
        warnings.warn(f"{file}: no weights for {', '.join(missing)}; they keep their fresh initialization",
                      stacklevel=3)
    # a pretraining checkpoint's heads, or a pooler, under a model that has none: what a task model
    # built on a pretrained encoder leaves out by design (not a warning); other heads are named
    named = [k for k in unused if not hf.unprefixed(k).startswith(hf.PRETRAINING_HEADS)]
    if named:
        warnings.warn(f"{file}: unused task-head tensors {', '.join(named[:4])}"
                      f"{f' and {len(named) - 4} more' if len(named) > 4 else ''} (not part of a "
                      f"{cls.__name__})", stacklevel=3)
    model.load_report = {"missing": missing, "unused": unused}
    return model


def save_pretrained(model: nn.Module, path: str | os.PathLike) -> None:
    """Write config.json and model.safetensors with its architecture's names; each file atomically."""
    from safetensors.torch import save_file

    path = Path(path)
    config = model.config
    name = getattr(model, "hf_architecture", type(model).__name__)  # our class names are Hugging Face's
    if getattr(config, "rotary", False):
        name = name.replace("Bert", "RoFormer", 1)
        if name == "RoFormerForMultipleChoice":  # its sequence_summary as our pooler: dense, activation, dropout
            config.extra = {**config.extra, "summary_type": "first", "summary_use_proj": True,
                            "summary_proj_to_labels": False, "summary_activation": config.hidden_act,
                            "summary_first_dropout": 0.0, "summary_last_dropout": config.hidden_dropout_prob}
    config.extra = {**config.extra, "architectures": [name]}
    state = architecture_of(config).write(model)
    atomic_write(path / "model.safetensors", lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    config.save(path)


class HFCheckpoint:
    """from_pretrained / save_pretrained for every torchbert model, through its architecture's reader
    and writer."""

    config_class: type = BertConfig  # what a folder's config.json is read as

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **kwargs):
        """Load a Hugging Face folder (config.json + model.safetensors or pytorch_model.bin)."""
        return load_pretrained(cls, path, **kwargs)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write config.json and model.safetensors that `transformers` loads."""
        save_pretrained(self, path)


register_architecture(Architecture(
    "bert", BertConfig, "bert", "BERT (Devlin et al., 2018), learned absolute or rotary positions",
    frozen_features=True, exports=True, embeds=True, bf16=True, file_encoders=("roformer",),
    dropouts=("hidden_dropout_prob", "attention_probs_dropout_prob")))
register_architecture(Architecture(
    "gpt", GPTConfig, "transformer", "GPT (Radford et al., 2018): BERT's blocks with causal attention",
    both_orders=True, lm_coef=True, dropouts=("resid_pdrop", "embd_pdrop", "attn_pdrop"),
    read=hf.gpt_from_hf, write=hf.gpt_to_hf))
register_architecture(Architecture(
    "elmo", ELMoConfig, "elmo", "ELMo (Peters et al., 2018): two LSTM language models, read as frozen features",
    finetune_lr=1e-3, dropouts=("dropout",), title="ELMo",
    no_head=" (ELMo's features feed a BiLSTM tagger or classifier here)",
    read=hf.elmo_from_state, write=hf.elmo_to_state))
