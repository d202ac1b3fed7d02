"""BERT's WordPiece tokenizer, wired from the pieces of the Rust `tokenizers` library.

BERT's pipeline, step by step:

1. Normalize (`BertNormalizer`): drop control characters and NUL/U+FFFD, turn every kind of
   whitespace into a plain space; optionally lowercase and strip accents (NFD, then drop the
   combining marks); put spaces around every CJK ideograph so each becomes its own word.
2. Pre-tokenize (`BertPreTokenizer`): split on whitespace and split off every punctuation
   character as a word of its own.
3. WordPiece: for each word, greedy longest-match-first against the vocabulary; pieces after the
   first carry the `##` prefix.  A word longer than 100 characters, or one that cannot be covered
   by vocabulary pieces, becomes a single `[UNK]`.
4. Post-process: `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]` with token type ids 0 for the first
   segment and 1 for the second.

`BertTokenizer` is a small, readable wrapper around that Rust pipeline (`.backend`) with the
Hugging Face call conventions that the rest of torchbert uses: `tok(text, text_pair, truncation=...,
padding=..., return_tensors=...)` returns a dict of `input_ids`, `token_type_ids` and
`attention_mask`.  Folders written by `save_pretrained` load in `transformers` and vice versa.

Known difference from `transformers` 4.x: its `decode` also ran `clean_up_tokenization` over the
text by default (so `don ' t` became `don't`); `transformers` 5 does not, and neither do we.  Our
`decode` is the WordPiece decoder's own output, which matches `transformers` 5 exactly.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Encoding, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from tokenizers.trainers import WordPieceTrainer

from torchbert.io.files import atomic_write_text
from torchbert.io.texts import CONFIG_BYTES, read_json
from torchbert.io.vocab import (CLS, MASK, PAD, SEP, SPECIAL_TOKENS, UNK, check_against_model, check_special_tokens,
                                 check_vocab, read_tokenizer_config, read_tokenizer_json, read_vocab, tokenizer_json_bytes)

MAX_VOCAB = 1 << 20  # the trainer preallocates for vocab_size: 10^9 aborts the process (issue 46)
# The trainer holds a line whole, and its word counting costs about 170 bytes per byte of one long
# line (a 50 MB line peaked at 8.6 GB): lines longer than this reach it in pieces cut at a space.
MAX_LINE = 1 << 16


def _is_cjk(ch: str) -> bool:
    """A character BERT's tokenizer makes a word of its own (the CJK blocks of BasicTokenizer)."""
    cp = ord(ch)
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


def _bounded_lines(path: Path, spare: Path) -> Path:
    """`path`, or when one of its lines is longer than MAX_LINE bytes, a copy at `spare` with such lines
    cut into pieces at a space (or a tab; at a character boundary where a piece has none). A word is cut
    only where MAX_LINE bytes hold no space (Chinese text, where every character is a word anyway)."""
    with open(path, "rb") as f:
        if all(len(line) <= MAX_LINE for line in iter(lambda: f.readline(MAX_LINE + 1), b"")):
            return path
    with open(path, "rb") as f, open(spare, "wb") as out:
        for line in iter(lambda: f.readline(MAX_LINE + 1), b""):
            while len(line) > MAX_LINE:
                cut = max(line.rfind(b" ", 0, MAX_LINE), line.rfind(b"\t", 0, MAX_LINE))
                if cut <= 0:
                    cut = MAX_LINE
                    while cut > 0 and line[cut] & 0xC0 == 0x80:  # not inside a UTF-8 character
                        cut -= 1
                out.write(line[:cut] + b"\n")
                line = line[cut:].lstrip(b" \t")
            out.write(line)
    return spare
MAX_INPUT_CHARS_PER_WORD = 100
TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json")  # save_pretrained's
DEFAULT_MODEL_MAX_LENGTH = 512

CHUNK = 256  # inputs encoded at a time (see BertTokenizer._encode_chunks)
_PADDING = {False: None, "do_not_pad": None, True: "longest", "longest": "longest", "max_length": "max_length"}
_TRUNCATION = {False: None, "do_not_truncate": None, True: "longest_first", "longest_first": "longest_first",
               "only_first": "only_first", "only_second": "only_second"}


