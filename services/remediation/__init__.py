"""Graded remediation: playbooks, policy and guardrails, approvals, actuators, Celery execution.

Flow: a :class:`~services.core.events.Diagnosis` becomes a :class:`~services.remediation.model.Decision`
(:func:`services.remediation.policy.plan_from_diagnosis`, pure), the decision a run recorded in Postgres
(:mod:`services.remediation.store`), and an executable run a Celery chain
(:mod:`services.remediation.tasks`): precheck -> (action, wait, verify) per step -> finish, with a
rollback when any of it fails. See docs/remediation.md.
"""
