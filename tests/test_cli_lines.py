"""``pypto-sched generate``'s lines as a vLLM user writes them: ``"messages"`` through the
checkpoint's chat template, per-line sampling keys, the generation config's defaults, and
one line naming the line or flag for every bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import save_word_tokenizer

from pypto_sched import LLM, SamplingParams
from pypto_sched.chat import ChatTemplate
from pypto_sched.cli import EXIT_OK, EXIT_USAGE, main
from pypto_sched_reference import TINY_MODEL, Weights, save_checkpoint

VOCAB = TINY_MODEL.vocab_size
WORDS = ["<unk>", "<s>", "</s>", "user", "assistant", "the", "cat", "sat", "hello"]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)
BUDGET = ["--max-num-batched-tokens", "32"]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A reference checkpoint with a word-level tokenizer and a chat template."""
    pytest.importorskip("tokenizers", reason="text needs the tokenizers library")
    pytest.importorskip("jinja2", reason="chat templates need jinja2")
    directory = tmp_path / "model"
    save_checkpoint(Weights.random(TINY_MODEL, seed=0), directory)
    save_word_tokenizer(directory, WORDS, VOCAB)
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def cli(
    capsys: pytest.CaptureFixture[str], model: Path, lines: list[Any], *argv: str
) -> tuple[int, list[dict[str, Any]], str]:
    path = model.parent / "prompts.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    status = main(["generate", "--backend", "reference", "--backend-option",
                   f"checkpoint={model}", "--prompts", str(path), *BUDGET, *argv])  # fmt: skip
    out, err = capsys.readouterr()
    return status, [json.loads(line) for line in out.splitlines()], err


MESSAGES = [{"role": "user", "content": "hello the cat"}]


def test_a_messages_line_is_the_chat_templates_prompt(
    capsys: pytest.CaptureFixture[str], model: Path
) -> None:
    rendered = ChatTemplate.from_directory(model).render(MESSAGES)  # type: ignore[union-attr]
    assert rendered == "<s>[user] hello the cat [assistant]"
    status, lines, err = cli(capsys, model, [{"messages": MESSAGES}, {"prompt": rendered}])
    assert status == EXIT_OK, err
    # The template writes the special tokens: the same ids as the rendered text's.
    assert lines[0]["token_ids"] == lines[1]["token_ids"]
    llm = LLM(model)
    (theirs,) = llm.chat(MESSAGES, SamplingParams(max_tokens=16))
    assert lines[0]["token_ids"] == list(theirs.token_ids)


def test_per_line_sampling_keys_replace_the_flags(
    capsys: pytest.CaptureFixture[str], model: Path
) -> None:
    hot = {"prompt": "the cat sat", "temperature": 1.0, "seed": 3, "top_k": 5}
    status, lines, err = cli(
        capsys, model, [hot, {"prompt": "the cat sat"}], "--max-new-tokens", "6"
    )
    assert status == EXIT_OK, err
    llm = LLM(model)
    theirs = llm.generate(
        ["the cat sat", "the cat sat"],
        [
            SamplingParams(temperature=1.0, seed=3, top_k=5, max_tokens=6),
            SamplingParams(max_tokens=6),
        ],
    )
    assert [line["token_ids"] for line in lines] == [list(o.token_ids) for o in theirs]


def test_a_stop_string_cuts_the_text_and_is_named(
    capsys: pytest.CaptureFixture[str], model: Path
) -> None:
    _, (free,), _ = cli(capsys, model, [{"prompt": "the cat"}], "--max-new-tokens", "8",
                         "--ignore-eos")  # fmt: skip
    stop = free["text"].split(" ")[3]
    line = {"prompt": "the cat", "stop": [stop]}
    status, (cut,), err = cli(capsys, model, [line], "--max-new-tokens", "8", "--ignore-eos")
    assert status == EXIT_OK, err
    assert (cut["finish_reason"], cut["stop_reason"]) == ("stop", stop)
    assert cut["text"] == free["text"][: free["text"].index(stop)]


