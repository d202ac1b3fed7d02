"""`torchbert benchmark`: a whole suite (suites.py) fine-tuned and scored with a protocol, one table.

For each model and task the protocol's grid (learning rates x batch sizes) runs with the first seed,
dev picks the best (its first column's metric; the first on a tie), then the other seeds run at that
setting: `seeds` of them, whose mean (or median) is the score and whose spread is shown; or, on a task
with fewer than `small` training examples, `restarts` of them, of which the one best on dev is kept
(the BERT paper's random restarts on the small GLUE sets). Each run keeps its best epoch on dev.

Every (task, learning rate, batch, seed) is a run folder of its own, `finetune` then `evaluate` on the
task's other labelled splits, announced by the command line that runs the same (stages.py); a run whose
cell.json is on disk is not run again, and one interrupted mid-training continues from its checkpoint
(--resume). Where a suite's test labels are hidden, the chosen run predicts its test splits into the
leaderboard's submission files.

    OUT/settings.json           suite, models, data, protocol: a --resume must match them
    OUT/runs/MODEL/TASK/lr2e-05-bs32-seed0/    each run; cell.json last
    OUT/submission/MODEL/*.tsv  leaderboard files (GLUE: index, prediction)
    OUT/summary.md, summary.json, scores.png
    OUT/tensorboard/MODEL/      the table as TensorBoard scalars (each run has its own in its folder)
"""

from __future__ import annotations

import itertools
import json
import shutil
import statistics
import time
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..io.files import atomic_write_text
from ..settings import MAX_EPOCHS, Checked, SettingError, seed_setting, setting
from .benchmark_table import averages, columns_of, scores_plot, suite_scalars, summary_markdown
from .stages import Stages, claim_folder
from .suites import SUITES, Suite, SuiteTask

MARKER = ".torchbert-benchmark"
VERSION = 1  # of settings.json and cell.json


@dataclass(frozen=True)
class Protocol(Checked):
    """How each task of a suite is trained and how its score is picked."""

    lrs: list[float] = setting(help="learning rates tried, each picked on dev", above=0)
    batch_sizes: list[int] = setting(help="batch sizes tried (the grid is every rate with every size)", low=1)
    epochs: float = setting(3.0, "passes over the training data", above=0, high=MAX_EPOCHS)
    warmup_ratio: float = setting(0.1, "share of the steps in linear warmup", low=0, below=1)
    weight_decay: float = setting(0.01, "AdamW decay (not on biases and LayerNorm)", low=0)
    max_length: int = setting(128, "tokens per sequence", low=8)
    seeds: int = setting(1, "runs at the chosen setting: their mean (or median) is the score", low=1)
    statistic: str = setting("mean", "how the seeds' scores become one", choices=("mean", "median"))
    restarts: int = setting(0, "on small tasks: runs at the chosen setting, the one best on dev kept "
                               "(0: none; seeds apply)", low=0)
    small: int = setting(10_000, "a task with fewer training examples is small (restarts apply)", low=0)
    seed: int = seed_setting(0, "the first seed; the others follow it")


PROTOCOLS: dict[str, tuple[Protocol, str]] = {
    "paper": (Protocol(lrs=[5e-5, 4e-5, 3e-5, 2e-5], batch_sizes=[32], epochs=3, warmup_ratio=0.1, weight_decay=0.01,
                       max_length=128, seeds=1, restarts=5),
              "Devlin et al. 2019 (GLUE, section 4.1): batch 32, 3 epochs, the rate picked on dev among "
              "5e-5, 4e-5, 3e-5, 2e-5; 10% warmup; random restarts on the small sets, the best on dev kept"),
    "roberta": (Protocol(lrs=[1e-5, 2e-5, 3e-5], batch_sizes=[16, 32], epochs=10, warmup_ratio=0.06,
                         weight_decay=0.1, max_length=128, seeds=5, statistic="median"),
                "Liu et al. 2019 (RoBERTa, appendix C): rates 1e-5, 2e-5, 3e-5 with batches 16 and 32, "
                "10 epochs, 6% warmup, decay 0.1, the median of 5 seeds"),
    "paper-squad": (Protocol(lrs=[5e-5], batch_sizes=[32], epochs=3, warmup_ratio=0.1, weight_decay=0.01,
                             max_length=384, seeds=1),
                    "Devlin et al. 2019 (SQuAD 1.1, section 4.2): 3 epochs at 5e-5, batch 32, 384 tokens with a "
                    "stride of 128 (their SQuAD 2.0 runs took 2 epochs at batch 48)"),
    # measured with MiniLM (2 cores): at 1e-4, batch 32 and 2 epochs (64 steps) neither NER task learned
    # a name (F1 0.00); at 2e-4, batch 16 and 3 epochs (190-220 steps) they reached 0.30 and 0.28
    "local": (Protocol(lrs=[2e-4, 1e-4], batch_sizes=[16], epochs=3, max_length=64, seeds=2),
              "the local suite's: rates 2e-4 and 1e-4, batch 16, 3 epochs, 64 tokens, the mean of 2 seeds"),
}


