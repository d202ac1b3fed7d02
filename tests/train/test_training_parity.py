"""`torchbert finetune` and `pretrain` take the same optimizer steps as transformers' models in a textbook loop.

Each task type's loss (and pretraining's MLM + NSP), gradients and update path (packed batches,
the loss normalized per step, embedding gradients as rows, clipping folded into the fused AdamW)
is checked against `transformers.BertFor...` on padded batches with `torch.optim.AdamW`,
`clip_grad_norm_` and transformers' own linear schedule: the same start weights, the same batches
in the same order, dropout off on both sides so the two runs are deterministic. Equal losses at
every step and equal weights at the end mean a run's result (a QA model that still answers "no
answer", say) is what transformers would have reached in the same steps.
"""

import json

import pytest
import realdata
import torch
import transformers
from clihelp import squad_file, write_conll
from parity import assert_parity
from safetensors.torch import load_file

from torchbert.cli import main
from torchbert.tasks.batches import TaskData
from torchbert.tasks.examples import LabelMap
from torchbert.tasks.families import TaskSettings, family, task_settings
from torchbert.tokenizer import BertTokenizer
from torchbert.train.finetune import load_task_model, task_config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SEED, BATCH, EPOCHS, LR, WARMUP, DECAY, CLIP = 42, 8, 2, 1e-4, 0.2, 0.01, 1.0
HF_CLASSES = {"qa-v2": transformers.BertForQuestionAnswering, "token": transformers.BertForTokenClassification,
              "pair": transformers.BertForSequenceClassification}


