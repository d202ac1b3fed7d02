"""evaluate and predict from Python (tasks/predict.py): what `load_finetuned` opens and refuses, and
how `predict` runs a model over a task's batches. The commands around them are held by the end-to-end
tests (train/test_finetune.py, test_failures.py); here, a classifier folder made in a second."""

import json
import shutil

import numpy as np
import pytest
import torch
from clihelp import with_tokenizer

from torchbert import BertConfig
from torchbert.errors import NonFiniteOutput
from torchbert.heads import BertForSequenceClassification
from torchbert.io.hf import with_labels
from torchbert.io.record import RunRecord, write_record
from torchbert.losses import TaskOutput
from torchbert.tasks.batches import TaskData
from torchbert.tasks.choice import ChoiceExample
from torchbert.tasks.encode import Encoded
from torchbert.tasks.families import family
from torchbert.tasks.predict import check_finite, load_finetuned, predict, run_evaluate, run_predict
from torchbert.tasks.text import TextExample

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, minilm_dir):
    """A folder as `torchbert finetune --task classification` leaves it (untrained weights): a BERT
    with a head for classes 0 and 1 (GLUE's SST-2 labels), MiniLM's tokenizer, and the run record
    naming the task."""
    folder = tmp_path_factory.mktemp("classifier")
    torch.manual_seed(0)
    config = BertConfig.from_name("tiny", vocab_size=30522, max_position_embeddings=64)
    BertForSequenceClassification(with_labels(config, ["0", "1"])).save_pretrained(folder)
    with_tokenizer(folder, minilm_dir)
    write_record(folder, RunRecord("finetune", task={"type": "classification", "max_length": 32}))
    return folder


def test_load_finetuned_opens_the_run_in_eval_mode_with_its_task_and_labels(classifier):
    model, tokenizer, ts, label_map = load_finetuned(classifier, None, CPU)
    assert not model.training and not any(m.training for m in model.modules())
    assert (ts.type, ts.max_length, ts.layout) == ("classification", 32, "auto") and label_map.labels == ["0", "1"]
    _, _, ts, _ = load_finetuned(classifier, "sst2", CPU)  # a preset of its type: that benchmark's files
    assert (ts.type, ts.preset, ts.layout) == ("classification", None, "glue-sst2")
    model, *_ = load_finetuned(classifier, None, CPU, "bf16")
    assert any(p.dtype == torch.bfloat16 for p in model.bert.parameters())


