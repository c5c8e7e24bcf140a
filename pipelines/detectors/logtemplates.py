"""Log-template mining (drain3) and the streaming log-template detector.

Every log line is masked (:mod:`pipelines.detectors.masking`) and fed to drain3's
:class:`~drain3.template_miner.TemplateMiner`, which files it under a template such as
``Received block <BLK> of size <NUM> from <IP>``. :class:`LogTemplateDetector` then watches the
templates and reports:

==================== ========================================================================
signal               when
==================== ========================================================================
log_new_template     a template is created after the warm-up (a line never seen before)
log_rare_template    a line matches a template seen only a handful of times so far
log_template_burst   a template's count in the current window is far above its EWMA baseline
cuda_oom             ``CUDA out of memory`` / ``torch.OutOfMemoryError``
gpu_xid              an ``NVRM: Xid`` line in a node's kernel stream, anchored (evidence: xid code,
                     PCI address); trusted for GPU faults
untrusted_xid_text   XID text anywhere else (an application echoing a prompt, a quoted line): an
                     observation that never supports a GPU runbook (evidence: ``quoted_xid``)
nccl_timeout         ``Watchdog caught collective operation timeout``
engine_dead          ``AsyncEngineDeadError`` / ``EngineDeadError`` / ``Engine loop is not running``
==================== ========================================================================

The miner's settings (similarity threshold, tree depth, word-conflict limit, masks) are
:data:`MINER_SETTINGS`, one row for every log: the detector's and ``bench/logparse.py``'s, which
measures it on LogHub. No setting depends on which system wrote the log.

Trust (docs/security.md): a line is a kernel line only when its stream is a node's kernel stream
(:class:`KernelStreams`, labels the log agent sets, never the application) *and* the line starts with
the kernel's own structure (an optional dmesg or journal prefix, then ``NVRM: Xid (PCI:...): N,``).
Every anomaly carries the :class:`~services.core.events.Provenance` of its stream.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal

from drain3 import TemplateMiner
from drain3.drain import Drain, LogCluster, Node
from drain3.template_miner_config import TemplateMinerConfig

from pipelines.detectors.masking import DEFAULT_MASKS, MASK_PATTERNS, generic_template, masking_instructions
from services.core.events import (
    FACT_GPU_FAULT,
    FACT_TOPOLOGY,
    SEVERITY_RANK,
    Anomaly,
    LogRecord,
    Provenance,
    Severity,
)
from services.core.fingerprint import fingerprint as core_fingerprint

EntityKind = Literal["gpu", "node", "pod", "model", "service", "other"]

DETECTOR_NAME = "log_templates"


@dataclass(frozen=True)
class MinerSettings:
    """How one drain3 miner masks and groups lines.

    Attributes:
        sim_th: Drain similarity threshold: the share of a template's constant tokens a line must
            repeat to join it; lower merges more.
        depth: Drain prefix-tree depth (root and length levels included), so ``depth - 2`` leading
            tokens route a line before similarity decides.
        max_children: widest a tree node may grow before further tokens share a wildcard child.
        max_clusters: templates kept (least recently used evicted); ``None`` keeps them all.
        masks: names from :data:`~pipelines.detectors.masking.MASK_PATTERNS`, in order.
        extra_masks: ``(name, regex)`` masks applied before ``masks``.
        extra_delimiters: characters split on besides whitespace.
        max_word_conflicts: most positions where a line and a template hold different words
            (:func:`words_conflict`) for the line still to join the template; ``None``: no limit
            (plain Drain). See :class:`WordAwareDrain`.
    """

    sim_th: float = 0.4
    depth: int = 4
    max_children: int = 100
    max_clusters: int | None = None
    masks: tuple[str, ...] = DEFAULT_MASKS
    extra_masks: tuple[tuple[str, str], ...] = ()
    extra_delimiters: tuple[str, ...] = ()
    max_word_conflicts: int | None = None


MINER_SETTINGS = MinerSettings(sim_th=0.3, depth=5, max_clusters=5000, max_word_conflicts=1)
"""The one settings row: the detector on cluster logs (vLLM, kernel, NCCL, Kubernetes) and
``bench/logparse.py`` on every LogHub system use it alike. ``sim_th``, ``depth`` and
``max_word_conflicts`` are what the bench's documented grid search picks on the LogHub samples
(docs/logparse.md, with the leave-one-system-out figures); the masks are the full library."""


_PUNCTUATION = string.punctuation
_SEPARATORS = re.compile(r"[^A-Za-z0-9]+")


def words_conflict(template_token: str, token: str) -> bool:
    """Whether two different tokens hold different *words*: the sign of two different messages.

    A word is a run of letters only. Two tokens conflict when, with the punctuation around them off,
    both are words (``started`` / ``stopped``), or both split at their inner punctuation into as many
    parts and some aligned parts are two different words (``msg=started`` / ``msg=stopped``,
    ``pam_unix(sshd:auth):`` / ``pam_unix(sshd:session):``). Placeholders written by the masks
    (``<NUM>``) never conflict, nor do parts holding a digit (``blk_12``, ``node-7``), which is how
    variables look.
    """
    if "<" in template_token or "<" in token:
        return False
    a = template_token.strip(_PUNCTUATION)
    b = token.strip(_PUNCTUATION)
    if a.isalpha() or b.isalpha():
        return a.isalpha() and b.isalpha()
    parts_a = _SEPARATORS.split(a)
    parts_b = _SEPARATORS.split(b)
    return len(parts_a) == len(parts_b) and any(
        x != y and x.isalpha() and y.isalpha() for x, y in zip(parts_a, parts_b, strict=True)
    )


class WordAwareDrain(Drain):
    """Drain whose similarity refuses a template that differs from the line in too many words.

    Drain's similarity is the share of equal tokens, so two messages that share a long prefix (or a
    long structure: JSON keys, ``key=value`` names) join one template however different their words
    are, and the words that told them apart become ``<*>``. Variables rarely look like words (they
    hold digits, or the masks caught them); words mostly are the message. So where the template and
    the line hold different words (:func:`words_conflict`), that counts as a *conflict*, and a
    template with more than ``max_word_conflicts`` of them is no match, whatever the share of equal
    tokens. Variables spelt as words (a user name, a state) still merge one position at a time when
    the limit is 1.
    """

    def __init__(self, *args: Any, max_word_conflicts: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_word_conflicts = max_word_conflicts

    def get_seq_distance(self, seq1: Sequence[str], seq2: Sequence[str], include_params: bool) -> tuple[float, int]:
        """Drain's ``(similarity, wildcard count)``, and similarity -1 past the word-conflict limit."""
        if self.max_word_conflicts is None:
            sim, params = super().get_seq_distance(seq1, seq2, include_params)
            return float(sim), int(params)
        if not seq1:
            return 1.0, 0
        equal = params = conflicts = 0
        wildcard = self.param_str
        limit = self.max_word_conflicts
        # Drain's loop, reordered for speed (equal tokens are the common case); the same counts.
        for template_token, token in zip(seq1, seq2, strict=True):
            if template_token == token:
                if template_token == wildcard:
                    params += 1
                else:
                    equal += 1
            elif template_token == wildcard:
                params += 1
            elif words_conflict(template_token, token):
                conflicts += 1
                if conflicts > limit:
                    return -1.0, params
        if include_params:
            equal += params
        return equal / len(seq1), params


