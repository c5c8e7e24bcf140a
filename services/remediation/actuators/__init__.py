"""Actuators: the one interface remediation uses to change (and read) the world."""
