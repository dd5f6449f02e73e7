"""Adapters that run the planner inside servers we did not write.

Each adapter is a submodule, an optional extra that imports its server only when imported
itself: ``import pypto_sched`` and ``import pypto_sched.integrations`` import no server.

* :mod:`pypto_sched.integrations.transformers`: the scheduler of transformers' continuous
  batching (``pip install 'pypto-sched[transformers]'``).
* :mod:`pypto_sched.integrations.ray`: offline batches on a Ray cluster, one actor per replica,
  parts balanced by tokens (``pip install 'pypto-sched[ray]'``).
* :mod:`pypto_sched.integrations.hf_verify`: greedy generation checked token for token
  against transformers' ``generate()`` on the same checkpoint (``pypto-sched generate
  --verify``).
"""

__all__: list[str] = []
