"""A toy server that generates with a real model, every dispatch planned by
``plan_generation_step``.

    python docs/examples/serving_loop.py

Requests arrive at random steps, each with a prompt of random token ids and a number of
tokens to generate; a few are aborted by their client while they wait or run. The model is
the NumPy reference backend (a tiny random Qwen3-style decoder with a paged KV cache), and
the KV cache has a fixed number of pages, fewer than the busiest moment needs. Every step
the server:

1. admits the requests that arrived (``state.add``) and drops the aborted ones
   (``state.finish``, which frees their pages);
2. asks ``plan_generation_step`` for the next dispatch: decode rows first, then prefill
   chunks, admission by free pages, and preemption by recomputation when a decode row
   cannot get a page;
3. runs it on the backend: the kernel arrays come from the step (``step.arrays()``), the
   token ids of each row from the server's own record of each request's tokens (prompt and
   generated, so that a preempted request's recomputation feeds its generated tokens);
4. appends each sampled token (greedy) to its request; ``step.state`` is the next state,
   without the requests that reached their ``max_new_tokens``.

The server keeps the tokens and the clock; the planner keeps every scheduling and paging
decision. ``tests/test_examples.py`` checks that every finished request's tokens equal
what ``pypto_sched.generate`` gives for its prompt alone.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from pypto_sched import GenerationState, PlannerConfig, plan_generation_step
from pypto_sched.backends import DispatchInput
from pypto_sched_reference import ReferenceBackend


@dataclass
class Request:
    """The server's own record of a request (the planner sees its id and lengths)."""

    arrival: int
    prompt: list[int]
    max_new_tokens: int
    generated: list[int] = field(default_factory=list)
    first_token_step: int | None = None


@dataclass
class Summary:
    steps: int = 0
    finished: int = 0
    aborted: int = 0
    preemptions: int = 0
    mixed_steps: int = 0
    tokens_run: int = 0
    #: Steps from arrival to first token, per request that got one.
    time_to_first_token: list[int] = field(default_factory=list)
    #: The requests, by id, with their generated tokens.
    requests: dict[int, Request] = field(default_factory=dict)
    #: The ids of the requests aborted by their client.
    aborted_ids: set[int] = field(default_factory=set)


def serve(
    config: PlannerConfig,
    *,
    backend: ReferenceBackend | None = None,
    num_requests: int = 60,
    num_pages: int = 48,
    page_size: int = 8,
    seed: int = 0,
    max_steps: int = 100_000,
) -> Summary:
    """Run the toy server until every request has finished or been aborted."""
    backend = backend or ReferenceBackend.from_seed(seed=seed)
    rng = random.Random(seed)
    summary = Summary()
    arrivals: dict[int, list[int]] = {}
    for request_id in range(num_requests):
        arrival = rng.randrange(num_requests // 2 + 1)
        prompt = [rng.randrange(backend.vocab_size) for _ in range(rng.randint(1, 120))]
        summary.requests[request_id] = Request(arrival, prompt, rng.randint(1, 24))
        arrivals.setdefault(arrival, []).append(request_id)
    aborts: dict[int, list[int]] = {}  # step -> requests the client gives up on then
    for request_id in rng.sample(range(num_requests), num_requests // 10):
        when = summary.requests[request_id].arrival + rng.randint(0, 20)
        aborts.setdefault(when, []).append(request_id)

    state: GenerationState[int] = GenerationState(num_pages=num_pages, page_size=page_size)
    cache = backend.new_cache(num_pages=num_pages, page_size=page_size)
    for step_index in range(max_steps):
        if step_index > max(arrivals) and not state:  # all served
            break
        summary.steps += 1
        # 1. Arrivals join; aborted requests leave (a finished one has left already).
        for request_id in arrivals.get(step_index, []):
            request = summary.requests[request_id]
            state = state.add(
                request_id, len(request.prompt), max_new_tokens=request.max_new_tokens
            )
        for request_id in aborts.get(step_index, []):
            if request_id in state:
                state = state.finish(request_id)
                summary.aborted += 1
                summary.aborted_ids.add(request_id)
        if not state:
            continue
        # 2. The planner decides the dispatch.
        step = plan_generation_step(state, config)
        # 3. The server feeds each row the tokens of its positions and runs the model.
        tokens = []
        for request_id, chunk in step.rows.items():
            request = summary.requests[request_id]
            context = request.prompt + request.generated
            tokens.extend(context[chunk.start : chunk.start + chunk.length])
        batch = DispatchInput(
            arrays=step.arrays(index=step_index),
            token_ids=np.array(tokens, dtype=np.int64),
            input_embeddings=None,
            return_logits=False,
            return_greedy=bool(step.sampled),  # a dispatch without final rows asks nothing
        )
        output = backend.run_dispatch(batch, cache)
        # 4. Each final row gives its request one token.
        assert output.greedy_token_ids is not None or not step.sampled
        for row, request_id in enumerate(step.sampled):
            request = summary.requests[request_id]
            request.generated.append(int(output.greedy_token_ids[row]))  # type: ignore[index]
            if request.first_token_step is None:
                request.first_token_step = step_index
                summary.time_to_first_token.append(step_index - request.arrival)
        summary.finished += len(step.finished)
        summary.preemptions += len(step.preempted)
        summary.mixed_steps += step.is_mixed
        summary.tokens_run += step.num_tokens
        state = step.state
    else:
        raise RuntimeError(f"the server did not drain in {max_steps} steps")
    return summary


def main() -> None:
    config = PlannerConfig(
        max_num_batched_tokens=128, long_prefill_token_threshold=32, max_num_seqs=16,
        chunk_alignment=8, policy="packed",
    )  # fmt: skip
    summary = serve(config)
    ttft = sorted(summary.time_to_first_token)
    print(
        f"{summary.finished} requests finished and {summary.aborted} aborted in "
        f"{summary.steps} steps ({summary.mixed_steps} mixing decode and prefill): "
        f"{summary.tokens_run} tokens run, {summary.preemptions} preemptions; time to "
        f"first token median {ttft[len(ttft) // 2]} steps, worst {ttft[-1]}"
    )


if __name__ == "__main__":
    main()
