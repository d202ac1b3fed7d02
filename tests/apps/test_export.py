"""`torchbert export`: ONNX graphs of real weights and of each task head, equal to PyTorch in
onnxruntime on other shapes than the traced ones; INT8 close to fp32; bad arguments refused."""

import json
import re

import numpy as np
import pytest
import realdata
from parity import assert_parity

pytestmark = pytest.mark.e2e  # whole commands end to end: `bash scripts/test.sh --fast` leaves them out

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
    assert_parity(hidden[mask], theirs.last_hidden_state.numpy()[mask])
    assert_parity(pooled, theirs.pooler_output.numpy())
    q_hidden, _ = ort.InferenceSession(str(minilm_onnx / "model.int8.onnx")).run(None, feed)
    mean = [(h[m].mean(0), r[m].mean(0)) for h, r, m in zip(q_hidden, hidden, mask)]  # sentence embeddings
    cos = [float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in mean]
    assert min(cos) > 0.975 and report["int8"]["last_hidden_state"]["cosine"] > 0.9, cos


def test_int8_keeps_the_feed_forward_down_projections_in_fp32(minilm_onnx):
    import onnx

    graph = onnx.load(str(minilm_onnx / "model.int8.onnx")).graph
    shapes = {w.name: tuple(w.dims) for w in graph.initializer}
    fp32 = sorted(shapes[x] for n in graph.node if n.op_type == "MatMul" for x in n.input if x in shapes)
    quantized = [n for n in graph.node if n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul")]
    assert fp32 == [(1536, 384)] * 6  # MiniLM: 6 layers, intermediate 1536, hidden 384
    assert len(quantized) == 6 * 3 + 1  # q/k/v (one product), attention output, up projection; the pooler


@pytest.mark.parametrize("task", ["classification", "token", "qa", "multiple-choice", "embedding", "reranker"])
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
    elif task in ("embedding", "reranker"):
        path = tmp_path / "t.jsonl"
        path.write_text("".join(json.dumps({"query": a, "positive": b}) + "\n" for a, b in zip(en, en[1:])),
                        encoding="utf-8")
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
    want = {"qa": ["start_logits", "end_logits"], "embedding": ["embeddings"]}.get(task, ["logits"])
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


def test_quantizing_drops_onnx_runtimes_advice_alone_and_leaves_the_root_logger_as_it_was(minilm_onnx, tmp_path,
                                                                                          caplog):
    import logging

    from torchbert.config import BertConfig
    from torchbert.io.onnx import quantize_int8

    root = logging.getLogger()
    filters = list(root.filters)
    with caplog.at_level(logging.INFO):
        quantize_int8(minilm_onnx / "model.onnx", tmp_path / "q.onnx", BertConfig.load(minilm_onnx / "config.json"))
    assert (tmp_path / "q.onnx").stat().st_size < (minilm_onnx / "model.onnx").stat().st_size / 2
    assert not [r for r in caplog.records if "pre-processing" in r.getMessage()], caplog.text
    assert root.filters == filters
    logging.warning("Please consider to run pre-processing before quantization")  # someone else's, after
    assert caplog.records[-1].getMessage() == "Please consider to run pre-processing before quantization"


def test_smoothing_for_int8_keeps_the_outputs_and_evens_out_the_channels(minilm_dir):
    """fast.int8.smoothed: the same model in exact arithmetic (real weights, real text, rotary positions too),
    and the inputs of the smoothed products nearer one scale: their largest channel over their median."""
    import torch

    from torchbert.fast.int8 import Smoothed, smoothed
    from torchbert.model import BertModel
    from torchbert.tokenizer import BertTokenizer

    model = BertModel.from_pretrained(minilm_dir).eval()
    tok = BertTokenizer.from_pretrained(minilm_dir)
    texts = list(realdata.english_texts()[30:34]) + list(realdata.peoples_daily_sentences()[30:34])
    enc = tok(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    even = smoothed(model)
    assert [type(layer.attention.qkv) for layer in model.layers] == [torch.nn.Linear] * 6  # a copy
    assert all(isinstance(layer.ffn.up, Smoothed) and isinstance(layer.attention.qkv, Smoothed) for layer in even.layers)
    spread = {}

    def record(module, inputs, name):
        x = inputs[0].abs().reshape(-1, inputs[0].shape[-1]).amax(0)
        spread[name] = float(x.max() / x.median())

    hooks = [m.register_forward_pre_hook(lambda mod, i, n=n: record(mod, i, n)) for n, m in
             [("before", model.layers[3].ffn.up), ("after", even.layers[3].ffn.up.linear)]]
    with torch.no_grad():
        want, got = model(**enc), even(**enc)
    for h in hooks:
        h.remove()
    mask = enc["attention_mask"].bool()
    assert_parity(got.last_hidden_state[mask], want.last_hidden_state[mask])
    assert_parity(got.pooler_output, want.pooler_output)
    assert spread["after"] < spread["before"] / 2, spread
    import copy

    config = copy.copy(model.config)
    config.position_embedding_type = "rotary"  # v's rows carry the output projection's scales: exact too
    rotary = BertModel(config).eval()
    with torch.no_grad():
        assert_parity(smoothed(rotary)(**enc).last_hidden_state[mask], rotary(**enc).last_hidden_state[mask])


def test_the_onnx_encoder_stands_in_for_bert_model_padded_packed_and_at_positions(minilm_dir):
    """fast.int8.OnnxEncoder with fp32 weights equals BertModel; with INT8 it stays close."""
    import copy

    import torch

    from torchbert.fast.int8 import int8
    from torchbert.model import BertModel
    from torchbert.packing import pack
    from torchbert.tokenizer import BertTokenizer

    model = BertModel.from_pretrained(minilm_dir).eval()
    tok = BertTokenizer.from_pretrained(minilm_dir)
    texts = list(realdata.english_texts()[20:23]) + list(realdata.peoples_daily_sentences()[20:23])
    ids = tok.encode_ids(texts, max_length=64, truncation=True)
    flat, cu, longest = pack(ids)
    enc = tok(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    positions = torch.tensor([0, 3, 7, int(cu[-1]) - 1])
    with torch.no_grad():
        want_packed = model(flat, cu_seqlens=cu, max_seqlen=longest)
        want_padded = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        want_rows = model(flat, cu_seqlens=cu, max_seqlen=longest, output_positions=positions)
        onnx = int8(copy.deepcopy(model), quantize=False)
        packed = onnx(flat, cu_seqlens=cu, max_seqlen=longest)
        padded = onnx(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        rows = onnx(flat, cu_seqlens=cu, max_seqlen=longest, output_positions=positions)
    mask = enc["attention_mask"].bool()
    assert_parity(packed.last_hidden_state, want_packed.last_hidden_state)
    assert_parity(padded.last_hidden_state[mask], want_padded.last_hidden_state[mask])
    assert_parity(rows.last_hidden_state, want_rows.last_hidden_state)
    assert_parity(packed.pooler_output, want_packed.pooler_output)
    with pytest.raises(ValueError, match="last layer only"):
        onnx(flat, cu_seqlens=cu, max_seqlen=longest, output_hidden_states=True)

    from torchbert.features import embed_ids

    quantized = int8(copy.deepcopy(model))
    texts = list(realdata.english_texts()[:100]) + list(realdata.peoples_daily_sentences()[:100])
    ids = tok.encode_ids(texts, max_length=128, truncation=True)
    cos = (embed_ids(quantized, ids, normalize=True) * embed_ids(model, ids, normalize=True)).sum(1)
    # the sentence embeddings' cosine to fp32: 0.9966 on average, 0.989 at least, smoothed (fast/int8.py);
    # 0.9933 and 0.986 with the weights of the unsmoothed model in 8 bits
    assert cos.mean() > 0.995 and cos.min() > 0.985, (cos.mean(), cos.min())


def test_embed_and_predict_take_int8(minilm_dir, tmp_path, capsys, monkeypatch):
    """On a CPU without native bf16 (mocked), where --int8 says what its products measured."""
    from clihelp import cli, tiny_bert

    from torchbert import hardware

    monkeypatch.setattr(hardware, "cpu", lambda: hardware.CPU("AVX2 only", frozenset({"avx2", "fma"})))
    (tmp_path / "in.txt").write_text("\n".join(realdata.peoples_daily_sentences()[:6]) + "\n", encoding="utf-8")
    code, _, err = cli(capsys, "embed", "--model", minilm_dir, "--input", tmp_path / "in.txt", "--out",
                       tmp_path / "q.npy", "--int8", "--normalize", "--quiet")
    assert code == 0, err
    assert "note: --int8: INT8 products measured 1.20x fp32's speed on this CPU (AVX2)" in err
    cosine = re.search(r"note: --int8: cosine to fp32 on the first 6 texts: mean (\S+), least (\S+)\n", err)
    code, _, _ = cli(capsys, "embed", "--model", minilm_dir, "--input", tmp_path / "in.txt", "--out",
                     tmp_path / "f.npy", "--normalize", "--quiet")
    q, f = np.load(tmp_path / "q.npy"), np.load(tmp_path / "f.npy")
    assert q.shape == f.shape and (q * f).sum(1).min() > 0.97
    assert abs(float(cosine[1]) - (q * f).sum(1).mean()) < 1e-3 and abs(float(cosine[2]) - (q * f).sum(1).min()) < 1e-3
    code, _, err = cli(capsys, "embed", "--model", minilm_dir, "--input", tmp_path / "in.txt", "--out",
                       tmp_path / "x.npy", "--int8", "--layers", "sum_all")
    assert code == 2 and "--int8 gives the last layer only" in err

    base = tiny_bert(tmp_path / "base", minilm_dir)
    data = tmp_path / "t.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": str(i % 2)}) + "\n"
                            for i, t in enumerate(realdata.english_texts()[:8])), encoding="utf-8")
    assert cli(capsys, "finetune", "--task", "classification", "--model", base, "--train", data, "--dev", data,
               "--out", tmp_path / "run", "--epochs", "1", "--quiet")[0] == 0
    for extra in ((), ("--int8",)):
        code, _, err = cli(capsys, "predict", "--model", tmp_path / "run", "--input", data, "--out",
                           tmp_path / f"p{len(extra)}.jsonl", "--quiet", *extra)
        assert code == 0, err
    fp32, q8 = ([json.loads(x) for x in (tmp_path / f"p{k}.jsonl").read_text().splitlines()] for k in (0, 1))
    assert len(q8) == len(fp32) == 8
    assert max(abs(a["probability"] - b["probability"]) for a, b in zip(q8, fp32)) < 0.05
    code, out, err = cli(capsys, "evaluate", "--model", tmp_path / "run", "--data", data, "--int8", "--quiet")
    assert code == 0 and "accuracy" in json.loads(out), err


