"""torchbert embed, end to end through the command line, with good and bad input."""

import json

import numpy as np
import pytest
import realdata
from parity import assert_parity
from safetensors.numpy import load_file

from torchbert import BertModel
from torchbert.cli import build_parser, main
from torchbert.features import embed
from torchbert.tokenizer import BertTokenizer

TEXTS = list(realdata.english_texts()[:30]) + list(realdata.peoples_daily_sentences()[:30])


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def expected(minilm_dir):
    model = BertModel.from_pretrained(minilm_dir).eval()
    return embed(model, BertTokenizer.from_pretrained(minilm_dir), TEXTS, pooling="mean", normalize=True)


def test_embed_txt_to_npy(tmp_path, capsys, minilm_dir, expected):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    code, out, _ = run(capsys, "embed", "--model", str(minilm_dir), "--input", str(src), "--out",
                       str(tmp_path / "e.npy"), "--normalize", "--batch-size", "7", "--quiet", "--show-neighbours", "2",
                       "--precision", "fp32")
    assert code == 0
    got = np.load(tmp_path / "e.npy")
    assert got.shape == (60, 384)
    assert_parity(got, expected)
    assert_parity(np.linalg.norm(got, axis=1), np.ones(len(got), np.float32))
    assert "wrote" in out and "60 x 384" in out and out.count("-> ") == 2


def test_embed_jsonl_to_safetensors_with_minilm_alias(tmp_path, capsys, expected):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n" for i, t in enumerate(TEXTS)))
    code, _, _ = run(capsys, "embed", "--model", "minilm", "--input", str(src), "--out", str(tmp_path / "e.safetensors"),
                     "--normalize", "--quiet", "--precision", "fp32")
    assert code == 0
    got = load_file(tmp_path / "e.safetensors")["embeddings"]
    assert_parity(got, expected)


def test_embed_reads_the_jsonl_field_text_field_names(tmp_path, capsys, expected):
    src = tmp_path / "pairs.jsonl"
    src.write_text("".join(json.dumps({"query": t, "positive": "x"}, ensure_ascii=False) + "\n" for t in TEXTS))
    code, _, _ = run(capsys, "embed", "--model", "minilm", "--input", str(src), "--text-field", "query", "--out",
                     str(tmp_path / "q.npy"), "--normalize", "--quiet", "--precision", "fp32")
    assert code == 0
    assert_parity(np.load(tmp_path / "q.npy"), expected)
    code, _, err = run(capsys, "embed", "--model", "minilm", "--input", str(src), "--out", str(tmp_path / "t.npy"))
    assert code == 2 and f"{src}:1: expected an object with a string 'text' field" in err
    txt = tmp_path / "in.txt"
    txt.write_text("a\n")
    code, _, err = run(capsys, "embed", "--model", "minilm", "--input", str(txt), "--text-field", "query", "--out",
                       str(tmp_path / "t.npy"))
    assert code == 2 and "--text-field query" in err and "not .jsonl" in err


def test_embed_checks_layers_against_the_model_before_reading_texts(tmp_path, capsys, minilm_dir):
    from clihelp import tiny_bert

    tiny_bert_dir = tiny_bert(tmp_path / "tiny", minilm_dir)
    src = tmp_path / "in.txt"
    src.write_text("one line\n")
    code, _, err = run(capsys, "embed", "--model", str(tiny_bert_dir), "--input", str(src), "--out",
                       str(tmp_path / "e.npy"), "--layers", "sum_last_four")
    assert code == 2 and "--layers sum_last_four: sum_last_four needs at least 4 layers; this model has 2" in err
    assert "text/s" not in err and not (tmp_path / "e.npy").exists()
    code, _, err = run(capsys, "embed", "--model", str(tiny_bert_dir), "--input", str(src), "--out",
                       str(tmp_path / "e.npy"), "--layers", "-4")
    assert code == 2 and "layer -4 out of range for a model with 2 layers" in err


