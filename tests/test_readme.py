"""The README's Python API block runs as written, and what it saves is what transformers loads."""

import contextlib
import io
import os
import re
from pathlib import Path

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
