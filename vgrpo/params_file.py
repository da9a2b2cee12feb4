"""Reading params files: the hardened YAML reader, deep merging in order, ``--set`` overrides and ``${VGRPO_*}``
variables, and validation into any typed config; an unknown or mistyped key is an error
(:class:`vgrpo.errors.ConfigError`, naming the file and the key).

``${VGRPO_NAME}`` in a string value is the environment variable ``VGRPO_NAME`` (the real-model params name their
weights ``${VGRPO_MODELS}/...``: :func:`expand_variables`); no other variable is read, so a params file cannot copy
a secret (``${AWS_SECRET_ACCESS_KEY}``) into a value that is logged. The run's own schemas and their loaders are in
:mod:`vgrpo.config`.
"""

from __future__ import annotations

import os
import re
import reprlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import yaml
from pydantic import BaseModel, ValidationError

from vgrpo.errors import ConfigError, read_user_text

__all__ = [
    "EXPANDED_PREFIX",
    "MAX_PARAMS_BYTES",
    "MAX_PARAMS_DEPTH",
    "MAX_PARAMS_VALUES",
    "describe_validation_error",
    "expand_variables",
    "load_params",
    "merge_overrides",
    "overrides_from_pairs",
    "read_params",
    "unset_variables",
]

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def overrides_from_pairs(pairs: Sequence[str]) -> dict[str, Any]:
    """Nested overrides from ``key.sub=value`` strings (values parsed as YAML): ``["optim.lr=1e-4"]`` ->
    ``{"optim": {"lr": 1e-4}}``."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key or "" in key.split("."):
            raise ConfigError(f"--set {pair!r}: expected key.sub=value")
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {pair!r}: {p!r} is already set to a value")
            node = child
        node[leaf] = yaml.safe_load(raw)
    return out


def merge_overrides(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into ``base`` (mappings merge key by key; anything else replaces).

    Changing ``algorithm.name`` drops the base algorithm's other keys: they belong to another schema.
    """
    merged = dict(base)
    for key, value in override.items():
        old = merged.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            if key == "algorithm" and "name" in value and value["name"] != old.get("name"):
                merged[key] = dict(value)
            else:
                merged[key] = merge_overrides(old, value)
        else:
            merged[key] = value
    return merged


EXPANDED_PREFIX = "VGRPO_"
"""The environment variables a params file may name (``${VGRPO_MODELS}``): the project's own, never a credential
the process happens to hold (a reward's API key is named by ``api_key_env`` and read where it is sent)."""


def expand_variables(value: Any) -> Any:
    """``value`` (a params file's mapping) with ``${VGRPO_NAME}`` in every string replaced by the environment
    variable ``VGRPO_NAME``. An unset variable is left as written: a run that reads the value refuses it before any
    compute (:func:`vgrpo.training.preflight.preflight` names the stage, the key and the variable), and a config
    that never reads it (``Trainer(pipeline=...)`` over the params' ``pipeline``) still loads.

    Raises:
        ConfigError: a ``${NAME}`` outside :data:`EXPANDED_PREFIX` (naming it).
    """
    if isinstance(value, str):
        return _VARIABLE.sub(_expanded, value)
    if isinstance(value, Mapping):
        return {key: expand_variables(item) for key, item in value.items()}
    if isinstance(value, list):
        return [expand_variables(item) for item in value]
    return value


def _expanded(match: re.Match[str]) -> str:
    name = match.group(1)
    if not name.startswith(EXPANDED_PREFIX):
        raise ConfigError(
            f"${{{name}}}: params may name only {EXPANDED_PREFIX}* environment variables (a secret must never reach "
            "a logged value; a reward's API key goes by api_key_env)"
        )
    return os.environ.get(name, match.group(0))


def unset_variables(text: str) -> list[str]:
    """The names of the ``${NAME}`` references in ``text`` that :func:`expand_variables` left (the unset ones)."""
    return _VARIABLE.findall(text)


MAX_PARAMS_BYTES = 1 << 20
"""Largest params file read (a real one is a few kB)."""
MAX_PARAMS_VALUES = 100_000
"""Most values a params file may hold once its YAML aliases are expanded (a real one holds a few hundred); an alias
bomb, whose few lines expand to billions, is refused before anything walks it."""
MAX_PARAMS_DEPTH = 64
"""Deepest nesting of mappings and lists in a params file."""