def test_embed_layers_and_pooling(tmp_path, capsys, minilm_dir):
    src = tmp_path / "in.txt"
    src.write_text("one line\nanother line\n")
    code, _, _ = run(capsys, "embed", "--model", str(minilm_dir), "--input", str(src), "--out", str(tmp_path / "e.npy"),
                     "--layers", "concat_last_four", "--pooling", "cls", "--quiet")
    assert code == 0 and np.load(tmp_path / "e.npy").shape == (2, 4 * 384)


def test_non_utf8_input_names_file_and_line(tmp_path, capsys, minilm_dir):
    src = tmp_path / "bad.txt"
    src.write_bytes("fine\nalso fine\n".encode() + b"caf\xe9 au lait\n")
    out = tmp_path / "e.npy"
    code, _, err = run(capsys, "embed", "--model", str(minilm_dir), "--input", str(src), "--out", str(out))
    assert code == 2
    assert f"{src}:3: not valid UTF-8" in err and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("content,message", [
    ('{"text": "ok"}\n{"text": 5}\n', ":2: expected an object with a string 'text' field"),
    ('{"text": "ok"}\n{oops\n', ":2: not valid JSON"),
    ("", ": no texts in the file"),
])
def test_bad_jsonl(tmp_path, capsys, minilm_dir, content, message):
    src = tmp_path / "in.jsonl"
    src.write_text(content)
    code, _, err = run(capsys, "embed", "--model", str(minilm_dir), "--input", str(src), "--out", str(tmp_path / "e.npy"))
    assert code == 2 and message in err


def test_bad_arguments(tmp_path, capsys, minilm_dir):
    src = tmp_path / "in.txt"
    src.write_text("hello\n")
    base = ["embed", "--model", str(minilm_dir), "--input", str(src)]
    cases = [
        (["--out", str(tmp_path / "e.csv")], "must end in .npy or .safetensors"),
        (["--out", str(tmp_path / "e.npy"), "--layers", "top"], "unknown layer strategy 'top'"),
        (["--out", str(tmp_path / "e.npy"), "--max-length", "1000"], "--max-length must be in [2, 512]"),
        (["--out", str(tmp_path / "e.npy"), "--batch-size", "0"], "--batch-size must be >= 1"),
    ]
    for extra, message in cases:
        code, _, err = run(capsys, *base, *extra)
        assert code == 2 and message in err, (extra, err)
    code, _, err = run(capsys, "embed", "--model", str(tmp_path / "nope"), "--input", str(src), "--out", str(tmp_path / "e.npy"))
    assert code == 2 and "not a folder" in err
    code, _, err = run(capsys, "embed", "--model", str(minilm_dir), "--input", str(tmp_path / "x.txt"),
                       "--out", str(tmp_path / "e.npy"))
    assert code == 2 and "no such input file" in err
    assert not (tmp_path / "e.npy").exists()


def test_help_teaches(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["embed", "--help"])
    out = capsys.readouterr().out
    for word in ("sum_last_four", "concat_last_four", "minilm", "examples:", "--normalize"):
        assert word in out


def test_empty_lines_keep_their_rows(tmp_path, capsys, minilm_dir):
    src = tmp_path / "in.txt"
    src.write_text("first\n\n   \nlast\n")
    code, _, err = run(capsys, "embed", "--model", str(minilm_dir), "--input", str(src), "--out",
                       str(tmp_path / "e.npy"), "--quiet")
    assert code == 0 and "2 empty line(s)" in err
    got = np.load(tmp_path / "e.npy")
    assert got.shape == (4, 384)
    assert_parity(got[1], got[2])  # both are the empty text: [CLS] [SEP]
    assert np.abs(got[0] - got[1]).max() > 1e-2


def test_console_script_is_declared():
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("torchbert") == "torchbert.__main__:run"


