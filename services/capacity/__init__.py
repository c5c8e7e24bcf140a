"""Variant-aware capacity planning: desired replicas per model variant at the lowest cost per 1k tokens.

``config`` reads ``infra/config/capacity.yaml``; ``planner`` turns one snapshot of serving
observations into desired replicas with a reason per variant. Both are pure (no I/O in the planner;
the config loader reads one file), so the stream role, the remediation path and the evaluation can
share them. See docs/capacity.md.
"""
