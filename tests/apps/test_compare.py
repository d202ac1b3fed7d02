"""`torchbert compare --quick`: every system pretrained and fine-tuned on every task and size, the
protocol's outputs (not who wins: a few steps decide nothing), and data kept apart."""

import json
import statistics
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    from torchbert.cli import main

    out = tmp_path_factory.mktemp("compare") / "run"
    assert main(["compare", "--quick", "--out", str(out)]) == 0
    return out


@pytest.mark.e2e
def test_quick_compare_writes_the_table_over_seeds_and_every_run(compared):
    from torchbert.apps.compare import QUICK, SECONDS, SYSTEMS, TASKS

    s = json.loads((compared / "summary.json").read_text(encoding="utf-8"))
    # GPT and ELMo again at matched seconds, and MiniLM continued
    assert len(s["cells"]) == len(TASKS) * 2 * (len(SYSTEMS) + 2 + 1)
    for key, cell in s["cells"].items():
        assert len(cell["test"]) == QUICK.seeds and all(0 <= x <= 1 for x in cell["test"])
        assert cell["lr"] in QUICK.grids[cell["system"]] and set(cell["grid_dev"]) == {
            f"{x:g}" for x in QUICK.grids[cell["system"]]}
        assert cell["mean"] == pytest.approx(sum(cell["test"]) / len(cell["test"]))
        for seed in range(QUICK.seeds):
            name = cell["name"].replace("@", "-")
            run = compared / "runs" / f"{cell['task']}-{cell['size']}-{name}-lr{cell['lr']:g}-seed{seed}"
            assert (run / "model.safetensors").is_file() and (run / "test_metrics.json").is_file()
    # matched: the same tokens, and non-embedding parameters within 1% of BERT's
    p = s["pretraining"]
    assert p["bert"]["tokens"] == p["gpt"]["tokens"] == p["elmo"]["tokens"] > 0
    for system in ("gpt", "elmo"):
        assert abs(p[system]["parameters"]["body"] / p["bert"]["parameters"]["body"] - 1) < 0.01
    assert set(p["elmo"]["heldout"]) == {"forward_loss", "forward_accuracy", "backward_loss", "backward_accuracy"}
    md = (compared / "summary.md").read_text(encoding="utf-8")
    assert md.count("\n| sentiment (accuracy) |") == 6  # two sizes in each of three tables
    assert "At matched tokens: the paper's order (BERT > GPT > ELMo > random) held in" in md
    assert "At matched seconds: the paper's order" in md and md.count("\n| ner (f1) |") == 6
    # matched seconds: GPT and ELMo each ran its own steps for about BERT's seconds, from its own
    # seconds per step in the matched-token run
    for system in ("gpt", "elmo"):
        again, first = p[f"{system}@seconds"], p[system]
        per_step = first["train_seconds"] / first["steps"]
        assert again["steps"] == max(1, round(p["bert"]["train_seconds"] / per_step))
        assert again["tokens"] > 0 and (compared / "pretrain" / f"{system}-seconds" / "model.safetensors").is_file()
    for key, order in s["order_seconds"].items():
        means = [s["cells"][f"{key}/{x}"]["mean"] for x in SECONDS]
        assert order["paper_order_held"] == all(a > b for a, b in zip(means, means[1:]))
    assert "BERT's recipe: rotary positions (RoFormer)" in md and s["settings"]["recipe"] == "rotary"
    for model in ("bert", "random"):  # random weights: BERT's architecture, rotary too
        assert json.loads((compared / "pretrain" / model / "config.json").read_text())["model_type"] == "roformer"
    assert (compared / "pretraining_loss.png").stat().st_size > 1000 and (compared / "scores.png").is_file()
    for key, order in s["order"].items():
        means = [s["cells"][f"{key}/{x}"]["mean"] for x in ("bert", "gpt", "elmo", "random")]
        assert order["paper_order_held"] == all(a > b for a, b in zip(means, means[1:]))
        assert "continued" not in order["ranking"]  # a larger model pretrained elsewhere: not in the paper's order


