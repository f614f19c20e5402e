"""Critics: the one home of "what writes feedback", its protocol, its registry and its spec loader.

Vocabulary (used everywhere in the repository): a **critic** is anything that writes `Feedback` (a critique
plus exact good/poor quotes) on a (prompt, response) pair: an LLM, the trained generative reward model, unit
tests run in the sandbox, a reference summary, a fact checker, a human. `FeedbackSource` is the protocol a
critic implements (one method, ``feedback(prompts, responses) -> list[Feedback]``). The method is
**Text2Grad**; the reward mode value ``nl_gradient`` (and the class name ``NLGradientPPOTrainer``) keep the
older name for config and API compatibility.

The same names select a critic in the annotation run, PPO and GRPO (``--critic`` in each):

=========================  ===============================================================================
``reward_model``           the trained generative reward model; kwargs ``path`` (or ``model_name_or_path``)
                           plus `reward_model.inference.GenerativeRewardModel` options.
``llm``                    an OpenAI-compatible model (`annotation.llm.LLMCritic`; key from the environment).
``code_tests``             unit tests run in the sandbox (`annotation.code_critic.CodeTestCritic`); the tests come
                           from each record's ``tests_field`` (default ``"test"``).
``reference``              agreement with a reference summary (`annotation.critics.ReferenceSummaryCritic`),
                           from each record's ``reference_field`` (default ``"reference"``).
``ensemble``               any critics as one ensemble (`text2grad.core.ensemble.EnsembleCritic`); kwargs
                           ``members: [{critic: NAME, critic_kwargs: {...}}, ...]``.
``reward_model_ensemble``  K generative reward models as LoRA adapters on one shared base model
                           (`reward_model.ensemble.RewardModelEnsemble`); kwargs ``paths`` (the adapters) or ``path``.
``pkg.module:Name``        any class built with the kwargs that has a ``feedback`` method, or a function
                           ``fn(prompt, response) -> Feedback | dict`` (wrapped in `CallableFeedbackSource`).
=========================  ===============================================================================

The registry holds ``"module:Name"`` strings, not classes, because the ground floor may not import the
phase packages that implement the critics (tests/test_layering.py). `load_object` is therefore the one
documented place where the repository imports a module by name at run time; it is also how an unused
critic's heavy dependencies (torch models, an HTTP client, the sandbox) stay unloaded.

A critic that needs per-prompt data (unit tests, references) defines ``bind_records(records)``;
`build_critic` calls it with the records the critic will be asked about, each record's
``"prompt"`` being the exact string later passed to ``feedback``.
"""

from __future__ import annotations

import ast
import importlib
import re
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from text2grad.core.feedback import Feedback

__all__ = [
    "CRITICS",
    "CallableFeedbackSource",
    "FeedbackSource",
    "build_critic",
    "extract_code",
    "feedback_per_pair",
    "lazy_exports",
    "load_object",
    "with_solution_import",
]


@runtime_checkable
class FeedbackSource(Protocol):
    """What every critic implements: the reward model, an LLM critic, unit tests, a fact checker.

    Implementations return exactly one `Feedback` per (prompt, response) pair, in order, and report
    per-sample failures as `Feedback.failed(...)` rather than raising, so one bad sample never costs a batch.
    """

    def feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[Feedback]: ...


# The built-in critics by name. Values are "module:attribute" strings (see the module docstring for why);
# each names a factory called with the critic kwargs.
CRITICS: dict[str, str] = {
    "reward_model": "reward_model.inference:GenerativeRewardModel.from_critic_kwargs",
    "llm": "annotation.llm:LLMCritic",
    "code_tests": "annotation.code_critic:CodeTestCritic",
    "reference": "annotation.critics:ReferenceSummaryCritic",
    "ensemble": "text2grad.core.ensemble:EnsembleCritic",
    "reward_model_ensemble": "reward_model.ensemble:RewardModelEnsemble.from_critic_kwargs",
}


