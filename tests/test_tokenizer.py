"""torchbert.tokenizer against Hugging Face's BERT tokenizers, on real English and Chinese text.

References: `transformers.BertTokenizerFast` loaded from the MiniLM folder, the same class built
from nothing but vocab.txt (so a tokenizer.json we might also read is not the only witness), and
the slow pure-Python BERT tokenizer on a subset.
"""

from __future__ import annotations

import inspect
import json
import pickle
import random
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import realdata
import torch
import transformers
from transformers import AutoTokenizer, BertTokenizerFast

from torchbert.io.vocab import VocabError
from torchbert.tokenizer import BatchEncoding, BertTokenizer

transformers.utils.logging.set_verbosity_error()  # "sequence longer than 512" warnings are expected

MODES = [  # (truncation, max_length)
    (False, None),
    (True, 32),
    ("longest_first", 128),
]
PAIR_MODES = MODES[1:]  # untruncated pairs are covered by the slow-tokenizer test (Rust pairs are slow-ish)


# -- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vocab_file(minilm_dir) -> Path:
    return minilm_dir / "vocab.txt"


@pytest.fixture(scope="module")
def vocab_lines(vocab_file) -> list[str]:
    return vocab_file.read_text(encoding="utf-8").splitlines()


def hf_from_vocab(vocab_file: Path, **kwargs) -> BertTokenizerFast:
    """BertTokenizerFast built from vocab.txt alone (transformers 4 names it vocab_file, 5 vocab)."""
    params = inspect.signature(BertTokenizerFast.__init__).parameters
    key = "vocab" if "vocab" in params else "vocab_file"
    tok = BertTokenizerFast(**{key: str(vocab_file)}, **kwargs)
    n_lines = len(vocab_file.read_text(encoding="utf-8").splitlines())
    assert len(tok) == n_lines, "the reference did not load vocab.txt"
    return tok


def slow_hf_class():
    """transformers' pure-Python BERT tokenizer (BertTokenizerLegacy in 5.x, BertTokenizer in 4.x)."""
    return getattr(transformers, "BertTokenizerLegacy", None) or transformers.BertTokenizer


@pytest.fixture(scope="module")
def tok(minilm_dir) -> BertTokenizer:
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def tok_cased(tok) -> BertTokenizer:
    return BertTokenizer(tok.vocab, lowercase=False)


@pytest.fixture(scope="module")
def hf(minilm_dir) -> BertTokenizerFast:
    return BertTokenizerFast.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def hf_vocab(vocab_file) -> BertTokenizerFast:
    return hf_from_vocab(vocab_file, do_lower_case=True, tokenize_chinese_chars=True)


@pytest.fixture(scope="module")
def hf_cased(vocab_file) -> BertTokenizerFast:
    return hf_from_vocab(vocab_file, do_lower_case=False, tokenize_chinese_chars=True)


@pytest.fixture(scope="module")
def hf_slow(vocab_file):
    return slow_hf_class()(vocab_file=str(vocab_file), do_lower_case=True)


@pytest.fixture(scope="module")
def hf_slow_cased(vocab_file):
    return slow_hf_class()(vocab_file=str(vocab_file), do_lower_case=False)


@pytest.fixture(scope="module")
def english() -> list[str]:
    return list(realdata.english_texts())


@pytest.fixture(scope="module")
def chinese() -> list[str]:
    sents = realdata.peoples_daily_sentences()
    return list(sents[::10][:3000])  # spread over the whole month


@pytest.fixture(scope="module")
def corpora(english, chinese) -> dict[str, list[str]]:
    return {"english": english, "chinese": chinese}


def assert_same_encodings(ours: dict, ref, texts, keys=("input_ids", "token_type_ids", "attention_mask")):
    for key in keys:
        a, b = ours[key], ref[key]
        assert len(a) == len(b)
        bad = [i for i, (x, y) in enumerate(zip(a, b)) if list(x) != list(y)]
        assert not bad, f"{key}: {len(bad)} of {len(a)} differ, first {texts[bad[0]]!r}: {a[bad[0]]} != {b[bad[0]]}"


# -- 1. parity ---------------------------------------------------------------------------------


def test_corpora_are_big_enough(english, chinese):
    assert len(english) >= 2400
    assert len(chinese) >= 3000
    assert set(realdata.EDGE_CASES) <= set(english)


@pytest.mark.parametrize("corpus", ["english", "chinese"])
@pytest.mark.parametrize("paired", [False, True], ids=["single", "pair"])
def test_parity_with_hf_uncased(tok, hf, corpora, corpus, paired):
    texts = corpora[corpus]
    pairs = texts[1:] + texts[:1] if paired else None
    for truncation, max_length in PAIR_MODES if paired else MODES:
        ours = tok(texts, pairs, truncation=truncation, max_length=max_length)
        ref = hf(texts, pairs, truncation=truncation, max_length=max_length)
        assert_same_encodings(ours, ref, texts)
        longest = max(map(len, ours["input_ids"]))
        if max_length == 32:
            assert longest == 32  # truncation really happened
        elif max_length:
            assert longest <= max_length
        else:
            assert longest > 64  # so the 32-token cut mattered


@pytest.mark.parametrize("corpus", ["english", "chinese"])
def test_parity_with_hf_built_from_vocab_txt_only(tok, hf_vocab, corpora, corpus):
    texts = corpora[corpus]
    assert_same_encodings(tok(texts), hf_vocab(texts), texts)
    pairs, texts = texts[1:1000] + texts[:1], texts[:1000]
    ours = tok(texts, pairs, truncation=True, max_length=32)
    assert_same_encodings(ours, hf_vocab(texts, pairs, truncation=True, max_length=32), texts)


