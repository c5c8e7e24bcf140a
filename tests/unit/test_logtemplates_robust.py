"""The one miner settings row on logs it was never tuned for: what it keeps apart and what it masks.

Each case is one a cluster's logs produce and plain Drain (the same similarity threshold and depth,
no word-conflict limit) gets wrong, which the tests show too, so that they fail if the guard goes.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from pipelines.detectors.logtemplates import (
    MINED_LINE_MAX,
    MINER_SETTINGS,
    LogTemplateDetector,
    MinerSettings,
    mine_templates,
    mined_text,
    words_conflict,
)
from pipelines.detectors.masking import MASK_PATTERNS, masking_instructions
from services.core.events import LogRecord

PLAIN_DRAIN = replace(MINER_SETTINGS, max_word_conflicts=None)


def _groups(lines: list[str], settings: MinerSettings = MINER_SETTINGS) -> int:
    return len(set(mine_templates(lines, settings)))


def test_lines_sharing_a_long_common_prefix_keep_their_distinct_templates() -> None:
    prefix = "reconcile loop for deployment gateway in namespace serving finished:"
    lines = [f"{prefix} rollout complete after {n} s" for n in (12, 15, 9)] + [
        f"{prefix} quota exceeded after {n} s" for n in (3, 4)
    ]
    templates = mine_templates(lines, MINER_SETTINGS)
    assert templates[:3] == [f"{prefix} rollout complete after <*> s"] * 3
    assert templates[3:] == [f"{prefix} quota exceeded after <*> s"] * 2
    # Plain Drain sees 10 equal tokens out of 13 and makes one template of both messages.
    assert _groups(lines, PLAIN_DRAIN) == 1


def test_a_message_whose_only_difference_is_one_word_still_groups() -> None:
    # A user name is a variable spelt as a word: one conflicting position is allowed.
    lines = [
        f"Failed password for {user} from 10.0.0.{n} port 22 ssh2" for n, user in enumerate(("root", "ftp", "oracle"))
    ]
    assert mine_templates(lines, MINER_SETTINGS) == ["Failed password for <*> from <*> port <*> ssh2"] * 3


@pytest.mark.parametrize(
    ("first", "others"),
    [
        ("10.0.0.7", ["10.0.3.1", "192.168.1.20"]),
        ("3f2a9c1e-8b4d-4e0a-9a41-0c2b6f7d8e11", ["a1b2c3d4-1111-2222-3333-444455556666"]),
        ("2024-05-21T10:15:33.123Z", ["2024-05-21T10:15:34.001Z"]),
        ("10:15:33", ["10:15:34", "23:59:59.999"]),
        ("0x7f3a", ["0x1b"]),
        ("4711", ["12"]),
        ("0000:3b:00.0", ["0000:86:00.0"]),
    ],
)
def test_a_variable_token_in_first_position_is_masked_not_taken_as_a_template(first: str, others: list[str]) -> None:
    message = "request finished in 12 ms"
    # Alone, the first line's template already has a placeholder where the variable was...
    assert mine_templates([f"{first} {message}"], MINER_SETTINGS) == ["<*> request finished in <*> ms"]
    # ...and every other value joins it, in the miner and in the detector's templates.
    lines = [f"{v} {message}" for v in [first, *others]]
    assert mine_templates(lines, MINER_SETTINGS) == ["<*> request finished in <*> ms"] * len(lines)
    detector = LogTemplateDetector()
    state, _ = detector.detect(
        [LogRecord(stream={"pod": "p"}, line=line, ts=float(i)) for i, line in enumerate(lines)],
        detector.initial_state(),
    )
    assert state.template_count() == 1
    (stats,) = state.templates.values()
    assert stats.template.startswith("<") and first not in stats.template


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # JSON: the keys are shared, the message words are not
        (
            '{"level": "info", "msg": "cache warm", "took_ms": 12}',
            '{"level": "info", "msg": "peer lost", "took_ms": 40}',
        ),
        # key=value pairs with no spaces around '='
        (
            "level=info component=api event=started reason=scheduled",
            "level=info component=api event=stopped reason=evicted",
        ),
        # pipes, semicolons and tabs as delimiters
        ("api | GET /v1/models | 200 | cache hit", "api | POST /v1/completions | 500 | upstream timeout"),
        ("node=gpu-node-3; by=operator; op=drain; result=ok", "node=gpu-node-3; by=operator; op=cordon; result=denied"),
        ("kubelet\tpod\tsync\tstarted\tcontainer", "kubelet\tpod\tsync\tkilled\tsandbox"),
    ],
)
def test_unusual_delimiters_never_merge_unrelated_messages(a: str, b: str) -> None:
    assert _groups([a, b, a, b]) == 2
    # Plain Drain: the shared structure outweighs the words, and the two become one template.
    assert _groups([a, b, a, b], PLAIN_DRAIN) == 1


def test_the_same_structured_message_with_other_values_still_groups() -> None:
    lines = [f'{{"level": "info", "msg": "cache warm", "took_ms": {n}}}' for n in (12, 40, 7)]
    assert _groups(lines) == 1


def test_very_long_lines_never_merge_unrelated_messages() -> None:
    # Two stack dumps with the same 20 KB of frames; what tells them apart is at the end.
    frames = " ".join(f"at worker.step(engine.py:{100 + i})" for i in range(800))
    assert len(frames) > MINED_LINE_MAX
    disk = f"Traceback {frames} OSError: disk quota exceeded"
    peer = f"Traceback {frames} ConnectionError: peer reset connection"
    assert disk[-40:] in mined_text(disk) and len(mined_text(disk)) <= MINED_LINE_MAX
    detector = LogTemplateDetector()
    records = [LogRecord(stream={"pod": "p"}, line=line, ts=float(i)) for i, line in enumerate([disk, peer, disk])]
    state, _ = detector.detect(records, detector.initial_state())
    assert state.template_count() == 2
    assert all(len(stats.template) <= MINED_LINE_MAX for stats in state.templates.values())


def test_long_lines_of_one_message_still_group() -> None:
    lines = [" ".join(f"shard {i} loaded in {n + i} ms;" for i in range(300)) for n in (3, 5)]
    assert _groups(lines) == 1


@pytest.mark.parametrize(
    ("a", "b", "conflict"),
    [
        ("started", "stopped", True),
        ("msg=started", "msg=stopped", True),
        ("(sshd:auth):", "(sshd:session):", True),
        ("node-7", "node-8", False),
        ("blk_12", "blk_13", False),
        ("<NUM>", "ready", False),
        ("user=root", "user=<IP>", False),
        ("a.b", "a.b.c", False),
    ],
)
def test_which_tokens_count_as_different_words(a: str, b: str, conflict: bool) -> None:
    assert words_conflict(a, b) is conflict


def test_guarded_masks_mask_exactly_as_the_patterns_do() -> None:
    # A mask skips lines without its guard substring; that must never change what it masks.
    lines = [
        "GPU GPU-5d1f3c9e-8f4b-4e0a-9a41-0c2b6f7d8e11 at 0000:3b:00.0 from 10.0.0.1:8000",
        "fetch hdfs://node-7:9000/out/part-0 then /var/log/nvidia/x.log at 2024-05-21 10:15:33",
        "delete blk_-6952295868487656571 blk_12 for application_1445144423722_0020 and node-7.local:8030",
        "digest 113d3a99c3da401fbd62cc2caa5b96d2 value 0x404600 count -3 ratio 0.25",
        "plain words only, nothing to mask",
    ]
    for line in lines:
        guarded = line
        plain = line
        for instruction in masking_instructions(tuple(MASK_PATTERNS)):
            guarded = instruction.mask(guarded, "<", ">")
            plain = re.sub(MASK_PATTERNS[instruction.mask_with], f"<{instruction.mask_with}>", plain)
        assert guarded == plain
