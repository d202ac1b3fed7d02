"""What each command prints and hands on, held to what it wrote: the lines a user reads after a run
(counts from the manifest, rates, notes), what --quiet leaves out, and the flags each command passes
to the library. The library's own behaviour is tested beside it; these are the commands' own lines."""

import json
import re

import pytest
import realdata
from clihelp import cli, tiny_bert

from torchbert.cli import main
from torchbert.commands import prepare as prepare_command
from torchbert.errors import UserError

# -- prepare ----------------------------------------------------------------------------------------


def test_prepare_rates_are_of_what_this_run_read_and_made():
    counts = {"corpus_tokens": 1000, "tokens": 5000}
    assert prepare_command.rates(counts, {"read_tokenize": 0.5}, 2.0, False) == \
        "2,000 corpus tokens/s read, 2,500 instance tokens/s overall"
    # resumed after every piece was read: this run read nothing, whatever the corpus holds
    assert prepare_command.rates(counts, {}, 2.0, True) == \
        "this run read 0 of the corpus tokens (0 tokens/s), the rest was read before --resume"
    assert prepare_command.rates(counts, {"read_tokens": 300, "read_tokenize": 0.5}, 2.0, True) == \
        "this run read 300 of the corpus tokens (600 tokens/s), the rest was read before --resume"


def test_prepare_says_what_it_wrote_as_its_manifest_counts_it(prepared, tmp_path, capsys):
    out = tmp_path / "d"
    code, stdout, err = cli(capsys, "prepare", "--corpus", prepared / "train.txt", "--tokenizer", prepared / "tok",
                            "--out", out, "--whole-word", "--heldout-docs", "3", "--max-seq-len", "64",
                            "--dupe-factor", "1")
    assert code == 0, err
    m = json.loads((out / "manifest.json").read_text())
    c, h = m["counts"], m["heldout"]
    first, memory, held = stdout.splitlines()
    assert re.fullmatch(r"  peak memory \d+\.\d\d GB in this process(, \d+\.\d\d GB in its largest worker)?", memory)
    assert first.startswith(f"wrote {out}: {c['instances']:,} instances, {c['tokens']:,} tokens in {c['shards']} "
                            f"shard(s) from {c['documents']:,} documents, {c['corpus_tokens']:,} corpus tokens "
                            "(static masking, whole word) in "), first
    seconds, _, made = re.fullmatch(r".* in ([\d.]+)s: ([\d,]+) corpus tokens/s read, ([\d,]+) instance "
                                       r"tokens/s overall", first).groups()
    seconds, made = float(seconds), int(made.replace(",", ""))
    assert c["tokens"] / (seconds + 0.05) - 1 <= made <= c["tokens"] / max(seconds - 0.05, 1e-3) + 1  # 0.1 s, whole
    assert held == f"  held out: {h['documents']} documents -> {h['instances']} instances in {out}/heldout " \
                   "(torchbert pretrain evaluates on it)"
    assert h["documents"] == 3 and "read + tokenize" in err and "pairs + masks" in err  # the progress bars

    code, stdout, err = cli(capsys, "prepare", "--corpus", prepared / "train.txt", "--tokenizer", prepared / "tok",
                            "--out", tmp_path / "packed", "--pairs", "none", "--masking", "dynamic", "--quiet")
    assert code == 0 and err == ""
    assert "(dynamic masking, packed sentences) in " in stdout and len(stdout.splitlines()) == 2


def test_prepare_gives_its_peak_memory_and_its_largest_workers(monkeypatch):
    from torchbert import hardware

    monkeypatch.setattr(hardware, "peak_resident_bytes", lambda children=False: 390_000_000 if children else 512_345_678)
    assert prepare_command.peak_memory(local_workers=True) == \
        "peak memory 0.51 GB in this process, 0.39 GB in its largest worker"
    assert prepare_command.peak_memory(local_workers=False) == "peak memory 0.51 GB in this process"  # --cluster
    monkeypatch.setattr(hardware, "peak_resident_bytes", lambda children=False: 0 if children else 512_345_678)
    assert prepare_command.peak_memory(local_workers=True) == "peak memory 0.51 GB in this process"  # no worker ran
    monkeypatch.setattr(hardware, "peak_resident_bytes", lambda children=False: None)  # no getrusage
    assert prepare_command.peak_memory(local_workers=True) is None



# -- vocab -------------------------------------------------------------------------------------------


def test_vocab_says_why_it_stopped_short_and_blames_chinese_characters_only_where_they_are(tmp_path, capsys):
    from torchbert.tokenizer import BertTokenizer

    corpus = tmp_path / "en.txt"
    corpus.write_text("\n".join(realdata.english_texts()[:300]) + "\n", encoding="utf-8")
    out = tmp_path / "v"
    code, stdout, err = cli(capsys, "vocab", "--corpus", corpus, "--vocab-size", "50000", "--out", out,
                            "--no-lowercase", "--quiet")
    n = BertTokenizer.from_pretrained(out).vocab_size
    assert code == 0 and n < 50000
    assert re.fullmatch(rf"wrote {re.escape(str(out))}: vocab of {n} tokens \(cased\) in [\d.]+s\n", stdout)
    assert err == (f"note: {n:,} tokens, fewer than --vocab-size 50,000: every pair of pieces that the corpus holds at "
                   "least --min-frequency 2 times was merged and none is left; more text, or a lower --min-frequency, "
                   "gives more\n")