@pytest.mark.parametrize("corpus", ["english", "chinese"])
def test_parity_cased(tok_cased, hf_cased, corpora, corpus):
    texts = corpora[corpus]
    assert not tok_cased.lowercase
    single = tok_cased(texts)
    assert_same_encodings(single, hf_cased(texts), texts)
    texts, pairs = texts[:1000], texts[1:1000] + texts[:1]
    ours = tok_cased(texts, pairs, truncation=True, max_length=128)
    assert_same_encodings(ours, hf_cased(texts, pairs, truncation=True, max_length=128), texts)
    if corpus == "english":
        # The vocab is uncased: capitalised words miss, so casing really changed the ids.
        unk = sum(i == tok_cased.unk_token_id for ids in single["input_ids"] for i in ids)
        assert unk > 1000
        assert single["input_ids"] != BertTokenizer(tok_cased.vocab)(corpora[corpus])["input_ids"]


def test_parity_with_slow_python_tokenizer(tok, tok_cased, hf_slow, hf_slow_cased, english, chinese):
    texts = english[:300] + list(realdata.EDGE_CASES) + chinese[:200]
    for ours_tok, slow in ((tok, hf_slow), (tok_cased, hf_slow_cased)):
        ours = ours_tok(texts)["input_ids"]
        ref = [slow(t)["input_ids"] for t in texts]
        assert_same_encodings({"input_ids": ours}, {"input_ids": ref}, texts, keys=("input_ids",))
    # Pairs, and truncation of single texts (the slow tokenizer truncates pairs on its own rule).
    pairs = texts[1:] + texts[:1]
    ours = tok(texts, pairs)["input_ids"]
    ref = [hf_slow(a, b)["input_ids"] for a, b in zip(texts, pairs)]
    assert_same_encodings({"input_ids": ours}, {"input_ids": ref}, texts, keys=("input_ids",))
    ours = tok(texts, truncation=True, max_length=32)["input_ids"]
    ref = [hf_slow(t, truncation=True, max_length=32)["input_ids"] for t in texts]
    assert_same_encodings({"input_ids": ours}, {"input_ids": ref}, texts, keys=("input_ids",))


def test_longest_first_odd_budget_follows_fast_tokenizer(tok, hf, hf_slow):
    # Both sequences too long, an odd budget: Rust (BertTokenizerFast) gives the spare token to the
    # second sequence, the slow Python tokenizer to the first. We follow the fast one.
    a, b = " ".join("abcdefghijklmnop"), " ".join("qrstuvwxyzabcdef")
    ours = tok(a, b, truncation=True, max_length=10)
    assert tok.convert_ids_to_tokens(ours["input_ids"]) == (
        ["[CLS]", "a", "b", "c", "[SEP]", "q", "r", "s", "t", "[SEP]"]
    )
    assert ours["input_ids"] == hf(a, b, truncation=True, max_length=10)["input_ids"]
    assert ours["input_ids"] != hf_slow(a, b, truncation=True, max_length=10)["input_ids"]


def test_only_first_and_only_second(tok, hf, english):
    texts = english[:200]
    short = ["short question ?"] * len(texts)
    for strategy, first, second in (("only_first", texts, short), ("only_second", short, texts)):
        ours = tok(first, second, truncation=strategy, max_length=24)
        assert_same_encodings(ours, hf(first, second, truncation=strategy, max_length=24), first)
        assert max(map(len, ours["input_ids"])) == 24
        # The other sequence is kept whole.
        kept = [ids[ids.index(tok.sep_token_id) + 1 :] for ids in ours["input_ids"]]
        if strategy == "only_first":
            assert all(k == tok("short question ?")["input_ids"][1:] for k in kept)
    with pytest.raises(ValueError, match="only_second"):
        tok("one text that is too long", truncation="only_second", max_length=4)
    with pytest.raises(ValueError, match="only_first"):
        tok("too long a first text", "and a longer second text", truncation="only_first", max_length=8)


def test_single_text_gives_flat_lists(tok, hf):
    text = realdata.EDGE_CASES[7]
    ours = tok(text)
    assert isinstance(ours, BatchEncoding) and isinstance(ours, dict)
    assert ours["input_ids"] == hf(text)["input_ids"]
    assert isinstance(ours["input_ids"][0], int)
    assert ours["input_ids"][0] == tok.cls_token_id and ours["input_ids"][-1] == tok.sep_token_id


def test_no_special_tokens(tok, hf, english):
    texts = english[:300]
    ours = tok(texts, add_special_tokens=False)
    assert_same_encodings(ours, hf(texts, add_special_tokens=False), texts)
    assert all(tok.cls_token_id not in ids and tok.sep_token_id not in ids for ids in ours["input_ids"])


def test_special_token_text_is_matched_whole(tok, hf):
    text = "the [MASK] sat on [SEP] the mat [unk]"
    ours = tok(text)["input_ids"]
    assert ours == hf(text)["input_ids"]
    assert tok.mask_token_id in ours and ours.count(tok.sep_token_id) == 2
    assert tok.unk_token_id not in ours  # lowercase "[unk]" is plain text, split into [ unk ]


def test_encode_ids_is_the_input_ids(tok, english, chinese):
    texts = english[:500] + chinese[:500]
    assert tok.encode_ids(texts) == tok(texts)["input_ids"]
    truncated = tok(texts, truncation=True, max_length=16)["input_ids"]
    assert tok.encode_ids(texts, max_length=16, truncation=True) == truncated
    assert max(map(len, tok.encode_ids(texts, truncation=True))) <= 512
    with pytest.raises(TypeError, match="list of str"):
        tok.encode_ids("one text")


