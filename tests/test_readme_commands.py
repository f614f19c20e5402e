"""Every ``python -m <module> ...`` command in the READMEs parses with that module's own argument parser.

Nothing runs: the module's ``main`` is called with the command's arguments and stopped right after
`text2grad.core.config.parse_config` has parsed them (and loaded the ``--config`` YAML, when the file exists), so a
renamed, unknown or abbreviated flag, or a value the config rejects, fails here instead of for a reader.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

import text2grad.core.config as config_module

REPO = Path(__file__).resolve().parents[1]
READMES = [
    "README.md",
    "annotation/README.md",
    "reward_model/README.md",
    "policy_optimization/README.md",
    "text2grad/apps/evaluation/README.md",
    "text2grad/apps/evaluation/README_code.md",
    "text2grad/apps/prepare_data/README.md",
    "text2grad/apps/quickstart/README.md",
]
# `python -m X`, and launchers that take a module: `deepspeed ... --module X`, `accelerate launch ... -m X`, `torchrun -m X`
_MODULE = re.compile(r"(?:\bpython3?|\bdeepspeed\b[^`\n]*?|\baccelerate launch\b[^`\n]*?|\btorchrun\b[^`\n]*?)\s(?:-m|--module)\s+([\w.]+)(.*)")


PROJECT_PACKAGES = ("text2grad", "annotation", "reward_model", "policy_optimization")


def _snippets(text: str) -> list[tuple[str, bool]]:
    """Shell text of the README, each with whether it is inline: fenced code lines (with ``\\`` continuations
    joined) and inline `code` spans."""
    out, prose, fenced = [], [], False
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            out.append((line, False))
        else:
            prose.append(line)
        i += 1
    # inline code may wrap across lines of a paragraph
    out += [(code, True) for code in re.findall(r"`([^`]+)`", " ".join(prose))]
    return out


def _commands() -> list[tuple[str, str, list[str]]]:
    found = []
    for readme in READMES:
        for snippet, inline in _snippets((REPO / readme).read_text(encoding="utf-8")):
            for m in _MODULE.finditer(snippet):
                module, rest = m.group(1), m.group(2)
                if module.split(".")[0] not in PROJECT_PACKAGES:  # `python -m pytest ...`, `python -m pip ...`
                    continue
                rest = re.split(r"\s#|`|\|", rest)[0]  # a trailing shell comment or the end of a table cell
                tokens = shlex.split(rest)
                # "..." elides arguments; it stays only as the value of a flag ("--dataset_path ...")
                args = [t for k, t in enumerate(tokens) if t != "..." or (k and tokens[k - 1].startswith("--"))]
                # inline prose naming a module ("`python -m text2grad.apps.tiny` writes ...") is not a command to parse
                if not (inline and not args):
                    found.append((readme, module, args))
    return found


COMMANDS = _commands()


class _Parsed(BaseException):
    """Raised in place of running the command once its flags have parsed (BaseException, so no CLI catches it)."""


def test_every_readme_documents_commands():
    documented = {readme for readme, _, _ in COMMANDS}
    assert documented == set(READMES), f"no `python -m` command found in {set(READMES) - documented}"
    assert len(COMMANDS) >= 30
    assert ("README.md", "reward_model.evaluate", ["--model_name_or_path", "runs/slf5k/reward_model", "--dataset_path",
            "runs/slf5k/annotations_validation.jsonl", "--output_dir", "runs/slf5k/rm_eval"]) in COMMANDS


def _main_of(module: str):
    mod = importlib.import_module(module)
    if not hasattr(mod, "main"):  # a package run as `python -m pkg` keeps main in pkg/__main__.py
        mod = importlib.import_module(module + ".__main__")
    return mod.main


@pytest.mark.parametrize("readme, module, args", COMMANDS, ids=[f"{r}:{m}:{' '.join(a)[:60]}" for r, m, a in COMMANDS])
def test_readme_command_parses(readme, module, args, monkeypatch, capsys):
    monkeypatch.chdir(REPO)  # YAML paths in the READMEs are relative to the repository root
    parsers = []
    real_build, real_load = config_module.build_parser, config_module.load_config

    def build_parser(*a, **kw):
        parsers.append(real_build(*a, **kw))
        return parsers[-1]

    def load_config(cls, path=None, overrides=None):
        if path is not None and not Path(path).is_file():  # placeholders such as "--config ..."
            path = None
        raise _Parsed(real_load(cls, path, overrides))

    real_parse_args = argparse.ArgumentParser.parse_args

    def parse_args(self, *a, **kw):  # CLIs with their own argparse parser (text2grad.apps.tiny) stop here instead
        namespace = real_parse_args(self, *a, **kw)
        if not any(p is self for p in parsers):
            parsers.append(self)
            raise _Parsed(namespace)
        return namespace

    monkeypatch.setattr(config_module, "build_parser", build_parser)
    monkeypatch.setattr(config_module, "load_config", load_config)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    if args == ["--help"]:
        with pytest.raises(SystemExit) as exc:
            _main_of(module)(args)
        assert exc.value.code == 0 and "usage:" in capsys.readouterr().out
        return
    try:
        _main_of(module)(args)
    except _Parsed:
        pass
    except SystemExit as exc:
        pytest.fail(f"{readme}: `python -m {module} {' '.join(args)}` does not parse:\n{capsys.readouterr().err}")
    else:
        pytest.fail(f"{module}.main returned without parsing its arguments with argparse")
    # argparse accepts unambiguous prefixes ("--data" for "--data_path"); a README should spell flags out in full
    # hidden options (help=SUPPRESS) are the renamed keys, which exist only to say their new name
    options = {s for action in parsers[-1]._actions if action.help != argparse.SUPPRESS for s in action.option_strings}
    for token in args:
        flag = token.split("=", 1)[0]
        if flag.startswith("--"):
            assert flag in options, f"{readme}: {flag} is not a flag of {module} (an abbreviation?)"


def test_a_wrong_flag_is_caught(monkeypatch):
    """The check above can fail: the README line this project once had, with abbreviated flags."""
    monkeypatch.setattr(config_module, "load_config", lambda *a, **k: (_ for _ in ()).throw(_Parsed()))
    with pytest.raises(SystemExit):
        _main_of("reward_model.evaluate")(["--model", "m", "--data", "d.jsonl", "--output_dir", "o"])
    with pytest.raises(SystemExit):
        _main_of("reward_model.evaluate")(["--no_such_flag", "1"])
