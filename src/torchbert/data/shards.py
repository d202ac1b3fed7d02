"""Pretraining instances on disk: memory-mapped numpy shards, a deterministic order, exact resume.

A data folder (written by `torchbert prepare`, see data/pretraining.py):

    manifest.json            counts, settings, vocab size and sha256, the shard list
    vocab.txt, tokenizer_config.json, ...   the tokenizer the ids belong to
    shard-00000/             one folder per shard of up to --shard-size instances (n in it)
      tokens.npy             [N] uint16 (int32 for vocabs over 65,536): [CLS] A [SEP] B [SEP], unmasked
      word_starts.npy        [N] bool: the token starts a word (for whole-word masking)
      offsets.npy            [n+1] int64: instance i is tokens[offsets[i]:offsets[i+1]]
      a_len.npy              [n] int32: length of [CLS] A [SEP] (token type 0; the rest are type 1)
      random_next.npy        [n] bool: B is from another document (NotNext, label 1)
      mlm_offsets.npy        static masking only: [n+1] int64 into the three arrays below
      mlm_positions.npy      [M] int16: masked positions within the instance, sorted
      mlm_input_ids.npy      [M]: the token the model sees there ([MASK], random, or the original)

Order: epoch e visits the instances in a permutation drawn from (seed, e).  A global batch of
batch_size * world_size instances is a contiguous slice of it; rank r takes the r-th part.  The
position in an epoch is one integer (global batches done), so resuming needs no RNG state.
Dynamic masking draws its random numbers from (seed, epoch, instance, position) only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..io.texts import read_json
from .masking import mask_instances

if TYPE_CHECKING:  # torch is imported where a batch is made: prepare's workers never load it
    import torch

FORMAT_NAME = "torchbert-pretraining"
FORMAT_VERSION = 1


# ----------------------------------------------------------------------------------------------
# batches


@dataclass
class Batch:
    """B instances packed end to end (N real tokens, no padding) with their MLM and NSP targets."""

    input_ids: torch.Tensor       # [N] int64, masked inputs
    token_type_ids: torch.Tensor  # [N] int64
    cu_seqlens: torch.Tensor      # [B+1] int32, cumulative lengths starting at 0
    max_seqlen: int
    mlm_positions: torch.Tensor   # [M] int64, indices into the N packed tokens
    mlm_labels: torch.Tensor      # [M] int64, the original token ids there
    nsp_labels: torch.Tensor      # [B] int64, 0 = IsNext, 1 = NotNext (Hugging Face's convention)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device) -> "Batch":
        """On `device`; to a GPU without waiting for it (a host-to-device copy from pageable memory
        is staged at once, so the batch may be dropped right after)."""
        t = lambda x: x.to(device, non_blocking=True)  # noqa: E731
        return Batch(t(self.input_ids), t(self.token_type_ids), t(self.cu_seqlens), self.max_seqlen,
                     t(self.mlm_positions), t(self.mlm_labels), t(self.nsp_labels))

    def padded(self, pad_id: int = 0, pad_to: int | None = None) -> dict[str, torch.Tensor]:
        """The padded [B, T] form that transformers.BertForPreTraining takes (labels -100 where unmasked)."""
        import torch

        B = len(self.cu_seqlens) - 1
        T = self.max_seqlen if pad_to is None else pad_to
        if T < self.max_seqlen:
            raise ValueError(f"pad_to={pad_to} is shorter than the longest instance ({self.max_seqlen})")
        device = self.input_ids.device
        cu = self.cu_seqlens.long()
        lengths = cu[1:] - cu[:-1]                                           # [B]
        row = torch.repeat_interleave(torch.arange(B, device=device), lengths)  # [N]
        col = torch.arange(self.num_tokens, device=device) - cu[:-1][row]    # [N]
        input_ids = torch.full((B, T), pad_id, dtype=torch.long, device=device)
        token_type_ids = torch.zeros((B, T), dtype=torch.long, device=device)
        attention_mask = torch.zeros((B, T), dtype=torch.long, device=device)
        labels = torch.full((B, T), -100, dtype=torch.long, device=device)
        input_ids[row, col] = self.input_ids
        token_type_ids[row, col] = self.token_type_ids
        attention_mask[row, col] = 1
        labels[row[self.mlm_positions], col[self.mlm_positions]] = self.mlm_labels
        return {
            "input_ids": input_ids,
            "token_type_ids": token_type_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            "next_sentence_label": self.nsp_labels.clone(),
        }


# ----------------------------------------------------------------------------------------------
# writing


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


class NpyAppender:
    """A 1-D .npy file written a slice at a time: the header is written first and again, with the final
    length, at close (numpy pads a 1-D header to the same 128 bytes whatever the length), so the file
    is byte for byte what np.save writes of the whole array, without the array in memory."""

    def __init__(self, path: Path, dtype) -> None:
        self.dtype, self.n = np.dtype(dtype), 0
        self._file = open(path, "wb")
        self._header()

    def _header(self) -> None:
        from numpy.lib import format as npy

        self._file.seek(0)
        npy.write_array_header_1_0(self._file, {"descr": npy.dtype_to_descr(self.dtype), "fortran_order": False,
                                                "shape": (self.n,)})
        if self._file.tell() != 128:
            raise AssertionError(f"an .npy header of {self._file.tell()} bytes")

    def append(self, array: np.ndarray) -> None:
        self._file.seek(0, os.SEEK_END)
        self._file.write(np.ascontiguousarray(array, dtype=self.dtype).tobytes())
        self.n += len(array)

    def close(self) -> None:
        self._header()
        self._file.close()


# ----------------------------------------------------------------------------------------------
# reading


def vocab_sha256(tokenizer) -> str:
    """sha256 of the vocab as save_pretrained writes vocab.txt: each token and a newline, in id order."""
    text = "".join(t + "\n" for t in tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size)))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _vocab_identity(tokenizer_or_vocab_path) -> tuple[int, str, str]:
    """(size, vocab sha256, a name for messages) of a tokenizer, its folder, or a vocab.txt."""
    if isinstance(tokenizer_or_vocab_path, (str, os.PathLike)):
        from ..io.vocab import read_vocab

        path = Path(tokenizer_or_vocab_path)
        if path.is_dir():
            path = path / "vocab.txt"
        vocab = read_vocab(path)
        text = "".join(t + "\n" for t in sorted(vocab, key=vocab.__getitem__))
        return len(vocab), hashlib.sha256(text.encode("utf-8")).hexdigest(), str(path)
    tok = tokenizer_or_vocab_path
    return tok.vocab_size, vocab_sha256(tok), "the tokenizer"


def _load_array(path: Path) -> np.ndarray:
    """A shard's array, memory-mapped; a missing or damaged file is an error that names it."""
    try:
        return np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"{path}: damaged or missing shard file ({e}); run torchbert prepare again") from None


