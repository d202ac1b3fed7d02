"""Parameter groups, AdamW, LAMB and the six schedules (checked against transformers')."""

import math

import numpy as np
import pytest
import torch
import transformers
from parity import assert_parity
from torch import nn

from torchbert import BertConfig
from torchbert.heads import BertForPreTraining, BertForTokenClassification
from torchbert.train.optim import (SCHEDULES, Lamb, SparseRows, clipped_step, lr_factor, make_optimizer, make_scheduler,
                                   parameter_groups)


def test_no_decay_on_biases_and_layernorm():
    model = BertForPreTraining(BertConfig.from_name("tiny", vocab_size=100))
    decay, no_decay = parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert decayed | kept == set(names.values()) and not decayed & kept
    assert all(n.endswith("bias") or "norm" in n for n in kept)
    assert "mlm.bias" in kept and "bert.embeddings.norm.weight" in kept and "bert.layers.0.ffn_norm.weight" in kept
    assert "bert.embeddings.word.weight" in decayed and "bert.layers.1.attention.qkv.weight" in decayed
    assert all(not n.endswith("bias") and "norm" not in n for n in decayed)
    lstm = torch.nn.LSTM(4, 3, bidirectional=True)  # biases named bias_ih_l0, bias_hh_l0_reverse, ...
    decay, no_decay = parameter_groups(lstm, 0.01)
    assert {id(p) for p in no_decay["params"]} == {id(p) for n, p in lstm.named_parameters() if "bias" in n}
    assert len(decay["params"]) == 4


def test_no_decay_on_named_biases_and_scalars_and_nothing_frozen():
    """A bias by any of its names (relative_bias, bias_ih_l0), and a scalar (a learned temperature),
    are not decayed; a frozen parameter is in neither group."""
    m = nn.Module()
    m.weight = nn.Parameter(torch.ones(2, 2))
    m.relative_bias = nn.Parameter(torch.ones(2))
    m.temperature = nn.Parameter(torch.tensor(0.05))
    m.frozen = nn.Parameter(torch.ones(2, 2), requires_grad=False)
    decay, no_decay = parameter_groups(m, 0.1)
    assert [id(p) for p in decay["params"]] == [id(m.weight)]
    assert {id(p) for p in no_decay["params"]} == {id(m.relative_bias), id(m.temperature)}


@pytest.mark.parametrize("name", SCHEDULES)
def test_schedules_match_transformers(name):
    warmup, total = 10, 100
    p = nn.Parameter(torch.zeros(1))
    ref_opt = torch.optim.SGD([p], lr=1.0)
    kwargs = {"lr_end": 0.0, "power": 2.0} if name == "polynomial" else {}
    extra = {"scheduler_specific_kwargs": kwargs} if kwargs else {}
    ref = transformers.get_scheduler(name, ref_opt, num_warmup_steps=warmup, num_training_steps=total, **extra)
    ours_opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    ours = make_scheduler(ours_opt, name, warmup, total, **({"power": 2.0} if kwargs else {}))
    for step in range(total + 1):  # past the end transformers' cosine rises again; ours stays at its end
        assert ours_opt.param_groups[0]["lr"] == pytest.approx(ref_opt.param_groups[0]["lr"], abs=1e-12), step
        want = ref_opt.param_groups[0]["lr"]
        assert lr_factor(name, step, warmup, total, **({"power": 2.0} if kwargs else {})) == pytest.approx(want, abs=1e-12)
        ref_opt.step(), ref.step(), ours_opt.step(), ours.step()
    end = lr_factor(name, total, warmup, total)
    assert all(lr_factor(name, total + k, warmup, total) == end for k in range(1, 20))


def test_schedule_shapes():
    assert lr_factor("linear", 0, 10, 100) == 0.0
    assert lr_factor("linear", 0, 0, 100) == 1.0 and lr_factor("cosine", 0, 0, 100) == 1.0  # no warmup: the peak
    assert lr_factor("linear", 10, 10, 100) == 1.0
    assert lr_factor("linear", 55, 10, 100) == pytest.approx(0.5)
    assert lr_factor("cosine", 55, 10, 100) == pytest.approx(0.5)
    assert lr_factor("cosine_with_restarts", 55, 10, 100, num_cycles=2) == pytest.approx(1.0)
    assert lr_factor("polynomial", 100, 10, 100, end_factor=0.1) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="unknown schedule 'exp'"):
        lr_factor("exp", 0)
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        make_optimizer(nn.Linear(2, 2), "sgd")


def lamb_reference(w, grads, lr, betas, eps, wd):
    """LAMB written out in numpy, step by step, from the paper's algorithm."""
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        u = (m / (1 - betas[0] ** t)) / (np.sqrt(v / (1 - betas[1] ** t)) + eps) + wd * w
        wn, un = np.linalg.norm(w), np.linalg.norm(u)
        ratio = wn / un if wn > 0 and un > 0 else 1.0
        w = w - lr * ratio * u
    return w


