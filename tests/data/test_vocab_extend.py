"""`torchbert vocab --extend`: a checkpoint's vocabulary grown with a corpus's words. New rows are the
mean of the rows of their old pieces, every old token keeps its id and row, [unused] slots are taken
before ids are appended, and transformers loads the folder with the same outputs on old tokens."""

import json

import pytest
import torch
from clihelp import cli
from safetensors.torch import load_file

import realdata
from torchbert import BertConfig, BertModel, BertTokenizer

SPECIALS = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def small_checkpoint(folder):
    """A tiny BERT whose vocabulary reads English words letter by letter and has no Chinese."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = SPECIALS + letters + ["##" + c for c in letters] + ["the", "."]
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=32)).save_pretrained(folder)
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    return folder, vocab


def test_new_tokens_take_the_unused_slots_then_follow_the_last_id_with_their_pieces_mean(tmp_path, capsys):
    base, vocab = small_checkpoint(tmp_path / "base")
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world. hello world the\nhello 你好 world 你\nzz hello\n", encoding="utf-8")
    code, out, err = cli(capsys, "vocab", "--extend", base, "--corpus", corpus, "--add", "4", "--min-frequency", "1",
                         "--out", tmp_path / "x")
    assert code == 0, err
    # by frequency: hello 4, world 3, 你 2, 好 1 (zz has 2 pieces, under --min-pieces 3)
    grown = (tmp_path / "x" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert grown[:7] == ["[PAD]", "hello", "world", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert grown[len(vocab):] == ["你", "好"] and grown[7:len(vocab)] == vocab[7:]
    assert json.loads((tmp_path / "x" / "config.json").read_text())["vocab_size"] == len(vocab) + 2
    assert "4 tokens added" in out and "2 in [unused] slots, 2 appended" in out
    # 13 words: hello x4 and world x3 in 5 pieces each, zz in 2, the rest one each (你 你 好 as [UNK]): 42 pieces
    assert "read in 3.231 pieces a word before, 1.077 after, 23.08% of its words [UNK] before, 0.00% after" in out
    old = load_file(base / "model.safetensors")
    new = load_file(tmp_path / "x" / "model.safetensors")
    key = next(k for k, v in old.items() if v.shape[0] == len(vocab) and v.dim() == 2)
    o, n = old[key], new[key]
    ids = {t: i for i, t in enumerate(vocab)}
    hello = [ids[p] for p in ("h", "##e", "##l", "##l", "##o")]
    world = [ids[p] for p in ("w", "##o", "##r", "##l", "##d")]
    torch.testing.assert_close(n[1], o[hello].mean(0))
    torch.testing.assert_close(n[2], o[world].mean(0))
    torch.testing.assert_close(n[len(vocab)], o[ids["[UNK]"]])  # a character read as [UNK] starts as [UNK]
    torch.testing.assert_close(n[len(vocab) + 1], o[ids["[UNK]"]])
    kept = [i for i in range(len(vocab)) if i not in (1, 2)]
    assert torch.equal(n[kept], o[kept])
    assert all(torch.equal(new[k], v) for k, v in old.items() if k != key)
    tok = BertTokenizer.from_pretrained(tmp_path / "x")
    assert tok.tokenize("hello 你好 world zz") == ["hello", "你", "好", "world", "z", "##z"]
    model = BertModel.from_pretrained(tmp_path / "x")
    assert model.config.vocab_size == len(vocab) + 2


def test_minilm_extended_loads_in_transformers_with_the_same_outputs_on_old_tokens(minilm_dir, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    corpus = tmp_path / "tweets.txt"
    corpus.write_text("\n".join(realdata.english_texts()[:2000]) + "\n", encoding="utf-8")
    code, out, err = cli(capsys, "vocab", "--extend", "minilm", "--corpus", corpus, "--add", "50", "--out",
                         tmp_path / "x")
    assert code == 0, err
    old_vocab = BertTokenizer.from_pretrained(minilm_dir).vocab
    new_tok = BertTokenizer.from_pretrained(tmp_path / "x")
    added = {t for t in new_tok.vocab if t not in old_vocab}
    assert len(added) == 50 and new_tok.vocab_size == len(old_vocab)  # MiniLM's [unused] slots hold them all
    assert all(new_tok.vocab[t] == i for t, i in old_vocab.items() if not t.startswith("[unused"))
    assert "pieces a word before" in out
    text = "the quick brown fox jumps over the lazy dog"
    ids = torch.tensor([BertTokenizer.from_pretrained(minilm_dir).encode_ids([text])[0]])
    assert new_tok.encode_ids([text])[0] == ids[0].tolist()  # no added word in it: the same ids
    theirs_old = transformers.AutoModel.from_pretrained(minilm_dir).eval()
    theirs_new = transformers.AutoModel.from_pretrained(tmp_path / "x").eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs_new(ids).last_hidden_state, theirs_old(ids).last_hidden_state,
                                   atol=1e-6, rtol=0)
    fast = transformers.AutoTokenizer.from_pretrained(tmp_path / "x")
    word = sorted(added)[0]
    assert fast.tokenize(word) == [word]  # transformers' tokenizer reads the new token whole
    assert (tmp_path / "x" / "modules.json").is_file()  # sentence-transformers' files come along


def test_extend_refuses_what_it_cannot_do(minilm_dir, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("some words here\n", encoding="utf-8")
    code, _, err = cli(capsys, "vocab", "--extend", "minilm", "--corpus", corpus, "--vocab-size", "100",
                       "--out", tmp_path / "x")
    assert code == 2 and "--vocab-size 100: --extend grows the checkpoint's vocabulary" in err
    code, _, err = cli(capsys, "vocab", "--corpus", corpus, "--out", tmp_path / "x")
    assert code == 2 and "--vocab-size: how many tokens" in err and "--extend CHECKPOINT" in err
    base, _ = small_checkpoint(tmp_path / "base")
    code, _, err = cli(capsys, "vocab", "--extend", base, "--corpus", corpus, "--out", base / "inside")
    assert code == 2 and "--extend" in err, err
    assert not (tmp_path / "x").exists() and not (base / "inside").exists()


def test_counting_holds_a_bounded_number_of_words_and_keeps_the_frequent_ones(tmp_path):
    from torchbert.data.vocab_extend import count_words

    base, _ = small_checkpoint(tmp_path / "base")
    tok = BertTokenizer.from_pretrained(base)
    # 1,000 lines, each with the two frequent words and three words seen nowhere else
    texts = [f"hello world w{i}a w{i}b w{i}c" for i in range(1000)]
    counts = count_words(tok, texts, max_words=200)
    assert len(counts) <= 200
    assert counts["hello"] == 1000 and counts["world"] == 1000  # never dropped, never undercounted
    assert count_words(tok, texts)["w999c"] == 1  # under the default bound nothing is dropped


def test_a_config_that_is_not_json_is_named_and_nothing_is_written(tmp_path, capsys):
    base, _ = small_checkpoint(tmp_path / "base")
    (base / "config.json").write_text('{"vocab_size": 61,', encoding="utf-8")
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world\n", encoding="utf-8")
    code, _, err = cli(capsys, "vocab", "--extend", base, "--corpus", corpus, "--out", tmp_path / "x")
    assert code != 0 and "config.json: not valid JSON" in err, err
    assert not (tmp_path / "x").exists()
