"""Typed, validated records of the catalog: hardware, models, strategy spaces.

Each record is a frozen pydantic model in strict mode: an unknown key, a value
of the wrong type or out of range is refused. Fields carry their unit in the
name in the units people read off datasheets (``hbm_bandwidth_GB_per_s``,
``latency_us``); the ``*_bytes``/``*_per_s``/``*_s`` properties convert to SI,
and only those reach the kernels.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from paraspace.spaces.enums import AllReduceAlgorithm, Collective, Dtype, labels
from paraspace.spaces.errors import MISSING, CatalogError

GIB = 1024**3  #: bytes in a GiB (binary: capacities)
MIB = 1024**2  #: bytes in a MiB
GB = 1e9  #: bytes in a GB (decimal: bandwidths, as vendors quote them)
TFLOP = 1e12

# --------------------------------------------------------------------------- bounds
# Every number a record holds is bounded by one of the types below (issue 16: a
# schema-valid ``layers = 2**63 - 1`` ranked first with memory -1 and MFU 1e22).
# The kernels take model and hardware numbers as float64 (integers exact below
# 2**53), strategy values as int32 and their products as int64 (spaces.encode:
# tp * pp * dp * cp), and the event tier times tasks in int64 nanoseconds. Each
# upper bound lies orders of magnitude beyond any real model or cluster (the
# catalog's largest: 126 layers, hidden 18432, vocab 256k, 128 heads, 256
# experts, 1024 devices) and keeps those products in range: tp, pp, cp (<= 2**12
# each) times dp (<= 2**24) stays below 2**63. Floats are finite (the Record
# config refuses inf and nan), and rates have a floor: a 5e-324 GB/s link makes a
# transfer take inf seconds, and a NaN MFU on a row that fits.

#: devices, heads, experts, vocabulary, tokens per sequence, sequences per step and
#: any other count: 16.7M (the largest clusters hold ~1e5 devices)
MAX_COUNT = 2**24
#: transformer layers (and layer counts within them): the deepest models have ~1e2
MAX_LAYERS = 10**5
#: widths (hidden, ffn, head and latent dims, GEMM tiles): the widest models ~5e4
MAX_WIDTH = 2**20
#: tp, pp, cp, vpp, ep, expert_tp: 4096-way (real runs: up to 64-way, EP 256);
#: three of them times dp (<= MAX_COUNT) stays below 2**63 in int64
MAX_PARALLEL = 2**12
#: a GEMM's m, n or k: up to the tokens of a step (MAX_COUNT sequences x MAX_COUNT tokens)
MAX_GEMM_DIM = MAX_COUNT * MAX_COUNT
#: memory sizes in GiB (1 PiB per device; the largest HBM today is ~0.3 TiB)
MAX_GIB = 2**20
#: GB/s and TFLOP/s: from 1 MB/s and 1 GFLOP/s (below any link or device worth
#: modelling; keeps times finite) to 1 EB/s and 1 ZFLOP/s per device
MIN_RATE, MAX_RATE = 1e-3, 1e9
#: per-message latency and launch overhead in microseconds: up to one second
MAX_LATENCY_US = 1e6
#: efficiencies and curve fractions: at least one part per million (a smaller one
#: makes times overflow to inf), at most 1
MIN_FRACTION = 1e-6

PositiveInt = Annotated[int, Field(gt=0, le=MAX_COUNT)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Layers = Annotated[int, Field(gt=0, le=MAX_LAYERS)]
LayerCount = Annotated[int, Field(ge=0, le=MAX_LAYERS)]
Width = Annotated[int, Field(gt=0, le=MAX_WIDTH)]
WidthOrZero = Annotated[int, Field(ge=0, le=MAX_WIDTH)]
Parallel = Annotated[int, Field(gt=0, le=MAX_PARALLEL)]
GemmDim = Annotated[int, Field(gt=0, le=MAX_GEMM_DIM)]
#: a positive real number of things (NICs per device, tokens over the mean)
Positive = Annotated[float, Field(gt=0, le=MAX_COUNT)]
Rate = Annotated[float, Field(ge=MIN_RATE, le=MAX_RATE)]
CapacityGiB = Annotated[float, Field(gt=0, le=MAX_GIB)]
SizeGiB = Annotated[float, Field(ge=0, le=MAX_GIB)]
SizeMiB = Annotated[float, Field(ge=0, le=MAX_GIB * 1024)]
MessageMiB = Annotated[float, Field(gt=0, le=MAX_GIB * 1024)]
Latency = Annotated[float, Field(ge=0, le=MAX_LATENCY_US)]
Fraction = Annotated[float, Field(ge=MIN_FRACTION, le=1)]
Text = Annotated[str, Field(min_length=1)]
#: the fused attention kernel a run uses: "flash2" (FlashAttention-2 and kernels of its
#: class), "flash1" (FlashAttention 1, the Triton kernel) or "flash3" (FlashAttention-3 and
#: other Hopper wgmma/TMA kernels: FlashMLA; cuDNN's fused attention measured at this
#: class's rate on an H100, docs/measurements/); they differ in achieved FLOP/s
#: (``Device.attention_efficiency*``)
AttentionKernel = Literal["flash2", "flash1", "flash3"]
#: how an 8-bit GEMM's operands are scaled: "tensor" (one scale a tensor: Transformer
#: Engine's and torchao's FP8 training recipes, per-tensor FP8 checkpoints), "row" (a scale
#: per token and per output channel) or "block" (DeepSeek-V3's fine-grained recipe,
#: arXiv:2412.19437 section 3.3: activations in 1 x 128 tiles, weights in 128 x 128
#: blocks, the accumulators promoted and rescaled every 128 of k; the block-quantized FP8
#: checkpoints of DeepSeek-V3 and Qwen3 load so). Priced by ``Device.gemm_scaling_overhead``
Fp8Scaling = Literal["tensor", "row", "block"]
FP8_SCALINGS = get_args(Fp8Scaling)
#: the precision of an MoE dispatch (training and serving spaces' ``dispatch_dtype``;
#: bytes per element: ``kernels.params.DISPATCH_BYTES``)
DispatchDtype = Literal["bf16", "fp8"]
#: the precision whose GEMMs a scaling recipe applies to
SCALED_DTYPE = "fp8"
#: the kernels with one head width for Q, K and V: FlashAttention-2 refuses MLA's 192 / 128
#: dims where cuDNN's fused attention runs them (docs/measurements/h100-sxm5-80gb,
#: attention_variants.csv), FlashAttention 1 the same (``Model.attention_kernel``)
EQUAL_HEAD_DIM_KERNELS = ("flash1", "flash2")


class Record(BaseModel):
    """Base of every catalog record: frozen, strict, no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


