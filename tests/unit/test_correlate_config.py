"""routing.yaml: durations, matchers, validation errors, the route tree and time intervals."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from services.alerting.config import load_routing, loads_routing
from services.alerting.durations import format_duration, parse_duration
from services.alerting.matchers import Matcher, parse_matcher, parse_matchers
from services.alerting.routes import build_route_tree
from services.alerting.timeintervals import TimeInterval
from services.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def ts(text: str, zone: str = "UTC") -> float:
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp()


# ------------------------------------------------------------------------------------ durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("5m", 300),
        ("4h", 14400),
        ("1h30m", 5400),
        ("1d", 86400),
        ("1w", 604800),
        ("0", 0),
        ("500ms", 0.5),
        ("1m30s500ms", 90.5),
        ("1y", 365 * 86400),
    ],
)
def test_prometheus_durations_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5x", "", "30", "m5", "1m1h", "1.5h", "-5m", " 5m"])
def test_bad_durations_are_rejected(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_durations_format_back():
    assert format_duration(5400) == "1h30m"
    assert format_duration(0.25) == "250ms"


# ------------------------------------------------------------------------------------- matchers


def test_equal_and_not_equal():
    eq = parse_matcher('severity="critical"')
    ne = parse_matcher('severity!="critical"')
    assert eq.matches({"severity": "critical"}) and not eq.matches({"severity": "warning"})
    assert ne.matches({"severity": "warning"}) and not ne.matches({"severity": "critical"})


def test_regex_and_negative_regex_are_anchored():
    rx = parse_matcher('severity=~"critical|warning"')
    assert rx.matches({"severity": "critical"}) and rx.matches({"severity": "warning"})
    assert not rx.matches({"severity": "critical-ish"})  # anchored at the end
    assert not parse_matcher('node=~"gpu"').matches({"node": "gpu-1"})  # and at the start
    assert parse_matcher('node=~"gpu.*"').matches({"node": "gpu-1"})
    assert not parse_matcher('node=~"b"').matches({"node": "abc"})
    nrx = parse_matcher('node!~"gpu-[0-9]+"')
    assert not nrx.matches({"node": "gpu-12"}) and nrx.matches({"node": "gpu-12a"})
    # A trailing newline does not sneak past the end anchor.
    assert not parse_matcher('x=~"a"').matches({"x": "a\n"})


def test_missing_label_reads_as_empty_string():
    assert parse_matcher('foo=""').matches({})
    assert not parse_matcher('foo!=""').matches({})
    assert parse_matcher('foo!=""').matches({"foo": "x"})
    assert parse_matcher('foo=~".*"').matches({})
    assert not parse_matcher('foo=~".+"').matches({})
    assert parse_matcher('foo!="bar"').matches({})


def test_matcher_syntax_variants():
    assert parse_matcher("severity=critical") == Matcher("severity", "=", "critical")
    assert parse_matcher('  severity  !=  "a b"  ') == Matcher("severity", "!=", "a b")
    assert parse_matchers('{alertname="X", node=~"gpu-.*"}') == (
        Matcher("alertname", "=", "X"),
        Matcher("node", "=~", "gpu-.*"),
    )
    # commas inside quotes belong to the value
    assert parse_matchers('msg="a,b", x=y') == (Matcher("msg", "=", "a,b"), Matcher("x", "=", "y"))
    # escapes: \" and \\ and \n; any other backslash stays (regex escapes survive)
    assert parse_matcher(r'a="say \"hi\""').value == 'say "hi"'
    assert parse_matcher(r'a=~"node\.x"').value == r"node\.x"
    assert parse_matcher(r'a=~"node\.x"').matches({"a": "node.x"})
    assert not parse_matcher(r'a=~"node\.x"').matches({"a": "nodeXx"})
    assert str(parse_matcher('severity=~"critical|warning"')) == 'severity=~"critical|warning"'


@pytest.mark.parametrize(
    "text", ['severity="critical', "severity", '="x"', 'a=~"("', 'a="1" b="2"', '{a="1"', 'a="1"}', "", "1a=b"]
)
def test_bad_matchers_are_rejected(text):
    with pytest.raises(ValueError, match="invalid"):
        parse_matchers(text)


# ------------------------------------------------------------------------------ config errors

BASE = """
route:
  receiver: default
receivers:
  - name: default