def test_vocab_into_a_log_writes_its_one_line_and_no_empty_ones(tmp_path, capfd):
    """tokenizers' trainer writes a newline to the process's stdout after each progress bar, even where
    it draws none: in a log (no terminal, no --quiet) stdout is the one line that says what was written."""
    corpus = tmp_path / "en.txt"
    corpus.write_text("\n".join(realdata.english_texts()[:100]) + "\n", encoding="utf-8")
    assert main(["vocab", "--corpus", str(corpus), "--vocab-size", "300", "--out", str(tmp_path / "v")]) == 0
    assert re.fullmatch(r"wrote \S+: vocab of 300 tokens \(lowercased\) in [\d.]+s\n", capfd.readouterr().out)


# -- what an inference command hands the library ---------------------------------------------------


@pytest.fixture(scope="module")
def bert_folder(minilm_dir, tmp_path_factory):
    """A tiny random BERT with MiniLM's tokenizer: what the commands check of a model (its config) is there."""
    return tiny_bert(tmp_path_factory.mktemp("m") / "tiny", minilm_dir)


def spy(monkeypatch, module, name, result):
    """Replace module.name with a stand-in that records its calls and returns result."""
    calls = []
    monkeypatch.setattr(module, name, lambda *a, **k: (calls.append((a, k)), result)[1])
    return calls


def test_predict_hands_on_its_flags_and_writes_readable_utf8(bert_folder, tmp_path, capsys, monkeypatch):
    from torchbert.tasks import predict

    texts = tmp_path / "in.jsonl"
    texts.write_text('{"text": "很好"}\n{"text": "不好"}\n', encoding="utf-8")
    calls = spy(monkeypatch, predict, "run_predict", [{"text": "很好", "label": "正面"}, {"text": "不好", "label": "负面"}])
    out = tmp_path / "p.jsonl"
    code, stdout, err = cli(capsys, "predict", "--model", bert_folder, "--input", texts, "--out", out,
                            "--batch-size", "7", "--precision", "bf16", "--quiet")
    assert code == 0, err
    (model_dir, data, device, batch), kw = calls[0]
    assert (model_dir, data, device.type, batch) == (bert_folder, texts, "cpu", 7)
    assert kw == {"progress": False, "precision": "bf16"}
    assert out.read_text(encoding="utf-8") == '{"text": "很好", "label": "正面"}\n{"text": "不好", "label": "负面"}\n'
    assert stdout == f"wrote {out}: 2 predictions\n"


def test_predict_out_dash_writes_the_lines_to_standard_output_and_no_file(bert_folder, tmp_path, capsys,
                                                                          monkeypatch):
    import os

    from torchbert.tasks import predict

    texts = tmp_path / "in.jsonl"
    texts.write_text('{"text": "很好"}\n', encoding="utf-8")
    spy(monkeypatch, predict, "run_predict", [{"text": "很好", "label": "正面"}, {"text": "x", "label": "负面"}])
    monkeypatch.chdir(tmp_path)
    code, stdout, err = cli(capsys, "predict", "--model", bert_folder, "--input", texts, "--out", "-", "--quiet")
    assert code == 0, err
    assert stdout == '{"text": "很好", "label": "正面"}\n{"text": "x", "label": "负面"}\n'  # the lines alone
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]  # no file named "-"


def test_predict_out_dash_into_a_pipe_its_reader_closes_stops_without_an_error(bert_folder, tmp_path, capsys,
                                                                               monkeypatch):
    """`predict ... --out - | head -1`: as inspect-data's, the command stops quietly with status 0."""
    from torchbert.tasks import predict

    texts = tmp_path / "in.jsonl"
    texts.write_text('{"text": "很好"}\n', encoding="utf-8")
    spy(monkeypatch, predict, "run_predict", [{"text": "很好" * 50, "label": "正面"}] * 2000)
    into_a_closed_pipe(monkeypatch, capsys, ["predict", "--model", str(bert_folder), "--input", str(texts),
                                             "--out", "-", "--quiet", "--precision", "fp32"])