def test_calls_in_threads_do_not_share_truncation(tok, english):
    texts = english[:100]
    expected = {n: tok(texts, truncation=True, max_length=n)["input_ids"] for n in (8, 16, 24, 32)}
    full = tok(texts)["input_ids"]
    errors = []

    def work(n):
        for _ in range(10):
            if tok(texts, truncation=True, max_length=n)["input_ids"] != expected[n]:
                errors.append(n)
            if tok(texts)["input_ids"] != full:
                errors.append("untruncated")

    threads = [threading.Thread(target=work, args=(n,)) for n in expected]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert tok.backend.truncation is None and tok.backend.padding is None


# -- 2. offsets and word ids -----------------------------------------------------------------------


@pytest.mark.parametrize("paired", [False, True], ids=["single", "pair"])
def test_offsets_and_word_ids_match_hf(tok, hf, english, chinese, paired):
    texts = english[::8][:300] + list(realdata.EDGE_CASES) + chinese[:300]
    pairs = texts[1:] + texts[:1] if paired else None
    ours = tok(texts, pairs, return_offsets_mapping=True, return_word_ids=True, truncation=True, max_length=64)
    ref = hf(texts, pairs, return_offsets_mapping=True, truncation=True, max_length=64)
    assert_same_encodings(ours, ref, texts, keys=("input_ids", "offset_mapping"))
    for i, text in enumerate(texts):
        assert ours["word_ids"][i] == ref.word_ids(i), text
    # Offsets point at the text the token came from; specials are (0, 0) with word id None.
    ids, offsets, words = ours["input_ids"][0], ours["offset_mapping"][0], ours["word_ids"][0]
    assert offsets[0] == (0, 0) and words[0] is None and words[-1] is None
    for token, (start, end) in zip(tok.convert_ids_to_tokens(ids[1:4]), offsets[1:4]):
        assert texts[0][start:end].lower() == token.removeprefix("##")


def test_offsets_of_a_single_chinese_text(tok, hf):
    text = "BERT模型在2018年发布，效果很好！"
    ours = tok(text, return_offsets_mapping=True, return_word_ids=True)
    ref = hf(text, return_offsets_mapping=True)
    assert ours["offset_mapping"] == ref["offset_mapping"]
    assert ours["word_ids"] == ref.word_ids()
    chars = [text[s:e] for s, e in ours["offset_mapping"][1:-1]]
    assert chars[1:6] == ["模", "型", "在", "2018", "年"]


# -- 3. padding and tensors ------------------------------------------------------------------------


def test_padding_longest_pt(tok, hf, english):
    texts = english[:64]
    ours = tok(texts, padding=True, truncation=True, max_length=48, return_tensors="pt")
    ref = hf(texts, padding=True, truncation=True, max_length=48, return_tensors="pt")
    longest = max(len(ids) for ids in tok(texts, truncation=True, max_length=48)["input_ids"])
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert isinstance(ours[key], torch.Tensor) and ours[key].dtype == torch.int64
        assert ours[key].shape == (64, longest)
        assert torch.equal(ours[key], ref[key]), key
    pad = ours["attention_mask"] == 0
    assert pad.any()
    assert (ours["input_ids"][pad] == tok.pad_token_id).all()
    assert (ours["token_type_ids"][pad] == 0).all()
    assert ours.to("cpu")["input_ids"].device.type == "cpu"


def test_padding_pairs_np(tok, hf, chinese):
    texts, pairs = chinese[:40], chinese[40:80]
    ours = tok(texts, pairs, padding="longest", return_tensors="np", return_offsets_mapping=True)
    ref = hf(texts, pairs, padding="longest", return_tensors="np", return_offsets_mapping=True)
    for key in ("input_ids", "token_type_ids", "attention_mask", "offset_mapping"):
        assert isinstance(ours[key], np.ndarray) and ours[key].dtype == np.int64
        np.testing.assert_array_equal(ours[key], ref[key], err_msg=key)
    assert ours["offset_mapping"].shape == ours["input_ids"].shape + (2,)


def test_padding_max_length(tok, hf, english):
    texts = english[:50]
    ours = tok(texts, padding="max_length", truncation=True, max_length=64, return_tensors="pt")
    ref = hf(texts, padding="max_length", truncation=True, max_length=64, return_tensors="pt")
    assert ours["input_ids"].shape == (50, 64)
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert torch.equal(ours[key], ref[key]), key
    # Lists too, and max_length defaults to model_max_length.
    lists = tok(texts[:3], padding="max_length", return_word_ids=True)
    assert [len(ids) for ids in lists["input_ids"]] == [512] * 3
    assert lists["word_ids"][0][-1] is None
    single = tok("hello world", padding="max_length", max_length=8)
    assert single["input_ids"] == [101, 7592, 2088, 102, 0, 0, 0, 0]
    assert single["attention_mask"] == [1, 1, 1, 1, 0, 0, 0, 0]


def test_tensors_of_one_text_have_a_batch_dim(tok):
    out = tok("hello world", return_tensors="pt", return_offsets_mapping=True)
    assert out["input_ids"].tolist() == [[101, 7592, 2088, 102]]
    assert out["offset_mapping"].shape == (1, 4, 2)


def test_ragged_tensors_are_refused(tok):
    with pytest.raises(ValueError, match="padding"):
        tok(["a short one", "and a somewhat longer second text"], return_tensors="pt")
    # Equal lengths need no padding.
    assert tok(["a b", "c d"], return_tensors="pt")["input_ids"].shape == (2, 4)


# -- 4. decode and tokenize ------------------------------------------------------------------------


def test_decode_matches_hf(tok, hf, english, chinese):
    texts = english[::5] + chinese[:300]
    batch = tok(texts)["input_ids"]
    for text, ids in zip(texts, batch):
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
        assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False), text
    ids = tok("Hello, world! It costs $5.99 - really?")["input_ids"]
    assert tok.decode(ids) == "hello, world! it costs $ 5. 99 - really?"
    assert tok.decode(torch.tensor(ids)) == tok.decode(np.array(ids)) == tok.decode(ids)


