"""The embedded expert-parallel MoE engine.

It runs as two processes: the API process (``engine.server``, ``engine.client``:
HTTP, SSE, tokenizer) and the engine-core process (``engine.core_proc`` around
``engine.core``: scheduler, KV cache, executor), talking over ZeroMQ with
``engine.wire``'s messages.  It records plain dataclasses (``engine.stats``)
and never exports them: the ``exporters`` package turns them into metrics.
Importing this package is cheap; torch is imported only by the modules that
run the model, never by the API process.
"""
