"""PlannerConfig: the knobs of the planner, validated once on construction."""

from __future__ import annotations

import functools
import warnings
from typing import Any, Literal, get_args

import attrs
import numpy as np

from ._errors import InvalidConfigError, InvalidInputError, PyptoSchedError
from ._validate import check_int, count_validator, retired_argument

__all__ = ["POLICIES", "PlannerConfig", "Policy", "check_config"]

#: The name of a scheduling policy (the type of ``PlannerConfig.policy``).
Policy = Literal["round_robin", "packed"]
#: The scheduling policies, in the order the docs describe them.
POLICIES: tuple[Policy, ...] = get_args(Policy)
#: What a limit may be given as (NumPy integers become ``int``).
Count = int | np.integer[Any]


def _plain(value: object) -> object:
    """NumPy integers become ``int`` (so configs compare, hash and serialise alike);
    everything else is left for the validators to judge."""
    if isinstance(value, np.integer):
        return int(value)
    return value


def _policy_name(value: Policy) -> Policy:
    """A NumPy string becomes ``str``, as :func:`_plain` does for integers."""
    return str(value) if isinstance(value, np.str_) else value  # type: ignore[return-value]


def _policy(_self: object, _field: attrs.Attribute[Any], value: object) -> None:
    # (Not `value in POLICIES` alone: an array holding a policy name passes that test.)
    if not isinstance(value, str) or value not in POLICIES:
        choices = ", ".join(repr(p) for p in POLICIES)
        raise InvalidConfigError.about("policy", f"must be one of {choices}: {value!r}")


