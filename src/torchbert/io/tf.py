"""Google's TensorFlow checkpoints, read without TensorFlow: BERT's original releases (BERT-Base
Chinese, multilingual, the small BERTs, whole-word-masking variants, and the many Chinese BERTs
published the same way) become a Hugging Face folder that every torchbert command and transformers
read.

A checkpoint `PREFIX` (for example `bert_model.ckpt`) is TensorFlow's tensor bundle:
  PREFIX.index                    a table of entries, one per tensor, sorted by name
  PREFIX.data-00000-of-0000N      the tensors' raw bytes, little-endian, row-major
The index is a LevelDB-format table: blocks of prefix-compressed key/value entries, each block
followed by a compression byte and the masked CRC-32C of both; a footer at the end of the file (48
bytes, ending in a magic number) points at the index block, whose entries point at the data blocks.
The entry of the empty key is the bundle's header (protocol buffer BundleHeaderProto: shard count,
endianness); every other key is a tensor's name, its value a BundleEntryProto: dtype, shape, shard,
offset, size and the masked CRC-32C of the tensor's bytes. Every checksum is verified.

Google's variable names map onto transformers' BertForPreTraining names (TF's dense kernels are
[in, out], transposed here); Adam's slots (`adam_m`, `adam_v`) and the step counters are skipped,
and any other name is an error. An ELECTRA checkpoint (`electra/...`) gives its discriminator's
encoder, which is BERT's (the generator and both heads are left out); Google released ELECTRA
without a config, so its sizes are read from the tensors' shapes.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .texts import json_loads

MAGIC = 0xDB4775248B80FB57  # the table footer's last 8 bytes
FOOTER = 48
DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8, 9: np.int64,
          10: np.bool_, 17: np.uint16, 19: np.float16, 22: np.uint32, 23: np.uint64}
BFLOAT16 = 14  # read as float32: its 16 bits are the top half of one


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as it is: the message names the file (and the tensor)."""


def _masked_crc(data: bytes) -> int:
    """The CRC-32C of data, masked as LevelDB and TensorFlow store it (rotated right by 15, plus a constant)."""
    import google_crc32c

    crc = google_crc32c.value(bytes(data))
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(buf: bytes, pos: int, where: str) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise CheckpointError(f"{where}: a number runs past its record")
        b = buf[pos]
        value |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes, where: str) -> list[tuple[int, int | bytes]]:
    """A protocol buffer message as (field number, value): varints and fixed ints as ints, the rest bytes."""
    out, pos = [], 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos, where)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos, where)
        elif wire == 1:
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos, where)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        else:
            raise CheckpointError(f"{where}: not a protocol buffer (wire type {wire})")
        if pos > len(buf):
            raise CheckpointError(f"{where}: a field runs past its record")
        out.append((number, value))
    return out


@dataclass(frozen=True)
class Entry:
    """Where a tensor's bytes are, and what they are."""

    name: str
    dtype: int  # TensorFlow's DataType number
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc: int | None  # the masked CRC-32C of the bytes, when the index carries one


def _entry(name: str, value: bytes, where: str) -> Entry:
    f = dict(_fields(value, where))
    if 7 in f:
        raise CheckpointError(f"{where}: {name} is saved in slices (a partitioned variable), which is not read here")
    shape: list[int] = []
    for number, dim in _fields(f.get(2, b""), where):
        if number == 3 and dim:
            raise CheckpointError(f"{where}: {name} has an unknown rank")
        if number == 2:
            size = dict(_fields(dim, where)).get(1, 0)
            shape.append(size - (1 << 64) if size >= 1 << 63 else size)
            if len(shape) > MAX_RANK:
                raise CheckpointError(f"{where}: {name[:100]} has more than {MAX_RANK} dimensions; the index is "
                                      "damaged (a BERT or ELECTRA checkpoint's tensors have at most 2)")
    return Entry(name, f.get(1, 0), tuple(shape), f.get(3, 0), f.get(4, 0), f.get(5, 0), f.get(6))


MAX_SHARDS = 1 << 16
MAX_RANK = 8


