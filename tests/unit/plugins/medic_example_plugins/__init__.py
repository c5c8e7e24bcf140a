"""Example ClusterMedic plugins, packaged as a third party would (docs/extending.md).

The package is what an installed distribution looks like on ``sys.path``: its modules and a
``*.dist-info`` folder whose ``entry_points.txt`` is what ``[project.entry-points."clustermedic.*"]`` in a
``pyproject.toml`` becomes on install. tests/unit/test_plugins.py puts it on the path of a fresh process
and checks that the registries, and every catalog derived from them, pick each plugin up.
"""
