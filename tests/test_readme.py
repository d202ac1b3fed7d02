"""The README runs as written: its Python API block (and what it saves is what transformers loads), and
its shell blocks marked for this test, in order, on small data (SHRINK), with their servers and clients."""

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
          "finetune": {"--epochs": "1", "--max-length": "32"}}


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
    return [sizes.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]


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
                code_ = main(shrunk(argv[1:]))
                out, err = self.capsys.readouterr()
                assert code_ == 0, f"{shlex.join(argv)}: exit {code_}\n{err[-3000:]}"
                outputs.append(out)
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


@pytest.mark.e2e
def test_your_own_bert_from_a_folder_of_jsonl_gz_to_served_models(shell, tmp_path):
    """The README's "Your own BERT" block, in order, on a corpus in its layout: a folder of .jsonl.gz
    files with the text under "content", reviews to classify and pairs to search by."""
    import gzip
    import json

    from torchbert.apps.samples import (corpus_text, documents, inverse_cloze, jsonl_text, peoples_daily_paragraphs,
                                        sentiment_reviews, tsv_text)

    paragraphs = [p for p in peoples_daily_paragraphs() if p]
    (tmp_path / "corpus").mkdir()
    docs = documents(paragraphs[:900], 5)
    for k in range(3):
        with gzip.open(tmp_path / "corpus" / f"news-{k}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(json.dumps({"id": i, "content": d}, ensure_ascii=False) + "\n" for i, d in
                         enumerate(docs[k::3]))
    (tmp_path / "reviews").mkdir()
    reviews = sentiment_reviews()
    (tmp_path / "reviews" / "train.tsv").write_text(tsv_text(reviews[:160]), encoding="utf-8")
    (tmp_path / "reviews" / "dev.tsv").write_text(tsv_text(reviews[160:200]), encoding="utf-8")
    pairs = inverse_cloze(paragraphs[900:], seed=0)
    (tmp_path / "pairs.jsonl").write_text(jsonl_text(pairs[:64]), encoding="utf-8")
    (tmp_path / "dev_pairs.jsonl").write_text(jsonl_text(pairs[64:96]), encoding="utf-8")
    # and for the next blocks: news/*.jsonl.zst, wiki/ (text files), crawl.parquet, each with its own documents
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    more = documents(paragraphs[1200:1600], 5)
    (tmp_path / "news").mkdir(), (tmp_path / "wiki").mkdir()
    for k in range(2):
        text = "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in more[k:40:2])
        (tmp_path / "news" / f"part-{k}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    (tmp_path / "wiki" / "a.txt").write_text(corpus_text(more[40:60]), encoding="utf-8")
    pq.write_table(pa.table({"text": more[60:]}), tmp_path / "crawl.parquet")

    (_, code), = marked_blocks("on a small corpus in this layout")
    outputs = shell.run(code)
    assert json.loads((tmp_path / "bert" / "config.json").read_text())["model_type"] == "roformer"  # --recipe rotary
    predicted = json.loads(outputs[-2])["predictions"]
    assert len(predicted) == 1 and predicted[0]["label"] in {"pos", "neg"}
    vector = json.loads(outputs[-1])["data"][0]["embedding"]
    assert len(vector) == 128 and abs(sum(x * x for x in vector) - 1) < 1e-3  # tiny: hidden 128, unit length

    # "More of the pretraining data": files, folders and globs in one prepare; packed sentences; a blend
    for mark in ('after "Your own BERT"', "after the prepare block above"):
        (_, more), = marked_blocks(mark)
        shell.run(more)
    settings = {name: json.loads((tmp_path / name / "manifest.json").read_text())["settings"]
                for name in ("mixed", "packed", "news-data", "wiki-data")}
    assert settings["mixed"]["corpus"] == ["news/*.jsonl.zst", "wiki/", "crawl.parquet"]  # as given
    counts = {name: json.loads((tmp_path / name / "manifest.json").read_text())["counts"]
              for name in ("mixed", "packed", "news-data", "wiki-data")}
    # every document of the three sources, each once: the jsonl.zst files', the text folder's, the Parquet's
    assert counts["mixed"]["documents"] == 80 == counts["news-data"]["documents"] + counts["wiki-data"]["documents"]
    assert counts["packed"]["is_random_next"] == 0 and counts["packed"]["documents"] == len(docs)
    assert settings["packed"]["pairs"] == "none" and settings["news-data"]["pairs"] == "nsp"
    assert json.loads((tmp_path / "blend" / "metrics.json").read_text())["steps"] == 6


@pytest.mark.e2e
def test_from_your_bert_to_search_runs_as_written_on_the_demos_bert(shell, tmp_path):
    """The README's search blocks, in order, on a `--quick` demo's BERT (runs/demo/pretrain/bert): the
    training files from `samples`, every score, both servers, OpenAI's client and httpx."""
    import json

    from torchbert.cli import main

    assert main(["demo", "--quick", "--out", "runs/demo"]) == 0
    (_, bash), (_, python) = marked_blocks("on a `--quick` demo's BERT")
    outputs = shell.run(bash)
    scores = [json.loads(x) for x in outputs if x.lstrip().startswith("{")]
    assert [sorted(k for k in x if k.startswith("ndcg")) for x in scores] == [["ndcg@10", "ndcg@10_d64"], ["ndcg@10"],
                                                                               ["ndcg@10"]]
    assert "first_stage_ndcg@10" in scores[2] and scores[2]["top_k"] == 20
    scope = shell.python(python)
    assert len(scope["vectors"][0].embedding) == 64  # dimensions=64: the Matryoshka size it was trained for
    assert [r["index"] for r in scope["ranked"]["results"]] in ([0], [1])


@pytest.mark.e2e
def test_the_quickstart_runs_as_written_and_writes_what_transformers_loads(shell, tmp_path):
    """The README's quickstart (one epoch): a fixed WNUT-16 split, MiniLM fine-tuned for NER, scored and
    predicted; the run folder is what transformers' BertForTokenClassification loads."""
    import json

    import transformers

    (_, code), = marked_blocks("after nothing but the set-up commands")
    outputs = shell.run(code)
    scores = json.loads(outputs[-2])
    assert {"f1", "precision", "recall"} <= set(scores) and scores["token_accuracy"] > 0.9  # (1 epoch: O mostly)
    records = [json.loads(x) for x in (tmp_path / "runs/ner/test.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 400 and all(len(r["words"]) == len(r["tags"]) for r in records)
    theirs = transformers.BertForTokenClassification.from_pretrained(tmp_path / "runs/ner")
    assert set(theirs.config.id2label.values()) >= {"O", "B-person"}
    for name in ("metrics.json", "loss.png", "dev.png", "dev_predictions.jsonl"):
        assert (tmp_path / "runs/ner" / name).is_file(), name


@pytest.mark.e2e
def test_serve_runs_as_written_and_answers_curl_and_openais_client_alike(shell, minilm_dir):
    """The README's serve blocks: the packaged MiniLM served, called with curl's request and with
    OpenAI's client; the vectors are sentence-transformers' (unit length, 384 wide)."""
    import json

    import numpy as np

    (_, bash), (_, python) = marked_blocks("against the packaged MiniLM")
    data = json.loads(shell.run(bash)[-1])["data"]
    assert [d["index"] for d in data] == [0, 1] and len(data[0]["embedding"]) == 384
    vectors = np.array(shell.python(python)["vectors"])
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
