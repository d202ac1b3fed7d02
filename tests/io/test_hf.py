"""Hugging Face checkpoints both ways, and every way a weights file can be wrong."""

import os
import pickle
import shutil
import warnings

import pytest
import realdata
import torch
import transformers
from parity import assert_parity
from safetensors.torch import load_file, save_file

from torchbert import BertConfig, BertModel, heads
from torchbert.io.hf import bert_key_map
from torchbert.packing import unpad


def tiny_hf_config(**kw):
    return transformers.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                   intermediate_size=256, max_position_embeddings=64, **kw)


def sample_batch(vocab=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (4, 20), generator=g)
    mask = (torch.arange(20) < torch.tensor([20, 7, 13, 2])[:, None]).long()
    types = (torch.arange(20) >= 5).long().expand(4, 20) * mask
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types)


@torch.no_grad()
def assert_same_outputs(ours, theirs, batch):
    m = batch["attention_mask"].bool()
    a, b = ours(**batch, output_hidden_states=True), theirs(**batch, output_hidden_states=True)
    assert_parity(a.last_hidden_state[m], b.last_hidden_state[m])
    if b.pooler_output is not None:
        assert_parity(a.pooler_output, b.pooler_output)
    for i, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states, strict=True)):
        assert_parity(x[m], y[m], f"hidden state {i}")
    ids, types, cu, T = unpad(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    u = ours(ids, token_type_ids=types, cu_seqlens=cu, max_seqlen=T)
    assert_parity(u.last_hidden_state, b.last_hidden_state[m])


def test_our_save_loads_in_transformers(tmp_path, minilm_dir):
    ours = BertModel.from_pretrained(minilm_dir).eval()
    ours.save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    theirs = transformers.BertModel.from_pretrained(tmp_path).eval()
    tok = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    texts = list(realdata.english_texts()[40:48]) + list(realdata.peoples_daily_sentences()[40:48])
    batch = dict(tok(texts, padding=True, truncation=True, max_length=96, return_tensors="pt"))
    assert_same_outputs(ours, theirs, batch)
    # the file holds exactly Hugging Face's tensors, bit for bit
    original, saved = load_file(minilm_dir / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    original = {k: v for k, v in original.items() if not k.endswith("position_ids")}
    assert original.keys() == saved.keys()
    assert all(torch.equal(original[k], saved[k]) for k in saved)


# Every class of ours and the transformers class whose checkpoints it reads: one table, one test. The
# checkpoint is theirs with every weight random (the heads included), so a head read from the wrong
# tensor, or left at its fresh initialization, changes the outputs.
LOADS = {
    "BertModel": (transformers.BertModel, BertModel),
    "BertForPreTraining": (transformers.BertForPreTraining, heads.BertForPreTraining),
    "BertForMaskedLM": (transformers.BertForMaskedLM, heads.BertForMaskedLM),
    "BertForNextSentencePrediction": (transformers.BertForNextSentencePrediction, heads.BertForNextSentencePrediction),
    "BertForSequenceClassification": (transformers.BertForSequenceClassification, heads.BertForSequenceClassification),
    "BertForTokenClassification": (transformers.BertForTokenClassification, heads.BertForTokenClassification),
    "BertForQuestionAnswering": (transformers.BertForQuestionAnswering, heads.BertForQuestionAnswering),
    "BertForMultipleChoice": (transformers.BertForMultipleChoice, heads.BertForMultipleChoice),
}


def targets(name: str, batch: dict) -> dict:
    """Each class's label arguments for `batch` (ours take transformers' names)."""
    g = torch.Generator().manual_seed(1)
    B, T = batch["input_ids"].shape
    mlm = torch.where(torch.rand(B, T, generator=g) < 0.3, batch["input_ids"], -100) * batch["attention_mask"] \
        - 100 * (1 - batch["attention_mask"])
    return {"BertModel": {}, "BertForPreTraining": dict(labels=mlm, next_sentence_label=torch.tensor([0, 1, 1, 0])),
            "BertForMaskedLM": dict(labels=mlm), "BertForNextSentencePrediction": dict(labels=torch.tensor([0, 1, 1, 0])),
            "BertForSequenceClassification": dict(labels=torch.tensor([2, 0, 1, 2])),
            "BertForTokenClassification": dict(labels=torch.randint(0, 3, (B, T), generator=g)),
            "BertForQuestionAnswering": dict(start_positions=torch.tensor([1, 3, 30, 0]),
                                             end_positions=torch.tensor([4, 5, 30, 1])),
            "BertForMultipleChoice": dict(labels=torch.tensor([1, 0]))}[name]


@pytest.mark.parametrize("name", LOADS)
@torch.no_grad()
def test_a_transformers_checkpoint_of_every_class_loads_in_ours_with_the_same_outputs(name, tmp_path):
    their_cls, ours_cls = LOADS[name]
    torch.manual_seed(0)
    labels = 2 if name == "BertForQuestionAnswering" else 3  # QA: start and end
    theirs = their_cls(tiny_hf_config(hidden_act="gelu_new", num_labels=labels)).eval()
    for p in theirs.parameters():  # beyond transformers' init (zero biases, LayerNorm at 1): every tensor counts
        p.normal_(0, 0.1)
    theirs.save_pretrained(tmp_path)
    ours = ours_cls.from_pretrained(tmp_path).eval()
    assert ours.load_report == {"missing": [], "unused": []}
    assert ours.config.hidden_act == "gelu_new"
    batch = sample_batch()
    if name == "BertModel":
        return assert_same_outputs(ours, theirs, batch)
    if name == "BertForMultipleChoice":  # [B, C, T]: two examples of two choices
        batch = {k: v.view(2, 2, -1) for k, v in batch.items()}
    kw = {**batch, **targets(name, sample_batch())}
    a, b = ours(**kw), theirs(**kw)
    assert_parity(a.loss, b.loss)
    m = batch["attention_mask"].bool()
    if name == "BertForPreTraining":
        assert_parity(a.mlm_logits, b.prediction_logits[kw["labels"] != -100])
        assert_parity(a.nsp_logits, b.seq_relationship_logits)
    elif name == "BertForMaskedLM":
        assert_parity(a.mlm_logits, b.logits[kw["labels"] != -100])
    elif name == "BertForNextSentencePrediction":
        assert_parity(a.nsp_logits, b.logits)
    elif name == "BertForTokenClassification":
        assert_parity(a.logits[m], b.logits[m])
    elif name == "BertForQuestionAnswering":
        assert_parity(a.start_logits[m], b.start_logits[m])
        assert_parity(a.end_logits[m], b.end_logits[m])
    else:
        assert_parity(a.logits, b.logits)


def test_task_model_checkpoints_with_bert_prefix(tmp_path):
    torch.manual_seed(2)
    theirs = transformers.BertForPreTraining(tiny_hf_config()).eval()
    theirs.save_pretrained(tmp_path)
    assert any(k.startswith("bert.") for k in load_file(tmp_path / "model.safetensors"))
    with warnings.catch_warnings():  # the pretraining heads an encoder leaves out: not a warning
        warnings.simplefilter("error")
        ours = BertModel.from_pretrained(tmp_path).eval()
    assert all(k.startswith("cls.") for k in ours.load_report["unused"]) and ours.load_report["unused"]
    assert_same_outputs(ours, theirs.bert, sample_batch())


def test_checkpoint_without_pooler(tmp_path):
    torch.manual_seed(3)
    theirs = transformers.BertModel(tiny_hf_config(), add_pooling_layer=False).eval()
    theirs.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="no weights for pooler.dense.weight, pooler.dense.bias"):
        ours = BertModel.from_pretrained(tmp_path).eval()
    assert ours.load_report["missing"] == ["pooler.dense.weight", "pooler.dense.bias"]
    assert_same_outputs(ours, theirs, sample_batch())
    bare = BertModel.from_pretrained(tmp_path, add_pooling_layer=False)
    assert bare.pooler is None and bare.load_report == {"missing": [], "unused": []}


def test_pytorch_model_bin_and_tensorflow_names(tmp_path):
    torch.manual_seed(4)
    theirs = transformers.BertModel(tiny_hf_config()).eval()
    theirs.config.save_pretrained(tmp_path)
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in theirs.state_dict().items()}
    torch.save(state, tmp_path / "pytorch_model.bin")
    ours = BertModel.from_pretrained(tmp_path).eval()
    assert_same_outputs(ours, theirs, sample_batch())