class PretrainingData:
    """A prepared data folder, read through memory maps; yields packed `Batch`es in a resumable order."""

    def __init__(self, folder, *, seed: int = 0, rank: int = 0, world_size: int = 1, shuffle: bool = True,
                 masked: bool = True):
        self.folder = Path(folder)
        manifest_path = self.folder / "manifest.json"
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{self.folder}: no manifest.json (not a folder written by torchbert prepare)")
        try:
            self.manifest: dict = read_json(manifest_path, dict, "data folder's manifest.json", 64 << 20)
        except ValueError as e:  # too large, not UTF-8, not JSON, not an object
            raise ValueError(f"{e}; run torchbert prepare again") from None
        if self.manifest.get("format") != FORMAT_NAME or self.manifest.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{manifest_path}: not a {FORMAT_NAME} v{FORMAT_VERSION} manifest")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.seed, self.rank, self.world_size, self.shuffle = seed, rank, world_size, shuffle
        self.masked = masked  # False: the instances as text, no MLM targets (a left-to-right LM reads them)
        settings = self.manifest.get("settings")
        for name, value, high in (("vocab_size", self.manifest.get("vocab_size"), 1 << 24),
                                  ("settings.max_seq_len", (settings or {}).get("max_seq_len"), 1 << 20)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
                raise ValueError(f"{manifest_path}: {name} must be a whole number in [1, {high}], got {value!r}; "
                                 "run torchbert prepare again")
        self.vocab_size: int = self.manifest["vocab_size"]
        self.max_seq_len: int = settings["max_seq_len"]
        self.dynamic = settings["masking"] == "dynamic"
        self._shards = []
        for entry in self.manifest["shards"]:
            d = self.folder / entry["name"]
            names = ["tokens", "word_starts", "offsets", "a_len", "random_next"]
            if not self.dynamic:
                names += ["mlm_offsets", "mlm_positions", "mlm_input_ids"]
            self._shards.append({n: _load_array(d / f"{n}.npy") for n in names})
        counts = [len(s["a_len"]) for s in self._shards]
        self._shard_starts = np.r_[0, np.cumsum(counts)].astype(np.int64)
        ids = self.manifest["special_ids"]
        self._special_ids = ids["all"]
        self._never_mask = [ids["cls"], ids["sep"], ids["pad"]]
        self._mask_id = ids["mask"]

    def __len__(self) -> int:
        return int(self._shard_starts[-1])

    def batches_per_epoch(self, batch_size: int) -> int:
        return len(self) // (batch_size * self.world_size)

    def order(self, epoch: int) -> np.ndarray:
        """[n] the epoch's visiting order: a permutation from (seed, epoch), or 0..n-1 without shuffle.
        Held in int32 below 2**31 instances (4 bytes an instance: 105 MB for the 26M instances of 1 GB
        of corpus), the same order that `Generator.permutation` gives in int64."""
        n = len(self)
        order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
        if self.shuffle:
            np.random.default_rng([self.seed, epoch]).shuffle(order)
        return order

    def batches(self, batch_size: int, *, epoch: int = 0, start: int = 0) -> Iterator[Batch]:
        """This rank's batches of `epoch`, from global batch `start` on (the last partial one dropped)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        order = self.order(epoch)
        global_size = batch_size * self.world_size
        for g in range(start, self.batches_per_epoch(batch_size)):
            first = g * global_size + self.rank * batch_size
            yield self.batch(order[first:first + batch_size], epoch=epoch)

    def token_arrays(self, limit: int | None = None) -> Iterator[np.ndarray]:
        """Each shard's unmasked tokens [N], its instances end to end ([CLS] ... [SEP] each); with
        `limit`, the first `limit` tokens in all (the last array cut)."""
        left = limit
        for shard in self._shards:
            if left is not None and left <= 0:
                return
            tokens = shard["tokens"] if left is None else shard["tokens"][:left]
            yield np.asarray(tokens, dtype=np.int64)
            left = None if left is None else left - len(tokens)

    def instance(self, index: int) -> dict[str, np.ndarray]:
        """One stored instance, unmasked: tokens, word_starts, a_len, random_next (and static MLM)."""
        s = int(np.searchsorted(self._shard_starts, index, side="right") - 1)
        if not 0 <= index < len(self):
            raise IndexError(f"instance {index} out of range for {len(self)} instances")
        shard, i = self._shards[s], index - int(self._shard_starts[s])
        o0, o1 = int(shard["offsets"][i]), int(shard["offsets"][i + 1])
        out = {
            "tokens": np.asarray(shard["tokens"][o0:o1], dtype=np.int64),
            "word_starts": np.asarray(shard["word_starts"][o0:o1]),
            "a_len": int(shard["a_len"][i]),
            "random_next": bool(shard["random_next"][i]),
        }
        if not self.dynamic:
            m0, m1 = int(shard["mlm_offsets"][i]), int(shard["mlm_offsets"][i + 1])
            out["mlm_positions"] = np.asarray(shard["mlm_positions"][m0:m1], dtype=np.int64)
            out["mlm_input_ids"] = np.asarray(shard["mlm_input_ids"][m0:m1], dtype=np.int64)
        return out

    def batch(self, indices, *, epoch: int = 0) -> Batch:
        """The packed, masked batch of these instances (dynamic masks are those of `epoch`)."""
        return self.assemble([self.instance(int(i)) for i in indices], indices, epoch=epoch)

    def assemble(self, items: list[dict], keys, *, epoch: int = 0) -> Batch:
        """The packed, masked batch of these instances (`instance`'s dicts); a dynamic mask is drawn
        from (seed, epoch, key) for each, the key being the instance's index (or a blend's)."""
        import torch

        lengths = np.array([len(it["tokens"]) for it in items], dtype=np.int64)
        cu = np.r_[0, np.cumsum(lengths)]
        tokens = np.concatenate([it["tokens"] for it in items])                    # [N]
        pos = np.arange(len(tokens)) - np.repeat(cu[:-1], lengths)                 # [N]
        a_len = np.array([it["a_len"] for it in items], dtype=np.int64)
        token_types = (pos >= np.repeat(a_len, lengths)).astype(np.int64)          # [N]
        if not self.masked:
            m_positions = m_inputs = np.zeros(0, dtype=np.int64)
        elif self.dynamic:
            settings = self.manifest["settings"]
            m = mask_instances(
                tokens, np.concatenate([it["word_starts"] for it in items]), cu, np.asarray(keys, dtype=np.int64),
                special_ids=self._special_ids, never_mask=self._never_mask, mask_id=self._mask_id,
                vocab_size=self.vocab_size, seed=self.seed, epoch=epoch,
                masked_lm_prob=settings["masked_lm_prob"], max_predictions=settings["max_predictions"],
                whole_word=settings["whole_word"], replace=tuple(settings.get("mask_replace", (0.8, 0.1))),
            )
            m_positions = m.positions + np.repeat(cu[:-1], np.diff(m.offsets))
            m_inputs = m.input_ids.astype(np.int64)
        else:
            counts = [len(it["mlm_positions"]) for it in items]
            m_positions = np.concatenate([it["mlm_positions"] for it in items]) + np.repeat(cu[:-1], counts)
            m_inputs = np.concatenate([it["mlm_input_ids"] for it in items])
        labels = tokens[m_positions]
        inputs = tokens.copy()
        inputs[m_positions] = m_inputs
        return Batch(
            input_ids=torch.from_numpy(inputs),
            token_type_ids=torch.from_numpy(token_types),
            cu_seqlens=torch.from_numpy(cu.astype(np.int32)),
            max_seqlen=int(lengths.max()) if len(lengths) else 0,
            mlm_positions=torch.from_numpy(m_positions.astype(np.int64)),
            mlm_labels=torch.from_numpy(labels.astype(np.int64)),
            nsp_labels=torch.tensor([int(it["random_next"]) for it in items], dtype=torch.long),
        )

    def check_vocab(self, tokenizer_or_vocab_path) -> None:
        """Raise ValueError naming both sides when the data's vocab is not this tokenizer's."""
        size, digest, name = _vocab_identity(tokenizer_or_vocab_path)
        want_size, want_digest = self.vocab_size, self.manifest["vocab_sha256"]
        if size != want_size or digest != want_digest:
            raise ValueError(
                f"vocab mismatch: {self.folder} was prepared with a vocab of {want_size} tokens "
                f"(sha256 {want_digest[:12]}), but {name} has {size} tokens (sha256 {digest[:12]})"
            )
