"""serve a model over HTTP: OpenAI-style /v1/embeddings, /v1/rerank and /predict, batched across clients

Serve a model over HTTP: a BERT's sentence embeddings (POST /v1/embeddings), a reranker's relevance
scores (POST /v1/rerank), and a fine-tuned model's predictions (POST /predict). Requests from
concurrent clients are batched together under a token budget."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..settings import Checked, add_flags, setting
from .common import command, cpu_for_int8, inference_precision, int8_note, resolve_model, settings_from, shared_flags

COMPUTES = True
EPILOG = """\
examples:
  torchbert serve --model minilm                       # http://127.0.0.1:8000
  curl -s localhost:8000/v1/embeddings -H 'Content-Type: application/json' \\
       -d '{"input": ["a first text", "a second"], "model": "minilm"}'
  python -c "from openai import OpenAI; c = OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='-'); \\
print(len(c.embeddings.create(model='minilm', input='hello').data[0].embedding))"

A run of `finetune --task embedding` serves its embeddings; with --matryoshka, `dimensions` gives
their first D dimensions (unit length again). A run of `finetune --task reranker` answers POST
/v1/rerank, Cohere's and Jina's shape (top_n and return_documents optional), results best first:
  curl -s localhost:8000/v1/rerank -H 'Content-Type: application/json' \\
       -d '{"query": "北京是哪国的首都？", "documents": ["北京是中国的首都。", "猫喜欢睡觉。"], "top_n": 1}'

Another folder written by `torchbert finetune` answers POST /predict: {"inputs": [...]}, each
example a JSON object as a line of the task's JSON Lines file ({"text"} or {"sentence1",
"sentence2"}; {"tokens": [words]} for tagging; {"question", "context"} for QA; {"context",
"choices"} for multiple choice), answered with the records `torchbert predict` writes:
  curl -s localhost:8000/predict -H 'Content-Type: application/json' \\
       -d '{"inputs": [{"text": "这家餐厅很好吃"}]}'

Embeddings responses: OpenAI's embeddings object (data[i].embedding, usage.prompt_tokens), with
encoding_format "float" or "base64" (little-endian float32); a text over --max-length tokens is cut
and the response's `truncated` names it. Errors: 400 for malformed JSON or a wrong field (the
message names it), 413 over --max-texts, --max-chars or the body size, 503 with Retry-After when
--max-queue texts are waiting. The embeddings equal `torchbert embed --normalize` on the same
model (the same pooling: the folder's own). GET /metrics: Prometheus text (requests by status,
latency histogram, texts and tokens per batch, queue depth).
"""


@dataclass(kw_only=True)
class ServeSettings(Checked):
    host: str = setting("127.0.0.1", "address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0 for all)")
    port: int = setting(8000, "port", low=0, high=65535)
    name: str | None = setting(None, "the model name this server serves: responses give it, and a request that names "
                                     "another model gets 404 (default: the folder's name)",
                               aliases=("--served-model-name",))
    api_key: str | None = setting(None, "the model endpoints and /v1/models then want 'Authorization: Bearer KEY' "
                                        "(else 401); /health and /metrics stay open (default: $TORCHBERT_API_KEY, "
                                        "else none: anyone who can reach the port may use the model). Prefer the "
                                        "variable: a key on the command line is shown to every user of the machine "
                                        "by `ps`")
    max_length: int | None = setting(None, "tokens kept per text; longer texts are cut and the response says which "
                                           "(default: the length the model folder was trained with, as `embed`, "
                                           "`predict` and sentence-transformers use it; else the model's limit)",
                                     low=2)
    log_level: str = setting("info", "uvicorn's log level; debug also logs each request (default: info)",
                             choices=("warning", "info", "debug"))


def add(sub) -> None:
    from ..apps.batcher import Limits
    from ..apps.endpoints import ENDPOINTS

    p = command(sub, __name__)
    shared_flags(p, "model")
    add_flags(p, ServeSettings, skip=("log_level",))
    for cls in ENDPOINTS:  # each endpoint's own options, under its route
        if getattr(cls, "Settings", None) is not None:
            add_flags(p.add_argument_group(f"POST {cls.path}"), cls.Settings)
    add_flags(p, Limits)
    add_flags(p, ServeSettings, only=("log_level",))
    shared_flags(p, "device", "threads", "precision", "int8")


def endpoint_options(args) -> dict:
    """Each endpoint's own settings from the parsed flags, by endpoint name (the Spec's `options`)."""
    from ..apps.endpoints import ENDPOINTS

    return {cls.endpoint: settings_from(cls.Settings, args) for cls in ENDPOINTS
            if getattr(cls, "Settings", None) is not None}


def run(args) -> None:
    from ..apps.batcher import Limits
    from ..apps.serve import create_app, server_settings
    from ..apps.worker import Spec, build, worker_pool

    s = settings_from(ServeSettings, args)
    limits = settings_from(Limits, args)
    api_key = s.api_key if s.api_key is not None else os.environ.get("TORCHBERT_API_KEY")
    if api_key is not None and not api_key.strip():
        raise UserError("--api-key is empty (or $TORCHBERT_API_KEY is set but empty): give a key, or leave it out")
    if s.api_key is not None and s.api_key != os.environ.get("TORCHBERT_API_KEY"):
        print("torchbert: warning: --api-key on the command line is shown to every user of this machine (ps, "
              "/proc); export TORCHBERT_API_KEY=... instead", file=sys.stderr)
    try:
        import uvicorn
    except ImportError:
        raise UserError("torchbert serve needs uvicorn and starlette: pip install uvicorn starlette") from None
    model_dir = resolve_model(args.model)
    device = cpu_for_int8(args)
    precision = inference_precision(args, device, model_dir)
    from ..architectures import load_config

    limit = load_config(model_dir).max_position_embeddings
    if s.max_length is not None and s.max_length > limit:
        raise UserError(f"--max-length must be in [2, {limit}] for this model, got {s.max_length}")
    name = s.name or Path(args.model).name
    spec = Spec(str(model_dir), name, max_length=s.max_length, options=endpoint_options(args), limits=limits,
                device=str(device), precision=precision, threads=args.threads)
    try:  # what the folder says where a flag left it open (the pooling), checked before anything is served
        if args.int8:  # ONNX Runtime runs a batch in one call, which lets go of the interpreter lock: a thread will do
            int8_note()
            served = build(spec, load=True)
            workers = None
        else:  # PyTorch's many small steps would wait on the event loop for the lock: a process of its own
            served = build(spec, load=False)  # the request side
            workers = worker_pool(spec)
    except ValueError as e:
        raise UserError(str(e)) from None
    task = next((f", a {x.ts.type} model" for x in served if hasattr(x, "ts")), "")
    print(f"serving {model_dir} as {name!r}{task} on http://{s.host}:{s.port} "
          f"({', '.join(f'POST {x.path}' for x in served)}, GET /v1/models, GET /health, GET /metrics); Ctrl-C or "
          "SIGTERM stops after answering what is in flight", file=sys.stderr)
    try:  # the app shuts the worker down when it stops; if it never started, this does
        uvicorn.run(create_app(served, limits, workers, api_key=api_key),
                    **server_settings(limits, s.host, s.port, s.log_level))
    except BaseException:
        if workers is not None:
            workers.shutdown(wait=True, cancel_futures=True)
        raise
