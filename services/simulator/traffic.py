"""Request arrivals: replay of the Azure LLM inference traces, or a synthetic Poisson generator.

Both produce :class:`~services.simulator.serving.ClassArrivals` per step (counts and mean lengths per
context class), which is all the fluid serving model needs. Both draw only from the generator they
are given, so a seed fixes the whole arrival process. Faults add temporary extra load through
:meth:`Traffic.add_surge` and :meth:`Traffic.add_long_context_burst`.
"""

from __future__ import annotations

import csv
import math
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.core.errors import ConfigError
from services.core.paths import shared_data_dir
from services.simulator.serving import CLASS_BOUNDS, ClassArrivals

# Up to this many requests in a step are grouped by class in plain Python (numpy's per-call cost
# dominates for a handful); more go through searchsorted/bincount. Both give the same bits.
_FEW_REQUESTS = 64
TRACE_DIR = Path("llm_traces") / "azure_llm_inference_2023"
TRACE_FILES = {"code": "AzureLLMInferenceTrace_code.csv", "conv": "AzureLLMInferenceTrace_conv.csv"}


def trace_path(kind: str) -> Path:
    """Path of one Azure trace CSV under the shared data folder.

    Raises:
        ConfigError: the shared folder or the file is absent, with what to do about it.
    """
    if kind not in TRACE_FILES:
        raise ConfigError(f"unknown trace {kind!r}; choose one of {sorted(TRACE_FILES)}")
    path = shared_data_dir() / TRACE_DIR / TRACE_FILES[kind]
    if not path.is_file():
        raise ConfigError(
            f"Azure LLM inference trace {path} is absent: put the public 2023 trace there "
            "(see shared/data/llm_traces/*/SOURCE.txt) or use synthetic traffic"
        )
    return path


