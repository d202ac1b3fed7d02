"""Feature extraction: layer strategies, word pooling, sentence embeddings, and the embed path."""

import numpy as np
import pytest
import realdata
import torch
import transformers
from parity import assert_parity

from torchbert import BertModel
from torchbert.features import combine_layers, embed, pool, token_features, word_features
from torchbert.tokenizer import BertTokenizer


@pytest.fixture(scope="module")
def ours(minilm_dir):
    return BertModel.from_pretrained(minilm_dir).eval()


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def reference(minilm_dir, tok):
    """transformers' hidden states for a mixed English/Chinese batch."""
    hf = transformers.BertModel.from_pretrained(minilm_dir).eval()
    texts = list(realdata.english_texts()[100:106]) + list(realdata.peoples_daily_sentences()[100:106])
    enc = tok(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        hs = hf(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], output_hidden_states=True).hidden_states
    return texts, enc, hs


@pytest.mark.parametrize("strategy,expect", [
    ("embeddings", lambda hs: hs[0]),
    ("last", lambda hs: hs[6]),
    ("second_to_last", lambda hs: hs[5]),
    ("sum_all", lambda hs: sum(hs[1:])),
    ("sum_last_four", lambda hs: hs[3] + hs[4] + hs[5] + hs[6]),
    ("concat_last_four", lambda hs: torch.cat([hs[3], hs[4], hs[5], hs[6]], -1)),
    (2, lambda hs: hs[2]),
    ("-3", lambda hs: hs[4]),
])
@torch.no_grad()
def test_layer_strategies_match_transformers(ours, reference, strategy, expect):
    _, enc, hs = reference
    got = token_features(ours, enc["input_ids"], enc["attention_mask"], strategy=strategy)
    want = expect(hs)
    m = enc["attention_mask"].bool()
    assert got.shape == want.shape
    assert_parity(got[m], want[m])


def test_bad_strategies():
    hs = [torch.zeros(1, 2, 3)] * 3
    with pytest.raises(ValueError, match="unknown layer strategy 'top'"):
        combine_layers(hs, "top")
    with pytest.raises(ValueError, match="layer 3 out of range for a model with 2 layers"):
        combine_layers(hs, 3)
    with pytest.raises(ValueError, match="needs at least 4 layers"):
        combine_layers(hs, "sum_last_four")


def test_word_features_first_and_mean(tok):
    enc = tok("unaffable strawberries are great", return_word_ids=True)
    tokens = tok.convert_ids_to_tokens(enc["input_ids"])
    word_ids = enc["word_ids"]
    assert word_ids[0] is None and word_ids[-1] is None and max(w for w in word_ids if w is not None) == 3
    feats = torch.arange(len(tokens), dtype=torch.float32)[:, None].repeat(1, 2)  # token i -> [i, i]
    first = word_features(feats, word_ids, "first")
    mean = word_features(feats, word_ids, "mean")
    for w in range(4):
        positions = [i for i, x in enumerate(word_ids) if x == w]
        assert first[w, 0] == positions[0]
        assert mean[w, 0] == pytest.approx(sum(positions) / len(positions))
    assert len([t for t in tokens if t.startswith("##")]) >= 1  # some word really has several pieces
    with pytest.raises(ValueError, match="'first' or 'mean'"):
        word_features(feats, word_ids, "last")


def test_pooling_ignores_padding():
    feats = torch.tensor([[[1.0, 5.0], [3.0, -1.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert pool(feats, mask, "cls").tolist() == [[1.0, 5.0]]
    assert pool(feats, mask, "mean").tolist() == [[2.0, 2.0]]
    assert pool(feats, mask, "max").tolist() == [[3.0, 5.0]]


@pytest.mark.parametrize("pooling", ["cls", "mean", "max"])
@pytest.mark.parametrize("layers", ["last", "sum_last_four", "concat_last_four"])
def test_embed_matches_padded_path_in_input_order(ours, tok, reference, pooling, layers):
    texts, enc, _ = reference
    with torch.no_grad():
        feats = token_features(ours, enc["input_ids"], enc["attention_mask"], strategy=layers)
        want = torch.nn.functional.normalize(pool(feats, enc["attention_mask"], pooling), dim=-1).numpy()
    got = embed(ours, tok, texts, pooling=pooling, layers=layers, normalize=True, batch_size=5, max_length=64)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert_parity(got, want)


def test_sentence_transformers_parity(minilm_dir, ours, tok):
    """Mean-pooled, normalized MiniLM embeddings equal sentence-transformers' all-MiniLM-L6-v2."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_dir), device="cpu")
    texts = list(realdata.english_texts()[200:300]) + list(realdata.peoples_daily_sentences()[200:260])
    want = st.encode(texts, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)
    got = embed(ours, tok, texts, pooling="mean", normalize=True, max_length=st.max_seq_length)
    cos = (want * got).sum(1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.99999
    assert_parity(got, want)


def test_embed_truncates_to_the_model_limit(ours, tok):
    long = "word " * 2000  # "word" is one token: 2,000 tokens, the model reads 512 ([CLS], 510 words, [SEP])
    got = embed(ours, tok, [long, "short"], max_length=None)
    assert got.shape == (2, 384) and np.isfinite(got).all()
    assert_parity(got[0], embed(ours, tok, ["word " * 510], max_length=None)[0])  # the text cut at the limit
    assert not np.allclose(got[0], embed(ours, tok, ["word " * 509], max_length=None)[0])  # and not shorter
