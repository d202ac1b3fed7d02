"""torchbert.fast: every piece held to the plain path it replaces, and `fast.training` puts the model back.

The CPU dropout behaves as F.dropout (the drop rate, the scaling, the gradient); the CPU attention
and the fused MLM loss give the plain path's values and gradients; the model is plain again after
training."""

import contextlib
import math

import numpy
import pytest
import torch
from parity import assert_parity

from torchbert import fast
from torchbert import model as model_module
from torchbert.config import BertConfig
from torchbert.fast.dropout import Dropout, dropout, keep_mask
from torchbert.heads import BertForMaskedLM, BertForPreTraining, MaskedLMHead
from torchbert.model import BertModel
from torchbert.packing import unpad


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drop_rate(p):
    torch.manual_seed(0)
    keep = keep_mask((1000, 1001), p)  # not a multiple of four elements
    assert keep.shape == (1000, 1001) and keep.dtype == torch.bool
    # binomial standard error at n = 1e6 is at most 5e-4; the rounding of p to 16 bits at most 8e-6
    assert abs((~keep).float().mean().item() - p) < 3e-3
    rows = (~keep).float().mean(1)  # no structure along either axis
    cols = (~keep).float().mean(0)
    assert rows.std() < 0.03 and cols.std() < 0.03


def test_values_and_gradient_match_the_rule():
    torch.manual_seed(1)
    x = torch.randn(64, 97, requires_grad=True)
    y = dropout(x, 0.25)
    kept = y != 0
    assert_parity(y[kept], x[kept] / 0.75)
    g = torch.randn_like(y)
    y.backward(g)
    assert_parity(x.grad, torch.where(kept, g / 0.75, 0.0))
    # the mean over many masks is the input (dropout is unbiased)
    mean = torch.stack([dropout(x.detach(), 0.25) for _ in range(400)]).mean(0)
    assert (mean - x.detach()).abs().mean() < 0.05


def test_bfloat16_keeps_dtype_and_exact_scale():
    """Under bf16 the scale 1 / (1 - p) is applied in fp32: a bf16 mask would round 1/0.9 to 1.109."""
    torch.manual_seed(2)
    x = torch.randn(32, 50).bfloat16().requires_grad_()
    y = dropout(x, 0.1)
    assert y.dtype == torch.bfloat16
    kept = y != 0
    assert torch.equal(y[kept], (x.detach().float()[kept] / 0.9).bfloat16())
    y.backward(torch.ones_like(y))
    assert x.grad.dtype == torch.bfloat16
    assert torch.equal(x.grad, torch.where(kept, torch.tensor(1 / 0.9).bfloat16(), torch.tensor(0.0).bfloat16()))


def test_off_paths_and_seed():
    x = torch.randn(8, 16)
    assert dropout(x, 0.1, training=False) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    torch.manual_seed(3)
    a = dropout(x, 0.3)
    torch.manual_seed(3)
    assert torch.equal(a, dropout(x, 0.3))
    m = Dropout(0.3)
    assert m.eval()(x) is x and isinstance(m, torch.nn.Dropout)


def test_training_attention_path_matches_sdpa_without_dropout():
    """Under fast.training, training on CPU takes the attention with this dropout; with a dropout of
    zero it must equal the scaled_dot_product_attention path, in values and gradients."""
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model = BertModel(config).train()
    applied = fast.training(model)  # held for the rest of this test: a dropped generator would undo it
    applied.__enter__()
    ids = torch.randint(1, 120, (3, 20))
    mask = (torch.arange(20) < torch.tensor([20, 13, 7])[:, None]).long()
    torch.manual_seed(5)
    a = model(ids, mask).last_hidden_state
    torch.manual_seed(5)
    assert torch.equal(a, model(ids, mask).last_hidden_state)  # dropout masks follow the seed
    assert not torch.equal(a, model(ids, mask).last_hidden_state)  # and dropout is on
    for layer in model.layers:
        layer.attention.dropout_p = 0.0
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    plain = model(ids, mask, output_attentions=True)  # need_weights: the plain path
    sdpa = model(ids, mask)  # dropout_p 0: the SDPA path
    real = mask.bool()
    assert_parity(plain.last_hidden_state[real], sdpa.last_hidden_state[real])
    params = [p for name, p in model.named_parameters() if not name.startswith("pooler")]
    # a random projection: the gradient of a plain sum through the last LayerNorm is zero up to rounding
    w = torch.randn(int(real.sum()), config.hidden_size, generator=torch.Generator().manual_seed(1))
    gp = torch.autograd.grad((plain.last_hidden_state[real] * w).sum(), params)
    gs = torch.autograd.grad((sdpa.last_hidden_state[real] * w).sum(), params)
    for a, b in zip(gp, gs):
        assert_parity(a, b)