"""


def test_minimal_config_gets_alertmanager_defaults():
    root = build_route_tree(loads_routing(BASE).route)
    assert (root.group_wait, root.group_interval, root.repeat_interval) == (30, 300, 4 * 3600)
    assert root.group_by == () and not root.group_by_all
    assert loads_routing(BASE).global_.resolve_timeout == 300


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        (BASE + "global: {resolve_timeout: 5x}\n", r"global\.resolve_timeout: invalid duration '5x'"),
        (
            "route:\n  receiver: default\n  routes:\n    - {group_wait: 30}\nreceivers: [{name: default}]\n",
            r"route\.routes\[0\]\.group_wait: expected a duration string",
        ),
        (BASE + "foo: 1\n", r"foo: unknown key"),
        (
            "route:\n  receiver: default\n  group_wiat: 1m\nreceivers: [{name: default}]\n",
            r"route\.group_wiat: unknown key",
        ),
        (
            "route:\n  receiver: default\n  routes: [{receiver: nobody}]\nreceivers: [{name: default}]\n",
            r"route\.routes\[0\]\.receiver: undefined receiver 'nobody'",
        ),
        (
            "route:\n  receiver: default\n  routes: [{mute_time_intervals: [nights]}]\nreceivers: [{name: default}]\n",
            r"route\.routes\[0\]\.mute_time_intervals: undefined time interval 'nights'",
        ),
        (
            "route:\n  receiver: default\n  matchers: ['a=b']\nreceivers: [{name: default}]\n",
            r"root route must not have any matchers",
        ),
        ("route: {}\nreceivers: [{name: default}]\n", r"route\.receiver: the root route must name a receiver"),
        (
            "route:\n  receiver: default\n  routes: [{matchers: ['a=~\"(\"']}]\nreceivers: [{name: default}]\n",
            r"route\.routes\[0\]\.matchers: invalid matcher",
        ),
        (
            "route:\n  receiver: default\n  group_by: ['...', node]\nreceivers: [{name: default}]\n",
            r"route\.group_by: group_by: '\.\.\.'",
        ),
        (BASE + "receivers: [{name: a}, {name: a}]\n", r"receiver 'a' is defined more than once"),
        (
            "route: {receiver: default}\nreceivers: [{name: default, email_configs: [{to: x}]}]\n",
            r"receivers\[0\]\.email_configs: unknown key",
        ),
        (
            BASE + "inhibit_rules: [{target_matchers: ['a=b'], equal: [node]}]\n",
            r"inhibit_rules\[0\]: .*needs source_matchers",
        ),
        (
            BASE + "correlation: {flap_detection: {high: 3, low: 3}}\n",
            r"correlation\.flap_detection: .*low \(3\) must be below high \(3\)",
        ),
        (
            BASE + "time_intervals: [{name: x, time_intervals: [{weekdays: [funday]}]}]\n",
            r"time_intervals\[0\]\.time_intervals\[0\]\.weekdays: 'funday' is not a weekday",
        ),
        (
            BASE
            + "time_intervals: [{name: x, time_intervals: [{times: [{start_time: '18:00', end_time: '09:00'}]}]}]\n",
            r"times\[0\]: .*start_time 18:00 must be before end_time 09:00",
        ),
        (
            BASE + "time_intervals: [{name: x, time_intervals: [{location: Mars/Olympus}]}]\n",
            r"location: unknown location 'Mars/Olympus'",
        ),
        ("- a\n- b\n", r"expected a mapping at the top level"),
        ("route: [\n", r"not valid YAML"),
        (
            "route:\n  receiver: default\n  routes: [{min_occurrences: 0}]\nreceivers: [{name: default}]\n",
            r"route\.routes\[0\]\.min_occurrences",
        ),
    ],
)
def test_config_errors_name_the_bad_key(yaml_text, message):
    with pytest.raises(ConfigError, match=message):
        loads_routing(yaml_text)


def test_shipped_routing_yaml_is_valid():
    config = load_routing(REPO / "infra" / "config" / "routing.yaml")
    assert {r.name for r in config.receivers} >= {"slack-sre", "pagerduty-gpu"}
    assert config.receiver("pagerduty-gpu").send_resolved  # PagerDuty resolves by default


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_routing(tmp_path / "nope.yaml")


def test_send_resolved_defaults_follow_alertmanager():
    config = loads_routing(
        BASE.replace("  - name: default\n", "  - name: default\n    slack_configs: [{channel: x}]\n")
        + "  - name: hook\n    webhook_configs: [{url: 'http://x'}]\n  - name: null-receiver\n"
    )
    assert not config.receiver("default").send_resolved  # slack: false unless asked
    assert config.receiver("hook").send_resolved  # webhook: true
    assert not config.receiver("null-receiver").send_resolved


# ---------------------------------------------------------------------------------- route tree

TREE = """
route:
  receiver: default
  group_by: [alertname]
  group_wait: 1m
  repeat_interval: 2h
  routes:
    - matchers: ['severity="critical"']
      receiver: pager
      continue: true
      group_wait: 10s
    - matchers: ['team="serving"']
      receiver: serving
      group_by: ['...']
      routes:
        - matchers: ['alertname=~".*_slo_burn"']
          receiver: slo
          mute_time_intervals: [nights]
          min_occurrences: 2
    - matchers: ['team="gpu"']
      receiver: gpu
    - matchers: ['team=~"gpu|serving"']
      receiver: never-reached-for-gpu-or-serving