class TFCheckpoint:
    """A TensorFlow checkpoint's tensors by name (`names`, `shape`, `tensor`), read from its files."""

    def __init__(self, path: str | Path):
        self.prefix = checkpoint_prefix(Path(path))
        self.index = Path(f"{self.prefix}.index")
        data = self.index.read_bytes()
        where = str(self.index)
        if len(data) < FOOTER or int.from_bytes(data[-8:], "little") != MAGIC:
            raise CheckpointError(f"{where}: not a TensorFlow checkpoint index (no table footer; truncated?)")
        footer = data[-FOOTER:]
        _, pos = _varint(footer, 0, where)  # the metaindex block: empty in a bundle
        _, pos = _varint(footer, pos, where)
        offset, pos = _varint(footer, pos, where)
        size, _ = _varint(footer, pos, where)
        self.entries: dict[str, Entry] = {}
        header = None
        for _, handle in self._records(data, offset, size, "the index block"):
            block_offset, pos = _varint(handle, 0, where)
            block_size, _ = _varint(handle, pos, where)
            for key, value in self._records(data, block_offset, block_size, f"the block at byte {block_offset}"):
                name = key.decode("utf-8", "replace")
                if not key:
                    header = dict(_fields(value, where))
                else:
                    self.entries[name] = _entry(name, value, f"{where}: {name}")
        if header is None:
            raise CheckpointError(f"{where}: the bundle has no header entry")
        if header.get(2, 0) != 0:
            raise CheckpointError(f"{where}: the tensors are big-endian, which is not read here")
        self.shards = header.get(1, 1)
        if not 1 <= self.shards <= MAX_SHARDS:  # a crafted header: 2^40 shards were looked for for ever
            raise CheckpointError(f"{where}: the header claims {self.shards} data shards (at most {MAX_SHARDS:,} are "
                                  "read); the index is damaged or not a TensorFlow checkpoint's")
        missing = [self.shard_file(k) for k in range(self.shards) if not self.shard_file(k).is_file()]
        if missing:
            raise CheckpointError(f"{missing[0]}: missing, a data shard of {self.prefix}")

    def _records(self, data: bytes, offset: int, size: int, what: str):
        """The key/value entries of the block at `offset`, its checksum and compression checked."""
        where = f"{self.index}: {what}"
        if offset + size + 5 > len(data) - FOOTER:
            raise CheckpointError(f"{where}: runs past the end of the file (truncated?)")
        block, kind = data[offset:offset + size], data[offset + size]
        if _masked_crc(data[offset:offset + size + 1]) != int.from_bytes(data[offset + size + 1:offset + size + 5],
                                                                           "little"):
            raise CheckpointError(f"{where}: checksum mismatch (the index file is damaged)")
        if kind != 0:
            raise CheckpointError(f"{where}: compressed (type {kind}); TensorFlow writes bundle indexes uncompressed")
        if len(block) < 4:
            raise CheckpointError(f"{where}: too short to be a block")
        restarts = int.from_bytes(block[-4:], "little")
        limit = len(block) - 4 * (restarts + 1)
        if limit < 0:
            raise CheckpointError(f"{where}: not a table block")
        pos, key = 0, b""
        while pos < limit:
            shared, pos = _varint(block, pos, where)
            fresh, pos = _varint(block, pos, where)
            length, pos = _varint(block, pos, where)
            if shared > len(key) or pos + fresh + length > limit:
                raise CheckpointError(f"{where}: an entry runs past its block")
            key = key[:shared] + block[pos:pos + fresh]
            pos += fresh
            yield key, block[pos:pos + length]
            pos += length

    def shard_file(self, k: int) -> Path:
        return Path(f"{self.prefix}.data-{k:05d}-of-{self.shards:05d}")

    def names(self) -> list[str]:
        return sorted(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].shape

    def raw(self, name: str) -> bytes:
        """The tensor's bytes, their checksum verified."""
        e = self.entries[name]
        if not 0 <= e.shard < self.shards:
            raise CheckpointError(f"{self.index}: {name} is in shard {e.shard}, but the bundle has {self.shards}")
        file = self.shard_file(e.shard)
        where = f"{file}: {name}"
        length = os.path.getsize(file)
        if e.offset < 0 or e.size < 0 or e.offset + e.size > length:  # before reading (2^50 bytes were asked for)
            raise CheckpointError(f"{where}: the shard ends before the tensor does (truncated?) (or the index is "
                                  f"damaged: it places {e.size:,} bytes at byte {e.offset:,} of a shard of {length:,})")
        with open(file, "rb") as f:
            f.seek(e.offset)
            raw = f.read(e.size)
        if len(raw) != e.size:
            raise CheckpointError(f"{where}: the shard ends before the tensor does (truncated?)")
        if e.crc is not None and _masked_crc(raw) != e.crc:
            raise CheckpointError(f"{where}: checksum mismatch (the data file is damaged)")
        return raw

    def tensor(self, name: str) -> np.ndarray:
        """The tensor's values, its checksum verified."""
        e = self.entries[name]
        where = f"{self.shard_file(e.shard)}: {name}"
        if e.dtype not in DTYPES and e.dtype != BFLOAT16:
            raise CheckpointError(f"{where}: TensorFlow dtype {e.dtype} is not read here")
        itemsize = 2 if e.dtype == BFLOAT16 else np.dtype(DTYPES[e.dtype]).itemsize
        if any(d < 0 for d in e.shape) or math.prod(e.shape) * itemsize != e.size:
            raise CheckpointError(f"{where}: shape {list(e.shape)} of {itemsize}-byte values does not fit the "
                                  f"{e.size:,} bytes the index gives it; the index is damaged")
        raw = self.raw(name)
        if e.dtype == BFLOAT16:
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            values = np.frombuffer(raw, dtype=np.dtype(DTYPES[e.dtype]).newbyteorder("<"))
        count = int(np.prod(e.shape)) if e.shape else 1
        if values.size != count:
            raise CheckpointError(f"{where}: {values.size} values for shape {list(e.shape)}")
        return values.reshape(e.shape).copy()


