"""``pypto-sched generate``: a JSON Lines file of prompts in, generated tokens out.

The command only parses, calls the library and renders, so its tokens are checked against
:func:`pypto_sched.generate` called directly, against a one-shot-prefill configuration, and
(``--verify``, with transformers installed) against transformers' own ``generate()``. Every
bad input the issue lists exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import importlib.util
import io
import json
import re
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from cli_helpers import save_word_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from pypto_sched import InvalidInputError, PlannerConfig, SamplingParams, generate
from pypto_sched.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main
from pypto_sched.cli import _model as cli_model
from pypto_sched.cli import generate as generate_command
from pypto_sched.integrations import hf_verify
from pypto_sched.prompts import PromptRequest, load_tokenizer, output_lines, read_prompts
from pypto_sched_reference import TINY_MODEL, ReferenceBackend, Weights, save_checkpoint

VOCAB = TINY_MODEL.vocab_size
PROMPTS: list[list[int]] = [
    [int(t) for t in np.random.default_rng(r).integers(0, VOCAB, size=n)]
    for r, n in enumerate([20, 3, 41, 1, 17])
]
CHUNKED = ["--max-num-batched-tokens", "24", "--long-prefill-token-threshold", "8"]


def write_prompts(path: Path, lines: Sequence[object]) -> str:
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    path.write_text(text)
    return str(path)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["generate", "--backend", "reference", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def outputs(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


@pytest.fixture
def prompts_file(tmp_path: Path) -> str:
    return write_prompts(tmp_path / "prompts.jsonl", [{"token_ids": p} for p in PROMPTS])


# -- what it generates ---------------------------------------------------------------------


def test_greedy_output_equals_the_library_generate_in_input_order(
    capsys: pytest.CaptureFixture[str], prompts_file: str
) -> None:
    status, out, err = cli(capsys, "--prompts", prompts_file, "--max-new-tokens", "6", *CHUNKED)
    assert status == EXIT_OK, err
    expected = generate(
        ReferenceBackend.from_seed(),
        PROMPTS,
        config=PlannerConfig(max_num_batched_tokens=24, long_prefill_token_threshold=8),
        max_new_tokens=6,
    )
    assert outputs(out) == [
        {"index": i, "token_ids": s.token_ids.tolist(), "finish_reason": "length"}
        for i, s in enumerate(expected.sequences)
    ]


def test_chunked_generation_equals_one_shot_prefill_generation(
    capsys: pytest.CaptureFixture[str], prompts_file: str
) -> None:
    args = ["--prompts", prompts_file, "--max-new-tokens", "5"]
    chunked = cli(capsys, *args, *CHUNKED, "--kv-page-size", "4", "--num-kv-pages", "16")
    one_shot = cli(capsys, *args, "--max-num-batched-tokens", "100000")
    assert chunked[0] == one_shot[0] == EXIT_OK
    preemptions = re.search(r"^preemptions +(\d+)", chunked[2], re.MULTILINE)
    assert preemptions is not None
    assert int(preemptions[1]) > 0  # the small pool did preempt
    assert outputs(chunked[1]) == outputs(one_shot[1])


def test_per_line_max_new_tokens_and_stop_tokens_end_a_request(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, prompts_file: str
) -> None:
    status, out, _ = cli(capsys, "--prompts", prompts_file, "--max-new-tokens", "6", *CHUNKED)
    assert status == EXIT_OK
    greedy = outputs(out)
    stop_at = greedy[2]["token_ids"][3]
    first_stop = greedy[2]["token_ids"].index(stop_at)
    lines = [
        {"token_ids": PROMPTS[0], "max_new_tokens": 2},
        {"token_ids": PROMPTS[2], "stop_token_ids": [stop_at]},
    ]
    path = write_prompts(tmp_path / "lines.jsonl", lines)
    status, out, _ = cli(capsys, "--prompts", path, "--max-new-tokens", "6", *CHUNKED)
    assert status == EXIT_OK
    assert outputs(out) == [
        {"index": 0, "token_ids": greedy[0]["token_ids"][:2], "finish_reason": "length"},
        {
            "index": 1,
            "token_ids": greedy[2]["token_ids"][: first_stop + 1],
            "finish_reason": "stop",
            "stop_reason": stop_at,
        },
    ]


def test_seeded_sampling_does_not_depend_on_the_budget_or_the_pool(
    capsys: pytest.CaptureFixture[str], prompts_file: str
) -> None:
    sampled = ["--prompts", prompts_file, "--max-new-tokens", "8", "--temperature", "1.5",
               "--top-k", "20", "--top-p", "0.9", "--sampling-seed", "3"]  # fmt: skip
    runs = [
        cli(capsys, *sampled, *CHUNKED),
        cli(capsys, *sampled, "--max-num-batched-tokens", "64", "--policy", "packed"),
        cli(capsys, *sampled, "--max-num-batched-tokens", "16", "--kv-page-size", "2",
            "--num-kv-pages", "30"),
    ]  # fmt: skip
    assert [status for status, _, _ in runs] == [EXIT_OK] * 3
    assert outputs(runs[0][1]) == outputs(runs[1][1]) == outputs(runs[2][1])
    expected = generate(
        ReferenceBackend.from_seed(),
        PROMPTS,
        config=PlannerConfig(max_num_batched_tokens=100),
        max_new_tokens=8,
        sampling=SamplingParams(temperature=1.5, top_k=20, top_p=0.9, seed=3),
    )
    assert [line["token_ids"] for line in outputs(runs[0][1])] == [
        s.token_ids.tolist() for s in expected.sequences
    ]


def test_output_file_gets_the_lines_and_stderr_the_summary(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, prompts_file: str
) -> None:
    target = tmp_path / "out.jsonl"
    args = ["--prompts", prompts_file, "--max-new-tokens", "3", *CHUNKED]
    status, out, err = cli(capsys, *args, "--output", str(target))
    assert (status, out) == (EXIT_OK, "")
    assert len(outputs(target.read_text())) == len(PROMPTS)
    assert err.startswith("5 requests, 82 prompt tokens on backend 'reference' (packed)\n")
    for label in ("generated ", "dispatches ", "mixed prefill and decode", "preemptions ",
                  "time to first token ", "time ", "tokens/s"):  # fmt: skip
        assert label in err
    assert all(line == line.rstrip() for line in err.splitlines())


def test_a_progress_bar_asked_for_is_drawn_on_stderr(
    capsys: pytest.CaptureFixture[str], prompts_file: str
) -> None:
    args = ["--prompts", prompts_file, "--max-new-tokens", "3", *CHUNKED, "--progress"]
    status, out, err = cli(capsys, *args)
    assert status == EXIT_OK
    assert len(outputs(out)) == len(PROMPTS)
    assert "requests" in err.split("5 requests, 82 prompt tokens")[0]


def test_generate_needs_no_rich_unless_a_progress_bar_is_asked_for(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, prompts_file: str
) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setitem(sys.modules, "rich.console", None)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a bar by default, without rich
    args = ["--prompts", prompts_file, "--max-new-tokens", "3", *CHUNKED]
    status, out, err = cli(capsys, *args)
    assert status == EXIT_OK, err
    assert len(outputs(out)) == len(PROMPTS)
    assert err.startswith("5 requests, 82 prompt tokens on backend 'reference' (packed)\n")
    assert re.search(r"^generated {13}\d+ tokens$", err, flags=re.MULTILINE), err
    status, out, err = cli(capsys, *args, "--progress")
    assert (status, out) == (EXIT_FAILED, "")
    assert err == (
        "pypto-sched: error: --progress needs rich: pip install 'pypto-sched[cli]' "
        "(or use --no-progress)\n"
    )


# -- bad input: exit 2, one line -----------------------------------------------------------


def assert_usage_error(result: tuple[int, str, str], *fragments: str) -> None:
    status, out, err = result
    assert status == EXIT_USAGE, err
    assert out == ""
    assert err.startswith("pypto-sched: error: ")
    assert err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


def test_a_malformed_line_is_named_by_its_number(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write_prompts(tmp_path / "p.jsonl", ['{"token_ids": [1]}', "", '{"token_ids": [2,]}'])
    result = cli(capsys, "--prompts", path, "--max-new-tokens", "2", *CHUNKED)
    assert_usage_error(result, "line 3", "not valid JSON")


def test_a_token_id_outside_the_vocabulary(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [{"token_ids": [1, 2]}, {"token_ids": [3, VOCAB]}])
    result = cli(capsys, "--prompts", path, "--max-new-tokens", "2", *CHUNKED)
    assert_usage_error(result, "line 2", f"'token_ids'[1] must be in [0, {VOCAB})", str(VOCAB))


def test_a_prompt_longer_than_the_models_positions(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [{"token_ids": [1] * 30}])
    small = ["--backend-option", "max_position_embeddings=32"]
    assert cli(capsys, *small, "--prompts", path, "--max-new-tokens", "3", *CHUNKED)[0] == 0
    result = cli(capsys, *small, "--prompts", path, "--max-new-tokens", "4", *CHUNKED)
    assert_usage_error(result, "line 1", "33 positions", "the model's 32")


def test_a_pool_that_cannot_hold_one_request(
    capsys: pytest.CaptureFixture[str], prompts_file: str
) -> None:
    args = ["--prompts", prompts_file, "--max-new-tokens", "4", *CHUNKED, "--kv-page-size", "4"]
    result = cli(capsys, *args, "--num-kv-pages", "10")
    assert_usage_error(
        result, "error: --num-kv-pages: must hold every request alone: request 2 needs 44 tokens",
        "11 pages of 4: 10",
    )  # fmt: skip
    assert "num_pages" not in result[2]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("seed=abc", "'seed' must be an int >= 0: 'abc' (str)"),
        ("seed=-1", "'seed' must be an int >= 0: -1 (int)"),
        ("seed=true", "'seed' must be an int >= 0: True (bool)"),
        ("checkpoint=5", "the checkpoint directory must be a path (str or os.PathLike): 5 (int)"),
        ('dtype=["float64"]', "'dtype' must be one of ['float32', 'float64']: ['float64']"),
    ],
)
def test_a_bad_backend_option_value_is_named(
    capsys: pytest.CaptureFixture[str], prompts_file: str, option: str, message: str
) -> None:
    result = cli(capsys, "--backend-option", option, "--prompts", prompts_file,
                 "--max-new-tokens", "2", *CHUNKED)  # fmt: skip
    assert_usage_error(result, f"error: --backend-option: backend 'reference': {message}\n")


def test_an_empty_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl", ["", "   "])
    result = cli(capsys, "--prompts", path, "--max-new-tokens", "2", *CHUNKED)
    assert_usage_error(result, "holds no request")


def test_a_negative_temperature(capsys: pytest.CaptureFixture[str], prompts_file: str) -> None:
    args = ["--prompts", prompts_file, "--max-new-tokens", "2", *CHUNKED]
    assert_usage_error(
        cli(capsys, *args, "--temperature", "-0.5"), "error: --temperature: must be >= 0: -0.5"
    )


@pytest.mark.parametrize("top_p", ["0", "1.5", "-1"])
def test_a_top_p_out_of_range(
    capsys: pytest.CaptureFixture[str], prompts_file: str, top_p: str
) -> None:
    args = ["--prompts", prompts_file, "--max-new-tokens", "2", *CHUNKED]
    assert_usage_error(
        cli(capsys, *args, "--top-p", top_p), "error: --top-p: must be a number in (0, 1]"
    )


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--top-k", "0"], "--top-k: must be >= 1: 0"),
        (["--sampling-seed", "-1"], "--sampling-seed: must be >= 0: -1"),
        (["--sampling-seed", str(2**63)], f"--sampling-seed: must be <= {2**63 - 1}: {2**63}"),
    ],
)
def test_a_bad_sampling_option_is_named_by_its_flag(
    capsys: pytest.CaptureFixture[str], prompts_file: str, option: list[str], message: str
) -> None:
    args = ["--prompts", prompts_file, "--max-new-tokens", "2", *CHUNKED, *option]
    assert_usage_error(cli(capsys, *args), f"pypto-sched: error: {message}\n")


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('{"token_ids": [1], "max_token": 3}', "unknown keys ['max_token']"),
        ('{"token_ids": [1], "max_tokens": 3, "max_new_tokens": 3}', "not both"),
        ('{"token_ids": [1], "prompt_token_ids": [1]}', "give one of 'token_ids' and"),
        ('{"token_ids": [1], "prompt": "hi"}', "exactly one of"),
        ('{"token_ids": []}', "at least one token"),
        ('{"token_ids": [1, true]}', "'token_ids'[1] must be an int"),
        (
            '{"token_ids": [1], "max_new_tokens": 0}',
            "'max_new_tokens' must be an int in [1, 2147483647]: 0",
        ),
        (
            '{"token_ids": [1], "max_new_tokens": 2147483648}',
            "'max_new_tokens' must be an int in [1, 2147483647]: 2147483648",
        ),
        ('{"token_ids": [1], "stop_token_ids": [-1]}', "'stop_token_ids'[0] must be in"),
        ('{"prompt": "hello"}', "'prompt' needs a tokenizer"),
        ("[1, 2]", "expected a JSON object"),
        ('{"token_ids": [1], "token_ids": [2]}', "duplicate key"),
    ],
)
def test_other_bad_lines_are_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, line: str, fragment: str
) -> None:
    path = write_prompts(tmp_path / "p.jsonl", [line])
    result = cli(capsys, "--prompts", path, "--max-new-tokens", "2", *CHUNKED)
    assert_usage_error(result, "line 1", fragment)


def test_a_missing_prompts_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    result = cli(capsys, "--prompts", str(tmp_path / "nope.jsonl"), "--max-new-tokens", "2",
                 *CHUNKED)  # fmt: skip
    assert_usage_error(result, "--prompts: cannot read")


@pytest.mark.parametrize(
    ("where", "problem"),
    [
        ("no/such/dir.jsonl", "no directory"),
        (".", "it is a directory"),
        ("", "an empty file name"),
        ("prompts.jsonl", "it is the --prompts file, which it would overwrite"),
        ("stdout closed", "stdout is closed"),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_the_backend_loads(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    prompts_file: str,
    where: str,
    problem: str,
) -> None:
    def no_backend(*args: object, **kwargs: object) -> None:
        raise AssertionError("the backend loaded: the run would have gone ahead")

    monkeypatch.setattr(generate_command, "load_backend_from_args", no_backend)
    args = ["--prompts", prompts_file, "--max-new-tokens", "2", *CHUNKED]
    if where == "stdout closed":  # as Python starts with fd 1 closed: sys.stdout is None
        monkeypatch.setattr(sys, "stdout", None)
        result = cli(capsys, *args)
        assert_usage_error(result, problem)
        return
    before = Path(prompts_file).read_text()
    result = cli(capsys, *args, "--output", where and str(tmp_path / where))
    assert_usage_error(result, "--output: cannot write", problem)
    assert Path(prompts_file).read_text() == before


def test_output_dash_is_stdout(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    prompts_file: str,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    args = ["--prompts", prompts_file, "--max-new-tokens", "2", *CHUNKED]
    status, want, _ = cli(capsys, *args)
    assert status == EXIT_OK
    assert cli(capsys, *args, "--output", "-")[:2] == (EXIT_OK, want)
    assert not (tmp_path / "-").exists()


def test_a_generate_flag_given_twice_keeps_its_last_value(
    capsys: pytest.CaptureFixture[str], prompts_file: str
) -> None:
    args = ["--prompts", prompts_file, *CHUNKED]
    once = cli(capsys, *args, "--max-new-tokens", "3", "--policy", "packed")
    twice = cli(
        capsys, *args, "--max-new-tokens", "7", "--policy", "round_robin", "--max-new-tokens",
        "3", "--policy", "packed",
    )  # fmt: skip
    assert twice[:2] == once[:2]
    assert once[0] == EXIT_OK


def test_a_backend_option_key_given_twice_is_still_refused(
    capsys: pytest.CaptureFixture[str], prompts_file: str
) -> None:
    """A key of --backend-option is not a flag: two values for it are a mistake."""
    args = ["--prompts", prompts_file, "--max-new-tokens", "2", *CHUNKED]
    args += ["--backend-option", "seed=1", "--backend-option", "seed=2"]
    assert_usage_error(cli(capsys, *args), "--backend-option", "given twice; give it once")


def test_verify_refuses_sampling(capsys: pytest.CaptureFixture[str], prompts_file: str) -> None:
    args = ["--prompts", prompts_file, "--max-new-tokens", "2", *CHUNKED, "--verify"]
    assert_usage_error(cli(capsys, *args, "--temperature", "1"), "greedy")


def test_verify_without_transformers_says_what_to_install(
    capsys: pytest.CaptureFixture[str], prompts_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == "transformers" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    args = ["--prompts", prompts_file, "--max-new-tokens", "2", *CHUNKED, "--verify"]
    assert_usage_error(cli(capsys, *args), "pip install 'pypto-sched[transformers]'")


def test_verify_needs_a_checkpoint(
    capsys: pytest.CaptureFixture[str], prompts_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_model, "transformers_missing", lambda: None)
    args = ["--prompts", prompts_file, "--max-new-tokens", "2", *CHUNKED, "--verify"]
    assert_usage_error(cli(capsys, *args), "--backend-option checkpoint=DIR")


# -- the library reader ----------------------------------------------------------------------


requests = st.builds(
    PromptRequest,
    token_ids=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8).map(tuple),
    max_new_tokens=st.integers(1, 1000),
    stop_token_ids=st.lists(st.integers(0, VOCAB - 1), max_size=3).map(tuple),
)


@given(st.lists(requests, min_size=1, max_size=6), st.integers(1, 50))
@settings(max_examples=50, deadline=None)
def test_read_prompts_reads_back_every_written_request(
    written: list[PromptRequest], default: int
) -> None:
    lines = []
    for request in written:
        line: dict[str, Any] = {"token_ids": list(request.token_ids)}
        if request.max_new_tokens != default:
            line["max_new_tokens"] = request.max_new_tokens
        if request.stop_token_ids:
            line["stop_token_ids"] = list(request.stop_token_ids)
        lines.append(json.dumps(line))
    data = ("\n\n".join(lines) + "\n").encode()
    assert read_prompts(data, max_new_tokens=default, vocab_size=VOCAB) == tuple(written)


def test_read_prompts_refuses_bytes_that_are_not_utf8() -> None:
    with pytest.raises(
        InvalidInputError, match=r"^prompts is not UTF-8: invalid start byte on line 2 \(byte 19\)$"
    ):
        read_prompts(b'{"token_ids": [1]}\n\xff\n', max_new_tokens=1, vocab_size=VOCAB)


@pytest.mark.parametrize(
    ("data", "options", "message"),
    [
        (['{"token_ids": [1]}'], {}, r"^'data' must be JSON Lines, str or bytes: list$"),
        ('{"token_ids": [1]}', {"vocab_size": 0}, r"^'vocab_size' must be >= 1: 0$"),
        ('{"token_ids": [1]}', {"vocab_size": "64"}, r"^'vocab_size' must be an int: '64'"),
        ('{"token_ids": [1]}', {"max_new_tokens": 0}, r"^'max_new_tokens' must be >= 1: 0$"),
        # The caller's default is out of range, not line 1.
        ('{"token_ids": [1]}', {"max_new_tokens": 2**31},
         r"^'max_new_tokens' must be <= 2147483647: 2147483648$"),
        ('{"token_ids": [1]}', {"max_positions": 0}, r"^'max_positions' must be >= 1: 0$"),
    ],
)  # fmt: skip
def test_read_prompts_names_a_bad_argument(
    data: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        read_prompts(data, **{"max_new_tokens": 2, "vocab_size": VOCAB, **options})


def test_output_lines_names_a_result_that_is_not_one() -> None:
    with pytest.raises(
        InvalidInputError, match=r"^'result' must be a GenerationResult: 5 \(int\)$"
    ):
        list(output_lines(5))  # type: ignore[arg-type]


# -- a tokenizer.json in the checkpoint directory --------------------------------------------


WORDS = ["<unk>", "the", "cat", "sat", "on", "mat", "a", "dog"]


@pytest.fixture
def checkpoint_with_tokenizer(tmp_path: Path) -> Path:
    pytest.importorskip("tokenizers", reason="prompt text needs the tokenizers library")
    directory = tmp_path / "model"
    save_checkpoint(Weights.random(TINY_MODEL, seed=0), directory)
    save_word_tokenizer(directory, WORDS, VOCAB)
    return directory


def test_prompt_text_is_tokenized_and_the_output_decoded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, checkpoint_with_tokenizer: Path
) -> None:
    lines = [{"prompt": "the cat sat on the mat"}, {"token_ids": [1, 2, 3, 4, 1, 5]}]
    path = write_prompts(tmp_path / "p.jsonl", lines)
    option = ["--backend-option", f"checkpoint={checkpoint_with_tokenizer}"]
    status, out, err = cli(capsys, *option, "--prompts", path, "--max-new-tokens", "5", *CHUNKED)
    assert status == EXIT_OK, err
    text, ids = outputs(out)
    assert text["token_ids"] == ids["token_ids"]  # the same prompt, as text and as ids
    names = [WORDS[t] if t < len(WORDS) else f"w{t}" for t in text["token_ids"]]
    assert text["text"] == ids["text"] == " ".join(names)


def test_a_tokenizer_file_that_truncates_and_pads_changes_no_prompt(
    tmp_path: Path, checkpoint_with_tokenizer: Path
) -> None:
    """Some checkpoints save a truncation or padding setting in tokenizer.json; applied, it
    cut and padded every prompt (transformers' ``tokenizer(text)`` applies neither)."""
    import tokenizers

    path = checkpoint_with_tokenizer / "tokenizer.json"
    saved = tokenizers.Tokenizer.from_file(str(path))
    saved.enable_truncation(max_length=3)
    saved.enable_padding(length=9, pad_id=0)
    saved.save(str(path))
    tokenizer = load_tokenizer(checkpoint_with_tokenizer)
    assert tokenizer is not None
    assert tokenizer.encode("the cat sat on the mat") == [1, 2, 3, 4, 1, 5]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": null}', "line 1: 'prompt' must be a string: NoneType"),
        ('{"prompt": "the \\ud800 cat"}', "line 1: the tokenizer cannot encode 'prompt': "),
    ],
)
def test_a_prompt_the_tokenizer_cannot_encode_is_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    checkpoint_with_tokenizer: Path,
    line: str,
    message: str,
) -> None:
    """(A lone surrogate is valid JSON that the tokenizer refuses; null crashed with a
    KeyError, as if 'token_ids' had been given.)"""
    path = write_prompts(tmp_path / "p.jsonl", [line])
    option = ["--backend-option", f"checkpoint={checkpoint_with_tokenizer}"]
    result = cli(capsys, *option, "--prompts", path, "--max-new-tokens", "2", *CHUNKED)
    assert_usage_error(result, message)


