"""Prometheus metrics of one server (its own ``CollectorRegistry``, so several apps can coexist)."""

from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 128)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class TokenRate:
    """Tokens per second over a sliding window, fed from the worker thread."""

    def __init__(self, window_s: float = 2.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        """Record ``n`` tokens produced now."""
        now = time.perf_counter()
        with self._lock:
            self._events.append((now, n))
            while self._events and self._events[0][0] < now - self.window_s:
                self._events.popleft()

    def rate(self) -> float:
        """Return the tokens per second over the last ``window_s`` seconds."""
        now = time.perf_counter()
        with self._lock:
            total = sum(n for t, n in self._events if t >= now - self.window_s)
        return total / self.window_s


class ServingMetrics:
    """The server's metrics. Names start with ``serve_``; see ``/metrics``."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge("serve_queue_depth", "Generation requests waiting for a batch slot", registry=r)
        self.active = Gauge("serve_active_sequences", "Sequences in the running decode batch", registry=r)
        self.batch_size = Histogram("serve_batch_size", "Sequences per forward pass", buckets=BATCH_BUCKETS, registry=r)
        self.prefill_size = Histogram("serve_prefill_batch_size", "Prompt chunks per forward pass that computed any",
                                      buckets=BATCH_BUCKETS, registry=r)
        self.latency = Histogram("serve_request_latency_seconds", "Time from arrival to the last token",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("serve_time_to_first_token_seconds", "Time from arrival to the first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("serve_tokens_generated", "Tokens generated", registry=r)
        self.requests = Counter("serve_requests", "Generation requests by outcome", ["outcome"], registry=r)
        self.engine_seconds = Counter("serve_engine_seconds", "Worker thread time by phase (forward pass, prefix "
                                      "cache copies, waiting for requests, bookkeeping)", ["phase"], registry=r)
        self.prefix_lookup_tokens = Counter("serve_prefix_cache_lookup_tokens", "Prompt tokens looked up in "
                                            "the prefix cache", registry=r)
        self.prefix_hit_tokens = Counter("serve_prefix_cache_hit_tokens", "Prompt tokens whose keys and values "
                                         "came from the prefix cache (not computed)", registry=r)
        self.prefix_bytes = Gauge("serve_prefix_cache_bytes", "Bytes of keys and values held by the prefix cache",
                                  registry=r)
        self.token_rate = TokenRate()
        self.tokens_per_s = Gauge("serve_tokens_per_second", "Tokens generated per second (2 s window)", registry=r)
        self.tokens_per_s.set_function(self.token_rate.rate)
        self.embed_batch = Histogram("serve_embed_batch_size", "Texts per embedding batch", buckets=BATCH_BUCKETS, registry=r)
        self.embed_requests = Counter("serve_embed_requests", "Embedding requests by outcome", ["outcome"], registry=r)

    def render(self) -> bytes:
        """Return the Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