# --------------------------------------------------------------------------- hardware


class Link(Record):
    """A kind of link: its name, unidirectional bandwidth and per-message latency."""

    name: Text
    #: unidirectional bandwidth per device (decimal GB/s, as vendors quote them)
    bandwidth_GB_per_s: Rate
    #: per-message start-up cost (alpha) per algorithm step or hop
    latency_us: Latency

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_GB_per_s * GB

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


class LinkTier(Link):
    """One level of the interconnect, innermost first (NVLink, then the NIC, ...)."""

    #: devices that reach each other over this tier or a faster one (NVLink: 8);
    #: omitted on the outermost tier, which spans the whole cluster
    domain_devices: PositiveInt | None = None
    #: achieved bus bandwidth / link bandwidth for large messages (nccl-tests busbw)
    efficiency: Fraction = 1.0
    #: devices that share one link of this tier (1 = a NIC per device)
    shared_by: PositiveInt = 1
    #: measured achieved bus bandwidth of particular collectives (keys: Collective
    #: labels), replacing bandwidth x efficiency / shared_by for that operation
    op_bandwidth_GB_per_s: dict[str, Rate] = {}
    #: bandwidth-vs-message-size curve, (message MiB, fraction of the large-message
    #: bandwidth) with sizes ascending; interpolated in log size, flat outside
    size_curve: tuple[tuple[MessageMiB, Fraction], ...] = ()
    #: how an all-reduce runs at this tier's level of the hierarchy (AllReduceAlgorithm
    #: labels): "ring" (2(n-1) steps, 2(n-1)/n of the buffer), "tree" (NCCL's double
    #: binary tree: 2 ceil(log2 n) steps, twice the buffer) or "auto" (the faster of
    #: the two for each message, as NCCL's tuner picks); kernels.collectives
    allreduce_algorithm: Text = "ring"

    @model_validator(mode="after")
    def _ops_and_curve(self) -> LinkTier:
        for key in self.op_bandwidth_GB_per_s:
            if key not in labels(Collective):
                raise ValueError(f"op_bandwidth_GB_per_s.{key}: a collective named one of {labels(Collective)}")
        if self.allreduce_algorithm not in labels(AllReduceAlgorithm):
            raise ValueError(f"allreduce_algorithm: one of {labels(AllReduceAlgorithm)}")
        sizes = [p[0] for p in self.size_curve]
        if sizes != sorted(set(sizes)):
            raise ValueError("size_curve: points with strictly ascending message sizes")
        return self