class BatchEncoding(dict):
    """What the tokenizer returns: a plain dict of model inputs.

    `encodings` is None: the Rust `tokenizers.Encoding` objects behind it are let go as they are read
    (a truncated one holds every window cut off it; see `BertTokenizer._encode_chunks`).
    """

    def __init__(self, data: dict[str, Any], encodings: list[Encoding] | None = None):
        super().__init__(data)
        self.encodings = encodings

    def to(self, device) -> "BatchEncoding":
        """Move the tensors to `device` (other values are kept as they are)."""
        import torch

        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.items()}
        return BatchEncoding(moved, self.encodings)


# ----------------------------------------------------------------------------------------------


def _most_frequent_chars(paths: Sequence[Path], backend: Tokenizer, limit: int) -> list[str]:
    """The `limit` most frequent characters of the files as the trainer counts them (after the
    normalizer, whitespace aside), ties to the lower code point; sorted."""
    from collections import Counter

    counts: Counter[str] = Counter()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                counts.update(backend.normalizer.normalize_str(line))
    ranked = sorted((c for c in counts if not c.isspace()), key=lambda c: (-counts[c], c))
    return sorted(ranked[:limit])


def _build_backend(
    vocab: dict[str, int] | None, lowercase: bool, strip_accents: bool | None, tokenize_chinese_chars: bool
) -> Tokenizer:
    """The Rust pipeline without a post-processor (added once the special token ids are known)."""
    model = WordPiece(
        vocab if vocab is not None else {},
        unk_token=UNK,
        max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD,
        continuing_subword_prefix="##",
    )
    backend = Tokenizer(model)
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=tokenize_chinese_chars, strip_accents=strip_accents, lowercase=lowercase
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    return backend


