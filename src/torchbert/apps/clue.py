"""CLUE's files as its download holds them, made into the layouts the task families read, and the
test predictions written back in the leaderboard's own format.

CLUE (Xu et al. 2020) gives each task a folder of JSON Lines files whose keys differ by task; CSL's
keywords are a list, CLUEWSC2020 marks its two spans by character offsets, CLUENER gives entities as
offsets per type, C3 is a JSON array split over two files (dialogues d-*.json and mixed texts m-*.json),
and CMNLI and OCNLI mark the pairs on whose label the annotators did not agree with "-". Each
converter reads one official file (every line checked; a bad one is an error naming FILE:LINE) and
writes the task's examples as JSON Lines for the text and multiple-choice families, or as CoNLL for
the token family:

    convert(src, dst, labelled, warn)      # AFQMC: {"id", "sentence1", "sentence2", "label"} per line

CMRC 2018 is SQuAD's format and needs none. The submission writers turn the chosen run's prediction
records (`torchbert predict`) into the `<task>_predict.json` files the leaderboard takes.
"""

# ruff: noqa: TRY004  (a wrong type of value in a file is bad input, a ValueError like every other)

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..io.files import atomic_write_text
from ..io.texts import json_records

Warn = Callable[[str], object]


def _text(record: dict, key: str, where: str, task: str, keys: str) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        found = "none" if value is None else f"a {type(value).__name__}"
        raise ValueError(f"{where}: {key!r} is {found}; a {task} line has {keys}")
    return value


def _id(record: dict, n: int) -> str:
    """The example's id: the file's own ("id", or CLUEWSC2020's "idx"), else its line's index from 0."""
    for key in ("id", "idx"):
        if isinstance(record.get(key), (int, str)) and record[key] != "":
            return str(record[key])
    return str(n - 1)


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def text_converter(task: str, fields: tuple[str, ...], drop_unsure: bool = False) -> Callable[..., None]:
    """A sentence (one field) or pair (two) task whose lines hold the fields, "label" and (test) "id".
    drop_unsure: pairs labelled "-" (no majority among the annotators) are left out of labelled splits,
    as CLUE's own readers do."""
    names = ("sentence",) if len(fields) == 1 else ("sentence1", "sentence2")
    keys = ", ".join([*fields, "label"])

    def convert(src: Path, dst: Path, labelled: bool, warn: Warn) -> None:
        rows, unsure = [], 0
        for n, record in json_records(src):
            where = f"{src}:{n}"
            row = {"id": _id(record, n)}
            for name, key in zip(names, fields):
                row[name] = _text(record, key, where, task, keys)
            if labelled:
                label = record.get("label")
                if not isinstance(label, (str, int)) or label == "":
                    raise ValueError(f"{where}: no label; a labelled {task} line has {keys}")
                if drop_unsure and label == "-":
                    unsure += 1
                    continue
                row["label"] = str(label)
            rows.append(row)
        if unsure:
            warn(f"{src}: left out {unsure} pair(s) labelled '-' (the annotators did not agree), as CLUE does")
        atomic_write_text(dst, _jsonl(rows))

    return convert


def convert_csl(src: Path, dst: Path, labelled: bool, warn: Warn) -> None:
    """CSL: are these keywords the paper's own? A pair: the keywords (joined by spaces, as CLUE's
    baseline) and the abstract."""
    rows = []
    for n, record in json_records(src):
        where = f"{src}:{n}"
        words = record.get("keyword")
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise ValueError(f"{where}: 'keyword' is {json.dumps(words, ensure_ascii=False)[:40]}; a CSL line has "
                             "keyword (a list of strings), abst, label")
        row = {"id": _id(record, n), "sentence1": " ".join(words),
               "sentence2": _text(record, "abst", where, "CSL", "keyword, abst, label")}
        if labelled:
            row["label"] = str(record.get("label", ""))
            if row["label"] == "":
                raise ValueError(f"{where}: no label; a labelled CSL line has keyword, abst, label")
        rows.append(row)
    atomic_write_text(dst, _jsonl(rows))


