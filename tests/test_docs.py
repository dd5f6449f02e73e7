"""Every command and code snippet in README.md and docs/*.md runs, and prints what it shows.

How the docs mark what runs:

- ```` ```console ```` blocks: a line starting with ``$ `` is a shell command (a trailing
  ``\\`` continues it on the next line); the lines up to the next ``$ `` are its expected
  output, compared after stripping trailing spaces, in which ``...`` stands for any text
  (several lines included), as in doctest's ELLIPSIS. A command shown without output only
  has to succeed. Output is what a pipe gets: plain text, never wrapped.
- ```` ```python ```` blocks are executed; the blocks of one page share one namespace, in
  page order. End a block with ``assert`` lines to state what it shows. A sketch that cannot
  run on its own (a server loop calling the server's functions) is marked
  ```` ```python sketch ````: it is compiled, so its syntax is checked, but not run.
- ```` ```pycon ```` blocks (``>>> `` prompts) are run with doctest (ELLIPSIS on).
- Other blocks (``text``, ``json``, ``toml``, unmarked) are not run.

Commands run under bash in one scratch directory per page (a file written by one command is
there for the next), with this interpreter's ``bin`` directory first on ``PATH`` so that
``pypto-sched`` and ``python`` are the ones under test. Set-up commands (``make``, ``git
clone``, ``cd``, ``source``, ``python -m venv``, ``pip install``) are not run: they rebuild
the environment this suite runs in, and ``make test`` runs them for real.

After a deliberate change of output (a planner change that moves the numbers in
``docs/settings.md``), ``PYPTO_SCHED_UPDATE_DOCS=1 pytest tests/test_docs.py`` rewrites every
output shown that holds no ``...`` with what its command printed; review the diff.
"""

from __future__ import annotations

import doctest
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import CodeType

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: Commands that set up the environment rather than use it.
SETUP = re.compile(
    r"^(make\b|git clone\b|cd\b|source\b|\. |python3? -m venv\b|(python3? -m )?pip3? install\b)"
)
_FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_TIMEOUT = 300
#: What a command or block needs beyond the core, recognised by its text: without the
#: package, the command or block is skipped (and so is the page, if anything needs it).
NEEDS = (
    (re.compile(r"pypto-sched plot\b|\bmatplotlib\b"), "matplotlib"),
    (re.compile(r"--backend npu\b|\bpypto_sched_npu\b|\btorch\b"), "torch"),
    (re.compile(r"\btransformers\b"), "transformers"),
    (re.compile(r"\btokenizers\b|--backend-option checkpoint=tiny\b"), "tokenizers"),
    (re.compile(r"\bjinja2\b|--backend-option checkpoint=tiny\b"), "jinja2"),
    (re.compile(r"\bintegrations\.ray\b|--ray-address\b|--replicas \d+ --ray\b"), "ray"),
    (re.compile(r"\bintegrations\.vllm\b|\bfrom vllm\b|\bimport vllm\b"), "vllm"),
)
#: Set to 1 to rewrite the outputs shown (those without ``...``) with what the commands print.
UPDATE_ENV = "PYPTO_SCHED_UPDATE_DOCS"


@attrs.frozen
class Block:
    page: Path
    line: int
    language: str
    text: str
    #: Words after the language on the fence line, such as ``sketch``.
    flags: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{_shown(self.page)}:{self.line}"


@attrs.frozen
class Command:
    block: Block
    line: int
    command: str
    expected: list[str]
    #: The page line (1-based) of the first expected output line.
    output_line: int

    @property
    def where(self) -> str:
        return f"{_shown(self.block.page)}:{self.line}"


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    return [
        Block(
            page=page,
            line=text.count("\n", 0, match.start()) + 2,
            language=match.group(1),
            text=match.group(3),
            flags=tuple(match.group(2).split()),
        )
        for match in _FENCE.finditer(text)
    ]


def console_commands(block: Block) -> list[Command]:
    """The ``$ `` commands of a console block, each with the output lines shown after it."""
    commands: list[Command] = []
    lines = block.text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.startswith("$ "):
            raise AssertionError(
                f"{block.where}: a console block must start with a '$ ' command: {line!r}"
            )
        start = block.line + index
        parts = [line[2:]]
        while parts[-1].endswith("\\") and index + 1 < len(lines):
            index += 1
            parts[-1] = parts[-1][:-1]
            parts.append(lines[index])
        index += 1
        output_line = block.line + index
        expected = []
        while index < len(lines) and not lines[index].startswith("$ "):
            expected.append(lines[index].rstrip())
            index += 1
        command = " ".join(p.strip() for p in parts)
        commands.append(Command(block, start, command, expected, output_line))
    return commands


def matches(expected: list[str], actual: str) -> bool:
    """Whether ``actual`` is ``expected`` line by line, ``...`` matching any text."""
    want = "\n".join(expected).strip("\n")
    got = "\n".join(line.rstrip() for line in actual.splitlines()).strip("\n")
    pattern = ".*?".join(re.escape(part) for part in want.split("..."))
    return re.fullmatch(pattern, got, re.DOTALL) is not None