def miner_config(settings: MinerSettings) -> TemplateMinerConfig:
    """Build a drain3 configuration in code (no ``drain3.ini`` is read).

    Args:
        settings: the miner settings.

    Returns:
        The configuration: masks, Drain parameters, profiling off, ``<NAME>`` placeholders.
    """
    config = TemplateMinerConfig()
    config.drain_sim_th = settings.sim_th
    config.drain_depth = settings.depth
    config.drain_max_children = settings.max_children
    config.drain_max_clusters = settings.max_clusters
    config.drain_extra_delimiters = list(settings.extra_delimiters)
    config.masking_instructions = masking_instructions(settings.masks, settings.extra_masks)
    config.mask_prefix = "<"
    config.mask_suffix = ">"
    config.parametrize_numeric_tokens = True
    config.profiling_enabled = False
    return config


def build_miner(settings: MinerSettings) -> TemplateMiner:
    """Return a drain3 miner with ``settings`` and no persistence handler.

    Its Drain is a :class:`WordAwareDrain` with the same parameters as the one drain3 built.

    Args:
        settings: the miner settings.
    """
    miner = TemplateMiner(persistence_handler=None, config=miner_config(settings))
    plain = miner.drain
    miner.drain = WordAwareDrain(
        depth=plain.log_cluster_depth,
        sim_th=plain.sim_th,
        max_children=plain.max_children,
        max_clusters=plain.max_clusters,
        extra_delimiters=plain.extra_delimiters,
        profiler=plain.profiler,
        param_str=plain.param_str,
        parametrize_numeric_tokens=plain.parametrize_numeric_tokens,
        max_word_conflicts=settings.max_word_conflicts,
    )
    return miner


# ------------------------------------------------------------------------------ offline mining


