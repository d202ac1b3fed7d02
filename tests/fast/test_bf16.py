"""Inference in bf16 (fast/bf16.py) held to fp32 on real weights and real text.

The bounds are the ones bench/README.md measures against ("Precision on the CPU"): embeddings within
cosine 0.999 of fp32's. bf16 runs (emulated, slower) on a CPU without native bf16 too, so these
tests hold on every machine."""

import copy

import numpy as np
import pytest
import realdata
import torch

from torchbert import BertConfig, BertModel, BertTokenizer
from torchbert.fast import at_precision
from torchbert.fast.bf16 import bf16, encoders
from torchbert.features import embed
from torchbert.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification


@pytest.fixture(scope="module")
def texts():
    return list(realdata.english_texts()[:100]) + list(realdata.peoples_daily_lines()[:100])


def test_embeddings_in_bf16_stay_within_cosine_0999_of_fp32(minilm_dir, texts):
    tok = BertTokenizer.from_pretrained(minilm_dir)
    fp32 = BertModel.from_pretrained(minilm_dir).eval()
    half = bf16(copy.deepcopy(fp32))
    assert all(p.dtype == torch.bfloat16 for p in half.parameters())
    want = embed(fp32, tok, texts, normalize=True)
    got = embed(half, tok, texts, normalize=True, batch_size=16)
    cosine = (want * got).sum(1)
    assert cosine.min() >= 0.999, cosine.min()
    assert np.abs(want - got).max() > 1e-4  # bf16 did run
    # features of other layers too (the hidden states leave the encoder in fp32)
    got = embed(half, tok, texts[:20], layers="sum_last_four")
    want = embed(fp32, tok, texts[:20], layers="sum_last_four")
    assert got.dtype == np.float32
    cosine = (want * got).sum(1) / np.linalg.norm(want, axis=1) / np.linalg.norm(got, axis=1)
    assert cosine.min() >= 0.999


@pytest.mark.parametrize("cls", [BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering])
def test_heads_read_fp32_states_and_stay_fp32(minilm_dir, texts, cls):
    """The encoder in bf16, the head in fp32: logits in fp32, close to fp32's at their scale, padded
    and packed alike."""
    tok = BertTokenizer.from_pretrained(minilm_dir)
    torch.manual_seed(0)
    kw = {"labels": ["a", "b", "c"]} if cls is not BertForQuestionAnswering else {}
    fp32 = cls.from_pretrained(minilm_dir, **kw).eval()
    half = at_precision(copy.deepcopy(fp32), "bf16")
    assert half.bert.embeddings.word.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for n, p in half.named_parameters() if not n.startswith("bert."))
    batch = tok(texts[:8], texts[100:108], truncation=True, max_length=64, padding=True, return_tensors="pt")
    with torch.no_grad():
        a, b = fp32(**batch), half(**batch)
    for name in ("logits", "start_logits", "end_logits"):
        x, y = getattr(a, name, None), getattr(b, name, None)
        if x is None:
            continue
        assert y.dtype == torch.float32
        if x.dim() == 3 or name != "logits":  # per token: the real tokens only
            x, y = x[batch["attention_mask"].bool()], y[batch["attention_mask"].bool()]
        assert (x - y).abs().max() <= 0.05 * x.abs().max(), (name, (x - y).abs().max(), x.abs().max())
        assert (x - y).abs().max() > 0


def test_rotary_tables_stay_fp32_and_a_second_call_changes_nothing():
    config = BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, position_embedding_type="rotary")
    torch.manual_seed(0)
    fp32 = BertModel(config).eval()
    half = bf16(copy.deepcopy(fp32))
    assert half.rotary_cos.dtype == torch.float32 and half.rotary_sin.dtype == torch.float32
    hooks = len(half._forward_hooks)
    assert bf16(half) is half and len(half._forward_hooks) == hooks == 1
    ids = torch.randint(5, 200, (3, 40))
    with torch.no_grad():
        a, b = fp32(ids).last_hidden_state, half(ids).last_hidden_state
    assert b.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(a, b, dim=-1).min() > 0.999


def test_a_model_without_a_bert_encoder_is_refused():
    from torchbert.baselines.gpt import OpenAIGPTModel
    from torchbert.config import GPTConfig

    gpt = OpenAIGPTModel(GPTConfig(vocab_size=50, n_positions=16, n_embd=32, n_layer=1, n_head=2))
    assert encoders(gpt) == []
    with pytest.raises(ValueError, match="bf16 inference runs BERT encoders; this model is a OpenAIGPTModel"):
        bf16(gpt)
    with pytest.raises(ValueError, match="precision must be fp32, bf16 or int8"):
        at_precision(gpt, "fp16")
