"""``generate`` with vLLM's per-request settings: ``SamplingParams`` one per request,
``max_tokens``, ``min_tokens``, stop strings, stop token ids, ``ignore_eos``, logprobs, and
``on_finish`` hearing of each request as it finishes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypto_sched import (
    DispatchDone,
    InvalidConfigError,
    InvalidInputError,
    PlannerConfig,
    SamplingParams,
    execute_schedule,
    generate,
    load_backend,
    plan_one_shot,
)

BACKEND = load_backend("reference", seed=0)
CONFIG = PlannerConfig(max_num_batched_tokens=32, policy="packed")
PROMPTS = [[1, 2, 3, 4, 5], [7, 7, 7], [9, 8, 7, 6, 5, 4, 3]]


def free(n: int = 12) -> list[list[int]]:
    """Each prompt's greedy tokens, with nothing to stop them."""
    result = generate(BACKEND, PROMPTS, config=CONFIG, max_new_tokens=n)
    return [s.token_ids.tolist() for s in result.sequences]


def letters(ids: Sequence[int]) -> str:
    """A toy detokenizer: one letter a token id."""
    return "".join(chr(ord("a") + t % 26) for t in ids)


def test_one_sampling_params_per_request_each_keyed_by_its_own_seed() -> None:
    hot = [SamplingParams(temperature=1.0, seed=s, max_tokens=6) for s in (1, 2, 3)]
    each = generate(BACKEND, PROMPTS, config=CONFIG, sampling=hot).sequences
    for r, params in enumerate(hot):
        alone = generate(BACKEND, PROMPTS, config=CONFIG, sampling=params).sequences[r]
        assert each[r].token_ids.tolist() == alone.token_ids.tolist()


def test_max_tokens_stands_for_max_new_tokens_and_16_by_default() -> None:
    params = [SamplingParams(max_tokens=2), SamplingParams(), SamplingParams(max_tokens=5)]
    result = generate(BACKEND, PROMPTS, config=CONFIG, sampling=params)
    assert [len(s.token_ids) for s in result.sequences] == [2, 16, 5]
    with pytest.raises(InvalidInputError, match=r"'sampling\[0\].max_tokens' both give"):
        generate(BACKEND, PROMPTS, config=CONFIG, max_new_tokens=3, sampling=params)


def test_a_stop_token_id_ends_the_request_and_is_named() -> None:
    ids = free()[0]
    stop = ids[4]
    params = SamplingParams(stop_token_ids=[stop], max_tokens=12)
    (first, *_) = generate(BACKEND, PROMPTS, config=CONFIG, sampling=params).sequences
    assert first.token_ids.tolist() == ids[: ids.index(stop) + 1]
    assert (first.finish_reason, first.stop_reason) == ("stop", stop)


def test_min_tokens_keeps_stop_tokens_from_being_chosen_as_vllm_masks_them() -> None:
    ids = free()[0]
    stop = ids[0]
    early = SamplingParams(stop_token_ids=[stop], max_tokens=12)
    late = SamplingParams(stop_token_ids=[stop], max_tokens=12, min_tokens=3)
    assert generate(BACKEND, PROMPTS, config=CONFIG, sampling=early).sequences[
        0
    ].token_ids.tolist() == [stop]
    masked = generate(BACKEND, PROMPTS, config=CONFIG, sampling=late).sequences[0]
    tokens = masked.token_ids.tolist()
    assert stop not in tokens[:3]
    assert len(tokens) >= 3
    # The masked choice is the best other token: the logits' second choice.
    assert tokens[0] != stop


def test_ignore_eos_drops_the_common_stop_ids_only() -> None:
    ids = free()[1]
    eos, own = ids[1], ids[3]
    params = [SamplingParams(max_tokens=12, ignore_eos=True, stop_token_ids=[own])] * 3
    result = generate(BACKEND, PROMPTS, config=CONFIG, sampling=params, stop_token_ids=[eos])
    second = result.sequences[1]
    assert second.stop_reason == own
    assert second.token_ids.tolist() == ids[: ids.index(own) + 1]


def test_a_stop_string_ends_the_request_at_the_token_that_completes_it() -> None:
    ids = free()[2]
    text = letters(ids)
    stop = text[3:5]
    params = SamplingParams(stop=stop, max_tokens=12)
    result = generate(BACKEND, PROMPTS, config=CONFIG, sampling=params, detokenize=letters)
    third = result.sequences[2]
    end = text.index(stop) + len(stop)
    assert third.token_ids.tolist() == ids[:end]
    assert (third.finish_reason, third.stop_reason) == ("stop", stop)
    with pytest.raises(InvalidInputError, match="needs text: pass 'detokenize'"):
        generate(BACKEND, PROMPTS, config=CONFIG, sampling=params)


