"""Task-adaptive pretraining's corpus (Gururangan et al., 2020, "Don't Stop Pretraining"): the text of a
fine-tuning file, its labels left out, prepared for `pretrain --tapt FILE` without a corpus made by hand.

The file is read as the task family its layout names (a CoNLL file as tagging, SQuAD JSON as QA, JSON
Lines with choices as multiple choice, a table with two text columns as pairs, else single texts), each
example's texts (the family's `texts`) one document, a text seen before left out (a QA file's context
comes once). The documents are prepared once per file, tokenizer and settings into torchbert's cache
folder (io/files.py cache_folder, under tapt/), a tenth of them held out for the run's evaluation; a second
run on the same file (another rate, a --resume) reads the same folder.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from .families import family

# the families tried on a file, by its suffix, in turn: the first that reads it gives its texts
GUESSES = {".conll": ("token",), ".json": ("qa-v2",), ".jsonl": ("multiple-choice", "pair", "classification"),
           ".tsv": ("pair", "classification"), ".csv": ("pair", "classification"), ".txt": ("classification",)}
MAX_HELDOUT = 1000  # documents held out at most (a tenth of the file's, at least one)


def task_documents(path: str | Path) -> tuple[str, list[list[str]]]:
    """(the task type it was read as, its documents: each example's texts not seen before)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--tapt {path}: no such file (a fine-tuning file: .tsv, .csv, .jsonl, .json, .conll)")
    tried = GUESSES.get(path.suffix.lower())
    if tried is None:
        raise ValueError(f"--tapt {path}: a fine-tuning file ends in {', '.join(GUESSES)}")
    errors = []
    for task in tried:
        try:
            examples = family(task).read(path, labelled=False, warn=lambda _: None)
        except ValueError as e:
            errors.append(str(e))
            continue
        seen: set[str] = set()
        documents = []
        for ex in examples:
            texts = [" ".join(t.split()) for t in family(task).texts(ex)]  # a text's line breaks as spaces
            fresh = [t for t in texts if t and t not in seen]
            seen.update(fresh)
            if fresh:
                documents.append(fresh)
        return task, documents
    raise ValueError(f"--tapt {path}: read as none of {', '.join(tried)}: {errors[-1]}")


def tapt_data(path: str | Path, tokenizer_dir: str | Path, max_seq_len: int, pairs: str,
              log: Callable[[str], None] = print, progress: bool = False) -> Path:
    """The data folder of `path`'s text prepared with `tokenizer_dir` (dynamic masking; `pairs` as prepare's
    --pairs), made once and reused."""
    from ..data.pipeline import prepare
    from ..data.pretraining import PrepareSettings
    from ..io.files import cache_folder

    path, tokenizer_dir = Path(path), Path(tokenizer_dir)
    task, documents = task_documents(path)
    if len(documents) < 3:
        raise ValueError(f"--tapt {path}: {len(documents)} text(s) in it; task-adaptive pretraining needs a few to "
                         "train on and one to hold out")
    heldout = max(1, min(MAX_HELDOUT, len(documents) // 10))
    settings = PrepareSettings(max_seq_len=max_seq_len, masking="dynamic", pairs=pairs, heldout_docs=heldout)
    key = hashlib.sha256()
    for part in (path.read_bytes(), (tokenizer_dir / "vocab.txt").read_bytes(),
                 json.dumps([task, max_seq_len, pairs, heldout]).encode()):
        key.update(hashlib.sha256(part).digest())
    out = cache_folder() / "tapt" / f"{path.stem}-{key.hexdigest()[:16]}"
    if (out / "manifest.json").is_file():
        log(f"--tapt {path}: its text as prepared before, in {out}")
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="torchbert-tapt.", dir=out.parent) as work:
        corpus = Path(work) / f"{path.stem}.txt"  # prepare's text layout: a line a text, a blank line a document
        corpus.write_text("\n\n".join("\n".join(doc) for doc in documents) + "\n", encoding="utf-8")
        try:
            m = prepare([corpus], tokenizer_dir, out, settings, progress=progress, log=log)
        except FileExistsError:  # another run made it meanwhile
            if (out / "manifest.json").is_file():
                return out
            raise
    c = m["counts"]
    log(f"--tapt {path}: read as a {task} task's file, {len(documents):,} documents ({heldout} held out) -> "
        f"{c['instances']:,} instances of {c['tokens']:,} tokens in {out}")
    return out
