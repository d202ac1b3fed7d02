"""What several commands share: the flags they have in common (declared once, in `Common`), how a
command module becomes a subcommand, and the checks and pickers behind --model, --device, --int8 and
--out."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from ..train.recipes import DEFAULT, RECIPES
from ..errors import UserError
from ..hardware import BF16_PAYS, PRECISIONS
from ..io.hf import resolve_model  # noqa: F401 (the commands take a model by name through here)
from ..settings import Checked, SettingError, add_flags, check_field, from_args, seed_setting, setting

INT8_HELP = ("the encoder in 8 bits on the CPU: exported to ONNX at start, its inputs' channels evened out, "
             "and quantized per channel by ONNX Runtime, feed-forward down projections kept in fp32. Outputs move "
             "slightly more than bf16's (bench/README.md, \"INT8\"), so --precision auto never takes it; it runs on "
             "every CPU and says what its products measured against fp32's and bf16's there, as `torchbert env` does")


@dataclass(kw_only=True)
class Common(Checked):
    """The flags several commands take, each declared once; a command names the ones it takes
    (`shared_flags`), and `main` checks their bounds before the command runs (`check_shared`)."""

    model: str = setting(help="checkpoint folder, `minilm`, or a hub id")
    device: str = setting("auto", "cpu, cuda, cuda:1, ... (default: cuda if available)")
    threads: int | None = setting(None, "compute with N threads (default: all the CPUs this process may use, capped "
                                        "by OMP_NUM_THREADS, shared with the other torchbert jobs computing on the "
                                        "machine: two jobs get half each)", low=1, metavar="N")
    batch_size: int = setting(64, "sequences per batch", low=1)
    quiet: bool = setting(False, "no progress bar")
    resume: bool = setting(False, "continue the run in --out from its newest checkpoint")
    overwrite: bool = setting(False, "replace a non-empty --out")
    int8: bool = setting(False, INT8_HELP)
    precision: str = setting("auto", "auto (default): bf16 where it is faster, else fp32: on a GPU with bf16, and on "
                                     f"a CPU where bf16's matrix products measured at least {BF16_PAYS}x fp32's (a "
                                     "probe of a few tenths of a second, once per machine, cached); fp32: exact, what the "
                                     "parity tests use; bf16: the encoder's weights in bfloat16, outputs in fp32 "
                                     "(embeddings within cosine 0.999 of fp32's; bench/README.md, \"Precision on the "
                                     "CPU\"). `torchbert env` prints the figures and what this machine picks",
                             choices=PRECISIONS)


def shared_flags(p: argparse.ArgumentParser, *names: str, **helps: str) -> None:
    """The shared flags `names` on parser p; helps: a command's own words for one of them."""
    add_flags(p, Common, only=names, helps=helps)
    p.set_defaults(shared=(*p.get_default("shared"), *names))


def check_shared(args: argparse.Namespace) -> None:
    """The bounds of the shared flags this command takes, and the one pair that excludes each other."""
    by_name = {f.name: f for f in Common.__dataclass_fields__.values()}
    for name in getattr(args, "shared", ()):
        try:
            check_field(by_name[name], getattr(args, name))
        except SettingError as e:
            raise UserError(e.as_flag()) from None
    if getattr(args, "resume", False) and getattr(args, "overwrite", False):
        raise UserError("--resume and --overwrite contradict each other (--resume continues what is in --out, "
                        "--overwrite starts again); pick one")


def command(sub, module_name: str, **texts: str) -> argparse.ArgumentParser:
    """The subcommand of a command module (commands/<verb>.py, by its __name__) that runs its `run`:
    the first paragraph of its docstring is its line in `torchbert --help`, the rest its description;
    its own --help shows the description, the flags, then module.EPILOG (examples and figures) as
    written. texts: a part made at run time."""
    module = sys.modules[module_name]
    name = module_name.rsplit(".", 1)[1].replace("_", "-")
    help_line, _, description = (module.__doc__ or "").partition("\n\n")
    texts = {"help": " ".join(help_line.split()), "description": description.strip(),
             "epilog": getattr(module, "EPILOG", None), **texts}
    p = sub.add_parser(name, formatter_class=argparse.RawDescriptionHelpFormatter, **texts)
    p.set_defaults(func=module.run, shared=())
    return p


def settings_from(cls, args: argparse.Namespace, **given):
    """A settings dataclass from the parsed flags; a value out of its bounds is the flag's error."""
    try:
        return from_args(cls, args, **given)
    except SettingError as e:
        raise UserError(e.as_flag()) from None


def pick_device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name}: not a device name (cpu, cuda, cuda:N)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {name}: no CUDA device is available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                            f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    elif device.type != "cpu":
        raise UserError(f"--device {name}: torchbert runs on cpu or cuda")
    return device


def cpu_for_int8(args: argparse.Namespace):
    """The device; --int8 runs on the CPU only."""
    device = pick_device(args.device)
    if getattr(args, "int8", False) and device.type != "cpu":
        if args.device != "auto":
            raise UserError(f"--int8 runs on the CPU; got --device {args.device}")
        import torch

        device = torch.device("cpu")
    return device


