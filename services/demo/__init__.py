"""``medic demo``: the closed loop on a simulated cluster (:mod:`.loop`), and the smoke flow (:mod:`.smoke`)."""

from services.demo.smoke import SmokeResult, describe, run_smoke

__all__ = ["SmokeResult", "describe", "run_smoke"]
