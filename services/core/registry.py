"""Explicit plugin registries.

A registry is a plain ``name -> "module:Attribute"`` map written out in code, one line per plugin.
Entries are imported lazily on first use, so a broken plugin fails loudly when it is asked for (and in
the unit test that loads every entry), never silently at discovery time.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

from services.core.errors import PluginError

T = TypeVar("T")


class Registry(Generic[T]):
    """A lazily loaded map from plugin name to the object its ``"module:Attribute"`` path names.

    Args:
        kind: what the plugins are ("detector", "notifier"...), used in error messages.
        entries: the name -> ``"module:Attribute"`` map.
        base: when given, every loaded object must be a subclass (for classes) or instance of it.
    """

    def __init__(self, kind: str, entries: Mapping[str, str], base: type | None = None) -> None:
        self.kind = kind
        self._entries = dict(entries)
        self._base = base
        self._loaded: dict[str, T] = {}

    def names(self) -> list[str]:
        """Return the registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def path(self, name: str) -> str:
        """Return the ``"module:Attribute"`` path registered under ``name``."""
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self.names()) or "none"
            raise PluginError(f"unknown {self.kind} {name!r}; registered: {known}") from None

    def load(self, name: str) -> T:
        """Import and return the plugin registered under ``name``.

        Raises:
            PluginError: the name is unknown, the module does not import, the attribute is missing,
                or the object is not of the registry's base type.
        """
        if name in self._loaded:
            return self._loaded[name]
        path = self.path(name)
        module_name, _, attr = path.partition(":")
        if not attr:
            raise PluginError(f"{self.kind} {name!r}: path {path!r} must look like 'module:Attribute'")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise PluginError(f"{self.kind} {name!r}: cannot import {module_name!r}: {exc}") from exc
        try:
            obj = getattr(module, attr)
        except AttributeError:
            raise PluginError(f"{self.kind} {name!r}: {module_name!r} has no attribute {attr!r}") from None
        if self._base is not None:
            ok = issubclass(obj, self._base) if isinstance(obj, type) else isinstance(obj, self._base)
            if not ok:
                raise PluginError(f"{self.kind} {name!r}: {path} is not a {self._base.__name__}")
        self._loaded[name] = obj
        return obj