class Device(Record):
    """One accelerator (a chip, or one die of a multi-die card)."""

    #: dense tensor-core peak per GEMM precision (keys: Dtype labels)
    peak_TFLOP_per_s: dict[str, Rate]
    hbm_capacity_GiB: CapacityGiB
    hbm_bandwidth_GB_per_s: Rate
    #: streaming multiprocessors (or equivalent) for wave quantization
    compute_units: PositiveInt
    launch_overhead_us: Latency
    #: achieved / peak FLOP/s of a large, perfectly tiled GEMM
    gemm_max_efficiency: Fraction
    #: output tile shapes (rows, cols) the GEMM library chooses from
    gemm_tiles: tuple[tuple[Width, Width], ...]
    #: the fixed part of each output tile's work (loading its first operand tiles,
    #: writing its output) in bytes of the reduction dimension k: a GEMM runs at
    #: gemm_max_efficiency x k / (k + this / element bytes) (``kernels.ops.loop_fill``).
    #: Measured 256 on Hopper (docs/measurements/); 0: not measured, no fill
    gemm_k_fill_bytes: Annotated[float, Field(ge=0, le=65536, allow_inf_nan=False)] = 0.0
    #: measured GEMM efficiency (achieved / peak) at (m, n, k) points; where given it
    #: replaces the tile model (kernels.ops: interpolated in log m among the points
    #: of the nearest (n, k)); ``paraspace calibrate gemm`` writes it
    gemm_efficiency: tuple[tuple[GemmDim, GemmDim, GemmDim, Fraction], ...] = ()
    #: the extra compute time of an 8-bit GEMM under a scaling recipe (``Fp8Scaling``),
    #: as a fraction of the same GEMM with one scale a tensor: the recipe's rescaling
    #: work inside the main loop. Measured per part (docs/measurements/); a recipe not
    #: listed costs nothing extra
    gemm_scaling_overhead: dict[str, Annotated[float, Field(ge=0, le=4, allow_inf_nan=False)]] = {}
    #: achieved / peak (16-bit) FLOP/s of FlashAttention-2-class kernels (FA2, cuDNN /
    #: Transformer Engine fused attention)
    attention_efficiency: Fraction
    #: the same for first-generation fused attention (FlashAttention 1, the Triton
    #: FlashAttention kernel): Dao 2023 (FlashAttention-2, abstract) measures FA1 at
    #: 25-40% of the A100's peak against FA2's 50-73%. Unset: ``attention_efficiency``
    attention_efficiency_flash1: Fraction | None = None
    #: the same for FlashAttention-3 (Hopper's asynchronous wgmma/TMA kernel; Shah et al.
    #: 2024 measure 1.5-2.0x FA2's speed, up to 75% of the H100 peak forward). Unset:
    #: ``attention_efficiency`` (FA3 runs on Hopper only; elsewhere the FA2 kernel runs)
    attention_efficiency_flash3: Fraction | None = None
    #: achieved / peak HBM bandwidth of memory-bound kernels
    memory_efficiency: Fraction
    #: the tensor-core clock a power-limited part sustains, as a fraction of the clock
    #: its datasheet peaks (``peak_TFLOP_per_s``) assume: 1.0 for a part run at the
    #: datasheet's power. ``peak_flops_per_s`` (every compute time and MFU) scales by it;
    #: ``peak_TFLOP_per_s`` keeps the datasheet numbers
    sustained_clock_fraction: Fraction = 1.0
    #: elementwise kernels fused (residual add + norm pairs, rotary embedding inside
    #: attention, the MLP activation in the GEMM epilogue): fewer launches and no
    #: intermediate round trips through HBM
    kernel_fusion: bool = False
    #: memory the framework holds beyond the model's tensors, a fixed part: CUDA
    #: context and framework workspace (cuBLAS, attention kernels). A profile that
    #: leaves the two constants below at 0 folds fragmentation and communication
    #: buffers in here, as profiles did before they were split out
    memory_overhead_GiB: SizeGiB
    #: the caching allocator's fragmentation: reserved but unusable memory as a
    #: fraction of the tensors' bytes (weights, gradients, optimizer states,
    #: activations, MoE buffers) of the device
    memory_fragmentation: Annotated[float, Field(ge=0, le=1)] = 0.0
    #: communication buffers of one process group (NCCL allocates channel buffers
    #: per communicator); a device holds one set per group of more than one rank
    #: it belongs to (TP, CP, DP x CP, PP; with experts EP, expert TP, expert DP)
    comm_buffer_MiB: SizeMiB = 0.0
    #: achieved host <-> device bandwidth per device, each direction (PCIe)
    host_link_GB_per_s: Rate
    #: host DRAM bandwidth available per device (the host's total / devices per host),
    #: streamed by the CPU optimizer step
    host_memory_GB_per_s: Rate
    #: host DRAM available per device for offloaded tensors (the host's total / devices per host)
    host_capacity_GiB: CapacityGiB

    @model_validator(mode="after")
    def _known_dtypes(self) -> Device:
        for key in self.peak_TFLOP_per_s:
            if key not in labels(Dtype):
                raise ValueError(f"peak_TFLOP_per_s.{key}: a precision named one of {labels(Dtype)}")
        if not self.gemm_tiles:
            raise ValueError("gemm_tiles: at least one (rows, cols) tile")
        for key in self.gemm_scaling_overhead:
            if key not in FP8_SCALINGS:
                raise ValueError(f"gemm_scaling_overhead.{key}: a scaling recipe named one of {list(FP8_SCALINGS)}")
        return self

    @property
    def hbm_capacity_bytes(self) -> float:
        return self.hbm_capacity_GiB * GIB

    @property
    def hbm_bandwidth_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_GB_per_s * GB

    @property
    def launch_overhead_s(self) -> float:
        return self.launch_overhead_us * 1e-6

    @property
    def memory_overhead_bytes(self) -> float:
        return self.memory_overhead_GiB * GIB

    @property
    def comm_buffer_bytes(self) -> float:
        return self.comm_buffer_MiB * MIB

    @property
    def host_link_bytes_per_s(self) -> float:
        return self.host_link_GB_per_s * GB

    @property
    def host_capacity_bytes(self) -> float:
        return self.host_capacity_GiB * GIB

    @property
    def host_memory_bytes_per_s(self) -> float:
        return self.host_memory_GB_per_s * GB

    def peak_flops_per_s(self, dtype: str) -> float:
        """The dense peak of ``dtype`` at the clock the part sustains (``sustained_clock_fraction``)."""
        return self.peak_TFLOP_per_s[dtype] * TFLOP * self.sustained_clock_fraction

    def gemm_scaling_overhead_of(self, dtype: str, scaling: str) -> float:
        """The extra GEMM compute time of ``dtype`` GEMMs scaled by ``scaling``
        (``gemm_scaling_overhead``): 0 for any precision but FP8, whose recipes it prices."""
        return self.gemm_scaling_overhead.get(scaling, 0.0) if dtype == SCALED_DTYPE else 0.0

    def attention_efficiency_of(self, kernel: str) -> float:
        """Achieved / peak FLOP/s of the attention core run by ``kernel`` (``ATTENTION_KERNELS``)."""
        specific = {"flash1": self.attention_efficiency_flash1, "flash3": self.attention_efficiency_flash3}.get(kernel)
        return specific if specific is not None else self.attention_efficiency


