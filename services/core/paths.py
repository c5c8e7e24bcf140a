"""Where the project finds its own files and the shared public data sets."""

from __future__ import annotations

import os
from pathlib import Path

from services.core.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    """Return the folder holding the public benchmark data (NAB, LogHub, traces, XID catalog...).

    It is ``$CLUSTERMEDIC_SHARED_DATA`` when set, else ``../shared/data`` beside the repository.
    These files are never copied into the project; benchmarks and tests read them in place.

    Raises:
        ConfigError: the folder does not exist, with what to do about it.
    """
    env = os.environ.get("CLUSTERMEDIC_SHARED_DATA")
    path = Path(env) if env else REPO_ROOT.parent / "shared" / "data"
    if not path.is_dir():
        raise ConfigError(
            f"shared data folder {path} is absent: put the public data sets there "
            "(see shared/data/*/SOURCE.txt) or set CLUSTERMEDIC_SHARED_DATA"
        )
    return path