def into_a_closed_pipe(monkeypatch, capsys, argv):
    """Run `torchbert ARGV` with stdout a pipe whose reader has gone: it exits 0, says nothing, and what is
    left in its buffer goes nowhere, not again at the pipe when Python flushes it at exit (an "Exception
    ignored ... BrokenPipeError" and status 120)."""
    import io
    import os
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader has gone
    stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(write, "w"), 8192), encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", stdout)
    try:
        assert main(argv) == 0
        print("what Python flushes as it exits")
        stdout.flush()  # raises BrokenPipeError where the pipe is still there
    finally:
        monkeypatch.undo()
        stdout.close()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv, words", [
    (["embed", "--model", "m", "--input", "in.txt"], "embed writes a file, not standard output"),
    (["evaluate", "--model", "m", "--data", "in.jsonl"], "evaluate writes a file, not standard output"),
    (["vocab", "--corpus", "in.txt", "--vocab-size", "100"], "vocab writes a folder, not standard output"),
])
def test_out_dash_is_refused_where_a_command_writes_files(tmp_path, capsys, monkeypatch, argv, words):
    import os

    monkeypatch.chdir(tmp_path)
    code, stdout, err = cli(capsys, *argv, "--out", "-")
    assert code == 2 and err == f"torchbert: error: --out -: {words}; give a path\n"
    assert os.listdir(tmp_path) == []  # nothing made, no file or folder named "-"


def test_evaluate_hands_on_its_flags_prints_the_scores_and_writes_them(bert_folder, tmp_path, capsys, monkeypatch):
    from torchbert.tasks import predict, reranker

    data = tmp_path / "dev.jsonl"
    data.write_text('{"text": "很好", "label": "正面"}\n', encoding="utf-8")
    scores = {"accuracy": 0.5, "f1": 0.25}
    calls = spy(monkeypatch, predict, "run_evaluate", (scores, []))
    out = tmp_path / "scores.json"
    code, stdout, err = cli(capsys, "evaluate", "--model", bert_folder, "--data", data, "--task", "classification",
                            "--batch-size", "5", "--out", out, "--quiet")
    assert code == 0, err
    (model_dir, path, task, device, batch), kw = calls[0]
    assert (model_dir, path, task, device.type, batch, kw) == (bert_folder, data, "classification", "cpu", 5,
                                                               {"progress": False, "precision": "fp32"})
    assert json.loads(stdout) == scores and json.loads(out.read_text()) == scores

    # a reranker: searched over the file by the first stage, its top k reordered
    calls = spy(monkeypatch, reranker, "run_rerank_evaluate", {"ndcg@10": 0.5})
    code, stdout, err = cli(capsys, "evaluate", "--model", bert_folder, "--data", data, "--first-stage", bert_folder,
                            "--top-k", "7", "--quiet")
    assert code == 0 and json.loads(stdout) == {"ndcg@10": 0.5}, err
    (model_dir, path, first, top_k, device, batch), kw = calls[0]
    assert (model_dir, path, first, top_k, batch) == (bert_folder, data, bert_folder, 7, 64)
    code, _, err = cli(capsys, "evaluate", "--model", bert_folder, "--data", data, "--first-stage", bert_folder,
                       "--task", "classification")
    assert code == 2 and "--task: a reranker is scored as a search with --first-stage; leave --task out" in err
    code, _, err = cli(capsys, "evaluate", "--model", bert_folder, "--data", data, "--first-stage", tmp_path / "nope")
    assert code == 2 and err.startswith(f"torchbert: error: --first-stage {tmp_path / 'nope'}"), err


# -- inspect-data ------------------------------------------------------------------------------------


def expected_instance(data, tok, i, epoch=0):
    """Instance i as its shards hold it: (tokens shown, original tokens, masked positions, A's length, NotNext)."""
    it = data.instance(i)
    b = data.batch([i], epoch=epoch)
    original = tok.convert_ids_to_tokens(it["tokens"].tolist())
    return (tok.convert_ids_to_tokens(b.input_ids.tolist()), original, b.mlm_positions.tolist(), it["a_len"],
            it["random_next"])


def test_inspect_data_shows_each_instance_as_its_shards_hold_it(prepared, capsys):
    from torchbert.data.shards import PretrainingData
    from torchbert.tokenizer import BertTokenizer

    folder = prepared / "eval"
    data, tok = PretrainingData(folder), BertTokenizer.from_pretrained(folder)
    code, stdout, _ = cli(capsys, "inspect-data", folder, "--n", "100000", "--jsonl")  # more than there are
    rows = [json.loads(line) for line in stdout.splitlines()]
    assert code == 0 and len(rows) == len(data) > 10
    for i, row in enumerate(rows):
        shown, original, positions, a_len, random_next = expected_instance(data, tok, i)
        assert row == {"index": i, "tokens": shown, "token_type_ids": [0] * a_len + [1] * (len(shown) - a_len),
                       "masked_positions": positions, "masked_labels": [original[p] for p in positions],
                       "is_random_next": random_next}
    assert {r["is_random_next"] for r in rows} == {True, False}

    code, stdout, _ = cli(capsys, "inspect-data", folder, "--n", "12")
    m = data.manifest
    want = [(f"{folder}: {len(data):,} instances, {m['counts']['tokens']:,} tokens, static masking, max_seq_len 64; "
             "showing 12")]
    for i in range(12):
        shown, original, positions, a_len, random_next = expected_instance(data, tok, i)
        marked = list(shown)
        for p in positions:
            marked[p] = f"[{shown[p]}→{original[p]}]" if shown[p] != original[p] else f"[={original[p]}]"
        want += ["", f"#{i}  is_random_next={random_next}  tokens={len(shown)}  masked={len(positions)}",
                 "  A: " + " ".join(marked[:a_len]), "  B: " + " ".join(marked[a_len:]),
                 "  masked: " + ", ".join(f"{p}:{original[p]}" for p in positions)]
    assert stdout.splitlines() == want
    assert "[=" in stdout and "→" in stdout  # a masked token left as it was, and a replaced one


