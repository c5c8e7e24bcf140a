"""Pure renderers: a :class:`~services.notify.base.Message` becomes one vendor's payload.

One module per vendor; no I/O, no clock (times come from the notification), so every limit is
unit-tested on plain data.
"""
