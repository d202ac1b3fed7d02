"""Pretraining heads against transformers on real weights and text, fp32; checkpoints both ways."""

import contextlib

import pytest
import torch
import transformers
from safetensors.torch import load_file

import realdata
from torchbert import BertConfig, heads
from torchbert.heads import BertForMaskedLM, BertForNextSentencePrediction, BertForPreTraining
from torchbert.model import unpad
from torchbert.train.optim import SparseRows
from torchbert.tokenizer import BertTokenizer

TOL = 1e-5
HEADS = [
    (BertForPreTraining, transformers.BertForPreTraining),
    (BertForMaskedLM, transformers.BertForMaskedLM),
    (BertForNextSentencePrediction, transformers.BertForNextSentencePrediction),
]


@pytest.fixture(scope="module")
def real_batch(minilm_dir):
    """Sentence pairs of real text, 15% of the non-special tokens masked, NSP labels mixed."""
    tok = BertTokenizer.from_pretrained(minilm_dir)
    en = list(realdata.english_texts()[300:306])
    zh = list(realdata.peoples_daily_sentences()[300:306])
    enc = tok(en + zh, zh + en, truncation=True, max_length=96, padding=True, return_tensors="pt")
    g = torch.Generator().manual_seed(0)
    special = (enc["input_ids"] == tok.cls_token_id) | (enc["input_ids"] == tok.sep_token_id)
    chosen = (torch.rand(enc["input_ids"].shape, generator=g) < 0.15) & enc["attention_mask"].bool() & ~special
    labels = torch.where(chosen, enc["input_ids"], -100)
    inputs = torch.where(chosen, tok.mask_token_id, enc["input_ids"])
    nsp = torch.tensor([0, 1] * 6)
    return dict(input_ids=inputs, attention_mask=enc["attention_mask"], token_type_ids=enc["token_type_ids"]), labels, nsp


@pytest.fixture(scope="module")
def minilm_with_heads(minilm_dir, tmp_path_factory):
    """MiniLM's encoder plus freshly initialized heads, saved by us for each model class."""
    folders = {}
    for ours_cls, _ in HEADS:
        torch.manual_seed(0)
        with pytest.warns(UserWarning, match="fresh initialization"):
            model = ours_cls.from_pretrained(minilm_dir)
        assert model.load_report["missing"]  # the heads were not in MiniLM's file
        folder = tmp_path_factory.mktemp(ours_cls.__name__)
        model.save_pretrained(folder)
        folders[ours_cls] = folder
    return folders


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
    assert abs(a.loss.item() - b.loss.item()) < TOL
    if ours_cls is BertForPreTraining:
        assert (a.mlm_logits - b.prediction_logits[labels != -100]).abs().max() < TOL
        assert (a.nsp_logits - b.seq_relationship_logits).abs().max() < TOL
        assert a.mlm_loss.item() + a.nsp_loss.item() == pytest.approx(a.loss.item())
    elif ours_cls is BertForMaskedLM:
        assert (a.mlm_logits - b.logits[labels != -100]).abs().max() < TOL
    else:
        assert (a.nsp_logits - b.logits).abs().max() < TOL


@pytest.mark.parametrize("ours_cls,their_cls", HEADS)
@torch.no_grad()
def test_transformers_checkpoints_load_in_ours(ours_cls, their_cls, tmp_path, real_batch):
    torch.manual_seed(1)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=256, max_position_embeddings=128)
    theirs = their_cls(cfg).eval()
    theirs.save_pretrained(tmp_path)
    ours = ours_cls.from_pretrained(tmp_path).eval()
    assert ours.load_report == {"missing": [], "unused": []}
    inputs, labels, nsp = real_batch
    a, b = call(ours, inputs, labels, nsp), call(theirs, inputs, labels, nsp)
    assert abs(a.loss.item() - b.loss.item()) < TOL


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
    assert abs(packed.loss.item() - padded.loss.item()) < TOL
    assert (packed.mlm_logits - padded.mlm_logits).abs().max() < TOL
    assert (packed.nsp_logits - padded.nsp_logits).abs().max() < TOL


