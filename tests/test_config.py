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


@pytest.mark.parametrize("fields, message", [
    ({"num_hidden_layers": True}, "num_hidden_layers must be a whole number, got True"),
    ({"num_hidden_layers": 2.0}, "num_hidden_layers must be a whole number, got 2.0"),
    ({"hidden_dropout_prob": True}, "hidden_dropout_prob must be a finite number, got True"),
    ({"layer_norm_eps": float("inf")}, "layer_norm_eps must be a finite number, got inf"),
    ({"hidden_act": 1}, "hidden_act must be a string, got 1"),
    ({"num_hidden_layers": 0}, r"num_hidden_layers must be in \[1, 1024\], got 0"),
    ({"pad_token_id": -1}, r"pad_token_id must be in \[0, 16,777,215\], got -1"),
    ({"hidden_dropout_prob": -0.1}, r"hidden_dropout_prob must be in \[0, 1\], got -0.1"),
    ({"vocab_size": 1 << 25}, r"vocab_size must be in \[1, 16,777,216\], got 33554432"),
])
def test_each_field_has_its_type_and_its_bounds(fields, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        BertConfig(**fields)
    with pytest.raises(ValueError, match=f"^model/config.json: {message}$"):  # a file's field, named with the file
        BertConfig.from_dict({**BertConfig().to_dict(), **fields}, source="model/config.json")


def test_whole_numbers_are_rates_and_bools_are_only_bools():
    """config.json files write a rate of 0 as 0: an int is a float's value; a flag is true or false."""
    from torchbert.config import GPTConfig

    assert BertConfig(hidden_dropout_prob=0, attention_probs_dropout_prob=1).hidden_dropout_prob == 0
    assert GPTConfig(both_orders=True).both_orders
    with pytest.raises(ValueError, match="^both_orders must be true or false, got 1$"):
        GPTConfig(both_orders=1)


def test_a_config_too_big_for_the_memory_is_named_before_anything_is_built(monkeypatch):
    """BERT-base (109M parameters, heads aside): 0.44 GB of fp32 weights fit in 1 GB; training them (weights,
    gradients, Adam's two moments: four copies) does not."""
    import os

    from torchbert.config import check_memory

    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_PHYS_PAGES": 250_000, "SC_PAGE_SIZE": 4096}[name])
    base = BertConfig.from_name("base")
    check_memory(base, "--config base")
    with pytest.raises(ValueError, match=r"^--config base: its sizes imply about 108,890,112 parameters, 1.7 GB "
                                         r"to train in fp32, more than this machine's 1.0 GB of memory$"):
        check_memory(base, "--config base", copies=4)
    with pytest.raises(ValueError, match=r"334,090,240 parameters, 1.3 GB to hold in fp32"):
        check_memory(BertConfig.from_name("large"), "--config large")


def test_save_writes_a_folder_or_a_file_and_load_reads_either(tmp_path):
    c = BertConfig.from_name("tiny", vocab_size=100)
    c.save(tmp_path / "new" / "model")  # a folder, made
    text = (tmp_path / "new" / "model" / "config.json").read_text()
    assert text.startswith('{\n  "')  # indented, as transformers writes it
    c.save(tmp_path / "tiny.json")  # a file of that name
    assert BertConfig.load(tmp_path / "tiny.json") == c == BertConfig.load(tmp_path / "new" / "model")
    assert BertConfig.from_name("tiny", num_hidden_layers=3).num_hidden_layers == 3  # overrides win over the preset


def test_parameter_estimates_count_the_models_parameters():
    """What is compared with a weights file before any allocation: every parameter but BERT's
    embedding LayerNorm (2H) and the biLM's softmax bias (V), for BERT with either positions, GPT and ELMo."""
    from torchbert import BertModel
    from torchbert.baselines.elmo import ELMoBiLM
    from torchbert.baselines.gpt import OpenAIGPTModel
    from torchbert.config import ELMoConfig, GPTConfig

    def count(model):
        return sum(p.numel() for p in model.parameters())

    for positions in ("absolute", "rotary"):
        c = BertConfig.from_name("tiny", vocab_size=100, position_embedding_type=positions)
        assert count(BertModel(c, add_pooling_layer=False)) - c.parameter_estimate() == 2 * c.hidden_size, positions
    gpt = GPTConfig.like(BertConfig.from_name("tiny", vocab_size=100))
    assert count(OpenAIGPTModel(gpt)) == gpt.parameter_estimate()
    elmo = ELMoConfig(vocab_size=100, projection_dim=16, cell_size=64, num_layers=2)
    assert count(ELMoBiLM(elmo)) - elmo.parameter_estimate() == elmo.vocab_size  # the softmax's bias


def test_roformer_configs_read_as_rotary_berts_and_write_back(tmp_path):
    """A RoFormer config.json is a BERT with rotary positions; what that cannot hold is refused; the
    dict given is left as it was; a BERT descendant's model_type is written back as bert."""
    rotary = BertConfig.from_name("tiny", vocab_size=100, position_embedding_type="rotary")
    d = rotary.to_dict()
    assert (d["model_type"], d["rotary_value"], d["embedding_size"]) == ("roformer", False, 128)
    assert "position_embedding_type" not in d
    given = dict(d)
    assert BertConfig.from_dict(given) == rotary and given == d
    for field, value, message in (("rotary_value", True, "rotary_value true"),
                                  ("embedding_size", 64, "embedding_size differs from hidden_size"),
                                  ("position_embedding_type", "absolute", "a RoFormer's positions are rotary")):
        with pytest.raises(ValueError, match=f"^x.json: {message}"):
            BertConfig.from_dict({**d, field: value}, source="x.json")
    with pytest.raises(ValueError, match="head size 3 is odd"):
        BertConfig(hidden_size=6, num_attention_heads=2, position_embedding_type="rotary")
    descendant = BertConfig.from_dict({**BertConfig().to_dict(), "model_type": "megatron-bert"})
    assert descendant.to_dict()["model_type"] == "bert"


def test_ids_and_sizes_a_config_refuses():
    import torch

    from torchbert.config import ELMoConfig, check_ids

    check_ids(BertConfig(vocab_size=100), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 0)  # none

    with pytest.raises(ValueError, match="^pad_token_id 100 is not an id of the vocabulary of 100$"):
        BertConfig(vocab_size=100, pad_token_id=100)
    with pytest.raises(ValueError, match="^cell_size 16 must be larger than projection_dim 16"):
        ELMoConfig(projection_dim=16, cell_size=16)


def test_gpt_configs_are_bert_blocks_of_gpt_names():
    """GPT's fields mapped to BERT's blocks (its "gelu" is the tanh approximation, gelu_new), the
    same checks, and GPTConfig.like a BERT of the same shape, dropout and initialization."""
    from torchbert.config import GPTConfig

    gpt = GPTConfig(n_embd=64, n_layer=2, n_head=4, layer_norm_epsilon=1e-6)
    blocks = gpt.blocks()
    assert (blocks.hidden_act, blocks.layer_norm_eps, blocks.intermediate_size) == ("gelu_new", 1e-6, 256)
    with pytest.raises(ValueError, match="hidden_size 64 is not a multiple of num_attention_heads 3"):
        GPTConfig(n_embd=64, n_head=3)
    bert = BertConfig.from_name("tiny", vocab_size=100, hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.3,
                                initializer_range=0.05)
    like = GPTConfig.like(bert)
    assert (like.resid_pdrop, like.embd_pdrop, like.attn_pdrop, like.initializer_range) == (0.2, 0.2, 0.3, 0.05)


def test_elmo_like_a_bert_has_as_many_layer_parameters_within_a_cell():
    from torchbert.config import ELMoConfig, bert_body_parameters

    bert = BertConfig.from_name("mini", vocab_size=100, max_position_embeddings=128)
    elmo = ELMoConfig.like(bert)
    d = elmo.projection_dim
    assert (d, elmo.num_layers, elmo.max_position_embeddings) == (128, 2, 128)
    layers = elmo.parameter_estimate() - 2 * elmo.vocab_size * d  # the token table and the softmax aside
    assert abs(layers - bert_body_parameters(bert)) <= 2 * 2 * (4 * (2 * d + 2) + d)  # a cell, both ways, both layers
