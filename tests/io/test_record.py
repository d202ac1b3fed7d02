"""The run record (torchbert.json): one reader and one writer over every layout torchbert wrote."""

import json

import pytest

from torchbert.io.record import VERSION, RunRecord, read_record, with_training, write_record


def test_the_record_reads_back_as_written_with_its_version(tmp_path):
    write_record(tmp_path, RunRecord("finetune", task={"type": "token"}, training={"lr": 1e-4}, command="x"))
    saved = json.loads((tmp_path / "torchbert.json").read_text())
    assert saved["version"] == VERSION == 2 and saved["versions"]["torchbert"]
    record = read_record(tmp_path)
    assert record.task == {"type": "token"} and record.training == {"lr": 1e-4} and record.fine_tuned


def test_older_layouts_read_the_same(tmp_path):
    # version 1: the training settings in training.json beside a torchbert.json without them
    (tmp_path / "torchbert.json").write_text(json.dumps({"made": "pretrain", "objective": "mlm"}))
    (tmp_path / "training.json").write_text(json.dumps({"lr": 1e-3, "steps": 5}))
    record = read_record(tmp_path)
    assert (record.version, record.objective, record.training) == (1, "mlm", {"lr": 1e-3, "steps": 5})
    # version 0: no torchbert.json, the task in config.json; its training.json read too
    (tmp_path / "torchbert.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({"torchbert_task": {"type": "qa"}}))
    record = read_record(tmp_path)
    assert (record.version, record.made, record.task, record.training["steps"]) == (0, "finetune", {"type": "qa"}, 5)
    # a version-2 record ignores a stray training.json: its own training settings are the run's
    write_record(tmp_path, RunRecord("finetune", task={"type": "qa"}, training={"steps": 9}))
    assert read_record(tmp_path).training == {"steps": 9}
    # a Hugging Face folder: no record
    (tmp_path / "torchbert.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert read_record(tmp_path) is None


def test_a_resumed_run_records_its_training_settings_in_the_current_layout(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"torchbert_objective": "mlm"}))
    with_training(tmp_path, {"steps": 7}, "pretrain")
    record = read_record(tmp_path)
    assert (record.version, record.made, record.objective, record.training) == (2, "pretrain", "mlm", {"steps": 7})
    bare = tmp_path / "bare"
    bare.mkdir()
    with_training(bare, {"steps": 3}, "finetune")  # a run that left no record at all gets one
    assert read_record(bare).made == "finetune" and read_record(bare).training == {"steps": 3}


@pytest.mark.parametrize("text, says", [("[1, 2]", "not a JSON object"), ("{", "not the run record"),
                                        ('{"made": "pretrain", "version": 3}', "newer torchbert"),
                                        ('{"made": "cooked"}', "made must be one of"),
                                        ('{"made": "pretrain", "training": [1]}', "training must be a JSON object"),
                                        ('{"made": "pretrain", "settings": "x"}', "settings must be a JSON object"),
                                        ('{"made": "pretrain", "version": "2"}', "version must be a whole number, got '2'"),
                                        ('{"made": "pretrain", "version": true}', "version must be a whole number, got True"),
                                        ('{"objective": "mlm"}', "missing 1 required positional argument: 'made'")])
def test_a_record_torchbert_did_not_write_is_named(tmp_path, text, says):
    (tmp_path / "torchbert.json").write_text(text)
    with pytest.raises(ValueError, match=says) as e:
        read_record(tmp_path)
    assert str(tmp_path / "torchbert.json") in str(e.value)


def test_a_record_is_indented_sorted_json_and_a_field_this_torchbert_does_not_know_is_left_aside(tmp_path):
    write_record(tmp_path, RunRecord("pretrain", objective="mlm", versions={"torchbert": "0"}))
    text = (tmp_path / "torchbert.json").read_text()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"  # for a person to read
    saved = json.loads(text)
    (tmp_path / "torchbert.json").write_text(json.dumps({**saved, "notes": "a later field"}))
    assert read_record(tmp_path) == RunRecord("pretrain", objective="mlm", versions={"torchbert": "0"})


@pytest.mark.parametrize("config", ["{", "[1]", '{"torchbert_task": null}', '{"torchbert_task": "token"}',
                                    '{"torchbert_objective": 3}', '{"torchbert_objective": null}'])
def test_a_config_json_without_an_old_record_in_it_is_no_record(tmp_path, config):
    (tmp_path / "config.json").write_text(config)  # whoever reads the config says what is wrong with it
    assert read_record(tmp_path) is None