def test_lamb_matches_the_algorithm():
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(5, 3))
    grads = [rng.normal(size=(5, 3)) for _ in range(6)]
    p = nn.Parameter(torch.tensor(w0, dtype=torch.float64))
    opt = Lamb([p], lr=0.01, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1)
    for g in grads:
        p.grad = torch.tensor(g)
        opt.step()
    want = lamb_reference(w0, grads, 0.01, (0.9, 0.99), 1e-6, 0.1)
    assert_parity(p, want)
    # a zero tensor (a fresh bias) gets the plain Adam step: trust ratio 1
    b = nn.Parameter(torch.zeros(3, dtype=torch.float64))
    opt = Lamb([b], lr=0.5)
    b.grad = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    opt.step()
    assert_parity(b, -0.5 * b.grad / (b.grad.abs() + 1e-6))  # m_hat / (sqrt(v_hat) + eps) = g / (|g| + eps)
    # eps reaches LAMB through make_optimizer; a closure's loss comes back
    opt = make_optimizer(nn.Linear(2, 2), "lamb", eps=1e-3)
    assert all(g["eps"] == 1e-3 for g in opt.param_groups)
    assert opt.step(lambda: torch.tensor(2.5)) == 2.5
    for bad in ({"lr": 0.0}, {"betas": (0.9, 1.0)}, {"betas": (1.0, 0.999)}, {"eps": 0.0}):
        with pytest.raises(ValueError, match="invalid LAMB settings"):
            Lamb([b], **bad)


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_optimizers_train_a_tiny_bert(name):
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_name("tiny", vocab_size=50, hidden_dropout_prob=0.0,
                                                    attention_probs_dropout_prob=0.0))
    ids = torch.randint(5, 50, (8, 10))
    labels = ids.clone()
    inputs = ids.clone()
    inputs[:, 4] = 3  # always mask position 4: the model must learn to recover it
    labels[:, torch.arange(10) != 4] = -100
    nsp = torch.randint(0, 2, (8,))
    opt = make_optimizer(model, name, lr=3e-3 if name == "adamw" else 2e-2, weight_decay=0.01)
    first = None
    for _ in range(60):
        loss = model(inputs, labels=labels, next_sentence_label=nsp).loss
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3 * first and math.isfinite(loss.item())


def test_fused_adamw_equals_the_per_tensor_loop():
    """make_optimizer's AdamW runs fused; it must step as torch's plain per-tensor AdamW does."""
    config = BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    a = BertForPreTraining(config)
    b = BertForPreTraining(config)
    b.load_state_dict(a.state_dict())
    a.eval(), b.eval()  # no dropout: the same gradients on both sides
    ours = make_optimizer(a, lr=1e-3, weight_decay=0.01)
    assert ours.defaults["fused"]
    ref = torch.optim.AdamW(parameter_groups(b, 0.01), lr=1e-3, eps=1e-6, foreach=False)
    ids = torch.randint(5, 300, (4, 16))
    for _ in range(5):
        for model, opt in ((a, ours), (b, ref)):
            model(ids, labels=ids, next_sentence_label=torch.tensor([0, 1, 0, 1])).loss.backward()
            opt.step()
            opt.zero_grad()
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert_parity(p, q, name)