def test_attention_in_blocks_of_like_length_equals_the_plain_path():
    """A packed batch of sequences of 4 to 40 tokens attends in blocks of like length under
    fast.training (less work than one block padded to 40); with a dropout too small to drop anything
    (so that the path is taken and the masks are all ones) its values and gradients are the plain
    model's, and a batch of equal lengths stays one block."""
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=1e-12,
                        attention_probs_dropout_prob=1e-12)
    torch.manual_seed(0)
    model = BertModel(config).train()
    lengths = torch.tensor([40, 4, 6, 33, 5, 38, 7, 36])
    cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).int()
    ids = torch.randint(1, 120, (int(lengths.sum()),))
    w = torch.randn(ids.numel(), config.hidden_size, generator=torch.Generator().manual_seed(1))

    def run(fast_pieces: bool):
        model.zero_grad(set_to_none=True)
        with fast.training(model) if fast_pieces else contextlib.nullcontext():
            out = model(ids, cu_seqlens=cu, max_seqlen=40).last_hidden_state  # [N, H]
            (out * w).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    blocks = []
    real = fast.attention.block_attention
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fast.attention, "block_attention", lambda qkv, layout, *a: blocks.append(layout.batch) or
                   real(qkv, layout, *a))
        ours = run(True)
        assert sorted(blocks) == sorted([1, 1, 2, 4] * config.num_hidden_layers)  # 4, 5, 6, 7 | 33 | 36, 38 | 40
        blocks.clear()
        equal = fast.attention.length_blocks(model_module.packed_layout(torch.tensor([0, 9, 18, 27]).int(), 9, 27)[0])
        assert equal is None
    plain = run(False)
    assert_parity(ours[0], plain[0])
    for name, g in plain[1].items():
        assert_parity(ours[1][name], g, name)


def test_causal_attention_and_a_dropout_of_one_train_as_the_plain_path():
    """Under fast.training a GPT's attention stays causal, packed and padded (a token never sees the
    ones after it), and a BERT whose attention drops everything (a config may say 1.0) gives what the
    plain path gives rather than dividing by 1 - p."""
    from torchbert.baselines.gpt import OpenAIGPTLMHeadModel
    from torchbert.config import GPTConfig

    torch.manual_seed(0)
    gpt = OpenAIGPTLMHeadModel(GPTConfig(vocab_size=120, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                         resid_pdrop=1e-12, embd_pdrop=1e-12, attn_pdrop=1e-12)).train()
    ids = torch.randint(1, 120, (2, 12))
    cu = torch.tensor([0, 12, 24], dtype=torch.int32)
    plain = gpt(ids).logits, gpt(ids.flatten(), cu_seqlens=cu, max_seqlen=12).logits
    with fast.training(gpt):
        ours = gpt(ids).logits, gpt(ids.flatten(), cu_seqlens=cu, max_seqlen=12).logits
    for a, b in zip(ours, plain):
        assert_parity(a, b)
    assert_parity(plain[0][:, :5], gpt(ids[:, :5]).logits)  # causal: the first five never saw the rest
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=1.0)
    bert = BertModel(config).train()
    mask = (torch.arange(12) < torch.tensor([12, 7])[:, None]).long()
    want = bert(ids, mask).last_hidden_state
    with fast.training(bert):
        assert_parity(bert(ids, mask).last_hidden_state, want)


