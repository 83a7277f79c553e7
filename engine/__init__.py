"""The embedded expert-parallel MoE engine.

It records plain dataclasses (``engine.stats``) and never exports them: the
``exporters`` package turns them into metrics.  Importing this package is
cheap; torch is imported only by the modules that run the model.
"""
