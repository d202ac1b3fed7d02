"""Fine-tuning heads against transformers on the real MiniLM weights and real text, fp32; checkpoints
both ways; the packed path against the padded one."""

import pytest
import realdata
import torch
import transformers
from parity import assert_parity

from torchbert.heads import (BertForMultipleChoice, BertForQuestionAnswering, BertForSequenceClassification,
                             BertForTokenClassification)
from torchbert.packing import unpad
from torchbert.tokenizer import BertTokenizer

LABELS = {"O": 0, "B-person": 1, "I-person": 2, "B-location": 3, "I-location": 4}


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def pairs(tok):
    en = list(realdata.english_texts()[200:206])
    zh = list(realdata.peoples_daily_sentences()[200:206])
    enc = tok(en + zh, zh + en, truncation=True, max_length=80, padding=True, return_tensors="pt")
    return {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


def saved(cls, minilm_dir, folder, **config_extra):
    """MiniLM's encoder with a fresh head of `cls`, saved by torchbert."""
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="fresh initialization"):
        model = cls.from_pretrained(minilm_dir)
    if config_extra:  # the head's size comes from the config: build again with it
        model.config.extra.update(config_extra)
        state = {k: v for k, v in model.state_dict().items() if not k.startswith("classifier.")}
        torch.manual_seed(0)
        fresh = cls(model.config)
        fresh.load_state_dict(state, strict=False)
        model = fresh
    model.save_pretrained(folder)
    return folder


def both(cls, their_cls, folder):
    ours = cls.from_pretrained(folder).eval()
    assert ours.load_report == {"missing": [], "unused": []}
    return ours, their_cls.from_pretrained(folder).eval()  # transformers loads what we saved


