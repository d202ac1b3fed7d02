"""print prepared pretraining instances, decoded

Print instances of a data folder written by `torchbert prepare`: tokens, segments, masked positions
with the original tokens, is_random_next."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..settings import Checked, add_flags, seed_setting, setting
from .common import command, settings_from

EPILOG = """\
examples:
  torchbert inspect-data ./data-128 --n 5
  torchbert inspect-data ./data-128 --n 1000 --jsonl > sample.jsonl

Masked tokens show as [MASK→original] (or random→original, or =original when kept unchanged).
"""


@dataclass(kw_only=True)
class InspectSettings(Checked):
    dir: str = setting(help="data folder", flag="DIR", metavar="DIR")
    n: int = setting(100, "instances to show", low=0)
    jsonl: bool = setting(False, "one JSON object per instance")
    seed: int = seed_setting(0, "loader seed for dynamic masking")


def add(sub) -> None:
    add_flags(command(sub, __name__), InspectSettings)


def run(args) -> None:
    from ..data.shards import PretrainingData
    from ..tokenizer import BertTokenizer

    s = settings_from(InspectSettings, args)
    folder = Path(s.dir)
    if not (folder / "manifest.json").is_file():
        raise UserError(f"{folder}: no manifest.json (not a folder written by torchbert prepare)")
    data = PretrainingData(folder, seed=s.seed)
    tok = BertTokenizer.from_pretrained(folder)
    data.check_vocab(tok)
    try:
        show(data, tok, folder, min(s.n, len(data)), s.jsonl)
    except BrokenPipeError:  # the reader (head, less) took what it wanted and went: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what Python flushes at exit goes nowhere


def show(data, tok, folder: Path, n: int, jsonl: bool) -> None:
    import numpy as np

    if not jsonl:
        m = data.manifest
        print(f"{folder}: {len(data):,} instances, {m['counts']['tokens']:,} tokens, {m['settings']['masking']} masking"
              f"{', whole word' if m['settings']['whole_word'] else ''}, max_seq_len {data.max_seq_len}; "
              f"showing {n}")
    for i in range(n):
        b = data.batch([i], epoch=0)
        inputs = tok.convert_ids_to_tokens(b.input_ids.tolist())
        originals = tok.convert_ids_to_tokens(np.asarray(data.instance(i)["tokens"]).tolist())
        positions = b.mlm_positions.tolist()
        is_random = bool(b.nsp_labels[0])
        if jsonl:
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
