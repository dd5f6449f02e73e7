"""Adapters that run the planner inside servers we did not write.

Each adapter is a submodule, an optional extra that imports its server only when imported
itself: ``import pypto_sched`` and ``import pypto_sched.integrations`` import no server.

* :mod:`pypto_sched.integrations.transformers`: the scheduler of transformers' continuous
  batching (``pip install 'pypto-sched[transformers]'``).
"""

__all__: list[str] = []