def test_cli_reference_is_up_to_date():
    """docs/cli.md is generated from the parser's --help; a changed flag must regenerate it."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "cli_reference.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_example_in_the_help_keeps_its_line_breaks():
    """An example's continuation written as a lone backslash in a Python string joins its two lines
    into one with a run of spaces inside; the help must print it as the user would paste it."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text(encoding="utf-8")
    joined = [line for line in text.splitlines() if re.search(r"\S {4,}--", line)]
    assert not joined, joined
    assert re.search(r"\S {4,}--", "  torchbert distill --out runs/a       --student b")  # the check sees one


def test_embed_pools_and_normalizes_as_the_model_folder_says(tmp_path, capsys, minilm_dir):
    """MiniLM's sentence-transformers files say mean pooling, then Normalize: embed's defaults give
    sentence-transformers' embeddings; a --pooling that contradicts the folder is a one-line error."""
    from sentence_transformers import SentenceTransformer

    texts = ["one line", "另一行中文"]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n")
    code, out, _ = run(capsys, "embed", "--model", str(minilm_dir), "--input", str(src), "--out",
                       str(tmp_path / "e.npy"), "--quiet", "--precision", "fp32")
    assert code == 0 and "(mean pooling, layers last, normalized; computed in fp32)" in out
    want = SentenceTransformer(str(minilm_dir), device="cpu").encode(texts, convert_to_numpy=True)
    assert abs(np.load(tmp_path / "e.npy") - want).max() < 1e-5
    code, _, err = run(capsys, "embed", "--model", str(minilm_dir), "--input", str(src), "--out",
                       str(tmp_path / "f.npy"), "--pooling", "cls", "--quiet")
    last = err.strip().splitlines()[-1]  # (sentence-transformers' loading bars come before it)
    assert code == 2 and "--pooling cls:" in last
    assert "was trained to pool by mean (its 1_Pooling/config.json); leave --pooling out" in last
    assert not (tmp_path / "f.npy").exists()


def test_a_mistyped_flag_is_its_commands_error_and_names_the_flag_meant(capsys):
    with pytest.raises(SystemExit) as e:
        main(["finetune", "--task", "token", "--model", "m", "--train", "t", "--out", "o", "--epocs", "3"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "usage: torchbert finetune" in err
    assert err.strip().splitlines()[-1] == ("torchbert finetune: error: unrecognized argument: --epocs; "
                                            "did you mean --epochs?"), err
    with pytest.raises(SystemExit):  # named before argparse asks for the required flags it hid
        main(["finetune", "--task", "token", "--trian", "t.conll"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "torchbert finetune: error: unrecognized argument: --trian; did you mean --train?")
    with pytest.raises(SystemExit):  # an abbreviation argparse takes is not unknown
        main(["finetune", "--task", "token", "--epo", "3"])
    assert "required: --model, --train, --out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["vocab", "--corpus", "c.txt", "--vocab-size", "100", "--out", "o", "--zzzz"])
    assert "torchbert vocab: error: unrecognized argument: --zzzz (see torchbert vocab --help)" in \
        capsys.readouterr().err


def test_an_encoder_without_pooler_or_with_pretraining_heads_loads_without_warnings(minilm_dir, tmp_path, capsys):
    """What a sentence vector never reads (the pooler) and what a task model leaves out by design (MLM
    and NSP heads) are not warnings; the vectors are the same either way."""
    import shutil

    import transformers

    bare, heads = tmp_path / "bare", tmp_path / "heads"
    transformers.BertModel.from_pretrained(minilm_dir, add_pooling_layer=False).save_pretrained(bare)
    transformers.BertForPreTraining.from_pretrained(minilm_dir).save_pretrained(heads)
    for folder in (bare, heads):
        for name in ("vocab.txt", "tokenizer_config.json"):
            shutil.copy(minilm_dir / name, folder / name)
    # what transformers said while writing the folders is not ours (its log handler may still hold an
    # earlier test's closed stream, whose error it prints here): only torchbert's own output is judged
    capsys.readouterr()
    src = tmp_path / "texts.txt"
    src.write_text("a tweet about the weather\n北京是中国的首都。\n", encoding="utf-8")
    vectors = []
    for folder in (minilm_dir, bare, heads):
        out = tmp_path / f"{folder.name}.npy"
        code, _, err = run(capsys, "embed", "--model", str(folder), "--input", str(src), "--out", str(out),
                           "--quiet", "--precision", "fp32", "--normalize")
        assert code == 0 and "warning" not in err, err
        vectors.append(np.load(out))
    assert abs(vectors[1] - vectors[0]).max() < 1e-5 and abs(vectors[2] - vectors[0]).max() < 1e-5
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": q, "positive": p}, ensure_ascii=False) + "\n" for q, p in (
        ("weather", "a tweet about the weather"), ("首都", "北京是中国的首都。"))), encoding="utf-8")
    code, _, err = run(capsys, "evaluate", "--model", str(heads), "--task", "embedding", "--data", str(pairs),
                       "--quiet")
    assert code == 0 and "warning" not in err, err


