"""train a WordPiece vocabulary on text files

Train a BERT WordPiece vocabulary on corpus files and write a tokenizer folder."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..settings import add_flags
from .common import check_out_folder, command, settings_from, shared_flags

WRITES_FOLDER = True
EPILOG = """\
examples:
  torchbert vocab --corpus wiki.txt books.txt --vocab-size 30522 --out ./my-vocab
  torchbert vocab --corpus zh.txt --vocab-size 21128 --no-lowercase --out ./zh-vocab

The folder holds vocab.txt, tokenizer_config.json, special_tokens_map.json and tokenizer.json; it
loads with BertTokenizer.from_pretrained and with transformers' AutoTokenizer.  [PAD] [UNK] [CLS]
[SEP] [MASK] get ids 0..4.

The trainer reads plain text: the text of .gz, .zst, JSON Lines and Parquet files is written beside
--out while it trains (as much disk as the text itself) and removed before --out appears. A word of
more than 100 characters (a base64 blob, a line of text without spaces), which the tokenizer makes
[UNK] whole, is left out of training: it would teach nothing the tokenizer uses, and slows the trainer
by its length squared.

The same corpus and flags give the same vocabulary every time. Hugging Face tokenizers' trainer alone
does not (it breaks ties between equally frequent merges in hash-map order, tokenizers issue 1794):
torchbert trains twice, the second time with the pieces numbered in a fixed order. `prepare` records
the vocabulary's sha256 in the data's manifest, and `pretrain --init` refuses a checkpoint whose
vocabulary is another.
"""


def add(sub) -> None:
    from ..data.vocabulary import VocabSettings

    p = command(sub, __name__)
    add_flags(p, VocabSettings)
    shared_flags(p, "overwrite", "quiet")


def run(args) -> None:
    from ..data.vocabulary import VocabSettings, train_vocabulary

    s = settings_from(VocabSettings, args)
    out = Path(s.out)
    check_out_folder(out, args.overwrite, [("--corpus", c) for c in s.corpus])
    start = time.perf_counter()
    # tokenizers' trainer draws its bars on a terminal only, and writes a newline to stdout after
    # each bar wherever stdout goes: where either is not a terminal (a log, a pipe), no bars
    shown = sys.stdout.isatty() and sys.stderr.isatty()
    tok = train_vocabulary(s, progress=not args.quiet and shown)
    print(f"wrote {out}: vocab of {tok.vocab_size} tokens ({'lowercased' if s.lowercase else 'cased'}) "
          f"in {time.perf_counter() - start:.1f}s")
    if tok.vocab_size > s.vocab_size:  # the trainer keeps every character it keeps at all
        print(f"note: more tokens than --vocab-size {s.vocab_size}: the corpus has that many distinct "
              f"characters (up to --limit-alphabet {s.limit_alphabet}) and each is a token; lower "
              "--limit-alphabet for a smaller vocab (rarer characters then become [UNK])", file=sys.stderr)
    elif tok.vocab_size < s.vocab_size:
        print(fewer_note(tok, s.vocab_size, s.min_frequency), file=sys.stderr)


def fewer_note(tok, asked: int, min_frequency: int) -> str:
    """Why the trainer stopped short of --vocab-size: no pair of pieces left that the corpus holds
    min_frequency times; for Chinese text, whose characters BERT never joins, the usual case."""
    from ..tokenizer import _is_cjk

    chinese = sum(1 for t in tok.vocab if len(t) == 1 and _is_cjk(t))
    why = "" if chinese <= tok.vocab_size // 4 else (
        f"; {chinese:,} of them are Chinese characters, each a token of its own (BERT's tokenizer splits Chinese "
        "text into characters, so they never merge into longer pieces)")
    return (f"note: {tok.vocab_size:,} tokens, fewer than --vocab-size {asked:,}: every pair of pieces that the "
            f"corpus holds at least --min-frequency {min_frequency} times was merged and none is left{why}; more "
            "text, or a lower --min-frequency, gives more")
