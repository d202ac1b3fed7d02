"""`prepare`'s plan: what a run will do, decided from the corpus files and the settings alone (never
from the worker count), written as `OUT.partial/plan.json` before any work, so that `--resume` can
tell whether it continues the same run (`differences`) and every worker reads the same plan."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from .pretraining import PrepareSettings, split_sentences

PLAN = "plan.json"
MAX_BLOCKS = 10_000  # a block is a folder and a task: more is only overhead (the corpus in pieces of < 1 MB)
PLAN_VERSION = 3          # 3: compressed files in pieces of their text; blocks by the documents' tokens
PIECE_BYTES = 8 << 20     # a piece of a file's text, and a part of any piece: a worker's text at a time


def partial_folder(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def make_plan(corpus: Sequence, tokenizer_dir, s: PrepareSettings, vocab_sha256: str,
              announce: Callable[[str], None] | None = None) -> dict:
    """What the run will do, from the corpus files alone (never from the worker count)."""
    from .sources import corpus_files, plan_pieces

    files = corpus_files(corpus)
    block_bytes = max(1, int(s.block_mb * (1 << 20)))
    pieces = plan_pieces(files, s.format, min(PIECE_BYTES, block_bytes), split_sentences, announce)
    if not pieces:
        raise ValueError(f"{', '.join(map(str, corpus))}: the corpus is empty (no text)")
    text_bytes = sum(p.size for p in pieces)
    blocks = max(1, -(-text_bytes // block_bytes))
    if blocks > MAX_BLOCKS:
        raise ValueError(f"--block-mb {s.block_mb:g}: cuts this corpus ({text_bytes / (1 << 20):,.1f} MB of text) into "
                         f"{blocks:,} blocks, a folder each; at most {MAX_BLOCKS:,}: give --block-mb "
                         f"{math.ceil(text_bytes / MAX_BLOCKS / (1 << 20) * 1000) / 1000:g} or more")
    data = {k: v for k, v in asdict(s).items() if k not in PrepareSettings.RUN_ONLY}
    return json.loads(json.dumps({  # as it reads back from plan.json (tuples as lists)
        "version": PLAN_VERSION,
        "settings": data,
        "corpus": [str(c) for c in corpus],
        "files": [{"path": str(f), "size": f.stat().st_size, "mtime_ns": f.stat().st_mtime_ns} for f in files],
        "tokenizer": str(Path(tokenizer_dir).resolve()),
        "vocab_sha256": vocab_sha256,
        "pieces": [p.to_json() for p in pieces],
        "blocks": blocks,
        "piece_bytes": min(PIECE_BYTES, block_bytes),
        "bytes": sum(p.size for p in pieces),
    }))


def differences(old: dict, new: dict) -> list[str]:
    """What changed between an unfinished run's plan and this command's, in the user's words."""
    out = []
    for key, value in new["settings"].items():
        if old.get("settings", {}).get(key) != value:
            out.append(f"--{key.replace('_', '-')} {old.get('settings', {}).get(key)} -> {value}")
    if [f["path"] for f in old.get("files", [])] != [f["path"] for f in new["files"]]:
        out.append("the corpus files")
    else:
        for a, b in zip(old["files"], new["files"]):
            if a != b:
                out.append(f"{b['path']} changed since")
    if old.get("vocab_sha256") != new["vocab_sha256"]:
        out.append("the tokenizer's vocab")
    if not out and old != new:
        out.append("the plan (another torchbert version?)")
    return out


_PLANS: dict[str, tuple[float, dict]] = {}


def load_plan(work: Path) -> dict:
    path = Path(work) / PLAN
    stamp = path.stat().st_mtime_ns
    cached = _PLANS.get(str(path))
    if cached is None or cached[0] != stamp:
        _PLANS[str(path)] = cached = (stamp, json.loads(path.read_text(encoding="utf-8")))
    return cached[1]
