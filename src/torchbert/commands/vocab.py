"""train a WordPiece vocabulary on text files

Train a BERT WordPiece vocabulary on corpus files and write a tokenizer folder."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..settings import Checked, add_flags, setting
from ..tokenizer import MAX_VOCAB
from .common import check_out_folder, command, settings_from, shared_flags

WRITES_FOLDER = True
EPILOG = """\
examples:
  torchbert vocab --corpus wiki.txt books.txt --vocab-size 30522 --out ./my-vocab
  torchbert vocab --corpus zh.txt --vocab-size 21128 --no-lowercase --out ./zh-vocab

The folder holds vocab.txt, tokenizer_config.json, special_tokens_map.json and tokenizer.json; it
loads with BertTokenizer.from_pretrained and with transformers' AutoTokenizer.  [PAD] [UNK] [CLS]
[SEP] [MASK] get ids 0..4.

The same corpus and flags give the same vocabulary every time. Hugging Face tokenizers' trainer alone
does not (it breaks ties between equally frequent merges in hash-map order, tokenizers issue 1794):
torchbert trains twice, the second time with the pieces numbered in a fixed order. `prepare` records
the vocabulary's sha256 in the data's manifest, and `pretrain --init` refuses a checkpoint whose
vocabulary is another.
"""


@dataclass(kw_only=True)
class VocabSettings(Checked):
    corpus: list[str] = setting(help="UTF-8 corpus files, folders or globs, read as streams (.jsonl/.json and "
                                     ".parquet: the `text` field of each line or row; .gz and .zst decompressed as "
                                     "they are read)", metavar="PATH")
    vocab_size: int = setting(help="tokens in the vocab, special tokens included: 5 and one more at least; the largest "
                                   "vocabularies in use hold about 250,000 (more if the corpus has more distinct "
                                   "characters than that, up to --limit-alphabet: each character is a token)",
                              low=6, high=MAX_VOCAB)
    out: str = setting(help="output tokenizer folder")
    lowercase: bool = setting(True, "lowercase and strip accents (uncased BERT; default: on)")
    min_frequency: int = setting(2, "drop pieces seen fewer times", low=1)
    limit_alphabet: int = setting(10000, "keep at most this many distinct characters, the most frequent", low=1)


def add(sub) -> None:
    p = command(sub, __name__)
    add_flags(p, VocabSettings)
    shared_flags(p, "overwrite", "quiet")


def run(args) -> None:
    import tempfile

    from ..data.pretraining import split_sentences
    from ..data.sources import _inner_suffix, compression, corpus_files, piece_documents, plan_pieces
    from ..io.files import atomic_folder
    from ..tokenizer import BertTokenizer

    s = settings_from(VocabSettings, args)
    out = Path(s.out)
    check_out_folder(out, args.overwrite, [("--corpus", c) for c in s.corpus])
    check_corpus(s.corpus)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for k, path in enumerate(corpus_files(s.corpus)):
            if compression(path) or _inner_suffix(path) in (".jsonl", ".json", ".parquet"):
                # the trainer reads raw lines: give it the text, a sentence a line, streamed to a file
                # (not the JSON around it, nor compressed bytes); memory holds one part at a time
                text_file = Path(tmp) / f"{k}.txt"
                with open(text_file, "w", encoding="utf-8") as f:
                    for piece in plan_pieces([path], "auto", 8 << 20, split_sentences):
                        for docs, _ in piece_documents(piece, 8 << 20, split_sentences):
                            f.write("".join(sent + "\n" for d in docs for sent in d))
                path = text_file
            files.append(path)
        tok = BertTokenizer.train(files, vocab_size=s.vocab_size, lowercase=s.lowercase,
                                  min_frequency=s.min_frequency, limit_alphabet=s.limit_alphabet,
                                  show_progress=not args.quiet)
    with atomic_folder(out, marked=True) as tmp:  # the whole vocabulary folder or none
        tok.save_pretrained(tmp)
    print(f"wrote {out}: vocab of {tok.vocab_size} tokens ({'lowercased' if s.lowercase else 'cased'}) "
          f"in {time.perf_counter() - start:.1f}s")
    if tok.vocab_size > s.vocab_size:  # the trainer keeps every character it keeps at all
        print(f"note: more tokens than --vocab-size {s.vocab_size}: the corpus has that many distinct "
              f"characters (up to --limit-alphabet {s.limit_alphabet}) and each is a token; lower "
              "--limit-alphabet for a smaller vocab (rarer characters then become [UNK])", file=sys.stderr)


def check_corpus(paths: list[str]) -> None:
    """Each plain corpus file exists, holds text, and is valid UTF-8 (the error names the file and
    line), read as a stream; compressed, JSON Lines and Parquet files are checked as they are read."""
    from ..data.sources import _inner_suffix, compression, corpus_files
    from ..io.texts import lines

    for path in corpus_files(paths):
        if compression(path) or _inner_suffix(path) in (".jsonl", ".json", ".parquet"):
            continue
        filled = False
        for _, line in lines(path):  # to the end: a bad byte anywhere is named here, with its line
            filled = filled or bool(line.strip())
        if not filled:
            raise UserError(f"{path}: the corpus file is empty")