def test_inspect_data_into_a_pipe_its_reader_closes_stops_without_an_error(prepared, monkeypatch, capsys):
    """`inspect-data DIR | head`: head goes early; the command stops there, quietly."""
    into_a_closed_pipe(monkeypatch, capsys, ["inspect-data", str(prepared / "eval"), "--n", "100000"])


def test_inspect_data_draws_dynamic_masks_with_its_seed_and_checks_the_vocab(prepared, tmp_path, capsys):
    import shutil

    from torchbert.data.shards import PretrainingData
    from torchbert.tokenizer import BertTokenizer

    folder = tmp_path / "dyn"
    assert cli(capsys, "prepare", "--corpus", prepared / "eval.txt", "--tokenizer", prepared / "tok", "--out", folder,
               "--masking", "dynamic", "--max-seq-len", "64", "--quiet")[0] == 0
    tok = BertTokenizer.from_pretrained(folder)
    shown = {}
    for seed in (0, 7):
        code, stdout, _ = cli(capsys, "inspect-data", folder, "--n", "6", "--jsonl", "--seed", seed)
        data = PretrainingData(folder, seed=seed)
        shown[seed] = [json.loads(line)["masked_positions"] for line in stdout.splitlines()]
        assert shown[seed] == [expected_instance(data, tok, i)[2] for i in range(6)]
    assert shown[0] != shown[7]
    assert "dynamic masking" in cli(capsys, "inspect-data", folder, "--n", "0")[1]

    other = tmp_path / "other-vocab"
    shutil.copytree(folder, other)
    vocab = other / "vocab.txt"
    vocab.write_text(vocab.read_text(encoding="utf-8") + "extra\n", encoding="utf-8")
    code, stdout, err = cli(capsys, "inspect-data", other)
    assert code == 2 and "vocab mismatch" in err and stdout == "", err


def test_export_hands_on_its_flags_and_says_in_a_line_what_it_cannot_export(bert_folder, tmp_path, capsys,
                                                                           monkeypatch):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from torchbert.apps import export

    calls = spy(monkeypatch, export, "export_onnx", {})
    code, _, err = cli(capsys, "export", "--model", bert_folder, "--out", tmp_path / "onnx", "--int8", "--opset", "17")
    assert code == 0, err
    (model_dir, out), kw = calls[0]
    assert (model_dir, out, kw["int8"], kw["opset"]) == (bert_folder, tmp_path / "onnx", True, 17)

    def refuse(*a, **k):
        raise ValueError("this head has no ONNX form")

    monkeypatch.setattr(export, "export_onnx", refuse)
    code, _, err = cli(capsys, "export", "--model", bert_folder, "--out", tmp_path / "onnx2")
    assert code == 2 and err == "torchbert: error: this head has no ONNX form\n"
    users = tmp_path / "users"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    code, _, err = cli(capsys, "export", "--model", bert_folder, "--out", users, "--overwrite")
    assert code == 2 and "which torchbert did not write" in err and (users / "notes.txt").read_text() == "mine"


# -- embed -------------------------------------------------------------------------------------------


def test_embed_names_a_bad_layers_before_it_reads_the_model(tmp_path, capsys):
    code, _, err = cli(capsys, "embed", "--model", tmp_path / "no-model", "--input", tmp_path / "none.txt",
                            "--out", tmp_path / "e.npy", "--layers", "bogus")
    assert code == 2 and err.startswith("torchbert: error: --layers bogus: unknown layer strategy 'bogus'"), err


def test_embed_of_a_plain_model_folder_is_not_normalized_and_reaches_the_models_length(minilm_dir, tmp_path, capsys):
    import numpy as np

    model = tiny_bert(tmp_path / "m", minilm_dir, positions=40)  # no sentence-transformers files
    texts = tmp_path / "queries.JSONL"  # the suffix in capitals is still JSON Lines
    texts.write_text("".join(json.dumps({"query": t}) + "\n" for t in realdata.english_texts()[:5]), encoding="utf-8")
    out = tmp_path / "e.npy"
    code, stdout, err = cli(capsys, "embed", "--model", model, "--input", texts, "--text-field", "query", "--out", out,
                            "--max-length", "40", "--quiet")
    assert code == 0, err
    norms = np.linalg.norm(np.load(out), axis=1)
    assert norms.shape == (5,) and not np.allclose(norms, 1.0, atol=1e-2) and "normalized" not in stdout
    code, _, err = cli(capsys, "embed", "--model", model, "--input", texts, "--text-field", "query", "--out", out,
                       "--max-length", "41")
    assert code == 2 and "--max-length must be in [2, 40] for this model, got 41" in err


