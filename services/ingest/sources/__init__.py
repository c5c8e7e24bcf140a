"""The ingest sources we poll, one module each (registered in :data:`services.ingest.registry.SOURCES`).

``scrape`` (Prometheus ``/metrics``), ``prometheus`` (PromQL ``query_range``) and ``loki`` (LogQL
``query_range``). Each module holds its client and its :class:`~services.ingest.source.PullSource`
declaration, from which ``medic ingest <command>`` is built; what they share is :mod:`services.ingest.pull`.
"""
