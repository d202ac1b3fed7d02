"""On a CUDA GPU: the fast paths against the plain ones, in bf16, and a training step without host syncs.

Skipped where torch sees no CUDA device (CI, the 2-core development machine); run on the GPU with
`python -m pytest -m gpu tests/test_gpu.py`. Tolerances are stated per test: bf16 keeps 8 bits of
mantissa, so one rounding is up to 2^-8 = 0.4% of a value, and a layer's output carries many.
"""

import pytest
import torch
from tinyloop import NaNTask, RepeatData, V, cfg

from torchbert import BertConfig, BertModel, fast
from torchbert.fast.flash import flash_attention, usable
from torchbert.heads import BertForPreTraining
from torchbert.model import eager_attention
from torchbert.packing import pack, packed_layout
from torchbert.train.loop import train
from torchbert.train.objectives import PretrainingTask
from torchbert.train.optim import clipped_step, make_optimizer

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = torch.device("cuda")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||, in float64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def packed_batch(lengths, vocab=V, seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs = [[2] + torch.randint(5, vocab, (n - 1,), generator=g).tolist() for n in lengths]
    ids, cu, longest = pack(seqs)
    return ids.to(CUDA), cu.to(CUDA), longest


@pytest.mark.parametrize("causal", [False, True])
def test_flash_varlen_attention_equals_eager_attention_in_fp32(causal):
    """FlashAttention's varlen kernel in bf16 on packed q/k/v against the written-out attention in
    fp32 on the same (bf16-rounded) inputs, padded: relative error under 1e-2 (bf16 operands)."""
    torch.manual_seed(0)
    heads, H = 4, 256
    cu = torch.tensor([0, 7, 40, 41, 105], dtype=torch.int32, device=CUDA)
    N = int(cu[-1])
    layout, _ = packed_layout(cu, 64, N, causal=causal)
    qkv = torch.randn(N, 3 * H, device=CUDA).bfloat16()
    assert usable(qkv, layout, heads)
    out, _ = flash_attention(qkv, layout, heads, 0.0)
    ref, _ = eager_attention(qkv.float(), layout, heads, 0.0)
    assert out.shape == (N, H) and out.dtype == torch.bfloat16
    assert rel(out, ref) < 1e-2
    # and the gradients, through torch's own formula for the kernel
    qkv.requires_grad_(True)
    g = torch.randn(N, H, device=CUDA)
    (flash_attention(qkv, layout, heads, 0.0)[0].float() * g).sum().backward()
    x = qkv.detach().float().requires_grad_(True)
    (eager_attention(x, layout, heads, 0.0)[0] * g).sum().backward()
    assert rel(qkv.grad, x.grad) < 2e-2


def test_flash_dropout_drops_and_is_seeded():
    torch.manual_seed(0)
    cu = torch.tensor([0, 50, 128], dtype=torch.int32, device=CUDA)
    layout, _ = packed_layout(cu, 78, 128)
    qkv = torch.randn(128, 3 * 128, device=CUDA).bfloat16()
    plain = flash_attention(qkv, layout, 2, 0.0)[0]
    torch.manual_seed(1)
    a = flash_attention(qkv, layout, 2, 0.5)[0]
    torch.manual_seed(1)
    b = flash_attention(qkv, layout, 2, 0.5)[0]
    assert torch.equal(a, b) and not torch.equal(a, plain)
    assert rel(a, plain) > 0.1  # half the probabilities dropped, the rest doubled: a different mix


def test_packed_bf16_encoder_matches_padded_and_fp32():
    """BertModel (base shape, random weights) on a packed batch with the fast pieces (flash varlen)
    under bf16 autocast, against the padded batch (SDPA) under bf16 and the fp32 model: relative
    error of the hidden states under 2e-2 (12 layers of bf16 roundings)."""
    torch.manual_seed(0)
    model = BertModel(BertConfig.from_name("base", vocab_size=1000)).to(CUDA).eval()
    lengths = [128, 77, 5, 100, 128, 33]
    ids, cu, longest = packed_batch(lengths, vocab=1000)
    with torch.no_grad():
        ref = model(ids, cu_seqlens=cu, max_seqlen=longest).last_hidden_state  # fp32
        with fast.training(model), torch.autocast("cuda", dtype=torch.bfloat16):
            assert {layer.attention.impl for layer in model.layers} == {"fast"}
            packed = model(ids, cu_seqlens=cu, max_seqlen=longest).last_hidden_state
        padded_ids = torch.zeros(len(lengths), longest, dtype=torch.long, device=CUDA)
        mask = torch.arange(longest, device=CUDA) < torch.tensor(lengths, device=CUDA)[:, None]
        padded_ids[mask] = ids
        with torch.autocast("cuda", dtype=torch.bfloat16):
            padded = model(padded_ids, attention_mask=mask.long()).last_hidden_state[mask]
    assert rel(packed, ref) < 2e-2 and rel(padded, ref) < 2e-2
    assert rel(packed, padded) < 2e-2


def second_step_under_sync_debug(model, loss_fn) -> torch.Tensor:
    """Two training steps as the loop takes them on a GPU (bf16 autocast, the fast pieces, ids checked
    on the host, the deferred clipped step); the second under torch's sync debug mode "error", which
    raises at any host sync (the first makes the optimizer's state). -> the second step's verdict."""
    optimizer = make_optimizer(model)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn()
        loss.backward()
        verdict = clipped_step(optimizer, model.parameters(), 1.0, loss=loss.detach(), defer=True)
        optimizer.zero_grad(set_to_none=True)
        return verdict

    with fast.training(model):
        step()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            return step()
        finally:
            torch.cuda.set_sync_debug_mode("default")


def test_a_cuda_training_step_reads_nothing_on_the_host():
    """Forward, backward and the deferred clipped step of BertForPreTraining under bf16 autocast
    with the fast pieces: torch's sync debug mode raises at any host sync."""
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_name("tiny", vocab_size=V)).to(CUDA).train()
    batch = next(RepeatData().batches(8)).to(CUDA)
    task = PretrainingTask()

    def loss():
        parts = task.forward(model, batch)
        return parts["mlm"][0] / 16 + parts["nsp"][0] / 8

    verdict = second_step_under_sync_debug(model, loss)
    assert verdict.is_cuda and bool(verdict)