def test_key_map_is_one_to_one():
    cfg = BertConfig.from_name("tiny")
    kmap = bert_key_map(cfg)
    ours = BertModel(cfg).state_dict()
    assert set(kmap) == set(ours)
    theirs = [h for hs in kmap.values() for h in hs]
    assert len(theirs) == len(set(theirs))
    hf = transformers.BertModel(transformers.BertConfig(**cfg.to_dict())).state_dict()
    assert set(theirs) == {k for k in hf if not k.endswith(("position_ids", "token_type_ids"))}


# -- bad checkpoints -------------------------------------------------------------------------------

@pytest.fixture
def good(tmp_path):
    torch.manual_seed(5)
    d = tmp_path / "good"
    transformers.BertModel(tiny_hf_config()).save_pretrained(d)
    return d


def rewrite(d, edit):
    state = load_file(d / "model.safetensors")
    edit(state)
    save_file(state, d / "model.safetensors")


def test_unknown_tensor_is_named(good):
    rewrite(good, lambda s: s.__setitem__("encoder.layer.0.adapter.weight", torch.zeros(2)))
    with pytest.raises(ValueError, match="unknown tensor.*encoder.layer.0.adapter.weight"):
        BertModel.from_pretrained(good)


def test_missing_tensor_is_named(good):
    rewrite(good, lambda s: s.pop("encoder.layer.2.output.dense.bias"))
    with pytest.raises(ValueError, match="missing tensor.*encoder.layer.2.output.dense.bias"):
        BertModel.from_pretrained(good)


