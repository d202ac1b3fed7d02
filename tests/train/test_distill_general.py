"""General distillation (`pretrain --objective distill`, train/objectives.py RelationDistillTask): a
student learns MLM beside a pretrained teacher's self-attention relations over a prepared corpus. Its
parts against the plain computations, nothing to learn from a teacher that is the student, the
relation heads that fit two widths, and a run through the command line that fine-tunes like any."""

import json

import pytest
import torch
from clihelp import cli

from test_objectives import _ce_sum, toy_batch
from torchbert import BertConfig
from torchbert.heads import BertForMaskedLM, BertForSequenceClassification
from torchbert.model import BertModel
from torchbert.tokenizer import BertTokenizer
from torchbert.train.distill_losses import last_qkv, relation_heads, relation_loss
from torchbert.train.objectives import PRETRAINING, RelationDistillTask


def save_teacher(folder, vocab_size=40, tokenizer=None, width=32, heads=4):
    config = BertConfig(vocab_size=vocab_size, hidden_size=width, num_hidden_layers=2, num_attention_heads=heads,
                        intermediate_size=2 * width, max_position_embeddings=128)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def test_the_relation_heads_divide_both_widths():
    assert relation_heads(384, 384, 12) == 12  # the teacher's heads where they fit
    assert relation_heads(384, 128, 12) == 8  # MiniLM to BERT-tiny: the most below 12 that divide both
    assert relation_heads(768, 384, 12) == 12
    assert relation_heads(32, 20, 4) == 4 and relation_heads(30, 7, 6) == 1


def test_general_distillation_is_mlm_plus_the_teachers_relations(tmp_path):
    teacher = save_teacher(tmp_path / "teacher")
    batch = toy_batch()
    task = RelationDistillTask(str(teacher), relation_weight=2.0)
    assert task.weights == {"relation": 2.0} and task.counts(batch) == {"mlm": 3, "relation": 3}
    torch.manual_seed(1)
    student = BertForMaskedLM(BertConfig.from_name("tiny", vocab_size=40)).eval()  # 128 wide, the teacher 32
    parts = task.forward(student, batch)
    with torch.no_grad():
        inputs = dict(token_type_ids=batch.token_type_ids, cu_seqlens=batch.cu_seqlens, max_seqlen=batch.max_seqlen)
        out = student(batch.input_ids, **inputs, mlm_positions=batch.mlm_positions, output_hidden_states=True)
        mine = student.bert(batch.input_ids, **inputs, output_hidden_states=True).hidden_states
        theirs = task.teacher(batch.input_ids, **inputs, output_hidden_states=True).hidden_states
        want = relation_loss(last_qkv(student, mine), last_qkv(task.teacher, theirs), batch.cu_seqlens,
                             batch.max_seqlen, 4)
    assert parts["mlm"][0].item() == pytest.approx(_ce_sum(out.mlm_logits, batch.mlm_labels).item(), rel=1e-5)
    assert parts["relation"][0].item() == pytest.approx(want.item(), rel=1e-5) and want.item() > 0
    parts["relation"][0].backward()
    assert student.bert.layers[-1].attention.qkv.weight.grad.abs().sum() > 0  # the student learns them
    assert all(p.grad is None for p in task.teacher.parameters())  # the teacher does not
    # a student that is the teacher has nothing to learn from it
    same = BertForMaskedLM.from_pretrained(teacher).eval()
    assert abs(task.forward(same, batch)["relation"][0].item()) < 1e-5


@pytest.mark.e2e
def test_pretrain_distill_writes_a_bert_that_fine_tunes(prepared, tmp_path, capsys):
    tok = BertTokenizer.from_pretrained(prepared / "tok")
    teacher = save_teacher(tmp_path / "teacher", tok.vocab_size, tok)
    run = tmp_path / "run"
    args = ["pretrain", "--data", prepared / "data", "--out", run, "--config", "tiny", "--objective", "distill",
            "--teacher", teacher, "--relation-weight", "3", "--batch-size", "8", "--steps", "6", "--warmup-steps", "2",
            "--log-every", "2", "--eval-data", prepared / "eval", "--eval-every", "3", "--quiet"]
    code, out, err = cli(capsys, *args)
    assert code == 0, err
    assert "relation KL to the teacher" in out and "MLM accuracy" in out
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["relation_loss"] > 0 and "relation_accuracy" not in r for r in rows)
    assert "eval_relation_loss" in rows[-1] and "eval_relation_accuracy" not in rows[-1]
    record = json.loads((run / "torchbert.json").read_text())
    assert record["objective"] == "distill" and record["settings"] == {"teacher": str(teacher), "relation_weight": 3.0}
    BertForSequenceClassification.from_pretrained(run, labels=["a", "b"])  # a BERT like any, to fine-tune
    # a teacher of another vocabulary is refused before any step
    other = save_teacher(tmp_path / "other", 40, None)
    (other / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefgh"]) + "\n",
                                     encoding="utf-8")
    code, _, err = cli(capsys, *[str(a) for a in args[:4]], str(tmp_path / "run2"), "--objective", "distill",
                       "--teacher", str(other), "--steps", "1", "--quiet")
    assert code == 2 and "vocab mismatch" in err
    assert PRETRAINING["distill"].model_class is BertForMaskedLM


@pytest.mark.e2e
def test_prepare_and_pretrain_take_a_model_by_name_as_model_does(tmp_path, capsys, minilm_dir):
    import realdata

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(realdata.english_texts()[i:i + 4]) for i in range(0, 120, 4)) + "\n",
                      encoding="utf-8")
    code, _, err = cli(capsys, "prepare", "--corpus", corpus, "--tokenizer", "minilm", "--out", tmp_path / "data",
                       "--max-seq-len", "64", "--quiet")
    assert code == 0, err
    assert (tmp_path / "data" / "vocab.txt").read_text() == (minilm_dir / "vocab.txt").read_text()
    code, out, err = cli(capsys, "pretrain", "--data", tmp_path / "data", "--out", tmp_path / "run", "--init", "minilm",
                         "--objective", "mlm", "--steps", "1", "--batch-size", "4", "--quiet")
    assert code == 0, err
    code, _, err = cli(capsys, "prepare", "--corpus", corpus, "--tokenizer", tmp_path / "nowhere", "--out",
                       tmp_path / "d2", "--quiet")
    assert code == 2 and "--tokenizer" in err and "not a folder" in err
