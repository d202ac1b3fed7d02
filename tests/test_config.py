import json

import pytest
import transformers

from torchbert import BertConfig
from torchbert.config import PRESETS


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_have_the_released_sizes(name):
    layers, hidden, heads = PRESETS[name]
    c = BertConfig.from_name(name)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (layers, hidden, heads)
    assert c.intermediate_size == 4 * hidden
    assert c.head_size * heads == hidden


def test_preset_values():
    assert PRESETS["tiny"] == (2, 128, 2) and PRESETS["base"] == (12, 768, 12) and PRESETS["large"] == (24, 1024, 16)
    assert BertConfig.from_name("mini", vocab_size=100).vocab_size == 100
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        BertConfig.from_name("huge")


def test_transformers_reads_our_config_and_we_read_theirs(tmp_path):
    ours = BertConfig.from_name("small", vocab_size=21128, hidden_act="gelu_new")
    ours.save(tmp_path)
    theirs = transformers.BertConfig.from_pretrained(tmp_path)
    for k, v in ours.to_dict().items():
        if k in ("model_type",):
            continue
        assert getattr(theirs, k) == v, k
    theirs.save_pretrained(tmp_path / "hf")
    back = BertConfig.load(tmp_path / "hf")
    assert back == ours


def test_extra_fields_are_kept(tmp_path, minilm_dir):
    c = BertConfig.load(minilm_dir)
    assert c.hidden_size == 384 and c.num_hidden_layers == 6 and c.num_attention_heads == 12
    assert c.extra["architectures"] == ["BertModel"]  # a field we do not model, kept
    c.save(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    assert d["architectures"] == ["BertModel"] and d["use_cache"] is True and d["model_type"] == "bert"


def test_missing_required_field_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10, "hidden_size": 8}))
    with pytest.raises(ValueError, match=r"config.json: missing required field\(s\) num_hidden_layers, num_attention_heads"):
        BertConfig.load(tmp_path)


def test_bad_configs(tmp_path):
    with pytest.raises(ValueError, match="not a multiple"):
        BertConfig(hidden_size=100, num_attention_heads=3)
    with pytest.raises(ValueError, match="hidden_act 'swish2'"):
        BertConfig(hidden_act="swish2")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        BertConfig.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such config"):
        BertConfig.load(tmp_path / "nowhere")
    rel = BertConfig.from_name("tiny").to_dict() | {"position_embedding_type": "relative_key"}
    with pytest.raises(ValueError, match="position_embedding_type 'relative_key' is not supported, only 'absolute'"):
        BertConfig.from_dict(rel)