class BertTokenizer:
    """BERT's WordPiece tokenizer (uncased by default), backed by the Rust `tokenizers` library."""

    def __init__(
        self,
        vocab: dict[str, int],
        *,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
    ):
        if not isinstance(vocab, dict):
            raise TypeError(f"vocab must be a dict of token -> id, got {type(vocab).__name__}")
        if not isinstance(model_max_length, int) or isinstance(model_max_length, bool) or model_max_length < 1:
            raise ValueError(f"model_max_length must be a positive int, got {model_max_length!r}")
        check_vocab(vocab, where="vocab")
        self.vocab: dict[str, int] = dict(vocab)
        self.lowercase = bool(lowercase)
        self.strip_accents = strip_accents  # None: strip accents iff lowercasing (as BERT does)
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self.model_max_length = model_max_length
        self._ids_to_tokens = sorted(self.vocab, key=self.vocab.__getitem__)

        self.backend: Tokenizer = _build_backend(self.vocab, self.lowercase, strip_accents, self.tokenize_chinese_chars)
        # Special tokens are matched in the raw text before normalization, never split, and
        # dropped by decode(skip_special_tokens=True): exactly how transformers registers them.
        self.backend.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS if t in self.vocab]
        )
        self.backend.post_processor = processors.TemplateProcessing(
            single=f"{CLS}:0 $A:0 {SEP}:0",
            pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
            special_tokens=[(CLS, self.cls_token_id), (SEP, self.sep_token_id)],
        )
        # Truncation and padding are set on the shared backend for one call at a time.
        self._lock = threading.Lock()

    # -- special tokens and vocab --------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def pad_token_id(self) -> int:
        return self.vocab[PAD]

    @property
    def unk_token_id(self) -> int:
        return self.vocab[UNK]

    @property
    def cls_token_id(self) -> int:
        return self.vocab[CLS]

    @property
    def sep_token_id(self) -> int:
        return self.vocab[SEP]

    @property
    def mask_token_id(self) -> int | None:
        return self.vocab.get(MASK)

    @property
    def all_special_ids(self) -> list[int]:
        return [self.vocab[t] for t in SPECIAL_TOKENS if t in self.vocab]

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        """Token(s) to id(s); a token not in the vocab gives the [UNK] id."""
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        return [self.vocab.get(t, self.unk_token_id) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> str | list[str]:
        ids = _to_python(ids)
        if isinstance(ids, int):
            return self._id_to_token(ids)
        return [self._id_to_token(i) for i in ids]

    def _id_to_token(self, i: int) -> str:
        if not 0 <= i < len(self._ids_to_tokens):
            raise IndexError(f"token id {i} is out of range for a vocab of {len(self._ids_to_tokens)}")
        return self._ids_to_tokens[i]

    # -- loading and saving ----------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "BertTokenizer":
        """Load from a folder holding vocab.txt (or from a vocab.txt itself).

        A tokenizer_config.json next to the vocab sets do_lower_case, strip_accents,
        tokenize_chinese_chars and model_max_length; without one, BERT's uncased defaults apply.
        """
        path = Path(path)
        check_special_tokens(path if path.is_dir() else path.parent)  # BERT's, as the tokenizer uses them
        if path.is_dir() and not (path / "vocab.txt").is_file() and (path / "tokenizer.json").is_file():
            return cls._from_tokenizer_json(path)
        if path.is_dir():
            vocab_path = path / "vocab.txt"
            if not vocab_path.is_file():
                raise FileNotFoundError(f"{path}: no vocab.txt (or tokenizer.json) in this folder")
        elif path.is_file():
            vocab_path = path
        else:
            raise FileNotFoundError(f"{path}: no vocab.txt (no such file or folder)")
        check_against_model(vocab_path)
        vocab = read_vocab(vocab_path)
        config_path = vocab_path.parent / "tokenizer_config.json"
        settings = read_tokenizer_config(config_path) if config_path.is_file() else {}
        return cls(vocab, **settings)

    @classmethod
    def _from_tokenizer_json(cls, path: Path) -> "BertTokenizer":
        """A folder with a BERT tokenizer.json and no vocab.txt (transformers 5 writes only the former).

        The vocabulary is tokenizer.json's; the casing, accents and CJK settings are tokenizer_config.json's,
        BERT's defaults where it is silent, as transformers (4 and 5) reads such a folder: it rebuilds the
        normalizer from those settings, whatever tokenizer.json's says. Where the two disagree, a warning."""
        config = path / "config.json"
        try:
            size = read_json(config, dict, "config.json", CONFIG_BYTES).get("vocab_size") if config.is_file() else None
        except (OSError, ValueError):
            size = None  # the model's loading says what is wrong with it
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            size = None
        # the model's vocab_size bounds the file: one far too large is refused before it is parsed
        vocab, in_file = read_tokenizer_json(path / "tokenizer.json", tokenizer_json_bytes(size))
        if size is not None and len(vocab) > size:
            raise ValueError(f"{path / 'tokenizer.json'}: {len(vocab):,} tokens, more than the {size:,} of {config}'s "
                             "vocab_size; the vocabulary does not belong to this model")
        given = read_tokenizer_config(path / "tokenizer_config.json") if (path / "tokenizer_config.json").is_file() \
            else {}
        settings = {"lowercase": True, "strip_accents": None, "tokenize_chinese_chars": True, **given}
        differ = [f"{k} {in_file[k]} there, {settings[k]} here" for k in in_file if in_file[k] != settings[k]]
        if differ:
            warnings.warn(f"{path / 'tokenizer.json'}: its normalizer disagrees with tokenizer_config.json (or BERT's "
                          f"defaults where that is silent): {'; '.join(differ)}; following tokenizer_config.json, as "
                          "transformers does", stacklevel=3)
        return cls(vocab, **settings)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write vocab.txt, tokenizer_config.json, special_tokens_map.json and tokenizer.json.

        The folder loads with `BertTokenizer.from_pretrained` and with transformers'
        `AutoTokenizer` / `BertTokenizerFast`.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        specials = {"unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS,
                    **({"mask_token": MASK} if MASK in self.vocab else {})}
        config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self.lowercase,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "do_basic_tokenize": True,
            "never_split": None,
            "model_max_length": self.model_max_length,
            # Our decode() is the WordPiece decoder's output alone; say so for transformers 4.x too.
            "clean_up_tokenization_spaces": False,
            **specials,
        }
        atomic_write_text(path / "vocab.txt", "".join(t + "\n" for t in self._ids_to_tokens))
        atomic_write_text(path / "tokenizer_config.json", json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        atomic_write_text(path / "special_tokens_map.json", json.dumps(specials, indent=2) + "\n")
        atomic_write_text(path / "tokenizer.json", self.backend.to_str())

    @classmethod
    def train(
        cls,
        files: Sequence[str | os.PathLike],
        vocab_size: int = 30522,
        *,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        min_frequency: int = 2,
        limit_alphabet: int = 10000,
        show_progress: bool = True,
    ) -> "BertTokenizer":
        """Learn a WordPiece vocab from text files; [PAD] [UNK] [CLS] [SEP] [MASK] get ids 0..4.

        `limit_alphabet` caps how many distinct characters are kept (the most frequent); the default
        of 10,000 holds the characters of everyday Chinese, which run to thousands. The same files
        give the same vocabulary every time (tokenizers' trainer alone does not: see below); it
        trains twice for that. A line over MAX_LINE bytes is cut in a copy in a temporary folder.
        """
        if not len(SPECIAL_TOKENS) + 1 <= vocab_size <= MAX_VOCAB:
            raise ValueError(f"vocab_size must be in [{len(SPECIAL_TOKENS) + 1}, {MAX_VOCAB:,}] (the special tokens and "
                             f"one more; the largest vocabularies in use hold about 250,000), got {vocab_size}")
        if isinstance(files, (str, os.PathLike)):
            files = [files]
        paths = [Path(f) for f in files]
        if not paths:
            raise ValueError("train: no training files given")
        for p in paths:
            if not p.is_file():
                raise FileNotFoundError(f"{p}: training file not found")
        with tempfile.TemporaryDirectory() as tmp:
            return cls._train([_bounded_lines(p, Path(tmp) / f"{k}.txt") for k, p in enumerate(paths)], vocab_size,
                              lowercase=lowercase, strip_accents=strip_accents,
                              tokenize_chinese_chars=tokenize_chinese_chars, min_frequency=min_frequency,
                              limit_alphabet=limit_alphabet, show_progress=show_progress)

    @classmethod
    def _train(cls, paths: list[Path], vocab_size: int, *, lowercase: bool, strip_accents: bool | None,
               tokenize_chinese_chars: bool, min_frequency: int, limit_alphabet: int,
               show_progress: bool) -> "BertTokenizer":

        def run(fixed: list[str], alphabet: list[str]) -> dict[str, int]:
            backend = _build_backend(None, lowercase, strip_accents, tokenize_chinese_chars)
            trainer = WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=show_progress,
                                       special_tokens=[*SPECIAL_TOKENS, *fixed], initial_alphabet=alphabet,
                                       limit_alphabet=limit_alphabet, continuing_subword_prefix="##")
            backend.train([str(p) for p in paths], trainer)
            return backend.get_vocab(with_added_tokens=True)

        # The trainer numbers the continuing pieces (##c) in hash-map order and breaks ties between
        # merges of equal count by those numbers, so one run's vocabulary differs from the next
        # (huggingface/tokenizers#1794). A first run finds the alphabet and the continuing pieces; the
        # second gives the pieces fixed numbers (sorted, passed first) and keeps that alphabet: its
        # merges, and so the vocabulary, come out the same every time.
        # The alphabet has the same trouble where limit_alphabet cuts it (characters of equal count at the
        # cut are kept at random): the cut is then made here, by count and then by code point.
        first = run([], [])
        alphabet = sorted(t for t in first if len(t) == 1 and t not in SPECIAL_TOKENS)
        if len(alphabet) >= limit_alphabet:
            alphabet = _most_frequent_chars(paths, _build_backend(None, lowercase, strip_accents,
                                                                  tokenize_chinese_chars), limit_alphabet)
            first = run([], alphabet)
        vocab = run(sorted(t for t in first if t.startswith("##") and len(t) == 3), alphabet)
        for expected_id, token in enumerate(SPECIAL_TOKENS):
            if vocab.get(token) != expected_id:  # the trainer's contract; fail loudly if it changes
                raise RuntimeError(f"train: {token} got id {vocab.get(token)}, expected {expected_id}")
        return cls(
            vocab, lowercase=lowercase, strip_accents=strip_accents, tokenize_chinese_chars=tokenize_chinese_chars
        )

    # -- encoding --------------------------------------------------------------------------------

    def _encode_chunks(
        self,
        inputs: list,
        *,
        add_special_tokens: bool,
        truncate_to: int | None = None,
        strategy: str = "longest_first",
    ) -> Iterator[list[Encoding]]:
        """Run the Rust pipeline on a batch, CHUNK inputs at a time, with truncation set for each call
        only. A truncated Rust encoding keeps every window cut off it (`overflowing`, nested for
        pairs): ~430 KB for a 32-token pair of a 190-character passage, 8.6 GB for a reranker's
        20,000 candidates at once; callers take what they need of a chunk and let it go."""
        for start in range(0, len(inputs), CHUNK):
            with self._lock:
                try:
                    if truncate_to is not None:
                        self.backend.enable_truncation(truncate_to, strategy=strategy)
                    chunk = self.backend.encode_batch(inputs[start:start + CHUNK],
                                                      add_special_tokens=add_special_tokens)
                except Exception as e:
                    if str(e).startswith("Truncation error"):  # tokenizers raises a bare Exception
                        raise ValueError(
                            f"cannot truncate to max_length={truncate_to} with strategy {strategy!r}: {e}"
                        ) from None
                    raise
                finally:
                    self.backend.no_truncation()
            yield chunk

    def __call__(
        self,
        text: str | list[str],
        text_pair: str | list[str] | None = None,
        *,
        max_length: int | None = None,
        truncation: bool | str = False,
        padding: bool | str = False,
        return_offsets_mapping: bool = False,
        return_word_ids: bool = False,
        return_tensors: str | None = None,
        add_special_tokens: bool = True,
    ) -> BatchEncoding:
        """Encode one text (or pair) or a batch of them.

        A str gives flat lists; a list of str gives a list of lists.  `truncation` is False,
        True/"longest_first" (cut the longer of a pair first), "only_first" or "only_second", to
        `max_length` (default `model_max_length`).  Without truncation nothing is cut, however long.
        `padding` is False, True/"longest" (to the batch's longest) or "max_length".
        `return_tensors` "pt" or "np" gives (batch, length) arrays, a batch of one for a str;
        `word_ids` then stays a list (None marks special and padding tokens).
        """
        batched = _check_texts(text, "text")
        if text_pair is not None:
            pair_batched = _check_texts(text_pair, "text_pair")
            if pair_batched != batched:
                raise TypeError("text and text_pair must both be str or both be lists of str")
            if batched and len(text_pair) != len(text):
                raise ValueError(f"text has {len(text)} items but text_pair has {len(text_pair)}")
        if truncation not in _TRUNCATION:
            raise ValueError(f"truncation must be one of {list(_TRUNCATION)}, got {truncation!r}")
        if padding not in _PADDING:
            raise ValueError(f"padding must be one of {list(_PADDING)}, got {padding!r}")
        if return_tensors not in (None, "pt", "np"):
            raise ValueError(f"return_tensors must be None, 'pt' or 'np', got {return_tensors!r}")
        _check_max_length(max_length)
        strategy, pad = _TRUNCATION[truncation], _PADDING[padding]
        limit = max_length if max_length is not None else self.model_max_length
        n_special = self.backend.num_special_tokens_to_add(text_pair is not None) if add_special_tokens else 0
        if strategy and limit < n_special:
            # tokenizers would silently leave the input whole; say what is wrong instead.
            raise ValueError(f"max_length={limit} leaves no room for the {n_special} special tokens")

        texts = list(text) if batched else [text]
        if text_pair is None:
            inputs: list = texts
        else:
            inputs = list(zip(texts, text_pair if batched else [text_pair]))
        # what each key holds per sequence, and what a padding position holds (tokenizers' own padding)
        fields = {"input_ids": ("ids", self.pad_token_id), "token_type_ids": ("type_ids", 0),
                  "attention_mask": ("attention_mask", 0)}
        if return_offsets_mapping:
            fields["offset_mapping"] = ("offsets", (0, 0))
        if return_word_ids:
            fields["word_ids"] = ("word_ids", None)
        data: dict[str, Any] = {key: [] for key in fields}
        for chunk in self._encode_chunks(inputs, add_special_tokens=add_special_tokens,
                                         truncate_to=limit if strategy else None,
                                         strategy=strategy or "longest_first"):
            for key, (attribute, _) in fields.items():
                data[key].extend(getattr(e, attribute) for e in chunk)
        if pad is not None:  # right, to the longest sequence or to max_length (a longer one stays as it is)
            rows = data["input_ids"]
            target = limit if pad == "max_length" else max(map(len, rows), default=0)
            for key, (_, fill) in fields.items():
                data[key] = [r + [fill] * (target - len(r)) if len(r) < target else r for r in data[key]]
        word_ids = data.pop("word_ids", None)
        if return_tensors is not None:
            data = {k: _stack(k, v, return_tensors) for k, v in data.items()}
        elif not batched:
            data = {k: v[0] for k, v in data.items()}
        if word_ids is not None:
            data["word_ids"] = word_ids if batched or return_tensors else word_ids[0]
        return BatchEncoding(data)

    def encode_ids(self, texts: list[str], max_length: int | None = None, truncation: bool = False) -> list[list[int]]:
        """The fast path for batch inference: token ids with [CLS]/[SEP], no padding."""
        if not _check_texts(texts, "texts"):
            raise TypeError("encode_ids takes a list of str; for one text pass [text]")
        _check_max_length(max_length)
        truncate_to = (max_length or self.model_max_length) if truncation else None
        if truncate_to is not None and truncate_to < 2:
            raise ValueError(f"max_length={truncate_to} leaves no room for [CLS] and [SEP]")
        if truncate_to is not None:  # what a text costs is bounded by what is kept of it
            texts = [self._head(t, truncate_to) for t in texts]
        return [e.ids for chunk in self._encode_chunks(list(texts), add_special_tokens=True, truncate_to=truncate_to)
                for e in chunk]

    def _head(self, text: str, tokens: int) -> str:
        """A head of `text` whose first `tokens` tokens are the text's own (its truncation to that many
        is the same), so that one 50 MB line costs what its first 512 tokens cost (issue 46). Cut only
        where no word can be split: at whitespace, or between two CJK characters (each its own word);
        the head grows until it yields more than `tokens` tokens."""
        size = max(1024, 16 * tokens)
        while size < len(text):
            cut = next((c for c in range(size, min(size + 4096, len(text))) if text[c].isspace()
                        or (_is_cjk(text[c - 1]) and _is_cjk(text[c]))), None)
            if cut is None:
                size *= 4
                continue
            head = text[:cut]
            if len(self.backend.encode(head, add_special_tokens=False).ids) > tokens:
                return head
            size = 4 * cut
        return text

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of `text`, without [CLS]/[SEP]."""
        _check_texts(text, "text", allow_batch=False)
        return self.backend.encode(text, add_special_tokens=False).tokens

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Ids back to text: `##` pieces joined to their word, spaces before , . ! ? removed."""
        ids = _to_python(ids)
        if isinstance(ids, int):
            ids = [ids]
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def __repr__(self) -> str:
        return (
            f"BertTokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase}, "
            f"strip_accents={self.strip_accents}, tokenize_chinese_chars={self.tokenize_chinese_chars}, "
            f"model_max_length={self.model_max_length})"
        )

    # Locks do not pickle (DataLoader workers under spawn pickle the dataset and its tokenizer).
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


