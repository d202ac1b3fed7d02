"""GPT (gpt.py) against transformers' OpenAIGPT on random weights of a small config, both directions,
and the properties its fine-tuning and pretraining rely on: causal, packed == one sequence alone."""

import dataclasses

import pytest
import torch
import transformers
from parity import assert_parity

from torchbert.baselines.gpt import OpenAIGPTLMHeadModel, OpenAIGPTModel
from torchbert.config import BertConfig, GPTConfig
from torchbert.losses import IGNORE, next_tokens

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SMALL = dict(vocab_size=99, n_positions=32, n_embd=32, n_layer=2, n_head=4)


@pytest.fixture(scope="module")
def theirs(tmp_path_factory):
    """A random transformers OpenAIGPTLMHeadModel saved in its own layout."""
    torch.manual_seed(0)
    model = transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(**SMALL)).eval()
    folder = tmp_path_factory.mktemp("hf-gpt")
    model.save_pretrained(folder)
    return model, folder


@torch.no_grad()
def test_we_read_transformers_gpt_with_the_same_outputs(theirs):
    ref, folder = theirs
    ours = OpenAIGPTLMHeadModel.from_pretrained(folder).eval()
    ids = torch.randint(0, SMALL["vocab_size"], (3, 17))
    a, b = ref(ids, labels=ids, output_hidden_states=True), ours(ids, labels=ids, output_hidden_states=True)
    assert_parity(a.logits, b.logits)
    assert_parity(a.loss, b.loss)
    assert len(a.hidden_states) == len(b.hidden_states) == SMALL["n_layer"] + 1
    for x, y in zip(a.hidden_states, b.hidden_states):
        assert_parity(x, y)
    # the bare model from the LM head model's file, and transformers' bare model
    base = OpenAIGPTModel.from_pretrained(folder).eval()
    assert_parity(base(ids).last_hidden_state, ref.transformer(ids).last_hidden_state)


