"""The model architectures torchbert builds, found by name: BERT, and the two the paper defines it
against, GPT and ELMo (baselines/).

What differs between them outside their own model files is declared here, once, as data: the code
that fine-tunes, exports or serves a model asks `architecture_of(config)` what the model supports
and never which class it is. A task family's heads are looked up by an architecture's `name`
(tasks/families.py `heads`); a pretraining objective names its architecture (train/objectives.py).
A new architecture is one registration here (and its config class, model and heads).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .config import BertConfig, ELMoConfig, GPTConfig


@dataclass(frozen=True)
class Architecture:
    name: str                        # as task families' `heads` and `pretrain --model` name it
    config_class: type               # its config.json's class (model_type: config_class.MODEL_TYPE)
    encoder: str                     # the attribute holding the encoder in a model with a head (its
    about: str                       # checkpoint keys' prefix); the bare encoder has none
    finetune_lr: float = 5e-5        # finetune's default learning rate
    frozen_features: bool = False    # its hidden layers feed a feature-based tagger (finetune --frozen)
    exports: bool = False            # `export` writes it as ONNX
    embeds: bool = False             # its encoder gives sentence embeddings (`embed`, serve's /v1/embeddings)
    both_orders: bool = False        # a similarity task reads each pair in both orders (the GPT paper)
    lm_coef: bool = False            # fine-tuning may add its language-model loss (finetune --lm-coef)
    dropouts: tuple[str, ...] = ()   # its config's dropout fields, all set by `pretrain --dropout`


ARCHITECTURES: dict[str, Architecture] = {}


def register_architecture(arch: Architecture) -> Architecture:
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


def architecture_of_folder(path: str | os.PathLike) -> Architecture | None:
    """The architecture of the model in a folder, from its config.json's model_type (BERT's when it
    names another, as Hugging Face BERT folders do); None when there is no readable config.json
    (whoever loads the model says what is wrong with it)."""
    from .config import CONFIG_BYTES
    from .io.texts import read_json

    try:
        model_type = read_json(Path(path) / "config.json", dict, "config.json", CONFIG_BYTES).get("model_type")
    except (OSError, ValueError):
        return None
    return next((a for a in ARCHITECTURES.values() if a.config_class.MODEL_TYPE == model_type), ARCHITECTURES["bert"])


register_architecture(Architecture(
    "bert", BertConfig, "bert", "BERT (Devlin et al., 2018), learned absolute or rotary positions",
    frozen_features=True, exports=True, embeds=True, dropouts=("hidden_dropout_prob", "attention_probs_dropout_prob")))
register_architecture(Architecture(
    "gpt", GPTConfig, "transformer", "GPT (Radford et al., 2018): BERT's blocks with causal attention",
    both_orders=True, lm_coef=True, dropouts=("resid_pdrop", "embd_pdrop", "attn_pdrop")))
register_architecture(Architecture(
    "elmo", ELMoConfig, "elmo", "ELMo (Peters et al., 2018): two LSTM language models, read as frozen features",
    finetune_lr=1e-3, dropouts=("dropout",)))
