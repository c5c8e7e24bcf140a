"""Who may use the HTTP API, and the record of what they did (docs/api.md, "Authentication").

* :mod:`services.auth.tokens`: roles (viewer < operator < admin), identities, and API tokens stored
  hashed in ``api_tokens`` (``medic token create|list|revoke``).
* :mod:`services.auth.audit`: ``audit_log``, one row per write (who, what, when, from where, outcome).
* :mod:`services.auth.replay`: signed requests seen recently, so that a captured Slack click cannot be
  sent again.
* :mod:`services.auth.http`: the API's side: the middleware that authenticates every request but the
  open ones and writes the audit row of every write, the ``require(role)`` dependencies routes declare,
  and the token, audit and ``whoami`` routes.
* :mod:`services.auth.cli`: ``medic token``.

This package sits above ``services/store`` (it uses its connections and migrations) and below the
API and the remediation router, which import it.
"""
