"""The endpoints of `torchbert serve`, one class each, registered in ENDPOINTS.

An endpoint is the whole of one route: which model folders it serves (`serves`), how it is built
from the server's Spec (`from_spec`: its request side in the server, the model itself in the worker
process), how a request body becomes items and their tokens (`decode`, a Rejected naming the field
when it does not fit), how the model runs a batch of items from any requests (`__call__`, in the
worker), and how a request's results become its response body (`encode`); an endpoint with options
of its own declares them as a dataclass of `setting` fields (`Settings`), which `serve` makes flags
of, under the endpoint's route, and hands to `from_spec` in the Spec's `options`. The app (serve.py)
gives every registered endpoint its route, its batcher and its metrics; a new route is one class
here, and `register_endpoint` (docs/architecture.md works an example). Which of them a fine-tuned run offers,
its task's family says (TaskFamily.endpoints).

    POST /v1/embeddings   Embedder: sentence embeddings, OpenAI's request and response
    POST /predict         Predictor: a fine-tuned model's predictions, the records of `torchbert predict`
    POST /v1/rerank       Reranker: a reranker's relevance scores, Cohere's and Jina's request and response
"""

from __future__ import annotations

import base64
import itertools
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from ..settings import Checked, setting
from .batcher import Limits, Rejected, budget_batches


@dataclass
class Call:
    """A request, decoded: its items (what the model side takes), each one's tokens (what the batcher
    budgets), and what `encode` needs besides the results."""

    items: list
    tokens: list[int]
    context: Any = None


class Endpoint(Protocol):
    endpoint: ClassVar[str]  # its name in /metrics and /health, and in the worker
    path: ClassVar[str]  # its route (POST)
    # (optional) Settings: ClassVar[type], its own options, a Checked dataclass: serve's flags under its
    # route; from_spec finds them in spec.options[endpoint] (absent: its defaults)
    name: str  # the served model's name
    precision: str

    @classmethod
    def serves(cls, folder: Path, config) -> bool: ...

    @classmethod
    def from_spec(cls, spec, load: bool, loaded: dict) -> Endpoint: ...

    def decode(self, body: dict, limits: Limits) -> Call: ...

    def __call__(self, items: list) -> list: ...

    def encode(self, results: list, call: Call) -> dict: ...


@dataclass
class EmbedderSettings(Checked):
    pooling: str | None = setting(None, "how tokens become one vector (default: the model folder's own, as its "
                                        "sentence-transformers files say, else mean)", choices=("cls", "mean", "max"))
    normalize: bool = setting(True, "unit-length embeddings, as OpenAI's (default: on)")