def convert_wsc(src: Path, dst: Path, labelled: bool, warn: Warn) -> None:
    """CLUEWSC2020: does the pronoun (span2) refer to the noun (span1)? One sentence, the noun marked
    _so_ and the pronoun [so], at the offsets the file gives (as CLUE's baseline marks them)."""
    keys = "text, target {span1_index, span1_text, span2_index, span2_text}, label"
    rows = []
    for n, record in json_records(src):
        where = f"{src}:{n}"
        text = _text(record, "text", where, "CLUEWSC2020", keys)
        target = record.get("target")
        if not isinstance(target, dict):
            raise ValueError(f"{where}: no 'target' object; a CLUEWSC2020 line has {keys}")
        spans = []
        for k, (left, right) in ((1, ("_", "_")), (2, ("[", "]"))):
            start, span = target.get(f"span{k}_index"), target.get(f"span{k}_text")
            if not isinstance(start, int) or not isinstance(span, str) or text[start:start + len(span)] != span:
                raise ValueError(f"{where}: span{k}_text {span!r} is not at span{k}_index {start!r} of the text")
            spans.append((start, start + len(span), left, right))
        marked = text
        for start, end, left, right in sorted(spans, reverse=True):  # the later span first: offsets hold
            marked = marked[:start] + left + marked[start:end] + right + marked[end:]
        row = {"id": _id(record, n), "sentence": marked}
        if labelled:
            label = record.get("label")
            if label not in ("true", "false"):
                raise ValueError(f"{where}: label {label!r}; a labelled CLUEWSC2020 line has \"true\" or \"false\"")
            row["label"] = label
        rows.append(row)
    atomic_write_text(dst, _jsonl(rows))


SPACE = "_"  # a CoNLL token cannot be blank: a whitespace character of a CLUENER text is written as this


def convert_cluener(src: Path, dst: Path, labelled: bool, warn: Warn) -> None:
    """CLUENER2020: a CoNLL sentence per line, a character per token, tagged B-/I-TYPE from the
    entities' offsets (end included); test lines untagged."""
    blocks = []
    for n, record in json_records(src):
        where = f"{src}:{n}"
        text = _text(record, "text", where, "CLUENER", "text, label {type: {entity: [[start, end], ...]}}")
        if not text.strip():
            raise ValueError(f"{where}: an empty text")
        chars = [SPACE if ch.isspace() else ch for ch in text]
        if not labelled:
            blocks.append("".join(ch + "\n" for ch in chars))
            continue
        tags = ["O"] * len(text)
        label = record.get("label", {})
        if not isinstance(label, dict):
            raise ValueError(f"{where}: 'label' is not an object {{type: {{entity: [[start, end], ...]}}}}")
        for kind, entities in label.items():
            for entity, places in (entities or {}).items():
                for place in places:
                    if not (isinstance(place, list) and len(place) == 2 and all(isinstance(x, int) for x in place)
                            and 0 <= place[0] <= place[1] < len(text) and text[place[0]:place[1] + 1] == entity):
                        raise ValueError(f"{where}: {kind} {entity!r} is not at {place} of the text")
                    tags[place[0]] = f"B-{kind}"
                    for i in range(place[0] + 1, place[1] + 1):
                        tags[i] = f"I-{kind}"
        blocks.append("".join(f"{ch}\t{tag}\n" for ch, tag in zip(chars, tags)))
    atomic_write_text(dst, "\n".join(blocks))


