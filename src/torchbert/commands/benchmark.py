"""fine-tune and score models on a whole suite (GLUE, local) with the paper's protocol, in one table

Each task of the suite is fine-tuned for every learning rate (and batch size) of the protocol, dev picks
the best, more seeds (or, on small sets, the paper's random restarts) run at it; summary.md is the
paper's table, a row per model beside published rows, with the spread over seeds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..settings import add_flags, setting
from .common import command, holds_files, keep_memory, settings_from, shared_flags


def _suites() -> tuple[str, ...]:
    from ..apps.suites import SUITES

    return tuple(SUITES)


def _protocols_text() -> str:
    import textwrap
    from dataclasses import fields

    from ..apps.benchmark import PROTOCOLS, Protocol

    lines = [textwrap.fill(text, 100, initial_indent=f"  {name:8s} ", subsequent_indent=" " * 11)
             for name, (_, text) in PROTOCOLS.items()]
    keys = ", ".join(f.name for f in fields(Protocol))
    lines.append("  FILE.json  the paper's, some settings changed: {\"lrs\": [3e-5], \"seeds\": 3}")
    lines.append(textwrap.fill(f"settings: {keys}", 100, initial_indent=" " * 13, subsequent_indent=" " * 13))
    return "\n".join(lines)


def _layouts_text() -> str:
    from ..apps.suites import SUITES

    return "\n\n".join(s.layout for s in SUITES.values())


WRITES_FOLDER = True
COMPUTES = True


def epilog() -> str:
    """Made when the parser is: the protocols and suites are registries."""
    return f"""\
examples:
  torchbert benchmark local --model minilm --out runs/local          # minutes on 2 CPU cores
  torchbert benchmark glue --model runs/mybert minilm --data glue_data --out runs/glue
  torchbert benchmark glue --model runs/mybert --data glue_data --tasks RTE MRPC --out runs/small
  torchbert benchmark glue --model minilm --data glue_data --out runs/glue --resume   # after a stop

Protocols (--protocol):
{_protocols_text()}

Folder layouts (--data):
{_layouts_text()}

Every run is a run folder under OUT/runs/MODEL/TASK/ with its command line printed as it starts; an
interrupted benchmark continues with --resume (finished runs are kept, an interrupted one continues
from its checkpoint). OUT gets summary.md (the table), summary.json (every figure and its run folder),
scores.png, and submission/MODEL/ where the test labels are hidden.
"""


@dataclass(kw_only=True)
class BenchmarkSettings:
    suite: str = setting(help="the suite to run", flag="suite", choices=_suites)
    model: list[str] = setting(help="models to fine-tune: folders, `minilm`, or hub ids; NAME=PATH names a row of "
                                    "the table (default: the folder's name)", metavar="MODEL")
    out: str = setting(help="output folder")
    data: str | None = setting(None, "the suite's folder, in its official layout (below); none for local")
    protocol: str = setting(None, "a protocol's name or a JSON file (below); default: the suite's own (glue: "
                                  "paper, local: local)", metavar="NAME|FILE")
    tasks: list[str] | None = setting(None, "run these tasks of the suite only (default: every one its folder holds)",
                                      metavar="TASK")
    max_train: int | None = setting(None, "the first N training examples of each task (a quick look; the local "
                                          "suite's default is 1,000)", low=1, metavar="N")
    precision: str = setting("fp32", "the runs' training precision: fp32, the paper's and the same on every CPU; "
                                     "or bf16, finetune's --precision bf16 (where the CPU multiplies bf16 "
                                     "natively, `torchbert env` says: MiniLM's training 1.7x faster on Zen 4, a "
                                     "whole run 1.4x; dev and test still scored in fp32)", choices=("fp32", "bf16"))
    jobs: int | None = setting(None, "runs side by side, each in a worker process of its own, sharing the cores "
                                     "as torchbert jobs do (default: 1; with several GPUs, one run a GPU)",
                               low=1, metavar="N")


def add(sub) -> None:
    p = command(sub, __name__, epilog=epilog())
    add_flags(p, BenchmarkSettings)
    shared_flags(p, "device", "threads", "resume", "overwrite", "quiet",
                 resume="continue an earlier benchmark in --out: finished runs are kept",
                 quiet="print the table at the end and nothing before it (no line per run; errors and warnings "
                       "still go to stderr)")


def models_of(given: list[str]) -> dict[str, Path]:
    """NAME -> model folder, from --model's words."""
    from .common import resolve_model

    models: dict[str, Path] = {}
    for word in given:
        name, sep, where = word.partition("=")
        if not sep:
            name, where = (word if word == "minilm" else Path(word.rstrip("/")).name), word
        if not name or not where:
            raise UserError(f"--model {word}: expected a model, or NAME=MODEL")
        if name in models:
            raise UserError(f"--model: two models are named {name!r}; name them apart with NAME=MODEL")
        models[name] = resolve_model(where)
    return models


def jobs_of(given: int | None, device: str) -> int:
    """--jobs, or its default: one run at a time, or one a GPU where the runs go to several."""
    if given is not None:
        return given
    if device not in ("auto", "cuda"):  # the CPU, or one GPU named
        return 1
    import torch

    return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1


def run(args) -> None:
    from ..apps.benchmark import MARKER, plan_benchmark, read_protocol, run_benchmark
    from ..apps.suites import SUITES
    from ..train.distributed import Dist
    from ..train.rundir import RunFolder

    s = settings_from(BenchmarkSettings, args)
    out = Path(s.out)
    log = (lambda *a, **k: None) if args.quiet else print
    suite = SUITES[s.suite]
    if suite.discover is not None:  # searched with the models' own embeddings: nothing is trained
        given = [f for f, v in (("--protocol", s.protocol), ("--max-train", s.max_train),
                                 ("--precision", s.precision != "fp32")) if v]
        if given:
            raise UserError(f"{given[0]}: the {suite.name} suite fine-tunes nothing (each model's own sentence "
                            "embeddings search each dataset)")
        protocol, text = None, "none: each model's own sentence embeddings (its pooling), cosine, exact search"
    else:
        protocol, text = read_protocol(s.protocol or suite.protocol)
    models = models_of(s.model)
    data = Path(s.data) if s.data else None
    plan = plan_benchmark(s.suite, models, data, out, protocol, s.tasks, s.max_train, log=log,
                          precision=s.precision)
    holds = holds_files(out)
    if holds and args.resume and not (out / MARKER).is_file():
        raise UserError(f"--out {out}: holds no earlier benchmark to resume")
    inputs = [*(("--model", m) for m in models.values()), *((("--data", data),) if data else ())]
    folder = RunFolder(out, resume=args.resume and holds, overwrite=args.overwrite, inputs=inputs, log=log,
                       kept_until="has finished its first run")
    keep_memory(True)  # its runs train in this process, as finetune does in its own
    with folder.opened(Dist()):  # kept once a run finished (an earlier folder, or a fresh one, put back before)
        jobs = jobs_of(s.jobs, args.device)
        runner = None
        if jobs > 1:
            from ..apps.benchmark_jobs import Parallel

            def runner(bench):
                return Parallel(bench, jobs, args.device, getattr(args, "threads", None), log).run()
        summary = run_benchmark(plan, text, s.max_train, log=log, on_done=folder.commit, device=args.device,
                                runner=runner)
    if args.quiet:
        from ..apps.benchmark_table import summary_markdown

        print(summary_markdown(summary))
