"""How a config field is declared and checked, and the dict / JSON / dotted-override forms.

A field declares everything the checks need in one place, its default's line:

- its type (the annotation) and, for a number, its valid range: ``number(4, ge=1)``; a float
  must also be finite unless ``infinite=True``;
- a choice that is a registry name: ``choice("reference", KERNELS)``;
- the condition under which it means something at all: ``read_when=when("q_init", "normal",
  "xavier_uniform")`` (a selector field of the same config, or a dotted path from the top-level
  ``Config`` such as ``"data.padding"``). Set to anything but its default while the selector
  holds another value, the field is refused: it would silently do nothing. Fields that only one
  registry entry reads are named by the entry instead (``KINDS`` below);
- whether it is a program argument of the compiled training step (``argument=``, see
  ``attnjax.train.hyper``): its canonical value, or ``RATE`` for a rate whose zero is
  structural.

Every check fails with a one-line ``ValueError`` naming the dotted field and, for a choice, the
valid values, before anything is traced, compiled or written.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal, NamedTuple

from attnjax.registry import Registry


class When(NamedTuple):
    """The values of ``selector`` under which a field is read (``why``: optional reason)."""
    selector: str
    values: tuple
    why: str = ""


def when(selector: str, *values, why: str = "") -> When:
    """``read_when`` of a field: it is read only while ``selector`` is one of ``values``."""
    return When(selector, values, why)


RATE = "rate"   # ``argument=RATE``: a program argument whose zero is structural (see train.hyper)

# Bounds of the integers JAX holds as int32: seeds, step counters, token ids, positions
# (``INT32``); a length or a shift of the causal diagonal is at most ``LENGTH``, so a position
# plus a shift (``j <= i + causal_offset``) stays an int32 too
INT32 = 2**31 - 1
LENGTH = 2**30


def _metadata(range_=None, infinite=False, registry=None, read_when=None, argument=None) -> dict:
    entries = {"range": range_, "infinite": infinite or None, "registry": registry,
               "read_when": read_when, "argument": argument}
    return {key: value for key, value in entries.items() if value is not None}


def number(default, *, ge=None, gt=None, le=None, lt=None, infinite: bool = False,
           read_when: When | None = None, argument=None):
    """A numeric field and its valid range (``None`` values are not range-checked)."""
    bounds = (ge, gt, le, lt)
    return dataclasses.field(default=default, metadata=_metadata(
        bounds if any(b is not None for b in bounds) else None, infinite,
        read_when=read_when, argument=argument))


def choice(default: str | None, registry: Registry, *, read_when: When | None = None):
    """A field whose value is a name in ``registry`` (``None`` allowed where typed so)."""
    return dataclasses.field(default=default, metadata=_metadata(registry=registry,
                                                                 read_when=read_when))


def field(default, *, read_when: When | None = None):
    """Any other field that is read only under a condition."""
    return dataclasses.field(default=default, metadata=_metadata(read_when=read_when))


def _bound(value) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def range_text(bounds) -> str:
    """``[0, 1)``, ``>= 1``, ``> 0`` ... for ``(ge, gt, le, lt)`` (an int bound in full)."""
    ge, gt, le, lt = bounds
    low, high = (ge if gt is None else gt), (le if lt is None else lt)
    if low is not None and high is not None:
        return (f"in {'[' if gt is None else '('}{_bound(low)}, {_bound(high)}"
                f"{']' if lt is None else ')'}")
    if low is not None:
        return f"{'>=' if gt is None else '>'} {_bound(low)}"
    return f"{'<=' if lt is None else '<'} {_bound(high)}"


def in_range(value, bounds) -> bool:
    ge, gt, le, lt = bounds
    return ((ge is None or value >= ge) and (gt is None or value > gt)
            and (le is None or value <= le) and (lt is None or value < lt))


def _check_value(path: str, hint, value):
    """Return ``value`` converted to ``hint`` (int -> float only) or raise naming ``path``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _check_value(path, inner, value)
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{path}={value!r} is not valid; choices: {', '.join(map(str, args))}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{path} must be a list, got {value!r}")
        return tuple(_check_value(f"{path}[{i}]", args[0], v) for i, v in enumerate(value))
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if isinstance(value, dict):
            return from_dict(hint, value, path)
        raise ValueError(f"{path} must be a {hint.__name__} or a dict, got {type(value).__name__}")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ValueError(f"{path} must be {hint.__name__}, got {value!r} ({type(value).__name__})")
    return value


def _check_finite(path: str, value):
    for v in value if isinstance(value, tuple) else (value,):
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{path} must be finite, got {v!r}")


def _check_range(path: str, value, bounds):
    for v in value if isinstance(value, tuple) else (value,):
        if v is not None and not in_range(v, bounds):
            raise ValueError(f"{path} must be {range_text(bounds)}, got {v!r}")


def join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def field_default(field_: dataclasses.Field):
    return field_.default_factory() if field_.default is dataclasses.MISSING else field_.default


def lookup(config, path: str):
    """The value at a dotted ``path`` below ``config``."""
    for part in path.split("."):
        config = getattr(config, part)
    return config


def _means_nothing(path: str, value, selector: str, chosen, readers) -> ValueError:
    return ValueError(f"{path}={value!r} means nothing with {selector}={chosen!r}; it is read "
                      f"by {selector}={' or '.join(map(repr, readers))}")


