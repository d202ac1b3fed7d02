"""The README runs as written: its Python API block (and what it saves is what transformers loads), and
its shell blocks marked for this test, in order, on small data (SHRINK, TRAIN_ROWS), with their servers and
clients."""

import contextlib
import io
import os
import re
import shlex
from pathlib import Path

import pytest
import torch
from parity import assert_parity

README = Path(__file__).parent.parent / "README.md"


def api_block() -> str:
    text = README.read_text(encoding="utf-8")
    marker = text.index("<!-- the block below is run by tests/test_readme.py -->")
    match = re.compile(r"```python\n(.*?)```", re.S).search(text, marker)
    return match.group(1)


def test_python_api_block_runs(tmp_path, minilm_dir):
    code = api_block()
    assert len([x for x in code.splitlines() if x.strip() and not x.startswith(("import", "from"))]) <= 12
    assert '"path/to/bert"' in code
    code = code.replace('"path/to/bert"', repr(str(minilm_dir)))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            scope: dict = {}
            exec(compile(code, "README.md", "exec"), scope)
    finally:
        os.chdir(cwd)
    probs = scope["model"](**scope["batch"]).logits.softmax(-1)
    assert_parity(probs.sum(-1), torch.ones(2))
    assert probs[0, 1] > 0.5 and probs[1, 0] > 0.5  # ten steps on two sentences: it fits them
    assert "tensor(" in printed.getvalue()

    from transformers import BertForSequenceClassification

    theirs = BertForSequenceClassification.from_pretrained(tmp_path / "clf").eval()
    assert theirs.config.id2label == {0: "neg", 1: "pos"}
    batch = scope["batch"]
    with torch.no_grad():
        ours = scope["model"](**batch).logits
        ref = theirs(**{k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}).logits
    assert_parity(ours, ref)


# -- the README's shell blocks, run as written (sizes shrunk) ------------------------------------------

MARK = "<!-- tests/test_readme.py runs the"
FENCE = re.compile(r"```(\w+)\n(.*?)```\n", re.S)
# what makes a README command small enough for a test: the flag's value here, per command
SHRINK = {"pretrain": {"--steps": "6", "--batch-size": "8", "--save-every": "3", "--config": "tiny"},
          "vocab": {"--vocab-size": "3000"},
          "prepare": {"--heldout-docs": "5"},
          "finetune": {"--epochs": "1", "--max-length": "32"},
          "distill": {"--epochs": "1"}}
ADDED = {"finetune": {"--epochs": "1"}}  # and where the README leaves the flag at its default
TRAIN_ROWS = 1000  # what `torchbert samples` writes to train on is cut to its first examples; dev and test stay


def shrink_training_files(folder: Path) -> None:
    """A sample's training files (train.*, and sentences.txt for SimCSE) cut to TRAIN_ROWS examples: a
    sentence of a .conll file, a line of the others."""
    for path in folder.iterdir():
        if path.name.startswith("train.") or path.name == "sentences.txt":
            sep = "\n\n" if path.suffix == ".conll" else "\n"
            rows = path.read_text(encoding="utf-8").strip("\n").split(sep)
            path.write_text(sep.join(rows[:TRAIN_ROWS]) + "\n", encoding="utf-8")


def marked_blocks(mark: str) -> list[tuple[str, str]]:
    """The fenced blocks (language, code) after the README's mark for this test whose line holds
    `mark`: the next one ("the block below"), or the next two ("the two blocks below")."""
    text = README.read_text(encoding="utf-8")
    line = next(m for m in re.finditer(re.escape(MARK) + r"[^\n]*", text) if mark in m.group(0))
    count = 2 if "the two blocks below" in line.group(0) else 1
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text, line.end())][:count]


