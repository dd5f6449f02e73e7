"""Running ``pypto-sched`` in-process, as the command-line tests do, and the word-level
tokenizer their checkpoints carry."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pypto_sched.cli import EXIT_OK, main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``pypto-sched ARGV...``: the exit status, stdout and stderr."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    """``pypto-sched ARGV... --format json``, which must succeed silently; its parsed output."""
    status, out, err = run(capsys, *argv, "--format", "json")
    assert (status, err) == (EXIT_OK, "")
    return json.loads(out)


def save_word_tokenizer(directory: Path, words: Sequence[str], vocab_size: int) -> None:
    """Write ``directory/tokenizer.json``: one token a word, ``words`` first and then
    ``w<id>`` up to ``vocab_size`` (needs the tokenizers library)."""
    import tokenizers

    vocab = {word: i for i, word in enumerate(words)}
    vocab.update({f"w{i}": i for i in range(len(words), vocab_size)})
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.decoder = tokenizers.decoders.WordPiece(prefix="##")
    tokenizer.save(str(directory / "tokenizer.json"))