def checkpoint_prefix(path: Path) -> Path:
    """The checkpoint's prefix from a prefix, its .index file, or a folder holding exactly one checkpoint."""
    if path.is_dir():
        found = sorted(path.glob("*.index"))
        if len(found) != 1:
            raise CheckpointError(f"{path}: {'no' if not found else len(found)} checkpoint index files (*.index) in "
                                  "this folder; give the checkpoint's prefix, such as DIR/bert_model.ckpt")
        path = found[0]
    if path.name.endswith(".index"):
        path = path.with_name(path.name.removesuffix(".index"))
    if not Path(f"{path}.index").is_file():
        raise CheckpointError(f"{path}: no checkpoint here (expected {path}.index beside its data shards)")
    return path


# -- Google's BERT names -> transformers' BertForPreTraining names -------------------------------------

SKIPPED = re.compile(r"(^|/)(adam_m|adam_v)$|^(global_step|good_steps|bad_steps|loss_scale|current_loss_scale)$")
_LAYER = {"attention/self/query": "attention.self.query", "attention/self/key": "attention.self.key",
          "attention/self/value": "attention.self.value", "attention/output/dense": "attention.output.dense",
          "attention/output/LayerNorm": "attention.output.LayerNorm", "intermediate/dense": "intermediate.dense",
          "output/dense": "output.dense", "output/LayerNorm": "output.LayerNorm"}
_FIXED = {"bert/embeddings/word_embeddings": "bert.embeddings.word_embeddings.weight",
          "bert/embeddings/position_embeddings": "bert.embeddings.position_embeddings.weight",
          "bert/embeddings/token_type_embeddings": "bert.embeddings.token_type_embeddings.weight",
          "bert/embeddings/LayerNorm": "bert.embeddings.LayerNorm",
          "bert/pooler/dense": "bert.pooler.dense",
          "cls/predictions/transform/dense": "cls.predictions.transform.dense",
          "cls/predictions/transform/LayerNorm": "cls.predictions.transform.LayerNorm",
          "cls/predictions/output_bias": "cls.predictions.bias",
          "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
          "cls/seq_relationship/output_bias": "cls.seq_relationship.bias"}
_LEAF = {"kernel": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}


def hf_name(name: str) -> tuple[str, bool] | None:
    """(transformers' name, whether TF's tensor is transposed) of a Google BERT variable; None for a
    variable that is skipped (optimizer slots, step counters). KeyError for one BERT does not have."""
    if SKIPPED.search(name):
        return None
    if name in _FIXED:
        return _FIXED[name], False
    scope, _, leaf = name.rpartition("/")
    m = re.fullmatch(r"bert/encoder/layer_(\d+)/(.+)", scope)
    if m and m[2] in _LAYER and leaf in _LEAF:
        return f"bert.encoder.layer.{m[1]}.{_LAYER[m[2]]}.{_LEAF[leaf]}", leaf == "kernel"
    if scope in _FIXED and leaf in _LEAF:
        return f"{_FIXED[scope]}.{_LEAF[leaf]}", leaf == "kernel"
    raise KeyError(name)