@pytest.fixture(scope="module")
def model_dir(minilm_dir, tmp_path_factory):
    """MiniLM with dropout off: every forward is deterministic, so two systems can be compared step by step."""
    out = tmp_path_factory.mktemp("minilm_no_dropout")
    for f in minilm_dir.iterdir():
        if f.is_file() and f.name != "config.json":
            (out / f.name).symlink_to(f)
    config = json.loads((minilm_dir / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (out / "config.json").write_text(json.dumps(config))
    return out


def write_task(task_type, path):
    """A small real training file for the task type; returns the (max_length, doc_stride) to encode it with."""
    texts = [t for t in realdata.english_texts() if 60 < len(t) < 400]
    if task_type == "qa-v2":
        items = []
        for i, t in enumerate(texts[:32]):
            words = t.split()
            if i % 4 == 3:
                items.append((t, "what is never said here?", None))
            else:
                items.append((t, f"which word comes after {words[len(words) // 2 - 1]}?", words[len(words) // 2]))
        squad_file(path, items, v2=True)
        return 64, 16  # contexts span several windows; windows without the answer point at [CLS]
    if task_type == "token":
        write_conll(path, realdata.wnut_sentences()[:40])
        return 32, 16  # long tweets become overlapping windows
    rows = [{"sentence1": a, "sentence2": b, "label": ["near", "far", "same"][i % 3]}
            for i, (a, b) in enumerate(zip(texts[:40], texts[1:41]))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return 64, 32


def textbook_optimizer(model, lr, warmup, steps):
    """torch's AdamW (no decay on biases and LayerNorm weights) and transformers' linear schedule."""
    named = list(model.named_parameters())
    decayed = [not (k.endswith("bias") or "LayerNorm" in k) for k, _ in named]
    groups = [{"params": [p for (_, p), d in zip(named, decayed) if d], "weight_decay": DECAY},
              {"params": [p for (_, p), d in zip(named, decayed) if not d], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr, eps=1e-6, foreach=False)
    return optimizer, transformers.get_linear_schedule_with_warmup(optimizer, warmup, steps)


# Weights whose gradient is 0 but for rounding, which AdamW scales up to a step on both sides: a key's
# bias adds q.b to every score of a query, and qa_outputs.bias one number to every position's start (or
# end) logit, both of which a softmax cancels.
NO_GRADIENT = ("attention.self.key.bias", "qa_outputs.bias")


def assert_same_steps(ours, theirs, trained_file, reference, start_file, lr):
    """Both runs' losses and every weight of the checkpoint (but NO_GRADIENT's) at parity, after the
    steps moved the reference's weights (a comparison of standing weights proves nothing)."""
    assert_parity(torch.tensor(ours, dtype=torch.float32), torch.tensor(theirs, dtype=torch.float32), "losses")
    assert theirs[-1] < theirs[0]
    trained, start = load_file(trained_file), load_file(start_file)
    assert set(trained) <= set(reference)
    names = [k for k in trained if not k.endswith(NO_GRADIENT)]
    assert max((reference[k] - start[k]).abs().max().item() for k in names) > 2 * lr
    for k in names:
        assert_parity(trained[k], reference[k], k)


def textbook_step(model, loss, optimizer, scheduler):
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def transformers_run(model_dir, task_type, train_path, max_length, doc_stride, work):
    """transformers' model from torchbert's start weights, trained on torchbert's batches in the
    textbook loop. Returns its per-step mean losses and its final weights."""
    ts = task_settings(task_type, TaskSettings(type=task_type, max_length=max_length, doc_stride=doc_stride))
    examples = family(task_type).read(train_path)
    label_map = LabelMap.from_examples(examples) if task_type != "qa-v2" else None
    config = task_config(model_dir, ts, label_map)
    torch.manual_seed(SEED)  # as run_finetuning, right before it loads the task model
    load_task_model(model_dir, config, ts, log=lambda _: None).save_pretrained(work / "start")
    model = HF_CLASSES[task_type].from_pretrained(work / "start", attn_implementation="eager")
    model.train()

    encoded = family(task_type).encode(BertTokenizer.from_pretrained(model_dir), examples, ts, label_map, training=True)
    data = TaskData(encoded, family(task_type), seed=SEED)
    n = len(encoded.input_ids)
    if task_type == "token":  # torchbert divides a step's summed loss by the targets of an average step
        per_step = sum(sum(t != -100 for t in row) for row in encoded.labels) * BATCH / n
    else:
        per_step = BATCH  # windows or sequence pairs: every full batch holds BATCH of them

    steps = EPOCHS * data.batches_per_epoch(BATCH)
    optimizer, scheduler = textbook_optimizer(model, LR, round(WARMUP * steps), steps)
    losses = []
    for epoch in range(EPOCHS):
        for rows in data.order(BATCH, epoch):
            width = max(len(encoded.input_ids[r]) for r in rows)

            def padded(seqs, fill):
                return torch.tensor([list(s) + [fill] * (width - len(s)) for s in seqs])

            ids = padded([encoded.input_ids[r] for r in rows], 0)
            inputs = dict(input_ids=ids, token_type_ids=padded([encoded.token_type_ids[r] for r in rows], 0),
                          attention_mask=padded([[1] * len(encoded.input_ids[r]) for r in rows], 0))
            if task_type == "qa-v2":
                # torchbert scores a window's start and end over its own tokens: transformers' logits with
                # the padding masked (its own loss would also spread probability over the padding)
                out, real = model(**inputs), inputs["attention_mask"].bool()
                mean = sum(torch.nn.functional.cross_entropy(x.masked_fill(~real, float("-inf")),
                                                             torch.tensor([encoded.labels[r][i] for r in rows]))
                           for i, x in enumerate((out.start_logits, out.end_logits))) / 2
                loss = mean * len(rows) / per_step
            elif task_type == "token":
                labels = padded([encoded.labels[r] for r in rows], -100)
                logits = model(**inputs).logits
                total = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
                mean, loss = total / (labels != -100).sum(), total / per_step
            else:
                out = model(**inputs, labels=torch.tensor([encoded.labels[r] for r in rows]))
                mean, loss = out.loss, out.loss * len(rows) / per_step
            textbook_step(model, loss, optimizer, scheduler)
            losses.append(float(mean))
    return losses, {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.e2e
@pytest.mark.parametrize("task_type", ["qa-v2", "token", "pair"])
def test_finetune_takes_the_steps_of_transformers(model_dir, task_type, tmp_path):
    train_path = tmp_path / ("train.json" if task_type == "qa-v2" else "train.conll" if task_type == "token"
                             else "train.jsonl")
    max_length, doc_stride = write_task(task_type, train_path)
    out = tmp_path / "run"
    code = main([str(a) for a in (
        "finetune", "--task", task_type, "--model", model_dir, "--train", train_path, "--out", out,
        "--epochs", EPOCHS, "--batch-size", BATCH, "--lr", LR, "--warmup-ratio", WARMUP, "--weight-decay", DECAY,
        "--schedule", "linear", "--max-grad-norm", CLIP, "--seed", SEED, "--max-length", max_length,
        "--doc-stride", doc_stride, "--log-every", 1, "--precision", "fp32", "--device", "cpu", "--quiet")])
    assert code == 0
    ours = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]

    theirs, weights = transformers_run(model_dir, task_type, train_path, max_length, doc_stride, tmp_path)
    assert len(ours) == len(theirs) >= 8
    assert_same_steps(ours, theirs, out / "model.safetensors", weights, tmp_path / "start" / "model.safetensors", LR)


def test_pretrain_takes_the_steps_of_transformers(prepared, tmp_path):
    """MLM + NSP on packed batches, the tied decoder's gradient joining the embedding rows, against
    transformers.BertForPreTraining on the same batches padded, in the textbook loop."""
    from torchbert.config import BertConfig
    from torchbert.data.shards import PretrainingData
    from torchbert.heads import BertForPreTraining

    data = PretrainingData(prepared / "data", seed=SEED)
    config = BertConfig.from_name("tiny", vocab_size=data.vocab_size, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    torch.manual_seed(SEED)
    start = tmp_path / "start"
    BertForPreTraining(config).save_pretrained(start)
    (start / "vocab.txt").write_bytes((prepared / "tok" / "vocab.txt").read_bytes())
    steps, batch, lr = 10, 8, 1e-3
    out = tmp_path / "run"
    code = main([str(a) for a in (
        "pretrain", "--data", prepared / "data", "--out", out, "--init", start, "--steps", steps, "--batch-size", batch,
        "--lr", lr, "--warmup-steps", 2, "--schedule", "linear", "--weight-decay", DECAY, "--max-grad-norm", CLIP,
        "--seed", SEED, "--log-every", 1, "--eval-every", 0, "--precision", "fp32", "--device", "cpu", "--quiet")])
    assert code == 0
    ours = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]

    model = transformers.BertForPreTraining.from_pretrained(start, attn_implementation="eager")
    model.train()
    optimizer, scheduler = textbook_optimizer(model, lr, 2, steps)
    theirs = []
    stream = (b for epoch in range(steps) for b in data.batches(batch, epoch=epoch))
    for b in (next(stream) for _ in range(steps)):
        loss = model(**b.padded()).loss  # [B, T] with labels -100 where nothing is masked
        textbook_step(model, loss, optimizer, scheduler)
        theirs.append(float(loss))
    assert len(ours) == steps
    weights = {k: v.detach() for k, v in model.state_dict().items()}
    assert_same_steps(ours, theirs, out / "model.safetensors", weights, start / "model.safetensors", lr)