class Embedder:
    """A BERT encoder's sentence embeddings, as `torchbert embed` computes them: from a folder, or
    from the encoder and tokenizer of a loaded model. load=False: the tokenizer side only (what the
    server's event loop needs when the model runs in a worker process)."""

    endpoint = "embeddings"
    path = "/v1/embeddings"
    Settings = EmbedderSettings  # serve's --pooling and --normalize

    def __init__(self, model_dir: Path | None, *, name: str, pooling: str | None = None, normalize: bool = True,
                 max_length: int | None = None, limits: Limits | None = None, device: str = "cpu",
                 precision: str = "fp32", model=None, tokenizer=None, load: bool = True):
        import torch

        from ..architectures import load_config
        from ..fast import at_precision
        from ..io.hf import folder_max_length, folder_pooling
        from ..model import BertModel
        from ..tokenizer import BertTokenizer

        # None: the folder's own (its sentence-transformers files), else mean
        self.pooling = pooling or (folder_pooling(model_dir) if model_dir is not None else "mean")
        self.name, self.normalize = name, normalize
        self.limits, self.precision = limits or Limits(), precision
        self.tokenizer = tokenizer or BertTokenizer.from_pretrained(model_dir)
        self.model = model
        if model is None and load:  # a model given (a fine-tuned one's encoder) is in `precision` already
            self.model = at_precision(BertModel.from_pretrained(model_dir, add_pooling_layer=False)  # pools tokens
                                      .eval().to(torch.device(device)), precision)
        self.config = model.config if model is not None else load_config(model_dir)
        limit = self.config.max_position_embeddings  # a flag's length, else the folder's (as embed), else the model's
        own = folder_max_length(model_dir) if model_dir is not None and max_length is None else None
        self.max_length = min(max_length or own or limit, limit)
        self.sep = self.tokenizer.sep_token_id

    @classmethod
    def serves(cls, folder: Path, config) -> bool:
        """A BERT's folder, fine-tuned for a task whose family offers embeddings or not fine-tuned (GPT
        and ELMo have no BERT encoder to embed with)."""
        from ..architectures import architecture_of

        return architecture_of(config).embeds and offered(folder, cls.endpoint, plain=True)

    @classmethod
    def from_spec(cls, spec, load: bool, loaded: dict) -> Embedder:
        from ..io.hf import folder_pooling

        own = spec.options.get(cls.endpoint) or EmbedderSettings()
        kw = dict(name=spec.name, pooling=folder_pooling(spec.model_dir, own.pooling), normalize=own.normalize,
                  max_length=spec.max_length, limits=spec.limits, precision=spec.precision)
        task_model = loaded.get("task_model")
        if load and task_model is not None:  # a fine-tuned BERT: its encoder, loaded once
            return cls(None, model=task_model.bert, tokenizer=loaded["tokenizer"], **kw)
        return cls(Path(spec.model_dir), device=spec.device, load=load, **kw)

    def tokenize(self, texts: list[str]) -> tuple[list[list[int]], list[int]]:
        """Token ids per text (with [CLS] and [SEP]), cut to max_length; and the indexes of those cut."""
        ids = self.tokenizer.encode_ids(texts)
        cut = [i for i, x in enumerate(ids) if len(x) > self.max_length]
        for i in cut:
            ids[i] = ids[i][:self.max_length - 1] + [self.sep]
        return ids, cut

    def decode(self, body: dict, limits: Limits) -> Call:
        texts = _texts(body, limits)
        dims = _dimensions(body, self.config.hidden_size, self.config.extra.get("matryoshka") or ())
        ids, cut = self.tokenize(texts)
        return Call(ids, [len(x) for x in ids], (cut, body.get("encoding_format", "float"), dims))

    def __call__(self, ids: list[list[int]]) -> np.ndarray:
        from ..features import embed_ids

        out = np.empty((len(ids), self.config.hidden_size), dtype=np.float32)
        with _fast(self.model):
            for idx in budget_batches([len(x) for x in ids], self.limits.max_batch_tokens):
                out[idx] = embed_ids(self.model, [ids[i] for i in idx], pooling=self.pooling,
                                     normalize=self.normalize, batch_size=len(idx))
        if not np.isfinite(out).all():  # whatever the encoding asked (base64 would carry them)
            from ..errors import NonFiniteOutput

            raise NonFiniteOutput("the model's output for this request holds NaN or inf")
        return out

    def encode(self, vectors: list, call: Call) -> dict:
        cut, fmt, dims = call.context
        if dims is not None:  # Matryoshka: the first dims, then unit length again
            vectors = [v[:dims] / max(float(np.linalg.norm(v[:dims])), 1e-12) if self.normalize else v[:dims]
                       for v in vectors]
        if fmt == "base64":
            data = [base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii") for v in vectors]
        else:
            data = [v.tolist() for v in vectors]
        tokens = sum(call.tokens)
        content = {"object": "list", "model": self.name,
                   "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
                   "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        if cut:  # OpenAI's API has no such field; ours says what was done
            content["truncated"] = {"indexes": cut, "max_tokens": self.max_length,
                                    "kept": "the first tokens ([SEP] last)"}
        return content


class Predictor:
    """A model fine-tuned by torchbert: for JSON examples, the records `torchbert predict` writes.
    Each example is encoded as it arrives (its windows' tokens are what the batcher budgets); the
    worker encodes a batch's examples again and runs them in one packed pass."""

    endpoint = "predict"
    path = "/predict"

    def __init__(self, model_dir: Path, *, name: str, device: str = "cpu", precision: str = "fp32",
                 load: bool = True):
        import torch

        from ..architectures import load_config
        from ..tasks.families import TaskSettings, family
        from ..tasks.predict import id2label, load_finetuned
        from ..tokenizer import BertTokenizer

        self.name, self.precision = name, precision  # fp32, bf16 or int8
        if load:
            self.model, self.tokenizer, self.ts, _ = load_finetuned(model_dir, None, torch.device(device),
                                                                    self.precision)
            self.config = self.model.config
        else:  # the task's settings and the tokenizer, to read requests; the model runs elsewhere
            self.model, self.config = None, load_config(model_dir)
            self.tokenizer = BertTokenizer.from_pretrained(model_dir)
            self.ts = TaskSettings.of(model_dir)
        self.family, self.id2label = family(self.ts.type), id2label(self.config)
        self.device = torch.device(device)
        self.serial = itertools.count()  # examples of different requests share a batch: their ids must not clash

    @classmethod
    def serves(cls, folder: Path, config) -> bool:
        """A folder written by `torchbert finetune` (its run record names the task) for a task whose
        family offers predictions."""
        return offered(folder, cls.endpoint)

    @classmethod
    def from_spec(cls, spec, load: bool, loaded: dict) -> Predictor:
        predictor = cls(Path(spec.model_dir), name=spec.name, device=spec.device, precision=spec.precision,
                        load=load)
        if load:  # the embeddings of a fine-tuned BERT come from this model's encoder
            loaded.update(task_model=predictor.model, tokenizer=predictor.tokenizer)
        return predictor

    def decode(self, body: dict, limits: Limits) -> Call:
        """The request's examples (with ids unique to this server) and their tokens, the ids to answer
        with as the context; or Rejected naming the field that is wrong."""
        records = body.get("inputs")
        if not isinstance(records, list) or not records:
            raise Rejected(400, "field 'inputs' must be a non-empty list of examples (JSON objects, as the lines "
                                f"of a {self.ts.type} task's JSON Lines file)")
        if len(records) > limits.max_texts:
            raise Rejected(413, f"field 'inputs' holds {len(records)} examples; at most {limits.max_texts} per request")
        examples, ids = [], []
        for i, record in enumerate(records):
            where = f"inputs[{i}]"
            if not isinstance(record, dict):
                raise Rejected(400, f"field '{where}' is {type(record).__name__}; expected a JSON object")
            for text in _strings(record):
                _check_unicode(text, where)
            chars = sum(len(x) for x in _strings(record))
            if chars > limits.max_chars:
                raise Rejected(413, f"field '{where}' holds {chars} characters; at most {limits.max_chars}")
            try:
                example = self.family.from_record(record, where, str(i))
            except ValueError as e:
                raise Rejected(400, str(e)) from None
            ids.append(example.id)
            examples.append(replace(example, id=f"#{next(self.serial)}"))
        encoded = self.family.encode(self.tokenizer, examples, self.ts, None, training=False, use_labels=False)
        per_example = np.zeros(len(examples), dtype=np.int64)
        np.add.at(per_example, np.asarray(encoded.example_index), [len(r) for r in encoded.input_ids])
        return Call(examples, [max(1, int(n)) for n in per_example], ids)

    def __call__(self, examples: list) -> list[dict]:
        from ..tasks.batches import TaskData
        from ..tasks.predict import predict

        encoded = self.family.encode(self.tokenizer, examples, self.ts, None, training=False, use_labels=False)
        data = TaskData(encoded, self.family)
        with _fast(self.model):  # the batcher sized it: one pass
            return predict(self.model, data, examples, self.ts, self.id2label, len(data), self.device)

    def encode(self, records: list, call: Call) -> dict:
        for record, ident in zip(records, call.context):
            record["id"] = ident
        return {"model": self.name, "task": self.ts.type, "predictions": records}


class Reranker:
    """A reranker fine-tuned by torchbert (finetune --task reranker): a query and its documents ->
    each document's relevance (the sigmoid of the cross-encoder's score, as sentence-transformers'
    CrossEncoder.predict), best first. The request and response of Cohere's and Jina's rerank APIs,
    which text-embeddings-inference and infinity also take: {query, documents, top_n,
    return_documents} -> {results: [{index, relevance_score, document}], usage}. Each (query,
    document) pair is one item of the batcher: a request's documents share batches with others'."""

    endpoint = "rerank"
    path = "/v1/rerank"

    def __init__(self, model_dir: Path, *, name: str, max_length: int | None = None, device: str = "cpu",
                 precision: str = "fp32", load: bool = True):
        import torch

        from ..architectures import load_config
        from ..tasks.families import TaskSettings, family
        from ..tasks.predict import load_finetuned
        from ..tokenizer import BertTokenizer

        self.name, self.precision, self.device = name, precision, torch.device(device)
        if load:
            self.model, self.tokenizer, ts, _ = load_finetuned(model_dir, None, self.device, precision)
            self.config = self.model.config
        else:
            self.model, self.config = None, load_config(model_dir)
            self.tokenizer, ts = BertTokenizer.from_pretrained(model_dir), TaskSettings.of(model_dir)
        limit = self.config.max_position_embeddings
        self.ts = replace(ts, max_length=min(max_length or ts.max_length, limit))  # --max-length, else as trained
        self.family = family(self.ts.type)
        self.serial = itertools.count()

    @classmethod
    def serves(cls, folder: Path, config) -> bool:
        return offered(folder, cls.endpoint)

    @classmethod
    def from_spec(cls, spec, load: bool, loaded: dict) -> Reranker:
        return cls(Path(spec.model_dir), name=spec.name, max_length=spec.max_length, device=spec.device,
                   precision=spec.precision, load=load)

    def decode(self, body: dict, limits: Limits) -> Call:
        from ..tasks.reranker import RerankExample

        query = body.get("query")
        if not isinstance(query, str) or not query.strip():
            raise Rejected(400, "field 'query' must be a non-empty string")
        docs = body.get("documents")
        if not isinstance(docs, list) or not docs:
            raise Rejected(400, "field 'documents' must be a non-empty list of strings (or of {\"text\": ...} "
                                "objects)")
        if len(docs) > limits.max_texts:
            raise Rejected(413, f"field 'documents' holds {len(docs)} documents; at most {limits.max_texts} per "
                                "request")
        texts = []
        for i, d in enumerate(docs):
            text = d.get("text") if isinstance(d, dict) else d
            if not isinstance(text, str) or not text.strip():
                raise Rejected(400, f"field 'documents[{i}]' must be a non-empty string or an object with a "
                                    "non-empty 'text'")
            texts.append(text)
        for where, text in (("query", query), *((f"documents[{i}]", t) for i, t in enumerate(texts))):
            if len(text) > limits.max_chars:
                raise Rejected(413, f"field '{where}' is {len(text)} characters; at most {limits.max_chars}")
            _check_unicode(text, where)
        top_n = body.get("top_n", len(texts))
        if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1:
            raise Rejected(400, f"field 'top_n' must be a positive integer, got {json.dumps(top_n)[:40]}")
        back = body.get("return_documents", False)
        if not isinstance(back, bool):
            raise Rejected(400, f"field 'return_documents' must be true or false, got {json.dumps(back)[:40]}")
        pairs = [RerankExample(f"#{next(self.serial)}", query, [t], None) for t in texts]
        encoded = self.family.encode(self.tokenizer, pairs, self.ts, None, training=False, use_labels=False)
        return Call(pairs, [len(r) for r in encoded.input_ids], (texts, min(top_n, len(texts)), back))

    def __call__(self, pairs: list) -> list[float]:
        from ..tasks.batches import TaskData
        from ..tasks.predict import predict

        encoded = self.family.encode(self.tokenizer, pairs, self.ts, None, training=False, use_labels=False)
        data = TaskData(encoded, self.family)
        with _fast(self.model):  # the batcher sized it: one pass
            records = predict(self.model, data, pairs, self.ts, None, len(data), self.device)
        return [r["scores"][0] for r in records]

    def encode(self, scores: list, call: Call) -> dict:
        texts, top_n, back = call.context
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:top_n]
        tokens = sum(call.tokens)
        return {"object": "list", "model": self.name,
                "results": [{"index": i, "relevance_score": scores[i], **({"document": {"text": texts[i]}} if back
                                                                              else {})} for i in order],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def offered(folder: Path, endpoint: str, plain: bool = False) -> bool:
    """Whether `serve` offers `endpoint` for a folder: for a run `torchbert finetune` wrote, when its
    task's family lists it (TaskFamily.endpoints); for any other folder, when `plain`."""
    from ..io.record import read_record
    from ..tasks.families import FAMILIES

    record = read_record(folder)
    if record is None or not record.fine_tuned:
        return plain
    kind = (record.task or {}).get("type")
    return kind in FAMILIES and endpoint in FAMILIES[kind].endpoints


# a fine-tuned model loads first: Embedder shares its encoder
ENDPOINTS: list[type[Endpoint]] = [Predictor, Reranker, Embedder]


def register_endpoint(cls: type[Endpoint]) -> type[Endpoint]:
    """A new endpoint class, served by every folder it `serves` (usable as a class decorator)."""
    if any(x.endpoint == cls.endpoint or x.path == cls.path for x in ENDPOINTS):
        raise ValueError(f"an endpoint named {cls.endpoint!r} or at {cls.path} is registered already")
    ENDPOINTS.append(cls)
    return cls


def _fast(model):
    """torchbert.fast's attention for inference: on a CUDA GPU under bf16, FlashAttention's varlen
    kernel over the packed batch (1.26x the texts/s of SDPA on a padded block, bench/README.md); the
    plain path elsewhere."""
    from .. import fast

    return fast.inference(model)


# -- what a request may hold ---------------------------------------------------------------------------

def _check_unicode(text: str, where: str) -> None:
    """Rejected unless `text` is valid Unicode: JSON's \\u escapes can spell a lone surrogate (half of a
    UTF-16 pair), which no encoder takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Rejected(400, f"field '{where}' holds a lone surrogate (\\u{ord(text[e.start]):04x} at character "
                            f"{e.start}): not valid Unicode text") from None


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _texts(body: dict, limits: Limits) -> list[str]:
    """The `input` of an embeddings request as a list of texts, or Rejected naming what is wrong."""
    if "input" not in body:
        raise Rejected(400, "missing field 'input': a string or a list of strings")
    texts = body["input"]
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts:
        raise Rejected(400, "field 'input' must be a string or a non-empty list of strings")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise Rejected(400, f"field 'input[{i}]' is {type(t).__name__}; expected a string (token arrays "
                                "are not accepted: send text)")
    if len(texts) > limits.max_texts:
        raise Rejected(413, f"field 'input' holds {len(texts)} texts; at most {limits.max_texts} per request")
    for i, t in enumerate(texts):
        if len(t) > limits.max_chars:
            raise Rejected(413, f"field 'input[{i}]' is {len(t)} characters; at most {limits.max_chars}")
        _check_unicode(t, f"input[{i}]")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise Rejected(400, f"field 'encoding_format' is {json.dumps(fmt)[:40]}; expected \"float\" or \"base64\"")
    return texts


def _dimensions(body: dict, size: int, trained: list[int]) -> int | None:
    """OpenAI's `dimensions`: a model trained with Matryoshka (finetune --task embedding --matryoshka)
    gives the first D dimensions of its vectors for each D it was trained at (`trained`; unit length
    again when normalized); another one's vectors have their own size only. None: the full vectors."""
    if "dimensions" not in body:
        return None
    d = body["dimensions"]
    if not isinstance(d, int) or isinstance(d, bool) or d < 1:
        raise Rejected(400, f"field 'dimensions' must be a positive integer, got {json.dumps(d)[:40]}")
    if d > size:
        raise Rejected(400, f"field 'dimensions' is {d}: this model's embeddings have {size} dimensions")
    if d != size and not trained:
        raise Rejected(400, f"field 'dimensions' is {d}: this model's embeddings have {size} dimensions and it was "
                            "not trained to shorten them (leave 'dimensions' out)")
    if d != size and d not in trained:
        sizes = ", ".join(map(str, sorted({*trained, size})))
        raise Rejected(400, f"field 'dimensions' is {d}: this model was trained for {sizes} dimensions only "
                            "(its first D dimensions at another D were never trained to stand alone)")
    return None if d == size else d