# ELECTRA (Clark et al., 2020): the discriminator is BERT's encoder under `electra/`; the generator and
# both prediction heads are left out (what fine-tuning reads is the encoder)
ELECTRA_LEFT_OUT = re.compile(r"^(generator|generator_predictions|discriminator_predictions)/|^temperature$")


def is_electra(checkpoint: TFCheckpoint) -> bool:
    return any(n.startswith("electra/") for n in checkpoint.entries)


def electra_name(name: str) -> tuple[str, bool] | None:
    """(transformers' BertModel name, transposed) of an ELECTRA variable, None for one left out; KeyError."""
    if SKIPPED.search(name) or ELECTRA_LEFT_OUT.search(name):
        return None
    if name.startswith("electra/embeddings_project/"):
        raise KeyError(name)  # a projection BERT does not have (said in read_encoder)
    target = hf_name("bert/" + name.removeprefix("electra/")) if name.startswith("electra/") else None
    if target is None or not target[0].startswith("bert.") or target[0].startswith("bert.pooler."):
        raise KeyError(name)
    return target[0].removeprefix("bert."), target[1]


def read_encoder(checkpoint: TFCheckpoint) -> dict[str, "np.ndarray"]:
    """transformers-named tensors of a Google BERT checkpoint (BertForPreTraining names) or of an ELECTRA
    one (its discriminator's encoder, BertModel names); kernels transposed to [out, in]."""
    electra = is_electra(checkpoint)
    if electra and "electra/embeddings_project/kernel" in checkpoint.entries:
        e, h = checkpoint.shape("electra/embeddings_project/kernel")
        raise CheckpointError(f"{checkpoint.index}: this ELECTRA projects its {e}-wide embeddings to its hidden size "
                              f"{h} (electra/embeddings_project, as ELECTRA-Small does); torchbert's BERT has no such "
                              "projection, so it cannot hold this model")
    state = {}
    for name in checkpoint.names():
        try:
            target = electra_name(name) if electra else hf_name(name)
        except KeyError:
            kind = ("an ELECTRA discriminator's encoder (electra/...; the generator and heads are left out)" if electra
                    else "a Google BERT checkpoint (BERT's embeddings, encoder layers, pooler and cls heads)")
            raise CheckpointError(f"{checkpoint.index}: variable {name} is not part of {kind}; Adam's slots are "
                                  "skipped") from None
        if target is None:  # left out, but its checksum is verified all the same: a damaged file is said
            checkpoint.raw(name)
            continue
        value = checkpoint.tensor(name)
        state[target[0]] = value.T if target[1] else value
    return state


def electra_config(checkpoint: TFCheckpoint) -> dict:
    """A BERT config for an ELECTRA checkpoint, which Google released without one: sizes from the tensors'
    shapes, and ELECTRA's 64-wide attention heads (small 4, base 12, large 16)."""
    def shape(name):
        if name not in checkpoint.entries:
            raise CheckpointError(f"{checkpoint.index}: no variable {name}; give the model's sizes with --config")
        return checkpoint.shape(name)

    vocab, hidden = shape("electra/embeddings/word_embeddings")
    layers = {int(m[1]) for n in checkpoint.entries if (m := re.match(r"electra/encoder/layer_(\d+)/", n))}
    return {"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": len(layers),
            "num_attention_heads": max(1, hidden // 64),
            "intermediate_size": shape("electra/encoder/layer_0/intermediate/dense/kernel")[1],
            "max_position_embeddings": shape("electra/embeddings/position_embeddings")[0],
            "type_vocab_size": shape("electra/embeddings/token_type_embeddings")[0], "hidden_act": "gelu"}


def guess_lowercase(vocab: dict[str, int]) -> bool:
    """Whether a vocabulary was made from lowercased text: an uncased BERT's vocab.txt holds (nearly) no
    word with a capital letter, a cased one thousands. Special tokens ([CLS], [unused0]) do not count."""
    words = [t.removeprefix("##") for t in vocab if not (t.startswith("[") and t.endswith("]"))]
    capital = sum(1 for w in words if any("A" <= c <= "Z" for c in w))
    return capital <= max(10, len(words) // 1000)


def bert_config_dict(path: Path) -> dict:
    """bert_config.json as a dict of transformers' BertConfig fields (Google's names are the same)."""
    try:
        d = json_loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a readable bert_config.json ({e})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return d