# what a protocol file's value of each field type may be: (Python types, the words of an error)
_JSON_KINDS = {"float": ((int, float), "a number"), "int": ((int,), "a whole number"), "str": ((str,), "a text"),
               "list[float]": (None, "a non-empty list of numbers"), "list[int]": (None, "a non-empty list of whole numbers")}


def _fits(kind: str, value: Any) -> bool:
    """Whether a JSON value has a Protocol field's type (a bool is no number; a list is not empty)."""
    if kind.startswith("list["):
        return isinstance(value, list) and bool(value) and all(_fits(kind[5:-1], v) for v in value)
    return isinstance(value, _JSON_KINDS[kind][0]) and not isinstance(value, bool)


def read_protocol(name_or_file: str) -> tuple[Protocol, str]:
    """A protocol by name, or from a JSON file of Protocol's fields over the paper's (`{"lrs": [3e-5]}`)."""
    if name_or_file in PROTOCOLS:
        return PROTOCOLS[name_or_file]
    path = Path(name_or_file)
    if not path.is_file():
        raise UserError(f"--protocol {name_or_file}: neither a protocol ({', '.join(PROTOCOLS)}) nor a JSON file")
    try:
        given = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not JSON ({e})") from None
    if not isinstance(given, dict):
        raise UserError(f"{path}: expected a JSON object of protocol settings, like {{\"lrs\": [3e-5, 2e-5]}}")
    names = {f.name for f in fields(Protocol)}
    unknown = sorted(set(given) - names)
    if unknown:
        raise UserError(f"{path}: {', '.join(unknown)} is not a protocol setting; settings: {', '.join(sorted(names))}")
    kinds = {f.name: f.type for f in fields(Protocol)}  # "list[float]", "int", ...: annotations are text here
    for key, value in given.items():
        if not _fits(kinds[key], value):
            raise UserError(f"{path}: {key} must be {_JSON_KINDS[kinds[key]][1]}, got {json.dumps(value)[:60]}")
    try:
        return Protocol(**{**asdict(PROTOCOLS["paper"][0]), **given}), f"{path} (over the paper's)"
    except SettingError as e:
        raise UserError(f"{path}: {e}") from None


# -- the runs -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    """One fine-tuning run of the protocol: a model on a task at a learning rate, batch and seed."""

    model: str
    task: str
    lr: float
    batch: int
    seed: int


@dataclass
class Plan:
    suite: Suite
    models: dict[str, Path]  # name -> model folder
    data: Path  # the suite's folder (read) or OUT/data (written)
    protocol: Protocol | None  # None: a suite that fine-tunes nothing (retrieval)
    tasks: list[SuiteTask]  # those present
    out: Path
    precision: str = "fp32"  # the runs' training precision (TrainConfig.precision); scoring stays fp32


def task_files(t: SuiteTask, data: Path) -> dict[str, Path]:
    """The task's splits present in `data` (of a split's "a|b", the first present)."""
    found = {split: next((data / x for x in rel.split("|") if (data / x).is_file()), None)
             for split, rel in t.files.items()}
    return {split: path for split, path in found.items() if path is not None}


def prepared_files(t: SuiteTask, data: Path, out: Path, log=print) -> dict[str, Path]:
    """The task's splits as its family reads them: the suite's own files, or (a task with a layout of its
    own) their conversions in OUT/data/TASK/, made once (a --resume finds them)."""
    files = task_files(t, data)
    if t.convert is None:
        return files
    done = {}
    for split, src in files.items():
        done[split] = out / "data" / t.name / f"{split}.{t.converted}"
        if not done[split].is_file():
            try:
                t.convert(src, done[split], split not in t.submission, lambda m: log(f"note: {m}"))
            except ValueError as e:
                raise UserError(str(e)) from None
    return done


