"""``python -m pypto_sched``: the same as ``pypto-sched``."""

import sys

from .cli import main

sys.exit(main())