def test_a_broken_tokenizer_file_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, checkpoint_with_tokenizer: Path
) -> None:
    (checkpoint_with_tokenizer / "tokenizer.json").write_text('{"model": {"type": "Nope"}}')
    path = write_prompts(tmp_path / "p.jsonl", [{"prompt": "the cat"}])
    option = ["--backend-option", f"checkpoint={checkpoint_with_tokenizer}"]
    result = cli(capsys, *option, "--prompts", path, "--max-new-tokens", "2", *CHUNKED)
    assert_usage_error(result, "is not a tokenizer")


# -- --verify against transformers ----------------------------------------------------------


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch", reason="transformers, the oracle, runs on torch")
    transformers = pytest.importorskip("transformers", reason="--verify runs transformers")
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.1,
        eos_token_id=3,
    )  # fmt: skip
    directory = tmp_path_factory.mktemp("hf") / "qwen3"
    transformers.Qwen3ForCausalLM(config).save_pretrained(directory)
    return directory


def test_verify_passes_against_transformers_generate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, hf_checkpoint: Path
) -> None:
    lines = [{"token_ids": PROMPTS[0]}, {"token_ids": PROMPTS[2], "stop_token_ids": [3, 7]},
             {"token_ids": PROMPTS[4], "max_new_tokens": 3}]  # fmt: skip
    path = write_prompts(tmp_path / "p.jsonl", lines)
    option = ["--backend-option", f"checkpoint={hf_checkpoint}"]
    args = [*option, "--prompts", path, "--max-new-tokens", "8", *CHUNKED, "--verify"]
    status, out, err = cli(capsys, *args, "--kv-page-size", "4", "--num-kv-pages", "14")
    assert status == EXIT_OK, err
    assert "PASS vs transformers generate(): 3/3 equal" in err
    # Only the summary: transformers' progress bars and logs stay off stderr.
    assert err.splitlines()[0].startswith("3 requests, ")
    assert "Loading weights" not in err
    assert [len(line["token_ids"]) <= 8 for line in outputs(out)] == [True] * 3


