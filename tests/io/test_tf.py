"""Google's TensorFlow checkpoints read without TensorFlow (io/tf.py, `torchbert convert`).

The fixture (tests/fixtures/google_bert) is a tiny BERT that TensorFlow wrote in Google's layout, with
Adam's slots and global_step, made once by tests/fixtures/make_google_bert.py; its expected.json holds
what TensorFlow's own reader read (shape, dtype, sum and first value of every variable) and the
outputs of transformers' BertForPreTraining after transformers' own converter (load_tf_weights_in_bert,
transformers 4.x with TensorFlow) on fixed inputs. Nothing here needs TensorFlow."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from clihelp import cli

from torchbert.io.tf import TFCheckpoint, guess_lowercase

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "google_bert"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())


def test_our_reader_gives_every_tensor_tensorflow_read():
    ckpt = TFCheckpoint(FIXTURE / "bert_model.ckpt")
    want = EXPECTED["variables"]
    assert ckpt.names() == sorted(want) and len(want) == 3 * 46 + 1  # 46 BERT tensors, 2 slots each, the step
    for name, e in want.items():
        t = ckpt.tensor(name)
        assert [list(t.shape), str(t.dtype)] == [e["shape"], e["dtype"]], name
        assert float(t.sum(dtype=np.float64)) == e["sum"] and float(t.reshape(-1)[0]) == e["first"], name
    assert int(ckpt.tensor("global_step")) == 1000


def test_a_bfloat16_variable_is_read_as_the_float32_it_is_the_top_half_of():
    """TPU runs save some variables in bfloat16 (TensorFlow dtype 14): each value's 16 bits are the high
    half of a float32's. The fixture has none, so one entry is made to point at bfloat16 bytes."""
    import dataclasses

    from torchbert.io.tf import BFLOAT16

    ckpt = TFCheckpoint(FIXTURE / "bert_model.ckpt")
    name = "bert/embeddings/LayerNorm/gamma"
    values = np.array([[1.0, -2.5, 0.15625], [65536.0, -0.0078125, 3.0]], dtype=np.float32)  # exact in bfloat16
    bits = (values.view(np.uint32) >> 16).astype("<u2")
    ckpt.entries[name] = dataclasses.replace(ckpt.entries[name], dtype=BFLOAT16, shape=(2, 3), size=12, crc=None)
    ckpt.raw = lambda _: bits.tobytes()
    got = ckpt.tensor(name)
    assert got.dtype == np.float32 and np.array_equal(got, values)