class Hardware(Record):
    """A cluster: identical devices joined by a hierarchy of link tiers."""

    name: Text
    description: Text
    device: Device
    links: tuple[LinkTier, ...]
    #: devices per server (one host: its CPUs, DRAM and PCIe switches). Omitted: the
    #: outermost finite tier's domain (the scale-up domain), as in HGX/DGX nodes whose
    #: NVLink domain is the server; rack-scale parts set it apart (GB200 NVL72: trays of
    #: 4 in an NVLink domain of 72)
    node_devices: PositiveInt | None = None
    #: NVLink generation of the scale-up tier (descriptive: its bandwidth is the tier's)
    nvlink_generation: PositiveInt | None = None
    #: scale-out NICs per device (descriptive: the outer tier's bandwidth is per device)
    nics_per_device: Positive | None = None

    @property
    def scale_up_tier(self) -> int:
        """Index of the outermost tier with a finite domain (``kernels.moe.node_tier``)."""
        return max(0, len(self.links) - 2)

    @property
    def devices_per_node(self) -> int:
        return self.node_devices or self.links[self.scale_up_tier].domain_devices or 1

    def with_node_devices(self, n: int, source: str) -> Hardware:
        """This cluster built from servers of ``n`` devices (``SpaceSpec.node_devices``,
        a validation row's ``gpus_per_node``). Where the scale-up domain is the server
        (HGX: NVLink joins the GPUs of one server), the domain becomes ``n`` devices
        too; a domain that spans servers (NVL72) keeps its size."""
        if n == self.devices_per_node:
            return self
        data = self.model_dump()
        up = self.scale_up_tier
        if self.links[up].domain_devices == self.devices_per_node and len(self.links) > 1:
            data["links"][up]["domain_devices"] = n
        data["node_devices"] = n
        return validate(Hardware, data, source)

    @model_validator(mode="after")
    def _tiers_nest(self) -> Hardware:
        if not self.links:
            raise ValueError("links: at least one link tier")
        names = [t.name for t in self.links]
        for i, name in enumerate(names):
            if name in names[:i]:  # calibrate and the messages name a tier by it
                raise ValueError(f"links.{i}.name: a name no other tier of the profile has ({name!r} is repeated)")
        sizes = [t.domain_devices for t in self.links]
        if sizes[-1] is not None:
            raise ValueError(f"links.{len(sizes) - 1}.domain_devices: no value on the outermost tier (it spans the cluster)")
        inner = [s for s in sizes[:-1]]
        for i, size in enumerate(inner):
            if size is None:
                raise ValueError(f"links.{i}.domain_devices: a value on every tier but the outermost")
        for i, (a, b) in enumerate(zip(inner, inner[1:])):
            if b <= a or b % a:  # type: ignore[operator]
                raise ValueError(f"links.{i + 1}.domain_devices: a whole multiple (> 1) of the inner tier's {a}")
        domain = self.links[self.scale_up_tier].domain_devices
        if self.node_devices is not None and domain is not None and domain % self.node_devices:
            raise ValueError(f"node_devices: a divisor of the scale-up domain's {domain} devices")
        return self


