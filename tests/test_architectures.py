"""The architecture registry: BERT, GPT and ELMo told apart by their configs, folders and models in
one place (architectures.py), and what each supports as the commands find it."""

import json

import pytest
import torch

from torchbert import BertConfig, BertModel
from torchbert.heads import BertForPreTraining
from torchbert.architectures import (ARCHITECTURES, Architecture, architecture, architecture_of,
                                     architecture_of_folder, encoder_of, register_architecture)
from torchbert.baselines.elmo import ELMoBiLM, ELMoModel
from torchbert.baselines.gpt import OpenAIGPTLMHeadModel, OpenAIGPTModel
from torchbert.config import ELMoConfig, GPTConfig


def configs():
    bert = BertConfig.from_name("tiny", vocab_size=100)
    return {"bert": bert, "gpt": GPTConfig.like(bert), "elmo": ELMoConfig.like(bert)}


def test_each_config_model_and_folder_names_its_architecture(tmp_path, minilm_dir):
    torch.manual_seed(0)
    c = configs()
    assert {name: architecture_of(config).name for name, config in c.items()} == {n: n for n in c}
    bare = {"bert": BertModel(c["bert"]), "gpt": OpenAIGPTModel(c["gpt"]), "elmo": ELMoModel(c["elmo"])}
    headed = {"bert": BertForPreTraining(c["bert"]), "gpt": OpenAIGPTLMHeadModel(c["gpt"]), "elmo": ELMoBiLM(c["elmo"])}
    for name in c:
        assert encoder_of(bare[name]) is None, name  # the bare encoder holds no other
        assert isinstance(encoder_of(headed[name]), torch.nn.Module), name
        headed[name].save_pretrained(tmp_path / name)
        assert architecture_of_folder(tmp_path / name).name == name
    assert encoder_of(torch.nn.Linear(2, 2)) is None  # no config: no architecture
    assert architecture_of_folder(minilm_dir).name == "bert"  # a Hugging Face BERT folder
    rotary = BertConfig.from_name("tiny", vocab_size=100, position_embedding_type="rotary")
    BertModel(rotary).save_pretrained(tmp_path / "rotary")
    assert json.loads((tmp_path / "rotary/config.json").read_text())["model_type"] == "roformer"
    assert architecture_of_folder(tmp_path / "rotary").name == "bert"
    assert architecture_of_folder(tmp_path / "nothing") is None


def test_what_each_supports_is_what_the_commands_allow():
    bert, gpt, elmo = (architecture(n) for n in ("bert", "gpt", "elmo"))
    assert bert.exports and bert.embeds and bert.frozen_features and not bert.lm_coef
    assert gpt.lm_coef and gpt.both_orders and not gpt.exports and not gpt.embeds
    assert elmo.finetune_lr == 1e-3 and bert.finetune_lr == gpt.finetune_lr == 5e-5
    for name, config in configs().items():  # the dropout fields pretrain --dropout sets exist
        arch = architecture(name)
        assert arch.dropouts and all(hasattr(config, f) for f in arch.dropouts), name
    with pytest.raises(ValueError, match="unknown architecture 'xlnet'; choose from bert, gpt, elmo"):
        architecture("xlnet")
    with pytest.raises(ValueError, match="registered twice"):
        register_architecture(Architecture("bert", BertConfig, "bert", "again"))
    assert list(ARCHITECTURES) == ["bert", "gpt", "elmo"]
