"""The repository keeps the design card's layout, and test modules stay importable side by side."""

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_design_card_layout():
    for name in ["README.md", "pyproject.toml", "env.sh", "text2grad", "annotation", "reward_model",
                 "policy_optimization", "configs", "scripts", "tests"]:
        assert (ROOT / name).exists(), name
    for package in ["text2grad", "annotation", "reward_model", "policy_optimization"]:
        assert (ROOT / package / "__init__.py").is_file(), package


def test_test_module_basenames_are_unique():
    # Test folders have no __init__.py (a tests/policy_optimization package would shadow the real one), so
    # pytest imports test modules by basename: two test_x.py files in different folders collide.
    names = Counter(p.name for p in (ROOT / "tests").rglob("*.py") if p.name != "conftest.py")
    assert [n for n, c in names.items() if c > 1] == []
