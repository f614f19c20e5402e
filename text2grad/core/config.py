"""One way to configure every trainer: a dataclass, a YAML file over its defaults, CLI flags over the YAML.

Each trainer defines one dataclass whose fields carry their help text, declared with `config_field` (the one
config idiom of the repository), in a ``<x>_config.py`` module of its package (``annotation/annotation_config.py``,
``policy_optimization/ppo_config.py``, ``reward_model/scalar_config.py``, ...; CONTRIBUTING.md)::

    @dataclass
    class RewardModelConfig:
        model_name_or_path: str = config_field("meta-llama/Llama-3.1-8B-Instruct", "Hub id or local path of the base model.")

and its CLI calls ``cfg = parse_config(RewardModelConfig)``. Then::

    python -m reward_model.train --config configs/slf5k/reward_model.yaml --learning_rate 1e-5

reads the defaults, overrides them with the YAML file, then with the flags. ``--help`` lists every field
with its help text and default. Unknown YAML keys and badly typed values are errors that name the key.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import importlib.metadata
import inspect
import json
import logging
import os
import re
import sys
import types
import typing
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence, TypeVar

import yaml

__all__ = [
    "ConfigError", "DataError", "CliParser", "config_field", "parse_config", "load_config", "save_config", "config_to_dict", "configure_logging",
    "invoked_as", "range_problems", "RENAMED_KEYS", "Renamed", "renamed_keys",
]

C = TypeVar("C")


class ConfigError(ValueError):
    """A configuration value or file is wrong; the message says which and how to fix it."""


class DataError(ValueError):
    """Input data is missing, malformed, or lacks a field; the message names where."""


def config_field(default: Any, help: str, **kwargs: Any) -> Any:
    """A config dataclass field with its help text: the one way every config in the repository declares one.

    ``default`` is the default value; a list or dict default is copied for each instance (a
    ``default_factory``), so instances never share it. ``kwargs`` go to `dataclasses.field` (e.g.
    ``repr=False``). The help text is what ``--help`` prints.
    """
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=functools.partial(copy.deepcopy, default), metadata={"help": help}, **kwargs)
    return dataclasses.field(default=default, metadata={"help": help}, **kwargs)


def _field_type(cls: type, f: dataclasses.Field) -> Any:
    hints = typing.get_type_hints(cls)
    return hints.get(f.name, str)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


@functools.lru_cache(maxsize=None)
def literal_choices(cls: type) -> dict[str, tuple[Any, ...]]:
    """``{field name: allowed values}`` for every ``Literal``-typed field of the dataclass ``cls`` (an optional
    one also allows None). A config's ``__post_init__`` checks these, so a config built in Python fails as early
    and as clearly as one parsed from the command line."""
    out: dict[str, tuple[Any, ...]] = {}
    for f in dataclasses.fields(cls):
        base, optional = _unwrap_optional(_field_type(cls, f))
        if typing.get_origin(base) is typing.Literal:
            out[f.name] = typing.get_args(base) + ((None,) if optional else ())
    return out


def _coerce(value: Any, tp: Any, name: str) -> Any:
    """Convert a YAML or CLI value to the field's type, or raise ConfigError naming the field."""
    base, optional = _unwrap_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional or base is Any:
            return None
        raise ConfigError(f"'{name}' may not be null")
    origin = typing.get_origin(base)
    try:
        if base is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
                return True
            if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError(f"expected true/false, got {value!r}")
        if base in (int, float):
            if isinstance(value, bool):
                raise ValueError(f"expected a number, got {value!r}")
            if base is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(f"expected an integer, got {value!r}")
            return base(float(value)) if base is int and isinstance(value, str) and "e" in value.lower() else base(value)
        if base is str:
            return str(value)
        if origin in (list, tuple, Sequence) or base in (list, tuple):
            if isinstance(value, str):
                value = json.loads(value) if value.strip().startswith("[") else [v for v in value.split(",") if v]
            (item_type,) = typing.get_args(base)[:1] or (Any,)
            items = [_coerce(v, item_type, name) if item_type is not Any else v for v in value]
            return tuple(items) if (origin is tuple or base is tuple) else items
        if origin is dict or base is dict:
            if isinstance(value, str):
                value = json.loads(value)
            if not isinstance(value, dict):
                raise ValueError(f"expected a mapping, got {value!r}")
            return value
        if origin is typing.Literal:
            allowed = typing.get_args(base)
            if value not in allowed:
                raise ValueError(f"expected one of {list(allowed)}, got {value!r}")
            return value
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"bad value for '{name}': {exc}") from None
    return value


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain YAML/JSON-able data."""
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def load_config(cls: type[C], path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> C:
    """Build ``cls`` from its defaults, then a YAML file, then ``overrides`` (later wins)."""
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must contain a mapping of field: value, got {type(data).__name__}")
        _refuse_renamed_keys(cls, data, f" (in {path})")
        values.update(data)
    _refuse_renamed_keys(cls, overrides or {})
    values.update(overrides or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        where = f" in {path}" if path else ""
        raise ConfigError(
            f"unknown config key(s){where}: {', '.join(unknown)}. Valid keys for {cls.__name__}: {', '.join(sorted(fields))}"
        )
    kwargs = {k: _coerce(v, _field_type(cls, fields[k]), k) for k, v in values.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


@dataclasses.dataclass(frozen=True)
class Renamed:
    """Where an old key went: the first of ``to`` that the config has (``eval_file`` is ``eval_dataset_path`` in a
    trainer with training and held-out data, ``dataset_path`` in an evaluation whose main input is held-out data),
    and a note when the value changed meaning too."""

    to: tuple[str, ...]
    note: str = ""


# The one table of renamed keys, for every CLI and YAML file: an old spelling fails (exit 2) with a message naming
# the new key, rather than being taken silently, so a stale YAML or script is fixed once instead of half-working.
# House spellings: `critic` (+ `_kwargs`) for the thing that writes feedback; `dataset_path` / `dataset_split` for a
# command's main input records; `eval_dataset_path` / `eval_dataset_split` for held-out data beside them;
# `progress_bar`; `resume`.
RENAMED_KEYS: dict[str, Renamed] = {
    "feedback_source": Renamed(("critic",)),
    "feedback_source_kwargs": Renamed(("critic_kwargs",)),
    "candidate_source": Renamed(("candidate_critic",)),
    "candidate_kwargs": Renamed(("candidate_critic_kwargs",)),
    "baseline_source": Renamed(("baseline_critic",)),
    "baseline_kwargs": Renamed(("baseline_critic_kwargs",)),
    "input": Renamed(("dataset_path",)),
    "train_file": Renamed(("dataset_path",)),
    "data": Renamed(("dataset_path",)),
    "data_config": Renamed(("dataset_config",)),
    "split": Renamed(("dataset_split",)),
    "train_split": Renamed(("dataset_split",)),
    "eval_file": Renamed(("eval_dataset_path", "dataset_path")),
    "eval_split": Renamed(("eval_dataset_split", "dataset_split")),
    "show_progress": Renamed(("progress_bar",)),
    "progress": Renamed(("progress_bar",)),
    "disable_tqdm": Renamed(("progress_bar",), "with the opposite value: progress_bar false"),
    "resume_from_checkpoint": Renamed(("resume",), "'auto' continues from the latest checkpoint"),
}


def renamed_keys(cls: type) -> dict[str, str]:
    """``{old key: message}`` for every key of `RENAMED_KEYS` that ``cls`` does not have as a field and whose new
    name it does have; the message names the new key (``feedback_source was renamed to critic ...``)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    out = {}
    for old, renamed in RENAMED_KEYS.items():
        new = next((n for n in renamed.to if n in fields), None)
        if old in fields or new is None:
            continue
        note = f" ({renamed.note})" if renamed.note else ""
        out[old] = f"{old} was renamed to {new}{note}: use --{new} on the command line or '{new}:' in a YAML file"
    return out