@pytest.mark.parametrize("given", ["bert_model.ckpt", "bert_model.ckpt.index", "."])
def test_convert_gives_the_outputs_of_transformers_own_converter(given, tmp_path, capsys):
    """The converted folder, read by transformers (5.x, no TensorFlow) and by torchbert, gives what
    transformers 4.x gave after converting the same checkpoint with TensorFlow."""
    from transformers import BertForPreTraining as HFBertForPreTraining
    from transformers import BertTokenizer as HFBertTokenizer

    from torchbert.heads import BertForPreTraining
    from torchbert.tokenizer import BertTokenizer

    out = tmp_path / "converted"
    code, stdout, err = cli(capsys, "convert", "--tf-checkpoint", FIXTURE / given, "--out", out)
    assert code == 0, err
    assert "lowercased (guessed from the vocabulary)" in err and f"wrote {out}" in stdout
    ref = EXPECTED["outputs"]
    ids, mask, types = (torch.tensor(ref[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    theirs = HFBertForPreTraining.from_pretrained(out).eval()
    ours = BertForPreTraining.from_pretrained(out).eval()
    with torch.no_grad():
        t = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        o = ours(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
    real = mask.bool()
    for got in (t.hidden_states[-1], o.hidden_states[-1]):
        assert torch.allclose(got[real], torch.tensor(ref["last_hidden_state"])[real], atol=1e-5)
    for got in (t.prediction_logits, o.mlm_logits):
        assert torch.allclose(got[real], torch.tensor(ref["prediction_logits"])[real], atol=1e-5)
    for got in (t.seq_relationship_logits, o.nsp_logits):
        assert torch.allclose(got, torch.tensor(ref["seq_relationship_logits"]), atol=1e-5)
    text = "The BERT model reads 中国人民日报 text."
    assert BertTokenizer.from_pretrained(out).tokenize(text) == HFBertTokenizer.from_pretrained(out).tokenize(text)
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is True


def test_the_casing_is_guessed_from_the_vocabulary_and_can_be_given(minilm_dir, tmp_path, capsys):
    from torchbert.io.vocab import read_vocab

    assert guess_lowercase(read_vocab(minilm_dir / "vocab.txt"))  # bert-base-uncased's vocabulary
    cased = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(
        f"{w}{k}" for k in range(30) for w in ("The", "Paris", "A", "the", "paris"))])}
    assert not guess_lowercase(cased)
    code, _, err = cli(capsys, "convert", "--tf-checkpoint", FIXTURE, "--out", tmp_path / "c", "--no-lowercase")
    assert code == 0 and "cased (as given)" in err
    assert json.loads((tmp_path / "c" / "tokenizer_config.json").read_text())["do_lower_case"] is False


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    shutil.copytree(FIXTURE, folder, ignore=shutil.ignore_patterns("unknown", "expected.json"))
    return folder


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_damaged_or_foreign_checkpoint_is_one_line_naming_the_file_and_nothing_is_written(tmp_path, capsys):
    def fails(folder, message, *extra):
        out = tmp_path / "out"
        code, stdout, err = cli(capsys, "convert", "--tf-checkpoint", folder / "bert_model.ckpt", "--out", out,
                                *extra)
        lines = err.strip().splitlines()
        assert code == 2 and lines[-1].startswith("torchbert: error: ") and message in lines[-1], err
        assert "Traceback" not in err and not out.exists() and not stdout

    ckpt = TFCheckpoint(FIXTURE / "bert_model.ckpt")
    index, shard = "bert_model.ckpt.index", "bert_model.ckpt.data-00000-of-00001"

    folder = _copy(tmp_path / "a")
    _flip(folder / index, 20)  # a byte of the first data block
    fails(folder, f"{folder / index}: the block at byte 0: checksum mismatch (the index file is damaged)")

    folder = _copy(tmp_path / "b")
    (folder / index).write_bytes((folder / index).read_bytes()[:-10])
    fails(folder, f"{folder / index}: not a TensorFlow checkpoint index (no table footer; truncated?)")

    word = ckpt.entries["bert/embeddings/word_embeddings"]
    folder = _copy(tmp_path / "c")
    _flip(folder / shard, word.offset + 7)
    fails(folder, f"{folder / shard}: bert/embeddings/word_embeddings: checksum mismatch (the data file is damaged)")

    slot = ckpt.entries["bert/pooler/dense/kernel/adam_m"]  # left out of the model, but verified too
    folder = _copy(tmp_path / "c2")
    _flip(folder / shard, slot.offset + 2)
    fails(folder, f"{folder / shard}: bert/pooler/dense/kernel/adam_m: checksum mismatch (the data file is damaged)")

    folder = _copy(tmp_path / "d")
    last = max(ckpt.entries.values(), key=lambda e: e.offset)
    (folder / shard).write_bytes((folder / shard).read_bytes()[:last.offset + last.size - 3])
    fails(folder, f"{last.name}: the shard ends before the tensor does (truncated?)")

    folder = _copy(tmp_path / "e")
    (folder / shard).unlink()
    fails(folder, f"{folder / shard}: missing, a data shard of {folder / 'bert_model.ckpt'}")

    fails(FIXTURE / "unknown", f"{FIXTURE / 'unknown' / index}: variable bert/encoder/layer_0/attention/self/rotary"
          "/kernel is not part of a Google BERT checkpoint", "--config", FIXTURE / "bert_config.json", "--vocab",
          FIXTURE / "vocab.txt")

    folder = _copy(tmp_path / "f")
    config = json.loads((folder / "bert_config.json").read_text())
    (folder / "bert_config.json").write_text(json.dumps({**config, "intermediate_size": 64}))
    fails(folder, "bert.encoder.layer.0.intermediate.dense.weight has shape (32, 16), expected (64, 16)")

    folder = _copy(tmp_path / "g")
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n" + "".join(f"w{i}\n" for i in range(56)))
    fails(folder, f"{folder / 'vocab.txt'}: 61 tokens, but {folder / 'bert_config.json'} says vocab_size 60")

    fails(tmp_path / "nowhere", f"{tmp_path / 'nowhere' / 'bert_model.ckpt'}: no checkpoint here")


def test_an_electra_checkpoint_gives_its_discriminators_encoder_as_transformers_read_it(tmp_path, capsys):
    """Google released ELECTRA without a config: the sizes come from the tensors, the heads are 64 wide;
    the generator and both heads are left out."""
    from transformers import BertModel as HFBertModel

    from torchbert.model import BertModel

    out = tmp_path / "electra"
    code, stdout, err = cli(capsys, "convert", "--tf-checkpoint", FIXTURE / "electra", "--out", out)
    assert code == 0, err
    assert "an ELECTRA without a config: 2 layers of 16, 1 heads of 64" in err and "BertModel" in stdout
    assert "tensors of the ELECTRA discriminator's encoder, the rest the generator, the heads" in err
    ref = EXPECTED["outputs"]
    ids, mask, types = (torch.tensor(ref[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    want = torch.tensor(ref["electra_last_hidden_state"])
    real = mask.bool()
    with torch.no_grad():
        ours = BertModel.from_pretrained(out).eval()(ids, attention_mask=mask, token_type_ids=types)
        theirs = HFBertModel.from_pretrained(out, add_pooling_layer=False).eval()(
            input_ids=ids, attention_mask=mask, token_type_ids=types)
    assert torch.allclose(ours.last_hidden_state[real], want[real], atol=1e-5)
    assert torch.allclose(theirs.last_hidden_state[real], want[real], atol=1e-5)
    assert json.loads((out / "torchbert.json").read_text())["objective"] == "electra"
    assert not any(k.startswith("torchbert_") for k in json.loads((out / "config.json").read_text()))
    code, _, err = cli(capsys, "convert", "--tf-checkpoint", FIXTURE / "electra_small", "--out", tmp_path / "s",
                       "--vocab", FIXTURE / "vocab.txt")
    assert code == 2 and "projects its 16-wide embeddings to its hidden size 32" in err and not (tmp_path / "s").exists()


def test_a_config_whose_sizes_do_not_fit_the_weights_is_refused_before_anything_is_built(tmp_path, capsys):
    """Issue 59: each field in bounds, together 52.8 trillion parameters: the allocator's failure, after
    the model was being built. Now compared with the checkpoint's tensors first."""
    folder = _copy(tmp_path)
    config = json.loads((folder / "bert_config.json").read_text())
    (folder / "bert_config.json").write_text(json.dumps({**config, "hidden_size": 65536, "num_attention_heads": 64,
                                                         "intermediate_size": 262144, "num_hidden_layers": 1024}))
    code, out, err = cli(capsys, "convert", "--tf-checkpoint", folder / "bert_model.ckpt", "--out", tmp_path / "o")
    line = err.strip().splitlines()[-1]
    assert code == 2 and f"{folder / 'bert_config.json'}: its sizes imply about" in line, err
    assert "the config does not belong to these weights" in line and not (tmp_path / "o").exists()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    """A protocol buffer field: a varint for an int, length-delimited for bytes."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def test_an_index_that_lies_about_its_entries_is_refused_naming_what_it_claims(monkeypatch):
    """Entries made by hand, checksums valid: a dimension of -1 (TensorFlow's unknown size), more dimensions
    than a tensor of BERT's has, a shard past the bundle's, a key that shares more than the previous key
    holds, a big-endian bundle: each a one-line CheckpointError, never numpy's or a wrong tensor."""
    import dataclasses

    from torchbert.io import tf
    from torchbert.io.tf import CheckpointError, _entry, _masked_crc

    def shape(*dims):  # TensorShapeProto: a dim (field 2) per size (field 1 of Dim), as uint64
        return _field(2, b"".join(_field(2, _field(1, d & (2**64 - 1))) for d in dims))

    assert _entry("w", _field(1, 1) + shape(3, 4) + _field(5, 48), "x").shape == (3, 4)
    with pytest.raises(CheckpointError, match=r"^x: w has more than 8 dimensions; the index is damaged"):
        _entry("w", _field(1, 1) + shape(*[1] * 9), "x")
    ckpt = TFCheckpoint(FIXTURE / "bert_model.ckpt")
    name = "bert/embeddings/word_embeddings"
    ckpt.entries[name] = _entry(name, _field(1, 1) + shape(-1, 16) + _field(5, 64), "x")
    with pytest.raises(CheckpointError, match=r"shape \[-1, 16\] of 4-byte values does not fit the 64 bytes"):
        ckpt.tensor(name)
    ckpt.entries[name] = dataclasses.replace(ckpt.entries[name], shard=1)
    with pytest.raises(CheckpointError, match=f"{name} is in shard 1, but the bundle has 1"):
        ckpt.raw(name)

    def block(*entries):  # a table block: (shared, fresh key, value) entries, one restart point, checksummed
        body = b"".join(_varint(s) + _varint(len(k)) + _varint(len(v)) + k + v for s, k, v in entries)
        body += (0).to_bytes(4, "little") + (1).to_bytes(4, "little")
        return body, body + b"\x00" + _masked_crc(body + b"\x00").to_bytes(4, "little") + bytes(48)

    body, data = block((0, b"ab", b"1"), (1, b"c", b"2"))
    assert list(ckpt._records(data, 0, len(body), "a block")) == [(b"ab", b"1"), (b"ac", b"2")]
    body, data = block((0, b"ab", b"1"), (3, b"c", b"2"))  # shares 3 bytes of a 2-byte key
    with pytest.raises(CheckpointError, match="a block: an entry runs past its block"):
        list(ckpt._records(data, 0, len(body), "a block"))

    real = TFCheckpoint._records

    def big_endian(self, data, offset, size, what):
        for key, value in real(self, data, offset, size, what):
            yield key, (_field(1, 1) + _field(2, 1) if key == b"" and what != "the index block" else value)

    monkeypatch.setattr(tf.TFCheckpoint, "_records", big_endian)
    with pytest.raises(CheckpointError, match="the tensors are big-endian, which is not read here"):
        TFCheckpoint(FIXTURE / "bert_model.ckpt")


def test_names_left_out_refused_and_sizes_read_from_shapes():
    """What a mixed-precision run saves beside the model (loss scale, step counts) is skipped; ELECTRA has
    no pooler; an ELECTRA's heads are 64 wide (small 4, base 12, large 16); a vocabulary with a few
    capitals among 30,000 tokens is still an uncased one."""
    from torchbert.io.tf import electra_config, electra_name, hf_name

    for name in ("global_step", "good_steps", "bad_steps", "loss_scale", "current_loss_scale",
                 "bert/pooler/dense/kernel/adam_v", "electra/encoder/layer_0/output/dense/bias/adam_m"):
        assert hf_name(name) is None and electra_name(name) is None, name
    assert electra_name("electra/encoder/layer_3/output/dense/kernel") == ("encoder.layer.3.output.dense.weight", True)
    for name in ("electra/pooler/dense/kernel", "electra/encoder/layer_0/rotary/kernel"):
        with pytest.raises(KeyError):
            electra_name(name)

    class Sizes:  # the shapes electra_config reads, of an ELECTRA with `hidden` and 12 layers
        index = "model.ckpt.index"

        def __init__(self, hidden):
            self.entries = {"electra/embeddings/word_embeddings": (30522, hidden),
                            "electra/embeddings/position_embeddings": (512, hidden),
                            "electra/embeddings/token_type_embeddings": (2, hidden),
                            **{f"electra/encoder/layer_{i}/intermediate/dense/kernel": (hidden, 4 * hidden)
                               for i in range(12)}}

        def shape(self, name):
            return self.entries[name]

    for hidden, heads in ((256, 4), (768, 12), (1024, 16)):
        config = electra_config(Sizes(hidden))
        assert (config["num_attention_heads"], config["num_hidden_layers"], config["intermediate_size"]) == \
            (heads, 12, 4 * hidden)
    words = [f"w{i}" for i in range(30_000)]
    assert guess_lowercase({t: i for i, t in enumerate(words[:-25] + [f"X{i}" for i in range(25)])})


def test_a_crafted_tensorflow_index_is_refused_before_anything_is_allocated(monkeypatch):
    import dataclasses

    from torchbert.io import tf
    from torchbert.io.tf import CheckpointError

    fixture = FIXTURE / "bert_model.ckpt"
    ckpt = TFCheckpoint(fixture)
    name = "bert/embeddings/word_embeddings"
    e = ckpt.entries[name]
    ckpt.entries[name] = dataclasses.replace(e, size=2**50)  # b0c3a35: "unexpected MemoryError"
    with pytest.raises(CheckpointError, match=f"{name}: the shard ends .* it places 1,125,899,906,842,624 bytes at byte"):
        ckpt.raw(name)
    with pytest.raises(CheckpointError, match="shape \\[60, 16\\] of 4-byte values does not fit the 1,125,899"):
        ckpt.tensor(name)
    ckpt.entries[name] = dataclasses.replace(e, shape=(2**32, 2**32))  # b0c3a35: numpy's reshape message
    with pytest.raises(CheckpointError, match=rf"{name}: shape \[4294967296, 4294967296\] of 4-byte values"):
        ckpt.tensor(name)

    real = TFCheckpoint._records

    def records(self, data, offset, size, what):
        for key, value in real(self, data, offset, size, what):
            yield key, (_field(1, 2**40) if key == b"" and what != "the index block" else value)

    monkeypatch.setattr(tf.TFCheckpoint, "_records", records)  # b0c3a35 looked for 2^40 shard files for ever
    with pytest.raises(CheckpointError, match="the header claims 1099511627776 data shards"):
        TFCheckpoint(fixture)


def test_convert_writes_neither_over_its_checkpoint_nor_into_a_folder_of_files(tmp_path, capsys):
    folder = _copy(tmp_path)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    for out in (folder, folder / "converted"):  # the checkpoint's own folder, or one under it
        code, stdout, err = cli(capsys, "convert", "--tf-checkpoint", folder / "bert_model.ckpt", "--out", out)
        assert code == 2 and "--tf-checkpoint" in err and stdout == "", err
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    users = tmp_path / "users"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    code, _, err = cli(capsys, "convert", "--tf-checkpoint", folder, "--out", users)
    assert code == 2 and "--overwrite" in err and sorted(p.name for p in users.iterdir()) == ["notes.txt"], err