def test_embed_hands_on_its_flags_and_writes_nothing_when_a_row_is_not_finite(bert_folder, tmp_path, capsys,
                                                                             monkeypatch):
    import numpy as np

    from torchbert import features

    texts = tmp_path / "t.txt"
    texts.write_text("one\ntwo\nthree\n", encoding="utf-8")
    rows = np.ones((3, 4), dtype=np.float32)
    calls = spy(monkeypatch, features, "embed", rows)
    out = tmp_path / "e.npy"
    code, stdout, err = cli(capsys, "embed", "--model", bert_folder, "--input", texts, "--out", out, "--batch-size", "3",
                            "--max-length", "16", "--layers", "second_to_last", "--pooling", "max", "--normalize",
                            "--precision", "fp32", "--quiet")
    assert code == 0 and err == "", err
    (_, _, given), kw = calls[0]
    assert given == ["one", "two", "three"]
    assert kw == {"pooling": "max", "layers": "second_to_last", "normalize": True, "batch_size": 3, "max_length": 16,
                  "progress": False}
    assert np.array_equal(np.load(out), rows)
    assert stdout.startswith(f"wrote {out}: 3 x 4 float32 (max pooling, layers second_to_last, normalized; computed in "
                             "fp32) in ")

    rows[1, 2] = np.nan
    rows[2, 0] = np.inf
    out.unlink()
    code, stdout, err = cli(capsys, "embed", "--model", bert_folder, "--input", texts, "--out", out,
                            "--precision", "fp32", "--quiet")
    assert code == 1 and not out.exists() and stdout == ""
    assert err == (f"torchbert: error: --model {bert_folder}: the embeddings of 2 text(s) hold NaN or inf (the first: "
                   f"line 2 of {texts}); nothing was written\n")


def test_embed_in_bf16_is_close_to_fp32_and_not_the_same_numbers(minilm_dir, tmp_path, capsys):
    import numpy as np

    texts = tmp_path / "t.txt"
    texts.write_text("\n".join([*realdata.english_texts()[:4], *realdata.peoples_daily_sentences()[:4]]) + "\n",
                     encoding="utf-8")
    got = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / f"{precision}.npy"
        code, stdout, err = cli(capsys, "embed", "--model", minilm_dir, "--input", texts, "--out", out,
                                "--precision", precision, "--quiet")
        assert code == 0 and f"computed in {precision})" in stdout, err
        got[precision] = np.load(out)
    a, b = got["fp32"], got["bf16"]
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert not np.array_equal(a, b) and cosine.min() > 0.99


def test_the_neighbour_shown_is_the_nearest_other_text_by_cosine_and_long_texts_are_clipped(capsys):
    import numpy as np

    from torchbert.commands.embed import show_neighbours

    texts = ["x" * 100, "long vector", "same direction"]
    # by dot product row 1 is nearest to row 0; by cosine row 2 is; each row is nearest to itself
    emb = np.array([[1.0, 0.0], [10.0, 3.0], [1.0, 0.01]], dtype=np.float32)
    show_neighbours(texts, emb, 1)
    assert capsys.readouterr().out == f"  {'x' * 69 + '…'!r}\n    -> 'same direction'  (cosine 1.000)\n"


# -- pretrain and finetune ----------------------------------------------------------------------------


def test_pretrain_refuses_the_settings_of_two_objectives_at_once(monkeypatch):
    """Only ELECTRA has settings of its own today; a second objective that registers some must not
    have both sets taken silently."""
    import argparse
    from dataclasses import dataclass, replace

    from torchbert.commands.pretrain import objective_settings
    from torchbert.settings import Checked, setting
    from torchbert.train.objectives import PRETRAINING, ElectraSettings

    @dataclass
    class OtherSettings(Checked):
        other_width: int = setting(3, "a second objective's own setting", low=1)

    monkeypatch.setitem(PRETRAINING, "other", replace(PRETRAINING["electra"], name="other", settings=OtherSettings))
    args = argparse.Namespace(generator_size=0.5, other_width=4, given=("generator_size",))
    assert objective_settings(args) == ElectraSettings(generator_size=0.5)
    assert objective_settings(argparse.Namespace(**{**vars(args), "given": ("other_width",)})) == OtherSettings(4)
    assert objective_settings(argparse.Namespace(**{**vars(args), "given": ("data",)})) is None
    with pytest.raises(UserError, match="is a setting of .*another objective's: give one objective's settings"):
        objective_settings(argparse.Namespace(**{**vars(args), "given": ("generator_size", "other_width")}))