def test_an_empty_stop_string_is_refused() -> None:
    with pytest.raises(InvalidConfigError, match=r"'stop\[1\]' must be a non-empty string: ''"):
        SamplingParams(stop=["x", ""])


def test_logprobs_are_those_of_the_raw_logits() -> None:
    params = SamplingParams(logprobs=3, max_tokens=4, temperature=0.7, seed=5)
    result = generate(BACKEND, PROMPTS[:1], config=CONFIG, sampling=params)
    (sequence,) = result.sequences
    assert sequence.logprobs is not None
    assert sequence.top_token_ids is not None
    assert sequence.top_logprobs is not None
    assert sequence.top_token_ids.shape == sequence.top_logprobs.shape == (4, 3)
    # Recompute each row's logits whole (one-shot prefill of the prompt and tokens so far).
    tokens = PROMPTS[0] + sequence.token_ids.tolist()
    for t, token in enumerate(sequence.token_ids.tolist()):
        context = tokens[: len(PROMPTS[0]) + t]
        run = execute_schedule(plan_one_shot([len(context)]), BACKEND, [context])
        logits = np.asarray(run.logits, dtype=np.float64)[0]
        log_softmax = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert sequence.logprobs[t] == pytest.approx(log_softmax[token], abs=1e-9)
        best = np.argsort(-log_softmax, kind="stable")[:3]
        assert sequence.top_token_ids[t].tolist() == best.tolist()


def test_greedy_with_logprobs_keeps_the_greedy_tokens() -> None:
    params = SamplingParams(logprobs=0, max_tokens=12)
    result = generate(BACKEND, PROMPTS, config=CONFIG, sampling=params)
    assert [s.token_ids.tolist() for s in result.sequences] == free()
    assert all(s.top_token_ids is not None and s.top_token_ids.shape[1] == 0
               for s in result.sequences)  # fmt: skip


def test_on_finish_hears_each_request_once_as_it_finishes() -> None:
    heard: list[tuple[int, list[int]]] = []
    result = generate(
        BACKEND, PROMPTS, config=CONFIG, max_new_tokens=[9, 2, 5],
        on_finish=lambda r, s: heard.append((r, s.token_ids.tolist())),
    )  # fmt: skip
    assert sorted(r for r, _ in heard) == [0, 1, 2]
    assert heard[0][0] == 1  # the shortest finishes first
    assert dict(heard) == {r: s.token_ids.tolist() for r, s in enumerate(result.sequences)}


def test_a_stop_string_check_decodes_a_bounded_tail_however_long_the_text() -> None:
    """Decoding the whole text after every token would cost the square of its length."""
    seen: list[int] = []

    def spy(ids: Sequence[int]) -> str:
        seen.append(len(ids))
        return letters(ids)

    ids = free(60)[0]
    text = letters(ids)
    stop = text[50:52]
    params = SamplingParams(stop=stop, max_tokens=60)
    (first, *_) = generate(
        BACKEND, PROMPTS, config=CONFIG, sampling=params, detokenize=spy
    ).sequences
    assert first.token_ids.tolist() == ids[: text.index(stop) + len(stop)]
    assert max(seen) == 16 + 4 * len(stop) < len(first.token_ids)


@st.composite
def request_params(draw: st.DrawFn) -> SamplingParams:
    """Any per-request settings the loop honours, stop strings aside."""
    hot = draw(st.booleans())
    return SamplingParams(
        temperature=draw(st.sampled_from([0.5, 1.0, 2.0])) if hot else 0.0,
        top_k=draw(st.none() | st.integers(1, 8)),
        top_p=draw(st.none() | st.sampled_from([0.5, 0.9])),
        seed=draw(st.integers(0, 3)),
        max_tokens=draw(st.integers(1, 8)),
        min_tokens=draw(st.integers(0, 4)),
        stop_token_ids=draw(st.lists(st.integers(0, 63), max_size=3)),
        ignore_eos=draw(st.booleans()),
        logprobs=draw(st.none() | st.integers(0, 3)),
    )


@settings(max_examples=25, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 63), min_size=1, max_size=24), min_size=1,
                     max_size=6),
    data=st.data(),
)  # fmt: skip
def test_each_requests_tokens_and_logprobs_do_not_depend_on_the_plan(
    prompts: list[list[int]], data: st.DataObject
) -> None:
    """Whatever each request's settings, another policy, budget and pool (preemptions
    included) give the same tokens, stops and logprobs: the property that lets a resumed
    run write the bytes of an uninterrupted one."""
    params = [data.draw(request_params()) for _ in prompts]
    eos = data.draw(st.lists(st.integers(0, 63), max_size=2))
    wide = generate(BACKEND, prompts, config=CONFIG, sampling=params, stop_token_ids=eos)
    tight = generate(
        BACKEND, prompts, config=PlannerConfig(max_num_batched_tokens=8), sampling=params,
        stop_token_ids=eos, num_kv_pages=10, kv_page_size=4,
    )  # fmt: skip
    for a, b, p in zip(wide.sequences, tight.sequences, params, strict=True):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert (a.finish_reason, a.stop_reason) == (b.finish_reason, b.stop_reason)
        tokens = a.token_ids.tolist()
        stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos))
        assert not stops & set(tokens[: p.min_tokens])  # masked until min_tokens
        assert len(tokens) <= p.max_tokens  # type: ignore[operator]
        if p.logprobs is None:
            assert a.logprobs is None
        else:
            assert a.logprobs is not None
            assert b.logprobs is not None
            assert np.allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-9)
            assert a.top_token_ids is not None
            assert a.top_token_ids.shape == (len(tokens), p.logprobs)


