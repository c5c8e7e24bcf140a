"""The playbook contract.

A playbook is a class with a ``name`` (its registry key), a ``level`` (1 automatic, 2 needs approval,
3 page a human and never act), typed ``Params`` validated before anything runs, a docstring shown to
humans (Slack, the CLI) and to the diagnostician's LLM, and four pure methods:

* :meth:`Playbook.targets` says what the playbook touches (the guardrails reason about it);
* :meth:`Playbook.precheck` reads the world through the actuator and changes nothing;
* :meth:`Playbook.steps` lists the ordered steps (action, wait, verify with a timeout);
* :meth:`Playbook.rollback` lists the steps that undo what the steps did, given what the precheck saw.

The parameter type is the class's type argument, written once in its header: ``class
RestartPodPlaybook(Playbook[RestartPodParams])`` sets ``Params`` and types the ``params`` argument of
every method (a class that sets ``Params = ...`` instead keeps working, with untyped methods).

Steps and rollbacks are data (:class:`~services.remediation.model.Step`), so the executor can record
each one in Postgres before it acts and Celery can carry them as JSON.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, Generic, TypeVar, cast, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError

from services.remediation.actuators.base import Actuator
from services.remediation.errors import ParamsError
from services.remediation.model import PrecheckResult, Step, Targets


class PlaybookParams(BaseModel):
    """Base of every playbook's parameters: frozen, unknown keys rejected (a typo must not pass)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = ""


P = TypeVar("P", bound=PlaybookParams)


class Playbook(Generic[P]):
    """Base class of every playbook (see the module docstring).

    Type Args:
        P: the parameters (a :class:`PlaybookParams`); ``Playbook[XParams]`` sets :attr:`Params` to it.
    """

    name: ClassVar[str] = ""
    level: ClassVar[int] = 3
    Params: ClassVar[type[PlaybookParams]] = PlaybookParams
    # Parameters a diagnosis proposes besides the targets it fills from topology labels: only relative
    # ones that need no knowledge of the current state ("one more replica"); see services.remediation.catalog.
    proposed: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__dict__.get("__orig_bases__", ()):
            if get_origin(base) is not Playbook:
                continue
            (params,) = get_args(base)
            if not (isinstance(params, type) and issubclass(params, PlaybookParams)):
                continue  # Playbook[P] of a generic subclass: its own subclasses name the type
            declared = cls.__dict__.get("Params", params)
            if declared is not params:
                raise TypeError(f"{cls.__name__}: Params = {declared.__name__} but the header says {params.__name__}")
            cls.Params = params

    def parse(self, raw: dict[str, Any]) -> P:
        """Validate raw parameters.

        Raises:
            ParamsError: they do not validate against :attr:`Params`.
        """
        try:
            return cast(P, self.Params.model_validate(raw))
        except ValidationError as exc:
            errs = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()[:5])
            raise ParamsError(f"{self.name}: {errs}") from exc

    @classmethod
    def description(cls) -> str:
        """The docstring shown to humans and to the diagnostician."""
        return inspect.cleandoc(cls.__doc__ or cls.name)

    def targets(self, params: P) -> Targets:
        """What the playbook touches (for blast radius and cooldown)."""
        return Targets(namespace=params.namespace)

    def precheck(self, params: P, actuator: Actuator) -> PrecheckResult:
        """Read the world and say whether the playbook can run; must change nothing."""
        return PrecheckResult(ok=True)

    def steps(self, params: P, observed: dict[str, Any]) -> list[Step]:
        """The ordered steps, given what the precheck observed."""
        return []

    def rollback(self, params: P, observed: dict[str, Any]) -> list[Step]:
        """Steps that undo the playbook's changes, given what the precheck observed (may be empty)."""
        return []


def require(actuator: Actuator, *ops: str) -> str:
    """Return a reason when the actuator lacks one of ``ops`` (empty string when it has them all)."""
    missing = [op for op in ops if not actuator.supports(op)]
    return f"actuator {actuator.name} cannot {', '.join(missing)}" if missing else ""