def convert_c3(src: Path, dst: Path, labelled: bool, warn: Warn) -> None:
    """C3: multiple choice over a document (its sentences joined). A training or dev split is two files,
    d-SPLIT.json (dialogues) and m-SPLIT.json (mixed texts): `src` names the d- one, whose m- sibling is
    read with it when present (CLUE's readers concatenate the two)."""
    sources = [src]
    if src.name.startswith("d-") and (src.parent / ("m-" + src.name[2:])).is_file():
        sources.append(src.parent / ("m-" + src.name[2:]))
    rows = []
    for path in sources:
        try:
            items = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e.reason})") from None
        if not isinstance(items, list):
            raise ValueError(f"{path}: expected a JSON array of [sentences, questions, id] items (C3's layout)")
        for i, item in enumerate(items):
            where = f"{path}: item {i}"
            if not (isinstance(item, list) and len(item) >= 2 and isinstance(item[0], list)
                    and isinstance(item[1], list)):
                raise ValueError(f"{where}: expected [sentences, questions, id]")
            context = "".join(str(s) for s in item[0])
            for k, q in enumerate(item[1]):
                choices = q.get("choice") if isinstance(q, dict) else None
                if not (isinstance(choices, list) and len(choices) >= 2 and all(isinstance(c, str) for c in choices)
                        and isinstance(q.get("question"), str)):
                    raise ValueError(f"{where}, question {k}: expected {{\"question\", \"choice\": [2 or more], "
                                     "\"answer\"}")
                ident = q.get("id", f"{item[2] if len(item) > 2 else i}-{k}")
                row = {"id": str(ident), "context": context, "question": q["question"], "choices": choices}
                if labelled:
                    if q.get("answer") not in choices:
                        raise ValueError(f"{where}, question {k}: the answer {q.get('answer')!r} is not a choice")
                    row["label"] = choices.index(q["answer"])
                rows.append(row)
    atomic_write_text(dst, _jsonl(rows))


# -- the leaderboard's files --------------------------------------------------------------------------

def _official_id(ident: str) -> int | str:
    return int(ident) if ident.isdigit() else ident


def submit_labels(records: list[dict[str, Any]], source: Path) -> str:
    """{"id", "label"} per line: the classification tasks' file."""
    return _jsonl([{"id": _official_id(r["id"]), "label": r["label"]} for r in records])


def submit_choices(records: list[dict[str, Any]], source: Path) -> str:
    """{"id", "label": the chosen index} per line: C3's file."""
    return _jsonl([{"id": _official_id(r["id"]), "label": r["choice"]} for r in records])


def submit_answers(records: list[dict[str, Any]], source: Path) -> str:
    """{question id: answer}: CMRC 2018's file, one JSON object."""
    return json.dumps({r["id"]: r["answer"] for r in records}, ensure_ascii=False, indent=1) + "\n"


def entities(text: str, tags: list[str]) -> dict[str, dict[str, list[list[int]]]]:
    """The entities of B-/I- tags over a text's characters, as CLUENER writes them: {type: {entity:
    [[start, end], ...]}}, end included; an I- tag that does not continue its type starts an entity."""
    out: dict[str, dict[str, list[list[int]]]] = {}
    start, kind = None, None

    def close(end: int) -> None:
        if kind is not None:
            out.setdefault(kind, {}).setdefault(text[start:end + 1], []).append([start, end])

    for i, tag in enumerate([*tags, "O"]):
        head, _, name = tag.partition("-")
        if head == "I" and name == kind:
            continue
        close(i - 1)
        start, kind = (i, name) if head in ("B", "I") and name else (None, None)
    return out


def submit_entities(records: list[dict[str, Any]], source: Path) -> str:
    """{"id", "label": {type: {entity: [[start, end]]}}} per line: CLUENER's file, the ids and texts read
    back from the official test file, in its order (the records are in the same order)."""
    lines = list(json_records(source))
    if len(lines) != len(records):
        raise ValueError(f"{source}: {len(lines)} lines, but {len(records)} predictions")
    return _jsonl([{"id": _official_id(_id(rec, n)), "label": entities(rec["text"], r["tags"])}
                   for (n, rec), r in zip(lines, records)])
