"""The architecture registry: BERT, GPT and ELMo told apart by their configs, folders and models in
one place (architectures.py), and what each supports as the commands find it."""

import json
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn

from torchbert import BertConfig, BertModel
from torchbert.heads import BertForPreTraining
from torchbert.architectures import (ARCHITECTURES, Architecture, HFCheckpoint, architecture, architecture_of,
                                     architecture_of_folder, encoder_of, encoder_tensor, load_config, load_pretrained,
                                     register_architecture)
from torchbert.baselines.elmo import ELMoBiLM, ELMoModel
from torchbert.baselines.gpt import OpenAIGPTLMHeadModel, OpenAIGPTModel
from torchbert.config import ELMoConfig, GPTConfig, _JsonConfig
from torchbert.losses import TaskOutput, num_labels, sequence_loss


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


# -- a toy architecture registered here: a one-layer encoder of its own ---------------------------------

@dataclass
class ToyConfig(_JsonConfig):
    """A word embedding, one feed-forward layer and mean pooling: what a new architecture declares."""

    MODEL_TYPE = "torchbert-toy"
    REQUIRED = ("vocab_size",)

    vocab_size: int = 100
    hidden_size: int = 16
    max_position_embeddings: int = 64
    initializer_range: float = 0.02
    extra: dict = field(default_factory=dict)

    def parameter_estimate(self) -> int:
        return self.vocab_size * self.hidden_size + self.hidden_size * (self.hidden_size + 1)


class ToyModel(HFCheckpoint, nn.Module):
    """[B, T] or packed [N] token ids -> [B, H] or [S, H], the mean of each sequence's states."""

    config_class = ToyConfig

    def __init__(self, config: ToyConfig):
        super().__init__()
        self.config = config
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layer = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, input_ids, attention_mask=None, cu_seqlens=None):
        h = torch.tanh(self.layer(self.embeddings(input_ids)))  # [B, T, H] or [N, H]
        if cu_seqlens is not None:  # packed: sequence s is tokens cu_seqlens[s]:cu_seqlens[s + 1]
            lengths = cu_seqlens.diff().long()
            seq = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
            return torch.zeros(len(lengths), h.shape[-1]).index_add_(0, seq, h) / lengths[:, None]
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        mask = mask.unsqueeze(-1).to(h.dtype)
        return (h * mask).sum(1) / mask.sum(1)


class ToyForSequenceClassification(HFCheckpoint, nn.Module):
    config_class = ToyConfig

    def __init__(self, config: ToyConfig):
        super().__init__()
        self.config = config
        self.toy = ToyModel(config)
        self.classifier = nn.Linear(config.hidden_size, num_labels(config))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, *, cu_seqlens=None,
                max_seqlen=None, labels=None):
        logits = self.classifier(self.toy(input_ids.reshape(-1) if cu_seqlens is not None else input_ids,
                                          attention_mask, cu_seqlens))  # [B, num_labels]
        return TaskOutput(None if labels is None else sequence_loss(self.config, logits, labels), logits)


def toy_read(model, file_state, source):
    """The file's tensors by our own names, bare (a ToyModel's) or under `toy.` (a task model's)."""
    prefix = "toy." if isinstance(getattr(model, "toy", None), ToyModel) else ""
    params = model.state_dict()

    def ours(name: str) -> str:
        body = name.removeprefix("toy.")
        return prefix + body if body.startswith(("embeddings.", "layer.")) else name

    state = {ours(k): v for k, v in file_state.items() if ours(k) in params}
    unused = sorted(k for k in file_state if ours(k) not in params)
    return state, sorted(set(params) - set(state)), unused


@pytest.fixture
def toy_architecture():
    arch = register_architecture(Architecture(
        "toy", ToyConfig, "toy", "a one-layer encoder registered in a test", exports=True,
        read=toy_read, write=lambda model: {k: v.contiguous() for k, v in model.state_dict().items()},
        heads={"classification": ToyForSequenceClassification}))
    try:
        yield arch
    finally:
        del ARCHITECTURES["toy"]


