"""Examples without labels for a multiple-choice or QA student (distill --unlabeled in the task's own layout)."""

from __future__ import annotations

import json

import pytest
import torch

from test_distill import distilled_with_unlabeled, family_data, tokenizer  # noqa: F401 (a fixture)
from torchbert.tasks.families import FAMILIES, task_settings
from torchbert.train.distill import (UNLABELLED, DistillSettings, DistillTask, mark_unlabelled, placeholder,
                                     student_of, teacher_outputs, unlabeled_examples)


@pytest.mark.parametrize("task_type", ["multiple-choice", "qa-v2"])
def test_unlabelled_choices_and_windows_add_to_the_soft_loss_alone(task_type, tokenizer, tmp_path):
    fam, teacher, data, config = family_data(task_type, tokenizer, tmp_path)
    examples = max(data.encoded.example_index) + 1
    gold = list(data.encoded.labels)
    first = mark_unlabelled(data.encoded, examples - 1)  # the last example: without labels
    first_unit = int(data.unit_start.searchsorted(first))
    if task_type == "multiple-choice":  # a label an example
        assert data.encoded.labels == gold[:-1] + [UNLABELLED] and first_unit == examples - 1
    else:  # a (start, end) a window
        assert data.encoded.labels == gold[:first] + [(UNLABELLED, UNLABELLED)] * (len(gold) - first)
        assert first_unit == first
    kept = teacher_outputs(teacher, data, batch_size=3, device="cpu")
    student = student_of(teacher, 1, **fam.head_arguments(task_settings(task_type))).eval()
    task = DistillTask(fam, kept, DistillSettings(student_layers=1), config, per_step=4.0, labelled_rows=first,
                       labelled_units=first_unit, units=len(data))
    assert task.per_step["task"] == pytest.approx(4.0 * first_unit / len(data)) and task.per_step["soft"] == 4.0
    totals = {"task": 0, "soft": 0}
    for batch in data.batches(2, epoch=1):
        units = batch.units.tolist()
        counts = task.counts(batch)
        assert counts == {"task": sum(u < first_unit for u in units), "soft": batch.num_targets}
        parts = task.forward(student, batch)
        assert torch.isfinite(parts["task"][0]) and torch.isfinite(parts["soft"][0])
        if not counts["task"]:  # only unlabelled units: no task loss
            assert parts["task"][0].item() == 0
        else:
            assert parts["task"][0].item() > 0
        assert parts["soft"][0].item() > 0 and 0 <= parts["soft"][1].item() <= batch.num_targets
        totals = {k: totals[k] + counts[k] for k in totals}
    assert totals == {"task": first_unit, "soft": len(data)}  # an epoch: every unit once, the labelled ones in the task part


def test_unlabelled_questions_are_read_in_the_tasks_layout_and_learnt(tokenizer, tmp_path, capsys):
    for task_type in ("multiple-choice", "qa-v2", "qa"):
        fam = FAMILIES[task_type]
        name, text = fam.example_file
        train = tmp_path / f"{task_type}-{name}"
        train.write_text(text, encoding="utf-8")
        got = unlabeled_examples(fam, train, "auto")
        assert len(got) == len(fam.read(train))
        marked = [placeholder(e, None) for e in got]
        if task_type == "multiple-choice":
            assert all(e.label == 0 for e in marked)
        else:  # every window of a question without answers kept, its label a placeholder
            assert all(e.answers is None for e in marked)
            encoded = fam.encode(tokenizer, marked, task_settings(task_type), None, training=True)
            assert encoded.labels == [(0, 0)] * len(encoded.input_ids) and \
                sorted(set(encoded.example_index)) == list(range(len(marked)))
        texts = tmp_path / "texts.txt"
        texts.write_text("one text\n", encoding="utf-8")
        with pytest.raises(ValueError, match=r"^--unlabeled: .*texts.txt.*a file in --train's layout"):
            unlabeled_examples(fam, texts, "auto")
    fam = FAMILIES["multiple-choice"]
    name, text = fam.example_file
    train = tmp_path / name
    train.write_text(text, encoding="utf-8")
    more = tmp_path / "more.jsonl"  # questions with their choices, no labels
    more.write_text(json.dumps({"id": "x", "context": "It rained,", "question": "so she",
                                "choices": ["took an umbrella.", "sang."]}) + "\n", encoding="utf-8")
    metrics = distilled_with_unlabeled("multiple-choice", train, more, tokenizer, tmp_path, capsys)
    assert metrics["distill"]["unlabeled_examples"] == 1 and metrics["train_examples"] == len(fam.read(train))
