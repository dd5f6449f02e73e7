"""One builder of a dispatch's kernel arrays, offline or online.

A dispatch's rows come from a :class:`Schedule` (a :class:`Dispatch`, whose requests' pages
are :class:`BlockTables`) or from a step planned online (a :class:`StepPlan`'s or a
:class:`GenerationStep`'s rows, or a server's own, whose pages a :class:`PagePool` holds).
:func:`dispatch_arrays` takes either and builds the same :class:`DispatchArrays`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, TypeVar, cast, overload

from ._dispatch import DispatchArrays, dispatch_arrays_with_ids, rows_arrays
from ._errors import InvalidInputError
from ._generation import GenerationStep
from ._online import StepChunk, StepPlan, as_step_rows
from ._pages import BlockTables
from ._pool import PagePool
from ._schedule import Dispatch

__all__ = ["dispatch_arrays"]

RequestId = TypeVar("RequestId", bound=Hashable)


@overload
def dispatch_arrays(dispatch: Dispatch, block_tables: BlockTables) -> DispatchArrays: ...


@overload
def dispatch_arrays(
    rows: Mapping[RequestId, StepChunk],
    pool: PagePool[RequestId],
    /,
    *,
    index: int = 0,
) -> DispatchArrays: ...


@overload
def dispatch_arrays(
    rows: StepPlan[RequestId] | GenerationStep[RequestId],
    pool: PagePool[RequestId] | None = None,
    /,
    *,
    index: int = 0,
) -> DispatchArrays: ...


def dispatch_arrays(
    dispatch: object, block_tables: object = None, *, index: int | None = None
) -> DispatchArrays:
    """The kernel arrays of one dispatch, from either of its descriptions:

    - ``dispatch_arrays(dispatch, block_tables)``: a schedule's :class:`Dispatch` and every
      request's block table (its ``index`` is the dispatch's own);
    - ``dispatch_arrays(rows, pool, *, index=0)``: a step's rows (request id to
      :class:`StepChunk`, decode and prefill alike; or a :class:`StepPlan` or
      :class:`GenerationStep`, whose own ``pool`` is used when ``pool`` is omitted) with
      their pages held in ``pool``. Row ``i`` is the ``i``-th row; its ``requests`` entry
      is ``i`` (the row of ``pool.block_tables(list(rows))``).
    """
    if isinstance(dispatch, Dispatch) or isinstance(block_tables, BlockTables):
        if index is not None:
            raise InvalidInputError.about(
                "index", f"must not be given with a Dispatch (it has its own): {index!r}"
            )
        # (Which checks both: a wrong one is an error naming it.)
        return dispatch_arrays_with_ids(cast(Dispatch, dispatch), cast(BlockTables, block_tables))
    return _step_rows_arrays(dispatch, block_tables, 0 if index is None else index)


def _step_rows_arrays(rows: object, pool: object, index: int) -> DispatchArrays:
    """:func:`dispatch_arrays` of a step's rows (or the step) and a pool (or the step's)."""
    if isinstance(rows, (StepPlan, GenerationStep)):
        if pool is None:
            return rows.arrays(index=index)  # (a plan made without a pool has none: an error)
        rows = rows.rows
    elif not isinstance(rows, Mapping) and not isinstance(pool, PagePool):
        raise InvalidInputError.about(
            "dispatch",
            f"must be a Dispatch (with BlockTables), or 'rows' a step's rows, a "
            f"StepPlan or a GenerationStep (with a PagePool): {type(rows).__name__}",
        )
    checked: Mapping[Any, StepChunk] = as_step_rows(rows)
    if not isinstance(pool, PagePool):
        raise InvalidInputError.about("pool", f"must be a PagePool: {type(pool).__name__}")
    return rows_arrays(checked, pool, index=index)


def step_arrays(
    rows: Mapping[RequestId, StepChunk], pool: PagePool[RequestId], *, index: int = 0
) -> DispatchArrays:
    """The retired name of :func:`dispatch_arrays` for a step's rows, with its signature:
    ``step_arrays(rows, pool, *, index=0)`` (``pypto_sched.step_arrays`` warns)."""
    return dispatch_arrays(rows, pool, index=index)