def first_examples(src: Path, dst: Path, n: int, header: bool) -> None:
    """The first n examples of a task file: lines of a TSV, CSV or JSON Lines file (after its header),
    sentences of a CoNLL file (blank-line separated), questions of a SQuAD file."""
    text = src.read_text(encoding="utf-8")
    if src.suffix.lower() == ".json" and text.lstrip().startswith("{"):  # SQuAD: the first n questions
        doc, left = json.loads(text), n
        for article in doc["data"]:
            for para in article["paragraphs"]:
                para["qas"], left = para["qas"][:left], left - len(para["qas"][:left])
            article["paragraphs"] = [x for x in article["paragraphs"] if x["qas"]]
        doc["data"] = [a for a in doc["data"] if a["paragraphs"]]
        atomic_write_text(dst, json.dumps(doc, ensure_ascii=False))
        return
    if src.suffix.lower() in (".conll", ".txt", ".bio"):
        blocks = [b for b in text.replace("\r\n", "\n").split("\n\n") if b.strip()]
        atomic_write_text(dst, "".join(b.strip("\n") + "\n\n" for b in blocks[:n]))
        return
    lines = text.splitlines(keepends=True)
    keep = lines[:n + 1] if header else lines[:n]
    atomic_write_text(dst, "".join(keep))


def restarts_apply(p: Protocol, train_examples: int) -> bool:
    """Whether the paper's restarts replace the seeds on a task of this many training examples."""
    return p.restarts > 1 and train_examples < p.small


def _stat(values: list[float], how: str) -> float:
    return statistics.median(values) if how == "median" else statistics.fmean(values)