@pytest.mark.parametrize("flags, message", [
    (["--tagger", "linear"], "--features and --tagger set up the tagger of --frozen; add --frozen, or leave them out"),
    (["--features", "last"], "--features and --tagger set up the tagger of --frozen; add --frozen, or leave them out"),
    (["--task", "nerr"], "--task: "),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--epochs", "0"], "--epochs must be "),
])
def test_finetune_names_the_flag_at_fault_before_it_reads_the_model(tmp_path, capsys, flags, message):
    args = {"--task": "token", "--model": tmp_path / "no-model", "--train": tmp_path / "t.conll",
            "--dev": tmp_path / "d.conll", "--out": tmp_path / "run"}
    for flag, value in zip(flags[::2], flags[1::2]):
        args[flag] = value
    code, _, err = cli(capsys, "finetune", *[x for kv in args.items() for x in kv])
    assert code == 2 and err.startswith("torchbert: error: " + message) and err.count("\n") == 1, err
    assert "no-model" not in err and not (tmp_path / "run").exists()


# -- compare and demo: what they hand the study, and the folders they refuse ------------------------------


@pytest.fixture
def kept_memory(monkeypatch):
    """Calls of glibc's keep-freed-memory setting (fast.memory), which these commands own their process to make."""
    import torchbert.fast

    calls = []
    monkeypatch.setattr(torchbert.fast, "keep_freed_memory", lambda: calls.append(True))
    return calls


@pytest.mark.parametrize("command, app, fn", [("compare", "compare", "run_compare"), ("demo", "demo", "run_demo")])
def test_a_study_hands_on_its_flags_keeps_freed_memory_and_keeps_a_fresh_folder_that_failed(
        command, app, fn, tmp_path, capsys, monkeypatch, kept_memory):
    import importlib

    module = importlib.import_module(f"torchbert.apps.{app}")
    calls = []

    def study(out, **kw):
        calls.append(kw)
        (out / module.MARKER).write_text("")
        (out / "pretrain").mkdir()
        if kw["seed"] == 7:
            raise ValueError("the disk broke")

    monkeypatch.setattr(module, fn, study)
    flags = ["--quick", "--budget", "2", "--seed", "3", "--recipe", "paper"]
    extra = {"match": "tokens"} if command == "compare" else {}
    code, _, err = cli(capsys, command, "--out", tmp_path / "s", *flags, *(f"--{k}={v}" for k, v in extra.items()))
    assert code == 0, err
    assert {k: calls[0][k] for k in ("quick", "budget", "seed", "recipe", *extra)} == \
        {"quick": True, "budget": 2.0, "seed": 3, "recipe": "paper", **extra}
    assert kept_memory == [True]
    # a fresh folder whose study failed keeps what it made, for --resume
    code, _, err = cli(capsys, command, "--out", tmp_path / "f", "--seed", "7")
    assert code == 2 and "the disk broke" in err
    assert (tmp_path / "f" / "pretrain").is_dir() and (tmp_path / "f" / module.MARKER).is_file()


@pytest.mark.parametrize("command", ["compare", "demo"])
def test_a_study_refuses_a_folder_it_did_not_write_and_leaves_it_alone(command, tmp_path, capsys, monkeypatch,
                                                                       kept_memory):
    import torchbert.apps.compare
    import torchbert.apps.demo

    for module, fn in ((torchbert.apps.compare, "run_compare"), (torchbert.apps.demo, "run_demo")):
        monkeypatch.setattr(module, fn, lambda out, **kw: pytest.fail("the study ran"))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    code, _, err = cli(capsys, command, "--out", mine)
    assert code == 2 and "the folder is not empty" in err and "--overwrite" in err, err
    code, _, err = cli(capsys, command, "--out", mine, "--resume")
    assert code == 2 and f"holds no earlier {command} to resume" in err, err
    code, _, err = cli(capsys, command, "--out", mine, "--resume", "--overwrite")
    assert code == 2, err
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"] and kept_memory == []


# -- serve: what it builds and hands uvicorn (the served app itself: tests/apps/test_serve.py) ---------


@pytest.fixture
def serve_spy(monkeypatch):
    """serve's run up to uvicorn, recorded: the Spec the endpoints are built from (and whether they load
    here), the worker pool and its shutdown, create_app's arguments and uvicorn's settings."""
    from types import SimpleNamespace

    import uvicorn

    import torchbert.apps.serve
    import torchbert.apps.worker

    seen = {"shutdown": []}
    endpoints = [SimpleNamespace(path="/v1/embeddings")]

    def build(spec, load=True):
        seen.update(spec=spec, load=load)
        return endpoints

    def worker_pool(spec):
        seen["pool"] = spec
        return SimpleNamespace(shutdown=lambda **kw: seen["shutdown"].append(kw))

    def create_app(served, limits, workers, api_key=None):
        seen.update(app_args=(served, limits, workers), api_key=api_key)
        return "app"

    monkeypatch.setattr(torchbert.apps.worker, "build", build)
    monkeypatch.setattr(torchbert.apps.worker, "worker_pool", worker_pool)
    monkeypatch.setattr(torchbert.apps.serve, "create_app", create_app)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(run=(app, kw)))
    monkeypatch.delenv("TORCHBERT_API_KEY", raising=False)
    seen["endpoints"] = endpoints
    return seen