def test_a_feature_based_tagger_is_refused_in_words(tmp_path, capsys):
    """A `finetune --frozen` run (a BiLSTM over a frozen encoder's features) has no graph export can
    trace; it said so only as an unexpected torch.export error."""
    from dataclasses import asdict

    from clihelp import cli

    from torchbert import BertConfig
    from torchbert.io.record import RunRecord, write_record
    from torchbert.tasks.feature_tagger import FeatureTagger, TaggerSettings

    config = BertConfig.from_name("tiny", vocab_size=100)
    config.extra["id2label"] = {"0": "O", "1": "B-PER"}
    settings = TaggerSettings(kind="bilstm", strategy="last", lstm_size=8)
    run = tmp_path / "frozen"
    FeatureTagger(config, settings).save_pretrained(run)
    write_record(run, RunRecord("finetune", task={"type": "token", "tagger": asdict(settings)}))
    code, _, err = cli(capsys, "export", "--model", run, "--out", tmp_path / "onnx")
    assert code == 2 and "a feature-based tagger (finetune --frozen) does not export" in err, err
    assert not (tmp_path / "onnx").exists()


def test_the_check_runs_on_other_shapes_reports_its_worst_int8_row_and_refuses_a_graph_past_tolerance(
        minilm_onnx, minilm_dir, tmp_path, monkeypatch):
    """export.json: the fp32 check ran on 8 texts of more than the 16 traced tokens; int8's cosine_min is
    the worst row, under the mean; the weights of the quantized products are per output channel (one
    scale each); and a graph further from PyTorch than the tolerance writes nothing."""
    import onnx
    from onnx import numpy_helper

    import torchbert.apps.export as export

    report = json.loads((minilm_onnx / "export.json").read_text())
    assert report["checked_on"]["batch"] == 8 and report["checked_on"]["sequence"] > 16
    closeness = report["int8"]["last_hidden_state"]
    assert closeness["cosine_min"] < closeness["cosine"]
    graph = onnx.load(str(minilm_onnx / "model.int8.onnx")).graph
    values = {w.name: numpy_helper.to_array(w) for w in graph.initializer}
    zero_points = [values[n.input[3]] for n in graph.node if n.op_type == "MatMulInteger" and n.input[3] in values]
    assert zero_points and all(z.size > 1 for z in zero_points)  # per channel: [out_features]

    monkeypatch.setattr(export, "TOLERANCE", 0.0)
    with pytest.raises(RuntimeError, match="differs from PyTorch by .* nothing was written"):
        export.export_onnx(minilm_dir, tmp_path / "strict", log=lambda _: None)
    assert not (tmp_path / "strict").exists()


def test_a_pair_tasks_sample_is_pairs(minilm_dir):
    from torchbert.apps.export import _texts, sample_inputs
    from torchbert.tokenizer import BertTokenizer

    tok = BertTokenizer.from_pretrained(minilm_dir)
    assert sample_inputs(tok, "pair", _texts()[:4], 32)["token_type_ids"].max() == 1
    assert sample_inputs(tok, "encoder", _texts()[:4], 32)["token_type_ids"].max() == 0