def test_decode_round_trips_text_covered_by_the_vocab(tok):
    text = "the quick brown fox jumps over the lazy dog"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.decode(tok("unaffable")["input_ids"]) == "unaffable"  # joined back from ## pieces


def test_tokenize_matches_hf(tok, hf, tok_cased, hf_cased, english, chinese):
    for text in english + chinese[:500]:
        assert tok.tokenize(text) == hf.tokenize(text), text
    for text in realdata.EDGE_CASES:
        assert tok_cased.tokenize(text) == hf_cased.tokenize(text), text
    assert tok.tokenize("unaffable") == ["una", "##ffa", "##ble"]
    assert tok.tokenize("中文") == ["中", "文"]


def test_convert_tokens_and_ids(tok, hf, vocab_lines):
    tokens = tok.tokenize(realdata.EDGE_CASES[0])
    ids = tok.convert_tokens_to_ids(tokens)
    assert ids == hf.convert_tokens_to_ids(tokens)
    assert tok.convert_ids_to_tokens(ids) == tokens == hf.convert_ids_to_tokens(ids)
    assert tok.convert_tokens_to_ids("[MASK]") == vocab_lines.index("[MASK]") == tok.mask_token_id
    assert tok.convert_tokens_to_ids("no-such-token") == tok.unk_token_id
    assert tok.convert_ids_to_tokens(0) == vocab_lines[0]
    with pytest.raises(IndexError):
        tok.convert_ids_to_tokens(len(vocab_lines))


def test_vocab_and_special_ids(tok, hf, vocab_lines):
    assert len(tok) == tok.vocab_size == len(vocab_lines) == len(hf)
    assert tok.vocab == {t: i for i, t in enumerate(vocab_lines)}
    for name in ("pad", "unk", "cls", "sep", "mask"):
        assert getattr(tok, f"{name}_token_id") == getattr(hf, f"{name}_token_id"), name
    assert (tok.lowercase, tok.strip_accents, tok.tokenize_chinese_chars, tok.model_max_length) == (
        True, None, True, 512
    )


# -- 5. save and load ------------------------------------------------------------------------------


def test_save_load_round_trip(tok, english, chinese, tmp_path, vocab_file):
    tok.save_pretrained(tmp_path / "tok")
    files = sorted(p.name for p in (tmp_path / "tok").iterdir())
    assert files == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    assert (tmp_path / "tok" / "vocab.txt").read_bytes() == vocab_file.read_bytes()
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "BertTokenizer" and config["do_lower_case"] is True
    assert config["cls_token"] == "[CLS]" and config["model_max_length"] == 512
    assert json.loads((tmp_path / "tok" / "special_tokens_map.json").read_text())["mask_token"] == "[MASK]"

    back = BertTokenizer.from_pretrained(tmp_path / "tok")
    assert back.vocab == tok.vocab
    texts = english + chinese[:500]
    assert back(texts)["input_ids"] == tok(texts)["input_ids"]
    assert back.backend.to_str() == tok.backend.to_str()


def test_non_default_settings_round_trip_and_load_in_transformers(tok, english, chinese, tmp_path):
    texts = english + chinese[:500]
    custom = BertTokenizer(
        tok.vocab, lowercase=False, strip_accents=True, tokenize_chinese_chars=False, model_max_length=128
    )
    assert custom(texts)["input_ids"] != tok(texts)["input_ids"]
    custom.save_pretrained(tmp_path / "custom")
    back = BertTokenizer.from_pretrained(tmp_path / "custom")
    settings = lambda t: (t.lowercase, t.strip_accents, t.tokenize_chinese_chars, t.model_max_length)  # noqa: E731
    assert settings(back) == (False, True, False, 128)
    ids = custom(texts)["input_ids"]
    assert back(texts)["input_ids"] == ids
    long_text = " ".join(english[:20])
    assert len(back(long_text)["input_ids"]) > 128
    assert len(back(long_text, truncation=True)["input_ids"]) == 128

    for cls in (AutoTokenizer, BertTokenizerFast):
        loaded = cls.from_pretrained(tmp_path / "custom")
        assert loaded(texts)["input_ids"] == ids
        assert loaded.model_max_length == 128
    # A reference built from just the saved vocab.txt and the settings agrees too.
    ref = hf_from_vocab(
        tmp_path / "custom" / "vocab.txt", do_lower_case=False, strip_accents=True, tokenize_chinese_chars=False
    )
    assert ref(texts)["input_ids"] == ids