# --------------------------------------------------------------------------- models


class Moe(Record):
    """Mixture-of-experts feed-forward layers (DeepSeek-V3 / Mixtral / Qwen3 style)."""

    #: routed experts per MoE layer
    experts: PositiveInt
    #: experts each token is routed to
    top_k: PositiveInt
    #: intermediate width of one expert's gated MLP
    expert_ffn: Width
    #: shared experts every token passes through (same width as a routed one)
    shared_experts: Count = 0
    #: the first layers keep a dense MLP of the model's ``ffn`` width
    dense_layers: LayerCount = 0
    #: node-limited routing: a token's experts lie on at most this many nodes (0: no limit)
    max_nodes: Count = 0

    @model_validator(mode="after")
    def _top_k(self) -> Moe:
        if self.top_k > self.experts:
            raise ValueError(f"top_k: at most experts = {self.experts}")
        return self


class Mla(Record):
    """DeepSeek multi-head latent attention: low-rank Q and KV with decoupled RoPE dims."""

    #: query compression rank (0: queries projected directly, as in DeepSeek-V2-Lite)
    q_lora_rank: WidthOrZero
    #: key/value latent rank (what the KV cache stores, with the RoPE key)
    kv_lora_rank: Width
    #: per-head query/key dims without and with rotary embedding
    qk_nope_head_dim: Width
    qk_rope_head_dim: Width
    #: per-head value dim
    v_head_dim: Width


