"""Check the NVML collector against a real GPU: readings follow the load and agree with nvidia-smi.

    python bench/gpu_nvml_check.py [--load-seconds 25] [--alloc-gib 32] [--out DIR]

Needs an NVIDIA GPU, its driver, ``pynvml`` (nvidia-ml-py) and PyTorch with CUDA (to put a known load
on the GPU); it imports nothing else of ClusterMedic than :mod:`services.ingest.nvml`, which needs only
the standard library, so it runs on a bare GPU host. Phases: idle readings; a known allocation plus a
bf16 matmul loop; idle again. Every reading is paired with ``nvidia-smi --query-gpu`` taken right after
it. Prints one JSON object (and writes it, with a sample of the /metrics text, to ``--out``): per-phase
means, agreement with nvidia-smi, the collect() cost, and pass/fail of each check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.ingest.nvml import NvmlCollector, exposition

SMI_FIELDS = ("utilization.gpu", "memory.used", "temperature.gpu", "power.draw", "clocks.sm")
OURS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_SM_CLOCK")


def smi() -> dict[str, float]:
    """GPU 0 as nvidia-smi reports it, in the same units as the DCGM fields."""
    out = subprocess.run(
        ["nvidia-smi", "-i", "0", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()
    return {ours: float(v) for ours, v in zip(OURS, out.split(","), strict=True)}


def gpu0(samples: list[Any]) -> dict[str, float]:
    return {s.name: s.value for s in samples if s.labels["gpu"] == "0"}


def sample_phase(collector: NvmlCollector, name: str, seconds: float, every: float) -> list[dict[str, Any]]:
    rows = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ours = gpu0(collector.collect())
        rows.append({"phase": name, "t": time.time(), "ours": ours, "smi": smi()})
        time.sleep(every)  # a sampling interval, not synchronisation
    return rows


def mean(rows: list[dict[str, Any]], field: str, source: str = "ours") -> float:
    return statistics.fmean(r[source][field] for r in rows if field in r[source])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--load-seconds", type=float, default=25.0)
    ap.add_argument("--alloc-gib", type=float, default=32.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import torch

    result: dict[str, Any] = {}
    with NvmlCollector() as collector:
        first = collector.collect()
        result["gpus"] = collector.gpus
        result["fields_read"] = sorted({s.name for s in first if s.labels["gpu"] == "0"})
        result["unsupported"] = collector.unsupported
        result["xid_events_registered"] = collector.xid_events

        costs = []
        for _ in range(200):
            t0 = time.perf_counter()
            collector.collect()
            costs.append((time.perf_counter() - t0) * 1000)
        costs.sort()
        result["collect_ms"] = {"p50": round(costs[100], 3), "p99": round(costs[197], 3), "gpus": len(collector.gpus)}

        idle = sample_phase(collector, "idle", 4.0, 0.5)

        torch.cuda.init()
        block = torch.empty(int(args.alloc_gib * 1024**3), dtype=torch.uint8, device="cuda")
        block.fill_(1)
        torch.cuda.synchronize()
        reserved_mib = torch.cuda.memory_reserved() / 1024**2
        mats = [torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        stop = threading.Event()

        def burn() -> None:
            while not stop.is_set():
                for _ in range(50):
                    torch.mm(mats[0], mats[1])
                torch.cuda.synchronize()

        energy0 = gpu0(collector.collect()).get("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
        t_energy0 = time.monotonic()
        worker = threading.Thread(target=burn, daemon=True)
        worker.start()
        time.sleep(3.0)  # let clocks and power settle before sampling the loaded phase
        load = sample_phase(collector, "load", args.load_seconds, 1.0)
        energy1 = gpu0(collector.collect()).get("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
        t_energy1 = time.monotonic()
        stop.set()
        worker.join()
        del block
        mats.clear()
        torch.cuda.empty_cache()
        after = sample_phase(collector, "after", 4.0, 0.5)
        exposition_text = exposition(collector.collect())

    phases = {"idle": idle, "load": load, "after": after}
    result["phases"] = {
        name: {f: {"ours": round(mean(rows, f), 1), "nvidia_smi": round(mean(rows, f, "smi"), 1)} for f in OURS}
        | {"readings": len(rows)}
        for name, rows in phases.items()
    }
    every = idle + load + after
    result["max_abs_diff_vs_nvidia_smi"] = {
        f: round(max(abs(r["ours"][f] - r["smi"][f]) for r in every if f in r["ours"]), 2) for f in OURS
    }
    fb_delta = mean(load, "DCGM_FI_DEV_FB_USED") - mean(idle, "DCGM_FI_DEV_FB_USED")
    result["allocation_mib"] = {"torch_reserved": round(reserved_mib, 1), "fb_used_delta": round(fb_delta, 1)}
    checks = {
        "fb_used_follows_allocation_within_5pct": abs(fb_delta - reserved_mib) <= 0.05 * reserved_mib,
        "fb_used_matches_nvidia_smi_within_1pct": all(
            abs(r["ours"]["DCGM_FI_DEV_FB_USED"] - r["smi"]["DCGM_FI_DEV_FB_USED"])
            <= 0.01 * max(r["smi"]["DCGM_FI_DEV_FB_USED"], 1024)
            for r in every
        ),
        "util_high_under_load": mean(load, "DCGM_FI_DEV_GPU_UTIL") >= 80,
        "util_low_when_idle": mean(idle, "DCGM_FI_DEV_GPU_UTIL") <= 20,
        "power_rises_under_load": mean(load, "DCGM_FI_DEV_POWER_USAGE") > mean(idle, "DCGM_FI_DEV_POWER_USAGE") + 50,
        "temperature_matches_nvidia_smi_within_2C": all(
            abs(r["ours"]["DCGM_FI_DEV_GPU_TEMP"] - r["smi"]["DCGM_FI_DEV_GPU_TEMP"]) <= 2 for r in every
        ),
    }
    if energy0 is not None and energy1 is not None:
        energy_w = (energy1 - energy0) / 1000.0 / (t_energy1 - t_energy0)
        result["energy_counter_mean_w"] = round(energy_w, 1)
        checks["energy_counter_agrees_with_power_within_25pct"] = (
            abs(energy_w - mean(load, "DCGM_FI_DEV_POWER_USAGE")) <= 0.25 * mean(load, "DCGM_FI_DEV_POWER_USAGE")
        )
    try:
        from prometheus_client.parser import text_string_to_metric_families

        families = list(text_string_to_metric_families(exposition_text))
        checks["exposition_parses"] = len(families) >= len(result["fields_read"]) - 1
    except ImportError:
        result["exposition_parses"] = "prometheus_client not installed: not checked"
    result["checks"] = checks
    result["passed"] = all(checks.values())
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "nvml_check.json").write_text(text)
        (args.out / "nvml_metrics.txt").write_text(exposition_text)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
