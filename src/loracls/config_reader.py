"""Reading a config: YAML files and `--set key=value` pairs into the one typed `Config`, every value checked
against its field's declared type, unknown keys refused (with the nearest known key)."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Literal

import yaml
from pydantic import ValidationError

from loracls import files
from loracls.config import Config
from loracls.errors import LoraclsError, first_line, shown

__all__ = [
    "FIELDS",
    "config_help",
    "from_dict",
    "load_config",
    "parse_overrides",
    "parse_value",
    "read_mapping",
    "split_alternatives",
]


FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_TYPES = typing.get_type_hints(Config)


def _nearest(key: str) -> str:
    close = difflib.get_close_matches(key, FIELDS, n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _base_type(hint):
    """`int | None` -> int; other hints unchanged."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if type(None) in typing.get_args(hint) and len(args) == 1 else hint


def _coerce(key: str, value):
    """Check `value` against the declared type of `key`; ints are accepted where floats are."""
    hint = _TYPES[key]
    if value is None:
        if type(None) in typing.get_args(hint):
            return None
        raise LoraclsError(f"config: {key} cannot be null")
    base = _base_type(hint)
    return _coerce_to(key, str if typing.get_origin(base) is Literal else base, value)  # the choice: pydantic's


def _coerce_to(key: str, hint, value):
    arms = [a for a in typing.get_args(hint) if a is not type(None)] if isinstance(hint, types.UnionType) else []
    for arm in arms:  # `str | dict[str, float]`: the first arm the value fits
        try:
            return _coerce_to(key, arm, value)
        except LoraclsError:
            continue
    if arms:
        raise LoraclsError(f"config: {key} must be {' or '.join(_name(a) for a in arms)}, got {shown(value)}")
    origin = typing.get_origin(hint)
    if origin is dict:
        if not isinstance(value, dict):
            raise LoraclsError(f"config: {key} must be a mapping like {{name: value}}, got {shown(value)}")
        item = typing.get_args(hint)[1]
        return {str(k): _coerce_to(f"{key}.{k}", item, v) for k, v in value.items()}
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
            raise LoraclsError(f"config: {key} must be a list of names, got {shown(value)}")
        return [str(v) for v in value]
    return _scalar(key, hint, value)


