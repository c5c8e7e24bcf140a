"""The Alertmanager model: routing config and route tree, label matchers, durations, time intervals,
silences, the labels every alert carries, and the :class:`~services.alerting.notification.Notification`
decision.

A leaf package: it imports only :mod:`services.core` (and third-party packages), so the store, the
notify stage, the API and the stream pipeline (``pipelines/correlate``) all use it without importing
each other. The tree of its errors is in :mod:`services.alerting.errors`.

* :mod:`~services.alerting.config`: routing.yaml (``load_routing``, ``loads_routing``, ``RoutingConfig``).
* :mod:`~services.alerting.routes`: the route tree built from it, group keys, time muting.
* :mod:`~services.alerting.matchers`, :mod:`~services.alerting.durations`,
  :mod:`~services.alerting.timeintervals`: Alertmanager's matcher, duration and time-interval syntax.
* :mod:`~services.alerting.silences`: silences and their validation.
* :mod:`~services.alerting.labels`: an anomaly's alert labels and fingerprint.
* :mod:`~services.alerting.notification`: the notify stage's decision.
"""
