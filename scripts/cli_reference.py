"""Write docs/cli.md, the command-line reference, from the parser's own --help texts.

    python scripts/cli_reference.py          # rewrite docs/cli.md
    python scripts/cli_reference.py --check  # exit 1 when docs/cli.md is out of date (a test runs this)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "docs" / "cli.md"


def reference() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fix the width so the file is stable
    from torchbert.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parts = ["# torchbert command-line reference", "",
             "Generated from `torchbert COMMAND --help` by `scripts/cli_reference.py`; do not edit by hand.", "",
             "```", parser.format_help().rstrip(), "```", ""]
    for name, p in sub.choices.items():
        parts += [f"## torchbert {name}", "", "```", p.format_help().rstrip(), "```", ""]
    return "\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when docs/cli.md differs")
    args = ap.parse_args()
    text = reference()
    if args.check:
        if not TARGET.is_file() or TARGET.read_text(encoding="utf-8") != text:
            print(f"{TARGET} is out of date: run python scripts/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
