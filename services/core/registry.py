"""Explicit plugin registries.

A registry is a plain ``name -> "module:Attribute"`` map written out in code, one line per plugin.
Entries are imported lazily on first use, so a broken plugin fails loudly when it is asked for (and in
the unit test that loads every entry), never silently at discovery time.

A plugin that lives outside this repository registers the same line as a Python entry point (how
pytest/pluggy, Celery and Faust take plugins from installed packages): in the plugin package's
``pyproject.toml``::

    [project.entry-points."clustermedic.detectors"]
    gpu_fan = "acme_medic.fan:GpuFanDetector"

The group is ``clustermedic.`` + the registry's kind in the plural (``clustermedic.detectors``,
``clustermedic.playbooks``, ``clustermedic.actuators``, ``clustermedic.notifiers``,
``clustermedic.diagnostic_tools``, ``clustermedic.ingest_sources``). An entry point is one more line
of the map, loaded as lazily; one that reuses a built-in name, or a name another package registers
too, is a :class:`PluginError` (a plugin never replaces another one silently). docs/extending.md has
the steps for each kind.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

from services.core.errors import PluginError

T = TypeVar("T")

ENTRY_POINT_PREFIX = "clustermedic."


def entry_point_group(kind: str) -> str:
    """The entry-point group that adds plugins to the registry of ``kind`` ("detector" -> "clustermedic.detectors")."""
    return ENTRY_POINT_PREFIX + kind.replace(" ", "_") + "s"


@functools.cache
def installed_entries(group: str) -> tuple[tuple[str, str, str], ...]:
    """``(name, "module:Attribute", distribution)`` of every installed entry point of ``group``.

    Read once per process (a scan of the installed distributions costs ~30 ms); ``cache_clear`` after
    installing a package into a running process.
    """
    out = []
    for ep in importlib.metadata.entry_points(group=group):
        dist = ep.dist.name if ep.dist is not None else "?"
        out.append((ep.name, ep.value, dist))
    return tuple(sorted(out))


class Registry(Generic[T]):
    """A lazily loaded map from plugin name to the object its ``"module:Attribute"`` path names.

    Args:
        kind: what the plugins are ("detector", "notifier"...), used in error messages and to name the
            entry-point group (:func:`entry_point_group`).
        entries: the name -> ``"module:Attribute"`` map of the built-in plugins.
        base: when given, every loaded object must be a subclass (for classes) or instance of it.
    """

    def __init__(self, kind: str, entries: Mapping[str, str], base: type | None = None) -> None:
        self.kind = kind
        self.group = entry_point_group(kind)
        self._builtin = dict(entries)
        self._merged: dict[str, str] | None = None
        self._origin: dict[str, str] = {}
        self._base = base
        self._loaded: dict[str, T] = {}

    @property
    def _entries(self) -> dict[str, str]:
        """The built-in map plus the installed entry points of :attr:`group`, merged on first use.

        Raises:
            PluginError: an entry point reuses a built-in name or one another distribution registers.
        """
        if self._merged is None:
            merged = dict(self._builtin)
            origin = dict.fromkeys(merged, "built-in")
            for name, path, dist in installed_entries(self.group):
                if name in merged:
                    raise PluginError(
                        f"{self.kind} {name!r} of the package {dist!r} (entry point group {self.group!r}) "
                        f"is already registered by {origin[name]}; a plugin needs a name of its own"
                    )
                merged[name] = path
                origin[name] = f"the package {dist!r}"
            self._merged, self._origin = merged, origin
        return self._merged

    def origin(self, name: str) -> str:
        """``"built-in"`` or ``"the package '<distribution>'"``: who registered ``name``."""
        self.path(name)
        return self._origin[name]

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