def test_serve_builds_its_spec_from_the_flags_and_the_folder(serve_spy, minilm_dir, capsys, monkeypatch):
    from torchbert.apps.endpoints import EmbedderSettings

    monkeypatch.setenv("TORCHBERT_API_KEY", "from-env")
    code, _, err = cli(capsys, "serve", "--model", minilm_dir, "--port", "0", "--threads", "1", "--precision", "bf16",
                       "--max-length", "64", "--pooling", "cls", "--no-normalize")
    assert code == 0, err
    spec = serve_spy["spec"]
    assert (spec.name, spec.threads, spec.precision, spec.max_length, spec.device) == \
        (minilm_dir.name, 1, "bf16", 64, "cpu")
    assert spec.options == {"embeddings": EmbedderSettings(pooling="cls", normalize=False)}  # its own flags
    assert serve_spy["load"] is False and serve_spy["pool"] is spec  # the models load in the worker process
    assert serve_spy["api_key"] == "from-env" and "warning" not in err  # the variable, not shown by ps
    assert serve_spy["run"][1]["port"] == 0 and serve_spy["run"][0] == "app"
    assert (f"serving {minilm_dir} as {minilm_dir.name!r} on http://127.0.0.1:0 (POST /v1/embeddings, GET /v1/models, "
            "GET /health") in err
    assert serve_spy["shutdown"] == []  # uvicorn's lifespan shuts the pool down when it stops
    # the key on the command line: used, and a warning unless it is the variable's
    code, _, err = cli(capsys, "serve", "--model", minilm_dir, "--api-key", "from-env", "--name", "mine")
    assert code == 0 and serve_spy["api_key"] == "from-env" and "warning" not in err, err
    assert serve_spy["spec"].name == "mine" and "as 'mine'" in err


def test_serve_names_a_fine_tuned_folders_task_and_int8_loads_here(serve_spy, minilm_dir, capsys, monkeypatch):
    from types import SimpleNamespace

    from torchbert import hardware

    serve_spy["endpoints"][:] = [SimpleNamespace(path="/predict", ts=SimpleNamespace(type="classification"))]
    monkeypatch.setattr(hardware, "cpu", lambda: hardware.CPU("AVX2 only", frozenset({"avx2", "fma"})))
    code, _, err = cli(capsys, "serve", "--model", minilm_dir, "--int8")
    assert code == 0, err
    assert serve_spy["spec"].precision == "int8" and serve_spy["load"] is True and "pool" not in serve_spy
    assert serve_spy["app_args"][2] is None  # ONNX Runtime lets go of the lock: no worker process
    assert "note: --int8: exporting the encoder to ONNX" in err
    assert f"as {minilm_dir.name!r}, a classification model on http://" in err


def test_serve_refuses_an_empty_key_and_a_length_past_the_model_and_stops_its_worker(serve_spy, minilm_dir, capsys,
                                                                                    monkeypatch):
    import uvicorn

    code, _, err = cli(capsys, "serve", "--model", minilm_dir, "--api-key", " ")
    assert code == 2 and err.startswith("torchbert: error: --api-key is empty"), err
    monkeypatch.setenv("TORCHBERT_API_KEY", "")
    code, _, err = cli(capsys, "serve", "--model", minilm_dir)
    assert code == 2 and "$TORCHBERT_API_KEY is set but empty" in err, err
    monkeypatch.delenv("TORCHBERT_API_KEY")
    code, _, err = cli(capsys, "serve", "--model", minilm_dir, "--max-length", "513")
    assert code == 2 and "--max-length must be in [2, 512] for this model, got 513" in err, err
    assert "spec" not in serve_spy  # refused before anything is built

    def fails(app, **kw):
        raise OSError("address already in use")

    monkeypatch.setattr(uvicorn, "run", fails)
    code, _, err = cli(capsys, "serve", "--model", minilm_dir)
    assert code != 0 and serve_spy["shutdown"] == [{"wait": True, "cancel_futures": True}]


# -- benchmark: what it hands the planner and the runner, and what it refuses first -------------------


@pytest.fixture
def bench_spy(monkeypatch):
    import torchbert.apps.benchmark

    seen = {}

    def plan(suite, models, data, out, protocol, tasks=None, max_train=None, log=print, precision="fp32"):
        seen["plan"] = dict(suite=suite, models=models, data=data, out=out, protocol=protocol, tasks=tasks,
                            max_train=max_train, precision=precision)
        return "the plan"

    def run(plan, text, max_train=None, log=print, on_done=None, device="auto", runner=None):
        seen["run"] = dict(plan=plan, max_train=max_train, device=device, runner=runner)
        return {}

    monkeypatch.setattr(torchbert.apps.benchmark, "plan_benchmark", plan)
    monkeypatch.setattr(torchbert.apps.benchmark, "run_benchmark", run)
    return seen