# (init=False: attrs writes __attrs_init__, with the fields' converters and validators, and
# the __init__ below adds the retired keyword ``page_size`` in front of it.)
@attrs.frozen(kw_only=True, init=False)
class PlannerConfig:
    """How the planner may split prompts into dispatches.

    Every limit is an ``int >= 1``; ``None`` switches an optional limit off. Use
    :meth:`from_engine_args` for the vLLM / pypto-serving convention where ``0`` means off.
    ``page_size`` is the retired name of ``chunk_alignment`` (a ``DeprecationWarning``).
    """

    #: Most tokens one dispatch may carry.
    max_num_batched_tokens: int = attrs.field(converter=_plain, validator=count_validator())
    #: Per-request chunk cap (``None``: off). Under ``round_robin`` it also lowers the
    #: dispatch budget, as in the seed.
    long_prefill_token_threshold: int | None = attrs.field(
        default=None, converter=_plain, validator=count_validator(optional=True)
    )
    #: Most rows (requests) one dispatch may carry (``None``: no limit).
    max_num_seqs: int | None = attrs.field(
        default=None, converter=_plain, validator=count_validator(optional=True)
    )
    #: When set, every non-final chunk ends on a multiple of it (so that a chunk never ends
    #: part-way into a KV page of that size: set it to the KV page size for that).
    chunk_alignment: int | None = attrs.field(
        default=None, converter=_plain, validator=count_validator(optional=True)
    )
    #: ``"round_robin"`` (the seed's behaviour) or ``"packed"`` (co-scheduled chunks).
    policy: Policy = attrs.field(default="round_robin", converter=_policy_name, validator=_policy)
    #: ``packed`` only: most requests part-way through their prefill at once (``None``: no
    #: limit).
    max_num_partial_prefills: int | None = attrs.field(
        default=None, converter=_plain, validator=count_validator(optional=True)
    )

    def __init__(
        self,
        *,
        max_num_batched_tokens: Count,
        long_prefill_token_threshold: Count | None = None,
        max_num_seqs: Count | None = None,
        chunk_alignment: Count | None = None,
        policy: Policy = "round_robin",
        max_num_partial_prefills: Count | None = None,
        page_size: Count | None = None,
    ) -> None:
        chunk_alignment = _alignment("PlannerConfig", chunk_alignment, page_size)
        self.__attrs_init__(
            max_num_batched_tokens=max_num_batched_tokens,
            long_prefill_token_threshold=long_prefill_token_threshold,
            max_num_seqs=max_num_seqs,
            chunk_alignment=chunk_alignment,
            policy=policy,
            max_num_partial_prefills=max_num_partial_prefills,
        )

    @property
    def page_size(self) -> int | None:
        """The retired name of :attr:`chunk_alignment` (a ``DeprecationWarning``)."""
        warnings.warn(
            "PlannerConfig.page_size is deprecated: use chunk_alignment",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.chunk_alignment

    def __attrs_post_init__(self) -> None:
        if self.max_num_partial_prefills is not None and self.policy != "packed":
            raise InvalidConfigError.about(
                "max_num_partial_prefills",
                f"applies only to policy 'packed': policy is {self.policy!r}",
            )
        if self.chunk_alignment is not None and self.chunk_alignment > self.chunk_cap:
            raise InvalidConfigError.about(
                "chunk_alignment",
                "must be <= the largest chunk, min(max_num_batched_tokens, "
                f"long_prefill_token_threshold) = {self.chunk_cap}, or no chunk could end "
                f"on a multiple of it: {self.chunk_alignment}",
            )

    # Cached: the online planner reads them on every step. (attrs fills the slot on first use.)
    @functools.cached_property
    def chunk_cap(self) -> int:
        """The most tokens one request may run in one dispatch."""
        threshold = self.long_prefill_token_threshold
        if threshold is None:
            return self.max_num_batched_tokens
        return min(threshold, self.max_num_batched_tokens)

    @functools.cached_property
    def effective_budget(self) -> int:
        """The most tokens one dispatch carries under this config's policy.

        ``round_robin`` reduces the budget to the threshold (the seed's safety rule);
        ``packed`` keeps ``max_num_batched_tokens`` and caps each request instead.
        """
        if self.policy == "round_robin":
            return self.chunk_cap
        return self.max_num_batched_tokens

    @classmethod
    def from_engine_args(
        cls,
        *,
        max_num_batched_tokens: int,
        long_prefill_token_threshold: int = 0,
        max_num_seqs: int | None = None,
        chunk_alignment: int | None = None,
        policy: Policy = "round_robin",
        max_num_partial_prefills: int | None = None,
        page_size: int | None = None,
    ) -> PlannerConfig:
        """Build a config from engine-style arguments, where a threshold of ``0`` means off.

        This is the convention of vLLM (``long_prefill_token_threshold=0``) and of
        pypto-serving; the config uses vLLM's names (``max_num_seqs``). ``page_size`` is the
        retired name of ``chunk_alignment``, as in the constructor.
        """
        threshold = check_int(
            "long_prefill_token_threshold",
            long_prefill_token_threshold,
            min_value=0,
            error=InvalidConfigError,
        )
        if max_num_seqs is not None:  # checked here so that errors name the engine's argument
            max_num_seqs = check_int(
                "max_num_seqs", max_num_seqs, min_value=1, error=InvalidConfigError
            )
        return cls(
            max_num_batched_tokens=max_num_batched_tokens,
            long_prefill_token_threshold=threshold or None,
            max_num_seqs=max_num_seqs,
            chunk_alignment=_alignment(
                "PlannerConfig.from_engine_args", chunk_alignment, page_size
            ),
            policy=policy,
            max_num_partial_prefills=max_num_partial_prefills,
        )

    def to_dict(self) -> dict[str, Any]:
        """The config as a JSON-ready dict (``None`` for limits that are off)."""
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> PlannerConfig:
        """Build a config from :meth:`to_dict`'s output, rejecting unknown keys (the retired
        ``page_size`` is read as ``chunk_alignment``, with a ``DeprecationWarning``)."""
        if not isinstance(data, dict):
            raise InvalidConfigError.about("data", f"must be a JSON object: {type(data).__name__}")
        known = {field.name for field in attrs.fields(cls)}
        # (Keys of any type: sorted by repr. The retired "page_size" is the constructor's.)
        unknown = sorted(set(data) - known - {"page_size"}, key=repr)
        if unknown:
            raise InvalidConfigError(
                f"unknown config keys {unknown}; known keys: {sorted(known)}", parameter="data"
            )
        if "max_num_batched_tokens" not in data:
            raise InvalidConfigError.about(
                "data", "must set 'max_num_batched_tokens': it is missing"
            )
        fields = dict(data)
        retired = fields.pop("page_size", None)
        fields["chunk_alignment"] = _alignment(
            "PlannerConfig.from_dict", fields.get("chunk_alignment"), retired
        )
        return cls(**fields)


def _alignment(where: str, chunk_alignment: Any, page_size: Any) -> Any:
    """``chunk_alignment``, or ``page_size``, its retired name, given to ``where`` by its
    caller (warned of there; both given is an :class:`InvalidConfigError`)."""
    retired = retired_argument(
        where,
        "page_size",
        page_size,
        "chunk_alignment",
        new_given=chunk_alignment is not None,
        error=InvalidConfigError,
        stacklevel=3,
    )
    return chunk_alignment if retired is None else retired


def check_config(
    value: object, *, name: str = "config", error: type[PyptoSchedError] = InvalidInputError
) -> PlannerConfig:
    """``value`` if it is a :class:`PlannerConfig`, else ``error`` naming ``name``: the one
    check of a config argument, at every entry point that takes one."""
    if not isinstance(value, PlannerConfig):
        hint = " (load a dict with PlannerConfig.from_dict)" if isinstance(value, dict) else ""
        raise error.about(name, f"must be a PlannerConfig: {type(value).__name__}{hint}")
    return value