receivers:
  - {name: default}
  - {name: pager}
  - {name: serving}
  - {name: slo}
  - {name: gpu}
  - {name: never-reached-for-gpu-or-serving}
time_intervals:
  - name: nights
    time_intervals: [{times: [{start_time: "22:00", end_time: "24:00"}]}]
"""


def receivers(labels):
    root = build_route_tree(loads_routing(TREE).route)
    return [r.receiver for r in root.match(labels)]


def test_first_matching_child_wins_and_continue_goes_on():
    assert receivers({"team": "gpu"}) == ["gpu"]
    # critical has continue: true, so matching goes on to the team routes
    assert receivers({"team": "gpu", "severity": "critical"}) == ["pager", "gpu"]
    # a route whose children do not match is itself the match
    assert receivers({"team": "serving", "alertname": "x"}) == ["serving"]
    assert receivers({"team": "serving", "alertname": "ttft_slo_burn"}) == ["slo"]
    # no child matches: the root
    assert receivers({"team": "other"}) == ["default"]
    assert receivers({"severity": "critical"}) == ["pager"]


def test_children_inherit_unset_values():
    root = build_route_tree(loads_routing(TREE).route)
    pager, serving, _gpu, _last = root.routes
    slo = serving.routes[0]
    assert pager.group_wait == 10 and pager.repeat_interval == 7200 and pager.group_by == ("alertname",)
    assert serving.group_by_all and slo.group_by_all  # inherited '...'
    assert slo.group_wait == 60 and slo.repeat_interval == 7200 and slo.group_interval == 300
    assert slo.min_occurrences == 2 and serving.min_occurrences == 1
    # mute_time_intervals are not inherited (Alertmanager semantics)
    assert slo.mute_time_intervals == ("nights",) and serving.mute_time_intervals == ()
    assert len({r.id for r in root.walk()}) == 6
    assert slo.key == '{}/{team="serving"}/{alertname=~".*_slo_burn"}'


def test_group_by_labels_and_all_labels():
    root = build_route_tree(loads_routing(TREE).route)
    pager, serving, *_ = root.routes
    labels = {"alertname": "gpu_xid", "node": "n1", "severity": "critical"}
    assert pager.group_labels(labels) == {"alertname": "gpu_xid"}
    assert pager.group_labels({"node": "n1"}) == {}  # a missing group_by label is left out
    assert serving.group_labels(labels) == dict(sorted(labels.items()))
    assert pager.group_key({"alertname": "gpu_xid"}) == '{}/{severity="critical"}/0:{alertname="gpu_xid"}'


# ------------------------------------------------------------------------------ time intervals


def test_weekdays_and_times():
    business = TimeInterval.model_validate(
        {"weekdays": ["monday:friday"], "times": [{"start_time": "09:00", "end_time": "17:00"}]}
    )
    assert business.contains(ts("2024-05-06T09:00:00"))  # Monday 09:00, start inclusive
    assert not business.contains(ts("2024-05-06T17:00:00"))  # end exclusive
    assert not business.contains(ts("2024-05-05T12:00:00"))  # Sunday
    assert business.contains(ts("2024-05-10T16:59:59"))  # Friday


def test_days_of_month_months_years_and_location():
    last_days = TimeInterval.model_validate({"days_of_month": ["-3:-1"]})
    assert last_days.contains(ts("2024-02-27T00:00:00")) and last_days.contains(ts("2024-02-29T23:00:00"))
    assert not last_days.contains(ts("2024-02-26T23:59:00"))
    whole_month = TimeInterval.model_validate({"days_of_month": ["1:-1"]})
    assert whole_month.contains(ts("2024-04-30T12:00:00"))
    q1 = TimeInterval.model_validate({"months": ["january:march"], "years": ["2024"]})
    assert q1.contains(ts("2024-03-31T23:00:00")) and not q1.contains(ts("2024-04-01T00:00:00"))
    assert not q1.contains(ts("2025-02-01T00:00:00"))
    berlin = TimeInterval.model_validate(
        {"times": [{"start_time": "22:00", "end_time": "24:00"}], "location": "Europe/Berlin"}
    )
    assert berlin.contains(ts("2024-07-01T21:30:00"))  # 23:30 in Berlin (UTC+2)
    assert not berlin.contains(ts("2024-07-01T23:30:00"))  # 01:30 next day in Berlin


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"days_of_month": ["0"]}, "0 is not a day"),
        ({"days_of_month": ["-1:5"]}, "end day must be negative"),
        ({"days_of_month": ["10:2"]}, "end day is before start day"),
        ({"months": ["13"]}, "not a valid month"),
        ({"weekdays": ["friday:monday"]}, "start day is after end day"),
        ({"times": [{"start_time": "24:00", "end_time": "24:00"}]}, "invalid time"),
        ({"location": "Local"}, "depends on the host"),
    ],
)
def test_bad_time_intervals(spec, message):
    with pytest.raises(ValueError, match=message):
        TimeInterval.model_validate(spec)