def load_trace(kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read one trace: (arrival seconds from the first request, context tokens, generated tokens)."""
    times: list[np.datetime64] = []
    ctx: list[int] = []
    gen: list[int] = []
    with trace_path(kind).open(newline="") as fh:
        for row in csv.DictReader(fh):
            stamp = row["TIMESTAMP"].strip().replace(" ", "T")
            times.append(np.datetime64(stamp[:26], "us"))
            ctx.append(int(row["ContextTokens"]))
            gen.append(int(row["GeneratedTokens"]))
    t = np.array(times, dtype="datetime64[us]")
    sec = (t - t.min()).astype(np.int64) / 1e6
    order = np.argsort(sec, kind="stable")
    return sec[order], np.array(ctx, dtype=float)[order], np.array(gen, dtype=float)[order]


@dataclass
class _Extra:
    start: float
    end: float
    rps: float
    prompt_lo: float
    prompt_hi: float
    output_mean: float


class Traffic:
    """Base: turns individual requests of one step into class aggregates and applies fault load."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self._surges: list[tuple[float, float, float]] = []
        self._extras: list[_Extra] = []
        self._bounds = np.array(CLASS_BOUNDS, dtype=float)
        self._bound_list = self._bounds.tolist()

    def add_surge(self, start: float, end: float, factor: float) -> None:
        """Multiply the request rate by ``factor`` between ``start`` and ``end``."""
        self._surges.append((start, end, factor))

    def add_long_context_burst(
        self, start: float, end: float, rps: float, prompt_lo: float, prompt_hi: float, output_mean: float = 300.0
    ) -> None:
        """Add long-prompt requests (RAG dumps, whole-repo prompts) at ``rps`` between the times."""
        self._extras.append(_Extra(start, end, rps, prompt_lo, prompt_hi, output_mean))

    def surge_factor(self, t: float) -> float:
        """Product of the surges active at ``t``."""
        f = 1.0
        for s, e, k in self._surges:
            if s <= t < e:
                f *= k
        return f

    def requests(self, t: float, dt: float) -> tuple[np.ndarray, np.ndarray]:
        """Prompt and output tokens of each request arriving in [t, t+dt)."""
        raise NotImplementedError

    def arrivals(self, t: float, dt: float) -> ClassArrivals:
        """Requests of the step, aggregated per context class."""
        prompt, output = self.requests(t, dt)
        for ex in self._extras:
            if ex.start <= t < ex.end:
                k = int(self.rng.poisson(ex.rps * dt))
                if k:
                    prompt = np.concatenate([prompt, self.rng.uniform(ex.prompt_lo, ex.prompt_hi, k)])
                    output = np.concatenate([output, self.rng.exponential(ex.output_mean, k) + 1.0])
        n_cls = len(self._bounds)
        if prompt.size == 0:
            z = np.zeros(n_cls)
            return ClassArrivals(z, z.copy(), z.copy())
        if prompt.size <= _FEW_REQUESTS:
            return self._aggregate_few(prompt.tolist(), output.tolist())
        cls = np.searchsorted(self._bounds, prompt + output, side="left")
        counts = np.bincount(cls, minlength=n_cls + 1).astype(float)
        psum = np.bincount(cls, weights=prompt, minlength=n_cls + 1)
        osum = np.bincount(cls, weights=output, minlength=n_cls + 1)
        safe = np.maximum(counts[:n_cls], 1.0)
        return ClassArrivals(counts[:n_cls], psum[:n_cls] / safe, osum[:n_cls] / safe, int(counts[n_cls]))

    def _aggregate_few(self, prompt: list[float], output: list[float]) -> ClassArrivals:
        """``arrivals``' per-class aggregation for a few requests, in Python floats.

        Gives the same bits as the numpy version: ``searchsorted(side="left")`` is ``bisect_left``,
        and ``bincount`` with weights adds each request to its class's sum in request order.
        """
        n_cls = len(CLASS_BOUNDS)
        counts = [0] * (n_cls + 1)
        psum = [0.0] * (n_cls + 1)
        osum = [0.0] * (n_cls + 1)
        for p, o in zip(prompt, output, strict=True):
            c = bisect_left(self._bound_list, p + o)
            counts[c] += 1
            psum[c] += p
            osum[c] += o
        safe = [float(k) if k >= 1 else 1.0 for k in counts[:n_cls]]
        return ClassArrivals(
            np.array(counts[:n_cls], dtype=float),
            np.array([x / d for x, d in zip(psum, safe, strict=False)]),
            np.array([x / d for x, d in zip(osum, safe, strict=False)]),
            counts[n_cls],
        )


class TraceTraffic(Traffic):
    """Replay of the Azure LLM inference trace, time-scaled and looped.

    Args:
        rng: generator (used for fault-added load only; the replay itself is deterministic).
        kind: ``conv``, ``code`` or ``both`` (merged).
        time_scale: >1 plays the trace faster (more requests per simulated second).
        copies: overlay this many time-shifted copies to load a bigger cluster.
    """

    def __init__(self, rng: np.random.Generator, kind: str = "conv", time_scale: float = 1.0, copies: int = 1) -> None:
        super().__init__(rng)
        kinds = ["code", "conv"] if kind == "both" else [kind]
        parts = [load_trace(k) for k in kinds]
        sec = np.concatenate([p[0] for p in parts]) / time_scale
        ctx = np.concatenate([p[1] for p in parts])
        gen = np.concatenate([p[2] for p in parts])
        mean_gap = (sec.max() - sec.min()) / max(1, sec.size - 1)
        self.period = float(sec.max() + mean_gap)
        if copies > 1:
            shifts = np.arange(copies) * self.period / copies
            sec = (sec[None, :] + shifts[:, None]).ravel() % self.period
            ctx = np.tile(ctx, copies)
            gen = np.tile(gen, copies)
        order = np.argsort(sec, kind="stable")
        self.sec, self.ctx, self.gen = sec[order], ctx[order], np.maximum(gen[order], 1.0)

    def requests(self, t: float, dt: float) -> tuple[np.ndarray, np.ndarray]:
        """Trace requests falling in [t, t+dt) of the looped timeline."""
        lo = t % self.period
        hi = lo + dt
        i, j = np.searchsorted(self.sec, [lo, min(hi, self.period)])
        prompt, output = self.ctx[i:j], self.gen[i:j]
        if hi > self.period:  # the step straddles the loop point
            k = np.searchsorted(self.sec, hi - self.period)
            prompt = np.concatenate([prompt, self.ctx[:k]])
            output = np.concatenate([output, self.gen[:k]])
        f = self.surge_factor(t)
        if f > 1.0 and prompt.size:
            # A surge replays extra requests drawn from the same step's mix.
            extra = self.rng.integers(0, prompt.size, int(self.rng.poisson((f - 1.0) * prompt.size)))
            prompt = np.concatenate([prompt, prompt[extra]])
            output = np.concatenate([output, output[extra]])
        return prompt, output


class SyntheticTraffic(Traffic):
    """Poisson arrivals with a diurnal curve and random bursts; log-normal lengths.

    Args:
        rng: generator for every draw.
        base_rps: mean requests per second over a day.
        diurnal_amplitude: relative swing of the daily curve (0.4: peak is 1.4x the mean).
        peak_hour: simulated hour of the daily peak.
        bursts_per_hour: mean rate of traffic bursts.
        burst_factor: mean rate multiplier during a burst.
        burst_s: mean burst length.
        prompt_median: median prompt tokens.
        output_median: median output tokens.
        start_hour: hour of day at simulated time 0.
    """

    def __init__(
        self,
        rng: np.random.Generator,
        base_rps: float = 10.0,
        diurnal_amplitude: float = 0.35,
        peak_hour: float = 15.0,
        bursts_per_hour: float = 2.0,
        burst_factor: float = 1.6,
        burst_s: float = 120.0,
        prompt_median: float = 900.0,
        output_median: float = 180.0,
        start_hour: float = 9.0,
    ) -> None:
        super().__init__(rng)
        self.base_rps = base_rps
        self.amp = diurnal_amplitude
        self.peak_hour = peak_hour
        self.burst_rate = bursts_per_hour / 3600.0
        self.burst_factor = burst_factor
        self.burst_s = burst_s
        self.prompt_mu = math.log(prompt_median)
        self.output_mu = math.log(output_median)
        self.start_hour = start_hour
        self._burst_until = -1.0
        self._burst_k = 1.0

    def rate(self, t: float) -> float:
        """Expected requests per second at simulated time ``t`` (before bursts and surges)."""
        hour = (self.start_hour + t / 3600.0) % 24.0
        return self.base_rps * (1.0 + self.amp * math.cos(2 * math.pi * (hour - self.peak_hour) / 24.0))

    def requests(self, t: float, dt: float) -> tuple[np.ndarray, np.ndarray]:
        """Poisson draw for the step, lengths log-normal (clipped to 128k)."""
        if t >= self._burst_until and self.rng.random() < self.burst_rate * dt:
            self._burst_until = t + float(self.rng.exponential(self.burst_s))
            self._burst_k = 1.0 + float(self.rng.exponential(self.burst_factor - 1.0))
        lam = self.rate(t) * self.surge_factor(t) * (self._burst_k if t < self._burst_until else 1.0)
        n = int(self.rng.poisson(lam * dt))
        prompt = np.minimum(self.rng.lognormal(self.prompt_mu, 1.0, n).round() + 1.0, 120000.0)
        output = np.minimum(self.rng.lognormal(self.output_mu, 0.8, n).round() + 1.0, 4096.0)
        return prompt, output

    def forecast_rate(self, t: float) -> float:
        """The deterministic part of the rate (what a capacity planner could know)."""
        return self.rate(t)