def test_the_fast_attention_is_left_to_autocast_and_to_the_plain_path_without_dropout(monkeypatch):
    """fast.attention's functions run in fp32 training with 0 < p < 1 only: under autocast (bf16
    training) and in eval the attention is the plain path's."""
    calls = []
    real = fast.attention.block_attention
    monkeypatch.setattr(fast.attention, "block_attention", lambda *a: calls.append(1) or real(*a))
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32)
    bert = BertModel(config).train()
    ids = torch.randint(1, 120, (2, 12))
    with fast.training(bert):
        bert(ids)
        assert len(calls) == 1  # the path is taken in fp32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bert(ids)
        bert.eval()
        bert(ids)
    assert len(calls) == 1


def test_the_attention_weights_asked_for_come_back_from_every_layer_under_fast_training():
    """The last layer under a head that reads a few rows (RowsSelfAttention) still gives its weights."""
    ids = torch.randint(1, 120, (2, 12))
    model = BertForPreTraining(BertConfig.from_name("tiny", vocab_size=120)).train()
    labels = torch.full((2, 12), -100)
    labels[:, 3] = 7
    with fast.training(model):
        out = model(ids, labels=labels, output_attentions=True)
    assert len(out.attentions) == 2 and out.attentions[-1].shape == (2, 2, 12, 12)


def test_model_dropout_rate_in_training():
    """With hidden dropout only, the embeddings' output has the configured share of zeros."""
    config = BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.2)
    model = BertModel(config).train()
    ids = torch.randint(1, 120, (16, 64))
    with fast.training(model):
        assert type(model.embeddings.dropout) is Dropout
        x = model.embeddings(ids, torch.zeros_like(ids), torch.arange(64).expand(16, 64))
    assert abs((x == 0).float().mean().item() - 0.2) < 0.02
    assert type(model.embeddings.dropout) is torch.nn.Dropout