def test_a_short_bf16_cuda_run_follows_the_fp32_cpu_run(tmp_path):
    """train() on the GPU (bf16, deferred reads, flash varlen) and on CPU (fp32), no dropout, same
    init and batches: every logged loss of the first 30 steps within 3% of the CPU run's, and the
    loss falls."""
    logs = {}
    for name, device, precision in (("cpu", torch.device("cpu"), "fp32"), ("cuda", CUDA, "bf16")):
        torch.manual_seed(0)
        model = BertForPreTraining(BertConfig.from_name("tiny", vocab_size=V, hidden_dropout_prob=0.0,
                                                        attention_probs_dropout_prob=0.0)).to(device)
        train(model, RepeatData(n=512), PretrainingTask(), cfg(steps=30, log_every=5, precision=precision),
              tmp_path / name, device=device, log=lambda s: None)
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        logs[name] = [__import__("json").loads(x)["loss"] for x in lines]
    assert len(logs["cuda"]) == 6
    for a, b in zip(logs["cuda"], logs["cpu"]):
        assert abs(a - b) < 0.03 * b, (logs["cuda"], logs["cpu"])
    assert logs["cuda"][-1] < logs["cuda"][0]


def test_nan_steps_are_skipped_on_the_gpu_without_a_sync(tmp_path):
    logs = []
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_name("tiny", vocab_size=V)).to(CUDA)
    summary = train(model, RepeatData(), NaNTask({2, 3}), cfg(steps=5, log_every=5, precision="bf16"), tmp_path,
                    device=CUDA, log=logs.append)
    assert summary["skipped_steps"] == 2 and summary["steps"] == 5
    assert any("steps 2, 3" in line for line in logs)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("head", ["sequence", "token", "qa", "choice"])
def test_a_cuda_fine_tuning_step_reads_nothing_on_the_host(head):
    """Each task head's training step (packed, bf16 autocast, the fast pieces, the deferred clipped
    step) with what the batch knows on the host given to it (label_positions, max_choices, max_seqlen):
    no host sync, under torch's sync debug mode."""
    from torchbert.heads import (BertForMultipleChoice, BertForQuestionAnswering, BertForSequenceClassification,
                                 BertForTokenClassification)

    torch.manual_seed(0)
    config = BertConfig.from_name("tiny", vocab_size=V)
    config.extra["num_labels"] = 3
    lengths = [9, 14, 6, 11]
    ids, cu, longest = packed_batch(lengths)
    N, B = int(sum(lengths)), len(lengths)
    inputs = {"input_ids": ids, "cu_seqlens": cu, "max_seqlen": longest}
    if head == "sequence":
        model, extra = BertForSequenceClassification(config), {"labels": torch.tensor([0, 2, 1, 1])}
    elif head == "token":
        labels = torch.randint(0, 3, (N,))
        labels[::3] = -100
        extra = {"labels": labels, "labelled_only": True, "label_positions": (labels != -100).nonzero().squeeze(1)}
        model = BertForTokenClassification(config)
    elif head == "qa":
        model = BertForQuestionAnswering(config)
        extra = {"start_positions": torch.tensor([1, 3, 2, 5]), "end_positions": torch.tensor([2, 7, 4, 9])}
    else:  # two examples of 2 and 2 choices: the 4 sequences
        model = BertForMultipleChoice(config)
        extra = {"num_choices": torch.tensor([2, 2]), "max_choices": 2, "labels": torch.tensor([1, 0])}
    model = model.to(CUDA).train()
    inputs.update({k: v.to(CUDA) if isinstance(v, torch.Tensor) else v for k, v in extra.items()})
    assert bool(second_step_under_sync_debug(model, lambda: model(**inputs).loss)) and B == 4
