"""The architecture, enforced: the core imports nothing above it, phases never import apps, no import cycles.

Read from the source with `ast` (nothing is imported), so a violation anywhere fails here even when the
offending import sits in a rarely executed function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("text2grad", "annotation", "reward_model", "policy_optimization")
PHASES = ("annotation", "reward_model", "policy_optimization")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an import statement's target lives in (longest known prefix), or None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str) -> set[str]:
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            resolved = _resolve(target)
            if resolved is not None and resolved != module:
                found.add(resolved)
    return found


GRAPH = {m: _imports(m) for m in MODULES}


def _is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_modules_were_found():
    assert "text2grad.core.spans" in MODULES and "policy_optimization.trainer" in MODULES


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _is_under(m, "text2grad.core")))
def test_core_imports_nothing_above_it(module):
    above = sorted(t for t in GRAPH[module] if not _is_under(t, "text2grad.core"))
    assert above == [], f"{module} is in the ground floor but imports {above}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.split(".")[0] in PHASES))
def test_phases_do_not_import_apps(module):
    apps = sorted(t for t in GRAPH[module] if _is_under(t, "text2grad.apps") or t == "text2grad.annotate")
    assert apps == [], f"phase module {module} imports the apps {apps}"


def test_no_import_cycles():
    # Tarjan's strongly connected components; any component with more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            # A package's __init__ is imported by its submodules implicitly; only explicit edges count.
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert cycles == [], f"import cycles: {cycles}"


# What `text2grad <command> --help` must not wait for: it builds the parser from the command's config module alone.
HEAVY = {"torch", "transformers", "peft", "trl", "datasets", "deepspeed", "accelerate", "vllm", "openai"}



def _external_imports(module: str) -> set[str]:
    """The third-party packages ``module`` imports when it loads (not those imported inside its functions)."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    loaded, todo = [], list(tree.body)
    while todo:  # module-level statements, including those inside top-level try/if blocks
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.Import):
            loaded += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            loaded.append(node.module)
        else:
            todo.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))
    return {name.split(".")[0] for name in loaded if _resolve(name) is None}


def _packages(module: str) -> list[str]:
    """The packages Python imports before ``module`` (their ``__init__``s run first)."""
    parts = module.split(".")
    return [name for name in (".".join(parts[:i]) for i in range(1, len(parts))) if name in MODULES]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.endswith("_config")))
def test_config_modules_load_no_ml_library(module):
    seen, todo, heavy = set(), [module], {}
    while todo:  # the module, its packages and every project module they import, transitively
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            heavy.update({lib: current for lib in _external_imports(current) & HEAVY})
            todo.extend([*GRAPH[current], *_packages(current)])
    assert heavy == {}, f"{module} loads {sorted(heavy)} (through {sorted(set(heavy.values()))})"