def test_large_masks_are_two_streams_fixed_by_the_seed():
    """A mask over SPLIT elements is two halves from two seeds drawn from torch's generator; the
    half drawn on the helper thread equals the same draw made on the caller's thread."""
    from torchbert.fast import dropout as d

    n = d.SPLIT * 2 + 7
    torch.manual_seed(4)
    mask = d.scaled_mask((n,), 0.1)
    torch.manual_seed(4)
    seeds = torch.randint(0, 2**62, (2,)).tolist()
    threshold = -(2**15) + round(0.1 * 2**16)
    by_hand = numpy.empty(n, numpy.float32)
    d._fill(by_hand[: n // 2], seeds[0], threshold, 1 / 0.9)
    d._fill(by_hand[n // 2:], seeds[1], threshold, 1 / 0.9)
    assert torch.equal(mask, torch.from_numpy(by_hand))
    assert set(mask.unique().tolist()) == {0.0, numpy.float32(1 / 0.9).item()}
    assert not torch.equal(mask[: n // 2][:1000], mask[n // 2:][:1000])  # two streams, not one twice
    # the caller's generator moved on: the next mask differs
    assert not torch.equal(mask, d.scaled_mask((n,), 0.1))


def _child_mask(queue):
    torch.set_num_threads(1)  # as DataLoader workers do: torch's OpenMP pool does not survive a fork
    torch.manual_seed(5)
    queue.put(dropout(torch.ones(600, 1000), 0.1).sum().item())


def test_a_forked_child_draws_its_own_masks():
    """The helper thread does not survive a fork (DataLoader workers, torchrun): the child makes its own."""
    import multiprocessing

    dropout(torch.ones(600, 1000), 0.1)  # the parent's helper thread exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_mask, args=(queue,), daemon=True)
    child.start()
    try:
        got = queue.get(timeout=60)
    finally:
        child.kill()
    torch.manual_seed(5)
    assert got == dropout(torch.ones(600, 1000), 0.1).sum().item()


# -- attention ---------------------------------------------------------------------------------------

def autograd_attention(blocks, q, bias, beta, p):
    """fast.attention._Attention's steps in autograd's hands (q in the block), with the same dropout masks
    (drawn a piece of fast.attention.spans at a time, as it draws them)."""
    _, B, A, T, D = blocks.shape
    q, k, v = blocks.view(3, B * A, T, D)
    scores = torch.baddbmm(bias, q, k.transpose(1, 2), beta=beta, alpha=1 / math.sqrt(D))
    probs = scores.softmax(-1)
    pieces = fast.attention.spans(B * A, T * T * max(probs.element_size(), 4))
    return (torch.cat([dropout(probs[a:b], p) for a, b in pieces]) @ v).view(B, A, T, D)


@pytest.mark.parametrize("inputs", ["packed", "packed in groups", "padded", "padded in pieces"])
def test_cpu_training_attention_matches_autograd(inputs, monkeypatch):
    """Training on CPU with attention dropout runs fast.attention's _Heads, _Attention and _Tokens,
    whose backwards are written by hand; with the same seed (the same dropout masks) the plain
    model's layout steps and autograd through the same attention steps give the same loss and
    gradients, packed (with padding) and padded; packed with the sequences in blocks of like
    length (fast.attention.length_blocks), where the reference attends block by block too; and with
    the scores made a few rows at a time (CHUNK_BYTES, here 3 of a block's 8 rows: 3, 3 and 2)."""
    grouped = inputs == "packed in groups"
    if not grouped:
        monkeypatch.setattr(fast.attention, "GROUPED_AT", 0.0)  # one block, padded to the longest
    pieces = []
    if inputs == "padded in pieces":
        monkeypatch.setattr(fast.attention, "CHUNK_BYTES", 3 * 11 * 11 * 4)
        monkeypatch.setattr(fast.attention, "spans", lambda *a, f=fast.attention.spans: pieces.append(f(*a)) or pieces[-1])
    cfg = BertConfig.from_name("tiny", vocab_size=300)  # dropout 0.1 everywhere
    torch.manual_seed(0)
    model = BertForPreTraining(cfg).train()
    ids = torch.randint(5, 300, (4, 11))
    mask = (torch.arange(11) < torch.tensor([11, 3, 7, 5])[:, None]).long()
    labels = torch.where((torch.rand(ids.shape) < 0.3) & mask.bool(), ids, -100)
    labels[0, 2] = ids[0, 2]
    nsp = torch.tensor([0, 1, 1, 0])
    if not inputs.startswith("padded"):
        flat, flat_labels, cu, T = unpad(ids, mask, labels)
        positions = (flat_labels != -100).nonzero().squeeze(1)
        kw = dict(input_ids=flat, cu_seqlens=cu, max_seqlen=T, mlm_positions=positions, mlm_labels=flat_labels[positions])
    else:
        kw = dict(input_ids=ids, attention_mask=mask, labels=labels)

    def run():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        with fast.training(model):
            out = model(**kw, next_sentence_label=nsp)
            out.loss.backward()
        return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    # the last layer attends from every token here (RowsSelfAttention, which attends from a few rows
    # only, draws other dropout masks: test_model.py holds it to the full output)
    monkeypatch.setattr(fast.attention.RowsSelfAttention, "forward", model_module.SelfAttention.forward)
    used = []
    for fn in (fast.attention._Heads, fast.attention._Attention, fast.attention._Tokens):
        monkeypatch.setattr(fn, "backward", staticmethod(lambda *a, b=fn.backward, n=fn.__name__: used.append(n) or b(*a)))
    ours = run()
    L, blocks = cfg.num_hidden_layers, 4 if grouped else 1  # grouped: each sequence alone, so none padded
    tokens = ["_Tokens"] * (L if inputs == "packed" else 0)
    assert sorted(used) == sorted(["_Heads", "_Attention"] * L * blocks + tokens)
    assert pieces == ([[(0, 3), (3, 6), (6, 8)]] * L if inputs == "padded in pieces" else [])

    def plain_layout_then(qkv, layout, heads, p):  # the model's own split and merge around the same steps
        def attend(qkv, layout):
            q, k, v = model_module.split_heads(qkv, layout, heads)
            return model_module.merge_heads(autograd_attention(torch.stack([q, k, v]), None,
                                                               *layout.score_bias(q, heads), p), layout)
        if not grouped:
            return attend(qkv, layout), None
        rows, layouts, _ = fast.attention.length_blocks(layout)
        out = torch.zeros(qkv.shape[0], qkv.shape[1] // 3)
        for r, sub in zip(rows, layouts):
            out = out.index_copy(0, r, attend(qkv[r], sub))
        return out, None

    monkeypatch.setitem(model_module.ATTENTION, "fast", plain_layout_then)  # what fast.training picks
    reference = run()
    assert_parity(ours[0], reference[0])
    for name, g in reference[1].items():
        assert_parity(ours[1][name], g, name)
    assert ours[1]["bert.layers.0.attention.qkv.weight"].abs().sum() > 0


# -- the fused MLM loss ------------------------------------------------------------------------------

def training_gradients(model, inputs, labels, nsp, use_logits: bool, rows: bool, fused: bool):
    """Loss, MLM logits and every parameter's gradient of one backward, dropout off, through the fast
    pieces when `fused`; the embeddings' gradients as rows made dense (SparseRows, as the
    pretraining loop does) when `rows`."""
    model.zero_grad(set_to_none=True)
    with fast.SparseRows(model) if rows else contextlib.nullcontext() as sparse, \
            fast.training(model) if fused else contextlib.nullcontext():
        assert isinstance(model.mlm, fast.decoder.FusedMaskedLMHead) == fused
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
def test_fused_decoder_loss_equals_the_plain_path(minilm_with_heads, real_batch, case):
    """With gradients on, fast's MLM decoder and its cross-entropy run as one function that makes the
    logits' gradient in its forward, on the word embeddings taken through _Tied; the plain head
    (F.linear + F.cross_entropy on the weight itself) must give the same loss, logits and gradient
    for every parameter, the tied embeddings' included."""
    model = BertForPreTraining.from_pretrained(minilm_with_heads[BertForPreTraining]).eval()  # dropout off
    inputs, labels, nsp = real_batch
    if case == "nothing scored":
        labels = torch.full_like(labels, -100)
    kw = dict(use_logits=case in ("loss and logits", "nothing scored"), rows=case == "rows")
    tied = []
    backward = fast.decoder._Tied.backward
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fast.decoder._Tied, "backward", staticmethod(lambda *a: tied.append(1) or backward(*a)))
        fused = training_gradients(model, inputs, labels, nsp, fused=True, **kw)
    assert tied == [1]  # the decoder took the embeddings through _Tied
    plain = training_gradients(model, inputs, labels, nsp, fused=False, **kw)
    if case == "nothing scored":
        assert fused[0].isnan() and plain[0].isnan() and fused[1].shape[0] == 0
    else:
        assert_parity(fused[0], plain[0])
    assert fused[1].shape == plain[1].shape
    if plain[1].numel():  # the logits: addmm against F.linear, perhaps another kernel
        assert_parity(fused[1], plain[1])
    assert fused[2].keys() == plain[2].keys()
    for name, g in plain[2].items():
        assert_parity(fused[2][name], g, name)
    assert plain[2]["bert.embeddings.word.weight"].abs().sum() > 0


def test_fused_decoder_reuses_its_gradient_buffer_safely(monkeypatch):
    """The [M, V] loss gradient's buffer passes from a backward to the next forward (decoder._FREE): the
    next step gets the same memory and the same result as with fresh buffers; a retained graph run
    twice gives the same gradients, unless a later forward took its buffer meanwhile: then autograd
    refuses, as for any in-place change of a saved tensor."""
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_name("tiny", vocab_size=300)).eval()
    applied = fast.training(model)  # held for the rest of this test: a dropped generator would undo it
    applied.__enter__()
    ids = torch.randint(5, 300, (4, 12))
    labels = torch.full_like(ids, -100)
    labels[:, 3:6] = ids[:, 3:6]
    monkeypatch.setattr(fast.decoder, "_FREE", [])

    def grads(retain=False):
        model.zero_grad()
        out = model(ids, labels=labels)
        out.mlm_loss.backward(retain_graph=retain)
        return out, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    _, first = grads()
    free = fast.decoder._FREE
    assert len(free) == 1
    kept = free[0].data_ptr()
    _, second = grads()
    assert free[0].data_ptr() == kept and len(free) == 1  # the same buffer, taken and given back
    assert len(first) == len(second) > 10 and all(torch.equal(a, b) for a, b in zip(first, second))

    out, once = grads(retain=True)
    model.zero_grad()
    out.mlm_loss.backward(retain_graph=True)  # again: its buffer is back in _FREE, untouched
    again = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(once) == len(again) and all(torch.equal(a, b) for a, b in zip(once, again))
    assert len(free) == 1  # given back once
    model(ids, labels=labels).mlm_loss  # a new forward takes that buffer and writes into it
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.mlm_loss.backward()


# -- fast.training ------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [BertForPreTraining, BertForMaskedLM])
def test_training_swaps_the_pieces_in_and_puts_the_model_back(cls):
    torch.manual_seed(0)
    model = cls(BertConfig.from_name("tiny", vocab_size=300))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plain_types = [type(m) for m in model.modules()]
    with fast.training(model) as same:
        assert same is model
        assert all(type(m) is Dropout for m in model.modules() if isinstance(m, torch.nn.Dropout))
        assert {layer.attention.impl for layer in model.bert.layers} == {"fast"}
        assert {type(layer.attention) for layer in model.bert.layers} == {fast.attention.RowsSelfAttention}
        assert type(model.mlm) is fast.decoder.FusedMaskedLMHead and len(model._forward_pre_hooks) == 1
        assert model.state_dict().keys() == before.keys()
    assert [type(m) for m in model.modules()] == plain_types and type(model.mlm) is MaskedLMHead
    assert {layer.attention.impl for layer in model.bert.layers} == {"sdpa"}
    assert not model._forward_pre_hooks
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_training_leaves_eager_attention_and_inference_alone():
    """An attention set to another function by its user keeps it; in eval the fast model gives the
    plain model's outputs exactly (every piece falls back)."""
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_name("tiny", vocab_size=300)).eval()
    model.bert.layers[0].attention.impl = "eager"
    ids = torch.randint(5, 300, (3, 9))
    plain = model(ids).mlm_logits
    with fast.training(model):
        assert model.bert.layers[0].attention.impl == "eager" and model.bert.layers[1].attention.impl == "fast"
        assert torch.equal(model(ids).mlm_logits, plain)
    assert model.bert.layers[0].attention.impl == "eager"


def test_inference_attention_is_the_plain_path_on_cpu_and_is_put_back():
    """fast.inference (what serve runs its models under) switches every attention to "fast" while
    its block runs, and back after; on CPU in eval that is SDPA, so the outputs are the same numbers."""
    torch.manual_seed(0)
    model = BertModel(BertConfig.from_name("tiny", vocab_size=50)).eval()
    ids = torch.randint(5, 50, (23,))
    cu = torch.tensor([0, 9, 23], dtype=torch.int32)
    with torch.no_grad():
        plain = model(ids, cu_seqlens=cu, max_seqlen=14).last_hidden_state
        with fast.inference(model):
            assert {layer.attention.impl for layer in model.layers} == {"fast"}
            inside = model(ids, cu_seqlens=cu, max_seqlen=14).last_hidden_state
    assert {layer.attention.impl for layer in model.layers} == {"sdpa"}
    assert torch.equal(plain, inside)
    model.layers[0].attention.impl = "eager"  # the user's choice stays, inside the block and after it
    with fast.inference(model):
        assert [layer.attention.impl for layer in model.layers] == ["eager", "fast"]
    assert [layer.attention.impl for layer in model.layers] == ["eager", "sdpa"]


def test_training_leaves_an_in_place_dropout_alone():
    """fast.dropout.Dropout writes a new tensor; a dropout its user made in place stays torch's."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1, inplace=True), torch.nn.Dropout(0.1))
    with fast.training(model):
        assert type(model[1]) is torch.nn.Dropout and type(model[2]) is Dropout
    assert type(model[2]) is torch.nn.Dropout


def test_sparse_rows_zero_every_row_they_filled_and_forget_them():
    """Two densify calls before a reset (rows from both are zeroed); after reset no row is kept, so a
    long run's list of rows does not grow step by step."""
    emb = torch.nn.Embedding(10, 3)
    rows = fast.SparseRows(emb)
    with rows:
        for ids in ([1, 2], [7]):
            emb(torch.tensor(ids)).sum().backward()
            rows.densify()
            emb.weight.grad = None  # the next backward's rows come sparse again
        assert rows.buffers[emb.weight][[1, 2, 7]].abs().sum() > 0
        assert rows.norms()[emb.weight] == pytest.approx(float(rows.buffers[emb.weight].norm()))
        rows.reset()
    assert not rows.buffers[emb.weight].any() and rows.rows == {}


def test_the_fused_cross_entropy_skips_ignored_targets_as_cross_entropy_does():
    """Called with targets that hold IGNORE (-100), the fused loss and every gradient equal
    F.cross_entropy's with ignore_index: an ignored row passes no gradient."""
    torch.manual_seed(0)
    h = torch.randn(6, 8, requires_grad=True)
    w = torch.randn(11, 8, requires_grad=True)
    b = torch.randn(11, requires_grad=True)
    targets = torch.tensor([3, -100, 0, 10, -100, 7])
    loss, logits = fast.decoder._DecoderCrossEntropy.apply(h, w, b, targets)
    loss.backward()
    fused = [h.grad.clone(), w.grad.clone(), b.grad.clone()]
    for p in (h, w, b):
        p.grad = None
    plain = torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w, b), targets, ignore_index=-100)
    plain.backward()
    assert loss.item() == pytest.approx(plain.item(), rel=1e-6)
    for got, want in zip(fused, (h.grad, w.grad, b.grad)):
        assert torch.allclose(got, want, atol=1e-6)
    assert not fused[0][[1, 4]].any()  # the ignored rows' hidden states get nothing


def test_the_loss_gradient_buffers_keep_the_two_largest_and_room_to_grow(monkeypatch):
    """_FREE holds the two largest buffers given back; a new one has a quarter to spare, so that the
    next batches' few more masked tokens fit it."""
    monkeypatch.setattr(fast.decoder, "_FREE", [])
    for n in (10, 30, 20):
        fast.decoder._give_buffer(torch.empty(n))
    assert [b.numel() for b in fast.decoder._FREE] == [30, 20]
    assert fast.decoder._take_buffer(torch.empty(25), torch.float32).numel() == 30
    assert fast.decoder._take_buffer(torch.empty(100), torch.float32).numel() == 125
    assert [b.numel() for b in fast.decoder._FREE] == [20]


def test_the_fused_head_runs_only_with_gradients_and_without_autocast_and_keeps_nothing(monkeypatch):
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_name("tiny", vocab_size=300))
    ids = torch.randint(5, 300, (2, 9))
    labels = torch.full_like(ids, -100)
    labels[:, 2:4] = ids[:, 2:4]
    real = fast.decoder._DecoderCrossEntropy.apply
    calls = []
    monkeypatch.setattr(fast.decoder._DecoderCrossEntropy, "apply", lambda *a: calls.append(1) or real(*a))
    with fast.training(model):
        with torch.no_grad():
            model(ids, labels=labels)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(ids, labels=labels)
        assert calls == []  # the plain head in eval and under autocast
        model(ids, labels=labels).mlm_loss.backward()
        assert calls == [1]
        assert model.mlm.tied is None  # the step's tied embeddings are not kept past its forward