def test_logprobs_on_a_line_come_back_on_its_line(
    capsys: pytest.CaptureFixture[str], model: Path
) -> None:
    status, (line,), err = cli(capsys, model, [{"prompt": "the cat", "logprobs": 2}],
                               "--max-new-tokens", "3")  # fmt: skip
    assert status == EXIT_OK, err
    assert len(line["logprobs"]) == len(line["token_ids"]) == 3
    assert [len(top) for top in line["top_logprobs"]] == [2, 2, 2]
    assert all(lp <= 0 for lp in line["logprobs"])


def test_the_generation_configs_defaults_apply_unless_turned_off(
    capsys: pytest.CaptureFixture[str], model: Path
) -> None:
    path = model / "generation_config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    config.update(max_new_tokens=5, temperature=0.9, top_k=4)
    path.write_text(json.dumps(config))
    lines = [{"prompt": "the cat", "ignore_eos": True}]
    status, (auto,), err = cli(capsys, model, lines)
    assert status == EXIT_OK, err
    assert len(auto["token_ids"]) == 5
    params = SamplingParams(temperature=0.9, top_k=4, max_tokens=5, ignore_eos=True)
    sampled = LLM(model).generate("the cat", params)
    assert auto["token_ids"] == list(sampled[0].token_ids)
    status, (off,), err = cli(capsys, model, lines, "--generation-config", "none")
    assert len(off["token_ids"]) == 16  # vLLM's default max_tokens
    status, (flag,), err = cli(capsys, model, lines, "--temperature", "0", "--max-new-tokens", "5")
    greedy = LLM(model, generation_config=None).generate("the cat", SamplingParams(
        max_tokens=5, ignore_eos=True))  # fmt: skip
    assert flag["token_ids"] == list(greedy[0].token_ids)


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ({"prompt": "the cat", "stop": [""]}, "line 1: 'stop[0]' must be a non-empty string: ''"),
        ({"prompt": "the cat", "temperature": -1}, "line 1: 'temperature' must be >= 0: -1"),
        ({"prompt": "the cat", "tempreature": 1}, "line 1: unknown keys ['tempreature']"),
        ({"messages": [{"role": "user", "content": "x"}], "prompt": "y"}, "give exactly one of"),
        ({"messages": "hello"}, "line 1: 'messages': 'messages' must be a non-empty list"),
        ({"messages": [{"content": "x"}]}, "must have a string 'role'"),
    ],
)
def test_a_bad_line_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], model: Path, line: dict[str, Any], fragment: str
) -> None:
    status, lines, err = cli(capsys, model, [line])
    assert (status, lines) == (EXIT_USAGE, [])
    assert err.count("\n") == 1
    assert err.startswith("pypto-sched: error: --prompts ")
    assert fragment in err


def test_a_failing_chat_template_is_one_line_naming_the_line(
    capsys: pytest.CaptureFixture[str], model: Path
) -> None:
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ raise_exception('only user turns: ' + messages[0]['role']) }}"
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    status, _, err = cli(capsys, model, [{"prompt": "the cat"}, {"messages": MESSAGES}])
    assert status == EXIT_USAGE
    assert err.count("\n") == 1
    assert "line 2: 'messages': " in err
    assert "failed: TemplateError: only user turns: user" in err


def test_messages_without_a_template_are_refused(
    capsys: pytest.CaptureFixture[str], model: Path
) -> None:
    (model / "tokenizer_config.json").write_text("{}")
    status, _, err = cli(capsys, model, [{"messages": MESSAGES}])
    assert status == EXIT_USAGE
    assert "line 1: 'messages' needs a chat template" in err


def test_version_is_printed_on_stdout() -> None:
    done = subprocess.run([sys.executable, "-m", "pypto_sched.cli", "--version"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0
    assert done.stdout.startswith("pypto-sched ")
    assert done.stderr == ""


def test_messages_without_a_tokenizer_say_so(
    capsys: pytest.CaptureFixture[str], model: Path
) -> None:
    (model / "tokenizer.json").unlink()
    status, _, err = cli(capsys, model, [{"messages": MESSAGES}])
    assert status == EXIT_USAGE
    assert "line 1: 'messages' needs a tokenizer (tokenizer.json" in err