# -- progress: one DispatchDone a dispatch, as execute_schedule's --------------------------------


def test_on_dispatch_hears_each_generation_dispatch_as_a_dispatch_done() -> None:
    heard: list[DispatchDone] = []
    news = [4, 1, 6]
    result = generate(
        BACKEND, PROMPTS, config=CONFIG, max_new_tokens=news, on_dispatch=heard.append
    )
    assert [done.index for done in heard] == list(range(result.stats.num_dispatches))
    assert all(done.num_dispatches is None for done in heard)  # not known ahead online
    assert all(done.num_requests == len(PROMPTS) for done in heard)
    finished = [done.num_finished for done in heard]
    assert finished == sorted(finished)
    assert finished[-1] == len(PROMPTS)
    generated = [done.num_generated_tokens for done in heard]
    assert generated == sorted(generated)
    assert generated[-1] == sum(news)
    assert [done.fraction for done in heard] == [n / len(PROMPTS) for n in finished]
    assert sum(done.num_tokens for done in heard) == result.stats.num_computed_tokens
    assert heard[0].num_decode_rows == 0
    assert heard[-1].num_decode_rows == heard[-1].num_rows
    mixed = sum(0 < done.num_decode_rows < done.num_rows for done in heard)
    assert mixed == result.stats.num_mixed_dispatches


def test_on_step_is_on_dispatch_by_its_retired_name() -> None:
    heard: list[DispatchDone] = []
    with pytest.warns(DeprecationWarning, match=r"'on_step' is deprecated: use 'on_dispatch'"):
        generate(BACKEND, PROMPTS, config=CONFIG, max_new_tokens=2, on_step=heard.append)
    expected: list[DispatchDone] = []
    generate(BACKEND, PROMPTS, config=CONFIG, max_new_tokens=2, on_dispatch=expected.append)
    assert heard == expected
    assert heard
    with pytest.raises(InvalidInputError, match=r"^'on_step' must not be given with 'on_dispa"):
        generate(BACKEND, PROMPTS, config=CONFIG, on_step=print, on_dispatch=print)


def test_num_pages_and_page_size_are_the_kv_pools_retired_names() -> None:
    expected = generate(BACKEND, PROMPTS, config=CONFIG, num_kv_pages=9, kv_page_size=4)
    with (
        pytest.warns(DeprecationWarning, match=r"'num_pages' is deprecated: use 'num_kv_pages'"),
        pytest.warns(DeprecationWarning, match=r"'page_size' is deprecated: use 'kv_page_size'"),
    ):
        old = generate(BACKEND, PROMPTS, config=CONFIG, num_pages=9, page_size=4)
    assert [s.token_ids.tolist() for s in old.sequences] == [
        s.token_ids.tolist() for s in expected.sequences
    ]
    assert old.stats.num_preemptions == expected.stats.num_preemptions > 0  # the small pool's
    with pytest.raises(InvalidInputError, match=r"^'num_pages' must not be given with 'num_kv_"):
        generate(BACKEND, PROMPTS, config=CONFIG, num_pages=9, num_kv_pages=9)
    with pytest.raises(InvalidInputError, match=r"^'page_size' must not be given with 'kv_page"):
        generate(BACKEND, PROMPTS, config=CONFIG, page_size=4, kv_page_size=8)
    # (The default size given by name is given too: neither silently wins.)
    with pytest.raises(InvalidInputError, match=r"^'page_size' must not be given with 'kv_page"):
        generate(BACKEND, PROMPTS, config=CONFIG, page_size=32, kv_page_size=16)


def test_an_error_about_the_pool_names_generates_argument() -> None:
    with pytest.raises(InvalidConfigError, match=r"^'num_kv_pages' must ") as info:
        generate(BACKEND, PROMPTS, config=CONFIG, max_new_tokens=30, num_kv_pages=2, kv_page_size=4)
    assert info.value.parameter == "num_kv_pages"
    with pytest.raises(InvalidInputError, match=r"^'kv_page_size' must be >= 1: 0$"):
        generate(BACKEND, PROMPTS, config=CONFIG, kv_page_size=0)