def environment() -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"}
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run_console(command: Command, cwd: Path) -> str:
    """Run ``command``; return its output, after checking it is the output shown."""
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command.command],
        cwd=cwd,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, (
        f"{command.where}: `{command.command}` exited with {result.returncode}:\n"
        f"{result.stderr}{result.stdout}"
    )
    if command.expected and not matches(command.expected, result.stdout):
        if _updating() and "..." not in "\n".join(command.expected):
            return result.stdout
        shown = "\n".join(command.expected)
        raise AssertionError(
            f"{command.where}: `{command.command}` printed\n{result.stdout}\n"
            f"but the page shows\n{shown}\n(after a deliberate change, "
            f"{UPDATE_ENV}=1 pytest tests/test_docs.py rewrites outputs without '...')"
        )
    return result.stdout


def _updating() -> bool:
    return os.environ.get(UPDATE_ENV, "") == "1"


def update_outputs(page: Path, outputs: list[tuple[Command, str]]) -> None:
    """Replace the outputs shown for ``outputs``' commands with what they printed."""
    lines = page.read_text().splitlines(keepends=True)
    for command, printed in sorted(outputs, key=lambda item: -item[0].output_line):
        start = command.output_line - 1
        new = [line.rstrip() + "\n" for line in printed.rstrip("\n").splitlines()]
        lines[start : start + len(command.expected)] = new
    page.write_text("".join(lines))


def run_pycon(block: Block, namespace: dict[str, object]) -> None:
    test = doctest.DocTestParser().get_doctest(
        block.text, namespace, block.where, str(block.page), block.line - 1
    )
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    result = runner.run(test, out=report.append, clear_globs=False)
    assert result.failed == 0, "".join(report)


def _run_python(code: CodeType, namespace: dict[str, object], block: Block) -> None:
    try:
        exec(code, namespace)
    except Exception as error:
        raise AssertionError(
            f"{block.where}: the python block failed with {type(error).__name__}: {error} "
            "(a sketch that cannot run on its own goes in a ```python sketch block)"
        ) from error


def missing_packages(text: str) -> list[str]:
    """The optional packages ``text`` needs (see :data:`NEEDS`) that are not installed."""
    return [
        package
        for pattern, package in NEEDS
        if pattern.search(text) and importlib.util.find_spec(package) is None
    ]


def run_page(page: Path, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Run every runnable block of ``page`` in order; return how many things ran."""
    missing = missing_packages("\n".join(b.text for b in blocks(page) if "sketch" not in b.flags))
    if missing:
        pytest.skip(f"{_shown(page)} needs {', '.join(missing)} (not installed)")
    monkeypatch.chdir(cwd)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    count = 0
    changed: list[tuple[Command, str]] = []
    for block in blocks(page):
        if block.language == "console":
            for command in console_commands(block):
                if SETUP.match(command.command):
                    continue
                printed = run_console(command, cwd)
                if command.expected and not matches(command.expected, printed):
                    changed.append((command, printed))
                count += 1
        elif block.language == "python":
            code = compile(block.text, block.where, "exec")
            if "sketch" not in block.flags:
                _run_python(code, namespace, block)
            count += 1
        elif block.language == "pycon":
            run_pycon(block, namespace)
            count += 1
    if changed:
        update_outputs(page, changed)
    return count


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_command_and_snippet_on_the_page_runs(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_page(page, tmp_path, monkeypatch)


def test_every_page_that_shows_commands_marks_them_as_console() -> None:
    """A ``pypto-sched`` command in an unmarked block would silently go untested."""
    for page in PAGES:
        for block in blocks(page):
            if block.language in ("", "text", "sh", "bash", "shell"):
                assert "pypto-sched " not in block.text, (
                    f"{block.where}: show commands in a ```console block with '$ ' prompts"
                )


def test_only_set_up_commands_are_skipped() -> None:
    skipped = [
        command.command
        for page in PAGES
        for block in blocks(page)
        if block.language == "console"
        for command in console_commands(block)
        if SETUP.match(command.command)
    ]
    assert all("pypto-sched " not in command for command in skipped), skipped


def test_the_conventions_are_checked() -> None:
    """The matcher and the parser behave as the module docstring says."""
    assert matches(["a", "...", "d"], "a\nb\nc\nd\n")
    assert matches(["time 1... s"], "time 1.25 s   \n")
    assert not matches(["a", "b"], "a\nc\n")
    block = Block(ROOT / "README.md", 1, "console", "$ echo one \\\n    two\none two\n$ true\n")
    commands = console_commands(block)
    assert [(c.command, c.expected, c.output_line) for c in commands] == [
        ("echo one two", ["one two"], 3),
        ("true", [], 5),
    ]
    assert SETUP.match("make demo")
    assert SETUP.match("pip install -e '.[cli,plot]'")
    assert not SETUP.match("pypto-sched plan --lengths 5 --max-num-batched-tokens 8")


def test_outputs_shown_can_be_rewritten_after_a_deliberate_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Intro.\n\n```console\n$ printf 'a\\nb\\n'\nold\n$ echo kept\nk...\n```\nEnd.\n"
    )
    with pytest.raises(AssertionError, match="but the page shows\nold"):
        run_page(page, tmp_path, monkeypatch)
    monkeypatch.setenv(UPDATE_ENV, "1")
    run_page(page, tmp_path, monkeypatch)
    assert page.read_text() == (
        "Intro.\n\n```console\n$ printf 'a\\nb\\n'\na\nb\n$ echo kept\nk...\n```\nEnd.\n"
    )


def test_a_python_sketch_is_compiled_but_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python sketch\nwhile serving:\n    step()\n```\n")
    assert run_page(page, tmp_path, monkeypatch) == 1
    page.write_text("```python sketch\nwhile serving\n```\n")
    with pytest.raises(SyntaxError):
        run_page(page, tmp_path, monkeypatch)