def test_verify_exits_1_on_a_mismatch(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    hf_checkpoint: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = generate_command.execute

    def wrong_second_token(*args: Any, on_finish: Any, **kwargs: Any) -> Any:
        def changed(place: int, sequence: Any) -> None:
            ids = sequence.token_ids.copy()
            if place == 0:
                ids[1] = (ids[1] + 1) % VOCAB
            on_finish(place, attrs.evolve(sequence, token_ids=ids))

        return real(*args, on_finish=changed, **kwargs)

    monkeypatch.setattr(generate_command, "execute", wrong_second_token)
    path = write_prompts(tmp_path / "p.jsonl", [{"token_ids": PROMPTS[1]}])
    option = ["--backend-option", f"checkpoint={hf_checkpoint}"]
    status, _, err = cli(capsys, *option, "--prompts", path, "--max-new-tokens", "4", *CHUNKED,
                         "--verify")  # fmt: skip
    assert status == EXIT_FAILED
    assert "FAIL vs transformers generate(): 0/1 equal" in err
    assert "request 0: generated token 1 is" in err
    assert "after the same tokens" in err  # checked again within the backend's tolerance
    # The backend's tolerance sets the slack near-ties have: within a vast one every token
    # keeps to it, but the changed token derails the ones after it, and so many tokens off
    # transformers' choice are no near-ties.
    monkeypatch.setattr(generate_command, "relative_tolerance", lambda backend: 1e6)
    status, _, err = cli(capsys, *option, "--prompts", path, "--max-new-tokens", "4", *CHUNKED,
                         "--verify")  # fmt: skip
    assert status == EXIT_FAILED, err
    assert "0/1 equal, 1 more break a near-tie the other way" in err
    assert "more than 1 in 20 of the tokens differ: too many to be near-ties" in err


def test_verification_is_plain_greedy_whatever_the_checkpoints_generation_config(
    tmp_path: Path, hf_checkpoint: Path
) -> None:
    directory = tmp_path / "qwen3"
    shutil.copytree(hf_checkpoint, directory)
    backend = ReferenceBackend.from_checkpoint(directory)
    prompts = [PROMPTS[0], PROMPTS[2]]
    result = generate(backend, prompts, config=PlannerConfig(max_num_batched_tokens=24),
                      max_new_tokens=8, kv_page_size=4)  # fmt: skip
    generated = [s.token_ids for s in result.sequences]
    settings_file = directory / "generation_config.json"
    settings = json.loads(settings_file.read_text())
    # Each would change greedy tokens; the first bans the first token generated.
    settings.update(suppress_tokens=[int(generated[0][0])], repetition_penalty=1.5,
                    no_repeat_ngram_size=1, min_new_tokens=8)  # fmt: skip
    settings_file.write_text(json.dumps(settings))
    verification = hf_verify.verify_greedy_generation(directory, prompts, generated,
                                                      max_new_tokens=8)  # fmt: skip
    assert verification.passed, verification.describe()


# -- help ------------------------------------------------------------------------------------


def test_help_fits_80_columns_and_its_examples_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    body = out[out.index("\n\n") :]
    assert [line for line in body.splitlines() if len(line) > 80] == []
    monkeypatch.chdir(tmp_path)
    write_prompts(tmp_path / "prompts.jsonl", [{"token_ids": p} for p in PROMPTS])
    for _, example in generate_command.EXAMPLES[:2]:  # the third needs a checkpoint
        argv = shlex.split(example.replace("\\\n", " "))
        status, _, _ = (main(argv), *capsys.readouterr())
        assert status == EXIT_OK, example
    assert len(outputs((tmp_path / "out.jsonl").read_text())) == len(PROMPTS)


# -- the checkpoint's EOS ids ----------------------------------------------------------------


@pytest.fixture
def reference_checkpoint(tmp_path: Path) -> Path:
    directory = tmp_path / "model"
    save_checkpoint(Weights.random(TINY_MODEL, seed=0), directory)
    return directory


@pytest.mark.parametrize("file", ["generation_config.json", "config.json"])
def test_the_checkpoints_eos_ids_end_requests_unless_ignored(
    capsys: pytest.CaptureFixture[str], prompts_file: str, reference_checkpoint: Path, file: str
) -> None:
    args = ["--backend-option", f"checkpoint={reference_checkpoint}", "--prompts", prompts_file,
            "--max-new-tokens", "6", *CHUNKED]  # fmt: skip
    status, out, _ = cli(capsys, *args)
    assert status == EXIT_OK
    free = outputs(out)
    eos = free[0]["token_ids"][2]
    path = reference_checkpoint / file
    fields = json.loads(path.read_text()) if path.exists() else {}
    # 151645 (Qwen's EOS, kept by a small model of the family) is outside the vocabulary:
    # it can never be generated, and it stops nothing.
    path.write_text(json.dumps({**fields, "eos_token_id": [VOCAB - 1, eos, 151645]}))
    status, out, _ = cli(capsys, *args)
    assert status == EXIT_OK
    for before, after in zip(free, outputs(out), strict=True):
        ids = before["token_ids"]
        ends = [i for i, t in enumerate(ids) if t in (eos, VOCAB - 1)]
        if ends:
            cut = ids[: ends[0] + 1]
            assert after == {**before, "token_ids": cut, "finish_reason": "stop",
                             "stop_reason": cut[-1]}  # fmt: skip
        else:
            assert after == before
    assert outputs(cli(capsys, *args, "--ignore-eos")[1]) == free


def test_greedy_generation_on_nan_logits_exits_1_naming_the_dispatch(
    capsys: pytest.CaptureFixture[str], prompts_file: str, tmp_path: Path
) -> None:
    weights = Weights.random(TINY_MODEL, seed=0)
    directory = tmp_path / "nan-model"
    save_checkpoint(attrs.evolve(weights, norm=np.full_like(weights.norm, np.nan)), directory)
    args = ["--backend-option", f"checkpoint={directory}", "--prompts", prompts_file,
            "--max-new-tokens", "8", "--max-num-batched-tokens", "64"]  # fmt: skip
    status, out, err = cli(capsys, *args)
    assert (status, out) == (EXIT_FAILED, "")
    assert "dispatch 0" in err, err
    assert "logits must be finite to give greedy ids" in err, err


def test_a_bad_eos_id_is_one_line(
    capsys: pytest.CaptureFixture[str], prompts_file: str, reference_checkpoint: Path
) -> None:
    (reference_checkpoint / "generation_config.json").write_text('{"eos_token_id": "2"}')
    args = ["--backend-option", f"checkpoint={reference_checkpoint}", "--prompts", prompts_file,
            "--max-new-tokens", "6", *CHUNKED]  # fmt: skip
    assert_usage_error(cli(capsys, *args), "generation_config.json", "'eos_token_id' must be")


def test_prompts_are_read_from_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, prompts_file: str
) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(Path(prompts_file).read_bytes())))
    status, out, _ = cli(capsys, "--prompts", "-", "--max-new-tokens", "2", *CHUNKED)
    assert status == EXIT_OK
    assert [line["index"] for line in outputs(out)] == list(range(len(PROMPTS)))