def inference_precision(args: argparse.Namespace, device, model_dir: Path) -> str:
    """fp32, bf16 or int8: what --precision (and --int8, where the command has it) ask for on `device`
    for the model in `model_dir`; a note on stderr says when bf16 was picked, and why. bf16 runs BERT
    encoders: for a GPT or ELMo folder, auto is fp32 and bf16 an error."""
    from .. import hardware
    from ..architectures import architecture_of, load_config

    int8 = getattr(args, "int8", False)
    if int8 and args.precision == "bf16":
        raise UserError("--precision bf16 and --int8 exclude each other: pick one")
    try:
        config = load_config(model_dir)
        arch = architecture_of(config)
    except ValueError as e:
        raise UserError(str(e)) from None
    shape = (config.hidden_size, config.intermediate_size) if arch.bf16 else None  # a BERT encoder's
    if int8:
        print(f"note: --int8: {hardware.int8_report(shape)}", file=sys.stderr)
        return "int8"
    if not arch.bf16:
        if args.precision == "bf16":
            raise UserError(f"--precision bf16: runs BERT encoders, and {model_dir} holds a {arch.name} model; use fp32")
        return "fp32"
    try:
        precision, why = hardware.inference_precision(args.precision, device, shape)
    except ValueError as e:
        raise UserError(str(e)) from None
    if precision == "bf16":
        print(f"note: computing in bf16 (--precision {args.precision}: {why}); --precision fp32 for fp32's exact "
              "numbers", file=sys.stderr)
    return precision


def int8_note() -> None:
    print("note: --int8: exporting the encoder to ONNX and quantizing it (once, a few seconds)", file=sys.stderr)


def int8_model(model, layers="last"):
    """model (on the CPU: cpu_for_int8) with its encoder in INT8 (fast/int8.py), after checking what
    --int8 cannot do."""
    if str(layers) != "last":
        raise UserError(f"--int8 gives the last layer only; --layers {layers} needs every layer (drop --int8)")
    from ..fast.int8 import int8

    int8_note()
    return int8(model)


def keep_memory(fast: bool) -> None:
    """The training commands own their process: with fast on, glibc keeps freed memory for the next step."""
    if fast:
        from ..fast import keep_freed_memory

        keep_freed_memory()


def run_training(args: argparse.Namespace, cfg, run, report) -> None:
    """A training command's run (pretrain, finetune): the processes torchrun started (or this one
    alone) and their device, checked; glibc's freed memory kept with --fast; `run(device, log, dist)`,
    and process 0 reports what it returned. Process 0 also tells of the malloc where it costs: a
    jemalloc whose pages decay (before), a glibc heap that grew after the run's first tenth (after)."""
    import torch

    from ..train.distributed import init_distributed

    try:
        dist, device = init_distributed(args.device, fsdp=getattr(args, "fsdp", False))
    except ValueError as e:
        raise UserError(str(e)) from None
    if cfg.precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError("--precision bf16: this GPU does not support bfloat16")
    keep_memory(cfg.fast)
    from ..fast.memory import growth_note, jemalloc_advice
    from ..hardware import bf16_speed

    if dist.is_main and cfg.precision == "bf16" and device.type == "cpu" and (speed := bf16_speed()) < 1:
        print(f"note: --precision bf16: bf16 products measured {speed:.2f}x fp32's speed on this CPU; "
              "--precision fp32 is faster here", file=sys.stderr)
    if dist.is_main and (advice := jemalloc_advice()):
        print(f"note: {advice}", file=sys.stderr)
    with dist:
        result = run(device=device, log=lambda x: print(x, file=sys.stderr), dist=dist)
    if dist.is_main:
        report(result, args.out)
        note = growth_note(result.get("memory_growth_gb"), result.get("peak_memory_gb")) if cfg.fast else None
        if note:
            print(note, file=sys.stderr)


def holds_files(out: Path) -> bool:
    """Whether output folder --out exists with something in it; an error if it is not a folder."""
    from ..io.files import kind

    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is {kind(out) or 'a file'}, not a folder")
    return out.is_dir() and any(out.iterdir())


def check_out_folder(out: Path, overwrite: bool, inputs: list) -> None:
    """--out is apart from the inputs, and a folder with files in it is replaced only with --overwrite,
    and only when torchbert wrote it."""
    from ..io.files import check_apart, check_replaceable

    check_apart(out, inputs)
    if holds_files(out):
        if not overwrite:
            raise UserError(f"--out {out}: the folder exists and is not empty; pass --overwrite to replace it")
        check_replaceable(out)


@dataclass(kw_only=True)
class StudySettings(Checked):
    """The flags of the commands that pretrain and then measure what it bought (demo, compare)."""

    out: str = setting(help="output folder")
    quick: bool = setting(False, "every stage shrunk to a smoke test")
    budget: float = setting(1.0, "multiply the pretraining steps", above=0, high=1000)
    recipe: str = setting(DEFAULT, "BERT's pretraining recipe: rotary, the paper's with rotary positions (RoFormer), "
                                   f"measured to learn fastest here (bench/README.md); or paper, Devlin et al.'s as it "
                                   f"is (default: {DEFAULT})", choices=tuple(RECIPES))
    seed: int = seed_setting(0, "the first seed; the others follow it (default: 0)")


def study_flags(p: argparse.ArgumentParser, out: str, quick: str, budget: str) -> None:
    add_flags(p, StudySettings, defaults={"out": out}, helps={"quick": quick, "budget": budget})
