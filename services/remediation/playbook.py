"""The playbook contract.

A playbook is a class with a ``name`` (its registry key), a ``level`` (1 automatic, 2 needs approval,
3 page a human and never act), typed ``Params`` validated before anything runs, a docstring shown to
humans (Slack, the CLI) and to the diagnostician's LLM, and four pure methods:

* :meth:`Playbook.targets` says what the playbook touches (the guardrails reason about it);
* :meth:`Playbook.precheck` reads the world through the actuator and changes nothing;
* :meth:`Playbook.steps` lists the ordered steps (action, wait, verify with a timeout);
* :meth:`Playbook.rollback` lists the steps that undo what the steps did, given what the precheck saw.

Steps and rollbacks are data (:class:`~services.remediation.model.Step`), so the executor can record
each one in Postgres before it acts and Celery can carry them as JSON.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from services.remediation.actuators.base import Actuator
from services.remediation.errors import ParamsError
from services.remediation.model import PrecheckResult, Step, Targets


class PlaybookParams(BaseModel):
    """Base of every playbook's parameters: frozen, unknown keys rejected (a typo must not pass)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = ""


class Playbook:
    """Base class of every playbook (see the module docstring)."""

    name: ClassVar[str] = ""
    level: ClassVar[int] = 3
    Params: ClassVar[type[PlaybookParams]] = PlaybookParams
    # Parameters a diagnosis proposes besides the targets it fills from topology labels: only relative
    # ones that need no knowledge of the current state ("one more replica"); see services.remediation.catalog.
    proposed: ClassVar[dict[str, Any]] = {}

    def parse(self, raw: dict[str, Any]) -> PlaybookParams:
        """Validate raw parameters.

        Raises:
            ParamsError: they do not validate against :attr:`Params`.
        """
        try:
            return self.Params.model_validate(raw)
        except ValidationError as exc:
            errs = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()[:5])
            raise ParamsError(f"{self.name}: {errs}") from exc

    @classmethod
    def description(cls) -> str:
        """The docstring shown to humans and to the diagnostician."""
        return inspect.cleandoc(cls.__doc__ or cls.name)

    def targets(self, params: Any) -> Targets:
        """What the playbook touches (for blast radius and cooldown)."""
        return Targets(namespace=params.namespace)

    def precheck(self, params: Any, actuator: Actuator) -> PrecheckResult:
        """Read the world and say whether the playbook can run; must change nothing."""
        return PrecheckResult(ok=True)

    def steps(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        """The ordered steps, given what the precheck observed."""
        return []

    def rollback(self, params: Any, observed: dict[str, Any]) -> list[Step]:
        """Steps that undo the playbook's changes, given what the precheck observed (may be empty)."""
        return []


def require(actuator: Actuator, *ops: str) -> str:
    """Return a reason when the actuator lacks one of ``ops`` (empty string when it has them all)."""
    missing = [op for op in ops if not actuator.supports(op)]
    return f"actuator {actuator.name} cannot {', '.join(missing)}" if missing else ""
