"""pypto_sched: a pure chunked-prefill planner for LLM inference engines.

Plan with :func:`plan_prefill`, inspect the returned :class:`Schedule`, turn one dispatch into
kernel arrays with :func:`dispatch_arrays`, and run it with a backend. Generate with
:func:`generate` on token ids, or with :class:`LLM` from a model directory on text, token ids
or chat messages.
"""

import typing
import warnings

from .backends import (
    Backend,
    DispatchInput,
    DispatchOutput,
    list_backends,
    load_backend,
    refresh_backends,
)
from .core._arrays import dispatch_arrays
from .core._arrays import step_arrays as _step_arrays
from .core._config import POLICIES, PlannerConfig, Policy
from .core._dispatch import DispatchArrays
from .core._errors import (
    BackendError,
    BackendNotFoundError,
    CacheTooSmallError,
    CheckpointError,
    DuplicateRequestError,
    ExecutionError,
    InvalidConfigError,
    InvalidInputError,
    InvalidScheduleError,
    PyptoSchedError,
    UnknownRequestError,
)
from .core._generation import (
    GenerationRequest,
    GenerationState,
    GenerationStep,
    decode_rows_first,
    plan_generation_step,
)
from .core._online import PrefillRequest, PrefillState, StepChunk, StepPlan, plan_step
from .core._pages import BlockTables, plan_pages
from .core._partition import Partition, partition_requests
from .core._plan import plan_one_shot, plan_prefill
from .core._pool import PagePool
from .core._sampling import DEFAULT_MAX_TOKENS, SamplingParams, sample_token, token_logprobs
from .core._schedule import FORMAT_NAME, FORMAT_VERSION, Chunk, Dispatch, Schedule
from .core._stats import ScheduleStats
from .core._warmup import WarmupShape, plan_warmup
from .execute import DispatchDone, ExecutionResult, execute_schedule
from .runtime._generate import (
    GeneratedSequence,
    GenerationResult,
    GenerationStats,
    generate,
)
from .runtime._llm import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    GENERATION_CONFIG_FILE,
    LLM,
    CompletionOutput,
    IncompleteGenerationError,
    RequestOutput,
    generation_defaults,
)
from .runtime._verify import Verification, compare_results, verify_against_one_shot

__all__ = [
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "DEFAULT_MAX_TOKENS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "GENERATION_CONFIG_FILE",
    "LLM",
    "POLICIES",
    "Backend",
    "BackendError",
    "BackendNotFoundError",
    "BlockTables",
    "CacheTooSmallError",
    "CheckpointError",
    "Chunk",
    "CompletionOutput",
    "Dispatch",
    "DispatchArrays",
    "DispatchDone",
    "DispatchInput",
    "DispatchOutput",
    "DuplicateRequestError",
    "ExecutionError",
    "ExecutionResult",
    "GeneratedSequence",
    "GenerationRequest",
    "GenerationResult",
    "GenerationState",
    "GenerationStats",
    "GenerationStep",
    "IncompleteGenerationError",
    "InvalidConfigError",
    "InvalidInputError",
    "InvalidScheduleError",
    "PagePool",
    "Partition",
    "PlannerConfig",
    "Policy",
    "PrefillRequest",
    "PrefillState",
    "PyptoSchedError",
    "RequestOutput",
    "SamplingParams",
    "Schedule",
    "ScheduleStats",
    "StepChunk",
    "StepPlan",
    "UnknownRequestError",
    "Verification",
    "WarmupShape",
    "compare_results",
    "decode_rows_first",
    "dispatch_arrays",
    "execute_schedule",
    "generate",
    "generation_defaults",
    "list_backends",
    "load_backend",
    "partition_requests",
    "plan_generation_step",
    "plan_one_shot",
    "plan_pages",
    "plan_prefill",
    "plan_step",
    "plan_warmup",
    "refresh_backends",
    "sample_token",
    "token_logprobs",
    "verify_against_one_shot",
]

#: Retired public names -> (what reading one returns, the name to use instead). Reading one
#: warns (``DeprecationWarning``); none is in ``__all__``. ``StepDone`` is
#: :class:`DispatchDone` itself; ``step_arrays`` keeps its own signature and calls
#: :func:`dispatch_arrays`.
_RETIRED_NAMES: dict[str, tuple[object, str]] = {
    "StepDone": (DispatchDone, "DispatchDone"),
    "step_arrays": (_step_arrays, "dispatch_arrays"),
}

if typing.TYPE_CHECKING:  # (type checkers see the retired names' types, not __getattr__'s)
    from .core._arrays import step_arrays as step_arrays

    StepDone = DispatchDone


def __getattr__(name: str) -> object:
    if name not in _RETIRED_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value, replacement = _RETIRED_NAMES[name]
    warnings.warn(
        f"pypto_sched.{name} is deprecated: use pypto_sched.{replacement}",
        DeprecationWarning,
        stacklevel=2,
    )
    return value