@pytest.mark.e2e
def test_a_public_checkpoint_grown_and_continued_on_the_corpus_is_fine_tuned_beside_the_others(compared):
    from torchbert.apps.compare import QUICK
    from torchbert.io.hf import resolve_model

    s = json.loads((compared / "summary.json").read_text(encoding="utf-8"))
    c = s["pretraining"]["continued"]
    assert c["steps"] == QUICK.continue_steps and c["tokens"] > 0
    assert 0 <= c["heldout_first"]["mlm_accuracy"] <= 1 and 0 <= c["heldout"]["mlm_accuracy"] <= 1  # before, after
    run = compared / "pretrain" / "continued"
    m = json.loads((run / "metrics.json").read_text())
    assert m["objective"] == "mlm" and m["eval_first"] == c["heldout_first"]  # --recipe continue: from an --init
    minilm = (resolve_model("minilm", "minilm") / "vocab.txt").read_text(encoding="utf-8").splitlines()
    grown = (run / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert grown[:len(minilm)] != minilm and len(grown) == c["vocab_size"] >= len(minilm)
    added = set(grown) - set(minilm)
    corpus = (compared / "data" / "corpus.txt").read_text(encoding="utf-8")
    assert 0 < len(added) <= QUICK.extend_add and all(t in corpus for t in added)  # the corpus's own characters
    for key in s["order"]:
        cell = s["cells"][f"{key}/continued"]
        assert cell["lr"] in QUICK.grids["continued"] and len(cell["test"]) == QUICK.seeds
    md = (compared / "summary.md").read_text(encoding="utf-8")
    assert "Where users start: minilm" in md and "| random init | BERT from scratch | continued | best |" in md


@pytest.mark.e2e
def test_dev_and_test_text_stay_out_of_the_corpus_and_the_training_files(compared):
    data = compared / "data"
    corpus = (data / "corpus.txt").read_text(encoding="utf-8")
    for split in ("dev", "test"):
        reviews = (data / f"sentiment.{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]
        assert reviews and not any(r.split("\t")[0] in corpus for r in reviews)
        sentences = (data / f"ner.{split}.conll").read_text(encoding="utf-8").strip().split("\n\n")
        texts = ["".join(line.split("\t")[0] for line in s.splitlines()) for s in sentences]
        assert texts and not any(t in corpus for t in texts if len(t) >= 8)
        train = (data / "ner.train.conll").read_text(encoding="utf-8")
        assert not any(s in train for s in sentences if len(s) > 40)
    tags = {line.split("\t")[1] for line in (data / "ner.train.conll").read_text(encoding="utf-8").splitlines() if line}
    assert {"O", "B-PER", "B-LOC"} <= tags


@pytest.mark.e2e
def test_the_pair_task_asks_which_sentence_follows_on_held_out_paragraphs(compared):
    from torchbert.apps.samples import peoples_daily_paragraphs

    data = compared / "data"
    corpus = (data / "corpus.txt").read_text(encoding="utf-8")
    rows = {split: [json.loads(x) for x in (data / f"pair.{split}.jsonl").read_text(encoding="utf-8").splitlines()]
            for split in ("train", "train_low", "dev", "test")}
    assert all(r in rows["train"] for r in rows["train_low"])
    for split in ("train", "train_low", "dev", "test"):  # balanced
        assert len(rows[split]) >= 8 and [r["label"] for r in rows[split]].count("next") * 2 == len(rows[split])
    for split in ("dev", "test"):
        for r in rows[split]:  # held out: neither sentence is in the corpus
            assert r["sentence1"] not in corpus and r["sentence2"] not in corpus
        # each first sentence comes once with its next sentence and once with another paragraph's
        by_first: dict[str, list[str]] = {}
        for r in rows[split]:
            by_first.setdefault(r["sentence1"], []).append(r["label"])
        assert all(sorted(v) == ["next", "other"] for v in by_first.values())
    text = "\n".join(peoples_daily_paragraphs())
    for r in rows["train"]:  # `next`: the second follows the first in a paragraph; `other`: it does not
        assert (r["sentence1"] + r["sentence2"] in text) == (r["label"] == "next")


def test_next_sentence_pairs_pair_only_adjacent_sentences_and_other_paragraphs():
    from torchbert.apps.compare import next_sentence_pairs

    paragraphs = [["a1", "a2", "a3"], ["b1"], ["c1", "c2"]]
    rows = next_sentence_pairs(paragraphs, 100, seed=0)
    assert sorted((r["sentence1"], r["sentence2"]) for r in rows if r["label"] == "next") == [
        ("a1", "a2"), ("a2", "a3"), ("c1", "c2")]
    other = [(r["sentence1"], r["sentence2"]) for r in rows if r["label"] == "other"]
    assert sorted(a for a, _ in other) == ["a1", "a2", "c1"]
    assert all(a[0] != b[0] for a, b in other)  # never the sentence's own paragraph
    assert rows == next_sentence_pairs(paragraphs, 100, seed=0) and len(rows) == 6
    assert len(next_sentence_pairs(paragraphs, 5, seed=0)) == 4  # whole couples only
    gap = next_sentence_pairs([["a1", None, "a2", "a3"], ["b1"]], 100, seed=0)
    assert sorted((r["sentence1"], r["sentence2"]) for r in gap if r["label"] == "next") == [("a2", "a3")]


@pytest.mark.e2e
def test_resume_reruns_nothing_and_a_foreign_folder_is_refused(compared, tmp_path, capsys):
    from clihelp import cli

    before = {p: p.stat().st_mtime_ns for p in (compared / "runs").glob("*/model.safetensors")}
    code, out, err = cli(capsys, "compare", "--quick", "--out", compared, "--resume")
    assert code == 0, err
    assert "== sentiment-full-bert" not in out and "== pretrain" not in out
    assert {p: p.stat().st_mtime_ns for p in (compared / "runs").glob("*/model.safetensors")} == before
    code, _, err = cli(capsys, "compare", "--quick", "--out", compared)
    assert code == 2 and "pass --resume" in err
    code, _, err = cli(capsys, "compare", "--quick", "--out", compared, "--resume", "--seed", "1")
    assert code == 2 and "ran with other settings" in err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep", encoding="utf-8")
    code, _, err = cli(capsys, "compare", "--quick", "--out", tmp_path / "mine", "--resume")
    assert code == 2 and "holds no earlier compare" in err and (tmp_path / "mine" / "notes.txt").is_file()
    code, _, err = cli(capsys, "compare", "--quick", "--out", tmp_path / "x", "--budget", "0")
    assert code == 2 and "--budget must be in (0, 1000]" in err


@pytest.mark.e2e
def test_overwrite_keeps_the_earlier_compare_until_the_new_one_has_pretrained(tmp_path, capsys, monkeypatch):
    import torchbert.apps.compare
    from torchbert.apps.compare import MARKER
    from torchbert.cli import main

    earlier = tmp_path / "run"
    earlier.mkdir()
    (earlier / MARKER).write_text("")
    (earlier / "summary.md").write_text("old")

    def fails_while_pretraining(out, on_pretrained, **kw):
        (out / "pretrain").mkdir()
        raise ValueError("the disk broke")

    monkeypatch.setattr(torchbert.apps.compare, "run_compare", fails_while_pretraining)
    assert main(["compare", "--quick", "--out", str(earlier), "--overwrite"]) == 2
    assert "the disk broke" in capsys.readouterr().err
    assert sorted(p.name for p in earlier.iterdir()) == sorted([MARKER, "summary.md"])
    assert not list(tmp_path.glob(".run*"))

    def fails_after_pretraining(out, on_pretrained, **kw):
        (out / "pretrain").mkdir()
        on_pretrained()
        raise ValueError("the disk broke later")

    monkeypatch.setattr(torchbert.apps.compare, "run_compare", fails_after_pretraining)
    assert main(["compare", "--quick", "--out", str(earlier), "--overwrite"]) == 2
    assert sorted(p.name for p in earlier.iterdir()) == [".torchbert", "pretrain"]  # the new one stays, for --resume
    assert not list(tmp_path.glob(".run*"))


@pytest.mark.e2e
def test_a_fresh_compare_interrupted_while_pretraining_keeps_its_runs_for_resume(tmp_path, capsys, monkeypatch):
    """Hours of pretraining are not thrown away by a Ctrl-C or a SIGTERM: a fresh compare has no earlier
    folder to put back, so it keeps what finished and says how to continue."""
    import torchbert.apps.compare
    from torchbert.apps.compare import MARKER
    from torchbert.cli import main

    out = tmp_path / "run"

    def interrupted_while_pretraining(out, on_pretrained, **kw):
        (out / MARKER).write_text("")
        (out / "settings.json").write_text("{}")
        (out / "pretrain" / "bert").mkdir(parents=True)
        (out / "pretrain" / "bert" / "metrics.json").write_text("{}")  # a finished run
        raise KeyboardInterrupt

    monkeypatch.setattr(torchbert.apps.compare, "run_compare", interrupted_while_pretraining)
    assert main(["compare", "--quick", "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"interrupted; {out} keeps the runs that finished; continue with: torchbert compare --quick --out {out} " \
           "--resume" in err, err
    assert (out / "pretrain" / "bert" / "metrics.json").is_file() and (out / MARKER).is_file()


def test_random_init_is_seeded_whole_and_leaves_the_global_rng_alone(tmp_path, minilm_dir):
    import torch
    from safetensors.torch import load_file

    from torchbert.apps.compare import random_init

    torch.manual_seed(123)
    before = torch.get_rng_state()
    random_init(minilm_dir, tmp_path / "a", seed=0)
    assert torch.equal(torch.get_rng_state(), before)
    random_init(minilm_dir, tmp_path / "b", seed=0)
    random_init(minilm_dir, tmp_path / "c", seed=1)
    a, b, c = (load_file(tmp_path / x / "model.safetensors") for x in "abc")
    assert all(a[k].equal(b[k]) for k in a) and not all(a[k].equal(c[k]) for k in a)
    assert not a["bert.encoder.layer.0.attention.self.query.weight"].equal(
        load_file(minilm_dir / "model.safetensors")["encoder.layer.0.attention.self.query.weight"])
    assert (tmp_path / "a" / "vocab.txt").is_file() and not list(tmp_path.glob(".*tmp"))


def test_the_learning_rate_is_chosen_on_dev_and_reported_on_test(monkeypatch):
    """compare's protocol for one cell: each rate with the first seed, the best on dev kept (the first
    on a tie), the other seeds at that rate; the figure is their mean test score. A rate that would
    win on test but not on dev is not chosen."""
    from types import SimpleNamespace

    import torchbert.apps.compare as compare

    scores = {1e-4: (0.70, 0.90), 5e-5: (0.80, 0.60), 3e-5: (0.80, 0.95)}  # lr: (dev, test)
    calls = []

    def finetune_one(r, b, data, task, size, name, model, lr, seed):
        calls.append((lr, seed))
        dev, test = scores[lr]
        return {"dev": dev, "test": test + seed / 100, "seconds": 1.0, "run": f"lr{lr:g}-seed{seed}"}

    monkeypatch.setattr(compare, "finetune_one", finetune_one)
    got = compare.cell(None, SimpleNamespace(seeds=3), None, "ner", "small", "bert", None, (1e-4, 5e-5, 3e-5), seed=10)
    assert got["lr"] == 5e-5 and calls == [(1e-4, 10), (5e-5, 10), (3e-5, 10), (5e-5, 11), (5e-5, 12)]
    assert got["test"] == pytest.approx([0.70, 0.71, 0.72]) and got["mean"] == pytest.approx(0.71)
    assert got["grid_dev"] == {"0.0001": 0.70, "5e-05": 0.80, "3e-05": 0.80}
    assert got["std"] == pytest.approx(statistics.stdev([0.70, 0.71, 0.72]))  # over the seeds, n - 1
    assert got["dev"] == [0.80, 0.80, 0.80] and got["run"] == "lr5e-05-seed10"
    assert got["seconds"] == 5.0  # every run once: 3 at the chosen rate, 1 at each other


def test_the_paper_order_is_strict_and_ranks_best_first():
    from torchbert.apps.compare import paper_order

    def cells(**means):
        return {f"ner/full/{k}": {"mean": v} for k, v in means.items()}

    got = paper_order(cells(bert=0.9, gpt=0.8, elmo=0.7, random=0.1))["ner/full"]
    assert got["ranking"] == ["bert", "gpt", "elmo", "random"] and got["paper_order_held"] and got["bert_beats_random"]
    got = paper_order(cells(bert=0.5, gpt=0.8, elmo=0.8, random=0.5))["ner/full"]
    assert got["ranking"][0] == "gpt" and not got["paper_order_held"]  # a tie is no order
    assert not got["bert_beats_random"]  # nor is a tie with random init a win
    assert not paper_order(cells(bert=0.9, gpt=0.8, elmo=0.8, random=0.1))["ner/full"]["paper_order_held"]


def test_held_out_paragraphs_come_from_the_end_test_first():
    """hold_out: whole paragraphs from the last, test first, until each split holds n sentences and
    n / 2 pair examples (2 per adjacent sentences, so a paragraph of 1 sentence gives none)."""
    from torchbert.apps.compare import hold_out

    by_paragraph = {p: ["s"] * k for p, k in enumerate([3, 3, 1, 1, 1, 1, 2, 4])}
    # n = 4: test takes paragraph 7 (4 sentences, 6 pair examples: enough); dev takes 6 (2 sentences, 2
    # examples), 5 and 4 (4 sentences, still 2 examples: n / 2 = 2 is enough, so dev stops there)
    assert hold_out(by_paragraph, 4) == {"test": [7], "dev": [6, 5, 4]}
    assert hold_out({p: ["s"] * 2 for p in range(6)}, 4) == {"test": [5, 4], "dev": [3, 2]}
    # four paragraphs of one sentence: n sentences, but no pair example; test goes on to paragraph 1
    assert hold_out({p: ["s"] * k for p, k in enumerate([3, 3, 1, 1, 1, 1])}, 4) == {"test": [5, 4, 3, 2, 1],
                                                                                     "dev": [0]}


def test_the_budget_scales_pretraining_and_the_full_training_sets_and_counts_every_stage(tmp_path):
    from torchbert.apps.compare import QUICK, run_compare, stage_count

    b = QUICK.scaled(2)
    assert (b.train, b.pretrain_steps, b.low) == (2 * QUICK.train, 2 * QUICK.pretrain_steps, QUICK.low)
    # vocab and prepare, 3 pretrainings (+2 at matched seconds); per task (3) and size (2), each system's
    # runs (its 1 rate + 1 more seed), a finetune and a test each
    # MiniLM continued: its vocab --extend, prepare and pretrain, and its runs like the others'
    assert stage_count(QUICK, "tokens") == 2 + 3 + 3 + 3 * 2 * (5 * 2) * 2
    assert stage_count(QUICK, "both") == 2 + 3 + 3 + 2 + 3 * 2 * (7 * 2) * 2
    with pytest.raises(ValueError, match="match 'seconds' is not one of"):
        run_compare(tmp_path / "compare", quick=True, match="seconds")
    assert not (tmp_path / "compare").exists()  # refused before the folder is made


def test_a_finished_pretraining_is_read_back_with_its_peak_memory(tmp_path):
    """The demo's summary gives the pretraining's peak memory: it comes from the run's metrics.json."""
    import torch
    from safetensors.torch import save_file

    from torchbert.apps.compare import QUICK, pretrain_one
    from torchbert.apps.stages import Stages

    run = tmp_path / "bert"
    run.mkdir()
    save_file({"embeddings.word_embeddings.weight": torch.zeros(10, 4), "encoder.layer.0.w": torch.zeros(4, 4)},
              run / "model.safetensors")
    (run / "config.json").write_text("{}")
    metrics = {"train_seconds": 2.0, "tokens": 100, "tokens_per_second": 50.0, "eval": {"mlm_accuracy": 0.2}}
    (run / "metrics.json").write_text(json.dumps({**metrics, "peak_memory_gb": 2.2}))
    got = pretrain_one(Stages(tmp_path, lambda m: None, keep=False), QUICK, "bert", run, 10, 0)
    assert got["peak_memory_gb"] == 2.2 and got["parameters"] == {"embedding": 40, "body": 16}
    (run / "metrics.json").write_text(json.dumps(metrics))  # a run of an older torchbert
    assert "peak_memory_gb" not in pretrain_one(Stages(tmp_path, lambda m: None, keep=False), QUICK, "bert", run,
                                                10, 0)


def test_a_resumed_run_keeps_its_fine_tuning_that_finished_and_runs_only_the_evaluation_it_lacked(tmp_path):
    """A signal during a run's test evaluation: the message counts its fine-tuning as kept, and a
    --resume takes up after it (the stages it runs are the ones the message said were missing)."""
    import torchbert.apps.compare as compare
    from torchbert.apps.stages import Stages
    from torchbert.errors import StudyInterrupted

    calls = []

    class Study(Stages):
        stop = True

        def finetune(self, name, s, cfg):
            def call():
                calls.append("finetune")
                s.out.mkdir(parents=True)
                for f in ("model.safetensors", "config.json"):
                    (s.out / f).write_text("x")
                (s.out / "metrics.json").write_text(json.dumps({"accuracy": 0.6}))
            return self.run(name, ["finetune"], call)

        def evaluate(self, name, model, data, out):
            def call():
                calls.append("evaluate")
                if self.stop:
                    raise KeyboardInterrupt
                out.write_text(json.dumps({"accuracy": 0.7}))
            return self.run(name, ["evaluate"], call)

    args = (compare.QUICK, tmp_path / "data", "sentiment", "full", "bert", tmp_path / "bert", 1e-4, 0)
    with pytest.raises(StudyInterrupted) as e:
        compare.finetune_one(Study(tmp_path, lambda m: None, total=2), *args)
    assert e.value.done == 1 and calls == ["finetune", "evaluate"]
    resumed = Study(tmp_path, lambda m: None, total=2)
    resumed.stop = False
    got = compare.finetune_one(resumed, *args)
    assert calls == ["finetune", "evaluate", "evaluate"] and resumed.done == 2
    assert got["dev"] == 0.6 and got["test"] == 0.7 and got["seconds"] == resumed.times[Path(got["run"]).name]
    again = Study(tmp_path, lambda m: None, total=2)
    assert compare.finetune_one(again, *args) == got and again.done == 2 and len(calls) == 3  # all on disk
