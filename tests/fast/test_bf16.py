"""bf16 (fast/bf16.py) held to fp32 on real weights and real text: inference (the encoder's weights in
bf16, its outputs in fp32) and training (BF16Weights: the weights in bf16 for a step, fp32 gradients
for the optimizer, the fast pieces running in bf16).

The bounds are the ones bench/README.md measures against ("Precision on the CPU"): embeddings within
cosine 0.999 of fp32's. bf16 runs (emulated, slower) on a CPU without native bf16 too, so these
tests hold on every machine."""

import contextlib
import copy

import numpy as np
import pytest
import realdata
import torch

from torchbert import BertConfig, BertModel, BertTokenizer, fast
from torchbert.fast import at_precision
from torchbert.fast.bf16 import bf16, encoders
from torchbert.features import embed
from torchbert.heads import (BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
                             BertForTokenClassification)


@pytest.fixture(scope="module")
def texts():
    return list(realdata.english_texts()[:100]) + list(realdata.peoples_daily_lines()[:100])


def test_embeddings_in_bf16_stay_within_cosine_0999_of_fp32(minilm_dir, texts):
    texts = texts[:40] + texts[100:140]  # English and Chinese
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
    with pytest.raises(ValueError, match="precision must be auto, fp32, bf16 or int8"):
        at_precision(gpt, "fp16")
    assert at_precision(gpt, "auto") is gpt  # auto: fp32 for a model without a BERT encoder


@pytest.mark.parametrize("bf16_gflops, held", [(50.0, torch.float32), (300.0, torch.bfloat16)])
def test_auto_in_the_python_api_decides_as_the_commands_do(monkeypatch, tmp_path, bf16_gflops, held):
    """fast.at_precision(model, "auto"): bf16 where its products measured faster (the probe mocked
    both ways), on the encoder's own shape."""
    from torchbert import probe
    from torchbert.config import BertConfig
    from torchbert.model import BertModel

    monkeypatch.setenv("TORCHBERT_CACHE", str(tmp_path))
    shapes = []
    monkeypatch.setattr(probe, "measure", lambda precisions, h, i, threads: shapes.append((h, i)) or
                        {"fp32": 100.0, "bf16": bf16_gflops})
    model = BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=48)).eval()
    assert {p.dtype for p in at_precision(model, "auto").layers.parameters()} == {held}
    assert shapes == [(32, 48)]


# -- training: the weights held in bf16 for a step, fp32 for the optimizer ----------------------------

