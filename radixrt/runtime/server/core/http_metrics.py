"""Prometheus metrics of one HTTP app, in a registry of its own (never the global one).

Gauges (running and waiting requests, KV usage, cache hit rate, preemptions by mode, pinned
prefixes and tokens, pins refused) are read from manager.server_info() at scrape time, lease
counts from the pin service; latency histograms (queue, prefill, TTFT, ITL, e2e), token counters
and finish reasons are fed by the manager's on_finish callback, once per finished request;
refused requests are counted by the app's error handlers, by status code. Requests, tokens and
queue time are also counted by class of service (priority, tenant), preemptions caused by
urgent requests by their priority and tenant, every preemption by its cause (memory, priority,
fair share), and running requests by tenant. Grammar masks: how many the worker built, the
seconds they took and the seconds sampling waited for them after the forward pass. Speculative
decoding: drafts verified, tokens drafted and accepted, draft lookups and their seconds, and the
acceptance-length histogram (verified runs by how many drafted tokens they kept). KV tiers: each
tier's size, cached and hit tokens, tokens moved each way, seconds moving them. LoRA adapters:
finished requests and their prompt, cached and generated tokens by adapter. Grammars: constrained
requests by whether their grammar was cached, and the compile time of the others. Tenants: each
configured fair-share weight.

The same load figures are also exported under the names a Kubernetes inference gateway reads
(GATEWAY_GAUGES): the Gateway API Inference Extension's endpoint picker (llm-d-router) scrapes
each model-server pod for its queue, its running requests and its KV-cache utilization, under
vLLM's names by default and SGLang's for pods labelled `llm-d.ai/engine-type: sglang`. radixrt
answers to both (docs/kubernetes.md).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from radixrt.runtime.config import MAX_METRIC_LABELS
from radixrt.runtime.messages import TIER_NAMES
from radixrt.runtime.scheduler.stats import OTHER_LABEL
from radixrt.runtime.tokenizer.pin_leases import PinService
from radixrt.runtime.tokenizer.request_metrics import RequestMetrics
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager

# Buckets (seconds) of the latency histograms on /metrics.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
COMPILE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

PREFIX = "radixrt"

# (name, help, the figure it carries): the endpoint picker's built-in engine configs
# (llm-d-router, pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go; the table
# of the inference extension's model server protocol). "kv_usage" is the fraction (0..1) of KV
# slots held by requests or locked, radixrt_kv_usage_ratio: cached prefixes that could be
# evicted count as free, as in vLLM's and SGLang's own figures.
GATEWAY_GAUGES = (
    ("vllm:num_requests_waiting", "Requests queued (vLLM's name)", "waiting"),
    ("vllm:num_requests_running", "Requests running (vLLM's name)", "running"),
    ("vllm:kv_cache_usage_perc", "KV-cache usage, 0..1 (vLLM's name)", "kv_usage"),
    ("vllm:gpu_cache_usage_perc", "KV-cache usage, 0..1 (vLLM's earlier name, the default of "
     "older endpoint pickers)", "kv_usage"),
    ("sglang:num_queue_reqs", "Requests queued (SGLang's name)", "waiting"),
    ("sglang:num_running_reqs", "Requests running (SGLang's name)", "running"),
    ("sglang:token_usage", "KV-cache usage, 0..1 (SGLang's name)", "kv_usage"),
)
# the picker's optional cache-shape info metrics (for its approximate prefix scorer): the
# name, its page-size label and its page-count label
GATEWAY_CACHE_INFO = (("vllm:cache_config_info", "block_size", "num_gpu_blocks"),
                      ("sglang:cache_config_info", "page_size", "num_pages"))


class HTTPMetrics:
    def __init__(self, manager: TokenizerManager, pins: PinService) -> None:
        self.manager = manager
        self.pins = pins
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.running = Gauge(f"{PREFIX}_num_running_requests", "Requests decoding now", registry=r)
        self.waiting = Gauge(f"{PREFIX}_num_waiting_requests", "Requests queued", registry=r)
        self.kv_usage = Gauge(f"{PREFIX}_kv_usage_ratio",
                              "Fraction of KV slots held by requests or locked", registry=r)
        self.kv_cached = Gauge(f"{PREFIX}_kv_cached_ratio",
                               "Fraction of KV slots holding evictable cached prefixes", registry=r)
        self.hit_rate = Gauge(f"{PREFIX}_cache_hit_rate",
                              "Prompt tokens served from the radix cache / prompt tokens",
                              registry=r)
        self.queue_time = Histogram(f"{PREFIX}_queue_time_seconds",
                                    "Submission to first admission (the scheduler's clock)",
                                    buckets=TTFT_BUCKETS, registry=r)
        self.prefill_time = Histogram(f"{PREFIX}_prefill_time_seconds",
                                      "First admission to first token (the scheduler's clock)",
                                      buckets=TTFT_BUCKETS, registry=r)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "Time to first token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(f"{PREFIX}_inter_token_latency_seconds",
                             "Time between consecutive output tokens", buckets=ITL_BUCKETS,
                             registry=r)
        self.e2e = Histogram(f"{PREFIX}_e2e_request_latency_seconds",
                             "Arrival to finish of a request", buckets=E2E_BUCKETS, registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of finished "
                                     "requests", registry=r)
        self.cached_tokens = Counter(f"{PREFIX}_cached_prompt_tokens",
                                     "Prompt tokens served from the radix cache", registry=r)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Generated tokens",
                                         registry=r)
        self.requests = Counter(f"{PREFIX}_requests", "Finished requests", registry=r)
        self.finished = Counter(f"{PREFIX}_request_finish", "Finished samples by reason",
                                ["reason"], registry=r)
        self.rejected = Counter(f"{PREFIX}_rejected_requests",
                                "Requests refused before they ran, by HTTP status", ["status"],
                                registry=r)
        self.preemptions = Gauge(f"{PREFIX}_preemptions",
                                 "Requests preempted for KV so far, by mode", ["mode"],
                                 registry=r)
        self.preemptions_by_cause = Gauge(f"{PREFIX}_preemptions_by_cause",
                                          "Requests preempted so far, by cause: memory (KV ran "
                                          "out), priority (a more urgent request waited), "
                                          "fair_share (a tenant under its share waited)",
                                          ["cause"], registry=r)
        self.tenant_running = Gauge(f"{PREFIX}_tenant_running_requests",
                                    "Requests running now, by tenant (fair share's slots)",
                                    ["tenant"], registry=r)
        self.swap_fallbacks = Gauge(f"{PREFIX}_swap_fallbacks",
                                    "Swap preemptions done by recompute: the swap space was "
                                    "full", registry=r)
        self.grammar_masks = Gauge(f"{PREFIX}_grammar_masks",
                                   "Grammar masks built so far (one per constrained row per step)",
                                   registry=r)
        self.grammar_mask_seconds = Gauge(f"{PREFIX}_grammar_mask_seconds",
                                          "Seconds spent building grammar masks so far (on the "
                                          "worker's mask thread, beside the forward pass); "
                                          "divide by grammar_masks for the cost per token",
                                          registry=r)
        self.images = {
            key: Gauge(f"{PREFIX}_{key}", text, registry=r) for key, text in (
                ("images_encoded", "Images the vision encoder computed features of so far"),
                ("image_cache_hits", "Images whose features came from the encoder's cache "
                                     "(a picture sent again, a request computed again)"),
                ("image_encode_seconds", "Seconds the vision encoder ran so far"),
                ("decoded_image_bytes", "Bytes of requests' decoded pictures held now (bounded: "
                                        "past the bound a 429)"),
                ("decoded_images_refused", "Images refused with a 429 at that bound so far"))}
        self.grammar_mask_wait = Gauge(f"{PREFIX}_grammar_mask_wait_seconds",
                                       "Seconds sampling waited for grammar masks after the "
                                       "forward pass so far (mask time the pass did not hide)",
                                       registry=r)
        self.spec = {
            key: Gauge(f"{PREFIX}_{key}", text, registry=r) for key, text in (
                ("spec_verifications", "Speculative decoding: runs whose drafts were verified"),
                ("spec_drafted_tokens", "Speculative decoding: tokens drafted so far"),
                ("spec_accepted_tokens", "Speculative decoding: drafted tokens accepted so far"),
                ("spec_tree_verifications", "Speculative decoding: verified drafts that were "
                 "trees (branches where continuations part) so far"),
                ("spec_branch_accepted_tokens", "Speculative decoding: drafted tokens accepted "
                 "on a branch off a draft tree's main line so far"),
                ("draft_lookups", "Speculative decoding: draft lookups (radix tree and the "
                 "request's own tokens) so far"),
                ("draft_lookup_seconds", "Speculative decoding: seconds spent looking drafts "
                 "up so far"),
                ("draft_index_entries", "Speculative decoding: places of n-grams of the radix "
                 "tree's tokens the draft index holds"),
            )}
        self.spec_lengths = Gauge(f"{PREFIX}_spec_accept_length",
                                  "Speculative decoding: verified runs by how many drafted "
                                  "tokens they accepted (the acceptance-length histogram)",
                                  ["accepted"], registry=r)
        self.tier = {
            key: Gauge(f"{PREFIX}_kv_tier_{key}", text, ["tier"], registry=r) for key, text in (
                ("tokens", "KV tiers: each tier's size in tokens (device = the pool)"),
                ("cached_tokens", "KV tiers: tokens of the radix cache held in each tier now"),
                ("hit_tokens", "KV tiers: prompt tokens served from each tier so far (a device "
                 "hit, or loaded back from host or disk)"))}
        self.tier_moved = Gauge(f"{PREFIX}_kv_tier_moved_tokens",
                                "KV tiers: tokens moved between tiers so far, by direction",
                                ["direction"], registry=r)
        self.tier_seconds = Gauge(f"{PREFIX}_kv_tier_move_seconds",
                                  "KV tiers: seconds the worker spent moving pages so far",
                                  registry=r)
        self.pinned = Gauge(f"{PREFIX}_pinned_prefixes",
                            "Prefixes pinned in the radix cache (DSL forks, HTTP pins)",
                            registry=r)
        self.pinned_tokens = Gauge(f"{PREFIX}_pinned_tokens",
                                   "KV tokens the pins keep locked (shared ones once)", registry=r)
        self.pins_refused = Gauge(f"{PREFIX}_pins_refused",
                                  "Pins refused by the pin budget so far", registry=r)
        self.leases = Gauge(f"{PREFIX}_pin_leases", "Pin leases held", registry=r)
        self.leases_expired = Gauge(f"{PREFIX}_pin_leases_expired",
                                    "Pin leases that ran out (their clients stopped renewing)",
                                    registry=r)
        # by class of service (labels: at most MAX_METRIC_LABELS tenants / priorities each)
        by_class = ["priority", "tenant"]
        self.class_requests = Counter(f"{PREFIX}_class_requests",
                                      "Finished requests by priority and tenant", by_class,
                                      registry=r)
        self.class_tokens = Counter(f"{PREFIX}_class_tokens",
                                    "Prompt and generated tokens of finished requests, by "
                                    "priority and tenant", by_class + ["kind"], registry=r)
        self.class_queue = Counter(f"{PREFIX}_class_queue_seconds",
                                   "Seconds finished requests waited in the queue, by priority "
                                   "and tenant (divide by class_requests for the mean)",
                                   by_class, registry=r)
        self.class_queue_time = Histogram(f"{PREFIX}_queue_time_by_priority_seconds",
                                          "Submission to first admission, by priority",
                                          ["priority"], buckets=TTFT_BUCKETS, registry=r)
        self.preempts_caused = Gauge(f"{PREFIX}_preemptions_caused",
                                     "Running requests preempted for more urgent ones so far, "
                                     "by the urgent request's priority or tenant",
                                     ["by", "value"], registry=r)
        self.queue_timeouts = Gauge(f"{PREFIX}_queue_timeouts",
                                    "Requests that waited past their timeout", registry=r)
        self.queue_full = Gauge(f"{PREFIX}_queue_full_refusals",
                                "Requests refused because a queue was at its cap", registry=r)
        self.gateway = [(Gauge(name, text, registry=r), figure)
                        for name, text, figure in GATEWAY_GAUGES]
        self.cache_info = [Gauge(name, "KV cache shape: page size and page count (value 1)",
                                 [size, count], registry=r)
                           for name, size, count in GATEWAY_CACHE_INFO]
        # by LoRA adapter ("" the base model; at most MAX_METRIC_LABELS adapters named)
        self.lora_requests = Counter(f"{PREFIX}_lora_requests",
                                     "Finished requests by LoRA adapter (\"\": the base model)",
                                     ["adapter"], registry=r)
        self.lora_tokens = Counter(f"{PREFIX}_lora_tokens",
                                   "Prompt, cached and generated tokens of finished requests, by "
                                   "LoRA adapter", ["adapter", "kind"], registry=r)
        # pooling requests (embeddings, classification and rerank scores), by task
        self.pooling_requests = Counter(f"{PREFIX}_pooling_requests",
                                        "Finished pooling requests (one per input) by task",
                                        ["task"], registry=r)
        self.pooling_tokens = Counter(f"{PREFIX}_pooling_tokens", "Prompt and cached tokens of "
                                      "finished pooling requests, by task", ["task", "kind"],
                                      registry=r)
        self.pooling_time = Histogram(f"{PREFIX}_pooling_seconds", "Pooling requests, "
                                      "submission to result (seconds)", buckets=E2E_BUCKETS,
                                      registry=r)
        self.grammar_compile = Histogram(f"{PREFIX}_grammar_compile_seconds",
                                         "Grammars compiled for requests (not found in the "
                                         "compiler's cache): submission to compiled (seconds)",
                                         buckets=COMPILE_BUCKETS, registry=r)
        self.grammar_requests = Counter(f"{PREFIX}_grammar_requests", "Constrained requests, "
                                        "by whether their grammar was in the compiler's cache",
                                        ["cache"], registry=r)
        self.tenant_weight = Gauge(f"{PREFIX}_tenant_weight", "Fair-share weight of each "
                                   "tenant with a configured weight (others weigh 1)",
                                   ["tenant"], registry=r)
        self._labels: dict[str, set[str]] = {"priority": set(), "tenant": set(), "adapter": set()}
        manager.on_finish(self.record)

    def _label(self, kind: str, value: str) -> str:
        """`value` as a label of `kind`; past MAX_METRIC_LABELS distinct values, "other"."""
        seen = self._labels[kind]
        if value not in seen:
            if len(seen) >= MAX_METRIC_LABELS:
                return OTHER_LABEL
            seen.add(value)
        return value

    def record(self, m: RequestMetrics) -> None:
        """on_finish callback. A request the runtime refused (no first token and nothing
        generated) is left out of the latency figures."""
        self.requests.inc()
        priority = self._label("priority", str(m.priority))
        tenant = self._label("tenant", m.tenant)
        self.class_requests.labels(priority, tenant).inc()
        self.class_tokens.labels(priority, tenant, "generated").inc(m.completion_tokens)
        adapter = self._label("adapter", m.lora)
        self.lora_requests.labels(adapter).inc()
        for kind, count in (("prompt", m.prompt_tokens), ("cached", m.cached_tokens),
                            ("generated", m.completion_tokens)):
            self.lora_tokens.labels(adapter, kind).inc(count)
        if m.queue is not None:
            self.class_queue.labels(priority, tenant).inc(m.queue)
            self.class_queue_time.labels(priority).observe(m.queue)
        for reason in m.finish_reasons:
            self.finished.labels(reason="error" if reason.startswith("error") else reason).inc()
        if m.pooling and m.finished is not None and m.finish_reasons == ["length"]:
            self.pooling_requests.labels(m.pooling).inc()
            self.pooling_tokens.labels(m.pooling, "prompt").inc(m.prompt_tokens)
            self.pooling_tokens.labels(m.pooling, "cached").inc(m.cached_tokens)
            self.pooling_time.observe(m.finished - m.arrival)
        if m.grammar is not None:
            self.grammar_requests.labels(cache="hit" if m.grammar.cached else "miss").inc()
            if not m.grammar.cached and m.grammar.ended is not None:
                self.grammar_compile.observe(m.grammar.ended - m.grammar.started)
        if m.queue is not None and m.prefill is not None:
            self.queue_time.observe(m.queue)
            self.prefill_time.observe(m.prefill)
        if m.first_token is None:
            return
        self.ttft.observe(m.first_token - m.arrival)
        for gap in m.inter_token:
            self.itl.observe(gap)
        if m.finished is not None:
            self.e2e.observe(m.finished - m.arrival)
        self.prompt_tokens.inc(m.prompt_tokens)
        self.cached_tokens.inc(m.cached_tokens)
        self.generation_tokens.inc(m.completion_tokens)
        self.class_tokens.labels(priority, tenant, "prompt").inc(m.prompt_tokens)

    async def scrape(self) -> bytes:
        self.update_gauges(await self.manager.server_info())
        return generate_latest(self.registry)

    def update_gauges(self, info: dict[str, Any]) -> None:
        self.running.set(info.get("running", 0))
        self.waiting.set(info.get("waiting", 0))
        total = info.get("kv_total", 0)
        kv_usage = 0.0
        if total:
            kv_usage = (info.get("kv_private", 0) + info.get("kv_locked", 0)) / total
            self.kv_usage.set(kv_usage)
            self.kv_cached.set(info.get("kv_evictable", 0) / total)
        self._update_gateway(info, kv_usage)
        self.hit_rate.set(info.get("cache_hit_rate", 0.0))
        swaps = info.get("swaps", 0)
        self.preemptions.labels(mode="swap").set(swaps)
        self.preemptions.labels(mode="recompute").set(info.get("preemptions", 0) - swaps)
        for cause, count in info.get("preemptions_by_cause", {}).items():
            self.preemptions_by_cause.labels(cause=cause).set(count)
        self.tenant_running.clear()  # tenants with nothing running drop out
        for tenant, count in info.get("running_by_tenant", {}).items():
            self.tenant_running.labels(tenant=tenant).set(count)
        for tenant, weight in info.get("tenant_weights", {}).items():
            self.tenant_weight.labels(tenant=tenant).set(weight)
        self.swap_fallbacks.set(info.get("swap_fallbacks", 0))
        self.grammar_masks.set(info.get("grammar_masks", 0))
        self.grammar_mask_seconds.set(info.get("grammar_mask_seconds", 0.0))
        self.grammar_mask_wait.set(info.get("grammar_mask_wait_seconds", 0.0))
        for key, gauge in self.images.items():
            gauge.set(info.get(key, 0))
        for key, gauge in self.spec.items():
            gauge.set(info.get(key, 0))
        for length, count in info.get("spec_accepted_lengths", {}).items():
            self.spec_lengths.labels(accepted=str(length)).set(count)
        self.pinned.set(info.get("pinned", 0))
        self.pinned_tokens.set(info.get("pinned_tokens", 0))
        self.pins_refused.set(info.get("pins_refused", 0))
        for by in ("priority", "tenant"):
            for value, count in info.get(f"preemptions_caused_by_{by}", {}).items():
                self.preempts_caused.labels(by, value).set(count)
        self.queue_timeouts.set(info.get("queue_timeouts", 0))
        self.queue_full.set(info.get("queue_full", 0))
        self._update_tiers(info.get("kv_tiers"))
        self.leases.set(len(self.pins))
        self.leases_expired.set(self.pins.expired_total)

    def _update_tiers(self, tiers: dict[str, Any] | None) -> None:
        if not tiers:
            return
        for name in TIER_NAMES:
            for key, gauge in self.tier.items():
                if name in tiers:
                    gauge.labels(tier=name).set(tiers[name][key])
        for direction, tokens in tiers["moved_tokens"].items():
            self.tier_moved.labels(direction=direction).set(tokens)
        self.tier_seconds.set(tiers["move_seconds"])

    def _update_gateway(self, info: dict[str, Any], kv_usage: float) -> None:
        figures = {"waiting": info.get("waiting", 0), "running": info.get("running", 0),
                   "kv_usage": kv_usage}
        for gauge, figure in self.gateway:
            gauge.set(figures[figure])
        page_size = max(1, int(info.get("page_size", 1)))
        pages = int(info.get("kv_total", 0)) // page_size
        for gauge in self.cache_info:
            gauge.clear()
            gauge.labels(str(page_size), str(pages)).set(1)

    def reject(self, status: int) -> None:
        """An error handler refused a request with this status."""
        self.rejected.labels(status=str(status)).inc()