def test_a_folder_that_is_not_a_model_says_what_it_holds_and_what_model_takes(tmp_path, capsys):
    data, tok = tmp_path / "data", tmp_path / "tok"
    data.mkdir(), tok.mkdir()
    (data / "manifest.json").write_text("{}")
    (tok / "vocab.txt").write_text("[PAD]\n")
    texts = tmp_path / "t.txt"
    texts.write_text("hello\n")
    for folder, what in ((data, "prepared pretraining data (torchbert prepare: pretrain on it with --data)"),
                         (tok, "a tokenizer only (torchbert vocab), no model")):
        code, _, err = run(capsys, "embed", "--model", str(folder), "--input", str(texts), "--out",
                           str(tmp_path / "e.npy"))
        assert code == 2 and f"--model {folder}: no config.json in this folder, which holds {what}" in err, err
        assert "--model takes a model folder" in err and err.count("\n") == 1


def test_a_model_name_is_a_folder_or_a_hub_id_and_says_which_it_was_not(tmp_path, monkeypatch):
    """A run that wrote only checkpoints says so; an existing file, a path, or a name with two slashes is
    no hub id (refused without the network); `org/name` goes to the hub, whose failure is one line."""
    import huggingface_hub

    from torchbert.commands.common import resolve_model
    from torchbert.errors import UserError

    asked = []

    def offline(name, **kw):
        asked.append(name)
        raise OSError("no network\nsecond line")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    run_folder, a_file = tmp_path / "run", tmp_path / "weights.bin"
    (run_folder / "checkpoints").mkdir(parents=True)
    a_file.write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    for name, words in ((str(run_folder), "which holds only the checkpoints of a run that has not finished"),
                        ("weights.bin", "--model weights.bin: not a folder"),
                        ("a/b/c", "--model a/b/c: not a folder"),
                        ("org/name", "--model org/name: no such folder, and the hub download failed "
                                     "(OSError: no network)")):
        with pytest.raises(UserError) as e:
            resolve_model(name)
        assert words in str(e.value) and "\n" not in str(e.value), (name, str(e.value))
    assert asked == ["org/name"]


def test_a_study_budget_of_zero_is_refused(tmp_path, capsys):
    code, _, err = run(capsys, "demo", "--out", str(tmp_path / "d"), "--budget", "0")
    assert code == 2 and "--budget must be in (0, 1000], got 0" in err and not (tmp_path / "d").exists()


def test_resume_with_overwrite_and_a_cuda_device_without_cuda_are_refused_before_any_work(tmp_path, capsys):
    import torch

    code, _, err = run(capsys, "finetune", "--task", "classification", "--model", "minilm", "--train",
                       str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "run"), "--resume", "--overwrite")
    assert code == 2 and "--resume and --overwrite contradict each other (--resume continues what is in --out" in err
    if not torch.cuda.is_available():
        from torchbert.commands.common import pick_device
        from torchbert.errors import UserError

        with pytest.raises(UserError, match=r"^--device cuda:1: no CUDA device is available$"):
            pick_device("cuda:1")
