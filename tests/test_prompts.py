"""pypto_sched.prompts: text written as UTF-8, special tokens left out of decoded text, eos
ids and file sizes checked."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from pypto_sched import InvalidInputError
from pypto_sched.prompts import Tokenizer, eos_token_ids, output_lines, read_prompts
from pypto_sched.runtime import prompts
from pypto_sched.runtime._generate import GeneratedSequence, GenerationResult, GenerationStats


class _Codec:
    def encode(self, text: str) -> list[int]:
        return [1]

    def decode(self, token_ids: Sequence[int]) -> str:
        return "café ✓"


def _result() -> GenerationResult:
    sequence = GeneratedSequence(
        token_ids=np.array([3, 4], np.int64), finish_reason="length",
        first_token_dispatch=0, num_preemptions=0,
    )  # fmt: skip
    stats = GenerationStats(
        num_dispatches=1, num_mixed_dispatches=0, num_preemptions=0, num_prompt_tokens=1,
        num_generated_tokens=2, num_computed_tokens=2, mean_time_to_first_token=1.0,
        max_time_to_first_token=1, wall_seconds=0.0, planning_seconds=0.0,
    )  # fmt: skip
    return GenerationResult(sequences=(sequence,), stats=stats)


def test_output_lines_write_text_as_utf8_not_escapes() -> None:
    (line,) = output_lines(_result(), tokenizer=_Codec())
    assert "café ✓" in line
    assert json.loads(line) == {
        "index": 0, "token_ids": [3, 4], "finish_reason": "length", "text": "café ✓"
    }  # fmt: skip


def test_tokenizer_decode_leaves_special_tokens_out(tmp_path: Path) -> None:
    calls = []

    class Fake:
        def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
            calls.append(skip_special_tokens)
            return "x"

    assert Tokenizer(Fake(), path=tmp_path).decode([1, 2]) == "x"
    assert calls == [True]


@pytest.mark.parametrize("found", [-1, [2, -1]])
def test_a_negative_eos_token_id_is_refused(found: object, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": found}))
    with pytest.raises(InvalidInputError, match=r"'eos_token_id' must be an id or a list of ids"):
        eos_token_ids(tmp_path)


def test_an_eos_config_over_the_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}) + " " * 20)
    monkeypatch.setattr(prompts, "_MAX_CONFIG_BYTES", 20)
    with pytest.raises(InvalidInputError, match=r"is larger than the limit of 20 bytes"):
        eos_token_ids(tmp_path)


def test_vllms_key_names_are_taken_for_ours() -> None:
    ours = read_prompts(
        '{"token_ids": [1, 2], "max_new_tokens": 3}', max_new_tokens=8, vocab_size=9
    )
    theirs = read_prompts(
        '{"prompt_token_ids": [1, 2], "max_tokens": 3}', max_new_tokens=8, vocab_size=9
    )
    assert theirs == ours
    with pytest.raises(InvalidInputError, match="'max_new_tokens' must be an int in"):
        read_prompts('{"prompt_token_ids": [1], "max_tokens": 0}', max_new_tokens=8, vocab_size=9)


def test_eos_ids_outside_the_vocabulary_are_left_out_when_asked(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [3, 151645]}')
    assert eos_token_ids(tmp_path) == (3, 151645)
    assert eos_token_ids(tmp_path, vocab_size=64) == (3,)