@torch.no_grad()
def test_transformers_reads_ours_with_the_same_outputs(tmp_path):
    torch.manual_seed(1)
    ours = OpenAIGPTLMHeadModel(GPTConfig(**SMALL)).eval()
    ours.save_pretrained(tmp_path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(ref).__name__ == "OpenAIGPTLMHeadModel"
    ids = torch.randint(0, SMALL["vocab_size"], (2, 11))
    assert_parity(ours(ids).logits, ref(ids).logits)
    # tied: their output layer is our token embedding
    assert torch.equal(ref.lm_head.weight, ours.transformer.embeddings.tokens.weight)
    again = OpenAIGPTLMHeadModel.from_pretrained(tmp_path).eval()
    assert torch.equal(again(ids).logits, ours(ids).logits)


@torch.no_grad()
def test_packed_sequences_equal_each_sequence_alone_and_nothing_sees_the_future():
    torch.manual_seed(2)
    model = OpenAIGPTLMHeadModel(GPTConfig(**SMALL)).eval()
    seqs = [torch.randint(0, 99, (n,)) for n in (7, 4, 9)]
    cu = torch.tensor([0, 7, 11, 20], dtype=torch.int32)
    packed = model(torch.cat(seqs), cu_seqlens=cu, max_seqlen=9, labels=torch.cat(seqs))
    alone = [model(s[None], labels=s[None]) for s in seqs]
    assert_parity(packed.logits, torch.cat([a.logits[0] for a in alone]))
    # the loss: every next-token target of the three sequences, none across their borders
    n_targets = sum(len(s) - 1 for s in seqs)
    want = sum(a.loss * (len(s) - 1) for a, s in zip(alone, seqs)) / n_targets
    assert_parity(packed.loss, want)
    # causal: changing the last five tokens leaves every earlier position's output unchanged
    ids = torch.randint(0, 99, (1, 12))
    changed = ids.clone()
    changed[0, 7:] = (changed[0, 7:] + 1) % 99
    a, b = model(ids).logits, model(changed).logits
    assert_parity(a[0, :7], b[0, :7])
    assert not torch.allclose(a[0, 7:], b[0, 7:])


@torch.no_grad()
def test_eager_attention_gives_the_same_outputs_and_lower_triangular_maps():
    torch.manual_seed(3)
    model = OpenAIGPTModel(GPTConfig(**SMALL)).eval()
    ids = torch.randint(0, 99, (2, 8))
    fast = model(ids).last_hidden_state
    out = model(ids, output_attentions=True)  # the probabilities come from the eager path
    assert_parity(out.last_hidden_state, fast)
    probs = out.attentions[0]  # [B, A, T, T]
    assert probs.shape == (2, 4, 8, 8)
    assert torch.all(probs.triu(1) == 0)
    assert_parity(probs.sum(-1), torch.ones(2, 4, 8))


def test_next_tokens_stay_inside_each_sequence():
    ids = torch.tensor([5, 6, 7, 8, 9])
    assert next_tokens(ids, torch.tensor([0, 3, 5], dtype=torch.int32)).tolist() == [6, 7, IGNORE, 9, IGNORE]
    assert next_tokens(torch.tensor([[1, 2, 3]])).tolist() == [[2, 3, IGNORE]]


def test_gpt_config_matches_a_bert_size_and_round_trips(tmp_path):
    bert = BertConfig.from_name("mini", vocab_size=5000)
    gpt = GPTConfig.like(bert)
    assert (gpt.n_layer, gpt.n_embd, gpt.n_head, gpt.vocab_size, gpt.n_positions) == (4, 256, 4, 5000, 512)
    model = OpenAIGPTModel(gpt)
    body = sum(p.numel() for n, p in model.named_parameters() if n.startswith("layers."))
    from torchbert.model import BertModel

    bert_body = sum(p.numel() for n, p in BertModel(bert).named_parameters() if n.startswith("layers."))
    assert body == bert_body  # the same blocks: only the embeddings and BERT's pooler differ
    gpt.save(tmp_path)
    assert GPTConfig.load(tmp_path) == gpt
    assert transformers.AutoConfig.from_pretrained(tmp_path).n_embd == 256
    with pytest.raises(ValueError, match="afn 'tanh' is not one of"):
        GPTConfig(afn="tanh")
    with pytest.raises(ValueError, match="GPT's feed-forward is 4 x hidden"):
        GPTConfig.like(BertConfig.from_name("tiny", intermediate_size=100))


def test_a_bert_folder_is_no_gpt(minilm_dir):
    with pytest.raises(ValueError, match="missing required field"):
        OpenAIGPTModel.from_pretrained(minilm_dir)


@pytest.mark.e2e
def test_gpt_pretrains_on_the_prepared_data_and_resumes_exactly(prepared, tmp_path, capsys):
    """`pretrain --model gpt`: the same prepared instances as BERT's, read as text; a falling loss,
    held-out next-token figures, a folder transformers loads with the same outputs, and --resume
    from the middle ends at the weights of a run that never stopped."""
    import json
    import shutil

    from clihelp import cli
    from safetensors.torch import load_file

    run = tmp_path / "gpt"
    args = ["pretrain", "--data", prepared / "data", "--config", "tiny", "--model", "gpt", "--batch-size", "16",
            "--lr", "1e-3", "--warmup-steps", "5", "--log-every", "5", "--quiet", "--steps", "30", "--save-every", "15",
            "--eval-data", prepared / "eval", "--eval-every", "15",
            "--threads", "1"]  # one thread: the same sums whatever other jobs compute beside it (fast/threads.py)
    code, out, err = cli(capsys, *args, "--out", run)
    assert code == 0, err
    assert "pretrained 30 steps" in out and "held-out: next-token loss" in out and "perplexity" in out
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["lm_loss"] < rows[0]["lm_loss"] - 0.5 and "eval_lm_accuracy" in rows[2]
    assert (run / "loss.png").is_file() and (run / "accuracy.png").is_file()
    summary = json.loads((run / "metrics.json").read_text())
    assert summary["model"] == "gpt" and set(summary["eval"]) == {"lm_loss", "lm_accuracy"}

    ref = transformers.OpenAIGPTLMHeadModel.from_pretrained(run).eval()
    ours = OpenAIGPTLMHeadModel.from_pretrained(run).eval()
    ids = torch.randint(0, ours.config.vocab_size, (2, 20))
    with torch.no_grad():
        assert_parity(ours(ids).logits, ref(ids).logits)

    # the same run stopped after step 15: resumed, it ends where the whole run did
    half = tmp_path / "half"
    shutil.copytree(run, half)
    shutil.rmtree(half / "checkpoints" / "step-00000030")
    code, _, err = cli(capsys, *args, "--out", half, "--resume", "--model", "bert")
    assert code == 2 and "pretrains gpt; leave --model out" in err
    code, _, err = cli(capsys, *[a for a in args if a not in ("--model", "gpt")], "--out", half, "--resume")
    assert code == 0, err
    a, b = load_file(run / "model.safetensors"), load_file(half / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@torch.no_grad()
def test_sequence_classification_matches_transformers_and_reads_each_sequences_last_token(tmp_path):
    from torchbert.baselines.gpt import OpenAIGPTForSequenceClassification, lm_loss

    torch.manual_seed(4)
    ref = transformers.OpenAIGPTForSequenceClassification(
        transformers.OpenAIGPTConfig(**SMALL, num_labels=3, pad_token_id=0)).eval()
    ref.save_pretrained(tmp_path / "theirs")
    ours = OpenAIGPTForSequenceClassification.from_pretrained(tmp_path / "theirs").eval()
    ids = torch.randint(1, SMALL["vocab_size"], (4, 9))  # no pad id: transformers reads the last token too
    assert_parity(ours(ids).logits, ref(ids).logits)
    ours.save_pretrained(tmp_path / "ours")
    back = transformers.OpenAIGPTForSequenceClassification.from_pretrained(tmp_path / "ours").eval()
    assert_parity(ours(ids).logits, back(ids).logits)
    # packed: each sequence's own last token
    seqs = [ids[0, :5], ids[1, :9], ids[2, :2]]
    packed = ours(torch.cat(seqs), cu_seqlens=torch.tensor([0, 5, 14, 16], dtype=torch.int32), max_seqlen=9)
    alone = torch.cat([ours(s[None]).logits for s in seqs])
    assert_parity(packed.logits, alone)
    # L3 = L2 + 0.5 L1: the task's cross-entropy plus half the next-token loss on the same text
    labels = torch.tensor([0, 2, 1, 1])
    out = ours(ids, labels=labels)
    h = ours.transformer(ids).last_hidden_state
    want = torch.nn.functional.cross_entropy(out.logits, labels) + 0.5 * lm_loss(ours.transformer, h, ids, None)[1]
    assert ours.lm_coef == 0.5
    assert_parity(out.loss, want)
    with pytest.raises(ValueError, match="packed input"):
        ours(ids, attention_mask=torch.ones_like(ids))


@pytest.mark.e2e
def test_gpt_fine_tunes_evaluates_and_predicts_through_the_same_commands(prepared, minilm_dir, tmp_path, capsys):
    """A GPT pretrained by `pretrain --model gpt` is fine-tuned on Chinese reviews by `finetune`; its
    run folder is transformers' OpenAIGPTForSequenceClassification; evaluate and predict read it;
    every other task type fine-tunes, evaluates and predicts the same way."""
    import json
    import random

    import realdata
    from clihelp import assert_served_like_predict, cli, squad_file, write_conll

    gpt = tmp_path / "gpt"
    code, _, err = cli(capsys, "pretrain", "--data", prepared / "data", "--out", gpt, "--config", "tiny", "--model",
                       "gpt", "--steps", "5", "--batch-size", "8", "--quiet")
    assert code == 0, err
    pos, neg = (sorted(set(p.read_text(encoding="utf-8").split("\n")) - {""}) for p in realdata.sentiment_paths())
    rows = [(t, "pos") for t in pos[:60]] + [(t, "neg") for t in neg[:60]]
    random.Random(0).shuffle(rows)
    for name, part in (("train", rows[:80]), ("dev", rows[80:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"sentence": t[:60], "label": y}, ensure_ascii=False)
                                                        + "\n" for t, y in part), encoding="utf-8")
    run = tmp_path / "cls"
    code, out, err = cli(capsys, "finetune", "--task", "classification", "--model", gpt, "--train",
                         tmp_path / "train.jsonl", "--dev", tmp_path / "dev.jsonl", "--out", run, "--epochs", "1",
                         "--batch-size", "16", "--max-length", "64", "--quiet")
    assert code == 0, err
    assert "OpenAIGPTForSequenceClassification: a new head (score)" in err
    metrics = json.loads((run / "metrics.json").read_text())
    assert 0 <= metrics["accuracy"] <= 1 and metrics["type"] == "classification"
    ref = transformers.OpenAIGPTForSequenceClassification.from_pretrained(run).eval()
    assert ref.config.id2label == {0: "neg", 1: "pos"}
    code, out, err = cli(capsys, "evaluate", "--model", run, "--data", tmp_path / "dev.jsonl")
    assert code == 0, err
    assert json.loads(out)["accuracy"] == pytest.approx(metrics["accuracy"])
    code, out, err = cli(capsys, "predict", "--model", run, "--input", tmp_path / "dev.jsonl", "--out",
                         tmp_path / "p.jsonl")
    assert code == 0, err
    records = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 40 and {r["label"] for r in records} <= {"pos", "neg"}
    assert_served_like_predict(run, [{"sentence": t[:60]} for t, _ in rows[80:]], records)  # torchbert serve
    # every other task type through the same commands: tagging (People's Daily person/place names),
    # multiple choice, QA and similarity, each a new head on the pretrained GPT
    sentences = [(w, tuple("B-PER" if t == "nr" else "B-LOC" if t == "ns" else "O" for t in tags))
                 for w, tags in realdata.peoples_daily_tagged()[:400] if len(w) <= 30][:60]
    write_conll(tmp_path / "t.conll", sentences)
    code, _, err = cli(capsys, "finetune", "--task", "token", "--model", gpt, "--train", tmp_path / "t.conll",
                       "--dev", tmp_path / "t.conll", "--out", tmp_path / "tok", "--epochs", "1", "--quiet",
                       "--lm-coef", "0.25")
    assert code == 0, err
    assert "OpenAIGPTForTokenClassification: a new head (classifier)" in err
    saved = json.loads((tmp_path / "tok" / "config.json").read_text())
    assert saved["model_type"] == "openai-gpt" and "lm_coef" not in saved  # how it trained: the run record's
    assert json.loads((tmp_path / "tok" / "torchbert.json").read_text())["training"]["lm_coef"] == 0.25
    from torchbert.tasks.families import task_settings
    from torchbert.train.finetune import load_task_model, task_config
    ts = task_settings("token")
    config = task_config(tmp_path / "tok", ts, None)
    assert load_task_model(tmp_path / "tok", config, ts, log=lambda *a: None, lm_coef=0.25).lm_coef == 0.25
    code, out, err = cli(capsys, "evaluate", "--model", tmp_path / "tok", "--data", tmp_path / "t.conll")
    assert code == 0, err
    assert json.loads(out)["f1"] == pytest.approx(json.loads((tmp_path / "tok" / "metrics.json").read_text())["f1"])
    texts = [t[:20] for t, _ in rows]
    choices = [{"id": f"c{i}", "context": texts[i], "choices": [texts[i + 1], texts[i + 2], texts[i]], "label": 2}
               for i in range(0, 60, 3)]
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in choices),
                                       encoding="utf-8")
    squad_file(tmp_path / "qa.json", [(t, "哪里？", t[2:5]) for t in texts[:30]], v2=False)
    pairs = [{"sentence1": texts[i], "sentence2": texts[i + 1], "label": i % 5} for i in range(40)]
    (tmp_path / "sts.jsonl").write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs),
                                        encoding="utf-8")
    for task, data, head in (("multiple-choice", "mc.jsonl", "OpenAIGPTForMultipleChoice"),
                             ("qa", "qa.json", "OpenAIGPTForQuestionAnswering"),
                             ("regression", "sts.jsonl", "OpenAIGPTForSequenceClassification")):
        run = tmp_path / task
        code, _, err = cli(capsys, "finetune", "--task", task, "--model", gpt, "--train", tmp_path / data, "--dev",
                           tmp_path / data, "--out", run, "--epochs", "1", "--batch-size", "8", "--quiet")
        assert code == 0, (task, err)
        assert f"{head}: a new head" in err
        code, out, err = cli(capsys, "predict", "--model", run, "--input", tmp_path / data, "--out", run / "p.jsonl")
        assert code == 0, (task, err)
        assert len((run / "p.jsonl").read_text(encoding="utf-8").splitlines()) == {"qa": 30, "regression": 40}.get(
            task, 20)
    assert json.loads((tmp_path / "regression" / "config.json").read_text())["both_orders"] is True
    # the weight of L1 belongs to GPT
    code, _, err = cli(capsys, "finetune", "--task", "classification", "--model", minilm_dir, "--train",
                       tmp_path / "train.jsonl", "--out", tmp_path / "bert", "--lm-coef", "0.5", "--quiet")
    assert code == 2 and "--lm-coef weighs GPT's next-token loss" in err and not (tmp_path / "bert").exists()
    code, _, err = cli(capsys, "finetune", "--task", "token", "--model", gpt, "--train", tmp_path / "t.conll",
                       "--out", tmp_path / "frozen", "--frozen", "--quiet")  # the feature-based tagger reads BERT's
    assert code == 2 and f"--frozen reads a BERT's hidden layers; the model in {gpt} is GPT\n" in err
    assert not (tmp_path / "frozen").exists()
    code, _, err = cli(capsys, "finetune", "--task", "classification", "--model", gpt, "--train",
                       tmp_path / "train.jsonl", "--out", tmp_path / "neg", "--lm-coef", "-1", "--quiet")
    assert code == 2 and "--lm-coef must be >= 0, got -1" in err