@pytest.mark.parametrize("grad_size", [10.0, 1e-3])  # clipped, and under the limit
@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_clipped_step_equals_clip_grad_norm_then_step(name, grad_size):
    """The fused AdamW takes the clipping scale in its step (grad_scale); the result is that of
    clip_grad_norm_ and step(), and the optimizer keeps no scale for the next step."""
    torch.manual_seed(0)
    a = BertForPreTraining(BertConfig.from_name("tiny", vocab_size=100))
    b = BertForPreTraining(BertConfig.from_name("tiny", vocab_size=100))
    b.load_state_dict(a.state_dict())
    opt_a, opt_b = make_optimizer(a, name), make_optimizer(b, name)
    for step in range(3):
        for p, q in zip(a.parameters(), b.parameters()):
            p.grad = torch.randn_like(p) * grad_size
            q.grad = p.grad.clone()
        norm = torch.nn.utils.get_total_norm([p.grad for p in a.parameters()])
        assert (norm > 1.0) == (grad_size > 1)
        clipped_step(opt_a, a.parameters(), 1.0)
        torch.nn.utils.clip_grad_norm_(b.parameters(), 1.0)
        opt_b.step()
        assert getattr(opt_a, "grad_scale", None) is None
        for (n, p), q in zip(a.named_parameters(), b.parameters()):
            assert_parity(p, q, n)
            # Adam's update hardly sees a gradient's scale; its moments do: they hold the clipped gradients
            for key in ("exp_avg", "exp_avg_sq"):
                assert_parity(opt_a.state[p][key], opt_b.state[q][key], f"{n} {key}")


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_a_non_finite_loss_skips_the_step_though_the_gradients_are_finite(name):
    model = nn.Linear(3, 2)
    opt = make_optimizer(model, name)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in model.parameters()]
    for loss in (float("nan"), float("inf")):
        assert clipped_step(opt, model.parameters(), 1.0, loss=torch.tensor(loss)) is False
        assert bool(clipped_step(opt, model.parameters(), 1.0, loss=torch.tensor(loss), defer=True)) is False
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert clipped_step(opt, model.parameters(), 1.0, loss=torch.tensor(0.5)) is True
    assert not any(torch.equal(p, q) for p, q in zip(model.parameters(), before))


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_a_deferred_step_skips_a_non_finite_gradient_on_the_device_and_equals_the_host_read_one(name):
    """clipped_step(defer=True), for GPUs: no host read; the verdict comes back as a tensor, a finite
    step equals the plain one, and a NaN gradient leaves the weights, the moments and the step count
    as they were (the fused AdamW's found_inf; LAMB reads the verdict on the host instead)."""
    torch.manual_seed(0)
    a = BertForPreTraining(BertConfig.from_name("tiny", vocab_size=100))
    b = BertForPreTraining(BertConfig.from_name("tiny", vocab_size=100))
    b.load_state_dict(a.state_dict())
    opt_a, opt_b = make_optimizer(a, name), make_optimizer(b, name)
    for step, bad in enumerate([False, True, False]):
        for p, q in zip(a.parameters(), b.parameters()):
            p.grad = torch.randn_like(p) * 10
            q.grad = p.grad.clone()
        if bad:
            a.bert.embeddings.norm.weight.grad[0] = float("nan")
        before = {n: p.detach().clone() for n, p in a.named_parameters()}
        verdict = clipped_step(opt_a, a.parameters(), 1.0, defer=True)
        assert isinstance(verdict, torch.Tensor) and bool(verdict) is not bad
        assert getattr(opt_a, "found_inf", None) is None and getattr(opt_a, "grad_scale", None) is None
        if bad:
            for n, p in a.named_parameters():
                assert torch.equal(p, before[n]), n
            continue
        clipped_step(opt_b, b.parameters(), 1.0)
        for (n, p), q in zip(a.named_parameters(), b.parameters()):
            assert_parity(p, q, n)
            for key in ("exp_avg", "exp_avg_sq", "step"):
                assert_parity(opt_a.state[p][key], opt_b.state[q][key], f"{n} {key}")


@pytest.mark.parametrize("kind", ["token", "pretraining"])
def test_sparse_rows_step_as_dense_gradients(kind):
    """With SparseRows the embeddings' gradients arrive as rows and are added into buffers that live
    across steps; the gradients the optimizer sees, and so the weights, are those of the dense
    lookup, step after step (stale rows left in a buffer would show in the next step), with two
    micro-batches per step. In pretraining the word embeddings are tied to the MLM decoder, whose
    dense gradient joins the rows: nothing is kept then."""
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, extra={"num_labels": 3})
    make = (lambda: BertForTokenClassification(config)) if kind == "token" else (lambda: BertForPreTraining(config))
    torch.manual_seed(0)
    dense, sparse = make(), make()
    sparse.load_state_dict(dense.state_dict())
    opt_d, opt_s = make_optimizer(dense, lr=1e-2), make_optimizer(sparse, lr=1e-2)
    rows = SparseRows(sparse)
    assert len(rows.embeddings) == 3  # word, position, token type

    def loss(model, step, micro):
        g = torch.Generator().manual_seed(100 * step + micro)
        ids = torch.randint(5, 60 if step % 2 else 120, (4, 12), generator=g)  # rows differ between steps
        torch.manual_seed(step * 10 + micro)  # the same dropout masks on both sides
        if kind == "token":
            return model(ids, labels=torch.randint(0, 3, (4, 12), generator=g)).loss
        return model(ids, labels=ids, next_sentence_label=torch.tensor([0, 1, 0, 1])).loss

    with rows:
        for step in range(4):
            for micro in range(2):
                loss(dense, step, micro).backward()
                loss(sparse, step, micro).backward()
            word = sparse.bert.embeddings.word.weight
            assert word.grad.is_sparse == (kind == "token")
            rows.densify()
            for (n, p), q in zip(dense.named_parameters(), sparse.parameters()):
                assert not q.grad.is_sparse
                assert_parity(q.grad, p.grad, n)
            assert (word.grad is rows.buffers.get(word)) == (kind == "token")
            norms = rows.norms()  # read from the rows: the dense gradients' norms
            assert (word in norms) == (kind == "token") and len(norms) == 2 + (kind == "token")
            for n, p in sparse.named_parameters():
                if p in norms:
                    assert_parity(norms[p], p.grad.norm(), n)
            assert torch.nn.utils.get_total_norm([p.grad for p in dense.parameters()]) > 1  # clipping is on
            for model, opt, r in ((dense, opt_d, None), (sparse, opt_s, rows)):
                clipped_step(opt, model.parameters(), 1.0, r)  # clears the rows after the step
                opt.zero_grad(set_to_none=True)
            assert all(not b.any() for b in rows.buffers.values())
    assert not any(m.sparse for m in rows.embeddings)  # the lookups are dense again after the block
    for (n, p), q in zip(dense.named_parameters(), sparse.parameters()):
        assert_parity(q, p, n)
