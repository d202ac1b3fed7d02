"""turn a corpus into sharded, masked pretraining instances

Build BERT pretraining instances (NSP pairs, masked LM) from a raw corpus and write them as
memory-mappable shards."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..settings import Checked, add_flags, setting
from .common import check_out_folder, command, resolve_model, settings_from, shared_flags

WRITES_FOLDER = True
EPILOG = """\
examples:
  torchbert prepare --corpus wiki.txt --tokenizer ./my-vocab --out ./data-128
  torchbert prepare --corpus zh.txt --tokenizer ./zh-vocab --out ./zh-wwm --whole-word --masking dynamic
  torchbert prepare --corpus 'news/*.jsonl.zst' wiki/ --tokenizer ./my-vocab --out ./data-512 \\
      --max-seq-len 512 --max-predictions 80 --dupe-factor 10
  torchbert prepare --corpus crawl/ --tokenizer ./my-vocab --out ./mlm --pairs none --masking dynamic
  torchbert prepare ... --resume                      # after a kill: only the unfinished blocks are made
  torchbert prepare ... --cluster tcp://HOST:8786     # the blocks as tasks on a Dask cluster

Corpus (--corpus): files, folders (every file under them) and globs, each read as a stream;
gzip (.gz) and zstd (.zst) are decompressed as they are read: once to find where to cut their text,
then once more, piece by piece, for every worker (one big .gz is read on every core, and gives the
shards its text gives plain). Layouts (--format):
  bert     one sentence per line, a blank line between documents (Google's BERT layout)
  text     each non-empty line is a paragraph, cut into sentences after . ! ? (before a space) and
           after 。！？；… (closing quotes and brackets stay with the sentence); blank lines
           separate documents, or, in a file without blank lines, every line is a document
  jsonl    one document per line, in its --text-field ("text")
  parquet  one document per row, in its --text-field column (Hugging Face datasets' layout)
  auto     jsonl for .jsonl/.json, parquet for .parquet (before any .gz/.zst); else bert when the
           file's first 20,000 lines have blank lines and >= 90% of the others hold one sentence,
           text otherwise (the default)

Instances follow the BERT paper: [CLS] A [SEP] B [SEP] of whole sentences, B the true next text
half the time and a span of another document otherwise; 15% of tokens masked (80% [MASK], 10%
random, 10% unchanged).  A one-sentence document still yields pairs, all NotNext (its sentence
as A, B from another document); a corpus of one document is an error.  --masking static
masks here (--dupe-factor copies, each with its own pairs and masks); dynamic stores the
instances unmasked and the loader masks them afresh every epoch.  --whole-word masks all pieces of
a word together; Chinese words come from jieba's segmenter (rjieba, its Rust port: the same words
about 25x faster; jieba itself where rjieba is not installed).  --pairs none packs whole sentences
end to end instead (RoBERTa's layout, for --objective mlm, electra and GPT; mlm+nsp refuses it).

Scale: memory is flat in the corpus size. The corpus is read in pieces of ~8 MB by --workers
processes (one per core), tokenized, and its documents dealt at random into blocks of --block-mb
(a global shuffle); each block is then paired, masked and written by one worker, its NotNext
partners drawn from the whole block. The same corpus, seed and settings give the same shards with
any number of workers or on a cluster. Work happens in OUT.partial, which a killed run leaves for
--resume; OUT appears whole at the end. The last lines say the peak memory of this process and of
its largest worker.

Output: shard-NNNNN/ folders of .npy arrays (memory-mapped by torchbert.data.PretrainingData),
manifest.json (counts, settings, vocab sha256) and a copy of the tokenizer files.
"""


@dataclass(kw_only=True)
class PrepareInputs(Checked):
    corpus: list[str] = setting(help="UTF-8 corpus files, folders or globs (.txt, .jsonl, .parquet; .gz and .zst "
                                     "read as they are)", metavar="PATH")
    tokenizer: str = setting(help="tokenizer folder (vocab.txt, tokenizer_config.json), or a model's by name as "
                                  "--model takes it (minilm, a hub id)")
    out: str = setting(help="output data folder")


class PrepareInterrupted(KeyboardInterrupt):
    """prepare stopped with its finished blocks kept in OUT.partial."""

    def __init__(self, work: Path) -> None:
        super().__init__(str(work))
        self.work = work


def add(sub) -> None:
    from ..data.pretraining import PrepareSettings

    p = command(sub, __name__)
    add_flags(p, PrepareInputs)
    add_flags(p, PrepareSettings)
    shared_flags(p, "resume", "overwrite", "quiet",
                 resume="continue an interrupted prepare from OUT.partial: finished pieces and blocks are kept")


def rates(counts: dict, timings: dict, seconds: float, resumed: bool) -> str:
    """The speeds of this run: a resumed one's of what it read and made itself."""
    read = timings.get("read_tokens", 0 if resumed else counts["corpus_tokens"])
    if resumed:
        return (f"this run read {read:,} of the corpus tokens ({read / max(timings.get('read_tokenize', 0), 1e-9):,.0f}"
                " tokens/s), the rest was read before --resume")
    return (f"{read / max(timings['read_tokenize'], 1e-9):,.0f} corpus tokens/s read, "
            f"{counts['tokens'] / seconds:,.0f} instance tokens/s overall")


def peak_memory(local_workers: bool) -> str | None:
    """This process's peak memory and, where its workers ran on this machine, the largest one's."""
    from ..hardware import peak_resident_bytes

    own, child = peak_resident_bytes(), peak_resident_bytes(children=True)
    if own is None:
        return None
    line = f"peak memory {own / 1e9:.2f} GB in this process"
    return line + (f", {child / 1e9:.2f} GB in its largest worker" if local_workers and child else "")


def quiet_dask_logs() -> None:
    """Dask's loggers in this process at CRITICAL. Its client's logger has a level of its own (Dask's
    logging config, read when distributed is imported), which the "distributed" logger's level does
    not override: each is set after the import."""
    import contextlib
    import logging

    with contextlib.suppress(ImportError):  # without distributed, --cluster is refused with its own error
        import distributed  # noqa: F401
    for name in ["distributed", *(n for n in logging.root.manager.loggerDict if n.startswith("distributed."))]:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def run(args) -> None:
    from ..data.pipeline import prepare
    from ..data.plan import partial_folder
    from ..data.pretraining import PrepareSettings

    settings = settings_from(PrepareSettings, args)  # the flags first: a bad one is named before any file is read
    s = settings_from(PrepareInputs, args)
    if not Path(s.tokenizer).is_dir():  # a model by name, as --model takes it (minilm, a hub id)
        s = dataclasses.replace(s, tokenizer=str(resolve_model(s.tokenizer, "--tokenizer")))
    check_out_folder(Path(s.out), args.overwrite or args.resume,
                     [("--tokenizer", s.tokenizer), *[("--corpus", c) for c in s.corpus]])
    if settings.cluster is not None:  # distributed logs a lost scheduler as tracebacks; the error says it in one line
        quiet_dask_logs()
    start = time.perf_counter()
    try:
        m = prepare(s.corpus, s.tokenizer, s.out, settings, overwrite=args.overwrite, resume=args.resume,
                    progress=not args.quiet)
    except FileExistsError as e:
        raise UserError(str(e)) from None
    except KeyboardInterrupt:
        work = partial_folder(Path(s.out))
        if work.is_dir():
            raise PrepareInterrupted(work) from None
        raise
    seconds = time.perf_counter() - start
    c = m["counts"]
    t = m["timings"]
    print(f"wrote {s.out}: {c['instances']:,} instances, {c['tokens']:,} tokens in {c['shards']} shard(s) from "
          f"{c['documents']:,} documents, {c['corpus_tokens']:,} corpus tokens ({settings.masking} masking"
          f"{', whole word' if settings.whole_word else ''}{', packed sentences' if settings.pairs == 'none' else ''}) "
          f"in {seconds:.1f}s: {rates(c, t, seconds, args.resume)}")
    if (memory := peak_memory(local_workers=settings.cluster is None)) is not None:
        print(f"  {memory}")
    if "heldout" in m:
        h = m["heldout"]
        print(f"  held out: {h['documents']} documents -> {h['instances']} instances in {s.out}/heldout "
              "(torchbert pretrain evaluates on it)")