@pytest.mark.parametrize(
    ("ours", "theirs", "expected"),
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 3], [1, 5, 3], (1, 2, 5)),
        ([1, 2], [1, 2, 3], (2, None, 3)),
        ([1, 2, 3], [1, 2], (2, 3, None)),
    ],
)
def test_a_verification_names_the_first_differing_token(
    ours: list[int], theirs: list[int], expected: tuple[int, int | None, int | None] | None
) -> None:
    found = hf_verify._first_difference(4, ours, theirs)
    if expected is None:
        assert found is None
    else:
        assert found == hf_verify.Mismatch(
            index=4, position=expected[0], ours=expected[1], theirs=expected[2]
        )


def test_transformers_tokens_are_cut_after_the_first_stop_token() -> None:
    assert hf_verify._until_stop([4, 7, 9, 7], {7, 9}) == [4, 7]
    assert hf_verify._until_stop([4, 5], {7}) == [4, 5]


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--max-new-tokens", "0"], "--max-new-tokens: must be >= 1: 0"),
        (["--max-new-tokens", "2", "--kv-page-size", "0"], "--kv-page-size: must be >= 1: 0"),
        (["--max-new-tokens", "2", "--num-kv-pages", "0"], "--num-kv-pages: must be >= 1: 0"),
        (["--max-new-tokens", "99999999999999"],
         "error: --max-new-tokens: must be <= 2147483647: 99999999999999"),
        (["--max-new-tokens", "2", "--kv-page-size", "99999999999"],
         "error: --kv-page-size: must be <= 2147483647: 99999999999"),
        (["--max-new-tokens", "2", "--num-kv-pages", "99999999999"],
         "error: --num-kv-pages: must be <= 2147483647: 99999999999"),
    ],
)  # fmt: skip
def test_limits_out_of_range_are_named_by_their_flags(
    capsys: pytest.CaptureFixture[str], prompts_file: str, flags: list[str], fragment: str
) -> None:
    assert_usage_error(cli(capsys, "--prompts", prompts_file, *flags, *CHUNKED), fragment)


