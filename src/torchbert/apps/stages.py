"""The stages of a study (demo, compare): each is one of torchbert's commands, run by calling the library
with its settings objects, and announced by the command line that runs the same from a shell.

    r = Stages(out, log=print, total=12)
    r.pretrain("pretrain bert", PretrainSettings(data=[...], out=...), TrainConfig(steps=2000, ...))
    # == pretrain bert (stage 3 of 12): torchbert pretrain --data ... --out ... --steps 2000 ...

The printed line is made from the same objects (settings.as_flags), and a test parses it back with the
command line's parser into equal objects: what the study ran is what the line runs. `done` counts the
stages finished, here or by an earlier run whose results are on disk (`found`); after each,
`on_done()` (the study's folder commits: an earlier one set aside can go). A stage that was
interrupted raises StudyInterrupted; one that failed on its input or its files, RunFailed: neither is
a bug, and the stages before it stay on disk for --resume.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import Interrupted, RunFailed, StudyInterrupted, UserError, interrupts
from ..settings import SettingError, as_flags


def note(text: str) -> None:
    """What a stage says as it runs (the library's log), on standard error, as the command prints it."""
    print(text, file=sys.stderr)


RECORD = "stage_seconds.json"  # each stage's seconds and the study's so far, kept for --resume
PACED = ("finetune", "evaluate", "predict")  # the many short stages after the pretraining: the time left


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


class Stages:
    def __init__(self, out: Path, log: Callable[[str], None] = print, total: int | None = None,
                 on_done: Callable[[], None] = lambda: None, device: str = "auto", keep: bool = True):
        self.out, self.log, self.keep = out, log, keep  # keep: the seconds in OUT/RECORD (a worker's are not)
        self.total, self.done, self.on_done, self.device = total, 0, on_done, device
        saved = _read_record(out / RECORD) if keep else {}  # a resumed study's earlier stages keep their seconds
        self.times: dict[str, float] = saved.get("stages", {})
        self._earlier, self._started = float(saved.get("seconds", 0.0)), time.perf_counter()
        self._paced: list[float] = []  # the seconds of the stages run here whose kind sets the pace (PACED)

    def seconds(self) -> float:
        """The study's seconds so far, those of the runs before --resume included."""
        return round(self._earlier + time.perf_counter() - self._started, 1)

    def where(self) -> str:
        """Where the study stands, for the next stage's line: "stage k of n", and once two of its
        fine-tuning-sized stages ran here, the time left at their mean pace (the stages that remain are all
        of that kind: a study pretrains first, and the pretraining's own bar has its ETA)."""
        if not self.total:
            return f"stage {self.done + 1}"
        text = f"stage {self.done + 1} of {self.total}"
        if len(self._paced) >= 2:
            left = (self.total - self.done) * sum(self._paced) / len(self._paced)
            text += f", about {_duration(left)} left"
        return text

    def run(self, name: str, argv: list[str], call: Callable[[], Any]) -> Any:
        """Stage `name`: `argv` (the command's words after `torchbert`) printed, `call()` run and timed."""
        argv = [str(a) for a in argv]
        self.log(f"\n== {name} ({self.where()}): {shlex.join(['torchbert', *argv])}")
        sys.stdout.flush()  # the stage's line out before its work, also where stdout is a pipe or a file
        start, signalled = time.perf_counter(), interrupts()
        try:
            result = call()
        except (KeyboardInterrupt, Interrupted):  # Ctrl-C, SIGTERM; a training run saved its checkpoint first
            raise StudyInterrupted(self.done, self.total) from None
        except Exception as e:
            if interrupts() > signalled:  # an interrupt that C++ code turned into an error (errors.py)
                raise StudyInterrupted(self.done, self.total) from None
            if not isinstance(e, (UserError, RunFailed, SettingError, ValueError, OSError)):
                raise
            text = " ".join(str(e).split()) or type(e).__name__
            raise RunFailed(f"stage {name!r} failed (torchbert {argv[0]}: {text}); the {self.done} stage(s) "
                            f"before it are kept in {self.out}") from e
        self.times[name] = round(time.perf_counter() - start, 1)
        if argv[0] in PACED:
            self._paced.append(self.times[name])
        from ..io.files import atomic_write_text

        if self.keep:
            atomic_write_text(self.out / RECORD, json.dumps({"stages": self.times, "seconds": self.seconds()},
                                                            indent=1))
        self.found()
        return result

    @contextlib.contextmanager
    def stopping(self):
        """Around a study's stages and its own code between them: a signal anywhere there (or an error that
        C++ code made of one) is StudyInterrupted after the stages done so far."""
        signalled = interrupts()
        try:
            yield self
        except StudyInterrupted:
            raise
        except KeyboardInterrupt:  # a signal between two stages
            raise StudyInterrupted(self.done, self.total) from None
        except Exception:
            if interrupts() > signalled:
                raise StudyInterrupted(self.done, self.total) from None
            raise

    def complete(self, folder: Path, *names: str) -> bool:
        """Whether a stage's outputs are all in `folder` (`names`; the first is the one it writes last):
        on --resume, a stage is run again when any is missing (deleted since, or never written)."""
        if not (folder / names[0]).is_file():
            return False
        missing = [n for n in names[1:] if not (folder / n).exists()]
        if missing:
            self.log(f"{folder}: {', '.join(missing)} missing; its stage runs again")
        return not missing

    def finished(self, name: str, folder: Path, *names: str) -> bool:
        """Whether stage `name` finished in a run of this study before (its seconds are in the record) and
        left its outputs (`names` in `folder`, as `complete`): a study of stages that go together (a
        fine-tuning run, then its evaluation) takes up again after the last one that finished."""
        return name in self.times and self.complete(folder, *names)

    def found(self, stages: int = 1) -> None:
        """`stages` more finished (run now, or their results found on disk)."""
        self.done += stages
        self.on_done()

    # -- the commands --------------------------------------------------------------------------------

    def vocab(self, name: str, s, overwrite: bool = False) -> None:
        """`torchbert vocab` with data.vocabulary's VocabSettings."""
        from ..data.vocabulary import train_vocabulary
        from ..io.files import check_replaceable

        def call():
            if overwrite and Path(s.out).exists():
                check_replaceable(Path(s.out))
            tok = train_vocabulary(s, progress=False)
            self.log(f"wrote {s.out}: vocab of {tok.vocab_size} tokens")

        self.run(name, ["vocab", *as_flags(s), "--quiet", *(["--overwrite"] if overwrite else [])], call)

    def extend_vocab(self, name: str, s, e, overwrite: bool = False) -> None:
        """`torchbert vocab --extend`: VocabSettings `s` (its corpus and out) and ExtendSettings `e`."""
        from ..data.vocab_extend import extend_from_corpus
        from ..io.files import check_replaceable
        from ..io.hf import resolve_model

        def call():
            if overwrite and Path(s.out).exists():
                check_replaceable(Path(s.out))
            x = extend_from_corpus(resolve_model(e.extend, "--extend"), s, e, Path(s.out))
            self.log(f"wrote {s.out}: {len(x.added):,} tokens added, vocab_size {x.new_size:,}; {x.unknown_before:.2%} "
                     f"of the corpus's words [UNK] before, {x.unknown_after:.2%} after")

        self.run(name, ["vocab", *as_flags(s), *as_flags(e), "--quiet", *(["--overwrite"] if overwrite else [])], call)

    def prepare(self, name: str, corpus: list[Path], tokenizer: Path, out: Path, settings,
                overwrite: bool = False) -> None:
        """`torchbert prepare` with data.pretraining's PrepareSettings."""
        from ..data.pipeline import prepare

        def call():
            m = prepare([str(c) for c in corpus], tokenizer, out, settings, progress=False, overwrite=overwrite)
            self.log(f"wrote {out}: {m['counts']['instances']:,} instances, {m['counts']['tokens']:,} tokens")

        argv = ["prepare", "--corpus", *corpus, "--tokenizer", tokenizer, "--out", out, *as_flags(settings), "--quiet",
                *(["--overwrite"] if overwrite else [])]
        self.run(name, argv, call)

    def pretrain(self, name: str, s, cfg) -> dict[str, Any]:
        """`torchbert pretrain`: train/pretrain.run_pretraining(s, cfg); its summary."""
        from ..train import pretrain

        own = as_flags(s.objective_settings) if s.objective_settings is not None else []
        return self._training(name, "pretrain", [*as_flags(s), *own, *as_flags(cfg)], s, cfg, pretrain.run_pretraining,
                              pretrain.report_lines)

    def finetune(self, name: str, s, cfg) -> dict[str, Any]:
        """`torchbert finetune`: train/finetune.run_finetuning(s, cfg), `s` and `cfg` as
        FinetuneSettings.resolve gives them; its dev result."""
        from ..tasks.families import task_settings
        from ..train import finetune

        ts = task_settings(s.task, s.task_settings)
        flags = [*as_flags(s), *as_flags(ts, defaults={"doc_stride": max(1, ts.max_length // 3)}),
                 *as_flags(cfg, skip=finetune.LOOP_DERIVED, defaults=finetune.LOOP_DEFAULTS)]
        return self._training(name, "finetune", flags, s, cfg, finetune.run_finetuning, finetune.report_lines)

    def evaluate(self, name: str, model: Path, data: Path, out: Path) -> dict[str, float]:
        """`torchbert evaluate`: the model's scores on `data`, also written to `out`."""
        import json

        from ..io.files import atomic_write_text
        from ..tasks.predict import EvaluateSettings, run_evaluate

        s = EvaluateSettings(data=str(data), out=str(out))

        def call():
            scores, _ = run_evaluate(model, data, None, self._device(), progress=False)
            atomic_write_text(out, json.dumps(scores, indent=2) + "\n")
            return scores

        return self.run(name, ["evaluate", "--model", model, *as_flags(s), "--quiet"], call)

    def predict(self, name: str, model: Path, input: Path, out: Path) -> list[dict[str, Any]]:
        """`torchbert predict`: the model's records on `input`, written to `out` as JSON lines."""
        import json

        from ..io.files import atomic_write_text
        from ..tasks.predict import PredictSettings, run_predict

        s = PredictSettings(input=str(input), out=str(out))

        def call():
            records = run_predict(model, input, self._device(), progress=False)
            atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
            return records

        return self.run(name, ["predict", "--model", model, *as_flags(s), "--quiet"], call)

    def _device(self):
        from ..train.distributed import init_distributed

        return init_distributed(self.device)[1]

    def _training(self, name: str, verb: str, flags: list[str], s, cfg, run: Callable[..., Any],
                  report: Callable[[Any, Path], list[str]]) -> Any:
        """A training run in this process (`run(s, cfg, device=, log=, dist=)`), on the study's device
        (the command's --device auto); its command line also goes to the run record."""
        from ..train.distributed import init_distributed

        argv = [verb, *flags, *(["--quiet"] if not cfg.progress else []), *(["--resume"] if s.resume else []),
                *(["--overwrite"] if s.overwrite else [])]
        s.command_line = shlex.join(["torchbert", *map(str, argv)])

        def call():
            dist, device = init_distributed(self.device)
            with dist:
                result = run(s, cfg, device=device, log=note, dist=dist)
            self.log("\n".join(report(result, s.out)))
            return result

        return self.run(name, argv, call)


def claim_folder(out: Path, marker: str, command: str, settings: str, flags: str) -> None:
    """A study's folder taken: `settings` (its settings.json text) must equal what an earlier run there
    wrote (a --resume continues with the same settings, never a mix), then the marker that lets the next
    run of `command` resume or replace it, and settings.json."""
    from ..io.files import atomic_write_text

    path = out / "settings.json"
    if path.is_file() and path.read_text(encoding="utf-8") != settings:
        raise UserError(f"--out {out}: the earlier {command} there ran with other settings ({flags}); resume it "
                        "with its own, or start again with --overwrite")
    out.mkdir(parents=True, exist_ok=True)
    (out / marker).write_text(f"a folder of `torchbert {command}`; --resume continues it\n", encoding="utf-8")
    atomic_write_text(path, settings)


def _read_record(path: Path) -> dict:
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    ok = isinstance(saved, dict) and isinstance(saved.get("stages"), dict) and \
        isinstance(saved.get("seconds"), (int, float))
    return saved if ok else {}
