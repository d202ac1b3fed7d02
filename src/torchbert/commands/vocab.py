"""train a WordPiece vocabulary on text files

Train a BERT WordPiece vocabulary on corpus files and write a tokenizer folder."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..errors import UserError
from ..settings import add_flags
from .common import check_out_folder, command, settings_from, shared_flags

WRITES_FOLDER = True
EPILOG = """\
examples:
  torchbert vocab --corpus wiki.txt books.txt --vocab-size 30522 --out ./my-vocab
  torchbert vocab --corpus zh.txt --vocab-size 21128 --no-lowercase --out ./zh-vocab
  torchbert vocab --extend minilm --corpus clinical.txt --add 2000 --out ./minilm-clinical

--extend CHECKPOINT grows a model's vocabulary instead: the corpus's most frequent words that the
checkpoint splits into --min-pieces pieces or more, and the characters it reads as [UNK], go into its
[unusedN] slots and then after its last id; every old token keeps its id and its row, and each new
row starts as the mean of the rows of the pieces it was read as. --out is the whole model folder
(weights, config, tokenizer, sentence-transformers files), ready for `pretrain --init` to teach the
new rows on the corpus.

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
    from ..data.vocab_extend import ExtendSettings
    from ..data.vocabulary import VocabSettings

    p = command(sub, __name__)
    add_flags(p, VocabSettings)
    add_flags(p, ExtendSettings)
    shared_flags(p, "overwrite", "quiet")


def run(args) -> None:
    from ..data.vocab_extend import ExtendSettings
    from ..data.vocabulary import VocabSettings, train_vocabulary

    s = settings_from(VocabSettings, args)
    e = settings_from(ExtendSettings, args)
    out = Path(s.out)
    if e.extend is not None:
        if s.vocab_size is not None:
            raise UserError(f"--vocab-size {s.vocab_size}: --extend grows the checkpoint's vocabulary by up to --add "
                            "tokens; leave --vocab-size out")
        return extend(s, e, out, args.overwrite)
    if s.vocab_size is None:
        raise UserError("--vocab-size: how many tokens the vocabulary trained on --corpus holds (BERT's: 30522); or "
                        "--extend CHECKPOINT to grow a model's vocabulary instead")
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


def extend(s, e, out: Path, overwrite: bool) -> None:
    from ..data.vocab_extend import extend_from_corpus
    from ..io.hf import resolve_model

    model_dir = resolve_model(e.extend, "--extend")
    check_out_folder(out, overwrite, [("--corpus", c) for c in s.corpus] + [("--extend", model_dir)])
    start = time.perf_counter()
    try:
        x = extend_from_corpus(model_dir, s, e, out)
    except (FileNotFoundError, ValueError) as err:
        raise UserError(str(err)) from None
    appended = x.new_size - x.old_size
    print(f"wrote {out}: {len(x.added):,} tokens added to {model_dir}'s {x.old_size:,} ({len(x.added) - appended:,} in "
          f"[unused] slots, {appended:,} appended: vocab_size {x.new_size:,}) in {time.perf_counter() - start:.1f}s; "
          f"--corpus read in {x.pieces_before:.3f} pieces a word before, {x.pieces_after:.3f} after, "
          f"{x.unknown_before:.2%} of its words [UNK] before, {x.unknown_after:.2%} after")
    if x.added:
        shown = ", ".join(t for t, _, _ in x.added[:10])
        print(f"  the most frequent: {shown}{', ...' if len(x.added) > 10 else ''}")
    else:
        print(f"note: no word of --corpus is split into --min-pieces {e.min_pieces} pieces or more at least "
              f"--min-frequency {s.min_frequency} times: nothing to add; the folder is the checkpoint's",
              file=sys.stderr)
