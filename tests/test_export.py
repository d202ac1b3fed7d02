"""`torchbert export`: ONNX graphs of real weights and of each task head, equal to PyTorch in
onnxruntime on other shapes than the traced ones; INT8 close to fp32; bad arguments refused."""

import json

import numpy as np
import pytest
import realdata

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


@pytest.fixture(scope="module")
def minilm_onnx(minilm_dir, tmp_path_factory):
    from torchbert.cli import main

    out = tmp_path_factory.mktemp("onnx") / "minilm"
    assert main(["export", "--model", str(minilm_dir), "--out", str(out), "--int8"]) == 0
    return out


def test_the_encoder_graph_equals_pytorch_and_transformers_on_new_shapes(minilm_onnx, minilm_dir):
    import torch
    import transformers

    from torchbert.tokenizer import BertTokenizer

    report = json.loads((minilm_onnx / "export.json").read_text())
    assert report["kind"] == "encoder" and max(report["max_abs_diff_fp32"].values()) < 1e-4
    for f in ("model.onnx", "model.int8.onnx", "config.json", "vocab.txt"):
        assert (minilm_onnx / f).is_file(), f
    tok = BertTokenizer.from_pretrained(minilm_onnx)  # the folder carries its tokenizer
    texts = list(realdata.english_texts()[10:13]) + list(realdata.peoples_daily_sentences()[10:13])
    enc = tok(texts, padding=True, truncation=True, max_length=128, return_tensors="np")
    feed = {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
    hidden, pooled = ort.InferenceSession(str(minilm_onnx / "model.onnx")).run(None, feed)
    with torch.no_grad():
        theirs = transformers.BertModel.from_pretrained(minilm_dir).eval()(**{k: torch.from_numpy(v)
                                                                             for k, v in feed.items()})
    mask = feed["attention_mask"].astype(bool)
    assert np.abs(hidden[mask] - theirs.last_hidden_state.numpy()[mask]).max() < 1e-4
    assert np.abs(pooled - theirs.pooler_output.numpy()).max() < 1e-4
    q_hidden, _ = ort.InferenceSession(str(minilm_onnx / "model.int8.onnx")).run(None, feed)
    mean = [(h[m].mean(0), r[m].mean(0)) for h, r, m in zip(q_hidden, hidden, mask)]  # sentence embeddings
    cos = [float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in mean]
    assert min(cos) > 0.975 and report["int8"]["last_hidden_state"]["cosine"] > 0.9, cos


@pytest.mark.parametrize("task", ["classification", "token", "qa", "multiple-choice"])
def test_each_task_head_exports_and_matches(task, minilm_dir, tmp_path):
    """A tiny BERT under each head, fine-tuned for a few steps, exported and checked."""
    from clihelp import squad_file, tiny_bert, write_conll

    from torchbert.cli import main

    base = tiny_bert(tmp_path / "base", minilm_dir)
    en = list(realdata.english_texts()[:8])
    if task == "token":
        path = tmp_path / "t.conll"
        write_conll(path, [(list(w), t) for w, t in realdata.wnut_sentences()[:8]])
    elif task == "qa":
        path = tmp_path / "t.json"
        squad_file(path, [(c, "what?", c.split()[1]) for c in en if len(c.split()) > 2], v2=False)
    elif task == "multiple-choice":
        path = tmp_path / "t.jsonl"
        path.write_text("".join(json.dumps({"context": a, "choices": [b, "no"], "label": i % 2}) + "\n"
                                for i, (a, b) in enumerate(zip(en, en[1:]))), encoding="utf-8")
    else:
        path = tmp_path / "t.jsonl"
        path.write_text("".join(json.dumps({"text": t, "label": str(i % 2)}) + "\n" for i, t in enumerate(en)),
                        encoding="utf-8")
    run = tmp_path / "run"
    assert main(["finetune", "--task", task, "--model", str(base), "--train", str(path), "--dev", str(path),
                 "--out", str(run), "--epochs", "1", "--batch-size", "4", "--max-length", "32", "--quiet"]) == 0
    assert main(["export", "--model", str(run), "--out", str(tmp_path / "onnx")]) == 0
    report = json.loads((tmp_path / "onnx" / "export.json").read_text())
    assert report["kind"] == task and max(report["max_abs_diff_fp32"].values()) < 1e-4
    want = ["start_logits", "end_logits"] if task == "qa" else ["logits"]
    assert report["outputs"] == want
    assert [o.name for o in ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx")).get_outputs()] == want


def test_export_refuses_bad_arguments_and_keeps_the_folder(minilm_onnx, minilm_dir, capsys):
    from clihelp import cli

    before = sorted(p.name for p in minilm_onnx.iterdir())
    code, _, err = cli(capsys, "export", "--model", minilm_dir, "--out", minilm_onnx)
    assert code == 2 and "pass --overwrite" in err
    code, _, err = cli(capsys, "export", "--model", minilm_dir, "--out", minilm_onnx, "--overwrite", "--opset", "9")
    assert code == 2 and "--opset must be in [13, 23]" in err
    code, _, err = cli(capsys, "export", "--model", minilm_dir, "--out", minilm_dir, "--overwrite")
    assert code == 2 and "--out" in err
    assert sorted(p.name for p in minilm_onnx.iterdir()) == before