def test_load_finetuned_refuses_what_does_not_fit_before_reading_weights(classifier, tmp_path):
    with pytest.raises(ValueError, match="precision must be fp32, bf16 or int8, got 'fp16'"):
        load_finetuned(tmp_path / "nothing", None, CPU, "fp16")  # said before the missing folder
    with pytest.raises(ValueError, match="--int8 runs on the CPU; got --device cuda"):
        load_finetuned(tmp_path / "nothing", None, torch.device("cuda"), "int8")
    with pytest.raises(ValueError, match=r"--task token is a token task, but .* was fine-tuned for classification"):
        load_finetuned(classifier, "token", CPU)
    unlabelled = shutil.copytree(classifier, tmp_path / "unlabelled")
    config = json.loads((unlabelled / "config.json").read_text())
    del config["id2label"]
    (unlabelled / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config.json has no id2label; the classification head's labels are unknown"):
        load_finetuned(unlabelled, None, CPU)


@pytest.mark.filterwarnings("ignore:.*no weights for classifier")  # what the error says next
def test_a_pretrained_folder_given_a_task_is_told_it_has_no_head(classifier, tmp_path, minilm_dir):
    """A folder `pretrain` wrote (a run record without a task) or any other BERT, with --task: the task's
    own settings, and an error naming the missing head rather than the missing run."""
    from clihelp import tiny_bert

    bare = tiny_bert(tmp_path / "bare", minilm_dir)
    write_record(bare, RunRecord("pretrain", objective="mlm"))
    with pytest.raises(ValueError, match="the checkpoint has no trained regression head; fine-tune it first"):
        load_finetuned(bare, "regression", CPU)
    with pytest.raises(ValueError, match="not a model fine-tuned by torchbert"):
        load_finetuned(bare, None, CPU)


def test_predict_runs_in_eval_mode_and_hands_the_model_back_as_it_was(classifier):
    model, tokenizer, ts, label_map = load_finetuned(classifier, None, CPU)
    model.train()  # dropout 0.1
    fam = family("classification")
    examples = [TextExample(str(i), text, None, None) for i, text in enumerate(("a fine film", "dull", "so so"))]
    data = TaskData(fam.encode(tokenizer, examples, ts, None, training=False), fam)
    first = predict(model, data, examples, ts, {0: "0", 1: "1"}, 2, CPU)
    assert model.training  # as it was given
    again = predict(model.eval(), data, examples, ts, {0: "0", 1: "1"}, 3, CPU)
    assert [r["probabilities"] for r in first] == [r["probabilities"] for r in again]  # no dropout in either
    assert [r["id"] for r in first] == ["0", "1", "2"]
    data.encoded.input_ids[1][1] = 40000  # past the vocabulary: named before the model sees it
    with pytest.raises(ValueError, match=r"input_ids out of range: values in \[\d+, 40000\] but vocab_size is 30522"):
        predict(model, data, examples, ts, None, 3, CPU)


def test_outputs_that_are_not_finite_name_the_example_and_the_others_of_its_batch():
    """The first example of the batch by its own index (not its row's: a multiple-choice example has
    a row per choice), and how many other examples share the batch; a NaN loss of unlabelled
    inputs is no output."""
    examples = [ChoiceExample(f"c{i}", "She", "opens", ["a door.", "a cat."], None) for i in range(3)]
    rows = [[101, 7, 102], [101, 8, 102], [101, 9, 9, 9, 102], [101, 9, 9, 9, 102], [101, 5, 102], [101, 5, 102]]
    data = TaskData(Encoded(rows, [[0] * len(r) for r in rows], [0, 0, 1, 1, 2, 2], num_choices=[2, 2, 2]),
                    family("multiple-choice"))
    (batch,) = data.all_batches(8)
    assert int(batch.rows[0]) == 2  # the longest rows first: example 1's
    check_finite(TaskOutput(torch.tensor(float("nan")), torch.zeros(3, 2)), batch, data, examples)
    with pytest.raises(NonFiniteOutput, match=r"^example 1 \(id 'c1'\): the model's outputs hold NaN or inf for "
                                              r"this example or one of the 2 others of its batch; nothing was written"):
        check_finite(TaskOutput(None, torch.tensor([[0.0, float("inf")], [0.0, 0.0], [0.0, 0.0]])), batch, data,
                     examples)
    with pytest.raises(NonFiniteOutput):  # any of the outputs: a QA head's end logits
        check_finite(TaskOutput(None, None, torch.zeros(6), torch.tensor([0.0, 1.0, float("inf"), 0, 0, 0])), batch,
                     data, examples)
    alone = TaskData(Encoded(rows[:2], [[0] * 3] * 2, [0, 0], num_choices=[2]), family("multiple-choice"))
    (batch,) = alone.all_batches(8)
    with pytest.raises(NonFiniteOutput, match=r"^example 0 \(id 'c0'\): .* for this example; nothing was written"):
        check_finite(torch.tensor([[np.nan, 0.0]]), batch, alone, examples)  # a bare tensor, as a baseline's


def test_evaluate_and_predict_read_files_as_the_run_did(classifier, tmp_path):
    labelled = tmp_path / "dev.jsonl"
    labelled.write_text('{"text": "a fine film", "label": "1"}\n{"text": "dull", "label": "0"}\n')
    scores, records = run_evaluate(classifier, labelled, None, CPU, progress=False)
    assert set(scores) >= {"accuracy"} and len(records) == 2
    unseen = tmp_path / "unseen.jsonl"
    unseen.write_text('{"text": "a fine film", "label": "1"}\n{"text": "dull", "label": "meh"}\n')
    with pytest.raises(ValueError, match=r"unseen.jsonl:2: label .meh. is not one of the 2 labels seen in training"):
        run_evaluate(classifier, unseen, None, CPU, progress=False)
    assert [r["label"] in ("0", "1") for r in run_predict(classifier, unseen, CPU, progress=False)] == [True] * 2
    bare = tmp_path / "bare.jsonl"
    bare.write_text('{"text": "a fine film"}\n{"text": "dull"}\n')
    assert len(run_predict(classifier, bare, CPU, progress=False)) == 2  # labels are optional here
    glue = tmp_path / "dev.tsv"
    glue.write_text("sentence\tlabel\na fine film\t1\ndull\t0\n")
    scores, _ = run_evaluate(classifier, glue, "sst2", CPU, progress=False)  # GLUE's layout, by the preset
    assert 0 <= scores["accuracy"] <= 1



def test_predict_reads_a_txt_of_one_text_a_line_for_a_single_text_model(classifier, tmp_path):
    """Each non-blank line is a text, its id its line number; the predictions are those of the same
    texts in JSON Lines. A .txt has no labels (evaluate and fine-tuning refuse it) and one text a line
    (a pair model refuses it)."""
    texts = tmp_path / "reviews.txt"
    texts.write_bytes("\ufeffa fine film\r\n\n   \ndull\n质量很好\n".encode())
    same = tmp_path / "reviews.jsonl"
    same.write_text("".join(json.dumps({"id": i, "text": t}) + "\n"
                            for i, t in ((1, "a fine film"), (4, "dull"), (5, "质量很好"))))
    got = run_predict(classifier, texts, CPU, progress=False)
    assert [r["id"] for r in got] == ["1", "4", "5"]
    assert got == run_predict(classifier, same, CPU, progress=False)
    with pytest.raises(ValueError, match=r"reviews.txt: a .txt file holds texts without labels, which only predict"):
        run_evaluate(classifier, texts, None, CPU, progress=False)
    with pytest.raises(ValueError, match=r"reviews.txt: this model reads two texts an example, and a .txt file"):
        family("pair").read(texts, labelled=False)
    assert [(x.text_a, x.text_b) for x in family("regression").read(texts, labelled=False)][1] == ("dull", None)
    (tmp_path / "blank.txt").write_text("\n \n")
    with pytest.raises(ValueError, match=r"blank.txt: no examples in the file; expected one text per line"):
        run_predict(classifier, tmp_path / "blank.txt", CPU, progress=False)
    with pytest.raises(ValueError, match=r"reviews.md: cannot tell the format from the extension '.md'"):
        run_predict(classifier, texts.rename(tmp_path / "reviews.md"), CPU, progress=False)


def test_a_bad_input_file_is_named_before_the_weights_are_read(classifier, tmp_path):
    """The weights of a large model take seconds to read (an --int8 start, its quantization too): the
    input is read first, from what the folder says of its task, and its fault said at once."""
    folder = shutil.copytree(classifier, tmp_path / "no-weights")
    (folder / "model.safetensors").unlink()  # reading the weights would fail: it is never reached
    bad = tmp_path / "in.tsv"
    bad.write_text("review\tstars\ngood\t5\n")
    for run in (lambda: run_predict(folder, bad, CPU, progress=False, precision="int8"),
                lambda: run_evaluate(folder, bad, None, CPU, progress=False)):
        with pytest.raises(ValueError, match=r"in.tsv:1: no sentence column"):
            run()
    unseen = tmp_path / "unseen.jsonl"
    unseen.write_text('{"text": "a fine film", "label": "meh"}\n')
    with pytest.raises(ValueError, match=r"unseen.jsonl:1: label .meh. is not one of the 2 labels seen in training"):
        run_evaluate(folder, unseen, None, CPU, progress=False)
    with pytest.raises(FileNotFoundError, match="no-weights: no weights found"):  # a good file: the weights now
        run_predict(folder, unseen, CPU, progress=False)


def test_heads_are_rebuilt_as_they_trained_and_put_in_eval_mode(tmp_path, minilm_dir):
    """An embedding run that learned its temperature comes back with it (the head's arguments from the
    run record: no tensor left unused); a feature-based tagger comes back in eval mode too."""
    import warnings

    from torchbert.heads import BertForEmbedding
    from torchbert.tasks.feature_tagger import FeatureTagger, TaggerSettings

    torch.manual_seed(0)
    config = BertConfig.from_name("tiny", vocab_size=30522, max_position_embeddings=64)
    embedder = tmp_path / "embedder"
    BertForEmbedding(config, temperature=0.1, learn_temperature=True).save_pretrained(embedder)
    with_tokenizer(embedder, minilm_dir)
    write_record(embedder, RunRecord("finetune", task={"type": "embedding", "max_length": 32, "temperature": 0.1,
                                                        "learn_temperature": True}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model, *_ = load_finetuned(embedder, None, CPU)
    assert isinstance(model.logit_scale, torch.nn.Parameter)
    assert float(model.logit_scale.detach().exp()) == pytest.approx(10)
    tagger = tmp_path / "tagger"
    FeatureTagger(with_labels(config, ["O", "B-x"]), TaggerSettings(kind="linear", strategy="last")).save_pretrained(tagger)
    with_tokenizer(tagger, minilm_dir)
    write_record(tagger, RunRecord("finetune", task={"type": "token", "max_length": 32}))
    model, *_ = load_finetuned(tagger, None, CPU)
    assert isinstance(model, FeatureTagger) and not model.training
