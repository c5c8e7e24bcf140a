"""What each playbook declares about itself, read from the playbook classes (never copied by hand).

The diagnostician proposes a playbook by name with parameters. It fills the *targets* (the fields of
the playbook's ``Params`` that name something in the cluster: pod, deployment, node, GPU, namespace)
from the incident's topology labels, and adds the playbook's :attr:`~Playbook.proposed` parameters (a
relative change such as "one more replica", which needs no knowledge of the cluster's current state).
Levels come from :attr:`Playbook.level`. A new playbook is therefore one file plus its registry line;
this module and the diagnostician's tables follow on their own.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.remediation.errors import ParamsError
from services.remediation.playbook import Playbook
from services.remediation.registry import playbook_registry

TARGET_KEYS: tuple[str, ...] = ("pod", "deployment", "node", "gpu", "namespace")
"""Parameter names that name a target; the diagnostician fills them from topology labels."""


@dataclass(frozen=True)
class PlaybookInfo:
    """One playbook as the diagnostician sees it.

    Attributes:
        name: the registry name.
        level: its default level (1 automatic, 2 after approval, 3 page a human).
        targets: the target parameters it takes, in :data:`TARGET_KEYS` order.
        proposed: the other parameters a diagnosis proposes for it.
        description: the docstring shown to humans and to an LLM.
    """

    name: str
    level: int
    targets: tuple[str, ...]
    proposed: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""
    playbook: Playbook | None = field(default=None, repr=False, compare=False)

    def names_target(self, params: Mapping[str, Any]) -> bool:
        """Whether ``params`` name what the playbook acts on (a namespace alone names nothing)."""
        return not self.targets or bool(params.keys() & (set(self.targets) - {"namespace"}))

    def params_error(self, params: Mapping[str, Any]) -> str:
        """Why ``params`` would be refused by the playbook ("" when they validate)."""
        assert self.playbook is not None
        try:
            self.playbook.parse(dict(params))
        except ParamsError as exc:
            return str(exc)
        return ""


@functools.cache
def playbook_catalog() -> dict[str, PlaybookInfo]:
    """Every registered playbook's :class:`PlaybookInfo`, in registry order (loaded once)."""
    registry = playbook_registry()
    out: dict[str, PlaybookInfo] = {}
    for name in registry.names():
        cls: type[Playbook] = registry.load(name)
        fields = cls.Params.model_fields
        targets = tuple(k for k in TARGET_KEYS if k in fields)
        out[name] = PlaybookInfo(
            name=name,
            level=cls.level,
            # every playbook takes a namespace; alone it names nothing to act on (page_oncall)
            targets=targets if set(targets) - {"namespace"} else (),
            proposed=dict(cls.proposed),
            description=cls.description(),
            playbook=cls(),
        )
    return out


def playbook_levels() -> dict[str, int]:
    """Registry name -> default level."""
    return {name: info.level for name, info in playbook_catalog().items()}
