"""Which pretraining recipe learns fastest: probes of held-out MLM accuracy at equal seconds (issue 36).

Each probe changes the demo's recipe in one way (or combines changes), pretrains for the same number
of training seconds on the same corpus, and is scored on the same held-out masks (the whole-word
15% masks of the demo's held-out documents), at several seeds:

    python bench/bench_recipes.py                            # every probe, 180 s each, seeds 0 and 1
    python bench/bench_recipes.py --probes paper "lr 2e-3" --seconds 60 --seeds 0
    python bench/bench_recipes.py --probes GPT "GPT, lr 2e-3" "GPT, rotary positions"   # GPT's own probes

GPT's probes (issue 36, item 5: the baseline gets the same care) pretrain GPT of the same shape on the same
instances, scored as held-out next-token accuracy, against "GPT" (the paper's GPT, as compare runs it).

The paper's recipe as the demo runs it: tiny (L2 H128), MLM + NSP, whole-word masks of 15% (80/10/10,
static, 5 passes), batches of 32 x 128, AdamW lr 1e-3 with 10% linear warmup then linear decay, dropout
0.1. A probe's steps come from its own speed: a 40-step calibration run measures its training tokens
per second, and the steps are those that fill --seconds (warmup and decay follow the steps). Held-out
accuracy is evaluated at 6 points and read at a third, two thirds and all of the budget (linear in
training seconds between evaluations). The count yardsticks of the same masks are printed above the
table. Results are kept in WORK/results.json: a probe already measured is not run again (--fresh).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_learning import demo_data  # noqa: E402
from machine import cpu_name  # noqa: E402

from torchbert.cli import main as cli  # noqa: E402
from torchbert.data.shards import PretrainingData  # noqa: E402
from torchbert.eval.yardsticks import yardsticks  # noqa: E402
from torchbert.train.pretrain import heldout_batches  # noqa: E402

# data variants: `torchbert prepare` flags beside the demo's (the same corpus, vocabulary and held-out documents)
DATA = {"ww15": [],
        "ww30": ["--masked-lm-prob", 0.3, "--max-predictions", 40],
        "ww40": ["--masked-lm-prob", 0.4, "--max-predictions", 52],
        "tok15": ["--no-whole-word"],
        "ww15-maskonly": ["--mask-replace", 1, 0],
        "packed": ["--pairs", "none"]}  # RoBERTa's FULL-SENTENCES: no sentence pairs, rows filled to max_seq_len

PAPER = {"data": "ww15", "config": "tiny", "batch": 32, "lr": 1e-3, "warmup": 0.1, "schedule": "linear", "args": [],
         "model": "bert", "variant": None}
GPT = {"model": "gpt"}  # GPT of the same shape on the same instances (issue 36, item 5): held-out next-token accuracy
# name: what changes from PAPER
PROBES = {
    "paper": {},
    "lr 5e-4": {"lr": 5e-4},
    "lr 2e-3": {"lr": 2e-3},
    "lr 4e-3": {"lr": 4e-3},
    "no warmup": {"warmup": 0.0},
    "one-cycle (warmup 50%)": {"warmup": 0.5},
    "dropout 0": {"args": ["--dropout", 0]},
    "MLM only": {"args": ["--objective", "mlm"]},
    "MLM only, packed sentences (--pairs none)": {"data": "packed", "args": ["--objective", "mlm"]},
    "mask 30%": {"data": "ww30"},
    "mask 40%": {"data": "ww40"},
    "[MASK] only": {"data": "ww15-maskonly"},
    "single-token masks": {"data": "tok15"},
    "batch 8": {"batch": 8},
    "batch 128 (accum 4)": {"batch": 128},
    "mini (L4 H256)": {"config": "mini"},
    "rotary positions": {"args": ["--positions", "rotary"]},
    "rotary, lr 2e-3": {"lr": 2e-3, "args": ["--positions", "rotary"]},
    "rotary, MLM only, dropout 0": {"args": ["--positions", "rotary", "--objective", "mlm", "--dropout", 0]},
    "rotary, MLM only": {"args": ["--positions", "rotary", "--objective", "mlm"]},
    "rotary, MLM only, packed sentences": {"data": "packed", "args": ["--positions", "rotary", "--objective", "mlm"]},
    "rotary, single-token masks": {"data": "tok15", "args": ["--positions", "rotary"]},
    "ELECTRA (generator 1/4)": {"args": ["--objective", "electra"]},
    "ELECTRA (generator 1/2)": {"args": ["--objective", "electra", "--generator-size", 0.5]},
    # GPT's own probes, against "GPT" (the paper's GPT: learned positions, post-LN, as compare pretrains it)
    "GPT": GPT,
    "GPT, lr 5e-4": {**GPT, "lr": 5e-4},
    "GPT, lr 2e-3": {**GPT, "lr": 2e-3},
    "GPT, lr 4e-3": {**GPT, "lr": 4e-3},
    "GPT, dropout 0": {**GPT, "args": ["--dropout", 0]},
    "GPT, rotary positions": {**GPT, "variant": "rotary"},
    "GPT, pre-LN": {**GPT, "variant": "pre-ln"},
}
MLM_OF_GENERATOR = ("ELECTRA",)  # probes whose held-out MLM accuracy is the generator's, not the encoder's


@contextlib.contextmanager
def gpt_variant(name: str | None):
    """A GPT architecture that torchbert does not ship, for a probe only (patched in while the block runs):
    "rotary": no position table in the sum, queries and keys turned by RoFormer's angles instead (the
    BERT probes' winner); "pre-ln": GPT-2's block order, x + attention(LN(x)) and x + FFN(LN(x)), with a
    final LayerNorm (without gain and bias: the probe adds no parameters) before the tied output layer."""
    if name is None:
        yield
        return
    from torchbert.baselines import gpt
    from torchbert import model as m
    from torchbert.packing import packed_layout

    saved = gpt.OpenAIGPTModel.forward, m.Layer.forward

    def forward(self, input_ids, position_ids=None, *, cu_seqlens=None, max_seqlen=None,
                output_hidden_states=False, output_attentions=False):
        layout, offsets = packed_layout(cu_seqlens, max_seqlen, input_ids.numel(), causal=True)  # pretraining: packed
        if name == "rotary":
            if not hasattr(self, "probe_rotary"):
                self.probe_rotary = [t.to(input_ids.device) for t in m.rotary_tables(
                    self.config.n_positions, self.config.n_embd // self.config.n_head)]
            x = self.embeddings.dropout(self.embeddings.tokens(input_ids))
            layout.rotary = tuple(t[offsets] for t in self.probe_rotary)
        else:
            x = self.embeddings(input_ids, offsets)
        for layer in self.layers:
            x, _ = layer(x, layout)
        if name == "pre-ln":
            x = torch.nn.functional.layer_norm(x, x.shape[-1:])
        return m.BertOutput(last_hidden_state=x)

    def pre_ln(self, x, layout, need_weights=False, rows=None):
        a, probs = self.attention(self.attention_norm(x), layout, need_weights, rows)
        x = x + self.dropout(a)
        return x + self.dropout(self.ffn(self.ffn_norm(x))), probs

    gpt.OpenAIGPTModel.forward = forward
    if name == "pre-ln":
        m.Layer.forward = pre_ln
    try:
        yield
    finally:
        gpt.OpenAIGPTModel.forward, m.Layer.forward = saved


def prepared(work: Path, base: Path, name: str) -> Path:
    """The data variant `name`, prepared like the demo's base data but for its flags (cached)."""
    if name == "ww15":
        return base
    out = work / f"data-{name}"
    if (out / "manifest.json").is_file():
        return out
    flags = [str(x) for x in DATA[name]]
    whole = [] if "--no-whole-word" in flags else ["--whole-word"]
    flags = [f for f in flags if f != "--no-whole-word"]
    settings = json.loads((base / "manifest.json").read_text())["settings"]
    argv = ["prepare", "--corpus", *settings["corpus"], "--tokenizer", settings["tokenizer"], "--out", out, *whole,
            "--max-seq-len", settings["max_seq_len"], "--heldout-docs", settings["heldout_docs"], "--seed",
            settings["seed"], "--quiet", "--overwrite", *flags]
    if cli([str(a) for a in argv]) != 0:
        raise SystemExit(f"prepare {name} failed")
    return out


