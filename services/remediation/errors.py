"""Errors of the remediation service, all under :class:`~services.core.errors.ClusterMedicError`::

ClusterMedicError
└── RemediationError           anything remediation refuses or fails to do
    ├── ParamsError            playbook parameters do not validate
    ├── PrecheckFailed         the world is not in the state the playbook expects
    ├── VerificationPending    a verification does not hold yet (retried with backoff)
    ├── VerificationFailed     a verification did not hold before its timeout
    ├── ActuatorError          the actuator could not carry out an action
    │   └── ActuatorUnsupported  this actuator cannot do that operation at all
    ├── ApprovalError          an approval cannot be given (not pending, expired, unknown run)
    └── SignatureError         a Slack request is unsigned, badly signed or stale
"""

from __future__ import annotations

from services.core.errors import ClusterMedicError


class RemediationError(ClusterMedicError):
    """Root of the remediation errors."""


class ParamsError(RemediationError):
    """Playbook parameters are missing or invalid."""


class PrecheckFailed(RemediationError):
    """The precheck found the world not as the playbook expects; nothing was changed."""


class VerificationPending(RemediationError):
    """A verification does not hold yet; the verify task retries it with backoff."""


class VerificationFailed(RemediationError):
    """A verification did not hold before its timeout."""


class ActuatorError(RemediationError):
    """An actuator failed to carry out an action (rejected, unreachable, blocked by a PDB...)."""


class ActuatorUnsupported(ActuatorError):
    """The actuator has no way to perform this operation."""


class ApprovalError(RemediationError):
    """An approval or rejection cannot be recorded."""


class SignatureError(RemediationError):
    """A signed request (Slack interactivity) failed verification."""