def test_transformers_loads_saved_uncased_folder(tok, english, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    ours = tok(english, english[1:] + english[:1], truncation=True, max_length=64)
    assert loaded(english, english[1:] + english[:1], truncation=True, max_length=64)["input_ids"] == ours["input_ids"]
    ids = ours["input_ids"][:200]
    assert [loaded.decode(i, skip_special_tokens=True) for i in ids] == [tok.decode(i) for i in ids]


def test_from_pretrained_vocab_file_and_config(tmp_path, vocab_file, tok):
    # A vocab.txt path works; a tokenizer_config.json next to it is honoured.
    assert BertTokenizer.from_pretrained(vocab_file).vocab == tok.vocab
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "vocab.txt").write_bytes(vocab_file.read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "model_max_length": int(1e30)}))
    loaded = BertTokenizer.from_pretrained(folder)
    assert loaded.lowercase is False and loaded.model_max_length == 512  # 1e30 means "unknown"
    assert loaded.tokenize("Hello") == ["[UNK]"]
    (folder / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        BertTokenizer.from_pretrained(folder)


def test_special_tokens_named_by_the_folder_are_berts_and_a_bad_map_is_named(tmp_path, vocab_file, tok):
    """special_tokens_map.json (and tokenizer_config.json's special tokens), which were never read: a map that
    cannot be read is a warning naming it (BERT's tokens are used); one that names another token for a role
    is an error naming the file and the role, in both layouts (vocab.txt, tokenizer.json alone)."""
    for layout in ("vocab.txt", "tokenizer.json"):
        folder = tmp_path / layout
        tok.save_pretrained(folder)
        if layout == "tokenizer.json":
            (folder / "vocab.txt").unlink()
        specials = folder / "special_tokens_map.json"
        assert json.loads(specials.read_text())["unk_token"] == "[UNK]"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert BertTokenizer.from_pretrained(folder).vocab == tok.vocab  # its own files: nothing said
        specials.write_text(json.dumps({"unk_token": {"content": "[UNK]", "lstrip": False}, "mask_token": "[MASK]"}))
        BertTokenizer.from_pretrained(folder)  # AddedToken's form, as transformers writes it
        specials.write_text("{not json")
        with pytest.warns(UserWarning, match=f"{specials}: not valid JSON.*BERT's special tokens"):
            assert BertTokenizer.from_pretrained(folder).vocab == tok.vocab
        specials.write_text(json.dumps({"unk_token": "<unk>"}))
        with pytest.raises(ValueError, match=f"{specials}: unk_token is '<unk>'; torchbert's BERT tokenizer uses"):
            BertTokenizer.from_pretrained(folder)
        specials.unlink()
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "mask_token": "<mask>"}))
        with pytest.raises(ValueError, match="tokenizer_config.json: mask_token is '<mask>'"):
            BertTokenizer.from_pretrained(folder)


def test_pickle(tok, english):
    copy = pickle.loads(pickle.dumps(tok))
    assert copy(english[:100], truncation=True, max_length=16)["input_ids"] == tok(
        english[:100], truncation=True, max_length=16
    )["input_ids"]


# -- 6. training -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train")
    lines = realdata.peoples_daily_lines()
    tweets = [" ".join(toks) for toks, _ in realdata.wnut_sentences()]
    zh_train, zh_held = lines[:-1000], lines[-1000:]
    en_train, en_held = tweets[:-300], tweets[-300:]
    (folder / "zh.txt").write_text("\n".join(zh_train) + "\n", encoding="utf-8")
    (folder / "en.txt").write_text("\n".join(en_train) + "\n", encoding="utf-8")
    tok = BertTokenizer.train(
        [folder / "zh.txt", str(folder / "en.txt")], vocab_size=8000, limit_alphabet=3000, show_progress=False
    )
    return tok, list(zh_held), list(en_held), folder


def unk_rate(tok, texts):
    ids = [i for seq in tok(texts, add_special_tokens=False)["input_ids"] for i in seq]
    return sum(i == tok.unk_token_id for i in ids) / len(ids)


