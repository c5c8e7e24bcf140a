"""The contract of an ingest source we poll: its command, its options, and how its client is built.

A pull source (``services/ingest/sources/<name>.py`` and one line in
:data:`services.ingest.registry.SOURCES`, or a module of an installed package and one entry point in
``clustermedic.ingest_sources``) declares on its class what ``medic ingest <command>`` needs, and the CLI
builds the command from that (:func:`services.ingest.cli.source_command`):

- :attr:`PullSource.command` and :attr:`PullSource.summary`: the command's name and help;
- :attr:`PullSource.options`: its flags, in help order; each overrides one setting (``--url`` over
  ``ingest_loki_url``), or, for a source whose settings ClusterMedic does not have (an installed
  package's), is the source's own (:attr:`PullSource.flags`); every command also gets ``--once``;
- :meth:`PullSource.check`: refuse a configuration that cannot work, saying what to set;
- :attr:`PullSource.interval_s` and :meth:`PullSource.build`: how often to poll, and the client (a
  :class:`Poller`) publishing through the shared :class:`~services.ingest.pull.Delivery`.

The command builds the settings once, makes the source ``cls(settings, flags)``, checks it, and polls
its client with :func:`services.ingest.pull.run_every` through the push receivers' publish queue, as it
does for every source. Push receivers (routes in ``services/ingest/http.py``) and the watchers with a
loop of their own (``watch-k8s``, ``nvml``) are not pull sources.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from services.core.settings import Settings

if TYPE_CHECKING:
    from services.ingest.pull import Delivery


class Poller(Protocol):
    """A pull client: one :meth:`poll` fetches what is new and publishes it."""

    def poll(self) -> int:
        """Fetch and publish what is new; return how many items Kafka acknowledged. Never raises for bad input."""
        ...


@dataclass(frozen=True)
class Option:
    """One flag of a source's command, ``--<name>``.

    Attributes:
        name: the parameter name (``target`` is ``--target``; underscores become dashes).
        type: the value's type (``str``, ``int``, ``float``, ``list[str]`` for a repeatable flag).
        setting: the :class:`~services.core.settings.Settings` field it overrides when given; None: the
            value is the source's own, in :attr:`PullSource.flags` (None when not given).
        help: the flag's help, naming the setting (or the value) it defaults to.
        parse: turns the flag's value into the setting's (``NAME=PROMQL`` items into a mapping); raises
            :class:`~services.core.errors.ConfigError` for a value it refuses.
    """

    name: str
    type: Any
    setting: str | None
    help: str
    parse: Callable[[Any], Any] | None = None


def _given(value: Any) -> bool:
    # typer passes None for a flag not given; a repeatable one may come as an empty list
    return value is not None and not (isinstance(value, list | tuple | dict) and not value)


class PullSource(ABC):
    """An ingest source we poll, declared for the registry and the CLI (see the module docstring).

    Args:
        settings: the settings, with the flags that override settings applied.
        flags: the values of the options without a setting (None for one not given).

    Class attributes:
        name: the registry key (the module's file name).
        command: the ``medic ingest`` command (``pull-prom``).
        summary: the command's help.
        options: its flags, in the order the help lists them (``--once`` comes last).
    """

    name: ClassVar[str]
    command: ClassVar[str]
    summary: ClassVar[str]
    options: ClassVar[tuple[Option, ...]] = ()

    def __init__(self, settings: Settings, flags: Mapping[str, Any] | None = None) -> None:
        self.settings = settings
        self.flags: dict[str, Any] = dict(flags or {})

    @classmethod
    def split(cls, values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The command's flag values as (settings they override, the source's own flags).

        A flag not given (None, or an empty list) overrides nothing, and is None among the own flags.

        Raises:
            ConfigError: an option's ``parse`` refused its value.
        """
        overrides: dict[str, Any] = {}
        flags: dict[str, Any] = {}
        for option in cls.options:
            value = values.get(option.name)
            value = option.parse(value) if _given(value) and option.parse is not None else value
            if option.setting is None:
                flags[option.name] = value if _given(value) else None
            elif _given(value):
                overrides[option.setting] = value
        return overrides, flags

    def check(self) -> None:
        """Refuse a configuration the source cannot run with (no URL, no query).

        Raises:
            ConfigError: what is missing and how to set it (the command prints it and exits 2).
        """
        return None  # a source that runs on its settings' defaults refuses nothing

    @property
    @abstractmethod
    def interval_s(self) -> float:
        """Seconds between polls."""

    @abstractmethod
    def build(self, delivery: Delivery) -> Poller:
        """The client, publishing through ``delivery``."""
