"""Data-parallel replicas behind the SGLang router: `radixrt serve --dp-size N`.

    client ──HTTP──▶ sglang-router (--host/--port, --router-policy) ──HTTP──▶ replica-0 .. N-1

Each replica is a complete `radixrt serve` (its own tokenizer, scheduler and worker processes,
its own radix cache, its own GPUs or share of the CPU cores) on a free port of --host; the router
(the optional dependency `radixrt[router]`) forwards each request to one of them, by default
with its cache_aware policy: an approximate radix tree of the text it sent each replica, so a
request goes where its prefix is cached while the loads stay balanced. plan.py decides who gets
what, router.py runs the router, deployment.py starts, watches and stops them all (fail-stop).
"""

from radixrt.runtime.replicas.deployment import serve_replicas

__all__ = ["serve_replicas"]