def test_benchmark_hands_on_its_flags(bench_spy, minilm_dir, tmp_path, capsys, kept_memory):
    from torchbert.apps.benchmark import PROTOCOLS

    (tmp_path / "glue").mkdir()
    code, _, err = cli(capsys, "benchmark", "glue", "--model", f"a={minilm_dir}", f"{minilm_dir}/", "--data",
                       tmp_path / "glue", "--tasks", "RTE", "MRPC", "--max-train", "5", "--precision", "bf16",
                       "--device", "cpu", "--out", tmp_path / "b")
    assert code == 0, err
    plan, run = bench_spy["plan"], bench_spy["run"]
    assert plan == dict(suite="glue", models={"a": minilm_dir, minilm_dir.name: minilm_dir}, data=tmp_path / "glue",
                        out=tmp_path / "b", protocol=PROTOCOLS["paper"][0], tasks=["RTE", "MRPC"], max_train=5,
                        precision="bf16")
    assert run == dict(plan="the plan", max_train=5, device="cpu", runner=None) and kept_memory == [True]
    code, _, err = cli(capsys, "benchmark", "local", "--model", minilm_dir, "--jobs", "2", "--out", tmp_path / "j")
    assert code == 0 and callable(bench_spy["run"]["runner"]), err  # two runs side by side, in workers
    assert bench_spy["run"]["device"] == "auto"


def test_benchmark_quiet_prints_the_table_and_nothing_before_it(monkeypatch, minilm_dir, tmp_path, capsys,
                                                                kept_memory):
    """benchmark had no --quiet, though every other long command has one: with it, no line per run (the
    stages' log), only the table at the end; without it, both."""
    import torchbert.apps.benchmark
    import torchbert.apps.benchmark_table

    def run(plan, text, max_train=None, log=print, on_done=None, device="auto", runner=None):
        log("== a run's line")
        log("\n" + "THE TABLE")  # as _finish logs it
        return {"the": "summary"}

    monkeypatch.setattr(torchbert.apps.benchmark, "plan_benchmark", lambda *a, log=print, **k: log("planned") or "p")
    monkeypatch.setattr(torchbert.apps.benchmark, "run_benchmark", run)
    monkeypatch.setattr(torchbert.apps.benchmark_table, "summary_markdown",
                        lambda summary: "THE TABLE" if summary == {"the": "summary"} else "?")
    code, out, err = cli(capsys, "benchmark", "local", "--model", minilm_dir, "--out", tmp_path / "q", "--quiet")
    assert code == 0 and out == "THE TABLE\n", (out, err)
    code, out, err = cli(capsys, "benchmark", "local", "--model", minilm_dir, "--out", tmp_path / "l")
    assert code == 0 and "planned" in out and "== a run's line" in out and out.count("THE TABLE") == 1, out


@pytest.mark.parametrize("flags, message", [
    (["--model", "=x"], "--model =x: expected a model, or NAME=MODEL"),
    (["--model", "a="], "--model a=: expected a model, or NAME=MODEL"),
    (["--model", "minilm", "minilm"], "--model: two models are named 'minilm'; name them apart with NAME=MODEL"),
    (["--model", "minilm", "--max-train", "5"], "--max-train: the retrieval suite fine-tunes nothing"),
    (["--model", "minilm", "--protocol", "paper"], "--protocol: the retrieval suite fine-tunes nothing"),
    (["--model", "minilm", "--precision", "bf16"], "--precision: the retrieval suite fine-tunes nothing"),
])
def test_benchmark_refuses_bad_models_and_flags_of_training_before_it_plans(bench_spy, tmp_path, capsys, flags,
                                                                           message):
    code, _, err = cli(capsys, "benchmark", "retrieval", "--out", tmp_path / "b", *flags)
    assert code == 2 and err.startswith("torchbert: error: " + message), err
    assert "plan" not in bench_spy and not (tmp_path / "b").exists()


def test_benchmark_keeps_its_output_apart_from_its_inputs_and_resumes_only_its_own(bench_spy, minilm_dir, tmp_path,
                                                                                  capsys):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(minilm_dir, model)
    (tmp_path / "glue").mkdir()
    code, _, err = cli(capsys, "benchmark", "glue", "--model", model, "--data", tmp_path / "glue", "--out",
                       model / "bench")
    assert code == 2 and f"the input --model {model}" in err, err
    code, _, err = cli(capsys, "benchmark", "glue", "--model", model, "--data", tmp_path / "glue", "--out",
                       tmp_path / "glue" / "bench")
    assert code == 2 and f"the input --data {tmp_path / 'glue'}" in err, err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    code, _, err = cli(capsys, "benchmark", "glue", "--model", model, "--data", tmp_path / "glue", "--out",
                       tmp_path / "mine", "--resume")
    assert code == 2 and "holds no earlier benchmark to resume" in err, err
    assert "run" not in bench_spy and sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]
    assert not (model / "bench").exists() and not (tmp_path / "glue" / "bench").exists()