@functools.cache
def type_hints(cls) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, evaluated once per class: the annotations are strings
    (``from __future__ import annotations``), and evaluating them would otherwise be most of
    the cost of building a config."""
    return typing.get_type_hints(cls)


class Validated:
    """Mixin: type-, range- and choice-check every field on construction, refuse settings that
    mean nothing under the chosen kinds (``KINDS``) or selectors (``read_when``), then run
    ``_validate``. The top-level config (``PATH == ""``) also checks the ``read_when`` of
    nested configs whose selector is a dotted path from it.

    ``KINDS``: ``(selector field, registry, entry attribute)`` triples: the entry attribute of
    every registry entry names the fields of this class only that entry reads."""
    PATH = ""
    KINDS: tuple = ()

    def __post_init__(self):
        hints = type_hints(type(self))
        for f in dataclasses.fields(self):
            path = join(self.PATH, f.name)
            value = _check_value(path, hints[f.name], getattr(self, f.name))
            if not f.metadata.get("infinite"):
                _check_finite(path, value)
            if "range" in f.metadata:
                _check_range(path, value, f.metadata["range"])
            if "registry" in f.metadata and value is not None:
                f.metadata["registry"].get(value, path)
            object.__setattr__(self, f.name, value)
        self._check_kind_fields()
        self._check_read_when(self, local=True)
        if not self.PATH:
            for nested in _nested(self):
                nested._check_read_when(self, local=False)
        self._validate()

    def _check_kind_fields(self):
        for selector, registry, attribute in self.KINDS:
            chosen = getattr(self, selector)
            readers: dict[str, list[str]] = {}
            for name, entry in registry.items():
                for name_read in getattr(entry, attribute):
                    readers.setdefault(name_read, []).append(name)
            for name, kinds in readers.items():
                if chosen not in kinds:
                    self._refuse_if_set(name, selector, chosen, kinds)

    def _check_read_when(self, root, local: bool):
        """Refuse fields set while their ``read_when`` selector (one of this config's fields
        when ``local``, else a dotted path from ``root``) holds another value."""
        for f in dataclasses.fields(self):
            rule = f.metadata.get("read_when")
            if rule is None or ("." not in rule.selector) != local:
                continue
            chosen = lookup(self if local else root, rule.selector)
            if chosen not in rule.values:
                self._refuse_if_set(f.name, rule.selector, chosen, rule.values, rule.why)

    def _refuse_if_set(self, name: str, selector: str, chosen, readers, why: str = ""):
        f = next(f for f in dataclasses.fields(self) if f.name == name)
        value = getattr(self, name)
        if value != field_default(f):
            error = _means_nothing(join(self.PATH, name), value, selector, chosen, readers)
            raise ValueError(f"{error} ({why})" if why else str(error))

    def _validate(self):
        pass

    def _fail(self, name: str, message: str):
        separator = "" if message.startswith("=") else " "
        raise ValueError(f"{join(self.PATH, name)}{separator}{message}")


def _nested(config) -> Iterator[Validated]:
    """Every config nested below ``config`` (depth first)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, Validated):
            yield value
            yield from _nested(value)


def program_arguments(cls, path: str = "") -> dict[str, tuple[type, Any]]:
    """``{dotted field: (type, canonical value or RATE)}`` of every field of ``cls`` (and the
    configs nested in it) declared with ``argument=``."""
    hints = type_hints(cls)
    found = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            found.update(program_arguments(hint, join(path, f.name)))
        elif "argument" in f.metadata:
            found[join(path, f.name)] = (hint, f.metadata["argument"])
    return found


def from_dict(cls, data: dict, path: str | None = None):
    """Build dataclass ``cls`` from a (nested) dict; an unknown key is an error listing the
    valid ones."""
    path = cls.PATH if path is None else path
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise ValueError(f"{join(path, unknown[0])} is not a config field; "
                         f"valid: {', '.join(names)}")
    return cls(**data)


def to_dict(config) -> dict:
    """Nested plain dict of a config (JSON-serialisable)."""
    return dataclasses.asdict(config)


def to_json(config) -> str:
    return json.dumps(to_dict(config), indent=2, sort_keys=True)


def from_json(cls, text: str):
    return from_dict(cls, json.loads(text))


def _parse_value(text: str) -> Any:
    """``'4'`` -> 4, ``'0.5'`` -> 0.5, ``'true'`` -> True, ``'null'``/``'None'`` -> None, else
    the string."""
    if text == "None":
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["a.b=4", "c=x"]`` -> ``{"a.b": 4, "c": "x"}`` (values parsed as JSON where possible)."""
    pairs = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like KEY=VALUE")
        key, value = item.split("=", 1)
        pairs[key.strip()] = _parse_value(value.strip())
    return pairs


def derive(config, **changes):
    """A copy of the validated ``config`` with ``changes``, not validated again: for configs
    derived inside a trace, whose fields may hold traced values (a vmapped hyperparameter)."""
    new = copy.copy(config)
    for name, value in changes.items():
        object.__setattr__(new, name, value)
    return new


def apply_overrides(config, overrides: dict[str, Any] | list[str]):
    """Return a copy of ``config`` with dotted overrides applied, validated once, together.

    ``overrides`` is a dict ``{"model.attention.num_heads": 8}`` or a list of ``KEY=VALUE``
    strings (values parsed as JSON where possible, else kept as strings). Keys are relative to
    the top-level config (``model.d_model``, ``seed``).
    """
    if isinstance(overrides, (list, tuple)):
        overrides = parse_overrides(overrides)
    data = to_dict(config)
    for key, value in overrides.items():
        node, parts = data, key.split(".")
        for depth, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                where = ".".join(parts[:depth]) or "config"
                valid = ", ".join(node) if isinstance(node, dict) else "(not a section)"
                raise ValueError(f"override {key!r}: {part!r} is not a field of {where}; "
                                 f"valid: {valid}")
            if depth == len(parts) - 1:
                node[part] = value
            else:
                node = node[part]
    return from_dict(type(config), data)