def test_wrong_shape_is_named(good):
    rewrite(good, lambda s: s.__setitem__("encoder.layer.1.attention.self.key.weight", torch.zeros(64, 32)))
    with pytest.raises(ValueError, match=r"layer.1.attention.self.key.weight has shape \(64, 32\), expected \(64, 64\)"):
        BertModel.from_pretrained(good)


def test_config_disagreeing_with_weights(good):
    cfg = BertConfig.load(good)
    cfg.vocab_size = 999
    cfg.save(good)
    with pytest.raises(ValueError, match=r"word_embeddings.weight has shape \(1000, 64\), expected \(999, 64\)"):
        BertModel.from_pretrained(good)


def test_truncated_safetensors(good):
    f = good / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ValueError, match="model.safetensors: not a valid safetensors file.*truncated"):
        BertModel.from_pretrained(good)


class Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED_BY_PICKLE",))


def test_pickle_is_refused_and_never_run(good, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (good / "model.safetensors").unlink()
    with open(good / "pytorch_model.bin", "wb") as f:
        pickle.dump({"embeddings.word_embeddings.weight": Payload()}, f)
    with warnings.catch_warnings(), pytest.raises(ValueError, match="pytorch_model.bin: refused as unsafe"):
        warnings.simplefilter("error")  # and nothing more: not torch's "Detected pickle protocol 4 ... file an issue"
        BertModel.from_pretrained(good)
    assert not (tmp_path / "PWNED_BY_PICKLE").exists()
    # the same pickle renamed to look like safetensors is refused too
    shutil.move(good / "pytorch_model.bin", good / "model.safetensors")
    with pytest.raises(ValueError, match="not a valid safetensors file"):
        BertModel.from_pretrained(good)
    assert not (tmp_path / "PWNED_BY_PICKLE").exists()


def test_folder_without_weights_or_config(tmp_path, good):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        BertModel.from_pretrained(tmp_path / "absent")
    (good / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no weights found"):
        BertModel.from_pretrained(good)
    (good / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no such config file"):
        BertModel.from_pretrained(good)


def test_failed_save_keeps_the_old_checkpoint(tmp_path, minilm_dir, monkeypatch):
    model = BertModel.from_pretrained(minilm_dir)
    model.save_pretrained(tmp_path)
    before = (tmp_path / "model.safetensors").read_bytes()

    import safetensors.torch

    def broken(state, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]  # no temporary left behind


def test_the_folders_length_is_its_sentence_transformers_then_its_run_record_and_a_bad_file_is_named(tmp_path):
    """folder_max_length: sentence_bert_config.json's max_seq_length, else the run record's fine-tuning length,
    else None; a sentence_bert_config.json that cannot be read is a warning naming it (it was ignored without
    a word); a run record that cannot be read, an error naming it (the default would change the vectors)."""
    import json

    from torchbert.io.hf import folder_max_length
    from torchbert.io.record import RunRecord, write_record

    assert folder_max_length(tmp_path) is None
    write_record(tmp_path, RunRecord("finetune", task={"type": "embedding", "max_length": 96}))
    assert folder_max_length(tmp_path) == 96
    st = tmp_path / "sentence_bert_config.json"
    st.write_text(json.dumps({"max_seq_length": 200}))
    assert folder_max_length(tmp_path) == 200
    for bad, says in (("{not json", "not valid JSON"), ("[200]", "holds a list"),
                      ('{"max_seq_length": 1}', "max_seq_length 1 is not a whole number of at least 2"),
                      ('{"max_seq_length": "64"}', 'max_seq_length 64 is not a whole number')):
        st.write_text(bad)
        with pytest.warns(UserWarning, match=f"{st}: .*{says}"):
            assert folder_max_length(tmp_path) == 96, bad  # the record's, then
    st.unlink()
    (tmp_path / "torchbert.json").write_text("{not json")
    with pytest.raises(ValueError, match="torchbert.json: not the run record torchbert writes"):
        folder_max_length(tmp_path)