class Model(Record):
    """A transformer's architecture: dense or MoE feed-forward, MHA/GQA or MLA attention."""

    name: Text
    description: Text
    layers: Layers
    hidden: Width
    heads: PositiveInt
    kv_heads: PositiveInt
    #: per-head width; hidden / heads when omitted
    head_dim: Width | None = None
    #: intermediate width of the MLP
    ffn: Width
    vocab: PositiveInt
    #: gated MLP with three matrices (SwiGLU); two matrices (GeLU) otherwise
    glu: bool
    #: linear layers carry biases (GPT-2/3 style)
    bias: bool = False
    #: the output head shares the embedding matrix
    tied_embeddings: bool = False
    #: dropout after attention and MLP (adds masks to the stored activations)
    dropout: bool = False
    #: sliding-window attention: each query attends to at most this many keys (0: full)
    sliding_window: Count = 0
    #: mixture-of-experts MLPs (``ffn`` is then the width of the first dense layers)
    moe: Moe | None = None
    #: multi-head latent attention instead of MHA/GQA (``kv_heads`` = ``heads`` then)
    mla: Mla | None = None
    #: multi-token prediction modules on the last stage (DeepSeek-V3: 1), each one
    #: more transformer layer plus a 2h x h projection, sharing embedding and head
    mtp_depth: LayerCount = 0

    @model_validator(mode="after")
    def _heads(self) -> Model:
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads: a divisor of heads = {self.heads}")
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"head_dim: a value, since hidden = {self.hidden} is not a multiple of heads = {self.heads}")
        if self.moe is not None and self.moe.dense_layers > self.layers:
            raise ValueError(f"moe.dense_layers: at most layers = {self.layers}")
        return self

    @property
    def d_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    def attention_kernel(self, asked: str) -> str:
        """The fused attention kernel that runs this model's attention when ``asked`` is
        named: a kernel of ``EQUAL_HEAD_DIM_KERNELS`` has no path for query/key and value
        heads of different widths (MLA's 192 and 128), so such a model runs the
        FlashAttention-3 class instead (cuDNN's fused attention, which Transformer Engine
        runs, FA3, FlashMLA); on a device with no rate of that class
        (``Device.attention_efficiency_of``) it is priced at FlashAttention-2's."""
        if self.mla is not None and asked in EQUAL_HEAD_DIM_KERNELS:
            if self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim != self.mla.v_head_dim:
                return "flash3"
        return asked


# --------------------------------------------------------------------------- spaces

Values = tuple[Any, ...]


class Dimensions(Record):
    """The values each strategy dimension may take. Omitted: its default."""

    tp: tuple[Parallel, ...] = (1,)
    pp: tuple[Parallel, ...] = (1,)
    #: omitted (or "auto"): derived per candidate as devices / (tp * pp * cp)
    dp: tuple[PositiveInt, ...] | None = None
    cp: tuple[Parallel, ...] = (1,)
    vpp: tuple[Parallel, ...] = (1,)
    micro_batch: tuple[PositiveInt, ...] = (1,)
    recompute: tuple[str, ...] = ("none",)
    #: with recompute = full: recompute only the last k layers of each device (0: all of
    #: them), the asynchronous runtime's recompute_ratio / Megatron's recompute-num-layers
    recompute_layers: tuple[LayerCount, ...] = (0,)
    #: stored activations copied to host memory after the forward and back before the
    #: backward, overlapped with compute over the host link
    offload_activations: tuple[bool, ...] = (False,)
    #: weights (and gradients) streamed layer by layer between host and device
    #: (ZeRO-Infinity style); needs the optimizer on the host
    offload_weights: tuple[bool, ...] = (False,)
    sequence_parallel: tuple[bool, ...] = (False,)
    tp_overlap: tuple[bool, ...] = (False,)
    zero: tuple[Annotated[int, Field(ge=0, le=3)], ...] = (0,)
    #: ZeRO-3 with gradient accumulation: keep the micro-batches' gradients unsharded
    #: and reduce-scatter them once, after the last micro-batch (FSDP2
    #: set_requires_gradient_sync(False), FSDP1 no_sync): one gradient reduction per
    #: step instead of one per micro-batch, for the whole unsharded gradient in memory
    defer_grad_sync: tuple[bool, ...] = (False,)
    optimizer: tuple[str, ...] = ("adam",)
    schedule: tuple[str, ...] = ("1f1b",)
    #: expert-parallel size: the routed experts of a layer are split over ep ranks
    #: of the stage's tp * cp * dp (MoE models only)
    ep: tuple[Parallel, ...] = (1,)
    #: tensor-parallel size inside each expert (expert TP)
    expert_tp: tuple[Parallel, ...] = (1,)
    #: where the EP group lies in the rank layout (inner: adjacent ranks; outer: spread)
    ep_placement: tuple[str, ...] = ("inner",)
    #: token dispatch/combine algorithm
    dispatch: tuple[str, ...] = ("alltoall",)
    #: two-batch overlap: dispatch/combine of one half micro-batch overlapped with the
    #: other half's expert compute, and the shared experts with the dispatch
    tbo: tuple[bool, ...] = (False,)

    @model_validator(mode="before")
    @classmethod
    def _dp_auto(cls, data: Any) -> Any:
        """``dp = "auto"`` is the explicit spelling of the default."""
        if isinstance(data, dict) and data.get("dp") == "auto":
            return {k: v for k, v in data.items() if k != "dp"}
        return data