def mine_templates(contents: Sequence[str], settings: MinerSettings) -> list[str]:
    """Mine ``contents`` in order and return each line's final template, placeholders generic.

    Like logparser's Drain, a line gets the template its cluster has once every line is in, so
    lines of one cluster share one template string. Named placeholders become ``<*>``.

    Args:
        contents: message bodies (headers already stripped), in log order.
        settings: the miner settings.

    Returns:
        One template per input line.
    """
    miner = build_miner(settings)
    cluster_ids = [int(miner.add_log_message(content)["cluster_id"]) for content in contents]
    names = frozenset(MASK_PATTERNS) | frozenset(name for name, _ in settings.extra_masks)
    final = {cluster.cluster_id: generic_template(cluster.get_template(), names) for cluster in miner.drain.clusters}
    return [final[cid] for cid in cluster_ids]


def grouping_accuracy(truth: Sequence[str], predicted: Sequence[str]) -> float:
    """Share of lines grouped exactly right (logparser's grouping accuracy).

    A line is correct when the lines sharing its predicted template are exactly the lines sharing
    its true event id.

    Args:
        truth: the true event id of each line.
        predicted: the predicted template (or group id) of each line.

    Returns:
        The fraction of correctly grouped lines; 0.0 for no lines.

    Raises:
        ValueError: the sequences differ in length.
    """
    if len(truth) != len(predicted):
        raise ValueError(f"{len(truth)} true labels but {len(predicted)} predictions")
    if not truth:
        return 0.0
    true_groups: dict[str, set[int]] = {}
    predicted_groups: dict[str, set[int]] = {}
    for i, (t, p) in enumerate(zip(truth, predicted, strict=True)):
        true_groups.setdefault(t, set()).add(i)
        predicted_groups.setdefault(p, set()).add(i)
    correct = sum(1 for t, p in zip(truth, predicted, strict=True) if true_groups[t] == predicted_groups[p])
    return correct / len(truth)


def parsing_accuracy(truth: Sequence[str], predicted: Sequence[str]) -> float:
    """Share of lines whose predicted template equals the true one, whitespace normalised.

    Args:
        truth: the true template of each line.
        predicted: the predicted template of each line.

    Returns:
        The fraction of exact matches; 0.0 for no lines.

    Raises:
        ValueError: the sequences differ in length.
    """
    if len(truth) != len(predicted):
        raise ValueError(f"{len(truth)} true templates but {len(predicted)} predictions")
    if not truth:
        return 0.0
    same = sum(1 for t, p in zip(truth, predicted, strict=True) if " ".join(t.split()) == " ".join(p.split()))
    return same / len(truth)


# ------------------------------------------------------------------------- error signatures

_PCI_ID = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"

# What may come before NVRM in a kernel line, as the log agents ship it: a kmsg priority ("<4>"), a
# syslog or journal header ("Feb 23 16:24:18 node-1 kernel: ", ISO time too, or "kernel: "), a dmesg timestamp
# ("[ 1234.567890]") or dmesg -T's ("[Sun Feb 23 16:24:18 2025]"). Every part is bounded.
_SYSLOG_HEAD = (
    r"(?:[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}"
    r"|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?)"
    r" [\w.-]{1,253} kernel: ?"
    r"|kernel: ?"  # the syslog identifier alone, as some agents prefix the journal's MESSAGE
)
_DMESG_TIME = r"\[ {0,12}\d{1,12}\.\d{1,9}\]|\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4}\]"
KERNEL_LINE_MAX = 4096
"""Longest line read as a kernel XID line (the kernel's own printk buffer is 1024 bytes a record)."""
MINED_LINE_MAX = 16_384
"""Most characters of a line the template miner sees: a template keeps every token of its first line,
and ingest accepts lines of 256 KiB, so 5,000 templates of such lines would hold gigabytes. The known
signatures still read the whole line (their patterns run in linear time)."""
_CUT = " ... "


def mined_text(line: str) -> str:
    """What the miner sees of ``line``: all of it, or its head and tail when it is longer than
    :data:`MINED_LINE_MAX`.

    Keeping the tail as well as the head: two long lines that share a long head (a stack of frames,
    a JSON preamble) often differ only at the end, where the message is, and a head alone would make
    them one template.
    """
    if len(line) <= MINED_LINE_MAX:
        return line
    half = (MINED_LINE_MAX - len(_CUT)) // 2
    return line[:half] + _CUT + line[-half:]


