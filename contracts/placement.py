"""Expert placement: per MoE layer, which logical expert each physical slot holds.

Slots are numbered rank-major: slot ``s`` lives on rank ``s // slots_per_rank``,
as in DeepSeek's EPLB.  More slots than experts gives redundant replicas; the
engine splits each expert's tokens among its replicas.  numpy only, so the
controller can build and check placements without torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from contracts.errors import PlacementError
from contracts.imbalance import count_replicas
from contracts.text_files import read_text


@dataclass(frozen=True, eq=False)
class Placement:
    """``phy2log[layer, slot]`` = logical expert held by that physical slot."""

    phy2log: npt.NDArray[np.int64]
    num_ranks: int

    @property
    def num_layers(self) -> int:
        return int(self.phy2log.shape[0])

    @property
    def num_slots(self) -> int:
        return int(self.phy2log.shape[1])

    @property
    def slots_per_rank(self) -> int:
        return self.num_slots // self.num_ranks

    def rank_of_slot(self, slot: int) -> int:
        return slot // self.slots_per_rank

    def experts_on_rank(self, layer: int, rank: int) -> npt.NDArray[np.int64]:
        """Logical expert ids in the rank's slots of one layer, in slot order."""
        spr = self.slots_per_rank
        return self.phy2log[layer, rank * spr : (rank + 1) * spr]

    def replica_counts(self, num_experts: int) -> npt.NDArray[np.int64]:
        """(layers, experts) number of replicas of each logical expert."""
        return count_replicas(self.phy2log, num_experts)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Placement)
            and self.num_ranks == other.num_ranks
            and np.array_equal(self.phy2log, other.phy2log)
        )

    def __hash__(self) -> int:
        return hash((self.num_ranks, self.phy2log.tobytes()))

    @classmethod
    def contiguous(
        cls, num_layers: int, num_experts: int, num_ranks: int, slots_per_rank: int | None = None
    ) -> Placement:
        """Experts in order over the slots; extra slots replicate experts 0, 1, … in turn."""
        if slots_per_rank is None:
            slots_per_rank = -(-num_experts // num_ranks)
        num_slots = num_ranks * slots_per_rank
        if num_slots < num_experts:
            raise PlacementError(
                f"{num_ranks} ranks x {slots_per_rank} slots = {num_slots} slots cannot hold {num_experts} experts"
            )
        row = np.arange(num_slots, dtype=np.int64) % num_experts
        return cls(np.tile(row, (num_layers, 1)), num_ranks)

    def validate(self, *, num_layers: int, num_experts: int, num_ranks: int) -> None:
        """Raise PlacementError listing every problem; return silently if the placement is usable."""
        problems: list[str] = []
        arr = self.phy2log
        if arr.ndim != 2:
            raise PlacementError(f"phy2log must be 2-D (layers x slots), got shape {arr.shape}")
        if self.num_ranks != num_ranks:
            problems.append(f"placement is for {self.num_ranks} ranks but the engine runs {num_ranks}")
        if arr.shape[0] != num_layers:
            problems.append(f"phy2log has {arr.shape[0]} layers, the model has {num_layers} MoE layers")
        if self.num_ranks < 1 or arr.shape[1] % max(self.num_ranks, 1):
            problems.append(
                f"{arr.shape[1]} slots cannot be split evenly over {self.num_ranks} ranks"
            )
        if arr.size and (arr.min() < 0 or arr.max() >= num_experts):
            problems.append(f"expert ids must be in [0, {num_experts}), got {int(arr.min())}..{int(arr.max())}")
        elif arr.shape[1] < num_experts:
            problems.append(f"{arr.shape[1]} slots per layer cannot hold {num_experts} experts")
        else:
            for layer in range(arr.shape[0]):
                missing = np.setdiff1d(np.arange(num_experts), arr[layer])
                if missing.size:
                    shown = ", ".join(str(int(e)) for e in missing[:8])
                    more = f" and {missing.size - 8} more" if missing.size > 8 else ""
                    problems.append(f"layer {layer}: experts {shown}{more} have no replica")
        if problems:
            raise PlacementError(problems)

    def to_json(self) -> dict[str, Any]:
        return {"num_ranks": self.num_ranks, "slots_per_rank": self.slots_per_rank,
                "phy2log": self.phy2log.tolist()}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Placement:
        """The placement ``to_json`` wrote; PlacementError names every field that is missing or no whole number.

        ``phy2log`` is a layers x slots matrix of whole numbers; ``num_ranks`` a whole number >= 1
        (or, without it, ``slots_per_rank``, which must divide the slots), and where both are given
        they must agree.  Booleans, strings, null and fractions (2.5, even 2.0) are refused, never
        rounded.
        """
        if not isinstance(raw, dict):
            raise PlacementError(f"placement JSON must be an object with phy2log and num_ranks, got {_shown(raw)}")
        problems: list[str] = []
        arr = None
        if "phy2log" in raw:
            arr = _int_matrix(raw["phy2log"], problems)
        else:
            problems.append("placement JSON needs 'phy2log' as a layers x slots integer matrix")
        num_ranks = _whole(raw, "num_ranks", problems)
        slots_per_rank = _whole(raw, "slots_per_rank", problems)
        if "num_ranks" not in raw and "slots_per_rank" not in raw:
            problems.append("placement JSON needs 'num_ranks' or 'slots_per_rank'")
        if arr is not None and not problems:
            num_ranks = _ranks_of(arr.shape[1], num_ranks, slots_per_rank, problems)
        if problems or arr is None or num_ranks is None:
            raise PlacementError(problems)
        return cls(arr, num_ranks)

    @classmethod
    def load(cls, path: str | Path) -> Placement:
        text = read_text(path, what="placement")  # a DataError naming the file
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlacementError(f"cannot read placement {path}: {exc}") from exc
        return cls.from_json(raw)


def _shown(value: Any, limit: int = 80) -> str:
    """``value`` as the JSON it came from (null, true, "2", 2.5), else its repr; cut at ``limit`` characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_whole(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _whole(raw: dict[str, Any], name: str, problems: list[str]) -> int | None:
    """The field ``name`` as a whole number >= 1 (None where absent); a problem naming it otherwise."""
    if name not in raw:
        return None
    value = raw[name]
    if not _is_whole(value) or value < 1:
        problems.append(f"{name} must be a whole number >= 1, got {_shown(value)}")
        return None
    return int(value)


def _int_matrix(value: Any, problems: list[str]) -> npt.NDArray[np.int64] | None:
    """``phy2log`` as a layers x slots int64 matrix of whole numbers (None and a problem otherwise)."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu" and value.ndim == 2 and value.size:
        return value.astype(np.int64)
    if not isinstance(value, list) or not value or not all(isinstance(row, list) and row for row in value):
        problems.append(f"phy2log must be a layers x slots matrix (a non-empty list of non-empty lists), "
                        f"got {_shown(value)}")
        return None
    bad = [v for row in value for v in row if not _is_whole(v)]
    if bad:
        problems.append(f"phy2log entries must be whole numbers (expert ids), got {_shown(bad[0])}")
        return None
    if len({len(row) for row in value}) > 1:
        problems.append(f"phy2log rows must all have the same number of slots, got {sorted({len(r) for r in value})}")
        return None
    try:
        return np.asarray(value, dtype=np.int64)
    except OverflowError as exc:
        problems.append(f"phy2log entries must be expert ids: {exc}")
        return None


def _ranks_of(num_slots: int, num_ranks: int | None, slots_per_rank: int | None, problems: list[str]) -> int | None:
    """The ranks ``num_slots`` slots per layer are split over, from ``num_ranks`` or ``slots_per_rank``."""
    if num_ranks is None:
        assert slots_per_rank is not None
        if num_slots % slots_per_rank:
            problems.append(f"slots_per_rank {slots_per_rank} does not divide phy2log's {num_slots} slots per layer")
            return None
        return num_slots // slots_per_rank
    if slots_per_rank is not None and num_ranks * slots_per_rank != num_slots:
        problems.append(f"num_ranks {num_ranks} x slots_per_rank {slots_per_rank} is not phy2log's "
                        f"{num_slots} slots per layer")
        return None
    return num_ranks