def test_both_orders_swaps_the_two_sentences_of_each_pair():
    from torchbert.baselines.gpt import both_orders

    # [CLS]=1 a a [SEP]=2 b b b [SEP] | one segment | a pair with a one-token b
    ids = torch.tensor([1, 10, 11, 2, 20, 21, 22, 2, 1, 30, 31, 2, 1, 40, 2, 50, 2])
    types = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1])
    cu = torch.tensor([0, 8, 12, 17], dtype=torch.int32)
    assert both_orders(ids, types, cu).tolist() == [1, 20, 21, 22, 2, 10, 11, 2, 1, 30, 31, 2, 1, 50, 2, 40, 2]


@torch.no_grad()
def test_gpt_task_heads_read_packed_input_as_each_sequence_alone_and_add_half_l1():
    """Token, QA, multiple-choice and similarity heads: packed [N] equals each sequence alone,
    similarity sums the extract states of both orders, and every loss is L2 + lm_coef * L1."""
    from torchbert.baselines.gpt import (OpenAIGPTForMultipleChoice, OpenAIGPTForQuestionAnswering,
                                         OpenAIGPTForSequenceClassification, OpenAIGPTForTokenClassification,
                                         both_orders, lm_loss)

    torch.manual_seed(5)
    config = GPTConfig(**SMALL)
    config.extra.update(num_labels=3)
    seqs = [torch.randint(3, 99, (n,)) for n in (5, 9, 2)]
    ids, cu = torch.cat(seqs), torch.tensor([0, 5, 14, 16], dtype=torch.int32)
    packed = dict(cu_seqlens=cu, max_seqlen=9)

    tagger = OpenAIGPTForTokenClassification(config).eval()
    out = tagger(ids, **packed)
    alone = torch.cat([tagger(s[None]).logits[0] for s in seqs])
    assert_parity(out.logits, alone)
    labels = torch.tensor([0, 1, IGNORE, 2, 0, 1, 1, IGNORE, 0, 0, 2, 2, 1, 0, IGNORE, 1])
    h = tagger.transformer(ids, **packed).last_hidden_state
    l1 = lm_loss(tagger.transformer, h, ids, cu)[1]
    got = tagger(ids, **packed, labels=labels, labelled_only=True)
    assert got.logits.shape == (13, 3)
    want = torch.nn.functional.cross_entropy(out.logits, labels, ignore_index=IGNORE) + 0.5 * l1
    assert_parity(got.loss, want)

    qa = OpenAIGPTForQuestionAnswering(config).eval()
    out = qa(ids, **packed, start_positions=torch.tensor([1, 3, 0]), end_positions=torch.tensor([2, 8, 1]))
    assert_parity(out.start_logits, torch.cat([qa(s[None]).start_logits[0] for s in seqs]))
    h = qa.transformer(ids, **packed).last_hidden_state
    l2 = sum(torch.nn.functional.cross_entropy(lg[None], torch.tensor([p])) for lg, p in
             zip(list(out.start_logits.split([5, 9, 2])) + list(out.end_logits.split([5, 9, 2])),
                 [1, 3, 0, 2, 8, 1])) / 6
    assert_parity(out.loss, l2 + 0.5 * lm_loss(qa.transformer, h, ids, cu)[1])

    mc = OpenAIGPTForMultipleChoice(config).eval()  # example 0: choices 0, 1; example 1: choice 2
    out = mc(ids, **packed, num_choices=torch.tensor([2, 1]), labels=torch.tensor([1, 0]))
    scores = [mc.multiple_choice_head(mc.transformer(s[None]).last_hidden_state[:, -1]) for s in seqs]
    assert_parity(out.logits[0], torch.cat(scores[:2]))
    assert out.logits[1, 1] == torch.finfo(out.logits.dtype).min  # no second choice

    config.extra.update(num_labels=1, problem_type="regression")
    config = dataclasses.replace(config, both_orders=True)
    sim = OpenAIGPTForSequenceClassification(config).eval()
    types = torch.tensor([0, 0, 1, 1, 1] + [0] * 4 + [1] * 5 + [0, 0])
    swapped = both_orders(ids, types, cu)
    out = sim(ids, token_type_ids=types, **packed, labels=torch.tensor([0.5, 1.0, 2.0]))
    final = [sim.transformer(x[None]).last_hidden_state[0, -1] for x in (*seqs, *swapped.split([5, 9, 2]))]
    want = torch.stack([sim.score(final[i] + final[i + 3]) for i in range(3)])
    assert_parity(out.logits, want)
    with pytest.raises(ValueError, match="token_type_ids"):
        sim(ids, **packed)