# Anchored: the whole line is a kernel line. The code has at most 4 digits and is followed by a comma
# (or the end): "79" in "...: 79, pid=" but never 5000 digits or a code glued to more text.
_KERNEL_XID = re.compile(
    rf"^(?:<\d{{1,3}}>)?(?:{_SYSLOG_HEAD})?(?:(?:{_DMESG_TIME})[ \t]{{0,16}})?"
    rf"NVRM: Xid \((?:PCI:)?(?P<pci>{_PCI_ID})\): (?P<xid>\d{{1,4}})(?:,|$)"
    r"(?: pid=(?P<pid>'?[^,']{0,64}'?),)?(?: name=(?P<name>[^,]{0,256}),)?\s*(?P<message>.*)$"
)
# XID text anywhere in a line, however quoted or escaped: what an application echoing a prompt logs.
_XID_TEXT = re.compile(r"NVRM:\s{0,8}Xid|\bXid\s{0,8}\(\s{0,8}(?:PCI:)?[0-9a-fA-F]{2,8}:", re.IGNORECASE)
_XID_TEXT_CODE = re.compile(r"Xid\s{0,8}\([^()]{0,40}\)\s{0,8}:\s{0,8}(\d{1,4})(?!\d)", re.IGNORECASE)

# Xid codes whose usual remedy is draining the node and resetting or replacing the GPU. Codes that
# point at the application (13, 31, 43, 45) are warnings; anything unknown is a warning too.
_CRITICAL_XIDS: frozenset[int] = frozenset({48, 62, 64, 74, 79, 95, 119, 120, 140})
_INFO_XIDS: frozenset[int] = frozenset({43, 45})

_SIGNATURES: tuple[tuple[str, Severity, re.Pattern[str]], ...] = (
    (
        "engine_dead",
        "critical",
        re.compile(r"AsyncEngineDeadError|EngineDeadError|Engine loop is not running"),
    ),
    ("nccl_timeout", "critical", re.compile(r"Watchdog caught collective operation timeout")),
    ("cuda_oom", "critical", re.compile(r"CUDA out of memory|torch\.(?:cuda\.)?OutOfMemoryError")),
)

# Bounded: a number of at most 18 digits (int() refuses 4,300 or more: one such line used to crash the
# agent), at most 64 characters of op name and 256 between it and the timeout. An unbounded ".*?" made
# every "WorkNCCL(" of a line rescan the rest of it: quadratic time on a hostile line.
_NCCL_DETAIL = re.compile(
    r"WorkNCCL\(SeqNum=(?P<seq>\d{1,18}), OpType=(?P<op>\w{1,64})[^\n]{0,256}?"
    r"Timeout\(ms\)=(?P<timeout_ms>\d{1,18})(?!\d)"
)
_ERROR_WORDS = re.compile(r"(?i)\b(?:error|fatal|exception|panic|fail(?:ed|ure)?|traceback)\b")


@dataclass(frozen=True)
class SignatureMatch:
    """A known error signature found in one log line.

    Attributes:
        signal: the anomaly signal (``gpu_xid``, ``cuda_oom``...).
        severity: its severity.
        details: signature-specific evidence (xid code and PCI address for ``gpu_xid``).
    """

    signal: str
    severity: Severity
    details: dict[str, Any] = field(default_factory=dict)


def xid_severity(xid: int) -> Severity:
    """Return the severity of an NVIDIA Xid code (critical for node-level GPU faults)."""
    if xid in _CRITICAL_XIDS:
        return "critical"
    if xid in _INFO_XIDS:
        return "info"
    return "warning"


def match_kernel_xid(line: str) -> SignatureMatch | None:
    """Return the ``gpu_xid`` signature when ``line`` is, as a whole, an NVRM Xid kernel line.

    The match is anchored at the start of the line (after an optional kmsg, journal or dmesg prefix)
    and the code is 1-4 digits followed by a comma: an XID quoted inside other text never matches.

    Args:
        line: a raw log line, from a stream already known to be a node's kernel stream.
    """
    if len(line) > KERNEL_LINE_MAX:
        return None
    xid = _KERNEL_XID.match(line)
    if xid is None:
        return None
    code = int(xid.group("xid"))
    details: dict[str, Any] = {"xid": code, "pci": xid.group("pci")}
    if xid.group("pid"):
        details["pid"] = xid.group("pid").strip("'")
    details["message"] = xid.group("message").strip()
    return SignatureMatch("gpu_xid", xid_severity(code), details)