class Bench:
    """The runs of one benchmark, on the stages of a study."""

    def __init__(self, plan: Plan, r: Stages, files: dict[str, dict[str, Path]], train_files: dict[str, Path],
                 train_counts: dict[str, int]):
        self.plan, self.r, self.files, self.train_files, self.train_counts = plan, r, files, train_files, train_counts

    def restarts(self, t: SuiteTask) -> bool:
        return restarts_apply(self.plan.protocol, self.train_counts[t.name])

    def stages_of(self, t: SuiteTask) -> int:
        """The stages of one run: its finetune, and an evaluate per labelled split it scores after."""
        return 1 + len([s for s in t.scored_splits() if s in self.files[t.name]])

    def folder(self, c: Cell) -> Path:
        return self.plan.out / "runs" / c.model / c.task / f"lr{c.lr:g}-bs{c.batch}-seed{c.seed}"

    def on_disk(self, c: Cell) -> dict[str, Any] | None:
        """The run's cell.json when it finished (with the files a later stage reads), else None."""
        run = self.folder(c)
        if self.r.complete(run, "cell.json", "model.safetensors", "config.json"):
            return json.loads((run / "cell.json").read_text(encoding="utf-8"))
        return None

    def run_one(self, model: str, t: SuiteTask, lr: float, batch: int, seed: int) -> dict[str, Any]:
        """One fine-tuning run and its scores on the task's labelled splits, or the ones on disk."""
        p, r = self.plan.protocol, self.r
        files = self.files[t.name]
        later = [s for s in t.scored_splits() if s in files]
        cell_of = Cell(model, t.name, lr, batch, seed)
        run, found = self.folder(cell_of), self.on_disk(cell_of)
        done = run / "cell.json"
        if found is not None:
            r.found(1 + len(later))
            return found
        from ..tasks.families import TaskSettings, resolve_task
        from ..train.finetune import FinetuneSettings

        name = f"{model} {t.name} lr {lr:g} batch {batch} seed {seed}"
        # each stage that finished before an interrupt is kept (the fine-tuning, then each evaluation)
        if r.finished(name, run, "metrics.json", "model.safetensors", "config.json"):
            r.found()
        else:
            resume = any(run.glob("checkpoints/step-*"))  # an interrupted run continues from its checkpoint
            if run.exists() and not resume:
                shutil.rmtree(run)
            s, cfg = FinetuneSettings(
                task=t.task, model=self.plan.models[model], train=self.train_files[t.name], dev=files["dev"],
                out=run, epochs=p.epochs, warmup_ratio=p.warmup_ratio, resume=resume,
                task_settings=TaskSettings(type=resolve_task(t.task)[0], max_length=t.max_length or p.max_length),
            ).resolve(lr=lr, batch_size=batch, seed=seed, weight_decay=p.weight_decay,
                      precision=self.plan.precision, progress=False)
            r.finetune(name, s, cfg)
        metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
        scores = {"dev": {k: v for k, v in metrics.items() if isinstance(v, float)}}
        for split in later:
            scored = run / f"scores-{split}.json"
            if r.finished(f"{name}: {split}", run, scored.name):
                scores[split] = json.loads(scored.read_text(encoding="utf-8"))
                r.found()
            else:
                scores[split] = r.evaluate(f"{name}: {split}", run, files[split], scored)
        cell = {"version": VERSION, "lr": lr, "batch_size": batch, "seed": seed, "run": str(run),
                "train_examples": metrics["train_examples"], "seconds": r.times[name], "scores": scores}
        atomic_write_text(done, json.dumps(cell, indent=2) + "\n")
        return cell

    def steps(self, model: str, t: SuiteTask) -> Generator[list[Cell], list[dict[str, Any]], dict[str, Any]]:
        """The protocol on one task, as the runs it needs, a batch at a time (the runs of a batch are
        independent: `--jobs` runs them side by side): the grid with the first seed; then, at the setting
        best on dev, the other seeds or restarts. Returns the table's value of each column, with the
        spread over the runs."""
        p = self.plan.protocol
        grid = list(itertools.product(p.lrs, p.batch_sizes))
        done = yield [Cell(model, t.name, lr, batch, p.seed) for lr, batch in grid]
        tried = dict(zip(grid, done))
        best = max(grid, key=lambda g: tried[g]["scores"]["dev"][t.select])
        restarts = self.restarts(t)
        n = p.restarts if restarts else p.seeds
        more = (yield [Cell(model, t.name, *best, p.seed + k) for k in range(1, n)]) if n > 1 else []
        runs = [tried[best], *more]
        chosen = max(runs, key=lambda c: c["scores"]["dev"][t.select])
        columns = {}
        for c in t.columns:
            values = [x["scores"][c.split][c.metric] for x in runs if c.split in x["scores"]]
            if not values:
                continue
            value = chosen["scores"][c.split][c.metric] if restarts else _stat(values, p.statistic)
            columns[c.title] = {"value": value, "values": values,
                                "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                                "split": c.split, "metric": c.metric}
        return {"lr": best[0], "batch_size": best[1], "restarts": restarts, "runs": [x["run"] for x in runs],
                "chosen": chosen["run"],
                "grid_dev": {f"lr {g[0]:g} batch {g[1]}": tried[g]["scores"]["dev"][t.select] for g in grid},
                "columns": columns, "seconds": round(sum(x["seconds"] for x in [*tried.values(), *more]), 1)}

    def task(self, model: str, t: SuiteTask) -> dict[str, Any]:
        """The protocol on one task, its runs one after another in this process."""
        steps = self.steps(model, t)
        try:
            cells = next(steps)
            while True:
                cells = steps.send([self.run_one(model, t, c.lr, c.batch, c.seed) for c in cells])
        except StopIteration as end:
            return end.value

    def submit(self, model: str, t: SuiteTask, chosen: Path) -> list[str]:
        """The chosen run's predictions on the task's unlabelled splits, as the leaderboard's files."""
        files = self.files[t.name]
        written = []
        for split, name in t.submission.items():
            if split not in files:
                continue
            out = self.plan.out / "submission" / model / name
            if not out.is_file():
                records = self.r.predict(f"{model} {t.name}: {split} predictions", chosen, files[split],
                                         chosen / f"predictions-{split}.jsonl")
                atomic_write_text(out, t.submit(records, task_files(t, self.plan.data)[split]))
            else:
                self.r.found()
            written.append(str(out))
        return written


def search_suite(plan: Plan, log, on_done: Callable[[], None], device: str) -> tuple[dict[str, Any], float]:
    """A suite of datasets searched with each model's sentence embeddings (apps/beir.py), nothing
    fine-tuned: a cell.json per model and dataset in OUT/runs/MODEL/DATASET/ (a --resume finds it)."""
    from .beir import check, search_dataset

    sets = {t.name: check(plan.data / Path(t.files["corpus"]).parent) for t in plan.tasks}  # every file first
    r = Stages(plan.out, log, total=len(plan.models) * len(plan.tasks), on_done=on_done, device=device)
    results: dict[str, dict[str, Any]] = {}
    with r.stopping():
        for model, folder in plan.models.items():
            results[model] = {}
            for t in plan.tasks:
                run = plan.out / "runs" / model / t.name
                done = run / "cell.json"
                if done.is_file():
                    cell = json.loads(done.read_text(encoding="utf-8"))
                    r.found()
                else:
                    data = sets[t.name]
                    log(f"\n== {model} {t.name} ({r.where()}): {len(data.queries):,} queries searched over "
                        f"{len(data.docs):,} documents ({data.split} qrels)")
                    start = time.perf_counter()
                    cell = search_dataset(folder, data, r._device(), log=log)
                    cell.update(version=VERSION, run=str(run), seconds=round(time.perf_counter() - start, 1))
                    if data.left_out:
                        log(f"note: {t.name}: {data.left_out} queries of the qrels have no document graded above 0; "
                            "left out")
                    log("  " + ", ".join(f"{k} {100 * v:.1f}" for k, v in cell["scores"].items()))
                    atomic_write_text(done, json.dumps(cell, indent=2) + "\n")
                    r.found()
                split = cell["split"]
                results[model][t.name] = {
                    "runs": [cell["run"]], "chosen": cell["run"], "seconds": cell["seconds"], "submission": [],
                    "columns": {c.title: {"value": cell["scores"][c.metric], "values": [cell["scores"][c.metric]],
                                          "std": 0.0, "split": split, "metric": c.metric} for c in t.columns}}
    return results, r.seconds()


def plan_benchmark(suite_name: str, models: dict[str, Path], data: Path | None, out: Path, protocol: Protocol,
                   tasks: list[str] | None = None, max_train: int | None = None, log=print,
                   precision: str = "fp32") -> Plan:
    """What a benchmark will run: the suite's tasks present in `data` (the missing ones listed), its runs
    trained in `precision`."""
    suite = SUITES[suite_name]
    if suite.write is not None:
        if data is not None:
            raise UserError(f"--data: the {suite_name} suite writes its own files (into --out's data/); give none")
        data = out / "data"
    elif data is None:
        raise UserError(f"--data: the {suite_name} suite reads a folder in its official layout; give it "
                        f"(torchbert benchmark --help shows the layouts)")
    elif not data.is_dir():
        raise UserError(f"--data {data}: not a folder")
    wanted = suite.tasks
    if suite.discover is not None:
        wanted = tuple(suite.discover(data))
        if not wanted:
            raise UserError(f"--data {data}: holds no {suite.title} dataset in its layout (`torchbert benchmark "
                            f"--help` shows it)")
    if tasks:
        names = {t.name.lower(): t for t in wanted}
        unknown = [x for x in tasks if x.lower() not in names]
        if unknown:
            raise UserError(f"--tasks {' '.join(unknown)}: not a task of {suite.name} "
                            f"({', '.join(t.name for t in wanted)})")
        wanted = tuple(names[x.lower()] for x in dict.fromkeys(tasks))
    if suite.write is not None or suite.discover is not None:  # every task's files are there
        return Plan(suite, models, data, protocol, list(wanted), out, precision)
    present, missing = [], []
    for t in wanted:
        files = task_files(t, data)
        (present if "train" in files and "dev" in files else missing).append(t)
    if missing:
        absent = sorted(f.replace("|", " or ") for t in missing for s, f in t.files.items()
                        if s in ("train", "dev") and s not in task_files(t, data))
        shown = ", ".join(absent[:4]) + (f" and {len(absent) - 4} more" if len(absent) > 4 else "")
        log(f"{data}: skipping {', '.join(t.name for t in missing)} (no {shown})")
    if not present:
        expected = ", ".join(f"{t.files['train']} and {t.files['dev']}".replace("|", " or ") for t in wanted[:3])
        raise UserError(f"--data {data}: holds none of {suite.title}'s tasks in its layout (expected {expected}"
                        f"{', ...' if len(wanted) > 3 else ''}; `torchbert benchmark --help` shows the layout)")
    return Plan(suite, models, data, protocol, present, out, precision)


def check_files(plan: Plan, files: dict[str, dict[str, Path]], train_files: dict[str, Path],
                log=print) -> dict[str, int]:
    """Every split of every task read before the first run, as its run will read it (a bad line is an
    error now, not hours in); the training examples of each task."""
    from ..tasks.families import read_examples, task_settings

    counts = {}
    for t in plan.tasks:
        ts = task_settings(t.task)
        for split, path in {**files[t.name], "train": train_files[t.name]}.items():
            try:
                n = len(read_examples(path, ts.type, ts.layout, labelled=split not in t.submission,
                                      warn=lambda m: log(f"note: {m}")))
            except ValueError as e:
                raise UserError(str(e)) from None
            if split == "train":
                counts[t.name] = n
    return counts


def run_benchmark(plan: Plan, protocol_text: str, max_train: int | None = None, log=print,
                  on_done: Callable[[], None] = lambda: None, device: str = "auto",
                  runner: Callable[[Bench], dict[str, dict[str, Any]]] | None = None) -> dict[str, Any]:
    """Every model on every task of the plan; summary.md, summary.json and scores.png in plan.out.
    runner(bench): every task's results, its runs made elsewhere (benchmark_jobs.Parallel: in worker
    processes side by side); by default one after another in this process."""
    p, out = plan.protocol, plan.out
    settings = json.dumps({"version": VERSION, "suite": plan.suite.name, "data": str(plan.data),
                           "models": {k: str(v) for k, v in plan.models.items()},
                           "tasks": [t.name for t in plan.tasks], "protocol": asdict(p) if p else None,
                           "max_train": max_train,  # a folder of fp32 runs reads as before --precision was
                           **({"precision": plan.precision} if plan.precision != "fp32" else {})},
                          indent=2) + "\n"
    claim_folder(out, MARKER, "benchmark", settings,
                 "suite, models, --data, --tasks, --protocol, --max-train or --precision")
    if plan.suite.discover is not None:
        return _finish(plan, protocol_text, max_train, log, *search_suite(plan, log, on_done, device))
    if plan.suite.write is not None:
        plan.suite.write(plan.data, max_train)
    files = {t.name: prepared_files(t, plan.data, out, log) for t in plan.tasks}
    train_files = {}
    for t in plan.tasks:
        train = files[t.name]["train"]
        if max_train is not None and plan.suite.write is None:  # the first examples, copied beside the runs
            train_files[t.name] = out / "data" / t.name / f"{train.stem}.first{max_train}{train.suffix}"
            if not train_files[t.name].is_file():
                first_examples(train, train_files[t.name], max_train, t.header)
        else:
            train_files[t.name] = train
    counts = check_files(plan, files, train_files, log)
    grid = len(p.lrs) * len(p.batch_sizes)
    total = 0
    for t in plan.tasks:
        later = [s for s in t.scored_splits() if s in files[t.name]]
        submissions = [s for s in t.submission if s in files[t.name]]
        runs = grid + (p.restarts if restarts_apply(p, counts[t.name]) else p.seeds) - 1
        total += runs * (1 + len(later)) + len(submissions)
    r = Stages(out, log, total=total * len(plan.models), on_done=on_done, device=device)
    bench = Bench(plan, r, files, train_files, counts)
    results: dict[str, dict[str, Any]] = {}
    with r.stopping():
        if runner is not None:
            results = runner(bench)
        for model in plan.models:
            results.setdefault(model, {})
            for t in plan.tasks:
                if t.name not in results[model]:
                    results[model][t.name] = bench.task(model, t)
                results[model][t.name]["submission"] = bench.submit(model, t, Path(results[model][t.name]["chosen"]))
    return _finish(plan, protocol_text, max_train, log, results, r.seconds())


def _finish(plan: Plan, protocol_text: str, max_train: int | None, log, results: dict[str, dict[str, Any]],
            seconds: float) -> dict[str, Any]:
    """summary.json, summary.md and scores.png of a finished benchmark."""
    p, out = plan.protocol, plan.out
    summary = {"suite": plan.suite.name, "title": plan.suite.title, "data": str(plan.data),
               "models": {k: str(v) for k, v in plan.models.items()}, "protocol": asdict(p) if p else None,
               "protocol_text": protocol_text, "max_train": max_train, "precision": plan.precision,
               "tasks": [t.name for t in plan.tasks],
               "columns": columns_of(plan), "results": results, "suite_averaged": plan.suite.averaged,
               "averages": averages(plan, results),
               "published": [asdict(x) for x in plan.suite.published], "seconds": seconds}
    scores_plot(out / "scores.png", summary)
    suite_scalars(out / "tensorboard", summary)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(out / "summary.md", summary_markdown(summary))
    log("\n" + summary_markdown(summary))
    return summary