def _scalar(key: str, base, value):
    if base is bool:
        if isinstance(value, bool):
            return value
    elif base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-4` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif base is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    raise LoraclsError(f"config: {key} must be {_name(base)}, got {shown(value)}")


def _name(hint) -> str:
    return (
        getattr(hint, "__name__", None)
        if typing.get_origin(hint) is None
        else {dict: "a mapping", list: "a list"}.get(typing.get_origin(hint), str(hint))
    )


def parse_value(key: str, raw: str):
    """One command-line value: YAML scalars (`8`, `2e-4`, `null`, `[a, b]`); text keys keep their text."""
    if key in _TYPES and _base_type(_TYPES[key]) is str:  # `Review: {text}` is no mapping
        return None if raw.strip() in ("null", "~") else raw
    if not raw.strip():
        return ""
    try:
        return read_yaml(raw, f"--set {key}")
    except LoraclsError as exc:
        if "not valid YAML" in str(exc):
            return raw  # a plain text value
        raise


def split_alternatives(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_overrides(pairs: list[str]) -> dict:
    """`key=value` strings -> dict of parsed values."""
    out = {}
    for pair in pairs:
        if "=" not in pair:  # `--set a=1 b=2` takes every pair after the flag; a config file goes before it
            raise LoraclsError(f"--set expects KEY=VALUE pairs, got {shown(pair)} (a config file goes before --set)")
        key, raw = pair.split("=", 1)
        out[key.strip()] = parse_value(key.strip(), raw)
    return out


def from_dict(values: dict, base: Config | None = None) -> Config:
    merged = dataclasses.asdict(base) if base is not None else {}
    for key, value in values.items():
        if not isinstance(key, str):  # YAML allows any key: `?`, `1: 2`, `[a]: b`
            raise LoraclsError(f"config: a key must be a name, got {shown(key)} ({type(key).__name__})")
        if key not in FIELDS:
            raise LoraclsError(f"config: unknown key {shown(key)}{_nearest(key)}")
        merged[key] = _coerce(key, value)
    try:
        config = Config(**merged)
    except ValidationError as exc:
        problem = exc.errors()[0]
        key = str(problem["loc"][0]) if problem["loc"] else "config"
        raise LoraclsError(f"config: {key} must be {_allowed(key)}, got {shown(problem['input'])}") from None
    return config.validate()


def _allowed(key: str) -> str:
    """What a field accepts, in words, from its declaration: `> 0.0 and <= 10.0`, `one of a, b`, `or null`."""
    info, hint = Config.__pydantic_fields__[key], _base_type(_TYPES[key])
    if typing.get_origin(hint) is Literal:
        words = "one of " + ", ".join(map(str, typing.get_args(hint)))
    elif typing.get_origin(hint) is list and typing.get_origin(typing.get_args(hint)[0]) is Literal:
        words = "a list of " + ", ".join(map(str, typing.get_args(typing.get_args(hint)[0])))
    else:
        names = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
        bounds = [f"{names[n]} {getattr(m, n)}" for m in info.metadata for n in names if hasattr(m, n)]
        words = " and ".join(bounds) if bounds else "a finite number"
    return words + (" or null" if type(None) in typing.get_args(_TYPES[key]) else "")


MAX_CONFIG_BYTES = 1 << 20  # a config is a few hundred bytes; past a MiB it is not a config
MAX_DEPTH = 32  # a config nests a mapping of lists or mappings: two or three levels; 5,000 overflow the stack


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader less what a config never needs: an anchor or alias (`&name`, `*name`: nine nested
    aliases expand 341 bytes into 387 million items) and the merge key `<<` are refused where they appear,
    before anything is expanded; a key given twice in one mapping is refused with both lines."""

    where = "config"
    depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise LoraclsError(
                f"{self.where}, line {event.start_mark.line + 1}: YAML anchors and aliases (&name, *name) are "
                f"not read in a config; write the value out"
            )
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise LoraclsError(
                    f"{self.where}, line {event.start_mark.line + 1}: values nested more than {MAX_DEPTH} deep; a "
                    f"config is a mapping of names to values and short lists"
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise LoraclsError(f"{self.where}, line {line}: the YAML merge key << is not read in a config")
            if not isinstance(key_node, yaml.ScalarNode):  # `? [a, b]`, `{a: 1}: b`: a key that is no name
                raise LoraclsError(f"{self.where}, line {line}: a key must be a name, got a YAML {key_node.id}")
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise LoraclsError(
                    f"{self.where}: key {shown(key)} is given twice (lines {seen[key]} and {line}); keep one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep)


def read_yaml(text: str, where: str):
    """A YAML document as a config reads it (`_ConfigLoader`); anything malformed is one line."""
    loader = type("Loader", (_ConfigLoader,), {"where": where})
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise LoraclsError(f"{where} is not valid YAML: {first_line(exc)}") from None


def read_mapping(path: Path, what: str) -> dict:
    """A YAML file that holds a mapping of key: value (a config file, a run's config.yaml); read as UTF-8,
    at most MAX_CONFIG_BYTES, by `read_yaml`; anything else is one line."""
    path = Path(path)
    size = path.stat().st_size if path.is_file() else 0
    if size > MAX_CONFIG_BYTES:
        raise LoraclsError(f"{what} {path} is {size:,} bytes; a config is at most {MAX_CONFIG_BYTES:,}")
    loaded = read_yaml(files.read_text(path, what), f"{what} {path}") or {}
    if not isinstance(loaded, dict):
        raise LoraclsError(f"{what} {path} must hold a mapping of key: value")
    return loaded


def load_config(path: str | None = None, overrides: list[str] | None = None) -> Config:
    config = from_dict(read_mapping(Path(path), "config file") if path is not None else {})
    return from_dict(parse_overrides(overrides or []), base=config)


def config_help() -> str:
    """Every key with its type, default and help: `loracls train --help-config` and docs/config-reference.md."""
    rows = ["| key | type | default | what it does |", "| --- | --- | --- | --- |"]
    for name, info in Config.__pydantic_fields__.items():
        default = info.default_factory() if info.default_factory is not None else info.default
        kind = _type_words(_TYPES[name])
        limits = _allowed(name).removesuffix(" or null")
        limits = f" ({limits})" if limits[0] in "<>" else ""
        shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
        described = info.description.replace("|", "\\|")
        rows.append(f"| `{name}` | {kind}{limits} | `{shown}` | {described} |")
    return "\n".join(rows) + "\n"


def _type_words(hint) -> str:
    base = _base_type(hint)
    if typing.get_origin(base) is Literal:
        return " \\| ".join(map(str, typing.get_args(base)))
    optional = type(None) in typing.get_args(hint)
    arms = [a for a in typing.get_args(base) if a is not type(None)] if isinstance(base, types.UnionType) else [base]
    words = [f"list of {_name(typing.get_args(a)[0])}" if typing.get_origin(a) is list else _name(a) for a in arms]
    return " or ".join(words) + (" or null" if optional else "")


def read_run_config(run: Path) -> Config:
    """The Config a run was made with (its config.yaml), checked like any other config (without importing
    torch: a command that takes a run refuses a damaged config before the heavy libraries load)."""
    path = Path(run) / "config.yaml"
    values = read_mapping(path, "run file")
    try:
        return from_dict(values)
    except LoraclsError as exc:
        raise LoraclsError(f"{path}: {exc}") from None
