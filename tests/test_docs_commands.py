"""Every `nostall` command shown in README.md and docs/ is one the command takes as written: its
subcommand and flags exist, and a training command's settings pass the trainer's checks (the
run itself needs the files the example names; README's and the guide's Python examples run in
test_readme.py, the migration guides' here)."""

import re
import shlex
import tempfile
from pathlib import Path

import pytest

from nostall import cli
from nostall.config_flags import config_from

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", page.read_text(), flags=re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                line = line.split(" #")[0].strip()
                words = shlex.split(line) if line else []
                while words and "=" in words[0] and not words[0].startswith("-"):
                    words = words[1:]  # (VAR=value before the command)
                if words and words[0] == "nostall":
                    found.append((page.name, " ".join(words[1:])))
    return found


COMMANDS = commands()


def test_the_pages_show_commands():
    assert len(COMMANDS) >= 20


@pytest.mark.parametrize(("page", "command"), COMMANDS)
def test_a_documented_command_is_taken_as_written(page, command, capsys):
    argv = shlex.split(command)
    for end in ("--", ">", "|", "&&"):  # (the profiled script's arguments; the shell's)
        argv = argv[: argv.index(end)] if end in argv else argv
    if argv[0] == "--version" or "--help" in argv:
        return
    parser = cli._parser(train_flags=argv[0] == "train")
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{page}: `nostall {command}`: {capsys.readouterr().err}")
    if args.command == "train":
        config_class, _ = cli._trainer(args.algorithm)
        config = config_from(args, config_class)
        if config.device == "cpu":  # (a CUDA run's checks need the GPU)
            config.check()


@pytest.mark.parametrize("page", ["from_sb3.md", "from_trl.md"])
def test_a_migration_guides_python_runs_as_written(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # SB3's logger makes a folder under the temporary directory: this test's, not the machine's.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for block in re.findall(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S):
        exec(compile(block, f"docs/{page} python block", "exec"), {})
