"""Hardware and model specifications the simulator draws on.

GPU figures are the public datasheet / ``nvidia-smi -q`` values (memory as reported in MiB, board
power limit, slowdown and shutdown temperatures, maximum SM clock). Model variants derive their
memory footprint and speed from first principles (parameter count x bytes per weight, KV-cache bytes
per token from the Llama-3 attention shape), so a newcomer can check every number by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model as DCGM and nvidia-smi describe it.

    Attributes:
        key: short name used in configuration (``h100-80gb``).
        model_name: the ``modelName`` label DCGM exporter writes.
        memory_mib: framebuffer size in MiB.
        tdp_w: board power limit in watts.
        idle_w: power draw with no work.
        slowdown_temp_c: temperature at which the hardware slows its clocks.
        shutdown_temp_c: temperature at which the GPU shuts down.
        max_sm_clock_mhz: boost SM clock.
        idle_sm_clock_mhz: SM clock when idle.
        mem_bw_gbs: memory bandwidth (decode speed is bandwidth bound).
        fp16_tflops: dense FP16 tensor throughput (prefill is compute bound).
        cost_per_hour: on-demand price per GPU-hour in USD.
        nvlink_links: NVLink links per GPU (0: PCIe only).
    """

    key: str
    model_name: str
    memory_mib: int
    tdp_w: float
    idle_w: float
    slowdown_temp_c: float
    shutdown_temp_c: float
    max_sm_clock_mhz: float
    idle_sm_clock_mhz: float
    mem_bw_gbs: float
    fp16_tflops: float
    cost_per_hour: float
    nvlink_links: int


GPU_SPECS: dict[str, GpuSpec] = {
    "h100-80gb": GpuSpec(
        "h100-80gb",
        "NVIDIA H100 80GB HBM3",
        81559,
        700.0,
        70.0,
        89.0,
        92.0,
        1980.0,
        345.0,
        3350.0,
        989.0,
        4.00,
        18,
    ),
    "a100-80gb": GpuSpec(
        "a100-80gb",
        "NVIDIA A100-SXM4-80GB",
        81920,
        400.0,
        55.0,
        89.0,
        92.0,
        1410.0,
        210.0,
        2039.0,
        312.0,
        2.50,
        12,
    ),
    "a100-40gb": GpuSpec(
        "a100-40gb",
        "NVIDIA A100-SXM4-40GB",
        40960,
        400.0,
        52.0,
        89.0,
        92.0,
        1410.0,
        210.0,
        1555.0,
        312.0,
        1.60,
        12,
    ),
    "l40s": GpuSpec(
        "l40s",
        "NVIDIA L40S",
        46068,
        350.0,
        35.0,
        95.0,
        98.0,
        2520.0,
        210.0,
        864.0,
        362.0,
        1.20,
        0,
    ),
}

# Bytes per weight for each precision; KV cache stays fp16 (vLLM's default kv_cache_dtype="auto").
PRECISION_BYTES: dict[str, float] = {"fp16": 2.0, "int8": 1.0, "int4": 0.5}
# Prefill speed-up relative to fp16: int8 uses int8/fp8 tensor cores; int4 (AWQ/GPTQ) dequantises
# on the fly, so its prefill is no faster than fp16 while its decode still reads fewer bytes.
PRECISION_PREFILL_SPEEDUP: dict[str, float] = {"fp16": 1.0, "int8": 1.5, "int4": 1.0}


