"""The CPU dropout (dropout.py) behaves as F.dropout: the drop rate, the scaling, the gradient."""

import numpy
import pytest
import torch

from torchbert.config import BertConfig
from torchbert.dropout import Dropout, dropout, keep_mask
from torchbert.model import BertModel


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
    torch.testing.assert_close(y[kept], x[kept] / 0.75)
    g = torch.randn_like(y)
    y.backward(g)
    torch.testing.assert_close(x.grad, torch.where(kept, g / 0.75, 0.0))
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
    """In training on CPU attention takes the plain path with this dropout; with a dropout of zero it
    must equal the scaled_dot_product_attention path it replaces, in values and gradients."""
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model = BertModel(config).train()
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
    torch.testing.assert_close(plain.last_hidden_state[real], sdpa.last_hidden_state[real], atol=1e-5, rtol=1e-5)
    params = [p for name, p in model.named_parameters() if not name.startswith("pooler")]
    gp = torch.autograd.grad(plain.last_hidden_state[real].sum(), params)
    gs = torch.autograd.grad(sdpa.last_hidden_state[real].sum(), params)
    for a, b in zip(gp, gs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_model_dropout_rate_in_training():
    """With hidden dropout only, the embeddings' output has the configured share of zeros."""
    config = BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.2)
    model = BertModel(config).train()
    ids = torch.randint(1, 120, (16, 64))
    x = model.embeddings(ids, torch.zeros_like(ids), torch.arange(64).expand(16, 64))
    assert abs((x == 0).float().mean().item() - 0.2) < 0.02


def test_large_masks_are_two_streams_fixed_by_the_seed():
    """A mask over SPLIT elements is two halves from two seeds drawn from torch's generator; the
    half drawn on the helper thread equals the same draw made on the caller's thread."""
    from torchbert import dropout as d

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
