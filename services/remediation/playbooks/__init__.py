"""Shipped playbooks, one per file; the registry in services.remediation.registry lists them."""
