"""The automatic report's pieces that need no infrastructure: when the notifier asks for a report, which Slack
configs it goes to, what the Slack summary says (within Block Kit's limits), and the post-mortem front matter."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from services.core.errors import ConfigError
from services.diagnostician.documents import parse_postmortem, report_document
from services.notify.service import IncidentFollower
from services.notify.standin import check_blocks
from services.notify.state import MemoryIncidentStore
from services.reports.archive import StoredReport, report_url, slack_summary
from services.reports.tasks import slack_targets
from tests.unit.test_notify_follower import ROUTING, diagnosis, incident, warning


def _follower() -> tuple[IncidentFollower, list[tuple[str, float, tuple[str, ...]]]]:
    asked: list[tuple[str, float, tuple[str, ...]]] = []
    f = IncidentFollower(
        ROUTING, MemoryIncidentStore(), lambda out: None, lambda e, r: asked.append((e.incident_id, e.ts, r))
    )
    return f, asked


def test_only_a_resolved_event_asks_for_the_report_with_the_receivers_notified() -> None:
    f, asked = _follower()
    f.on_incident(incident("opened", warning()))
    f.on_diagnosis(diagnosis())
    f.on_incident(incident("updated", warning(), ts=1_760_000_100.0))
    assert asked == []
    f.on_incident(incident("resolved", warning(status="resolved"), ts=1_760_000_400.0))
    assert asked == [("inc-1", 1_760_000_400.0, ("serving",))]


def test_an_incident_nobody_was_notified_about_still_gets_its_report() -> None:
    f, asked = _follower()
    f.on_incident(incident("resolved", warning(status="resolved"), ts=1_760_000_400.0))
    assert asked == [("inc-1", 1_760_000_400.0, ())]


def test_the_report_goes_to_each_slack_app_channel_of_the_receivers_once() -> None:
    targets = slack_targets(ROUTING, ("serving", "chat", "page", "serving", "gone"))
    assert [t["channel"] for t in targets] == ["#serving", "#sre"]


def _stored(summary: str, title: str = "gpu_xid on GPU-1") -> StoredReport:
    return StoredReport(
        incident_id="inc-1",
        version=datetime(2026, 12, 1, tzinfo=UTC),
        title=title,
        summary=summary,
        root_cause="gpu_xid_79",
        kb_doc_id="report-inc-1",
    )


def test_the_slack_summary_links_the_report_and_stays_within_block_kit_limits() -> None:
    url = report_url("https://medic.example.test/", "inc/1")
    assert url == "https://medic.example.test/api/v1/incidents/inc%2F1/report?format=html"
    text, blocks = slack_summary(_stored("**What**: <!channel> & more\n" + "x" * 5000, title="a|b <c>"), url)
    assert check_blocks(blocks) == []
    section = blocks[0]["text"]["text"]
    assert section.startswith(f"*Post-incident report*: <{url}|a/b &lt;c&gt;>")
    assert "*What*: &lt;!channel&gt; &amp; more" in section and "<!channel>" not in section
    assert url in text


def test_without_a_public_url_the_summary_says_how_to_read_the_report() -> None:
    _, blocks = slack_summary(_stored("**What**: x"), report_url("", "inc-1"))
    assert "`medic report inc-1`" in blocks[0]["text"]["text"] and "<" not in blocks[0]["text"]["text"]


def test_a_report_is_indexed_under_its_root_cause_with_its_summary_first() -> None:
    md = "# Post-incident report: x\n\n_sub_\n\n## Summary\n\n- **What**: x.\n\n## Timeline\n\n| a |\n|---|\n| b |\n"
    doc = report_document("inc-1", "Post-incident report: x", "gpu_xid_79", md, labels={"model": "m", "gpu": "0"})
    assert doc.doc_id == "report-inc-1" and doc.kind == "report" and doc.metadata["root_cause"] == "gpu_xid_79"
    assert "## Summary" in doc.chunks[0].content and "## Timeline" in doc.chunks[1].content
    assert doc.chunks[0].labels == {"kind": "report", "root_cause": "gpu_xid_79", "model": "m"}


@pytest.mark.parametrize(
    ("front", "says"),
    [
        ("title: t\nroot_cause: gpu_xid_79\n", "id: Field required"),
        ("id: pm-1\ntitle: t\nroot_cause: GPU-fault\n", "not a snake_case"),
        ("id: pm-1\ntitle: t\nroot_cause: gpu_xid_79\nseverity: bad\n", "severity"),
        ("id: pm-1\ntitle: t\nroot_cause: gpu_xid_79\nduration_minutes: -3\n", "duration_minutes"),
        (
            "id: pm-1\ntitle: t\nroot_cause: gpu_xid_79\nplaybooks_run: [{level: 1, status: ok}]\n",
            "playbooks_run.0.name",
        ),
        ("- a list\n", "must be a mapping"),
    ],
)
def test_bad_postmortem_front_matter_names_the_file_and_the_key(front: str, says: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_postmortem(f"---\n{front}---\n## Summary\n\ntext\n", Path("pm.md"))
    assert says in str(exc.value) and str(exc.value).startswith("pm.md:")


def test_a_postmortem_needs_text_after_its_front_matter() -> None:
    with pytest.raises(ConfigError, match="no text after it"):
        parse_postmortem("---\nid: pm-1\ntitle: t\nroot_cause: gpu_xid_79\n---\n", Path("pm.md"))
