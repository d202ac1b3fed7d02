"""Pretraining heads against transformers on real weights and text, fp32; checkpoints both ways."""

import pytest
import torch
import transformers
from parity import assert_parity
from safetensors.torch import load_file

from torchbert import BertConfig
from torchbert.heads import BertForMaskedLM, BertForNextSentencePrediction, BertForPreTraining
from torchbert.packing import unpad

HEADS = [
    (BertForPreTraining, transformers.BertForPreTraining),
    (BertForMaskedLM, transformers.BertForMaskedLM),
    (BertForNextSentencePrediction, transformers.BertForNextSentencePrediction),
]


def call(model, inputs, labels, nsp):
    """The same batch with each class's label arguments (ours take transformers' names)."""
    kw = dict(inputs)
    if isinstance(model, (BertForPreTraining, transformers.BertForPreTraining)):
        kw.update(labels=labels, next_sentence_label=nsp)
    elif isinstance(model, (BertForMaskedLM, transformers.BertForMaskedLM)):
        kw.update(labels=labels)
    else:
        kw.update(labels=nsp)
    return model(**kw)


@pytest.mark.parametrize("ours_cls,their_cls", HEADS)
@torch.no_grad()
def test_heads_match_transformers_on_real_weights(ours_cls, their_cls, minilm_with_heads, real_batch):
    folder = minilm_with_heads[ours_cls]
    ours = ours_cls.from_pretrained(folder).eval()
    assert ours.load_report == {"missing": [], "unused": []}
    theirs = their_cls.from_pretrained(folder).eval()  # transformers loads what we saved
    inputs, labels, nsp = real_batch
    a, b = call(ours, inputs, labels, nsp), call(theirs, inputs, labels, nsp)
    assert_parity(a.loss, b.loss)
    if ours_cls is BertForPreTraining:
        assert_parity(a.mlm_logits, b.prediction_logits[labels != -100])
        assert_parity(a.nsp_logits, b.seq_relationship_logits)
        assert_parity(a.mlm_loss + a.nsp_loss, a.loss)
    elif ours_cls is BertForMaskedLM:
        assert_parity(a.mlm_logits, b.logits[labels != -100])
    else:
        assert_parity(a.nsp_logits, b.logits)


def test_saved_files_hold_their_names_and_no_decoder_copy(minilm_with_heads):
    keys = set(load_file(minilm_with_heads[BertForPreTraining] / "model.safetensors"))
    assert {"cls.predictions.bias", "cls.predictions.transform.dense.weight", "cls.seq_relationship.weight",
            "bert.embeddings.word_embeddings.weight", "bert.pooler.dense.weight"} <= keys
    assert "cls.predictions.decoder.weight" not in keys
    mlm_keys = set(load_file(minilm_with_heads[BertForMaskedLM] / "model.safetensors"))
    assert not any("pooler" in k or "seq_relationship" in k for k in mlm_keys)


@torch.no_grad()
def test_packed_equals_padded(minilm_with_heads, real_batch):
    model = BertForPreTraining.from_pretrained(minilm_with_heads[BertForPreTraining]).eval()
    inputs, labels, nsp = real_batch
    padded = model(**inputs, labels=labels, next_sentence_label=nsp)
    ids, types, flat_labels, cu, T = unpad(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"], labels)
    positions = (flat_labels != -100).nonzero().squeeze(1)
    packed = model(ids, token_type_ids=types, cu_seqlens=cu, max_seqlen=T, mlm_positions=positions,
                   mlm_labels=flat_labels[positions], next_sentence_label=nsp)
    assert_parity(packed.loss, padded.loss)
    assert_parity(packed.mlm_logits, padded.mlm_logits)
    assert_parity(packed.nsp_logits, padded.nsp_logits)


def test_decoder_is_tied_and_every_parameter_learns():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_name("tiny", vocab_size=300))
    ids = torch.randint(5, 300, (4, 12))
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    out = model(ids, labels=labels, next_sentence_label=torch.tensor([0, 1, 1, 0]))
    out.loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0 and torch.isfinite(p.grad).all(), name
    assert "mlm.decoder.weight" not in dict(model.named_parameters())
    # the decoder is the embedding matrix itself: changing one changes the logits
    with torch.no_grad():
        before = model(ids, labels=labels).mlm_logits.clone()
        model.bert.embeddings.word.weight[ids[0, 3]] += 1.0
        after = model(ids, labels=labels).mlm_logits
    assert (after - before).abs().max() > 1e-3


def test_heads_initialized_like_bert():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_name("mini", vocab_size=500))
    assert torch.all(model.mlm.bias == 0) and torch.all(model.mlm.norm.weight == 1)
    assert abs(model.nsp.weight.std().item() - 0.02) < 0.005 and torch.all(model.nsp.bias == 0)


def test_untied_decoder_in_a_file_is_reported(tmp_path):
    torch.manual_seed(2)
    cfg = transformers.BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=32)
    transformers.BertForPreTraining(cfg).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["cls.predictions.decoder.weight"] = torch.randn(200, 32)
    from safetensors.torch import save_file
    save_file(state, tmp_path / "model.safetensors")
    with pytest.warns(UserWarning, match="decoder.weight differs from the word embeddings"):
        BertForPreTraining.from_pretrained(tmp_path)
