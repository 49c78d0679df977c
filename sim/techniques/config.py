"""The ``[techniques]`` table of a scenario: switches and parameters of the serving techniques, all off by default.

A scenario without the table simulates plain continuous batching. Fields, by technique (each module of
``sim.techniques`` documents the model behind it):

- prefix caching (:mod:`sim.techniques.caching`; the index is :mod:`controlplane.prefix_index`, router
  ``prefix-aware``): ``prefix_cache``, ``prefix_block_tokens``, ``prefix_cache_fraction``
- speculative decoding (:mod:`sim.techniques.speculative`): ``speculative``, ``spec_k``, ``spec_acceptance`` (per
  task), ``spec_draft_cost``
- prefill/decode disaggregation (:mod:`sim.techniques.disagg`): ``disaggregation``, ``prefill_fraction``,
  ``kv_link_gbps``
- quantization (:mod:`sim.techniques.quantization`): ``precision`` ("" keeps each catalog entry's own)
- LoRA adapters (:mod:`sim.techniques.caching`; slots are :mod:`controlplane.adapter_index`, router wrapper
  ``adapter-aware``): ``lora``, ``lora_routing``, ``lora_slots``, ``lora_load_gbs``
- async batch on idle GPUs (:mod:`sim.techniques.batch_policy`): ``batch_policy``
- chunked prefill (:mod:`sim.techniques.chunked`): ``chunked_prefill``, ``prefill_chunk_tokens``
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.catalog import TASKS
from edgepop.errors import UserError
from sim.techniques.batch_policy import BATCH_POLICIES, batch_policy_applies
from sim.validate import typed

PRECISIONS = ("", "fp16", "bf16", "fp8", "int8", "int4")


@dataclass
class Techniques:
    """Switches and parameters of the serving techniques; all off by default."""

    # prefix caching
    prefix_cache: bool = False
    prefix_block_tokens: int = 512  # Mooncake traces hash 512-token blocks
    prefix_cache_fraction: float = 1.0  # cap on the KV-pool share cached blocks may hold (1.0: all free space)
    # speculative decoding
    speculative: bool = False
    spec_k: int = 4
    spec_acceptance: dict = field(default_factory=lambda: {"text-generation": 0.7})
    spec_draft_cost: float = 0.1  # draft forward time as a fraction of the target's
    # prefill/decode disaggregation
    disaggregation: bool = False
    prefill_fraction: float = 0.5  # share of each site's GPUs in the prefill pool
    kv_link_gbps: float = 100.0
    # quantization
    precision: str = ""
    # LoRA adapters
    lora: bool = False
    lora_routing: bool = True  # prefer nodes with the adapter loaded
    lora_slots: int = 8  # adapters a replica keeps loaded (LRU)
    lora_load_gbs: float = 2.0  # adapter copy bandwidth (GB/s, local NVMe to GPU)
    # async batch on idle GPUs
    batch_policy: str = "none"
    # chunked prefill
    chunked_prefill: bool = False
    prefill_chunk_tokens: int = 2048  # tokens one iteration carries: decode rows plus prompt chunks

    def enabled(self, deployment: str | None = None) -> list[str]:
        """Names of the techniques switched on, for reports; with ``deployment``, those that act on it."""
        on = [n for n in ("prefix_cache", "speculative", "disaggregation", "lora", "chunked_prefill")
              if getattr(self, n)]
        if self.precision:
            on.append(f"precision={self.precision}")
        if self.batch_policy != "none" and (deployment is None or batch_policy_applies(deployment)):
            on.append(f"batch_policy={self.batch_policy}")
        return on


def parse_techniques(raw: dict, where: str, workload=None) -> Techniques:
    """Validate a ``[techniques]`` table (one-line errors naming the field); ``workload``: the scenario's
    workload config, whose prefix blocks the cache must match."""
    spec = raw.get("spec_acceptance")
    t = typed(Techniques, {k: v for k, v in raw.items() if k != "spec_acceptance"}, where)
    if spec is not None:
        if not isinstance(spec, dict):
            raise UserError(f"{where}: field 'spec_acceptance' must be a table of task = rate, got {spec!r}")
        if not spec:  # an empty table would leave every task at no speculation while listing it as on
            raise UserError(f"{where}: spec_acceptance is empty: give text-generation = rate in [0, 1)")
        for task, rate in spec.items():
            if task not in TASKS:  # an unknown task would leave every real one at no speculation, silently
                raise UserError(f"{where}: spec_acceptance.{task}: unknown task (known: {', '.join(TASKS)})")
            if task != "text-generation":  # (nothing else decodes token by token: the rate would do nothing)
                raise UserError(f"{where}: spec_acceptance.{task}: speculative decoding applies to "
                                "text-generation only")
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate < 1:
                raise UserError(f"{where}: spec_acceptance.{task} must be in [0, 1), got {rate!r}")
        t.spec_acceptance = dict(spec)
    if t.precision not in PRECISIONS:
        names = ", ".join(repr(p) for p in PRECISIONS)
        raise UserError(f"{where}: precision must be one of {names}, got {t.precision!r}")
    BATCH_POLICIES.check(t.batch_policy, where=f"{where}: field 'batch_policy'")
    for name in ("prefix_block_tokens", "spec_k"):
        if getattr(t, name) < 1:
            raise UserError(f"{where}: field {name!r} must be at least 1, got {getattr(t, name)!r}")
    if t.spec_k > 32:  # draft tokens per step: real speculators propose a handful
        raise UserError(f"{where}: spec_k must be at most 32, got {t.spec_k!r}")
    if t.spec_draft_cost > 1:  # a draft pass slower than the target's own step is no draft
        raise UserError(f"{where}: spec_draft_cost must be in [0, 1] (a draft pass as a fraction of the target's "
                        f"decode step), got {t.spec_draft_cost!r}")
    if not 0 < t.prefill_fraction < 1:
        raise UserError(f"{where}: prefill_fraction must be in (0, 1), got {t.prefill_fraction!r}")
    if not isinstance(t.prefill_chunk_tokens, int) or t.prefill_chunk_tokens < 1:
        raise UserError(f"{where}: prefill_chunk_tokens must be an integer >= 1, got {t.prefill_chunk_tokens!r}")
    if t.prefix_cache and t.disaggregation:
        raise UserError(f"{where}: prefix_cache and disaggregation cannot both be on (a disaggregated pool picks "
                        "its own prefill replica, while cache hits are looked up on the one routing chose: hits "
                        "would be credited where the blocks are not)")
    if t.speculative and t.chunked_prefill:
        raise UserError(f"{where}: speculative and chunked_prefill cannot both be on (a mixed chunked iteration "
                        "is timed and credited as one token per sequence: speculation would be dropped there)")
    if t.lora and t.disaggregation:
        raise UserError(f"{where}: lora and disaggregation cannot both be on (a disaggregated pool serves on "
                        "replicas of its own choosing, while adapters are loaded on the one routing chose)")
    if t.chunked_prefill and t.disaggregation:
        raise UserError(f"{where}: chunked_prefill and disaggregation cannot both be on (a disaggregated replica "
                        "only prefills or only decodes)")
    if t.kv_link_gbps <= 0:
        raise UserError(f"{where}: kv_link_gbps must be positive, got {t.kv_link_gbps!r}")
    for name, ok, rule in (("prefix_cache_fraction", 0 < t.prefix_cache_fraction <= 1, "in (0, 1]"),
                           ("lora_slots", isinstance(t.lora_slots, int) and t.lora_slots >= 1, "an integer >= 1"),
                           ("lora_load_gbs", t.lora_load_gbs > 0, "positive")):
        if not ok:
            raise UserError(f"{where}: {name} must be {rule}, got {getattr(t, name)!r}")
    if workload is not None:
        check_block_tokens(t, workload, where)
    return t


def check_block_tokens(techniques: Techniques, workload_config, where: str = "[techniques]") -> None:
    """The cache must cut prompts into the blocks the workload's ``hash_ids`` were made of."""
    if not techniques.prefix_cache:
        return
    kind = getattr(workload_config, "kind", "poisson")
    if kind == "azure":  # (its rows carry no prefix blocks: every lookup would miss, without a word)
        raise UserError(f"{where}: prefix_cache needs hash_ids, and an Azure trace has none (replay a Mooncake "
                        "trace, or a generated workload's sessions)")
    want = 512 if kind == "mooncake" else getattr(workload_config, "block_tokens", 512) if kind == "poisson" else None
    if want is not None and techniques.prefix_block_tokens != want:
        fix = ("set [workload] block_tokens to match" if kind == "poisson" else
               f"a Mooncake trace's blocks are {want} tokens: set prefix_block_tokens = {want}")
        raise UserError(f"{where}: prefix_block_tokens = {techniques.prefix_block_tokens} but the workload's "
                        f"hash_ids use {want}-token blocks ({fix})")