def match_xid_text(line: str) -> SignatureMatch | None:
    """Return an ``untrusted_xid_text`` observation when ``line`` contains XID text anywhere.

    What an application (or anything not a node's kernel stream) logs about XIDs is not a GPU fault:
    a vLLM request log echoes whatever prompt a user sent. The quoted code, if one can be read, is kept
    as ``quoted_xid`` for humans, never as ``xid``.

    Args:
        line: a raw log line.
    """
    if _XID_TEXT.search(line) is None:
        return None
    details: dict[str, Any] = {}
    code = _XID_TEXT_CODE.search(line)
    if code is not None:
        details["quoted_xid"] = int(code.group(1))
    return SignatureMatch("untrusted_xid_text", "warning", details)


def match_signature(line: str, kernel: bool = False) -> SignatureMatch | None:
    """Return the known error signature in ``line``, if any.

    Args:
        line: a raw log line.
        kernel: whether the line comes from a node's own kernel stream (:class:`KernelStreams`); only
            then can it be a ``gpu_xid``. XID text in any other line is ``untrusted_xid_text``.
    """
    if kernel:
        xid = match_kernel_xid(line)
        if xid is not None:
            return xid
    text = match_xid_text(line)
    if text is not None:
        return text
    for signal, severity, pattern in _SIGNATURES:
        if pattern.search(line):
            extra: dict[str, Any] = {}
            if signal == "nccl_timeout" and (detail := _NCCL_DETAIL.search(line)) is not None:
                extra = {
                    "seq": int(detail.group("seq")),
                    "op": detail.group("op"),
                    "timeout_ms": int(detail.group("timeout_ms")),
                }
            return SignatureMatch(signal, severity, extra)
    return None


# --------------------------------------------------------------------------- kernel streams

DEFAULT_KERNEL_STREAMS = "unit=kernel;transport=kernel"
"""Loki stream selectors of a node's kernel log: the simulator's and journald's ``unit="kernel"``, and
``transport="kernel"`` as promtail or Grafana Alloy relabel journald's ``_TRANSPORT``."""
# A pod's log stream is never a kernel stream, whatever other labels it carries.
_NOT_KERNEL_LABELS = ("pod", "container")


@dataclass(frozen=True)
class KernelStreams:
    """Which Loki streams are a node's own kernel log (setting ``trust_kernel_log_streams``).

    Stream labels are set by the log agent (promtail, Grafana Alloy, the simulator), not by the
    application that wrote the line, so they can say where a line came from. A stream is a kernel stream
    when it matches one selector (every ``label=value`` of it) and has no ``pod`` or ``container`` label.

    Attributes:
        selectors: each a tuple of (label, value) pairs that must all match.
    """

    selectors: tuple[tuple[tuple[str, str], ...], ...] = ((("unit", "kernel"),), (("transport", "kernel"),))

    @classmethod
    def parse(cls, text: str) -> KernelStreams:
        """Parse ``label=value[,label=value][;...]`` (``;`` separates alternatives).

        Raises:
            ValueError: an alternative is empty or a pair has no ``=``.
        """
        selectors = []
        for alternative in text.split(";"):
            if not alternative.strip():
                continue
            pairs = []
            for pair in alternative.split(","):
                label, eq, value = pair.partition("=")
                if not eq or not label.strip() or not value.strip():
                    raise ValueError(f"kernel stream selector {alternative!r}: expected label=value[,label=value]")
                pairs.append((label.strip(), value.strip()))
            selectors.append(tuple(pairs))
        if not selectors:
            raise ValueError("kernel stream selector is empty: no stream could carry a trusted XID")
        return cls(tuple(selectors))

    def matches(self, stream: dict[str, str]) -> bool:
        """Whether a stream (its labels) is a node's kernel stream."""
        if any(stream.get(label) for label in _NOT_KERNEL_LABELS):
            return False
        return any(all(stream.get(k) == v for k, v in selector) for selector in self.selectors)


def stream_text(stream: dict[str, str]) -> str:
    """Loki's ``{a="b",...}`` form of stream labels, sorted and cut to fit a provenance."""
    text = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(stream.items())) + "}"
    return text[:500]


def log_provenance(record: LogRecord, kernel: bool) -> Provenance:
    """The provenance of an anomaly from ``record``: a kernel log is trusted for GPU faults, an app log not.

    Both are telemetry ClusterMedic collected (its stream labels come from the log agent), so both can
    name a target and corroborate a webhook alert.
    """
    if kernel:
        return Provenance(
            source="kernel_log", stream=stream_text(record.stream), trusted=(FACT_GPU_FAULT, FACT_TOPOLOGY)
        )
    return Provenance(source="app_log", stream=stream_text(record.stream), trusted=(FACT_TOPOLOGY,))


# --------------------------------------------------------------------------------- state


