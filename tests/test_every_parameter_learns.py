"""Every model and every head gives each of its trainable parameters a gradient from its own loss
(and a frozen part none): BERT's pretraining heads and its five task heads, ELECTRA, GPT's LM and its
task heads, ELMo's biLM and its task models. One table, one test; a head that forgets to use a layer,
or detaches one, fails here."""

import pytest
import torch

from torchbert import BertConfig
from torchbert.baselines.elmo import ELMoBiLM
from torchbert.baselines.gpt import OpenAIGPTLMHeadModel
from torchbert.config import ELMoConfig, GPTConfig
from torchbert.electra import ElectraForPreTraining
from torchbert.heads import BertForMaskedLM, BertForNextSentencePrediction, BertForPreTraining
from torchbert.losses import IGNORE
from torchbert.tasks.batches import TaskData
from torchbert.tasks.encode import Encoded
from torchbert.tasks.families import family
from torchbert.tasks.examples import LabelMap

V = 60
BERT = dict(vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=32)


def config(system: str):
    bert = BertConfig(**BERT)
    return {"bert": bert, "gpt": GPTConfig.like(bert), "elmo": ELMoConfig.like(bert)}[system]


# rows of token ids ([CLS] x ... [SEP]), two token types in the longer ones, and each task's labels
ROWS = [[2, 7, 8, 9, 3, 10, 11, 3], [2, 12, 13, 3, 14, 3], [2, 15, 16, 17, 3], [2, 18, 19, 20, 21, 3]]
TYPES = [[0] * 5 + [1] * 3, [0] * 4 + [1] * 2, [0] * 5, [0] * 6]
TASKS = {
    "classification": dict(labels=[1, 0, 2, 1], label_map=LabelMap(["a", "b", "c"])),
    "regression": dict(labels=[0.5, 1.5, 2.5, 3.0], label_map=None),
    "token": dict(labels=[[IGNORE] + [i % 3 for i in range(len(r) - 2)] + [IGNORE] for r in ROWS],
                  label_map=LabelMap(["O", "B-X", "I-X"])),
    "qa": dict(labels=[(1, 2), (1, 1), (0, 0), (2, 4)], label_map=None),
    "multiple-choice": dict(labels=[1, 0], label_map=None, num_choices=[2, 2]),
}
CASES = [(task, system) for task in TASKS for system in ("bert", "gpt", "elmo")
         if system in family(task).heads]


def assert_every_trainable_parameter_learns(model: torch.nn.Module, loss: torch.Tensor,
                                            shift_invariant: bool = False) -> None:
    """shift_invariant: the loss is a softmax over scores that one output unit gives every choice, so
    that unit's bias adds the same to each and its gradient is zero by construction (checked as such)."""
    loss.backward()
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable, "nothing to train"
    for name, p in model.named_parameters():
        if shift_invariant and name.endswith("bias") and p.shape == (1,):
            assert p.grad is not None and p.grad.abs().item() < 1e-6, f"{name}: the choices' shared bias moved"
        elif p.requires_grad:
            assert p.grad is not None, f"{name}: no gradient"
            assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, f"{name}: a zero or non-finite gradient"
        else:
            assert p.grad is None, f"{name} is frozen but got a gradient"


@pytest.mark.parametrize("task,system", CASES, ids=[f"{t}-{s}" for t, s in CASES])
def test_every_task_head_on_every_system_trains_every_parameter(task, system):
    torch.manual_seed(0)
    fam, spec = family(task), TASKS[task]
    cfg = fam.configure(config(system), spec["label_map"])
    model = fam.model_for(cfg)(cfg).train()
    extra = {"num_choices": spec["num_choices"]} if "num_choices" in spec else {}
    data = TaskData(Encoded(ROWS, TYPES, list(range(len(ROWS))), labels=spec["labels"], **extra), fam)
    (batch,) = data.all_batches(16)
    out = model(**batch.model_inputs(), **fam.targets(batch))
    assert out.loss is not None and out.loss.dim() == 0
    assert_every_trainable_parameter_learns(model, out.loss, shift_invariant=task == "multiple-choice")
    if system == "elmo":  # the biLM is frozen: only the mix and the task model learn
        assert not any(p.requires_grad for p in model.elmo.parameters())


def padded_pretraining_batch():
    ids = torch.tensor([[2, 7, 8, 9, 3, 10, 11, 3], [2, 12, 13, 14, 3, 15, 16, 3]])
    types = torch.tensor([[0] * 5 + [1] * 3] * 2)
    labels = torch.full_like(ids, IGNORE)
    labels[0, 2], labels[1, 6] = 40, 41
    return ids, types, labels


PRETRAINING = ["bert-pretraining", "bert-mlm", "bert-nsp", "electra", "gpt-lm", "elmo-bilm"]


@pytest.mark.parametrize("name", PRETRAINING)
def test_every_pretraining_model_trains_every_parameter(name):
    torch.manual_seed(0)
    ids, types, labels = padded_pretraining_batch()
    mask, nsp = torch.ones_like(ids), torch.tensor([0, 1])
    if name == "bert-pretraining":
        model = BertForPreTraining(config("bert"))
        loss = model(ids, attention_mask=mask, token_type_ids=types, labels=labels, next_sentence_label=nsp).loss
    elif name == "bert-mlm":
        model = BertForMaskedLM(config("bert"))
        loss = model(ids, attention_mask=mask, token_type_ids=types, labels=labels).loss
    elif name == "bert-nsp":
        model = BertForNextSentencePrediction(config("bert"))
        loss = model(ids, attention_mask=mask, token_type_ids=types, labels=nsp).loss
    elif name == "electra":
        model = ElectraForPreTraining(config("bert"))
        loss = model(ids, attention_mask=mask, token_type_ids=types, labels=labels).loss
    elif name == "gpt-lm":
        model = OpenAIGPTLMHeadModel(config("gpt"))
        loss = model(ids, labels=ids).loss
    else:
        model = ELMoBiLM(config("elmo"))
        loss = model(ids, labels=ids).loss
    assert loss is not None and loss.dim() == 0 and torch.isfinite(loss)
    assert_every_trainable_parameter_learns(model.train(), loss)