def _node_problem(root: yaml.Node, path: Path) -> str | None:
    """A key set twice in one mapping (at any depth), nesting deeper than :data:`MAX_PARAMS_DEPTH`, or more than
    :data:`MAX_PARAMS_VALUES` values after alias expansion; found on the composed node graph, whose aliases are
    shared nodes, so the walk visits each node once however often it is referred to."""
    sizes: dict[int, int] = {}

    def walk(node: yaml.Node, where: str, depth: int) -> int | str:
        if id(node) in sizes:
            return sizes[id(node)]
        if depth > MAX_PARAMS_DEPTH:
            line = node.start_mark.line + 1
            return f"{path}: line {line}: {where or 'the file'} nests deeper than {MAX_PARAMS_DEPTH} levels"
        size = 1
        if isinstance(node, yaml.MappingNode):
            first_line: dict[str, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    key = "<<"
                else:
                    key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
                    line = key_node.start_mark.line + 1
                    if key in first_line:
                        dotted = f"{where}.{key}" if where else key
                        return (
                            f"{path}: line {line}: key {dotted!r} is set twice (first on line {first_line[key]}); "
                            "a params file sets each key once"
                        )
                    first_line[key] = line
                found = walk(value_node, f"{where}.{key}" if where else key, depth + 1)
                if isinstance(found, str):
                    return found
                size += found
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                found = walk(item, f"{where}[{i}]", depth + 1)
                if isinstance(found, str):
                    return found
                size += found
        if size > MAX_PARAMS_VALUES:
            return (
                f"{path}: {where or 'the file'} expands to more than {MAX_PARAMS_VALUES:,} values (YAML aliases "
                "referring to aliases); a params file holds a few hundred"
            )
        sizes[id(node)] = size
        return size

    found = walk(root, "", 0)
    return found if isinstance(found, str) else None


def read_params(path: str | Path) -> dict[str, Any]:
    """A params file's mapping, ``${NAME}`` expanded (:func:`expand_variables`).

    Raises:
        ConfigError: naming the file (and the key and line) when it is missing, larger than
            :data:`MAX_PARAMS_BYTES`, not YAML, not a mapping, sets a key twice, nests too deep or expands its
            aliases past :data:`MAX_PARAMS_VALUES` values.
    """
    path = Path(path)
    text = read_user_text(path, "params file", MAX_PARAMS_BYTES, ConfigError)
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return {}
        problem = _node_problem(root, path)
        if problem:
            raise ConfigError(problem)
        data = loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: nests deeper than {MAX_PARAMS_DEPTH} levels") from exc
    finally:
        loader.dispose()
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return cast(dict[str, Any], expand_variables(data))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def describe_validation_error(exc: ValidationError) -> str:
    """One line per error, naming its dotted key; a list's "too short" that only echoes its items' errors is left
    out."""
    errors = exc.errors()
    locs = [tuple(err["loc"]) for err in errors]
    lines = []
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] == "too_short" and any(len(o) > len(loc) and o[: len(loc)] == loc for o in locs):
            continue
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        given = "" if isinstance(err.get("input"), Mapping) else f" (got {reprlib.repr(err.get('input'))})"
        lines.append(f"  {where}: {err['msg']}{given}")
    return "\n".join(lines)


ConfigT = TypeVar("ConfigT", bound=BaseModel)


def load_params(
    paths: Sequence[str | Path],
    overrides: Mapping[str, Any] | None = None,
    *,
    schema: type[ConfigT],
    section: str | None = None,
) -> ConfigT:
    """A ``schema`` config from YAML files merged in order, then ``overrides``.

    Args:
        paths: params files; later files override earlier ones.
        overrides: a nested mapping applied last (for example from the command line).
        section: read the config from this top-level key of each file (files that also hold other sections);
            None reads the whole file.

    Raises:
        ConfigError: naming the file(s) and every offending key.
    """
    merged: dict[str, Any] = {}
    sources = []
    for raw in paths:
        path = Path(raw)
        data = read_params(path)
        if section is not None:
            data = data.get(section, {}) or {}
        merged = merge_overrides(merged, data)
        sources.append(str(path))
    if overrides:
        merged = merge_overrides(merged, overrides)
        sources.append("overrides")
    try:
        return schema.model_validate(merged)
    except ValidationError as exc:
        details = describe_validation_error(exc)
        raise ConfigError(f"invalid params in {', '.join(sources) or 'defaults'}:\n{details}") from exc
