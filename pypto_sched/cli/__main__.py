"""``python -m pypto_sched.cli``: the same as ``pypto-sched``."""

import sys

from . import main

sys.exit(main())