def test_train_special_tokens_and_size(trained):
    tok = trained[0]
    assert [tok.convert_ids_to_tokens(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    special_ids = (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id)
    assert special_ids == (0, 1, 2, 3, 4)
    assert 7000 <= tok.vocab_size <= 8000
    assert sorted(tok.vocab.values()) == list(range(tok.vocab_size))


def test_train_chinese(trained):
    tok, zh_held = trained[0], trained[1]
    for char in "的国中人民年":
        assert char in tok.vocab
    text = zh_held[0]
    tokens = tok.tokenize(text)
    cjk = [t for t in tokens if "\u4e00" <= t[0] <= "\u9fff"]
    assert cjk and all(len(t) == 1 for t in cjk)
    assert unk_rate(tok, zh_held) < 0.01


def test_train_english(trained):
    tok, en_held = trained[0], trained[2]
    for word in ("the", "and", "you"):
        assert tok.tokenize(word) == [word]
    assert any(t.startswith("##") for t in tok.vocab)
    pieces = tok.tokenize("unbelievably")
    assert len(pieces) > 1 and all(p.startswith("##") for p in pieces[1:])
    assert "".join(pieces).replace("##", "") == "unbelievably"
    assert unk_rate(tok, en_held) < 0.02


def test_trained_tokenizer_saves_loads_and_matches_hf(trained, tmp_path):
    tok, zh_held, en_held, _ = trained
    texts = zh_held[:300] + en_held
    tok.save_pretrained(tmp_path)
    back = BertTokenizer.from_pretrained(tmp_path)
    assert back.vocab == tok.vocab
    ids = tok(texts, truncation=True, max_length=64)["input_ids"]
    assert back(texts, truncation=True, max_length=64)["input_ids"] == ids
    ref = hf_from_vocab(tmp_path / "vocab.txt", do_lower_case=True)
    assert ref(texts, truncation=True, max_length=64)["input_ids"] == ids
    assert AutoTokenizer.from_pretrained(tmp_path)(texts, truncation=True, max_length=64)["input_ids"] == ids


@pytest.mark.parametrize("limit_alphabet", [3000, 10000])  # the People's Daily's characters cut, and all kept
def test_training_again_gives_the_same_vocabulary(trained, limit_alphabet):
    """tokenizers' trainer alone numbers its continuing pieces in hash-map order and breaks ties by those
    numbers (its vocabulary changed from run to run: 6,374 to 6,382 tokens on compare's corpus)."""
    folder = trained[3]
    files = [folder / "zh.txt", folder / "en.txt"]
    earlier = [trained[0].vocab] if limit_alphabet == 3000 else []  # the module's, trained the same way
    runs = earlier + [BertTokenizer.train(files, vocab_size=8000, limit_alphabet=limit_alphabet,
                                          show_progress=False).vocab for _ in range(2 - len(earlier))]
    assert runs[0] == runs[1]  # two trainings apart (each trains twice inside), the same vocabulary
    if limit_alphabet == 3000:
        assert sum(len(t) == 1 for t in runs[0]) == 3000  # the alphabet was cut there


def test_the_alphabet_is_cut_by_count_then_by_code_point(tmp_path):
    """Where --limit-alphabet cuts among characters of equal count, the lower code points are kept (the
    trainer alone keeps a random few of them), and the more frequent first whatever their code point."""
    import string

    tied = [c for c in string.ascii_lowercase[:20]]  # a..t, 10 times each
    corpus = tmp_path / "c.txt"
    corpus.write_text(("z y x " * 30 + " ".join(tied) + "\n") * 10, encoding="utf-8")
    for _ in range(2):
        tok = BertTokenizer.train([corpus], vocab_size=100, min_frequency=1, limit_alphabet=13, show_progress=False)
        assert {t for t in tok.vocab if len(t) == 1} == set("xyz") | set("abcdefghij")


def test_train_refuses_a_vocabulary_smaller_than_its_special_tokens(tmp_path):
    with pytest.raises(ValueError, match=r"vocab_size must be in \[6, 1,048,576\] \(the special tokens and one more; .*\), got 5"):
        BertTokenizer.train([tmp_path / "never-read.txt"], vocab_size=5)


def test_train_missing_file(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        BertTokenizer.train([missing], vocab_size=100, show_progress=False)


def test_train_cased_keeps_case(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("Apple apple APPLE Banana banana\n" * 50, encoding="utf-8")
    tok = BertTokenizer.train([corpus], vocab_size=200, lowercase=False, min_frequency=1, show_progress=False)
    assert not tok.lowercase
    assert "Apple" in tok.vocab and "apple" in tok.vocab
    assert tok.tokenize("Apple apple") == ["Apple", "apple"]


# -- 7. bad input ----------------------------------------------------------------------------------


def write_vocab(folder: Path, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_bytes(data)
    return folder


GOOD_VOCAB = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n##s\n"


def test_missing_vocab(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no vocab\.txt") as e:
        BertTokenizer.from_pretrained(tmp_path)
    assert str(tmp_path) in str(e.value)
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        BertTokenizer.from_pretrained(tmp_path / "does-not-exist")


def test_empty_vocab(tmp_path):
    folder = write_vocab(tmp_path / "e", b"")
    with pytest.raises(ValueError, match="empty") as e:
        BertTokenizer.from_pretrained(folder)
    assert str(folder / "vocab.txt") in str(e.value)


def test_non_utf8_vocab_names_the_line(tmp_path):
    folder = write_vocab(tmp_path / "u", b"[PAD]\n[UNK]\n[CLS]\n[SEP]\nbad\xff\xfeword\n")
    with pytest.raises(ValueError, match=r"vocab\.txt:5: not valid UTF-8"):
        BertTokenizer.from_pretrained(folder)


def test_duplicate_token_names_the_line(tmp_path):
    folder = write_vocab(tmp_path / "d", (GOOD_VOCAB + "hello\n").encode())
    with pytest.raises(VocabError, match=r"vocab\.txt:9: duplicate token 'hello' \(first on line 6\)"):
        BertTokenizer.from_pretrained(folder)


def test_missing_cls(tmp_path):
    folder = write_vocab(tmp_path / "c", GOOD_VOCAB.replace("[CLS]\n", "").encode())
    with pytest.raises(ValueError, match=r"vocab\.txt.*\[CLS\]"):
        BertTokenizer.from_pretrained(folder)
    with pytest.raises(ValueError, match=r"\[SEP\]"):
        BertTokenizer({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2})


def test_vocab_without_mask_and_with_crlf(tmp_path):
    folder = write_vocab(tmp_path / "m", GOOD_VOCAB.replace("[MASK]\n", "").replace("\n", "\r\n").encode())
    small = BertTokenizer.from_pretrained(folder)
    assert small.mask_token_id is None and small.vocab_size == 7
    # Without a [MASK] entry the text "[MASK]" is plain text: "[", "mask", "]", all unknown.
    assert small("hello worlds [MASK]")["input_ids"] == [2, 4, 5, 6, 1, 1, 1, 3]
    assert small.tokenize("hello worlds") == ["hello", "world", "##s"]
    small.save_pretrained(tmp_path / "saved")
    assert "mask_token" not in json.loads((tmp_path / "saved" / "special_tokens_map.json").read_text())
    assert BertTokenizer.from_pretrained(tmp_path / "saved").mask_token_id is None


def test_vocab_files_at_their_edges(tmp_path):
    """A byte order mark is not part of the first token; an empty line, ids that skip a number, and a
    vocab.txt one line longer than its model's vocab_size are refused, naming the file (and line)."""
    bom = BertTokenizer.from_pretrained(write_vocab(tmp_path / "bom", b"\xef\xbb\xbf" + GOOD_VOCAB.encode()))
    assert bom.pad_token_id == 0 and bom.tokenize("hello worlds") == ["hello", "world", "##s"]
    with pytest.raises(VocabError, match=r"blank/vocab\.txt:9: empty line"):
        BertTokenizer.from_pretrained(write_vocab(tmp_path / "blank", (GOOD_VOCAB + "\nmore\n").encode()))
    with pytest.raises(VocabError, match=r"token ids must be 0\.\.4, each used once"):
        BertTokenizer({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "gap": 5})
    for size, fits in ((8, True), (7, False)):  # GOOD_VOCAB has 8 tokens
        folder = write_vocab(tmp_path / f"model-{size}", GOOD_VOCAB.encode())
        (folder / "config.json").write_text(json.dumps({"vocab_size": size}))
        if fits:
            assert BertTokenizer.from_pretrained(folder).vocab_size == 8
        else:
            with pytest.raises(ValueError, match=r"vocab\.txt: more tokens than the 7 of .*config\.json's vocab_size"):
                BertTokenizer.from_pretrained(folder)


def test_tokenizer_config_settings_are_checked_not_coerced(tmp_path):
    """do_lower_case "false" (a string) would be true in Python: refused, naming the key and the file."""
    for key, value in (("do_lower_case", "false"), ("strip_accents", 0), ("tokenize_chinese_chars", "yes")):
        folder = write_vocab(tmp_path / key, GOOD_VOCAB.encode())
        (folder / "tokenizer_config.json").write_text(json.dumps({key: value}))
        with pytest.raises(ValueError, match=rf"tokenizer_config\.json: {key} must be bool.*got {value!r}"):
            BertTokenizer.from_pretrained(folder)


def test_a_tokenizer_json_is_bert_s_own_and_fits_its_model(tmp_path, minilm_dir):
    """Beside a tokenizer.json: tokenizer_config.json's settings rule, BERT's defaults where it is silent,
    as in transformers (which rebuilds the normalizer from them); a tokenizer.json whose normalizer says
    otherwise is a warning. Pieces marked other than `##`, or more tokens than the model's vocab_size,
    are refused naming the file."""
    import warnings

    folder = tmp_path / "t"
    folder.mkdir()
    spec = json.loads((minilm_dir / "tokenizer.json").read_text())
    config = json.loads((minilm_dir / "config.json").read_text())
    spec["normalizer"].update(lowercase=False, strip_accents=False, handle_chinese_chars=False)  # a cased one
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "config.json").write_text(json.dumps(config))
    texts = ["Héllo Wörld, 北京天安门 THE End"] + list(realdata.english_texts()[:20])
    for given, warned in (({"model_max_length": 256}, True),
                          ({"do_lower_case": False, "strip_accents": False, "tokenize_chinese_chars": False}, False)):
        (folder / "tokenizer_config.json").write_text(json.dumps(given))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ours = BertTokenizer.from_pretrained(folder)
        said = [str(w.message) for w in caught if "disagrees with tokenizer_config.json" in str(w.message)]
        assert said == ([f"{folder / 'tokenizer.json'}: its normalizer disagrees with tokenizer_config.json (or "
                         "BERT's defaults where that is silent): lowercase False there, True here; strip_accents "
                         "False there, None here; tokenize_chinese_chars False there, True here; following "
                         "tokenizer_config.json, as transformers does"] if warned else [])
        assert ours.lowercase is warned and ours.model_max_length == given.get("model_max_length", 512)
        assert ours.encode_ids(texts) == AutoTokenizer.from_pretrained(folder)(texts)["input_ids"]
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": len(spec["model"]["vocab"]) - 1}))
    with pytest.raises(ValueError, match=r"tokenizer\.json: 30,522 tokens, more than the 30,521 of .*vocab_size"):
        BertTokenizer.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config))
    spec["model"]["continuing_subword_prefix"] = "@@"
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(VocabError, match=r"tokenizer\.json: normalizer BertNormalizer, .* pieces '@@'"):
        BertTokenizer.from_pretrained(folder)


def test_non_str_input(tok):
    for bad in (123, None, b"bytes", ["ok", 3], {"a": 1}):
        with pytest.raises(TypeError, match=r"text(\[1\])? must be (a )?str"):
            tok(bad)
    with pytest.raises(TypeError, match="text_pair"):
        tok("a", 5)
    with pytest.raises(TypeError):
        tok(["a"], "b")
    with pytest.raises(ValueError, match="2 items"):
        tok(["a", "b"], ["c"])
    with pytest.raises(TypeError, match="must be a str"):
        tok.tokenize(["a list"])


def test_bad_options(tok):
    with pytest.raises(ValueError, match="truncation"):
        tok("a", truncation="sideways")
    with pytest.raises(ValueError, match="padding"):
        tok("a", padding="max")
    with pytest.raises(ValueError, match="return_tensors"):
        tok("a", return_tensors="tf")
    for kw in (dict(truncation=True), dict(padding="max_length")):
        with pytest.raises(ValueError, match=r"max_length must be a positive int or None, got 0"):
            tok("a", max_length=0, **kw)
    with pytest.raises(ValueError, match=r"max_length=1 leaves no room for \[CLS\] and \[SEP\]"):
        tok.encode_ids(["a"], max_length=1, truncation=True)
    for bad in (-1, tok.vocab_size):
        with pytest.raises(IndexError, match=f"token id {bad} is out of range"):
            tok.convert_ids_to_tokens(bad)
    with pytest.raises(ValueError, match="special tokens"):
        tok("a", "b", max_length=2, truncation=True)


def test_empty_and_whitespace_only_text(tok, hf):
    cls_sep = [tok.cls_token_id, tok.sep_token_id]
    for text in ("", "   \t\n  ", "\u200b\x00 \u00a0"):
        assert tok(text)["input_ids"] == cls_sep == hf(text)["input_ids"], repr(text)
        assert tok.tokenize(text) == []
    assert tok("", "")["input_ids"] == cls_sep + [tok.sep_token_id]
    assert tok([], return_tensors="pt")["input_ids"].shape == (0, 0)
    for kind in ("pt", "np"):  # offsets keep their pairs' axis
        assert tuple(tok([], return_offsets_mapping=True, return_tensors=kind)["offset_mapping"].shape) == (0, 0, 2)


def test_long_sequence_is_not_truncated_without_truncation(tok, hf, chinese):
    text = "".join(chinese[:40])
    assert len(text) > 600
    ids = tok(text)["input_ids"]
    assert len(ids) > tok.model_max_length
    assert ids == hf(text)["input_ids"]
    assert len(tok(text, max_length=64)["input_ids"]) == len(ids)  # max_length alone does not cut
    assert len(tok(text, truncation=True)["input_ids"]) == 512


# -- 8. long words -----------------------------------------------------------------------------------


def test_word_over_100_chars_is_unk(tok, hf, tok_cased, hf_cased):
    assert len(tok.tokenize("a" * 100)) > 1  # exactly 100 characters: still split into pieces
    for text in ("a" * 101, "x " + "ab" * 60 + " y", realdata.EDGE_CASES[9]):
        assert tok(text)["input_ids"] == hf(text)["input_ids"]
        assert tok_cased(text)["input_ids"] == hf_cased(text)["input_ids"]
    assert tok.tokenize("a" * 101) == ["[UNK]"]
    assert tok.tokenize("x " + "ab" * 60 + " y") == ["x", "[UNK]", "y"]
    first = tok.tokenize(realdata.EDGE_CASES[9])
    assert first[0] == "[UNK]" and first[1:4] == ["is", "longer", "than"]


def test_a_folder_with_only_tokenizer_json_loads_with_the_same_ids(tmp_path, minilm_dir):
    """transformers 5 (so sentence-transformers' save) writes tokenizer.json and no vocab.txt: the
    tokenizer reads its WordPiece vocabulary and normalizer and gives transformers' ids; a tokenizer.json
    of another kind is a one-line error naming it."""
    import json
    import shutil

    import realdata
    from transformers import AutoTokenizer

    from torchbert.io.vocab import VocabError
    from torchbert.tokenizer import BertTokenizer

    folder = tmp_path / "t"
    folder.mkdir()
    for name in ("tokenizer.json", "config.json"):
        shutil.copy(minilm_dir / name, folder / name)
    texts = list(realdata.english_texts()[:20]) + list(realdata.peoples_daily_sentences()[:20]) + ["Café ÀÉ naïve"]
    ours = BertTokenizer.from_pretrained(folder)
    assert ours.encode_ids(texts) == AutoTokenizer.from_pretrained(minilm_dir)(texts)["input_ids"]
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["model"]["type"] = "BPE"
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(VocabError, match=r"tokenizer.json: a BPE tokenizer; BERT's tokenizer is WordPiece"):
        BertTokenizer.from_pretrained(folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no vocab.txt \(or tokenizer.json\) in this folder"):
        BertTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("padding", [True, "max_length"])
def test_a_batch_over_several_chunks_pads_as_one(tok, hf, chinese, english, padding):
    """Encoded CHUNK inputs at a time (a truncated Rust encoding holds every window cut off it), padded
    afterwards: the batch is the reference's, padded to its longest sequence across chunks (or to
    max_length), offsets and word ids included."""
    from torchbert.tokenizer import CHUNK

    texts = (chinese + english)[:2 * CHUNK + 37]
    pairs = texts[5:] + texts[:5]
    assert len(texts) > 2 * CHUNK
    kw = dict(truncation="longest_first", max_length=48, padding=padding, return_offsets_mapping=True)
    ours = tok(texts, pairs, return_tensors="pt", **kw)
    ref = hf(texts, pairs, return_tensors="pt", **kw)
    for key in ("input_ids", "token_type_ids", "attention_mask", "offset_mapping"):
        assert torch.equal(ours[key], ref[key]), key
    assert ours["input_ids"].shape[1] == 48  # the longest pair reaches max_length, in some chunk
    ours = tok(texts, pairs, return_word_ids=True, **kw)
    ref = hf(texts, pairs, **kw)
    assert ours["word_ids"] == [ref.word_ids(i) for i in range(len(texts))]
    short = tok(["a"] * CHUNK + ["a b c d e f"], padding=True)  # the longest alone in the second chunk
    assert {len(r) for r in short["input_ids"]} == {8} and short["attention_mask"][0] == [1, 1, 1] + [0] * 5


def test_vocab_leaves_out_the_words_the_tokenizer_makes_unk_whole(tmp_path, monkeypatch):
    """A word longer than MAX_INPUT_CHARS_PER_WORD characters is [UNK] whole when encoded; `torchbert vocab`
    does not give it to the trainer (whose merges cost it time by its length squared: a 16 MB line without a
    space took 116 s, 6 s without it). Where such words sit among ordinary text, the vocabulary is the one of
    that text alone; a run without spaces that punctuation cuts into short words is kept."""
    from torchbert.cli import main
    from torchbert.tokenizer import MAX_INPUT_CHARS_PER_WORD

    rng = random.Random(0)
    text = [" ".join(toks) for toks, _ in realdata.wnut_sentences()[:1500]]
    long_word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5000))
    kept = "/".join(rng.choice(["www", "example", "com", "search", "query"]) for _ in range(60))  # a URL's shape
    (tmp_path / "plain.txt").write_text("\n".join(text + [kept]) + "\n", encoding="utf-8")
    text_with = text[:700] + [long_word[:101]] + text[700:] + [kept]
    text_with[5] = f"{text_with[5]} {long_word}"  # in the middle of a line too
    (tmp_path / "with.txt").write_text("\n".join(text_with) + "\n", encoding="utf-8")
    seen = []
    train = BertTokenizer.train.__func__

    def spy(cls, files, *a, **k):
        seen.extend(Path(f).read_text(encoding="utf-8") for f in files)
        return train(cls, files, *a, **k)

    monkeypatch.setattr(BertTokenizer, "train", classmethod(spy))
    for name in ("plain", "with"):
        assert main(["vocab", "--corpus", str(tmp_path / f"{name}.txt"), "--vocab-size", "800", "--out",
                     str(tmp_path / f"v-{name}"), "--quiet"]) == 0
    assert max(len(w) for w in seen[1].split()) <= MAX_INPUT_CHARS_PER_WORD and long_word not in seen[1]
    assert "search" in seen[1]  # the URL, cut into its words by its punctuation, is trained on
    assert (tmp_path / "v-with" / "vocab.txt").read_text() == (tmp_path / "v-plain" / "vocab.txt").read_text()
