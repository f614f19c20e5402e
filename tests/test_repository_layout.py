"""The repository keeps the design card's layout, and the tests mirror the packages."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_design_card_layout():
    for name in ["README.md", "pyproject.toml", "env.sh", "text2grad", "annotation", "reward_model",
                 "policy_optimization", "configs", "scripts", "tests"]:
        assert (ROOT / name).exists(), name
    for package in ["text2grad", "text2grad/core", "text2grad/apps", "annotation", "reward_model", "policy_optimization"]:
        assert (ROOT / package / "__init__.py").is_file(), package


def test_every_test_folder_is_a_package():
    # With __init__.py everywhere pytest imports tests as `tests.<folder>.<module>`, so two test files may share
    # a basename and no test folder shadows the real package of the same name.
    folders = {p.parent for p in (ROOT / "tests").rglob("test_*.py")}
    assert sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file()) == []