def load_object(spec: str) -> Any:
    """``"package.module:Name"`` (``Name`` may be dotted, e.g. ``Class.method``) -> that object.

    Raises ValueError with what was wrong (no colon, no such module, attribute missing). An ImportError for a
    package the module itself needs (e.g. ``openai`` for the LLM critic) propagates unchanged, so the caller
    can say which package to install.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected 'package.module:Name', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = exc.name or ""
        if missing and not (module_name == missing or module_name.startswith(missing + ".")):
            raise  # the module exists but a dependency of it is missing
        raise ValueError(f"cannot import module {module_name!r} for {spec!r}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"module {module_name!r} has no attribute {attr!r} (from {spec!r})")
        obj = getattr(obj, part)
    return obj


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` that loads ``name`` from ``exports[name]`` (a module path) on first use,
    so that importing the package, or one light module of it (a command's config), loads none of the heavy ones.

        __getattr__ = lazy_exports(__name__, {"main": "text2grad.apps.quickstart.pipeline"})
    """

    def __getattr__(name: str) -> Any:
        if name in exports:
            return load_object(f"{exports[name]}:{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


class CallableFeedbackSource:
    """Wrap ``fn(prompt, response) -> Feedback | dict`` as a `FeedbackSource`.

    A dict is read with `Feedback.from_dict` (``critique``, ``good_spans``, ``poor_spans``). An exception
    becomes ``Feedback.failed`` for that one sample, so the batch goes on.
    """

    def __init__(self, fn: Callable[[str, str], Feedback | Mapping[str, Any]]) -> None:
        if not callable(fn):
            raise TypeError(f"CallableFeedbackSource needs a callable, got {type(fn).__name__}")
        self.fn = fn

    def feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[Feedback]:
        return feedback_per_pair(prompts, responses, self.fn)


def feedback_per_pair(
    prompts: Sequence[str],
    responses: Sequence[str],
    critique_one: Callable[[str, str], Feedback | Mapping[str, Any]],
    error_prefix: str = "",
) -> list[Feedback]:
    """The loop of every critic that judges one pair at a time: ``critique_one(prompt, response)`` per pair, in
    order; a dict result is read with `Feedback.from_dict`, and an exception becomes ``Feedback.failed``
    (``error_prefix`` + the exception) for that one sample, so the batch goes on.

    Raises ValueError when the two sequences differ in length (a caller bug, not a sample failure).
    """
    if len(prompts) != len(responses):
        raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses")
    out = []
    for prompt, response in zip(prompts, responses):
        try:
            result = critique_one(prompt, response)
            out.append(result if isinstance(result, Feedback) else Feedback.from_dict(dict(result)))
        except Exception as exc:  # one bad sample must not cost the batch
            out.append(Feedback.failed(f"{error_prefix}{type(exc).__name__}: {exc}"))
    return out


def build_critic(
    name_or_spec: str,
    kwargs: Mapping[str, Any] | None = None,
    records: Sequence[Mapping[str, Any]] | None = None,
) -> FeedbackSource:
    """Build a critic from a registry name (`CRITICS`) or a ``"package.module:Name"`` spec.

    Args:
        name_or_spec: ``reward_model``, ``llm``, ``code_tests``, ``reference`` or ``package.module:Name``.
        kwargs: keyword arguments for the critic's constructor (a plain function takes none).
        records: the records the critic will be asked about; handed to ``bind_records`` when it has one.

    Raises ValueError for an unknown name, an unimportable spec or arguments the critic does not take,
    TypeError when the built object has no ``feedback`` method.
    """
    kwargs = dict(kwargs or {})
    registered = name_or_spec in CRITICS
    if not registered and ":" not in name_or_spec:
        raise ValueError(f"unknown critic {name_or_spec!r}; use one of {list(CRITICS)} or 'package.module:ClassName'")
    factory = load_object(CRITICS.get(name_or_spec, name_or_spec))
    if registered or isinstance(factory, type):
        try:
            critic = factory(**kwargs)
        except TypeError as exc:
            raise ValueError(f"cannot build critic {name_or_spec!r} with kwargs {sorted(kwargs)}: {exc}") from None
    elif callable(factory):
        if kwargs:
            raise ValueError(f"{name_or_spec!r} is a function; critic kwargs only apply to classes")
        critic = CallableFeedbackSource(factory)
    else:
        raise ValueError(f"{name_or_spec!r} is neither a class nor a function")
    if records is not None and callable(getattr(critic, "bind_records", None)):
        critic.bind_records(records)
    if not callable(getattr(critic, "feedback", None)):
        raise TypeError(f"critic {name_or_spec!r} is not a FeedbackSource: it has no feedback(prompts, responses) method")
    return critic


# --------------------------------------------------------------------------------------------------
# The code in a response (shared by the unit-test critic, the code evaluation and the DPO code pairs, so
# the critic that shapes rewards and the evaluator that scores code always judge the same program)
# --------------------------------------------------------------------------------------------------

# An opening fence: ``` plus an optional language tag and info string, then a newline. It may follow prose on
# the same line ("Here you go: ```python").
_OPEN_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n`]*\n")
# A closing fence: ``` at the start of a line (indentation allowed), or ``` ending a line. A ``` in the middle
# of a code line (inside a string literal, say) closes nothing.
_CLOSE_FENCE = re.compile(r"^[ \t]*```|```[ \t]*$", re.MULTILINE)
_PYTHON_TAGS = ("python", "py", "python3", "")

# The line KodCode's own test harness writes above each row's test code. Some released rows rely on it: their tests
# call the solution's functions without importing them.
SOLUTION_STAR_IMPORT = "from solution import *"


def with_solution_import(tests: str) -> str:
    """Unit tests as KodCode's harness runs them: ``from solution import *`` above the test code (after a leading
    docstring and ``from __future__`` imports, which must stay first), so tests that use the solution's names
    without importing them find them; tests that import what they use behave as before. Tests that already have
    the line come back unchanged, so applying it twice is harmless."""
    if re.search(rf"^{re.escape(SOLUTION_STAR_IMPORT)}\s*$", tests, re.MULTILINE):
        return tests
    try:
        body = ast.parse(tests).body
    except SyntaxError:  # the run reports the syntax error; the line goes on top
        return f"{SOLUTION_STAR_IMPORT}\n{tests}"
    after = 0  # the line after which the import goes (0: the top)
    for i, node in enumerate(body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant) \
            and isinstance(node.value.value, str)
        if docstring or (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            after = node.end_lineno or node.lineno
        else:
            break
    lines = tests.splitlines(keepends=True)
    head = "".join(lines[:after])
    if head and not head.endswith("\n"):
        head += "\n"
    return f"{head}{SOLUTION_STAR_IMPORT}\n{''.join(lines[after:])}"


def extract_code(response: str) -> str:
    """The Python code in a model response.

    The first fenced block tagged ``python``/``py``/``python3`` or untagged, else the first fenced block of
    any language, else the whole text. A fence that is never closed (generation cut by the token limit)
    runs to the end of the text. The result is always a substring of ``response``, so lines quoted from it
    are exact quotes of the response.
    """
    blocks: list[tuple[str, str]] = []
    pos = 0
    while (opening := _OPEN_FENCE.search(response, pos)) is not None:
        closing = _CLOSE_FENCE.search(response, opening.end())
        end = closing.start() if closing else len(response)
        body = response[opening.end() : end]
        blocks.append((opening.group(1).lower(), body))
        if closing is None:
            break
        pos = closing.end()
    for lang, body in blocks:
        if lang in _PYTHON_TAGS:
            return body
    return blocks[0][1] if blocks else response