class SpaceSpec(Record):
    """A strategy space as written in TOML (model and hardware by reference)."""

    name: Text
    description: Text
    #: catalog name or path of a model TOML
    model: Text
    #: catalog name or path of a hardware TOML
    hardware: Text
    #: devices in the cluster; several values make the cluster size a dimension
    #: (the ``devices`` column), e.g. the same model on 16, 32 and 64 nodes
    devices: PositiveInt | tuple[PositiveInt, ...]
    #: sequences per optimizer step
    global_batch: PositiveInt
    seq_len: PositiveInt
    dtype: Text = "bf16"
    flash_attention: bool = True
    #: which fused attention kernel runs the core when ``flash_attention`` (``AttentionKernel``;
    #: an MLA model runs the FlashAttention-3 class whichever is named, ``Model.attention_kernel``)
    attention_kernel: AttentionKernel = "flash2"
    #: how FP8 GEMM operands are scaled when ``dtype`` is "fp8" (``Fp8Scaling``)
    fp8_scaling: Fp8Scaling = "tensor"
    #: devices per server, overriding the hardware profile's (``Hardware.with_node_devices``):
    #: the same GPUs in 4-GPU servers, or part of one server
    node_devices: PositiveInt | None = None
    #: allow pipelines whose stages hold different numbers of layers (the first
    #: L mod p stages one more); otherwise pp * vpp must divide the layers
    uneven_layers: bool = False
    #: routed rows of the busiest expert-parallel rank over the mean, for every
    #: row of the space; the step waits for the busiest rank, and its buffers and
    #: activations are sized for it. Omitted: derived per row from the routed
    #: tokens, experts, top-k and EP size for uniform random routing
    #: (``kernels.routing``: 1.01-1.03 for training micro-batches, 1.1-2 for
    #: decode batches). A number fixes it: 1.0 for a forced balanced gate
    #: (round-robin routing), more for a learned router's measured skew (at most
    #: all tokens on one rank: the EP size, <= MAX_PARALLEL)
    moe_imbalance: Annotated[float, Field(ge=1, le=MAX_PARALLEL)] | None = None
    #: with an 8-bit dtype, which GEMMs run in it: "all", or "mlp" (the MLP and expert
    #: GEMMs; the attention projections stay in 16 bits, a common FP8 recipe)
    quantized_gemms: Literal["all", "mlp"] = "all"
    #: how the loss over the logits is computed, which sets the memory it holds at its
    #: peak (``kernels.params.LOSS_BYTES``): "fused", a vocab-parallel cross-entropy
    #: that works in place on one fp32 copy of the logits (Megatron's), or
    #: "unfused", PyTorch's cross-entropy over the upcast logits (torchtitan's and
    #: most PyTorch-native trainers'), whose backward holds three fp32 copies
    cross_entropy: Literal["fused", "unfused"] = "fused"
    #: how a layer's elementwise work runs, which sets what it keeps for the backward
    #: (``kernels.memory.eager_bytes_per_layer``) and what it costs
    #: (``kernels.elementwise``): "fused", kernels that keep only Korthikanti's tensors
    #: (Megatron with Transformer Engine, or a compiled model: rotary inside attention,
    #: a fused SwiGLU), or "eager", PyTorch ops one at a time (torchtitan and other
    #: PyTorch-native trainers without ``torch.compile``), which also keep the rotated Q
    #: and K, the attention output's transposed copy and an unfused SwiGLU's SiLU output
    #: (34% more for a Llama 3 8B layer, measured to the byte on an H100 and an H200:
    #: ``docs/measurements``, ``layer.csv``) and move 3.3 times the bytes: fp32 RMSNorms,
    #: the complex rotary, K and V repeated to the query heads
    elementwise: Literal["fused", "eager"] = "fused"
    #: how full recompute reruns a layer (``kernels.recompute.recompute_s``): "reentrant",
    #: its whole forward again (Megatron's and DeepSpeed's checkpointing), or
    #: "early-stop", PyTorch's non-reentrant ``torch.utils.checkpoint`` (FSDP trainers),
    #: which stops once the last tensor the backward reads is rebuilt and so skips the
    #: down projection: measured 0.68-0.94 of a forward on MPT-7B blocks on an H100 and
    #: an H200 (``docs/measurements``, ``layer.csv``)
    checkpoint: Literal["reentrant", "early-stop"] = "reentrant"
    #: what a ZeRO-3 device stores of its own parameter shard (``kernels.memory``):
    #: "16-bit", a 16-bit shard beside the optimizer's fp32 master (DeepSpeed ZeRO-3's
    #: partitioned fp16/bf16 parameters: 2 + 4 + 12 = 18 bytes a parameter with Adam), or
    #: "master", the fp32 master alone, cast to 16 bits as it is gathered (PyTorch FSDP's
    #: mixed precision: FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16)`` keeps the sharded
    #: parameters in fp32 and the optimizer updates them in place; FSDP1's low-precision
    #: shard is freed after each gather: 16 bytes). Optimizers without a device master
    #: (``adam-no-master``, ``adam-bf16``, ``cpu-adam``, ``adam-8bit-paged``) keep the 16-bit
    #: shard either way: it is what they update or what the host's master is copied to
    zero3_shard: Literal["16-bit", "master"] = "16-bit"
    #: the precision of an MoE dispatch (``kernels.params.DISPATCH_BYTES``): "bf16", or
    #: "fp8" (one byte an element plus a scale per 128, as DeepSeek-V3 trains and DeepEP
    #: sends): the forward's tokens and the backward's gradients before the down
    #: projections; combines stay 16-bit
    dispatch_dtype: DispatchDtype = "bf16"
    dimensions: Dimensions = Dimensions()

    @property
    def device_counts(self) -> tuple[int, ...]:
        return self.devices if isinstance(self.devices, tuple) else (self.devices,)

    @property
    def devices_text(self) -> str:
        """The cluster size(s) as people write them: ``256`` or ``256/512/1024``."""
        return "/".join(str(n) for n in self.device_counts)


