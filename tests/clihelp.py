"""Small helpers the command-line tests share."""

import json

from torchbert.apps.samples import conll_text
from torchbert.cli import main


def cli(capsys, *argv):
    """Run `torchbert ARGV...` in this process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def write_conll(path, sentences):
    """(words, tags) sentences as CoNLL: word TAB tag per line, a blank line after each sentence."""
    path.write_text(conll_text(sentences), encoding="utf-8")


def squad_file(path, items, v2, first=0):
    """items: (context, question, answer or None); ids q{first}, q{first + 1}, ..."""
    paragraphs = []
    for i, (context, question, answer) in enumerate(items, start=first):
        qa = {"id": f"q{i}", "question": question, "answers": []}
        if answer is not None:
            qa["answers"] = [{"text": answer, "answer_start": context.index(answer)}]
        if v2:
            qa["is_impossible"] = answer is None
        paragraphs.append({"context": context, "qas": [qa]})
    path.write_text(json.dumps({"version": "v2.0" if v2 else "1.1", "data": [{"title": "t", "paragraphs":
                                                                                 paragraphs}]}), encoding="utf-8")


def jsonl(path, rows: list) -> None:
    """JSON Lines, one row a line, in UTF-8 (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def tiny_bert(folder, minilm_dir, dropout: float = 0.1, seed: int = 0, positions: int = 512):
    """A tiny random BERT (2 layers, hidden 128) with MiniLM's vocab and tokenizer files: fine-tuning
    runs through every real code path in seconds."""
    import torch

    from torchbert import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig.from_name("tiny", vocab_size=30522, hidden_dropout_prob=dropout,
                               attention_probs_dropout_prob=dropout, max_position_embeddings=positions)
    BertModel(cfg).save_pretrained(folder)
    return with_tokenizer(folder, minilm_dir)


def with_tokenizer(folder, minilm_dir):
    """`folder` with MiniLM's tokenizer files copied in."""
    import shutil

    for f in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if (minilm_dir / f).is_file():
            shutil.copyfile(minilm_dir / f, folder / f)
    return folder


def assert_served_like_predict(run, inputs, predicted):
    """`torchbert serve` of a fine-tuned run folder answers POST /predict for `inputs` with the records
    of `torchbert predict` (`predicted`, read from its output file; ids aside, the same fields, the
    numbers at parity), and refuses /v1/embeddings when the model has no BERT encoder."""
    from starlette.testclient import TestClient

    from torchbert.apps.batcher import Limits
    from torchbert.apps.endpoints import Predictor
    from torchbert.apps.serve import create_app

    with TestClient(create_app(Predictor(run, name="m"), Limits())) as c:
        r = c.post("/predict", json={"inputs": inputs})
        assert r.status_code == 200, r.text
        assert c.post("/v1/embeddings", json={"input": "x"}).status_code == 404
    assert_same_records(*([{k: v for k, v in x.items() if k != "id"} for x in side]
                          for side in (r.json()["predictions"], predicted)))


def assert_same_records(got: list[dict], want: list[dict]) -> None:
    """Prediction records alike in every field, word, label and index, their numbers (probabilities,
    scores: fp32, computed by two processes) at parity."""
    import numpy as np
    from parity import assert_parity

    assert len(got) == len(want)
    (got_rest, got_numbers), (want_rest, want_numbers) = _numbers_apart(got), _numbers_apart(want)
    assert got_rest == want_rest
    if want_numbers:
        assert_parity(np.array(got_numbers, np.float32), np.array(want_numbers, np.float32))


def _numbers_apart(value, numbers=None):
    """(value with each float replaced by a placeholder, the floats in order)."""
    numbers = [] if numbers is None else numbers
    if isinstance(value, float):
        numbers.append(value)
        return "<float>", numbers
    if isinstance(value, dict):
        return {k: _numbers_apart(v, numbers)[0] for k, v in value.items()}, numbers
    if isinstance(value, list):
        return [_numbers_apart(v, numbers)[0] for v in value], numbers
    return value, numbers
