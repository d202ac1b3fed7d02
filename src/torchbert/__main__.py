"""python -m torchbert (and torchrun ... -m torchbert) run the command line."""

import sys

from .cli import main

sys.exit(main())
