"""BertConfig: the hyperparameters of a BERT, with Hugging Face's field names.

`to_dict` / `save` write a `config.json` that `transformers.BertConfig` reads, and `from_dict` /
`load` read theirs: fields we do not model (architectures, id2label, torch_dtype, ...) are kept in
`extra` and written back unchanged, so a round trip loses nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .io.texts import CONFIG_BYTES, read_json
from .settings import readable_number

if TYPE_CHECKING:
    from torch import Tensor

# Fields a config.json must carry; the rest have BERT's defaults.
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu")
POSITIONS = ("absolute", "rotary")  # BertConfig.position_embedding_type
ROFORMER = "roformer"  # the model_type of a BERT with rotary positions


# Each size and rate a config may hold, (lowest, highest): a config.json out of them (a hostile or a
# mistyped one) is one line naming the file and the field, before anything is allocated. The highest
# sizes are far past any released model (BERT-large: 24 layers of 1,024).
BOUNDS: dict[str, tuple[float, float]] = {
    "vocab_size": (1, 1 << 24), "hidden_size": (1, 1 << 16), "num_hidden_layers": (1, 1024),
    "num_attention_heads": (1, 1 << 12), "intermediate_size": (1, 1 << 18), "max_position_embeddings": (1, 1 << 20),
    "type_vocab_size": (1, 1 << 16), "pad_token_id": (0, (1 << 24) - 1),
    "n_positions": (1, 1 << 20), "n_embd": (1, 1 << 16), "n_layer": (1, 1024), "n_head": (1, 1 << 12),
    "projection_dim": (1, 1 << 16), "cell_size": (1, 1 << 18), "num_layers": (1, 1024),
    "hidden_dropout_prob": (0, 1), "attention_probs_dropout_prob": (0, 1), "resid_pdrop": (0, 1),
    "embd_pdrop": (0, 1), "attn_pdrop": (0, 1), "dropout": (0, 1),
    "layer_norm_eps": (1e-30, 1), "layer_norm_epsilon": (1e-30, 1), "initializer_range": (0, 10),
}


def check_fields(config) -> None:
    """Every field of a config dataclass has its declared type (an int is no float's place, 2.5 layers
    or "12" layers are errors), is finite, and lies in BOUNDS; ValueError naming the field."""
    import math

    for f in dataclasses.fields(config):
        if f.name == "extra":
            continue
        value, kind = getattr(config, f.name), str(f.type)
        if kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        elif kind == "bool":
            ok = isinstance(value, bool)
        else:
            ok = isinstance(value, str)
        if not ok:
            want = {"int": "a whole number", "float": "a finite number", "bool": "true or false"}.get(kind, "a string")
            raise ValueError(f"{f.name} must be {want}, got {value!r}")
        if f.name in BOUNDS and not BOUNDS[f.name][0] <= value <= BOUNDS[f.name][1]:
            low, high = BOUNDS[f.name]
            raise ValueError(f"{f.name} must be in [{readable_number(low)}, {readable_number(high)}], got {value!r}")


def check_memory(config, source: str, copies: int = 1) -> None:
    """Before a model is built from `config` alone (no weights to compare it with): its fp32 weights,
    `copies` times over (training: weights, gradients and Adam's two moments, 4), fit in this
    machine's memory; else a ValueError naming `source`, not the allocator's failure minutes later."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system that says
        return
    need = config.parameter_estimate() * 4 * copies
    if need > memory:
        raise ValueError(f"{source}: its sizes imply about {config.parameter_estimate():,} parameters, "
                         f"{need / 1e9:,.1f} GB to {'train' if copies > 1 else 'hold'} in fp32, more than this "
                         f"machine's {memory / 1e9:,.1f} GB of memory")


class _JsonConfig:
    """config.json in and out for the dataclasses below, with Hugging Face's field names: fields a
    class does not model are kept in `extra` and written back unchanged."""

    MODEL_TYPE: ClassVar[str]
    REQUIRED: ClassVar[tuple[str, ...]]
    READS_SEGMENTS: ClassVar[bool] = False  # token_type_ids reach the model (BERT's segments A and B)

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config"):
        missing = [k for k in cls.REQUIRED if k not in d]
        if missing:
            raise ValueError(f"{source}: missing required field(s) {', '.join(missing)}")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        extra = {k: v for k, v in d.items() if k not in names}
        try:
            return cls(**known, extra=extra)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {"model_type": self.MODEL_TYPE, **self.extra, **d}

    @classmethod
    def load(cls, path: str | os.PathLike):
        """Read a config.json file, or the config.json inside a folder."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such config file")
        d = read_json(path, dict, "config.json", CONFIG_BYTES)
        return cls.from_dict(d, source=str(path))

    def save(self, path: str | os.PathLike) -> None:
        path = Path(path)
        if path.is_dir() or not path.suffix:
            path.mkdir(parents=True, exist_ok=True)
            path = path / "config.json"
        from .io.files import atomic_write_text

        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


@dataclass
class BertConfig(_JsonConfig):
    """position_embedding_type "rotary" is BERT with RoFormer's positions (Su et al., 2021): no
    position table, each head's queries and keys turned by angles of their position instead. Its
    config.json is a RoFormer's (model_type "roformer"), which transformers loads as one."""

    MODEL_TYPE = "bert"
    REQUIRED = REQUIRED
    READS_SEGMENTS = True

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    position_embedding_type: str = "absolute"  # or "rotary": see the class's docstring
    # Everything else found in a config.json (task labels, architectures, ...), kept verbatim.
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.position_embedding_type not in POSITIONS:
            raise ValueError(f"position_embedding_type {self.position_embedding_type!r} is not supported, "
                             f"only {' or '.join(map(repr, POSITIONS))}")
        if self.position_embedding_type == "rotary" and self.head_size % 2:
            raise ValueError(f"rotary positions turn pairs of features: head size {self.head_size} is odd")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not one of {', '.join(ACTIVATIONS)}")
        if self.pad_token_id >= self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id} is not an id of the vocabulary of {self.vocab_size}")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def parameter_estimate(self) -> int:
        """About how many parameters a model of this config has (its encoder and embeddings; heads
        aside): compared with a weights file before anything is allocated."""
        table = self.vocab_size + self.type_vocab_size + (0 if self.rotary else self.max_position_embeddings)
        return bert_body_parameters(self) + table * self.hidden_size

    @property
    def rotary(self) -> bool:
        return self.position_embedding_type == "rotary"

    # -- RoFormer's config.json: no position_embedding_type, model_type "roformer" ------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config"):
        if d.get("model_type") != ROFORMER:
            return super().from_dict(d, source)
        d = dict(d)
        if d.pop("rotary_value", False):
            raise ValueError(f"{source}: rotary_value true (values turned too) is not supported")
        if d.pop("embedding_size", None) not in (None, d.get("hidden_size")):
            raise ValueError(f"{source}: embedding_size differs from hidden_size (a projection) is not supported")
        if d.pop("position_embedding_type", "rotary") != "rotary":
            raise ValueError(f"{source}: a RoFormer's positions are rotary")
        return super().from_dict({**d, "position_embedding_type": "rotary"}, source)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        if self.rotary:
            del d["position_embedding_type"]
            d.update(model_type=ROFORMER, rotary_value=False, embedding_size=self.hidden_size)
        else:
            d["model_type"] = self.MODEL_TYPE
        return d

    # -- presets --------------------------------------------------------------------------------
    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> "BertConfig":
        """A named size from the BERT release (intermediate size 4H); overrides win."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        layers, hidden, heads = PRESETS[name]
        base = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                    intermediate_size=4 * hidden)
        return cls(**{**base, **overrides})


# Hugging Face's OpenAIGPT activation names -> ours ("gelu" there is the tanh approximation).
GPT_ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu", "silu": "silu", "swish": "silu"}


@dataclass
class GPTConfig(_JsonConfig):
    """GPT (Radford et al., 2018) with Hugging Face's OpenAIGPTConfig field names. Its feed-forward
    is 4 x n_embd wide, as in the paper."""

    MODEL_TYPE = "openai-gpt"
    REQUIRED = ("vocab_size", "n_embd", "n_layer", "n_head")

    # GPT's own names; BERT's (BertConfig) after each
    vocab_size: int = 40478
    n_positions: int = 512  # max_position_embeddings
    n_embd: int = 768  # hidden_size
    n_layer: int = 12  # num_hidden_layers
    n_head: int = 12  # num_attention_heads
    afn: str = "gelu"  # hidden_act
    resid_pdrop: float = 0.1  # hidden_dropout_prob
    embd_pdrop: float = 0.1  # hidden_dropout_prob too (one rate in BERT)
    attn_pdrop: float = 0.1  # attention_probs_dropout_prob
    layer_norm_epsilon: float = 1e-5  # layer_norm_eps
    initializer_range: float = 0.02
    # the task heads (GPT paper, section 3.3): Hugging Face's dropout before the extract token's head;
    # similarity read in both orders, the two extract states summed (set for regression tasks). The
    # weight of the next-token loss in fine-tuning is how a head trains, its argument (baselines/gpt.py)
    summary_first_dropout: float = 0.1
    both_orders: bool = False
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def max_position_embeddings(self) -> int:  # BERT's name, so code that checks lengths serves both
        return self.n_positions

    def __post_init__(self) -> None:
        check_fields(self)
        if self.afn not in GPT_ACTIVATIONS:
            raise ValueError(f"afn {self.afn!r} is not one of {', '.join(GPT_ACTIVATIONS)}")
        self.blocks()  # the same checks as BERT's

    @classmethod
    def like(cls, bert: BertConfig) -> GPTConfig:
        """The GPT of a BERT's size (layers, hidden size, heads, vocabulary, positions, dropout), for
        comparisons of the two at equal shape. The feed-forward is 4H in both (every BERT preset)."""
        if bert.intermediate_size != 4 * bert.hidden_size:
            raise ValueError(f"GPT's feed-forward is 4 x hidden: intermediate_size {bert.intermediate_size} "
                             f"is not 4 x {bert.hidden_size}")
        return cls(vocab_size=bert.vocab_size, n_positions=bert.max_position_embeddings, n_embd=bert.hidden_size,
                   n_layer=bert.num_hidden_layers, n_head=bert.num_attention_heads,
                   resid_pdrop=bert.hidden_dropout_prob, embd_pdrop=bert.hidden_dropout_prob,
                   attn_pdrop=bert.attention_probs_dropout_prob, initializer_range=bert.initializer_range)

    def parameter_estimate(self) -> int:
        """About how many parameters the model has, heads aside (see BertConfig's)."""
        return bert_body_parameters(self.blocks()) + (self.vocab_size + self.n_positions) * self.n_embd

    def blocks(self) -> BertConfig:
        """The BertConfig whose transformer blocks (model.Layer) are GPT's: post-LN, 4H feed-forward."""
        return BertConfig(vocab_size=self.vocab_size, hidden_size=self.n_embd, num_hidden_layers=self.n_layer,
                          num_attention_heads=self.n_head, intermediate_size=4 * self.n_embd,
                          hidden_act=GPT_ACTIVATIONS[self.afn], hidden_dropout_prob=self.resid_pdrop,
                          attention_probs_dropout_prob=self.attn_pdrop, max_position_embeddings=self.n_positions,
                          type_vocab_size=1, layer_norm_eps=self.layer_norm_epsilon,
                          initializer_range=self.initializer_range)


@dataclass
class ELMoConfig(_JsonConfig):
    """ELMo's biLM (Peters et al., 2018): token embeddings of size projection_dim shared by both
    directions, num_layers LSTM layers per direction, each with cell_size memory cells and a
    projection back to projection_dim (the paper: 2 layers, 4096 cells, 512 projections), residual
    connections between layers, and one softmax shared by both directions. There is no Hugging Face
    class for it; config.json and model.safetensors are torchbert's own (model_type "torchbert-elmo")."""

    MODEL_TYPE = "torchbert-elmo"
    REQUIRED = ("vocab_size", "projection_dim", "cell_size", "num_layers")

    vocab_size: int = 30522
    projection_dim: int = 512
    cell_size: int = 4096
    num_layers: int = 2
    dropout: float = 0.1
    max_position_embeddings: int = 512  # LSTMs have no length limit; fine-tuning checks --max-length against it
    initializer_range: float = 0.02
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.cell_size <= self.projection_dim:
            raise ValueError(f"cell_size {self.cell_size} must be larger than projection_dim {self.projection_dim} "
                             "(each LSTM layer projects its cells down)")

    def parameter_estimate(self) -> int:
        """About how many parameters the biLM has (see BertConfig's)."""
        d, c = self.projection_dim, self.cell_size
        return 2 * self.vocab_size * d + 2 * self.num_layers * (4 * c * (2 * d + 2) + c * d)

    @classmethod
    def like(cls, bert: BertConfig) -> ELMoConfig:
        """The biLM with as many non-embedding parameters as a BERT of this shape (within a cell's
        worth): 2 layers as the paper, projections of H/2 and the cell size that matches 12 L H^2."""
        d = bert.hidden_size // 2
        target = bert_body_parameters(bert)
        # per direction and layer: 4 gates x cells x (input d + projected recurrent d) + 2 biases, and the projection
        cells = max(d + 1, round(target / (2 * 2 * (4 * (2 * d + 2) + d))))
        return cls(vocab_size=bert.vocab_size, projection_dim=d, cell_size=cells, num_layers=2,
                   dropout=bert.hidden_dropout_prob, max_position_embeddings=bert.max_position_embeddings,
                   initializer_range=bert.initializer_range)


def bert_body_parameters(config: BertConfig) -> int:
    """BERT's non-embedding parameters: its layers (q, k, v, output, the feed-forward, two LayerNorms)."""
    h, i = config.hidden_size, config.intermediate_size
    return config.num_hidden_layers * (4 * (h * h + h) + 2 * h * i + i + h + 4 * h)


def check_ids(config: BertConfig | GPTConfig | ELMoConfig, input_ids: Tensor, token_type_ids: Tensor | None = None,
              longest: int | None = None) -> None:
    """Name the culprit of an embedding lookup out of range before a batch reaches the model (else an
    opaque index error, or a device assert on a GPU): called where batches are made (the training
    loop on the host, before a batch moves; prediction and `embed` per batch), never in the model's
    forward. token_type_ids are checked for BERT only (GPT and ELMo read no segments); `longest`, the
    longest sequence, against the positions. One host sync when every id is in range."""
    import torch

    limit = config.max_position_embeddings
    if longest is not None and longest > limit:
        raise ValueError(f"sequence of {longest} tokens is longer than max_position_embeddings {limit}; "
                         f"truncate it (tokenizer: truncation=True, max_length={limit})")
    tables = {"input_ids": (input_ids, config.vocab_size, "vocab_size")}
    if config.READS_SEGMENTS and token_type_ids is not None:
        tables["token_type_ids"] = (token_type_ids, config.type_vocab_size, "type_vocab_size")
    ranges = {name: torch.aminmax(ids) for name, (ids, _, _) in tables.items() if ids.numel()}
    if not ranges or not torch.stack([(lo < 0) | (hi >= tables[name][1]) for name, (lo, hi) in ranges.items()]).any():
        return
    for name, (lo, hi) in ranges.items():
        (lo, hi), (_, limit, size) = (int(lo), int(hi)), tables[name]
        if lo < 0 or hi >= limit:
            raise ValueError(f"{name} out of range: values in [{lo}, {hi}] but {size} is {limit}")


# name: (layers L, hidden H, heads A), as in the BERT release (google-research/bert README).
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}