@torch.no_grad()
def test_multiple_choice_matches_transformers_double_heads_both_ways(tmp_path):
    """Our multiple-choice head is transformers' OpenAIGPTDoubleHeadsModel's (mc_token_ids at each
    choice's last token): the same scores from their checkpoint, and theirs from ours."""
    from torchbert.baselines.gpt import OpenAIGPTForMultipleChoice

    torch.manual_seed(6)
    ref = transformers.OpenAIGPTDoubleHeadsModel(transformers.OpenAIGPTConfig(**SMALL)).eval()
    ref.save_pretrained(tmp_path / "theirs")
    ours = OpenAIGPTForMultipleChoice.from_pretrained(tmp_path / "theirs").eval()
    ids = torch.randint(1, SMALL["vocab_size"], (2, 3, 7))  # 2 examples, 3 choices, 7 tokens
    last = torch.full((2, 3), 6)
    assert_parity(ours(ids).logits, ref(ids, mc_token_ids=last).mc_logits)
    ours.save_pretrained(tmp_path / "ours")
    back = transformers.OpenAIGPTDoubleHeadsModel.from_pretrained(tmp_path / "ours").eval()
    assert_parity(ours(ids).logits, back(ids, mc_token_ids=last).mc_logits)


def test_export_refuses_a_gpt_in_words(theirs):
    from torchbert.apps.export import load_for_export

    with pytest.raises(ValueError, match=r": export handles BERT models; this is a .*GPT.* model$"):
        load_for_export(theirs[1])