@dataclass(frozen=True)
class ModelShape:
    """Architecture numbers that decide memory and speed."""

    hf_name: str
    params_b: float
    layers: int
    kv_heads: int
    head_dim: int

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes for one token in fp16 (K and V, every layer)."""
        return self.layers * self.kv_heads * self.head_dim * 2 * 2


MODEL_SHAPES: dict[str, ModelShape] = {
    "8b": ModelShape("meta-llama/Llama-3.1-8B-Instruct", 8.0, 32, 8, 128),
    "70b": ModelShape("meta-llama/Llama-3.1-70B-Instruct", 70.6, 80, 8, 128),
}
CONTEXTS: dict[str, int] = {"8k": 8192, "32k": 32768, "128k": 131072}


@dataclass(frozen=True)
class Variant:
    """One servable configuration: model size, weight precision, context length, tensor parallelism.

    Attributes:
        size: ``8b`` or ``70b``.
        precision: ``fp16``, ``int8`` or ``int4``.
        context: ``8k``, ``32k`` or ``128k``.
        tp: tensor-parallel degree (GPUs per replica).
    """

    size: str
    precision: str
    context: str
    tp: int = 1
    shape: ModelShape = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.size not in MODEL_SHAPES or self.precision not in PRECISION_BYTES:
            raise ValueError(f"unknown variant {self.size}/{self.precision}")
        if self.context not in CONTEXTS:
            raise ValueError(f"unknown context {self.context}")
        object.__setattr__(self, "shape", MODEL_SHAPES[self.size])

    @property
    def key(self) -> str:
        """Stable name, e.g. ``70b-fp16-32k-tp4``."""
        return f"{self.size}-{self.precision}-{self.context}-tp{self.tp}"

    @property
    def served_model_name(self) -> str:
        """The ``model_name`` label vLLM reports."""
        return self.shape.hf_name + ("" if self.precision == "fp16" else f"-{self.precision.upper()}")

    @property
    def max_model_len(self) -> int:
        """Longest prompt+output accepted (vLLM ``--max-model-len``)."""
        return CONTEXTS[self.context]

    @property
    def weight_gib(self) -> float:
        """Weights plus runtime overhead (activations, CUDA graphs), GiB, whole replica."""
        raw = self.shape.params_b * 1e9 * PRECISION_BYTES[self.precision] / 2**30
        return raw * 1.08 + 1.5 * self.tp

    def weight_mib_per_gpu(self) -> float:
        """Memory taken before any KV cache, per GPU, MiB."""
        return self.weight_gib * 1024.0 / self.tp

    def kv_capacity_tokens(self, gpu: GpuSpec, gpu_memory_utilization: float = 0.9) -> float:
        """Tokens of KV cache the replica can hold on ``tp`` GPUs of type ``gpu``."""
        free_mib = gpu.memory_mib * gpu_memory_utilization - self.weight_mib_per_gpu()
        return max(0.0, free_mib * 2**20 * self.tp / self.shape.kv_bytes_per_token)

    def fits(self, gpu: GpuSpec) -> bool:
        """True when weights leave room for at least one full-length sequence of KV cache."""
        return self.kv_capacity_tokens(gpu) >= self.max_model_len

    def decode_base_s(self, gpu: GpuSpec) -> float:
        """Seconds of one decode step with an empty batch: read every weight once."""
        bytes_per_gpu = self.weight_gib * 2**30 / self.tp
        # 70% of peak bandwidth is what well-tuned kernels reach; TP adds an all-reduce per layer.
        return bytes_per_gpu / (gpu.mem_bw_gbs * 1e9 * 0.7) + (0.0008 * self.tp if self.tp > 1 else 0.0)

    def decode_per_token_s(self, gpu: GpuSpec) -> float:
        """Extra decode-step seconds per token of KV cache read by the batch."""
        return self.shape.kv_bytes_per_token / (gpu.mem_bw_gbs * 1e9 * 0.7 * self.tp)

    def prefill_tokens_per_s(self, gpu: GpuSpec) -> float:
        """Prompt tokens per second the replica can prefill (compute bound, ~40% MFU)."""
        flops_per_token = 2.0 * self.shape.params_b * 1e9
        return gpu.fp16_tflops * 1e12 * 0.4 * self.tp * PRECISION_PREFILL_SPEEDUP[self.precision] / flops_per_token

    def load_time_s(self) -> float:
        """Seconds from container start to Ready: read weights, allocate KV cache, capture graphs."""
        return 30.0 + self.weight_gib * 2.0 / self.tp**0.5


def parse_variant(key: str) -> Variant:
    """Parse ``70b-fp16-32k-tp4`` (``-tpN`` optional, default 1) into a :class:`Variant`."""
    parts = key.lower().split("-")
    tp = 1
    if parts and parts[-1].startswith("tp"):
        tp = int(parts.pop()[2:])
    if len(parts) != 3:
        raise ValueError(f"variant {key!r} must look like '<size>-<precision>-<context>[-tpN]'")
    return Variant(parts[0], parts[1], parts[2], tp)