# -- verify_greedy_generation's arguments -----------------------------------------------------


def test_verify_greedy_generation_takes_the_forms_generate_takes(hf_checkpoint: Path) -> None:
    backend = ReferenceBackend.from_checkpoint(hf_checkpoint)
    prompts: list[Any] = [PROMPTS[0], np.array(PROMPTS[2])]
    result = generate(backend, prompts, config=PlannerConfig(max_num_batched_tokens=24),
                      max_new_tokens=5, stop_token_ids=[3])  # fmt: skip
    generated = [s.token_ids for s in result.sequences]
    verification = hf_verify.verify_greedy_generation(
        hf_checkpoint, prompts, generated, max_new_tokens=5, stop_token_ids=[3]
    )
    assert verification.passed, verification.describe()


def _greedy_after(model: Any, ids: list[int], count: int) -> tuple[list[int], list[Any]]:
    """transformers' greedy continuation of ``ids`` (``count`` tokens) and its logit rows."""
    import torch

    tokens, rows = list(ids), []
    for _ in range(count):
        with torch.inference_mode():
            row = model(input_ids=torch.tensor([tokens])).logits[0, -1].double()
        rows.append(row)
        tokens.append(int(row.argmax()))
    return tokens[len(ids) :], rows


def test_a_near_tie_broken_the_other_way_passes_within_the_tolerance_and_fails_beyond(
    hf_checkpoint: Path,
) -> None:
    """A run that takes transformers' second choice at one token and its greedy tokens after
    that passes exactly when twice the allowed difference covers the gap between the two
    choices; beyond, the mismatch names that token and the gap; with no tolerance, the
    comparison is exact."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_checkpoint, dtype=torch.float64)
    prompt, flip = PROMPTS[1], 2
    greedy, rows = _greedy_after(model, prompt, flip + 1)
    best, runner_up = (int(i) for i in rows[flip].topk(2).indices)
    gap = float(rows[flip][best] - rows[flip][runner_up])
    scale = float(rows[flip].abs().max())
    assert greedy[flip] == best
    ours = [*greedy[:flip], runner_up]
    ours += _greedy_after(model, prompt + ours, 6 - len(ours))[0]

    def verify(
        tokens: list[int] = ours, tolerance: float = 0.0, relative_tolerance: float = 0.0
    ) -> Any:
        return hf_verify.verify_greedy_generation(
            hf_checkpoint, [prompt], [tokens], max_new_tokens=6, tolerance=tolerance,
            relative_tolerance=relative_tolerance,
        )  # fmt: skip

    exact = verify()
    assert exact.mismatches == (hf_verify.Mismatch(index=0, position=flip, ours=runner_up,
                                                   theirs=best),)  # fmt: skip
    within = [verify(tolerance=gap / 2 * 1.001),
              verify(relative_tolerance=gap / 2 / scale * 1.001)]  # fmt: skip
    for verification in within:
        assert verification.passed, verification.describe()
        (tie,) = verification.near_ties
        assert (tie.index, tie.position, tie.ours, tie.theirs) == (0, flip, runner_up, best)
        assert 0.99 < tie.worst_fraction <= 1.0
        assert verification.describe().startswith(
            "PASS vs transformers generate(): 0/1 equal, 1 more break a near-tie the other way"
        )
    beyond = verify(tolerance=gap / 2 * 0.99)
    assert not beyond.passed
    assert beyond.near_ties == ()
    (mismatch,) = beyond.mismatches
    assert (mismatch.position, mismatch.ours, mismatch.theirs) == (flip, runner_up, best)
    assert mismatch.gap == pytest.approx(gap)
    assert mismatch.slack == pytest.approx(gap * 0.99)
    assert "after the same tokens is" in beyond.describe()
    # Tokens that end where greedy generation does not are no near-tie, whatever the slack,
    # and the mismatch says how they end.
    endings = {
        "ends after 5 of 6 tokens without a stop token": ours[:-1],
        "generated 7 tokens, more than max_new_tokens 6": [*ours, ours[-1]],
    }
    for ending, tokens in endings.items():
        (wrong,) = verify(tokens, tolerance=1e6).mismatches
        assert wrong.ending == ending
        assert wrong.describe() == f"request 0: {ending}"
    # Two tokens off transformers' choice in six are too many to be near-ties.
    after = ours[: flip + 1]
    row = _greedy_after(model, prompt + after, 1)[1][0]
    second = [*after, int(row.topk(2).indices[1])]  # the second choice again
    second += _greedy_after(model, prompt + second, 6 - len(second))[0]
    twice = verify(second, tolerance=1e6)
    assert twice.mismatches == ()
    assert twice.near_ties[0].num_differing == 2
    assert not twice.passed
    assert "too many to be near-ties" in twice.describe()


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"tolerance": -1.0}, "'tolerance' must be a finite real number >= 0: -1.0"),
        ({"relative_tolerance": float("nan")}, "'relative_tolerance' must be a finite real"),
        ({"max_new_tokens": 0}, "'max_new_tokens' must be >= 1: 0"),
        ({"max_new_tokens": [2]}, r"'max_new_tokens' must be an int or one int per prompt \(2\)"),
        ({"stop_token_ids": 2}, "'stop_token_ids' must be a collection of token ids"),
        ({"stop_token_ids": [[2]]}, "'stop_token_ids' must be an int"),
        ({"request_stop_token_ids": [[2]]}, r"'request_stop_token_ids' must have one entry per"),
        ({"generated": [[4]]}, r"'generated' must be a sequence of one token id array per prompt"),
        ({"generated": [[4], [VOCAB]]}, r"'generated\[1\]' values must be in \[0, 64\)"),
        ({"prompts": [[1, VOCAB], [3]]}, r"'prompts\[0\]' values must be in \[0, 64\)"),
        ({"prompts": [[], [3]]}, r"'prompts\[0\]' must hold at least one token"),
        ({"prompts": []}, "'prompts' must be a non-empty sequence"),
        ({"checkpoint": 5}, r"'checkpoint' must be a checkpoint directory: 5 \(int\)"),
        ({"checkpoint": "/nonexistent"}, "'checkpoint' must be a checkpoint directory"),
        ({"dtype": "int8"}, "'dtype' must be one of"),
    ],
)
def test_verify_greedy_generation_names_a_bad_argument(
    reference_checkpoint: Path, change: dict[str, Any], fragment: str
) -> None:
    if hf_verify.transformers_missing() is not None:
        pytest.skip("the check runs only where a verification can")
    arguments: dict[str, Any] = {
        "checkpoint": reference_checkpoint,
        "prompts": [[1, 2], [3]],
        "generated": [[4], [5]],
        "max_new_tokens": 1,
        **change,
    }
    with pytest.raises(InvalidInputError, match=fragment):
        hf_verify.verify_greedy_generation(**arguments)


# -- sampling options under greedy, and how dispatches are counted ----------------------------


def test_top_k_and_top_p_are_ignored_at_temperature_0_as_the_help_says(
    capsys: pytest.CaptureFixture[str], prompts_file: str
) -> None:
    args = ["--prompts", prompts_file, "--max-new-tokens", "4", *CHUNKED]
    status, greedy, _ = cli(capsys, *args)
    assert status == EXIT_OK
    ignored = cli(capsys, *args, "--top-k", "1", "--top-p", "0.01", "--sampling-seed", "9")
    assert ignored[:2] == (EXIT_OK, greedy)
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--top-k K keep the K likeliest tokens (ignored at --temperature 0" in help_text
    assert "(0, 1] (ignored at --temperature 0)" in help_text


def test_first_token_dispatch_counts_from_0_and_time_to_first_token_from_1() -> None:
    result = generate(ReferenceBackend.from_seed(), PROMPTS, max_new_tokens=3,
                      config=PlannerConfig(max_num_batched_tokens=24))  # fmt: skip
    firsts = [s.first_token_dispatch for s in result.sequences]
    assert min(firsts) == 0
    assert result.stats.mean_time_to_first_token == pytest.approx(np.mean(firsts) + 1)
    assert result.stats.max_time_to_first_token == max(firsts) + 1