def commands(code: str) -> list[list[str]]:
    """A bash block's commands as argument lists, continuation lines joined and comments dropped; a
    command ending in `&` keeps the `&`."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&") + 1 if "&" in words else len(words)
            out.append(words[:cut])
            words = words[cut:]
    return out


def shrunk(argv: list[str]) -> list[str]:
    sizes = SHRINK.get(argv[0], {})
    argv = [sizes.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]
    if "--help" in argv:
        return argv
    return argv + [x for flag, value in ADDED.get(argv[0], {}).items() if flag not in argv for x in (flag, value)]


class Shell:
    """Runs a README block's commands in a folder: torchbert's in this process (through its main), a
    server (`... &`) as a process of its own on a free port, curl as an HTTP call, NAME=value as a
    variable; `ports` maps each README port to the one its server listens on."""

    def __init__(self, folder: Path, capsys):
        self.folder, self.capsys, self.env, self.ports, self.servers = folder, capsys, {}, {}, []

    def run(self, code: str) -> list[str]:
        outputs = []
        for argv in commands(code):
            argv = [os.path.expandvars(re.sub(r"\$(\w+)", lambda m: self.env.get(m.group(1), m.group(0)), a))
                    for a in argv]
            if len(argv) == 1 and re.fullmatch(r"\w+=\S*", argv[0]):
                name, value = argv[0].split("=", 1)
                self.env[name] = value
            elif argv[0] == "torchbert" and argv[-1] == "&":
                self.serve(argv[1:-1])
            elif argv[0] == "torchbert":
                from torchbert.cli import main

                self.capsys.readouterr()
                try:
                    code_ = main(shrunk(argv[1:]))
                except SystemExit as e:  # --help
                    code_ = e.code
                out, err = self.capsys.readouterr()
                assert code_ == 0, f"{shlex.join(argv)}: exit {code_}\n{err[-3000:]}"
                outputs.append(out)
                if argv[1] == "samples":
                    shrink_training_files(self.folder / argv[argv.index("--out") + 1])
            elif argv[0] == "curl":
                outputs.append(self.curl(argv[1:]))
            else:
                raise AssertionError(f"the README test cannot run {shlex.join(argv)}")
        return outputs

    def serve(self, argv: list[str]) -> None:
        import socket
        import subprocess
        import sys
        import time

        import httpx

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if "--port" not in argv:
            argv = [*argv, "--port", "8000"]  # serve's default
        at = argv.index("--port")
        given, argv = argv[at + 1], [*argv[:at], "--port", str(port), *argv[at + 2:]]
        log = open(self.folder / f"serve-{given}.log", "w")
        self.servers.append((subprocess.Popen([sys.executable, "-m", "torchbert", *argv], cwd=self.folder,
                                              stdout=log, stderr=subprocess.STDOUT), log))
        self.ports[given] = str(port)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.servers[-1][0].poll() is None, (self.folder / f"serve-{given}.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.5)
        raise AssertionError(f"serve {shlex.join(argv)} did not answer within 120 s")

    def local(self, text: str) -> str:
        """`text` with each README port replaced by its server's."""
        for given, port in self.ports.items():
            text = re.sub(rf"(localhost|127\.0\.0\.1):{given}\b", rf"\g<1>:{port}", text)
        return text

    def curl(self, argv: list[str]) -> str:
        import httpx

        url = next(a for a in argv if "localhost:" in a or "127.0.0.1:" in a)
        headers = dict(h.split(": ", 1) for h in (argv[i + 1] for i, a in enumerate(argv) if a == "-H"))
        body = argv[argv.index("-d") + 1]
        r = httpx.post("http://" + self.local(url).removeprefix("http://"), content=body.encode(), headers=headers,
                       timeout=60)
        assert r.status_code == 200, f"curl {url}: {r.status_code} {r.text}"
        return r.text

    def python(self, code: str) -> dict:
        scope: dict = {}
        exec(compile(self.local(code), "README.md", "exec"), scope)
        return scope

    def close(self) -> None:
        for process, log in self.servers:
            process.terminate()
            process.wait(timeout=60)
            log.close()