def validate(record: type[Record], data: dict[str, Any], source: str) -> Any:
    """Build ``record`` from ``data``; a ``CatalogError`` naming source, field, value otherwise."""
    try:
        return record.model_validate(_tuples(data))
    except ValidationError as err:
        raise _as_catalog_error(record, err, data, source) from None


def _tuples(value: Any) -> Any:
    """TOML arrays as tuples (strict mode wants the declared container type)."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def _as_catalog_error(record: type[Record], err: ValidationError, data: dict, source: str) -> CatalogError:
    errors = err.errors()
    # a misspelt key also makes the key it replaced "missing": name the misspelling first
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    # drop pydantic's union-branch tags ("int", "constrained-int", "tuple[...]") from the location
    loc = [p for p in first["loc"] if not (isinstance(p, str) and (
        "[" in p or p in ("int", "float", "none") or p.startswith("constrained-")))]
    field = ".".join(str(p) for p in loc) or "(record)"
    kind = first["type"]
    value = _lookup(data, loc)  # as written (lists, not the tuples validation saw)
    if value is MISSING:
        value = first.get("input", MISSING)
    if kind == "extra_forbidden":
        return CatalogError(source, field, value, f"one of the known keys {sorted(_fields_at(record, loc[:-1]))}")
    if kind == "missing":
        return CatalogError(source, field, MISSING, "a value (this field is required)")
    if kind == "value_error":  # a model validator's "FIELD: what was expected"
        msg = str(first["msg"]).removeprefix("Value error, ")
        sub, _, expected = msg.partition(": ")
        path = loc + sub.split(".")
        value = _lookup(data, path)
        written = _lookup(data, path[:-1]) if value is MISSING and len(path) > 1 else MISSING
        if written is not MISSING and not isinstance(written, dict):
            path, value = path[:-1], written  # a record's short spelling (``input_len = 1024``): as written
        return CatalogError(source, ".".join(map(str, path)), value, expected)
    expected = str(first["msg"]).replace("Input should be ", "").replace("Input ", "")
    return CatalogError(source, field, value, expected)


def _fields_at(record: type[Record], loc: list) -> set[str]:
    """Keys allowed in the record reached by following ``loc`` from ``record``."""
    cls: Any = record
    for part in loc:
        if isinstance(part, int):
            continue
        ann = cls.model_fields[part].annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        for arg in list(candidates):
            candidates += list(getattr(arg, "__args__", ()))
        cls = next(a for a in candidates if isinstance(a, type) and issubclass(a, Record))
    return set(cls.model_fields)


def _lookup(data: Any, path: list) -> Any:
    for part in path:
        try:
            data = data[int(part)] if isinstance(data, list | tuple) else data[part]
        except (KeyError, IndexError, TypeError, ValueError):
            return MISSING
    return data
