"""Every ```python and ```bash block of README.md runs as written.

Python blocks: each runs in a fresh interpreter (``sys.executable -c``) with cwd = the repository
root and 8 simulated CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``,
``JAX_PLATFORMS=cpu``); the test fails on a non-zero exit status and shows stdout / stderr.

Bash blocks: each logical command line (``\\`` continuations joined, blank and comment-only lines
dropped; trailing ``# ...`` comments are left to bash) runs with ``bash -e -c`` in a fresh
temporary directory, so the files a block writes (``--json vgg16.json --plot vgg16.png``) land
there; this interpreter's ``bin`` directory comes first on PATH (``jaxpar``, ``python``) and the
repository root is on PYTHONPATH. As a user would type them, no device flags are passed (the CLI
sets up its own simulated devices); ``JAX_PLATFORMS=cpu`` keeps them off any accelerator. The
lines of a block run in order and the first failure fails the block.

Both kinds of block get the suite's ``XLA_FLAGS=--xla_backend_optimization_level=0``
(`helpers.FAST_CODEGEN`, conftest.py), which changes only XLA:CPU's machine code.

Setup and test commands are not re-run:

* ``pip install ...`` (also ``pip3`` / ``python -m pip``) installs nothing here. For a line
  ``pip install ... && CMD`` only ``CMD`` runs; a line that only installs is skipped.
* A command that runs pytest is skipped: ``pip install -e ".[test]" && python -m pytest -n auto
  --maxprocesses 4`` is the README's test command, which CI runs as it stands (running it here
  would recurse into the suite), and ``JAXPAR_UPDATE_GOLDENS=1 python -m pytest ...``
  rewrites ``tests/goldens``. Any command that sets ``JAXPAR_UPDATE_GOLDENS`` is skipped for
  the same reason.
* ``jaxpar demo`` (`helpers.README_DEMO`) runs once, in test_demo.py: that test runs the line
  as written, in the environment and kind of directory given here (`helpers.readme_env`), and
  checks what it prints.

Blocks without a language tag (the pipeline diagram) are not code and are not run. Test ids
name the block: its index among all fenced blocks of README.md, its language and first line.
"""

from __future__ import annotations

import itertools
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from helpers import README_DEMO, ROOT, readme_env

pytestmark = [pytest.mark.api, pytest.mark.slow]

README = ROOT / "README.md"
TIMEOUT_S = 600
RUN_LANGS = ("python", "bash")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)[^\n]*$")


class Block(NamedTuple):
    index: int  # position among all fenced blocks of the README
    lang: str
    line: int  # 1-based line of the opening fence
    code: str

    @property
    def first_line(self) -> str:
        return next((s.strip() for s in self.code.splitlines() if s.strip()), "")


def fenced_blocks(text: str) -> list[Block]:
    """All fenced code blocks of a Markdown text, in order."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, start = m["fence"], i
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = lines[i].strip()
            if close.startswith(fence[0] * len(fence)) and not close.strip(fence[0]):
                break
            body.append(lines[i])
            i += 1
        blocks.append(Block(len(blocks), m["lang"].lower(), start + 1, "\n".join(body) + "\n"))
        i += 1  # past the closing fence
    return blocks


def logical_lines(code: str) -> list[str]:
    """Shell command lines: ``\\``-continued lines joined; blank and comment-only lines dropped."""
    out: list[str] = []
    pending = ""
    for raw in code.splitlines():
        line = pending + raw.lstrip() if pending else raw
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1].rstrip() + " "
            continue
        pending = ""
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line.strip())
    if pending.strip():
        out.append(pending.strip())
    return out


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:  # unbalanced quotes: let bash report it
        return command.split()


def _is_pip_install(words: list[str]) -> bool:
    if words[:1] in (["pip"], ["pip3"]):
        return words[1:2] == ["install"]
    return len(words) >= 4 and words[1:4] == ["-m", "pip", "install"]


def _runs_pytest(words: list[str]) -> bool:
    return any(Path(w).name in ("pytest", "py.test") for w in words) or any(
        a == "-m" and b == "pytest" for a, b in itertools.pairwise(words)
    )


def shell_command(line: str) -> tuple[str | None, str]:
    """The command to run for one README command line, or None and why it is skipped."""
    command = line
    while True:
        words = _words(command)
        if not words:
            return None, "comment"
        if not _is_pip_install(words):
            break
        if "&&" not in command:
            return None, "setup: pip install"
        command = command.split("&&", 1)[1].strip()
    if any(w.startswith("JAXPAR_UPDATE_GOLDENS=") for w in words):
        return None, "rewrites the golden plans"
    if _runs_pytest(words):
        return None, "runs pytest (the README's test command, run by CI as written)"
    if command == README_DEMO:
        return None, "test_demo.py runs it as written and checks what it prints"
    return command, ""


def _block_id(block: Block) -> str:
    first = re.sub(r"[^A-Za-z0-9.=-]+", "_", block.first_line).strip("_")[:48]
    return f"block{block.index}-{block.lang}-{first}"


BLOCKS = fenced_blocks(README.read_text(encoding="utf-8"))
RUNNABLE = [b for b in BLOCKS if b.lang in RUN_LANGS]


def _tail(text: str, n: int = 6000) -> str:
    return text if len(text) <= n else "...\n" + text[-n:]


def _failure(block: Block, what: str, proc: subprocess.CompletedProcess[str]) -> str:
    return (
        f"README.md block {block.index} ({block.lang}, line {block.line}) failed: {what}\n"
        f"exit status {proc.returncode}\n"
        f"--- stdout ---\n{_tail(proc.stdout)}\n--- stderr ---\n{_tail(proc.stderr)}"
    )


def test_readme_has_runnable_blocks():
    langs = {b.lang for b in RUNNABLE}
    assert langs == set(RUN_LANGS), f"README.md blocks: {[(b.index, b.lang) for b in BLOCKS]}"


def test_command_rules():
    assert logical_lines("a \\\n  --b c  # note\n\n# only a comment\nd\n") == [
        "a --b c  # note",
        "d",
    ]
    assert shell_command("pip install -e . && jaxpar plan vgg16") == ("jaxpar plan vgg16", "")
    assert shell_command("pip install -e . && jaxpar demo")[0] is None  # test_demo runs it
    assert shell_command('pip install -e ".[test]"')[0] is None
    assert shell_command('pip install -e ".[test]" && python -m pytest')[0] is None
    assert shell_command("JAXPAR_UPDATE_GOLDENS=1 python -m pytest tests/x.py")[0] is None
    assert shell_command("jaxpar clusters  # presets") == ("jaxpar clusters  # presets", "")


@pytest.mark.parametrize("block", RUNNABLE, ids=_block_id)
def test_readme_block_runs(block: Block, tmp_path: Path):
    if block.lang == "python":
        proc = subprocess.run(
            [sys.executable, "-c", block.code],
            cwd=ROOT,
            env=readme_env(simulated_devices=True),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        assert proc.returncode == 0, _failure(block, "python", proc)
        return
    ran, skipped = 0, []
    for line in logical_lines(block.code):
        command, why = shell_command(line)
        if command is None:
            skipped.append(f"{line!r}: {why}")
            continue
        proc = subprocess.run(
            ["bash", "-e", "-c", command],
            cwd=tmp_path,
            env=readme_env(simulated_devices=False),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        assert proc.returncode == 0, _failure(block, f"$ {command}", proc)
        ran += 1
    if not ran:
        pytest.skip("nothing to run: " + "; ".join(skipped))