def training_gradients(model, inputs, labels, nsp, use_logits: bool, rows: bool):
    """Loss, MLM logits and every parameter's gradient of one backward, dropout off; the embeddings'
    gradients as rows made dense (SparseRows, as the pretraining loop does) when `rows`."""
    model.zero_grad(set_to_none=True)
    with SparseRows(model) if rows else contextlib.nullcontext() as sparse:
        out = model(**inputs, labels=labels, next_sentence_label=nsp)
        mlm = out.mlm_loss if out.mlm_loss.isfinite() else 0.0  # nothing scored: the loss is nan
        loss = 0.7 * mlm + out.nsp_loss
        if use_logits:  # as the loop does for a micro-batch with no masked token
            loss = loss + out.mlm_logits.pow(2).mean()
        loss.backward()
        if rows:
            sparse.densify()
    return out.mlm_loss.detach(), out.mlm_logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", ["loss", "loss and logits", "rows", "nothing scored"])
def test_fused_decoder_loss_equals_the_plain_path(minilm_with_heads, real_batch, monkeypatch, case):
    """With gradients on, the MLM decoder and its cross-entropy run as one function that makes the
    logits' gradient in its forward (heads._DecoderCrossEntropy), on the word embeddings taken
    through heads._Tied; F.linear + F.cross_entropy on the weight itself must give the same loss,
    logits and gradient for every parameter, the tied embeddings' included."""
    model = BertForPreTraining.from_pretrained(minilm_with_heads[BertForPreTraining]).eval()  # dropout off
    inputs, labels, nsp = real_batch
    if case == "nothing scored":
        labels = torch.full_like(labels, -100)
    kw = dict(use_logits=case in ("loss and logits", "nothing scored"), rows=case == "rows")
    fused = training_gradients(model, inputs, labels, nsp, **kw)
    monkeypatch.setattr(heads._DecoderCrossEntropy, "apply", heads.decoder_cross_entropy)
    monkeypatch.setattr(heads._Tied, "apply", lambda w: w)
    plain = training_gradients(model, inputs, labels, nsp, **kw)
    if case == "nothing scored":
        assert fused[0].isnan() and plain[0].isnan() and fused[1].shape[0] == 0
    else:
        assert abs(fused[0] - plain[0]) < 1e-6
    assert torch.equal(fused[1], plain[1])
    assert fused[2].keys() == plain[2].keys()
    for name, g in plain[2].items():
        scale = g.abs().max()
        assert (fused[2][name] - g).abs().max() <= 1e-5 * scale, name
    assert plain[2]["bert.embeddings.word.weight"].abs().sum() > 0


def test_fused_decoder_reuses_its_gradient_buffer_safely(monkeypatch):
    """The [M, V] loss gradient's buffer passes from a backward to the next forward (heads._FREE): the
    next step gets the same memory and the same result as with fresh buffers; a retained graph run
    twice gives the same gradients, unless a later forward took its buffer meanwhile: then autograd
    refuses, as for any in-place change of a saved tensor."""
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_name("tiny", vocab_size=300)).eval()
    ids = torch.randint(5, 300, (4, 12))
    labels = torch.full_like(ids, -100)
    labels[:, 3:6] = ids[:, 3:6]
    monkeypatch.setattr(heads, "_FREE", [])

    def grads(retain=False):
        model.zero_grad()
        out = model(ids, labels=labels)
        out.mlm_loss.backward(retain_graph=retain)
        return out, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    _, first = grads()
    assert len(heads._FREE) == 1
    kept = heads._FREE[0].data_ptr()
    _, second = grads()
    assert heads._FREE[0].data_ptr() == kept and len(heads._FREE) == 1  # the same buffer, taken and given back
    assert len(first) == len(second) > 10 and all(torch.equal(a, b) for a, b in zip(first, second))

    out, once = grads(retain=True)
    model.zero_grad()
    out.mlm_loss.backward(retain_graph=True)  # again: its buffer is back in _FREE, untouched
    again = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(once) == len(again) and all(torch.equal(a, b) for a, b in zip(once, again))
    assert len(heads._FREE) == 1  # given back once
    model(ids, labels=labels).mlm_loss  # a new forward takes that buffer and writes into it
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.mlm_loss.backward()


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
