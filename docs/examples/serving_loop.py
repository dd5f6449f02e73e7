"""A toy serving loop that plans prefill one step at a time with ``plan_step``.

    python docs/examples/serving_loop.py

Requests arrive at random steps, each with a prompt (some with a prefix-cache hit) and a
number of tokens to generate; a few are aborted while they wait. Every step the server:

1. admits the requests that arrived (``state.add``) and drops the aborted ones
   (``state.remove``);
2. runs decode first: one token for each request that has finished its prefill, up to the
   row limit, and reserves that room in the dispatch (stall-free batching, as in
   Sarathi-Serve);
3. fills the rest of the dispatch with prefill chunks planned by ``plan_step``;
4. "runs" the dispatch: a request whose final prefill chunk ran produces its first token and
   starts decoding; ``plan.state`` becomes the state for the next step.

There is no model: the point is the bookkeeping around the planner. The loop checks what a
real server would rely on -- every dispatch within the budget and row limit, every prompt's
chunks contiguous -- and returns a summary.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from pypto_sched import PlannerConfig, PrefillState, plan_step


@dataclass
class Request:
    """The server's own record of a request (the planner only sees its id and lengths)."""

    arrival: int
    prompt_length: int
    cached_tokens: int
    output_tokens: int
    #: Prompt tokens prefilled so far (the server checks each chunk starts here).
    prefilled: int = 0
    generated: int = 0
    first_token_step: int | None = None


@dataclass
class Summary:
    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    finished: int = 0
    aborted: int = 0
    #: Steps from arrival to first token, per finished request.
    time_to_first_token: list[int] = field(default_factory=list)


def serve(
    config: PlannerConfig, *, num_requests: int = 200, seed: int = 0, max_steps: int = 100_000
) -> Summary:
    """Run the toy server until every request has finished or been aborted."""
    rng = random.Random(seed)
    arrivals: dict[int, list[int]] = {}
    requests: dict[int, Request] = {}
    for request_id in range(num_requests):
        arrival = rng.randrange(num_requests // 2 + 1)
        length = rng.randint(1, 3000)
        requests[request_id] = Request(
            arrival=arrival,
            prompt_length=length,
            cached_tokens=rng.choice([0, 0, 0, rng.randrange(length)]),
            output_tokens=rng.randint(1, 64),
        )
        arrivals.setdefault(arrival, []).append(request_id)
    aborts: dict[int, list[int]] = {}  # step -> requests the client gives up on then
    for request_id in rng.sample(range(num_requests), num_requests // 20):
        aborts.setdefault(requests[request_id].arrival + rng.randint(1, 30), []).append(request_id)

    state: PrefillState[int] = PrefillState()
    decoding: list[int] = []  # requests past their prefill, in the order they got there
    budget = config.max_num_batched_tokens  # decode tokens count against the whole budget
    row_limit = config.max_num_seqs
    summary = Summary()
    for step in range(max_steps):
        if step > max(arrivals) and not state and not decoding:  # all served
            break
        summary.steps += 1
        # 1. Arrivals join the state; aborted requests leave it, or stop decoding.
        for request_id in arrivals.get(step, []):
            request = requests[request_id]
            request.prefilled = request.cached_tokens
            state = state.add(
                request_id, request.prompt_length, num_computed_tokens=request.cached_tokens
            )
        for request_id in aborts.get(step, []):
            if request_id in state:  # waiting or part-way through its prefill
                state = state.remove(request_id)
            elif request_id in decoding:
                decoding.remove(request_id)
            else:  # already finished
                continue
            summary.aborted += 1
        # 2. Decode first, leaving the planner the rest of the step.
        decode_rows = min(len(decoding), budget, row_limit if row_limit is not None else budget)
        decode_now = decoding[:decode_rows]
        # 3. Prefill planned into the room that is left.
        plan = plan_step(state, config, reserved_tokens=decode_rows, reserved_rows=decode_rows)
        assert plan.num_tokens + decode_rows <= budget
        assert plan.num_tokens <= config.effective_budget
        assert row_limit is None or plan.num_rows + decode_rows <= row_limit
        # 4. Run the dispatch.
        for request_id in decode_now:
            request = requests[request_id]
            request.generated += 1
            if request.generated == request.output_tokens:
                decoding.remove(request_id)
                summary.finished += 1
        summary.decode_tokens += decode_rows
        for request_id, chunk in plan.rows.items():
            request = requests[request_id]
            assert chunk.start == request.prefilled, "chunks of a prompt are contiguous"
            request.prefilled = chunk.end
            if chunk.is_final:  # its logits give the first output token
                request.generated = 1
                request.first_token_step = step
                summary.time_to_first_token.append(step - request.arrival)
                if request.output_tokens == 1:
                    summary.finished += 1
                else:
                    decoding.append(request_id)
        summary.prefill_tokens += plan.num_tokens
        state = plan.state
    else:
        raise RuntimeError(f"the server did not drain in {max_steps} steps")
    return summary


def main() -> None:
    config = PlannerConfig(
        max_num_batched_tokens=2048,
        long_prefill_token_threshold=512,
        max_num_seqs=32,
        page_size=16,
        policy="packed",
    )
    summary = serve(config)
    ttft = sorted(summary.time_to_first_token)
    print(
        f"{summary.finished} requests finished and {summary.aborted} aborted in "
        f"{summary.steps} steps: {summary.prefill_tokens} prefill and "
        f"{summary.decode_tokens} decode tokens; time to first token "
        f"median {ttft[len(ttft) // 2]} steps, worst {ttft[-1]}"
    )


if __name__ == "__main__":
    main()