def pretrain(recipe: dict, data: Path, heldout: Path, out: Path, steps: int, seed: int, evals: int) -> list[dict]:
    """One run; its held-out evaluations as [{seconds, tokens, accuracy}]."""
    batch, accum = (recipe["batch"], 1) if recipe["batch"] <= 32 else (32, recipe["batch"] // 32)
    every = max(1, steps // evals)
    argv = ["pretrain", "--data", data, "--eval-data", heldout, "--out", out, "--config", recipe["config"], "--steps",
            steps, "--batch-size", batch, "--grad-accum", accum, "--lr", recipe["lr"], "--warmup-steps",
            round(recipe["warmup"] * steps), "--schedule", recipe["schedule"], "--seed", seed, "--log-every", every,
            "--eval-every", every, "--eval-batches", 20 * 32 // batch, "--quiet", "--overwrite", "--model",
            recipe["model"], *recipe["args"]]
    with gpt_variant(recipe["variant"]):
        if cli([str(a) for a in argv]) != 0:
            raise SystemExit(f"pretrain failed: {argv}")
    key = "eval_lm_accuracy" if recipe["model"] == "gpt" else "eval_mlm_accuracy"
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{"step": r["step"], "seconds": r["seconds"], "tokens": r["tokens"], "accuracy": r[key]}
            for r in rows if key in r]


def model_folder(work: Path, probe: str, seed: int) -> Path:
    return work / "models" / f"{re.sub(r'[^A-Za-z0-9]+', '-', probe).strip('-')}-seed{seed}"


def keep_model(run: Path, out: Path) -> None:
    """The run's final model folder (weights, config, tokenizer), without its checkpoints."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in run.iterdir():
        if f.is_file() and f.name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json",
                                      "special_tokens_map.json", "tokenizer.json", "metrics.json"):
            shutil.copyfile(f, out / f.name)


def finetune_table(a, work: Path, base: Path, tasks: Path, results: dict) -> None:
    """The demo's protocol on each probe's seed-0 model and on random weights: sentiment and People's Daily
    NER with 200 labels, the learning rate chosen on dev, 3 seeds scored on test (compare.cell)."""
    from torchbert.apps import demo
    from torchbert.apps.compare import Stages, bert_folder, cell

    b = demo.QUICK if a.budget == "quick" else demo.FULL
    r = Stages(work / "finetune", cli, lambda _: None)
    paper = model_folder(work, "paper", a.finetune_seed)
    models = {"random weights": work / "models" / "random"}
    bert_folder(paper, models["random weights"], seed=a.finetune_seed)
    models.update({name: model_folder(work, name, a.finetune_seed) for name in a.probes
                   if PROBES[name].get("model", "bert") == "bert"})  # GPT's probes are read by their LM only
    scores = results.setdefault("finetune", {})
    for name, folder in models.items():
        if not (folder / "model.safetensors").is_file():
            continue
        for task in ("sentiment", "ner"):
            if f"{name}/{task}" not in scores:
                slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")
                scores[f"{name}/{task}"] = cell(r, b, tasks, task, "low", slug, folder, b.grids["bert"], 0)
                (work / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nfine-tuned from each probe's seed-{a.finetune_seed} model: {b.low} labelled examples, the learning "
          f"rate chosen on dev from {b.grids['bert']}, test mean ± std over {b.seeds} seeds")
    print("| model | sentiment accuracy | gain | NER entity F1 | gain |\n|---|---:|---:|---:|---:|")
    base_scores = {t: scores[f"random weights/{t}"] for t in ("sentiment", "ner")}
    for name in models:
        if f"{name}/ner" not in scores:
            continue
        cells = []
        for t in ("sentiment", "ner"):
            c = scores[f"{name}/{t}"]
            se = (c["std"] ** 2 / len(c["test"]) + base_scores[t]["std"] ** 2 / len(base_scores[t]["test"])) ** 0.5
            gain = c["mean"] - base_scores[t]["mean"]
            mark = " ✓" if gain > 2 * se else " ✗" if gain < -2 * se else ""
            cells += [f"{c['mean']:.3f} ± {c['std']:.3f}", "-" if name == "random weights" else f"{gain:+.3f}{mark}"]
        print(f"| {name} | " + " | ".join(cells) + " |")


def cross_table(a, work: Path, base: Path, variant: str) -> None:
    """Every kept model of the probes (all seeds) scored on the base's held-out masks and on data
    variant `variant`'s (its own layout's held-out documents): a layout seen only in training is
    told apart from one the evaluation favours (packed rows are one segment, all token type 0)."""
    from torchbert.heads import BertForMaskedLM
    from torchbert.train.objectives import MaskedLMTask
    from torchbert.train.pretrain import evaluator

    heldouts = {"the paper's pairs (base)": base / "heldout", variant: prepared(work, base, variant) / "heldout"}
    scorers = {name: evaluator(PretrainingData(h, shuffle=False), 32, 20, torch.device("cpu"), MaskedLMTask())
               for name, h in heldouts.items()}
    print("\n| probe (MLM models) | " + " | ".join(f"held-out MLM acc, {n}" for n in heldouts) + " |")
    print("|---|" + "---:|" * len(heldouts))
    for name in a.probes:
        folders = [model_folder(work, name, seed) for seed in a.seeds]
        if not all((f / "model.safetensors").is_file() for f in folders) or PROBES[name].get("model") == "gpt":
            continue
        cells = []
        for score in scorers.values():
            accs = []
            for folder in folders:
                model = BertForMaskedLM.from_pretrained(folder).eval()
                with torch.no_grad():
                    accs.append(score(model)["mlm_accuracy"])
            cells.append(f"{statistics.mean(accs):.3f}" + (f" ± {statistics.stdev(accs):.3f}" if len(accs) > 1 else ""))
        print(f"| {name} | " + " | ".join(cells) + " |")


def at_seconds(curve: list[dict], t: float) -> float:
    """Held-out accuracy at t training seconds, linear between evaluations (0 before the first)."""
    xs = [0.0] + [r["seconds"] for r in curve]
    ys = [0.0] + [r["accuracy"] for r in curve]
    return float(np.interp(t, xs, ys))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench_recipes"), help="data, runs and results.json")
    ap.add_argument("--data", help="the base data (a prepare folder with heldout/; default: the demo's, made in --work)")
    ap.add_argument("--budget", choices=("full", "quick"), default="full",
                    help="the demo data's size when --data is not given (quick: a smoke test)")
    ap.add_argument("--probes", nargs="+", default=list(PROBES), help="probe names (default: all)")
    ap.add_argument("--seconds", type=float, default=180, help="training seconds per run (default: 180)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--evals", type=int, default=6, help="held-out evaluations per run (default: 6)")
    ap.add_argument("--fresh", action="store_true", help="measure again what results.json holds")
    ap.add_argument("--finetune", action="store_true",
                    help="also fine-tune each probe's model with the demo's protocol (sentiment and NER, 200 labels)")
    ap.add_argument("--finetune-seed", type=int, default=0, help="whose pretraining run is fine-tuned (default: 0)")
    ap.add_argument("--also-eval", choices=list(DATA), help="score every kept model also on this data variant's "
                    "held-out documents (e.g. packed: the --pairs none layout), beside the base's")
    ap.add_argument("--tasks", help="the demo's task files (default: made beside the demo's data in --work)")
    a = ap.parse_args()
    unknown = [p for p in a.probes if p not in PROBES]
    if unknown:
        ap.error(f"unknown probe(s) {unknown}; choose from {list(PROBES)}")
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    base = Path(a.data) if a.data else demo_data(work, a.budget)
    heldout = base / "heldout"
    results_path = work / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() and not a.fresh else {}
    key = f"{a.seconds:g}s"
    for name in a.probes:
        recipe = {**PAPER, **PROBES[name]}
        data = prepared(work, base, recipe["data"])
        for seed in a.seeds:
            done = results.setdefault(key, {}).setdefault(name, {})
            if str(seed) in done:
                continue
            calibration = pretrain(recipe, data, heldout, work / "calibrate", 40, seed, 1)
            per_step = calibration[-1]["seconds"] / calibration[-1]["step"]
            steps = max(10, round(a.seconds / per_step))
            curve = pretrain(recipe, data, heldout, work / "run", steps, seed, a.evals)
            keep_model(work / "run", model_folder(work, name, seed))
            tps = curve[-1]["tokens"] / curve[-1]["seconds"]
            done[str(seed)] = {"steps": steps, "tokens_per_second": round(tps), "curve": curve}
            results_path.write_text(json.dumps(results, indent=1))
            print(f"{name} seed {seed}: {steps} steps, {tps:,.0f} tokens/s, held-out accuracy "
                  f"{at_seconds(curve, a.seconds):.3f} at {a.seconds:g} s", flush=True)

    counts = yardsticks(PretrainingData(base), heldout_batches(PretrainingData(heldout, shuffle=False), 32, 20))
    print(f"\n# {cpu_name()}; {a.seconds:g} training seconds per run; seeds {a.seeds}")
    print(f"count yardsticks on the same {counts['masked']:,} held-out masks: unigram {counts['unigram']:.3f}, "
          f"left {counts['left']:.3f}, both neighbours {counts['neighbours']:.3f}\n")
    marks = [a.seconds / 3, 2 * a.seconds / 3, a.seconds]
    print("| probe | steps | tokens/s | " + " | ".join(f"acc at {t:.0f} s" for t in marks) + " | vs paper (GPT's: vs GPT) |")
    print("|---|---:|---:|" + "---:|" * (len(marks) + 1))

    def mean_end(probe):  # a probe's mean held-out accuracy at the full budget, or None
        runs = results.get(key, {}).get(probe, {})
        return statistics.mean(at_seconds(r["curve"], a.seconds) for r in runs.values()) if runs else None

    for name in a.probes:
        runs = [results[key][name][str(s)] for s in a.seeds if str(s) in results.get(key, {}).get(name, {})]
        if not runs:
            continue
        cells = []
        for t in marks:
            accs = [at_seconds(r["curve"], t) for r in runs]
            cells.append(f"{statistics.mean(accs):.3f}" + (f" ± {statistics.stdev(accs):.3f}" if len(accs) > 1 else ""))
        end = statistics.mean(at_seconds(r["curve"], a.seconds) for r in runs)
        reference = mean_end("GPT" if PROBES[name].get("model") == "gpt" else "paper")  # GPT's probes: vs GPT
        delta = f"{end - reference:+.3f}" if reference is not None else "n/a"
        what = " (generator MLM)" if name.startswith(MLM_OF_GENERATOR) else \
            " (next token)" if PROBES[name].get("model") == "gpt" else ""
        print(f"| {name}{what} | {statistics.mean(r['steps'] for r in runs):,.0f} | "
              f"{statistics.mean(r['tokens_per_second'] for r in runs):,.0f} | " + " | ".join(cells) + f" | {delta} |")
    if a.also_eval:
        cross_table(a, work, base, a.also_eval)
    if a.finetune:
        finetune_table(a, work, base, Path(a.tasks) if a.tasks else work / f"tasks-{a.budget}", results)


if __name__ == "__main__":
    main()
