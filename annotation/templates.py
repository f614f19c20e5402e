"""Annotation prompts: YAML templates shipped in annotation/prompts/, one per dataset and variant.

A template file has a ``system`` and a ``user`` string with ``{field}`` placeholders filled from the record
(``{prompt}``, ``{response}``, and ``{feedback}`` for human grounding); literal braces are doubled, as in
``str.format``. An optional ``defaults`` mapping gives the text of a placeholder a record does not have (the
KodCode prompts show ``{tests}`` and ``{execution_result}``, which prepare-data adds to every record; records
from elsewhere get the default). Built-in templates:

- ``<dataset>_cot.yaml``: reason step by step, then a critique, then spans justified by the critique
  (the paper's Section 3.3 protocol);
- ``<dataset>_nocot.yaml``: spans directly, then a one-sentence critique (the paper's "w/o CoT" ablation);
- ``human_grounding.yaml``: locate what a human's feedback refers to (the human's words are the critique);
- ``repair.yaml``: the follow-up message after an answer that could not be parsed.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from text2grad.core.data import DataError, render_template

__all__ = ["PromptTemplate", "load_template", "builtin_template", "repair_message"]


@dataclass(frozen=True)
class PromptTemplate:
    """A chat prompt: an optional system message and a user message, both ``str.format`` templates."""

    user: str
    system: str = ""
    name: str = ""
    defaults: tuple[tuple[str, str], ...] = ()

    def messages(self, record: Mapping[str, Any]) -> list[dict[str, str]]:
        """The chat messages for one record; a placeholder the record lacks (and that has no default) is a
        `DataError` naming it."""
        where = str(record.get("id", ""))
        if self.defaults:
            record = {**dict(self.defaults), **{k: v for k, v in record.items() if v is not None}}
        out = []
        if self.system:
            out.append({"role": "system", "content": render_template(self.system, record, where)})
        out.append({"role": "user", "content": render_template(self.user, record, where)})
        return out


def _parse(text: str, name: str) -> PromptTemplate:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"prompt template {name} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("user"), str):
        raise ValueError(f"prompt template {name} must be a YAML mapping with a 'user' string (and optionally 'system')")
    unknown = set(data) - {"user", "system", "defaults"}
    if unknown:
        raise ValueError(f"prompt template {name} has unknown key(s) {sorted(unknown)}; allowed: system, user, defaults")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict) or not all(isinstance(v, str) for v in defaults.values()):
        raise ValueError(f"prompt template {name}: 'defaults' must map placeholder names to strings")
    return PromptTemplate(user=data["user"], system=str(data.get("system") or ""), name=name,
                          defaults=tuple(sorted((str(k), v) for k, v in defaults.items())))


def load_template(path: str | Path) -> PromptTemplate:
    """Read a user-supplied template file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompt template {path} does not exist")
    return _parse(path.read_text(encoding="utf-8"), str(path))


def _builtin(filename: str) -> PromptTemplate:
    resource = importlib.resources.files("annotation.prompts").joinpath(filename)
    if not resource.is_file():
        raise ValueError(f"no built-in prompt template {filename}")
    return _parse(resource.read_text(encoding="utf-8"), filename)


def builtin_template(dataset: str, cot: bool = True, human: bool = False) -> PromptTemplate:
    """The shipped template for a dataset (``slf5k``, ``ultrafeedback``, ``kodcode``) and variant."""
    if human:
        return _builtin("human_grounding.yaml")
    return _builtin(f"{dataset}_{'cot' if cot else 'nocot'}.yaml")


def repair_message(error: str) -> dict[str, str]:
    """The user message that asks again after an unparseable answer."""
    template = _builtin("repair.yaml")
    try:
        content = render_template(template.user, {"error": error})
    except DataError as exc:  # only if repair.yaml was edited to use other fields
        raise ValueError(f"repair.yaml: {exc}") from None
    return {"role": "user", "content": content}