@pytest.mark.e2e
def test_a_toy_architecture_registered_in_a_test_runs_through_the_commands(toy_architecture, minilm_dir, tmp_path,
                                                                            capsys):
    from torchbert.cli import main
    from torchbert.tasks.families import FAMILIES
    from torchbert.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    pretrained = tmp_path / "toy"
    torch.manual_seed(0)
    ToyModel(ToyConfig(vocab_size=tokenizer.vocab_size)).save_pretrained(pretrained)
    tokenizer.save_pretrained(pretrained)
    assert architecture_of_folder(pretrained) is toy_architecture
    assert json.loads((pretrained / "config.json").read_text())["model_type"] == "torchbert-toy"

    name, text = FAMILIES["classification"].example_file
    data = tmp_path / name
    data.write_text(text, encoding="utf-8")
    run = tmp_path / "run"
    assert main(["finetune", "--task", "classification", "--model", str(pretrained), "--train", str(data),
                 "--dev", str(data), "--out", str(run), "--epochs", "3", "--batch-size", "2", "--lr", "1e-2",
                 "--max-length", "32", "--quiet"]) == 0
    capsys.readouterr()
    tuned = load_pretrained(ToyForSequenceClassification, run)  # the encoder trained, under the head it got
    assert not torch.equal(tuned.toy.embeddings.weight, ToyModel.from_pretrained(pretrained).embeddings.weight)
    assert main(["evaluate", "--model", str(run), "--data", str(data), "--quiet"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert 0 <= scores["accuracy"] <= 1
    out = tmp_path / "p.jsonl"
    assert main(["predict", "--model", str(run), "--input", str(data), "--out", str(out), "--quiet"]) == 0
    records = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 4 and {r["label"] for r in records} <= {"pos", "neg"}
    with torch.no_grad():  # predict's probabilities are the fine-tuned model's own
        enc = tokenizer([x.split("\t")[0] for x in text.splitlines()[1:]], padding=True, return_tensors="pt")
        probs = tuned.eval()(enc["input_ids"], enc["attention_mask"]).logits.softmax(-1)
    labels = tuned.config.extra["id2label"]
    assert [r["probabilities"][labels["0"]] for r in records] == pytest.approx(probs[:, 0].tolist(), abs=1e-5)

    onnx = tmp_path / "onnx"
    assert main(["export", "--model", str(run), "--out", str(onnx)]) == 0
    report = json.loads((onnx / "export.json").read_text())
    assert report["kind"] == "classification" and max(report["max_abs_diff_fp32"].values()) <= 1e-4
    assert (onnx / "model.onnx").is_file()
    capsys.readouterr()
    # what it does not register is refused in words: a head it has none of, a bare encoder's export
    assert main(["finetune", "--task", "token", "--model", str(pretrained), "--train", str(data),
                 "--out", str(tmp_path / "tags"), "--quiet"]) == 2
    assert "token tasks have no TOY task model; fine-tune a BERT, GPT or ELMo for them" in capsys.readouterr().err
    assert main(["export", "--model", str(pretrained), "--out", str(tmp_path / "bare")]) == 2
    assert "a TOY encoder exports once fine-tuned for a task" in capsys.readouterr().err


# -- what the registry and the checkpoint functions promise, each on its own ------------------------------

@dataclass
class DerivedConfig(BertConfig):
    """A BERT descendant's config: BERT's fields under a model_type of its own."""

    MODEL_TYPE = "torchbert-derived"


def test_a_config_class_derived_from_berts_builds_its_own_architecture(tmp_path):
    derived = register_architecture(Architecture("derived", DerivedConfig, "bert", "a BERT descendant"))
    try:
        config = DerivedConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32)
        assert architecture_of(config) is derived and derived.title == "DERIVED"
        assert architecture_of(BertConfig.from_name("tiny", vocab_size=100)).name == "bert"
        config.save(tmp_path)
        assert type(load_config(tmp_path)) is DerivedConfig and architecture_of_folder(tmp_path) is derived
    finally:
        del ARCHITECTURES["derived"]


def test_encoder_tensors_are_each_architectures_and_roformers_but_not_a_heads():
    for name in ("bert.encoder.layer.0.output.dense.weight", "roformer.pooler.dense.weight",
                 "roformer.embeddings.word_embeddings.weight", "transformer.h.0.attn.c_attn.weight", "elmo.mix.gamma"):
        assert encoder_tensor(name), name
    for name in ("classifier.weight", "qa_outputs.bias", "cls.predictions.bias", "score.weight", "bertx.pooler.weight"):
        assert not encoder_tensor(name), name


def test_a_config_file_or_folder_is_read_as_its_architectures_and_a_bad_one_named(tmp_path):
    for name, config in configs().items():
        config.save(tmp_path / name)
        assert type(load_config(tmp_path / name)) is type(config), name  # the folder
        assert type(load_config(tmp_path / name / "config.json")) is type(config), name  # or its config.json
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text('{"model_type": "openai-gpt",', encoding="utf-8")
    assert architecture_of_folder(tmp_path / "broken") is None  # whoever loads it says what is wrong
    with pytest.raises(ValueError, match="broken/config.json: not valid JSON"):
        load_config(tmp_path / "broken")
    (tmp_path / "empty").mkdir()
    assert architecture_of_folder(tmp_path / "empty") is None
    with pytest.raises(FileNotFoundError, match="empty/config.json: no such config"):
        load_config(tmp_path / "empty")


def test_from_pretrained_takes_the_labels_of_a_new_head(tmp_path, minilm_dir):
    from torchbert.heads import BertForSequenceClassification

    with pytest.warns(UserWarning, match="no weights for classifier.weight, classifier.bias; they keep their fresh"):
        model = BertForSequenceClassification.from_pretrained(minilm_dir, labels=["neg", "neu", "pos"])
    assert model.classifier.out_features == 3
    assert model.config.extra["id2label"] == {"0": "neg", "1": "neu", "2": "pos"}
    assert model.config.extra["label2id"] == {"neg": 0, "neu": 1, "pos": 2}
    model.save_pretrained(tmp_path / "nested" / "cls")  # the folders are made
    again = BertForSequenceClassification.from_pretrained(tmp_path / "nested" / "cls")
    assert again.classifier.out_features == 3 and torch.equal(again.classifier.weight, model.classifier.weight)


def test_unused_head_tensors_are_named_four_and_counted_beyond(tmp_path):
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    BertModel(BertConfig.from_name("tiny", vocab_size=100)).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    heads = {"classifier.weight": torch.zeros(2, 128), "classifier.bias": torch.zeros(2),
             "qa_outputs.weight": torch.zeros(2, 128), "qa_outputs.bias": torch.zeros(2),
             "sequence_summary.summary.weight": torch.zeros(128, 128), "cls.predictions.bias": torch.zeros(100)}
    save_file({**state, **heads}, tmp_path / "model.safetensors")
    with pytest.warns(UserWarning, match=r"unused task-head tensors classifier.bias, classifier.weight, qa_outputs.bias, "
                                         r"qa_outputs.weight and 1 more \(not part of a BertModel\)"):
        model = BertModel.from_pretrained(tmp_path)
    assert model.load_report["unused"] == sorted(heads)  # a pretraining head is unused but not named


def test_a_rotary_multiple_choice_checkpoint_keeps_its_dropout_as_roformers_summary(tmp_path):
    import transformers

    from torchbert.heads import BertForMultipleChoice

    config = BertConfig.from_name("tiny", vocab_size=100, position_embedding_type="rotary", hidden_dropout_prob=0.25)
    BertForMultipleChoice(config).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["RoFormerForMultipleChoice"] and saved["summary_last_dropout"] == 0.25
    theirs = transformers.RoFormerForMultipleChoice.from_pretrained(tmp_path)
    assert theirs.sequence_summary.last_dropout.p == 0.25
    assert isinstance(theirs.sequence_summary.first_dropout, nn.Identity)  # dropout 0: none