@dataclass
class TemplateStats:
    """What the detector remembers about one template.

    Attributes:
        template: the template as last mined.
        example: the first line filed under it.
        count: lines filed under it.
        first_ts: time of the first line.
        last_ts: time of the latest line.
        window: index of the current window (``floor(ts / window_s)``).
        window_count: lines in the current window.
        ewma_count: EWMA of the per-window count over closed windows (empty windows count).
        windows: closed windows folded into ``ewma_count``.
        burst_reported: whether the current window already raised a burst.
    """

    template: str
    example: str
    count: int = 0
    first_ts: float = 0.0
    last_ts: float = 0.0
    window: int = 0
    window_count: int = 0
    ewma_count: float = 0.0
    windows: int = 0
    burst_reported: bool = False


class LogTemplateState:
    """The detector's state: the drain3 miner (clusters and prefix tree) and per-template stats.

    The live miner is kept between batches, so scoring costs no rebuild; :meth:`to_dict` and
    :meth:`from_dict` turn it into plain JSON values (no pickle) for a state table or a snapshot.

    Args:
        settings: the miner settings.
        miner: an existing miner; a fresh one is built when ``None``.
        templates: per-template stats keyed by drain3 cluster id.
        lines: lines seen so far.
    """

    VERSION = 1

    def __init__(
        self,
        settings: MinerSettings,
        miner: TemplateMiner | None = None,
        templates: dict[int, TemplateStats] | None = None,
        lines: int = 0,
    ) -> None:
        self.settings = settings
        self.miner = miner if miner is not None else build_miner(settings)
        self.templates: dict[int, TemplateStats] = templates if templates is not None else {}
        self.lines = lines

    def template_count(self) -> int:
        """Return how many templates the miner holds."""
        return len(self.miner.drain.id_to_cluster)

    def to_dict(self) -> dict[str, Any]:
        """Return the state as JSON-compatible values."""
        drain = self.miner.drain
        clusters = [
            {"id": c.cluster_id, "tokens": list(c.log_template_tokens), "size": c.size}
            for c in drain.id_to_cluster.values()
        ]
        settings = asdict(self.settings)
        settings["extra_masks"] = [list(m) for m in self.settings.extra_masks]
        return {
            "version": self.VERSION,
            "settings": settings,
            "lines": self.lines,
            "drain": {
                "clusters_counter": drain.clusters_counter,
                "clusters": clusters,
                "tree": _node_to_dict(drain.root_node),
            },
            "templates": {str(cid): asdict(st) for cid, st in self.templates.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LogTemplateState:
        """Rebuild a state written by :meth:`to_dict`.

        Raises:
            ValueError: the data is not a state this version can read.
        """
        if data.get("version") != cls.VERSION:
            raise ValueError(f"log-template state version {data.get('version')!r} is not {cls.VERSION}")
        raw = dict(data["settings"])
        raw["masks"] = tuple(raw["masks"])
        raw["extra_masks"] = tuple((str(n), str(p)) for n, p in raw["extra_masks"])
        raw["extra_delimiters"] = tuple(raw["extra_delimiters"])
        settings = MinerSettings(**raw)
        templates = {int(cid): TemplateStats(**st) for cid, st in data["templates"].items()}
        miner = build_miner(settings)
        drain = miner.drain
        clusters = sorted(
            data["drain"]["clusters"],
            # Re-insert least recently seen first, so an LRU-bounded miner evicts in the same order.
            key=lambda c: (templates[c["id"]].last_ts if c["id"] in templates else 0.0, c["id"]),
        )
        for c in clusters:
            cluster = LogCluster(c["tokens"], int(c["id"]))
            cluster.size = int(c["size"])
            drain.id_to_cluster[cluster.cluster_id] = cluster
        drain.clusters_counter = int(data["drain"]["clusters_counter"])
        drain.root_node = _node_from_dict(data["drain"]["tree"])
        return cls(settings, miner, templates, int(data["lines"]))

    def to_json(self) -> str:
        """Serialise to a JSON string."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> LogTemplateState:
        """Rebuild a state from :meth:`to_json` output."""
        return cls.from_dict(json.loads(raw))


def _node_to_dict(node: Node) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if node.cluster_ids:
        out["ids"] = list(node.cluster_ids)
    if node.key_to_child_node:
        out["children"] = {key: _node_to_dict(child) for key, child in node.key_to_child_node.items()}
    return out


def _node_from_dict(data: dict[str, Any]) -> Node:
    node = Node()
    node.cluster_ids = [int(i) for i in data.get("ids", [])]
    node.key_to_child_node = {key: _node_from_dict(child) for key, child in data.get("children", {}).items()}
    return node


# ------------------------------------------------------------------------------ detector


@dataclass(frozen=True)
class LogTemplateDetector:
    """Streaming anomaly detector over log templates and known GPU/serving error signatures.

    Pure: :meth:`detect` reads only the batch and the state; time comes from each record's ``ts``.
    The state passed in is updated in place and returned; keep only the returned one.

    Attributes:
        settings: drain3 miner settings (:data:`MINER_SETTINGS`, the one row).
        warmup_lines: lines to learn from before new and rare templates are reported.
        rare_max_count: a template seen at most this many times (this line included) is rare...
        rare_max_share: ...when it is also at most this share of all lines seen.
        window_s: width of the rate window, seconds.
        ewma_alpha: weight of the newest closed window in a template's baseline.
        burst_factor: a window count this many times the baseline (the anomaly's threshold) is a burst.
        burst_min_count: fewest lines in a window for a burst.
        burst_min_windows: closed windows a template needs before its baseline is trusted.
        burst_floor: lowest baseline (lines a window) a count is compared with.
        kernel_streams: which streams are a node's kernel log (the only ones a ``gpu_xid`` comes from).
    """

    name: ClassVar[str] = DETECTOR_NAME
    consumes: ClassVar[type] = LogRecord
    signals: ClassVar[frozenset[str]] = frozenset(
        {"log_new_template", "log_rare_template", "log_template_burst", "gpu_xid", "untrusted_xid_text"}
        | {signal for signal, _, _ in _SIGNATURES}
    )

    settings: MinerSettings = MINER_SETTINGS
    warmup_lines: int = 500
    rare_max_count: int = 3
    rare_max_share: float = 0.001
    window_s: float = 60.0
    ewma_alpha: float = 0.3
    burst_factor: float = 5.0
    burst_min_count: int = 20
    burst_min_windows: int = 5
    burst_floor: float = 1.0
    kernel_streams: KernelStreams = field(default_factory=KernelStreams)

    @classmethod
    def from_settings(cls, settings: Any) -> LogTemplateDetector:
        """The detector with the kernel-stream selector of ``settings.trust_kernel_log_streams``."""
        return cls(kernel_streams=KernelStreams.parse(settings.trust_kernel_log_streams))

    def initial_state(self) -> LogTemplateState:
        """Return an empty state for this detector's settings."""
        return LogTemplateState(self.settings)

    def detect(self, batch: Sequence[LogRecord], state: LogTemplateState) -> tuple[LogTemplateState, list[Anomaly]]:
        """Mine a micro-batch of log lines and return the updated state and the anomalies.

        Per batch, a signature fires once per (entity, signal, detail) with the number of lines
        that matched; a new or rare template fires once per (entity, template).

        Args:
            batch: log records, in arrival order.
            state: the state returned by the previous call (or :meth:`initial_state`).

        Returns:
            The updated state and the anomalies, in the order their first line arrived.
        """
        found: dict[tuple[str, ...], _Pending] = {}
        for record in batch:
            line = record.line.rstrip()
            if not line.strip():
                continue
            state.lines += 1
            result = state.miner.add_log_message(mined_text(line))
            cid = int(result["cluster_id"])
            stats = state.templates.get(cid)
            if stats is None:
                stats = TemplateStats(
                    template=str(result["template_mined"]),
                    example=line,
                    first_ts=record.ts,
                    window=self._window(record.ts),
                )
                state.templates[cid] = stats
            stats.template = str(result["template_mined"])
            self._count(stats, record.ts)
            entity = record.entity or record.key()
            warm = state.lines > self.warmup_lines

            kernel = self.kernel_streams.matches(record.stream)
            signature = match_signature(line, kernel=kernel)
            if signature is not None:
                discriminator = tuple(str(v) for k, v in signature.details.items() if k in ("xid", "pci"))
                key = (entity, signature.signal, *discriminator)
                pending = found.get(key)
                if pending is None:
                    found[key] = _Pending(
                        record,
                        signature.signal,
                        signature.severity,
                        cid,
                        stats,
                        1.0,
                        1.0,
                        dict(signature.details),
                        kernel=kernel,
                    )
                else:
                    pending.lines += 1
            elif warm and result["change_type"] == "cluster_created":
                found.setdefault(
                    (entity, "log_new_template", str(cid)),
                    _Pending(
                        record,
                        "log_new_template",
                        _line_severity(line, "warning"),
                        cid,
                        stats,
                        1.0,
                        1.0,
                        {},
                        kernel=kernel,
                    ),
                )
            elif warm and stats.count <= self.rare_max_count and stats.count / state.lines <= self.rare_max_share:
                key = (entity, "log_rare_template", str(cid))
                if key in found:
                    found[key].lines += 1
                else:
                    share = stats.count / state.lines
                    found[key] = _Pending(
                        record,
                        "log_rare_template",
                        _line_severity(line, "info"),
                        cid,
                        stats,
                        1.0 - share,
                        1.0 - self.rare_max_share,
                        {"share": share},
                        kernel=kernel,
                    )

            burst = self._burst(stats)
            if burst is not None:
                score, baseline = burst
                stats.burst_reported = True
                found[(entity, "log_template_burst", str(cid), str(stats.window))] = _Pending(
                    record,
                    "log_template_burst",
                    "warning",
                    cid,
                    stats,
                    score,
                    self.burst_factor,
                    {
                        "rate": stats.window_count / self.window_s,
                        "baseline_rate": baseline / self.window_s,
                        "window_s": self.window_s,
                        "window_count": stats.window_count,
                        "baseline_count": baseline,
                    },
                    kernel=kernel,
                )

        self._forget_evicted(state)
        return state, [pending.anomaly(key) for key, pending in found.items()]

    # -- windows and bursts

    def _window(self, ts: float) -> int:
        return math.floor(ts / self.window_s)

    def _count(self, stats: TemplateStats, ts: float) -> None:
        window = self._window(ts)
        if window > stats.window:
            # Close the current window, then fold in the empty windows since (capped: after a long
            # silence the baseline is simply near zero).
            closed = stats.window_count
            if stats.windows == 0:
                stats.ewma_count = float(closed)
            else:
                stats.ewma_count += self.ewma_alpha * (closed - stats.ewma_count)
            empty = min(window - stats.window - 1, 10_000)
            stats.ewma_count *= (1.0 - self.ewma_alpha) ** empty
            stats.windows += 1 + empty
            stats.window = window
            stats.window_count = 0
            stats.burst_reported = False
        # A late line (older window) counts in the current one: windows only move forward.
        stats.window_count += 1
        stats.count += 1
        stats.last_ts = max(stats.last_ts, ts)

    def _burst(self, stats: TemplateStats) -> tuple[float, float] | None:
        if stats.burst_reported or stats.windows < self.burst_min_windows:
            return None
        if stats.window_count < self.burst_min_count:
            return None
        baseline = max(stats.ewma_count, self.burst_floor)
        score = stats.window_count / baseline
        return (score, baseline) if score >= self.burst_factor else None

    @staticmethod
    def _forget_evicted(state: LogTemplateState) -> None:
        clusters = state.miner.drain.id_to_cluster
        if len(state.templates) > len(clusters):
            for cid in [cid for cid in state.templates if cid not in clusters]:
                del state.templates[cid]


def _line_severity(line: str, default: Severity) -> Severity:
    """Raise a template anomaly to warning when its line reads like an error."""
    if _ERROR_WORDS.search(line) and SEVERITY_RANK[default] < SEVERITY_RANK["warning"]:
        return "warning"
    return default


def _entity_kind(record: LogRecord) -> EntityKind:
    if record.entity.startswith(("GPU-", "MIG-")):
        return "gpu"
    if record.entity:
        return "other"
    if "pod" in record.stream:
        return "pod"
    if any(label in record.stream for label in ("node", "Hostname", "hostname")):
        return "node"
    return "other"


@dataclass
class _Pending:
    """An anomaly being gathered over one batch."""

    record: LogRecord
    signal: str
    severity: Severity
    template_id: int
    stats: TemplateStats
    score: float
    threshold: float
    details: dict[str, Any]
    lines: int = 1
    kernel: bool = False

    def anomaly(self, key: tuple[str, ...]) -> Anomaly:
        entity = key[0]
        evidence: dict[str, Any] = {
            "template": self.stats.template,
            "template_id": self.template_id,
            "example": self.record.line.rstrip()[:2000],
            "count": self.stats.count,
            "lines_in_batch": self.lines,
            "score": self.score,
            "threshold": self.threshold,
            **self.details,
        }
        return Anomaly(
            entity=entity,
            entity_kind=_entity_kind(self.record),
            provenance=log_provenance(self.record, kernel=self.kernel),
            signal=self.signal,
            detector=DETECTOR_NAME,
            score=self.score,
            threshold=self.threshold,
            severity=self.severity,
            ts=self.record.ts,
            labels=dict(self.record.stream),
            evidence=evidence,
            fingerprint=core_fingerprint(DETECTOR_NAME, *key),
        )
