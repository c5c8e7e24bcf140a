"""Evaluation harnesses (simulator seeds, closed loop): never imported by services."""
