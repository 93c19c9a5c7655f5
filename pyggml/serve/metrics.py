"""GET /metrics: Prometheus text with llama.cpp server's names (`llamacpp:` prefix) read from the engine's
stats at scrape time, plus the server's own request outcomes (accepted, completed, cancelled, ...)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from pyggml.serve.state import ServerState


class EngineCollector:
    """Collected on each scrape: nothing is counted twice and nothing runs between scrapes."""

    def __init__(self, state: ServerState):
        self.state = state

    def collect(self):
        loaded = self.state.loaded
        stats = loaded.engine.stats() if loaded is not None and loaded.engine is not None else None
        if stats is not None:
            yield from _engine_metrics(stats)
        yield GaugeMetricFamily("llamacpp:requests_in_flight", "sequences admitted and not yet finished",
                                value=self.state.in_flight)
        outcomes = CounterMetricFamily("pyggml:requests", "requests by outcome (accepted, then how each ended)",
                                       labels=["outcome"])
        for outcome, n in sorted(self.state.outcomes.items()):
            outcomes.add_metric([outcome], n)
        yield outcomes


def _engine_metrics(s):
    prompt_tps = s.prompt_tokens / s.prompt_s if s.prompt_s else 0.0
    gen_tps = s.gen_tokens / s.gen_s if s.gen_s else 0.0
    yield CounterMetricFamily("llamacpp:prompt_tokens", "prompt tokens processed", value=s.prompt_tokens)
    yield CounterMetricFamily("llamacpp:prompt_seconds", "seconds spent on prompts", value=s.prompt_s)
    yield CounterMetricFamily("llamacpp:tokens_predicted", "tokens generated", value=s.gen_tokens)
    yield CounterMetricFamily("llamacpp:tokens_predicted_seconds", "seconds spent generating", value=s.gen_s)
    yield GaugeMetricFamily("llamacpp:prompt_tokens_seconds", "average prompt throughput in tokens/s",
                            value=prompt_tps)
    yield GaugeMetricFamily("llamacpp:predicted_tokens_seconds", "average generation throughput in tokens/s",
                            value=gen_tps)
    yield GaugeMetricFamily("llamacpp:requests_processing", "busy slots", value=s.slots_busy)
    yield GaugeMetricFamily("llamacpp:requests_deferred", "requests queued for a slot", value=s.queued)
    yield GaugeMetricFamily("llamacpp:kv_cache_tokens", "KV cells in use", value=s.kv_cells_used)
    yield GaugeMetricFamily("llamacpp:kv_cache_usage_ratio", "KV cells in use / all cells",
                            value=s.kv_cells_used / s.kv_cells_total if s.kv_cells_total else 0.0)
    yield CounterMetricFamily("pyggml:prompt_tokens_cached", "prompt tokens reused from the cache",
                              value=s.cached_tokens)
    # llama-server's slot statistics n_draft_total and n_draft_accepted, as Prometheus counters (…_total)
    yield CounterMetricFamily("llamacpp:n_draft", "speculative decoding: draft tokens fed to the model",
                              value=s.draft_tokens)
    yield CounterMetricFamily("llamacpp:n_draft_accepted", "speculative decoding: draft tokens the model kept",
                              value=s.draft_accepted)


def render(state: ServerState) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(state))
    return generate_latest(registry)
