"""A WordPiece vocabulary trained on a corpus as users hold it: plain text files, folders, globs,
JSON Lines and Parquet (their `text` field), gzip and zstd; what `torchbert vocab` runs."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..settings import Checked, setting
from ..tokenizer import MAX_INPUT_CHARS_PER_WORD, MAX_VOCAB, BertTokenizer, _bounded_lines, _build_backend


@dataclass(kw_only=True)
class VocabSettings(Checked):
    corpus: list[str] = setting(help="UTF-8 corpus files, folders or globs, read as streams (.jsonl/.json and "
                                     ".parquet: the --text-field of each line or row; .gz and .zst decompressed as "
                                     "they are read)", metavar="PATH")
    text_field: str = setting("text", "the JSON field or Parquet column that holds the text (as prepare's)")
    vocab_size: int | None = setting(None, "tokens in the vocab, special tokens included: 5 and one more at least; the "
                                           "largest vocabularies in use hold about 250,000 (more if the corpus has "
                                           "more distinct characters than that, up to --limit-alphabet: each "
                                           "character is a token); needed unless --extend grows a checkpoint's",
                                     low=6, high=MAX_VOCAB)
    out: str = setting(help="output tokenizer folder")
    lowercase: bool = setting(True, "lowercase and strip accents (uncased BERT; default: on)")
    min_frequency: int = setting(2, "drop pieces seen fewer times (with --extend: words)", low=1)
    limit_alphabet: int = setting(10000, "keep at most this many distinct characters, the most frequent", low=1)


def train_vocabulary(s: VocabSettings, progress: bool = True) -> BertTokenizer:
    """The vocabulary of `s.corpus`, written whole to `s.out` (or nothing written); the corpus is checked
    first (an empty file or a bad byte is an error naming the file and line)."""
    from ..io.files import atomic_folder
    from .pretraining import split_sentences
    from .compressed import compression
    from .sources import _inner_suffix, corpus_documents, corpus_files

    check_corpus(s.corpus)
    with atomic_folder(Path(s.out), marked=True) as folder:  # the whole vocabulary folder or none
        # the text of compressed and JSON files is staged beside the output, on the user's disk (a
        # corpus of gigabytes), not in /tmp, often a RAM disk; it goes before the folder is put in place
        stage = folder / "corpus-text"
        stage.mkdir()
        files = []
        for k, path in enumerate(corpus_files(s.corpus)):
            if compression(path) or _inner_suffix(path) in (".jsonl", ".json", ".parquet"):
                # the trainer reads raw lines: give it the text, a sentence a line, streamed to a file
                # (not the JSON around it, nor compressed bytes); memory holds one part at a time
                text_file = stage / f"{k}.txt"
                with open(text_file, "w", encoding="utf-8") as f:
                    for docs in corpus_documents([path], "auto", 8 << 20, split_sentences, s.text_field):
                        f.write("".join(sent + "\n" for d in docs for sent in d))
                path = text_file
            # lines the trainer would take whole are cut here, into the stage: BertTokenizer.train
            # would copy such a file to /tmp
            bounded = _bounded_lines(path, stage / f"{k}.cut.txt")
            if bounded != path and path.parent == stage:
                path.unlink()
            usable = _usable_words(bounded, stage / f"{k}.words.txt", s.lowercase)
            if usable != bounded and bounded.parent == stage:
                bounded.unlink()
            files.append(usable)
        tok = BertTokenizer.train(files, vocab_size=s.vocab_size, lowercase=s.lowercase,
                                  min_frequency=s.min_frequency, limit_alphabet=s.limit_alphabet,
                                  show_progress=progress)
        shutil.rmtree(stage)
        tok.save_pretrained(folder)
    return tok


# a run of more bytes than a word may hold characters, with no space in it: only there can a word be too long
_LONG_RUN = re.compile(rb"[^\s]{%d,}" % (MAX_INPUT_CHARS_PER_WORD + 1))


def _usable_words(path: Path, spare: Path, lowercase: bool) -> Path:
    """`path`, or where it holds a word longer than MAX_INPUT_CHARS_PER_WORD characters (as BERT's
    normalizer and pre-tokenizer cut words: at spaces, around punctuation and Chinese characters), a copy
    at `spare` without such words. The tokenizer makes such a word [UNK] whole, so nothing it would teach
    the trainer is ever used; and the trainer's merges cost it time by its length squared (bench/README.md,
    "One-line documents in vocab and prepare")."""
    with open(path, "rb") as f:
        if not any(_LONG_RUN.search(line) for line in f):
            return path
    backend = _build_backend(None, lowercase, None, True)
    normalize, split = backend.normalizer.normalize_str, backend.pre_tokenizer.pre_tokenize_str

    def words(run: re.Match) -> str:
        kept = [w for w, _ in split(normalize(run.group(0))) if len(w) <= MAX_INPUT_CHARS_PER_WORD]
        return " ".join(kept)

    runs = re.compile(r"\S{%d,}" % (MAX_INPUT_CHARS_PER_WORD + 1))
    with open(path, encoding="utf-8") as f, open(spare, "w", encoding="utf-8") as out:
        for line in f:
            out.write(runs.sub(words, line))
    return spare


def check_corpus(paths: list[str]) -> None:
    """Each plain corpus file exists, holds text, and is valid UTF-8 (the error names the file and
    line), read as a stream; compressed, JSON Lines and Parquet files are checked as they are read."""
    from .compressed import compression
    from .sources import _inner_suffix, corpus_files
    from ..io.texts import lines

    for path in corpus_files(paths):
        if compression(path) or _inner_suffix(path) in (".jsonl", ".json", ".parquet"):
            continue
        filled = False
        for _, line in lines(path):  # to the end: a bad byte anywhere is named here, with its line
            filled = filled or bool(line.strip())
        if not filled:
            raise UserError(f"{path}: the corpus file is empty")
