"""The across-layer summaries of a vLLM engine whose MoE layers several workers count (pipeline stages).

Under pipeline parallelism each stage's counting worker publishes the layers it runs, all under the
engine's labels (``model_name``, ``engine``).  ``moe_imbalance_cv_across_layers`` and
``moe_balancedness_across_layers`` summarise every MoE layer of the engine, so they are taken over
all its stages' layers (one stage's summary each made duplicate series, or the last stage's alone):

* the snapshot route sees every worker's snapshot at a scrape: :func:`engine_summaries` groups them;
* in the multiprocess route each worker sets its own gauges (``mostrecent``: the latest write is
  served), so each stage writes its per-layer figures to a file in a folder beside
  ``prometheus_client``'s files and summarises over its own and the other stages' latest
  (:class:`StageBoard`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path

from contracts.catalogue import BALANCEDNESS_ACROSS_LAYERS, IMBALANCE_CV_ACROSS_LAYERS
from contracts.imbalance import across_layers
from engine.vllm_plugin import ExpertLoadSnapshot

logger = logging.getLogger("moeslo.vllm_plugin")

LayerFigures = dict[int, tuple[float, float]]
"""Per MoE layer (its ``layer`` label): the window's imbalance CV and balancedness."""

Summaries = dict[str, dict[str, float]]
"""``{family: {stat: value}}`` of the across-layer families."""

ACROSS_LAYER_FAMILIES = (IMBALANCE_CV_ACROSS_LAYERS, BALANCEDNESS_ACROSS_LAYERS)

STAGES_FOLDER = "moeslo-stages"
"""The folder, in ``PROMETHEUS_MULTIPROC_DIR``, where the stages of the multiprocess route meet."""


def layer_figures(snapshot: ExpertLoadSnapshot) -> LayerFigures:
    """The figures of the layers that routed tokens in the window: an empty one (the window restarts at a
    rearrangement) has no balance, where its zeros read as a perfectly balanced layer."""
    loaded = snapshot.window_rank_tokens.sum(axis=1) > 0
    rows = zip(snapshot.layer_ids, snapshot.imbalance_cv, snapshot.balancedness, loaded, strict=True)
    return {int(layer): (float(cv), float(bal)) for layer, cv, bal, routed in rows if routed}


def summaries(figures: LayerFigures) -> Summaries:
    """The across-layer families' values over ``figures``' layers; NaN with no layer routed (nothing to report)."""
    if not figures:
        return {name: dict.fromkeys(("min", "median", "max"), math.nan) for name in ACROSS_LAYER_FAMILIES}
    return {
        IMBALANCE_CV_ACROSS_LAYERS: across_layers([cv for cv, _ in figures.values()]),
        BALANCEDNESS_ACROSS_LAYERS: across_layers([bal for _, bal in figures.values()]),
    }


def engine_summaries(snapshots: Iterable[ExpertLoadSnapshot]) -> dict[tuple[str, str], Summaries]:
    """Per (model_name, engine): the summaries over the layers of all its workers' snapshots."""
    grouped: dict[tuple[str, str], LayerFigures] = {}
    for snap in snapshots:
        grouped.setdefault((snap.model_name, snap.engine), {}).update(layer_figures(snap))
    return {key: summaries(figures) for key, figures in grouped.items()}


class StageBoard:
    """Each worker's per-layer figures in ``<directory>/stage-<pid>.json``; summaries over every fresh file
    of the same engine (files older than ``max_age_s`` are from a worker that is gone)."""

    def __init__(self, directory: str | Path, *, max_age_s: float = 30.0) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_age_s = max_age_s
        self.path = self.directory / f"stage-{os.getpid()}.json"

    def summaries(self, snapshot: ExpertLoadSnapshot) -> Summaries:
        """Post ``snapshot``'s figures; the summaries over its engine's layers in every stage."""
        own = layer_figures(snapshot)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"model_name": snapshot.model_name, "engine": snapshot.engine,
                                   "layers": [[layer, cv, bal] for layer, (cv, bal) in own.items()]}))  # fmt: skip
        os.replace(tmp, self.path)
        figures: LayerFigures = {}
        for other in self._others(snapshot.model_name, snapshot.engine):
            figures.update(other)
        figures.update(own)
        return summaries(figures)

    def _others(self, model_name: str, engine: str) -> list[LayerFigures]:
        now = time.time()
        out = []
        for path in sorted(self.directory.glob("stage-*.json")):
            if path == self.path:
                continue
            try:
                if now - path.stat().st_mtime > self.max_age_s:
                    continue
                raw = json.loads(path.read_text())
                if raw["model_name"] == model_name and raw["engine"] == engine:
                    out.append({int(layer): (float(cv), float(bal)) for layer, cv, bal in raw["layers"]})
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logger.debug("moeslo: skipping unreadable stage file %s: %s", path, exc)
        return out


__all__ = ["STAGES_FOLDER", "LayerFigures", "StageBoard", "Summaries", "engine_summaries", "layer_figures", "summaries"]
