"""`python -m torchbert` (and `torchrun ... -m torchbert`) and the `torchbert` script: the command line.
Importing it is here, so that Ctrl-C while Python starts up is one line too."""

import sys


def run() -> int:
    try:
        from .cli import main
    except KeyboardInterrupt:
        print("torchbert: interrupted while starting; no output was written", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(run())