@pytest.mark.parametrize("kind", ["single_label", "regression", "multi_label"])
@torch.no_grad()
def test_sequence_classification_matches_transformers(kind, minilm_dir, tmp_path, pairs):
    extra = {"single_label": {"id2label": {"0": "neg", "1": "mid", "2": "pos"}, "label2id": {"neg": 0, "mid": 1,
                                                                                            "pos": 2}},
             "regression": {"num_labels": 1, "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}},
             "multi_label": {"id2label": {"0": "a", "1": "b"}, "label2id": {"a": 0, "b": 1},
                             "problem_type": "multi_label_classification"}}[kind]
    folder = saved(BertForSequenceClassification, minilm_dir, tmp_path, **extra)
    ours, theirs = both(BertForSequenceClassification, transformers.BertForSequenceClassification, folder)
    B = pairs["input_ids"].shape[0]
    g = torch.Generator().manual_seed(1)
    labels = {"single_label": torch.randint(0, 3, (B,), generator=g),
              "regression": torch.rand(B, generator=g) * 5,
              "multi_label": torch.randint(0, 2, (B, 2), generator=g).float()}[kind]
    a, b = ours(**pairs, labels=labels), theirs(**pairs, labels=labels)
    assert a.logits.shape == b.logits.shape == (B, {"single_label": 3, "regression": 1, "multi_label": 2}[kind])
    assert_parity(a.logits, b.logits)
    assert_parity(a.loss, b.loss)
    ids, types, cu, T = unpad(pairs["input_ids"], pairs["attention_mask"], pairs["token_type_ids"])
    packed = ours(ids, token_type_ids=types, cu_seqlens=cu, max_seqlen=T, labels=labels)
    assert_parity(packed.logits, a.logits)
    assert_parity(packed.loss, a.loss)


@torch.no_grad()
def test_token_classification_matches_transformers(minilm_dir, tmp_path, tok):
    sents = [s for s in realdata.wnut_sentences() if any(t != "O" for t in s[1])][:8]
    words = [list(w) for w, _ in sents]
    enc = tok.backend.encode_batch(words, is_pretokenized=True)
    T = max(len(e.ids) for e in enc)
    ids = torch.zeros(len(enc), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (e, (_, tags)) in enumerate(zip(enc, sents)):
        ids[i, :len(e.ids)] = torch.tensor(e.ids)
        mask[i, :len(e.ids)] = 1
        seen = set()
        for t, w in enumerate(e.word_ids):  # the first sub-token of each word carries its tag
            if w is not None and w not in seen:
                seen.add(w)
                labels[i, t] = LABELS.get(tags[w], 0)
    id2label = {str(v): k for k, v in LABELS.items()}
    folder = saved(BertForTokenClassification, minilm_dir, tmp_path, id2label=id2label, label2id=LABELS)
    ours, theirs = both(BertForTokenClassification, transformers.BertForTokenClassification, folder)
    a, b = ours(ids, attention_mask=mask, labels=labels), theirs(input_ids=ids, attention_mask=mask, labels=labels)
    assert_parity(a.logits[mask.bool()], b.logits[mask.bool()])
    assert_parity(a.loss, b.loss)
    flat, cu, Tmax = unpad(ids, mask)
    packed = ours(flat, cu_seqlens=cu, max_seqlen=Tmax, labels=labels[mask.bool()])
    assert packed.logits.shape == (int(mask.sum()), len(LABELS))
    assert_parity(packed.logits, a.logits[mask.bool()])
    assert_parity(packed.loss, a.loss)
    # labelled_only, the training path: the last layer runs for the labelled tokens alone
    labelled = labels != -100
    assert 0 < labelled.sum() < mask.sum()
    only = ours(ids, attention_mask=mask, labels=labels, labelled_only=True)
    assert only.logits.shape == (int(labelled.sum()), len(LABELS))
    assert_parity(only.logits, b.logits[labelled])
    assert_parity(only.loss, b.loss)
    states = ours(ids, attention_mask=mask, labels=labels, labelled_only=True, output_hidden_states=True)
    assert len(states.hidden_states) == 7  # the full last layer, rows picked from it
    assert_parity(states.logits, only.logits)
    with torch.enable_grad():  # and the same gradients as the full computation, packed
        grads = []
        for kw in ({}, {"labelled_only": True}):
            ours.zero_grad()
            ours(flat, cu_seqlens=cu, max_seqlen=Tmax, labels=labels[mask.bool()], **kw).loss.backward()
            grads.append({k: p.grad.clone() for k, p in ours.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == len(list(ours.parameters()))
    for k, g in grads[0].items():
        assert_parity(grads[1][k], g, k)


@torch.no_grad()
def test_question_answering_matches_transformers(minilm_dir, tmp_path, tok, pairs):
    folder = saved(BertForQuestionAnswering, minilm_dir, tmp_path)
    ours, theirs = both(BertForQuestionAnswering, transformers.BertForQuestionAnswering, folder)
    B, T = pairs["input_ids"].shape
    lengths = pairs["attention_mask"].sum(1)
    # inside, inside, at the padded length and past it (ignored by both), and at the row's own length
    # (packed: past its last token, ignored; padded: a padding position, scored by both)
    starts = torch.stack([lengths // 2, lengths - 2, torch.full_like(lengths, T), torch.full_like(lengths, T + 5),
                          lengths], 1)[torch.arange(B), torch.arange(B) % 5]
    ends = torch.minimum(starts + 3, lengths - 1)
    ends[starts > T] = T + 9
    a = ours(**pairs, start_positions=starts, end_positions=ends)
    b = theirs(**pairs, start_positions=starts, end_positions=ends)
    m = pairs["attention_mask"].bool()
    assert_parity(a.start_logits[m], b.start_logits[m])
    assert_parity(a.end_logits[m], b.end_logits[m])
    assert_parity(a.loss, b.loss)
    # packed: each sequence scored over its own tokens only, so the loss is the padded loss with the
    # padding positions excluded; compare with transformers' logits masked by hand
    ids, types, cu, Tm = unpad(pairs["input_ids"], pairs["attention_mask"], pairs["token_type_ids"])
    p = ours(ids, token_type_ids=types, cu_seqlens=cu, max_seqlen=Tm, start_positions=starts, end_positions=ends)
    assert_parity(p.start_logits, a.start_logits[m])
    ref = sum(torch.nn.functional.cross_entropy(x.masked_fill(~m, float("-inf"))[pos < lengths], pos[pos < lengths])
              for x, pos in ((b.start_logits, starts), (b.end_logits, ends))) / 2
    assert_parity(p.loss, ref)


@torch.no_grad()
def test_multiple_choice_matches_transformers_and_pads_choices(minilm_dir, tmp_path, tok):
    contexts = list(realdata.english_texts()[10:13])
    endings = [list(realdata.english_texts()[20 + 4 * i: 24 + 4 * i]) for i in range(3)]
    flat = tok([c for c in contexts for _ in range(4)], [e for es in endings for e in es], truncation=True,
               max_length=64, padding=True, return_tensors="pt")
    inputs = {k: flat[k].view(3, 4, -1) for k in ("input_ids", "attention_mask", "token_type_ids")}
    labels = torch.tensor([0, 3, 2])
    folder = saved(BertForMultipleChoice, minilm_dir, tmp_path)
    ours, theirs = both(BertForMultipleChoice, transformers.BertForMultipleChoice, folder)
    a, b = ours(**inputs, labels=labels), theirs(**inputs, labels=labels)
    assert a.logits.shape == (3, 4)
    assert_parity(a.logits, b.logits)
    assert_parity(a.loss, b.loss)

    # example 1 keeps only 2 of its choices: padded with a choice mask, and packed with num_choices
    choice_mask = torch.ones(3, 4, dtype=torch.bool)
    choice_mask[1, 2:] = False
    small_labels = torch.tensor([0, 1, 2])
    masked = ours(**inputs, choice_mask=choice_mask, labels=small_labels)
    assert torch.equal(masked.logits[choice_mask], a.logits[choice_mask])
    assert (masked.logits[~choice_mask] < -1e30).all()
    real = choice_mask.flatten()
    ids, types, cu, T = unpad(inputs["input_ids"].view(12, -1)[real], inputs["attention_mask"].view(12, -1)[real],
                              inputs["token_type_ids"].view(12, -1)[real])
    packed = ours(ids, token_type_ids=types, cu_seqlens=cu, max_seqlen=T, num_choices=torch.tensor([4, 2, 4]),
                  labels=small_labels)
    assert_parity(packed.logits[choice_mask], a.logits[choice_mask])
    assert_parity(packed.loss, masked.loss)
    # the loss is the softmax over the real choices only
    ref = torch.nn.functional.cross_entropy(b.logits[1:2, :2], torch.tensor([1]))
    per_example = [torch.nn.functional.cross_entropy(masked.logits[i:i + 1], small_labels[i:i + 1]) for i in range(3)]
    assert_parity(per_example[1], ref)


def test_dropout_before_the_classifier_trains():
    from torchbert import BertConfig

    cfg = BertConfig.from_name("tiny", vocab_size=100, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cfg.extra["classifier_dropout"] = 0.5
    m = BertForSequenceClassification(cfg).train()
    ids = torch.randint(1, 100, (4, 9))
    assert not torch.equal(m(ids).logits, m(ids).logits)  # only the classifier's dropout is on
    m.eval()
    assert torch.equal(m(ids).logits, m(ids).logits)