@pytest.fixture
def shell(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = Shell(tmp_path, capsys)
    yield s
    s.close()


def your_files(folder: Path) -> None:
    """What the README says is the user's own: "Your own BERT"'s folder of .jsonl.gz files with the
    text under "content", reviews to classify and pairs to search by; "More of the pretraining data"'s
    news/*.jsonl.zst, wiki/ (text files) and crawl.parquet, each with documents of its own."""
    import gzip
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    from torchbert.apps.samples import (corpus_text, documents, inverse_cloze, jsonl_text, peoples_daily_paragraphs,
                                        sentiment_reviews, tsv_text)

    paragraphs = [p for p in peoples_daily_paragraphs() if p]
    (folder / "corpus").mkdir()
    docs = documents(paragraphs[:900], 5)
    for k in range(3):
        with gzip.open(folder / "corpus" / f"news-{k}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(json.dumps({"id": i, "content": d}, ensure_ascii=False) + "\n" for i, d in
                         enumerate(docs[k::3]))
    (folder / "reviews").mkdir()
    reviews = sentiment_reviews()
    (folder / "reviews" / "train.tsv").write_text(tsv_text(reviews[:160]), encoding="utf-8")
    (folder / "reviews" / "dev.tsv").write_text(tsv_text(reviews[160:200]), encoding="utf-8")
    pairs = inverse_cloze(paragraphs[900:], seed=0)
    (folder / "pairs.jsonl").write_text(jsonl_text(pairs[:64]), encoding="utf-8")
    (folder / "dev_pairs.jsonl").write_text(jsonl_text(pairs[64:96]), encoding="utf-8")
    more = documents(paragraphs[1200:1600], 5)
    (folder / "news").mkdir(), (folder / "wiki").mkdir()
    for k in range(2):
        text = "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in more[k:40:2])
        (folder / "news" / f"part-{k}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    (folder / "wiki" / "a.txt").write_text(corpus_text(more[40:60]), encoding="utf-8")
    pq.write_table(pa.table({"text": more[60:]}), folder / "crawl.parquet")


def every_marked_block() -> list[tuple[str, list[tuple[str, str]]]]:
    """(mark, its blocks) for each of the README's marks for this test, in the README's order."""
    text = README.read_text(encoding="utf-8")
    return [(m.group(0), marked_blocks(m.group(0))) for m in re.finditer(re.escape(MARK) + r"[^\n]*", text)]


@pytest.mark.e2e
def test_the_readme_runs_in_order_in_one_folder(shell, tmp_path):
    """Every block of the README marked for this test, in the README's order, in one fresh folder,
    each using only what the set-up command (a `--quick` demo), the blocks before it and the user's own
    files (your_files) made: no name of one block's output is clobbered by another's, no port taken
    twice. Then what each section says it made is checked."""
    import json

    import numpy as np
    import transformers
    from safetensors.numpy import load_file

    from torchbert.cli import main

    assert main(["demo", "--quick", "--out", "runs/demo"]) == 0  # `bash scripts/demo.sh`, at --quick's size
    your_files(tmp_path)
    ran: dict[str, list] = {}
    for mark, blocks in every_marked_block():
        ran[mark] = [shell.run(code) if language == "bash" else shell.python(code) for language, code in blocks]
    assert len(ran) == 11, list(ran)
    for name in ("data/pdr/train.jsonl", "data/pdr/sentences.txt"):  # what was trained on: cut to TRAIN_ROWS
        assert len((tmp_path / name).read_text(encoding="utf-8").splitlines()) == TRAIN_ROWS, name
    assert len((tmp_path / "data/pd-ner/train.conll").read_text(encoding="utf-8").strip().split("\n\n")) == TRAIN_ROWS

    def section(words: str) -> list:
        return next(outputs for mark, outputs in ran.items() if words in mark)

    # the quickstart: WNUT-16 NER with MiniLM (1 epoch), scored, predicted; what transformers loads
    outputs, = section("after nothing but the set-up commands")
    scores = json.loads(outputs[-2])
    assert {"f1", "precision", "recall"} <= set(scores) and scores["token_accuracy"] > 0.9  # (1 epoch: O mostly)
    records = [json.loads(x) for x in (tmp_path / "runs/ner/test.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 400 and all(len(r["words"]) == len(r["tags"]) for r in records)
    theirs = transformers.BertForTokenClassification.from_pretrained(tmp_path / "runs/ner")
    assert set(theirs.config.id2label.values()) >= {"O", "B-person"}
    for name in ("metrics.json", "loss.png", "dev.png", "dev_predictions.jsonl"):
        assert (tmp_path / "runs/ner" / name).is_file(), name

    # a smaller model: the quickstart's tagger distilled into 2 of its 6 layers, scored on the test tweets
    outputs, = section("after the quickstart's")
    assert {"f1", "precision", "recall"} <= set(json.loads(outputs[-1]))
    assert json.loads((tmp_path / "runs/ner-small/config.json").read_text())["num_hidden_layers"] == 2
    assert json.loads((tmp_path / "runs/ner-small/metrics.json").read_text())["distill"]["layers"] == [0, 5]
    transformers.BertForTokenClassification.from_pretrained(tmp_path / "runs/ner-small")

    # "Your own BERT": from .jsonl.gz files to a served classifier and search service
    outputs, = section("on a small corpus in this layout")
    assert json.loads((tmp_path / "bert" / "config.json").read_text())["model_type"] == "roformer"  # --recipe rotary
    predicted = json.loads(outputs[-2])["predictions"]
    assert len(predicted) == 1 and predicted[0]["label"] in {"pos", "neg"}
    vector = json.loads(outputs[-1])["data"][0]["embedding"]
    assert len(vector) == 128 and abs(sum(x * x for x in vector) - 1) < 1e-3  # tiny: hidden 128, unit length

    # continued from MiniLM: its vocabulary grown, scored before its first step, fine-tuned; then TAPT
    section("continued from MiniLM")
    grown = json.loads((tmp_path / "minilm-zh" / "config.json").read_text())["vocab_size"]
    assert grown > 30522  # MiniLM's own
    rows = [json.loads(x) for x in (tmp_path / "minilm-news" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and 0 <= rows[0]["eval_mlm_accuracy"] <= 1  # the checkpoint as it came
    continued = json.loads((tmp_path / "minilm-news" / "metrics.json").read_text())
    assert continued["objective"] == "mlm" and continued["steps"] == 6 and "eval_first" in continued
    assert json.loads((tmp_path / "sentiment-news" / "config.json").read_text())["vocab_size"] == grown
    assert "accuracy" in json.loads((tmp_path / "sentiment-news" / "metrics.json").read_text())
    assert json.loads((tmp_path / "minilm-reviews" / "metrics.json").read_text())["steps"] == 6

    # "More of the pretraining data": files, folders and globs in one prepare; packed sentences; a blend
    manifests = {name: json.loads((tmp_path / name / "manifest.json").read_text())
                 for name in ("mixed", "packed", "news-data", "wiki-data")}
    settings = {name: m["settings"] for name, m in manifests.items()}
    counts = {name: m["counts"] for name, m in manifests.items()}
    assert settings["mixed"]["corpus"] == ["news/*.jsonl.zst", "wiki/", "crawl.parquet"]  # as given
    # every document of the three sources, each once: the jsonl.zst files', the text folder's, the Parquet's
    assert counts["mixed"]["documents"] == 80 == counts["news-data"]["documents"] + counts["wiki-data"]["documents"]
    assert counts["packed"]["is_random_next"] == 0 and counts["packed"]["documents"] == 180
    assert settings["packed"]["pairs"] == "none" and settings["news-data"]["pairs"] == "nsp"
    assert json.loads((tmp_path / "blend" / "metrics.json").read_text())["steps"] == 6

    # fine-tuning your BERT on People's Daily's names: scored and predicted, a transformers checkpoint
    outputs, = section("after the blend's")
    scores = next(json.loads(x) for x in outputs if x.lstrip().startswith("{"))  # evaluate's
    assert {"f1", "precision", "recall", "token_accuracy"} <= set(scores)
    tags = [json.loads(x) for x in (tmp_path / "tags.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(tags) == 1000 and all(len(r["words"]) == len(r["tags"]) for r in tags)
    assert "--task" in outputs[-1] and "token" in outputs[-1]  # finetune --help
    assert len(json.loads((tmp_path / "pd-ner/config.json").read_text())["id2label"]) == 7  # O, B/I of 3 kinds

    # embeddings from any BERT: MiniLM's of the 1,000 test queries; the paper's features from your BERT
    outputs, = section("after the fine-tuning block above")
    queries = np.load(tmp_path / "queries.npy")
    assert queries.shape == (1000, 384) and np.allclose(np.linalg.norm(queries, axis=1), 1, atol=1e-3)
    sentences = (tmp_path / "data/pdr/sentences.txt").read_text(encoding="utf-8").splitlines()
    assert load_file(tmp_path / "feats.safetensors")["embeddings"].shape == (len(sentences), 128)
    assert "--text-field" in outputs[-1]

    # from the demo's BERT to search: every score's name, the reranker as a search, both servers
    outputs, scope = section("on a `--quick` demo's BERT")
    scores = [json.loads(x) for x in outputs if x.lstrip().startswith("{")]
    assert [sorted(k for k in x if k.startswith("ndcg")) for x in scores] == [["ndcg@10", "ndcg@10_d64"], ["ndcg@10"],
                                                                               ["ndcg@10"]]
    assert "first_stage_ndcg@10" in scores[2] and scores[2]["top_k"] == 20
    assert len(scope["vectors"][0].embedding) == 64  # dimensions=64: the Matryoshka size it was trained for
    assert [r["index"] for r in scope["ranked"]["results"]] in ([0], [1])

    # BERT against its predecessors: GPT and ELMo pretrained on the same data and fine-tuned alike
    section("after the fine-tuning and embedding blocks above")
    assert json.loads((tmp_path / "gpt/config.json").read_text())["model_type"] == "openai-gpt"
    for name in ("ner-gpt", "ner-elmo"):
        assert "f1" in json.loads((tmp_path / name / "metrics.json").read_text()), name

    # serve: the packaged MiniLM, called with curl's request and with OpenAI's client alike
    (outputs, scope) = section("against the packaged MiniLM")
    data = json.loads(outputs[-1])["data"]
    assert [d["index"] for d in data] == [0, 1] and len(data[0]["embedding"]) == 384
    vectors = np.array(scope["vectors"])
    assert vectors.shape == (2, 384) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-3)


def test_every_shell_block_is_run_here_or_says_why_not():
    """Each bash block of the README is run by a test above, or its mark says why it is not (and where
    its commands are tested instead): a new block cannot slip in untried."""
    text = README.read_text(encoding="utf-8")
    unmarked = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if m.group(1) == "bash" and not before.startswith((MARK, "<!-- not run by tests/test_readme.py")):
            unmarked.append(m.group(2).splitlines()[0])
    assert not unmarked, unmarked


def test_each_section_makes_the_sample_data_it_reads():
    """A reader who jumps to a section finds its data made there: every data/NAME/ file a marked block reads
    is written by a `torchbert samples ... --out data/NAME` of that block ("From your BERT to search" read
    data/pdr/train.jsonl, which only an earlier section made: "no such file")."""
    for mark, blocks in every_marked_block():
        code = "\n".join(c for language, c in blocks if language == "bash")
        made = set(re.findall(r"torchbert samples \S+ --out (data/[\w.-]+)", code))
        read = set(re.findall(r"(data/[\w.-]+)/", code))
        assert read <= made, (mark, sorted(read - made))