def step_gradients(model, inputs, labels, nsp, bf16: bool, micro: int = 1):
    """Loss and fp32 gradients of one step of `micro` micro-batches (each the whole batch at 1/micro),
    through the fast pieces and the embeddings' rows, as the loop runs it; with bf16, under
    BF16Weights."""
    model.zero_grad(set_to_none=True)
    weights = fast.BF16Weights(model) if bf16 else None
    losses = []
    with fast.SparseRows(model) as rows, fast.training(model), weights or contextlib.nullcontext():
        for _ in range(micro):
            out = model(**inputs, labels=labels, next_sentence_label=nsp)
            loss = (out.mlm_loss + out.nsp_loss) / micro
            loss.backward()
            losses.append(loss.detach())
            if weights is not None:
                weights.collect()
    rows.densify()
    return sum(losses), {n: p.grad.to_dense().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("micro", [1, 2])
def test_a_bf16_step_gives_fp32_gradients_close_to_fp32s_and_leaves_the_fp32_weights(minilm_with_heads,
                                                                                       real_batch, micro):
    model = BertForPreTraining.from_pretrained(minilm_with_heads[BertForPreTraining]).eval()  # dropout off
    inputs, labels, nsp = real_batch
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = {n: id(p) for n, p in model.named_parameters()}
    loss32, grads32 = step_gradients(model, inputs, labels, nsp, bf16=False)
    loss16, grads16 = step_gradients(model, inputs, labels, nsp, bf16=True, micro=micro)
    assert loss16.dtype == torch.float32 and abs(float(loss16 - loss32)) < 0.02 * float(loss32)
    for n, p in model.named_parameters():  # the same fp32 parameters, untouched, with fp32 gradients
        assert id(p) == ids[n] and p.dtype == torch.float32 and torch.equal(p.detach(), before[n])
        assert p.grad.dtype == torch.float32
    # each gradient at its own scale, those of a hundredth of the largest and more (the NSP biases' are
    # sums of 12 nearly cancelling terms, 1e-3 of the others: bf16's rounding of each term shows there)
    largest = max(g.norm() for g in grads32.values())
    for n, g in grads32.items():
        if g.norm() > 0.01 * largest:
            cos = torch.nn.functional.cosine_similarity(g.flatten(), grads16[n].flatten(), dim=0)
            assert cos > 0.99, (n, float(cos))
    every = torch.cat([g.flatten() for g in grads32.values()])
    # all of them together: 1.98% of the norm apart with 2 threads, 2.05% with 1 (the sums' order differs);
    # a gradient lost or scaled anywhere is tens of percent
    assert (torch.cat([grads16[n].flatten() for n in grads32]) - every).norm() < 0.03 * every.norm()
    assert grads16["bert.embeddings.word.weight"].abs().sum() > 0


def test_bf16_weights_cover_frozen_parameters_refresh_trained_ones_and_collect_on_exit():
    """Inside the block every fp32 parameter is bf16, a frozen one too (one dtype throughout); a
    trained one is read again from its fp32 weights at each entry (the optimizer changed them); the
    last backward's gradients reach the fp32 ones on exit without a collect()."""
    torch.manual_seed(0)
    frozen, trained = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
    frozen.requires_grad_(False)
    model = torch.nn.Sequential(frozen, trained)
    weights = fast.BF16Weights(model)
    x = torch.randn(3, 4)
    with weights:
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        model(x.bfloat16()).float().sum().backward()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert trained.weight.grad.dtype == torch.float32 and trained.weight.grad.abs().sum() > 0
    with torch.no_grad():
        trained.weight.add_(1.0)  # an optimizer step
    with weights:
        assert torch.equal(trained.weight, weights.masters[trained.weight].bfloat16())


def test_bf16_outputs_are_fp32_down_to_every_hidden_state():
    model = bf16(BertModel(BertConfig.from_name("tiny", vocab_size=50)).eval())
    with torch.no_grad():
        out = model(torch.randint(5, 50, (2, 7)), output_hidden_states=True)
    assert out.last_hidden_state.dtype == out.pooler_output.dtype == torch.float32
    assert len(out.hidden_states) == 3 and {h.dtype for h in out.hidden_states} == {torch.float32}


def test_the_fast_pieces_run_in_bf16_as_the_plain_path_does():
    """Under BF16Weights the fast attention (its hand-written backward), dropout and fused decoder run
    in bf16: the same dropout masks give gradients close to the plain model's in bf16."""
    cfg = BertConfig.from_name("tiny", vocab_size=300)  # dropout 0.1 everywhere
    torch.manual_seed(0)
    model = BertForPreTraining(cfg).train()
    ids = torch.randint(5, 300, (4, 16))
    labels = torch.where(torch.rand(ids.shape) < 0.3, ids, -100)
    labels[0, 2] = ids[0, 2]
    nsp = torch.tensor([0, 1, 1, 0])

    def run(use_fast: bool):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        with fast.training(model) if use_fast else contextlib.nullcontext(), fast.BF16Weights(model) as w:
            out = model(ids, labels=labels, next_sentence_label=nsp)
            assert model.bert.layers[0].attention.qkv.weight.dtype == torch.bfloat16
            out.loss.backward()
            w.collect()
        return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    fast_loss, fast_grads = run(True)
    plain_loss, plain_grads = run(False)  # other dropout masks: compared in distribution, not element-wise
    assert abs(float(fast_loss - plain_loss)) < 0.05 * float(plain_loss)
    for n, g in plain_grads.items():
        assert fast_grads[n].dtype == torch.float32 and fast_grads[n].isfinite().all(), n
        if g.norm() > 1e-4:
            assert 0.5 < fast_grads[n].norm() / g.norm() < 2, n