def _refuse_renamed_keys(cls: type, values: dict[str, Any], where: str = "") -> None:
    messages = renamed_keys(cls)
    found = [messages[k] for k in values if k in messages]
    if found:
        raise ConfigError("; ".join(found) + where)


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the config as YAML (checkpoints carry the exact config that produced them)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


class CliParser(argparse.ArgumentParser):
    """argparse with the house conventions: no abbreviated flags (``--conc`` is not ``--concurrency``) and
    one error format, ``error: <message>`` after the usage line, exit code 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        # "--learning_rate -1e-5" is a value, not an option: argparse's own pattern misses exponents
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")

    def error(self, message: str) -> typing.NoReturn:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"error: {message}\n")


LOG_LEVELS = ("debug", "info", "warning", "error")


def _field_groups(cls: type) -> dict[str, str]:
    """``{field name: section title}`` read from the ``# ---- title ----`` comments between a config
    dataclass's fields (and its bases'), so ``--help`` lists the fields in the same sections as the source."""
    groups: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            lines = inspect.getsource(klass).splitlines()
        except (OSError, TypeError):
            continue
        title = None
        for line in lines:
            heading = _SECTION.match(line)
            if heading:
                title = heading.group(1).strip()
                continue
            named = _FIELD_LINE.match(line)
            if named and title:
                groups.setdefault(named.group(1), title)
    return groups


_SECTION = re.compile(r"^\s*#\s*-{3,}\s*([A-Za-z][^-]*?)\s*-*\s*$")
_FIELD_LINE = re.compile(r"^\s{4}(\w+)\s*:")


def version() -> str:
    try:
        return importlib.metadata.version("text2grad")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_parser(cls: type, description: str | None = None, prog: str | None = None) -> argparse.ArgumentParser:
    """The parser of a config dataclass: ``--config``, one ``--field`` per field (grouped as in the source, help
    text and default shown), ``--log_level`` and ``--version``. Its description is ``description``, else the
    class's ``CLI_DESCRIPTION``, else the first line of its docstring."""
    parser = CliParser(
        prog=prog or program_name(),
        usage="%(prog)s [--config FILE] [--<option> VALUE ...]",
        description=description or getattr(cls, "CLI_DESCRIPTION", None) or (cls.__doc__ or "").strip().split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    general = parser.add_argument_group("general")
    general.add_argument("--config", default=None, help="YAML file whose keys override the defaults below.")
    general.add_argument(
        "--log_level", default="warning", choices=LOG_LEVELS,
        help="Logging of this program and the libraries it uses; warning keeps progress bars clean.",
    )
    general.add_argument("--version", action="version", version=f"text2grad {version()}")
    groups = _field_groups(cls)
    sections: dict[str, argparse._ArgumentGroup] = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
        )
        tp = _field_type(cls, f)
        base, _ = _unwrap_optional(tp)
        extra = ""
        if typing.get_origin(base) is typing.Literal:
            extra = f" Choices: {', '.join(map(str, typing.get_args(base)))}."
        names = [f"--{f.name}"] + ([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])
        title = groups.get(f.name, "options")
        if title not in sections:
            sections[title] = parser.add_argument_group(title)
        help_text = f.metadata.get("help", "") + extra + f" (default: {default!r})"
        sections[title].add_argument(
            *names,
            dest=f.name,
            default=argparse.SUPPRESS,
            metavar=base.__name__.upper() if isinstance(base, type) else "VALUE",
            help=help_text.replace("%", "%%"),  # argparse formats help with %: a literal % must be doubled
        )
    for old in renamed_keys(cls):  # recognised only to say what they are called now (load_config refuses them)
        names = [f"--{old}"] + ([f"--{old.replace('_', '-')}"] if "_" in old else [])
        parser.add_argument(*names, dest=old, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


_INVOKED_AS: list[str] = []


@contextlib.contextmanager
def invoked_as(prog: str) -> Iterator[None]:
    """Name the program in usage lines while a dispatcher (``text2grad annotate``) runs a module's ``main``."""
    _INVOKED_AS.append(prog)
    try:
        yield
    finally:
        _INVOKED_AS.pop()


def program_name() -> str:
    """The name a user typed: ``text2grad <command>`` under the dispatcher, ``python -m package.module`` when
    run as a module (argparse would show ``module.py``)."""
    if _INVOKED_AS:
        return _INVOKED_AS[-1]
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        name = spec.name[: -len(".__main__")] if spec.name.endswith(".__main__") else spec.name
        return f"python -m {name}"
    return Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "text2grad"


def parse_config(
    cls: type[C], argv: Sequence[str] | None = None, description: str | None = None, prog: str | None = None
) -> C:
    """Parse ``--config file.yaml`` and ``--field value`` flags into ``cls``; exits 2 with ``error: ...`` on a bad
    flag or value. ``--log_level`` sets up logging (`configure_logging`) before anything else runs."""
    parser = build_parser(cls, description, prog)
    args = vars(parser.parse_args(list(sys.argv[1:] if argv is None else argv)))
    path = args.pop("config", None)
    configure_logging(args.pop("log_level", "warning"))
    try:
        return load_config(cls, path, args)
    except ConfigError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


# Libraries whose INFO chatter is hidden unless --log_level info/debug (their warnings show, minus _NOISE).
_QUIET_LOGGERS = ("accelerate", "transformers", "deepspeed", "DeepSpeed", "datasets", "torch", "peft", "trl", "httpx")
_OUR_LOGGERS = ("text2grad", "annotation", "reward_model", "policy_optimization")
_NOISE = (
    r".*[Ss]etting (ds_)?accelerator to .*",  # DeepSpeed, at import, on every command
    r".*DeepSpeed.*accelerator.*",
    r".*Removed shared tensor.*",
    r".*[Ss]hared tensors? .*while saving.*",
)


_NOISE_SOURCES = ("DeepSpeed", "accelerate.utils.other", "transformers.modeling_utils", "transformers.trainer")


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(re.fullmatch(p, message, re.S) for p in _NOISE)


def configure_logging(level: str = "warning") -> None:
    """One logging set-up for every command. ``warning`` (default): this project's own INFO lines (what was
    saved where) and everyone's warnings, but not the libraries' INFO chatter nor the DeepSpeed accelerator
    and shared-tensor notices, which break progress bars; ``info``/``debug`` show everything."""
    numeric = getattr(logging, level.upper())
    root = logging.getLogger()
    if not root.handlers:  # an embedding program (or pytest) that set up logging keeps its own set-up
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(numeric)
    quiet = numeric >= logging.WARNING
    for handler in root.handlers:
        for f in [f for f in handler.filters if isinstance(f, _DropNoise)]:
            handler.removeFilter(f)
        if quiet:
            handler.addFilter(_DropNoise())
    for name in _OUR_LOGGERS:
        logging.getLogger(name).setLevel(min(numeric, logging.INFO))
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING) if quiet else numeric)
    # A logger's filters only see records logged on that very logger, so the noise is filtered where it starts.
    for name in _NOISE_SOURCES:
        source = logging.getLogger(name)
        for f in [f for f in source.filters if isinstance(f, _DropNoise)]:
            source.removeFilter(f)
        if quiet:
            source.addFilter(_DropNoise())
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", level)
    if quiet:
        warnings.filterwarnings("ignore", message=".*DeepSpeed.*accelerator.*")


def range_problems(
    cfg: Any,
    *,
    positive: Sequence[str] = (),
    non_negative: Sequence[str] = (),
    share: Sequence[str] = (),
) -> list[str]:
    """One message per numeric field of ``cfg`` out of its range (fields set to None are skipped): ``positive``
    must be > 0 (learning rates, batch sizes, lengths), ``non_negative`` >= 0 (weight decay, warm-up, counts),
    ``share`` in [0, 1]. A config's ``__post_init__`` raises with them, so a bad number stops the run before any
    model loads, whether the config came from the command line, a YAML file or Python."""
    problems = []
    for names, ok, what in (
        (positive, lambda v: v > 0, "> 0"),
        (non_negative, lambda v: v >= 0, ">= 0"),
        (share, lambda v: 0 <= v <= 1, "in [0, 1]"),
    ):
        for name in names:
            value = getattr(cfg, name)
            if value is not None and not ok(value):
                problems.append(f"{name} must be {what}, got {value}")
    return problems