# ----------------------------------------------------------------------------------------------


def _check_texts(value: Any, name: str, allow_batch: bool = True) -> bool:
    """True for a batch (list/tuple of str), False for one str; TypeError for anything else."""
    if isinstance(value, str):
        return False
    if allow_batch and isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise TypeError(f"{name}[{i}] must be str, got {type(item).__name__}")
        return True
    expected = "a str or a list of str" if allow_batch else "a str"
    raise TypeError(f"{name} must be {expected}, got {type(value).__name__}")


def _check_max_length(max_length: Any) -> None:
    if max_length is not None and (not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1):
        raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")


def _to_python(ids: Any) -> Any:
    """Torch tensors / numpy arrays / numpy ints to plain Python ints or lists of them."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if isinstance(ids, int):
        return ids
    return [int(i) for i in ids]


def _stack(key: str, rows: list, kind: str):
    """Rows of equal length to a (batch, length[, 2]) int64 torch tensor or numpy array."""
    import numpy as np

    lengths = {len(r) for r in rows}
    if len(lengths) > 1:
        raise ValueError(
            f"cannot make a tensor of {key}: sequences have lengths {min(lengths)}..{max(lengths)}; "
            "pass padding=True (or padding='max_length')"
        )
    array = np.array(rows, dtype=np.int64)
    if array.size == 0:  # no rows, or rows of no tokens: keep the (batch, length[, 2]) shape
        array = array.reshape((len(rows), 0, 2) if key == "offset_mapping" else (len(rows), 0))
    if kind == "np":
        return array
    import torch

    return torch.from_numpy(array)
