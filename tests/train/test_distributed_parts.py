"""The pieces of train/distributed.py in one process: a real gloo group of one process stands in for
torchrun's, and a Dist that says two processes makes every collective path run. The runs of two
processes themselves are in test_distributed.py (end to end)."""

import copy

import pytest
import torch
import torch.distributed as torch_dist

from torchbert.config import BertConfig
from torchbert.heads import BertForPreTraining
from torchbert.train.distributed import (Dist, full_optimizer_state, full_state_dict, init_distributed,
                                         load_full_state, unwrap, wrap)


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """A process group of one process (gloo, a file store), left when the module's tests are done."""
    assert not torch_dist.is_initialized()
    store = tmp_path_factory.mktemp("store") / "rendezvous"
    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    torch_dist.destroy_process_group()


TWO = Dist(rank=0, world_size=2)  # the collectives run (over the group of one, which sums nothing away)
CPU = torch.device("cpu")


def test_one_process_runs_no_collective(monkeypatch):
    monkeypatch.setattr(torch_dist, "all_reduce", lambda *a, **k: pytest.fail("a collective in a single process"))
    monkeypatch.setattr(torch_dist, "barrier", lambda *a, **k: pytest.fail("a barrier in a single process"))
    alone = Dist()
    assert not alone.enabled and alone.is_main and TWO.enabled and not Dist(rank=1, world_size=2).is_main
    t = torch.tensor([1.0, 2.0])
    assert alone.all_reduce([1.0, 2.0], CPU) == [1.0, 2.0] and alone.all_reduce_tensor(t) is t
    alone.barrier()
    alone.close(finished=True)


def test_sums_are_exact_in_float64_and_leave_the_callers_tensor_alone(group):
    # counts of targets pass 2^24 in long runs: float32 would round 2^24 + 1 down
    assert TWO.all_reduce([2.0**24 + 1, 0.5], CPU) == [2.0**24 + 1, 0.5]
    t = torch.tensor([3.0, 4.0])
    summed = TWO.all_reduce_tensor(t)
    assert summed is not t and summed.data_ptr() != t.data_ptr() and torch.equal(summed, t)


def test_a_barrier_waits_for_every_process(group, monkeypatch):
    calls = []
    real = torch_dist.barrier
    monkeypatch.setattr(torch_dist, "barrier", lambda *a, **k: (calls.append(1), real(*a, **k)))
    TWO.barrier()
    Dist().barrier()
    assert calls == [1]


def test_torchrun_s_environment_gives_the_process_its_place(group, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="--fsdp needs several processes: start the run with torchrun"):
        init_distributed("cpu", fsdp=True)
    assert init_distributed("cpu") == (Dist(), CPU)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("LOCAL_RANK", raising=False)  # torchrun sets it; a launcher that does not: 0
    assert init_distributed("cpu", fsdp=True) == (Dist(rank=1, world_size=2, local_rank=0, fsdp=True), CPU)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert init_distributed("cpu") == (Dist(rank=1, world_size=2, local_rank=1, fsdp=False), CPU)


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return BertForPreTraining(BertConfig.from_name("tiny", vocab_size=100))


def step(model):
    """One AdamW step on a fixed batch: the optimizer then holds state to save."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.arange(16).reshape(2, 8) + 5
    out = model(input_ids=ids, labels=ids, next_sentence_label=torch.tensor([0, 1]))
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return optimizer


def test_ddp_wraps_and_unwraps_and_its_state_carries_no_prefix(group):
    model = tiny_model()
    wrapped = wrap(model, TWO, CPU)
    assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel) and unwrap(wrapped) is model
    assert unwrap(model) is model and wrap(model, Dist(), CPU) is model
    state = full_state_dict(wrapped, TWO)
    assert state.keys() == model.state_dict().keys()
    assert all(v.device.type == "cpu" and not v.requires_grad for v in state.values())

    optimizer = step(wrapped)
    saved_model, saved_optim = full_state_dict(wrapped, TWO), full_optimizer_state(wrapped, optimizer, TWO)
    other = tiny_model(seed=1)
    other_optim = torch.optim.AdamW(other.parameters(), lr=1e-3)
    load_full_state(other, other_optim, saved_model, saved_optim, TWO)
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), saved_model.values()))
    assert torch.equal(other_optim.state_dict()["state"][0]["exp_avg"], saved_optim["state"][0]["exp_avg"])


def test_fsdp_shards_each_layer_then_the_model_and_saves_and_loads_whole_tensors(group):
    from torch.distributed.fsdp import FSDPModule

    reference = tiny_model()
    model = wrap(tiny_model(), Dist(rank=0, world_size=2, fsdp=True), CPU)
    fsdp = Dist(rank=0, world_size=2, fsdp=True)
    assert isinstance(model, FSDPModule) and all(isinstance(layer, FSDPModule) for layer in model.bert.layers)
    state = full_state_dict(model, fsdp)
    assert state.keys() == reference.state_dict().keys()
    assert all(type(v) is torch.Tensor and torch.equal(v, reference.state_dict()[k]) for k, v in state.items())

    optimizer = step(model)
    saved_model, saved_optim = full_state_dict(model, fsdp), full_optimizer_state(model, optimizer, fsdp)
    assert set(saved_optim["state"]) == {n for n, p in reference.named_parameters()}  # by name, whole
    assert all(type(v) is torch.Tensor for s in saved_optim["state"].values() for v in s.values())

    fresh = wrap(tiny_model(seed=1), fsdp, CPU)
    fresh_optim = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    # loading turns the dicts' tensors into shards in place: hand it copies
    load_full_state(fresh, fresh_optim, {k: v.clone() for k, v in saved_model.items()}, copy.deepcopy(saved_optim),
                    fsdp)
    again = full_state_dict(fresh, fsdp)
    assert all(torch.equal(again[k], v) for k, v in saved_model.items())
    back = full_optimizer_state(fresh, fresh_optim, fsdp)["state"]
    assert back.keys() == saved_optim["state"].keys()
    assert all(torch.equal(back[k]["exp_avg"], v["exp_avg"]) for k, v in saved_optim["state"].items())
