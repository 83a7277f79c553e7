"""Readers for LLM-serving request traces, into one typed structure.

Formats (chosen by ``fmt`` or detected from the header / file suffix):

- ``azure``: Azure LLM inference CSV, ``TIMESTAMP,ContextTokens,GeneratedTokens``
  (2023 Splitwise and 2024 DynamoLLM per-request files).
- ``mooncake``: JSONL with ``timestamp`` (ms), ``input_length``, ``output_length``.
- ``burstgpt``: BurstGPT CSV, ``Timestamp`` (s), ``Request tokens``, ``Response tokens``
  (columns read by name; rows with 0 response tokens are failed requests and dropped).
- ``counts``: request counts per time bin, ``Time,TIMESTAMP`` where ``TIMESTAMP`` is the
  count (the azure-llm-2024 aggregates); token lengths come from a :class:`LengthDistribution`.

Per-request traces load as :class:`RequestTrace`; count traces as :class:`CountTrace`, which
``expand()`` turns into requests (a Poisson process conditioned on each bin's count).  Every
malformed input raises :class:`contracts.errors.DataError` naming the file and line.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from contracts.errors import DataError
from contracts.text_files import not_utf8_error
from contracts.trace_fields import cell, column_index, csv_rows, epoch_s, seconds, tokens

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
TraceFormat = Literal["azure", "mooncake", "burstgpt", "counts"]

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
_COUNT_COLUMNS = ("Time", "TIMESTAMP")
_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
PREFIX_BLOCK_TOKENS = 512
"""Tokens per prefix block of Mooncake's ``hash_ids``."""


@dataclass(frozen=True, eq=False)
class RequestTrace:
    """Requests in arrival order; times in seconds from the first arrival."""

    source: str
    arrival_s: FloatArray
    prompt_tokens: IntArray
    output_tokens: IntArray
    start_epoch_s: float | None = None
    """Wall-clock (Unix, UTC where the format says so) time of ``arrival_s == 0``, if known."""
    prefix_blocks: tuple[IntArray, ...] | None = None
    """Per request, the hash IDs of its prompt's KV blocks of :data:`PREFIX_BLOCK_TOKENS` tokens (Mooncake's
    ``hash_ids``): requests with the same leading IDs share that prefix.  None: the format has none."""

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.prompt_tokens) != n or len(self.output_tokens) != n:
            raise ValueError("arrival_s, prompt_tokens and output_tokens must have the same length")
        if self.prefix_blocks is not None and len(self.prefix_blocks) != n:
            raise ValueError("prefix_blocks must have one entry per request")

    def _blocks(self, index: IntArray | slice) -> tuple[IntArray, ...] | None:
        if self.prefix_blocks is None:
            return None
        if isinstance(index, slice):
            return self.prefix_blocks[index]
        return tuple(self.prefix_blocks[i] for i in index)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0

    def counts(self, bin_s: float) -> FloatArray:
        """Requests per bin of ``bin_s`` seconds, from time 0 to the last arrival."""
        n_bins = int(self.duration_s // bin_s) + 1
        return np.bincount((self.arrival_s // bin_s).astype(np.int64), minlength=n_bins).astype(np.float64)

    def token_sums(self, bin_s: float) -> tuple[FloatArray, FloatArray]:
        """Prompt and output tokens per bin (same bins as :meth:`counts`)."""
        n_bins = int(self.duration_s // bin_s) + 1
        index = (self.arrival_s // bin_s).astype(np.int64)
        prompt = np.bincount(index, weights=self.prompt_tokens, minlength=n_bins)
        output = np.bincount(index, weights=self.output_tokens, minlength=n_bins)
        return prompt.astype(np.float64), output.astype(np.float64)

    def speedup(self, factor: float) -> RequestTrace:
        """The same requests, ``factor`` times faster (arrival times divided by it)."""
        _check_factor("speedup", factor)
        return RequestTrace(
            f"{self.source} x{factor:g} speed",
            self.arrival_s / factor,
            self.prompt_tokens,
            self.output_tokens,
            self.start_epoch_s,
            self.prefix_blocks,
        )

    def rate_scale(self, factor: float, *, seed: int = 0, jitter_s: float = 5.0) -> RequestTrace:
        """``factor`` times as many requests over the same span.

        Below 1, requests are thinned at random.  Above 1, each request is copied
        ``floor(factor)`` or ``ceil(factor)`` times (so the mean is exact); copies move by a
        uniform jitter of up to ``jitter_s`` so they do not arrive at the same instant.
        """
        _check_factor("rate scale", factor)
        rng = np.random.default_rng(seed)
        whole = int(np.floor(factor))
        copies = np.full(len(self), whole, dtype=np.int64) + (rng.random(len(self)) < factor - whole)
        index = np.repeat(np.arange(len(self)), copies)
        first_copy = np.r_[True, index[1:] != index[:-1]] if len(index) else np.zeros(0, dtype=bool)
        jitter = rng.uniform(-jitter_s, jitter_s, len(index)) * ~first_copy
        arrival = np.clip(self.arrival_s[index] + jitter, 0.0, self.duration_s)
        order = np.argsort(arrival, kind="stable")
        return RequestTrace(
            f"{self.source} x{factor:g} rate",
            arrival[order],
            self.prompt_tokens[index][order],
            self.output_tokens[index][order],
            self.start_epoch_s,
            self._blocks(index[order]),
        )

    def window(self, start_s: float, end_s: float) -> RequestTrace:
        """Requests arriving in ``[start_s, end_s)``, times shifted to start at 0."""
        lo, hi = np.searchsorted(self.arrival_s, [start_s, end_s])
        epoch = None if self.start_epoch_s is None else self.start_epoch_s + start_s
        return RequestTrace(
            self.source,
            self.arrival_s[lo:hi] - start_s,
            self.prompt_tokens[lo:hi],
            self.output_tokens[lo:hi],
            epoch,
            self._blocks(slice(lo, hi)),
        )


@dataclass(frozen=True, eq=False)
class LengthDistribution:
    """Joint (prompt, output) token lengths to draw from, e.g. a real trace's rows."""

    name: str
    prompt_tokens: IntArray
    output_tokens: IntArray

    def __post_init__(self) -> None:
        if len(self.prompt_tokens) == 0 or len(self.prompt_tokens) != len(self.output_tokens):
            raise ValueError("a length distribution needs at least one (prompt, output) pair")

    @classmethod
    def from_trace(cls, trace: RequestTrace) -> LengthDistribution:
        return cls(trace.source, trace.prompt_tokens, trace.output_tokens)

    @classmethod
    def fixed(cls, prompt_tokens: int, output_tokens: int) -> LengthDistribution:
        return cls(
            f"fixed:{prompt_tokens},{output_tokens}",
            np.array([prompt_tokens], dtype=np.int64),
            np.array([output_tokens], dtype=np.int64),
        )

    @property
    def mean_prompt_tokens(self) -> float:
        return float(self.prompt_tokens.mean())

    @property
    def mean_output_tokens(self) -> float:
        return float(self.output_tokens.mean())

    def sample(self, n: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
        """``n`` pairs drawn with replacement (prompt and output stay paired)."""
        pick = rng.integers(0, len(self.prompt_tokens), n)
        return self.prompt_tokens[pick], self.output_tokens[pick]

    def sample_stratified(self, n: int, rng: np.random.Generator, block: int) -> tuple[IntArray, IntArray]:
        """``n`` pairs in blocks of ``block`` consecutive draws, each block one draw from each of ``block``
        equal prompt-length strata of the rows, in random order (the last block a random part of one).

        Every block then holds the distribution's mix, long tail included, as each few minutes of a
        large service's traffic does; independent draws' means over a few dozen requests swing by a
        third with a heavy-tailed prompt length, as much as a morning's rise.
        """
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        order = np.argsort(self.prompt_tokens, kind="stable")
        edges = np.linspace(0, len(order), block + 1)
        picks: list[IntArray] = []
        for start in range(0, n, block):
            inside = edges[:-1] + rng.random(block) * (edges[1:] - edges[:-1])
            stratum = order[np.minimum(inside.astype(np.int64), len(order) - 1)]
            picks.append(rng.permutation(stratum)[: n - start])
        pick = np.concatenate(picks) if picks else np.zeros(0, dtype=np.int64)
        return self.prompt_tokens[pick], self.output_tokens[pick]


@dataclass(frozen=True, eq=False)
class CountTrace:
    """Request counts per fixed-width bin; bin ``i`` covers ``[i*bin_s, (i+1)*bin_s)``."""

    source: str
    bin_s: float
    counts: FloatArray
    start_epoch_s: float | None = None

    def __len__(self) -> int:
        return len(self.counts)

    @property
    def duration_s(self) -> float:
        return len(self.counts) * self.bin_s

    @property
    def total_requests(self) -> int:
        return int(self.counts.sum())

    def speedup(self, factor: float) -> CountTrace:
        _check_factor("speedup", factor)
        return CountTrace(f"{self.source} x{factor:g} speed", self.bin_s / factor, self.counts, self.start_epoch_s)

    def rate_scale(self, factor: float, *, seed: int = 0) -> CountTrace:
        """Counts times ``factor``, rounded stochastically so the expected total is exact."""
        _check_factor("rate scale", factor)
        scaled = self.counts * factor
        floor = np.floor(scaled)
        rounded = floor + (np.random.default_rng(seed).random(len(scaled)) < scaled - floor)
        return CountTrace(f"{self.source} x{factor:g} rate", self.bin_s, rounded, self.start_epoch_s)

    def expand(self, lengths: LengthDistribution, *, seed: int = 0) -> RequestTrace:
        """Per-request arrivals: uniform within each bin, lengths drawn from ``lengths``."""
        rng = np.random.default_rng(seed)
        counts = self.counts.astype(np.int64)
        bins = np.repeat(np.arange(len(counts)), counts)
        arrival = np.sort((bins + rng.random(len(bins))) * self.bin_s)
        prompt, output = lengths.sample(len(arrival), rng)
        return RequestTrace(f"{self.source} + lengths {lengths.name}", arrival, prompt, output, self.start_epoch_s)


Trace = RequestTrace | CountTrace


def _check_factor(what: str, factor: float) -> None:
    if not (factor > 0 and np.isfinite(factor)):
        raise ValueError(f"{what} factor must be a positive number, got {factor}")


def detect_format(path: Path) -> TraceFormat:
    """The format of ``path`` from its suffix and header line."""
    if path.suffix in (".jsonl", ".json"):
        return "mooncake"
    header = _first_line(path)
    columns = {c.strip() for c in next(csv.reader([header]), [])}
    if set(_AZURE_COLUMNS) <= columns:
        return "azure"
    if set(_BURSTGPT_COLUMNS) <= columns:
        return "burstgpt"
    if set(_COUNT_COLUMNS) <= columns:
        return "counts"
    if header.lstrip().startswith("{"):
        return "mooncake"
    raise DataError(
        f"unrecognised trace header {header.strip()[:120]!r}; expected one of "
        f"{','.join(_AZURE_COLUMNS)} (azure), {','.join(_BURSTGPT_COLUMNS)} (burstgpt), "
        f"{','.join(_COUNT_COLUMNS)} (counts) or JSON lines (mooncake)",
        path=str(path),
        line=1,
    )


def _first_line(path: Path) -> str:
    try:
        with path.open("r", encoding="utf-8-sig") as handle:
            line = handle.readline()
    except FileNotFoundError as exc:
        raise DataError("file not found", path=str(path)) from exc
    except UnicodeDecodeError as exc:
        raise not_utf8_error(path, exc) from exc
    if not line.strip():
        raise DataError("file is empty", path=str(path), line=1)
    return line


def load_trace(
    path: str | os.PathLike[str],
    fmt: TraceFormat | None = None,
) -> Trace:
    """Read a trace file; a :class:`CountTrace` for ``counts``, else a :class:`RequestTrace`."""
    file = Path(path)
    kind = fmt or detect_format(file)
    if kind == "mooncake":
        return _read_mooncake(file)
    rows = csv_rows(file)
    header = next(rows, None)
    if header is None:
        raise DataError("file is empty", path=str(file), line=1)
    if kind == "azure":
        return _read_azure(file, header[1], rows)
    if kind == "burstgpt":
        return _read_burstgpt(file, header[1], rows)
    return _read_counts(file, header[1], rows)


def load_request_trace(
    path: str | os.PathLike[str],
    fmt: TraceFormat | None = None,
    *,
    lengths: LengthDistribution | None = None,
    seed: int = 0,
) -> RequestTrace:
    """Read any trace as requests; count traces need ``lengths`` to expand."""
    trace = load_trace(path, fmt)
    if isinstance(trace, RequestTrace):
        return trace
    if lengths is None:
        raise DataError("a count trace needs a length distribution (e.g. --lengths azure-2023-conv)", path=str(path))
    return trace.expand(lengths, seed=seed)


class _Builder:
    """Collects rows in any order; :meth:`build` puts them in arrival order.

    A request log is often written as requests finish, so its rows can be out of arrival order
    (a log merged from several servers, or rows written at completion): the replay only needs
    each request's arrival time, so rows are sorted (stably: equal times keep the file's order).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.times: list[float] = []
        self.prompt: list[int] = []
        self.output: list[int] = []
        self.blocks: list[IntArray] = []

    def add(self, time_s: float, prompt: int, output: int) -> None:
        self.times.append(time_s)
        self.prompt.append(prompt)
        self.output.append(output)

    def build(self, *, wall_clock: bool = False) -> RequestTrace:
        """The trace; ``wall_clock``: the times are Unix seconds, so the first arrival's is its start."""
        if not self.times:
            raise DataError("no requests (header only)", path=str(self.path), line=2)
        if not any(self.prompt) and not any(self.output):
            raise DataError(f"every one of its {len(self.times)} requests has 0 prompt and 0 output tokens: "
                            "nothing to serve (are the token columns empty?)", path=str(self.path), line=2)  # fmt: skip
        times = np.asarray(self.times, dtype=np.float64)
        order = np.argsort(times, kind="stable")
        origin = float(times[order[0]])
        blocks = tuple(self.blocks[i] for i in order) if self.blocks and len(self.blocks) == len(times) else None
        return RequestTrace(
            str(self.path),
            times[order] - origin,
            np.asarray(self.prompt, dtype=np.int64)[order],
            np.asarray(self.output, dtype=np.int64)[order],
            origin if wall_clock else None,
            blocks,
        )


def _read_azure(path: Path, header: list[str], rows: Iterator[tuple[int, list[str]]]) -> RequestTrace:
    t_i, p_i, o_i = column_index(path, header, _AZURE_COLUMNS)
    builder = _Builder(path)
    for line, fields in rows:
        stamp = cell(path, line, fields, t_i, "TIMESTAMP")
        builder.add(
            epoch_s(path, line, stamp),
            tokens(path, line, cell(path, line, fields, p_i, "ContextTokens"), "ContextTokens"),
            tokens(path, line, cell(path, line, fields, o_i, "GeneratedTokens"), "GeneratedTokens"),
        )
    return builder.build(wall_clock=True)


def _read_burstgpt(path: Path, header: list[str], rows: Iterator[tuple[int, list[str]]]) -> RequestTrace:
    t_i, p_i, o_i = column_index(path, header, _BURSTGPT_COLUMNS)
    builder = _Builder(path)
    failed = 0
    for line, fields in rows:
        time_s = seconds(path, line, cell(path, line, fields, t_i, "Timestamp"), "Timestamp")
        prompt = tokens(path, line, cell(path, line, fields, p_i, "Request tokens"), "Request tokens")
        output = tokens(path, line, cell(path, line, fields, o_i, "Response tokens"), "Response tokens")
        if output == 0:
            failed += 1
            continue  # a failed request: BurstGPT's own *_without_fails files drop these rows
        builder.add(time_s, prompt, output)
    if failed and not builder.times:
        raise DataError(f"every one of its {failed} rows is a failed request (0 response tokens): nothing to replay",
                        path=str(path), line=2)  # fmt: skip
    return builder.build()


def _read_counts(path: Path, header: list[str], rows: Iterator[tuple[int, list[str]]]) -> CountTrace:
    t_i, c_i = column_index(path, header, _COUNT_COLUMNS)
    by_time: dict[float, tuple[float, int]] = {}  # bin start -> (count, line); rows may come in any order
    for line, fields in rows:
        time_s = epoch_s(path, line, cell(path, line, fields, t_i, "Time"))
        count = tokens(path, line, cell(path, line, fields, c_i, "TIMESTAMP"), "TIMESTAMP (count)")
        if time_s in by_time:
            raise DataError(f"bin {fields[t_i].strip()} appears twice (line {by_time[time_s][1]} too)",
                            path=str(path), line=line)  # fmt: skip
        by_time[time_s] = (float(count), line)
    if not by_time:
        raise DataError("no bins (header only)", path=str(path), line=2)
    times = sorted(by_time)
    counts = [by_time[t][0] for t in times]
    lines = [by_time[t][1] for t in times]
    if len(times) == 1:
        raise DataError("a count trace needs at least two bins to know the bin width", path=str(path), line=2)
    # Empty bins may be left out (a groupby-count writes none): the narrowest step is the bin width.
    steps = np.diff(np.asarray(times))
    bin_s = float(steps.min())
    bins = steps / bin_s
    uneven = np.flatnonzero(np.abs(bins - np.round(bins)) > 1e-6 * bins)
    if len(uneven):
        bad = int(uneven[0]) + 1
        raise DataError(
            f"a step of {steps[bad - 1]:g} s is not a whole number of {bin_s:g} s bins (bins must be evenly spaced)",
            path=str(path),
            line=lines[bad],
        )
    index = np.concatenate(([0], np.cumsum(np.round(bins).astype(np.int64))))
    filled = np.zeros(int(index[-1]) + 1)
    filled[index] = counts
    return CountTrace(str(path), bin_s, filled, times[0])


def _read_mooncake(path: Path) -> RequestTrace:
    _first_line(path)
    builder = _Builder(path)
    named = False
    with path.open("r", encoding="utf-8-sig") as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DataError(f"not valid JSON: {exc.msg}", path=str(path), line=line) from None
            if not isinstance(record, dict):
                raise DataError("each line must be a JSON object", path=str(path), line=line)
            missing = [k for k in _MOONCAKE_KEYS if k not in record]
            if missing:
                raise DataError(f"missing key(s) {', '.join(missing)}", path=str(path), line=line)
            time_ms = seconds(path, line, str(record["timestamp"]), "timestamp")
            builder.add(
                time_ms / 1000.0,
                tokens(path, line, str(record["input_length"]), "input_length"),
                tokens(path, line, str(record["output_length"]), "output_length"),
            )
            hashes = record.get("hash_ids")
            if hashes is not None and (not isinstance(hashes, list) or not all(isinstance(h, int) for h in hashes)):
                raise DataError("hash_ids must be a list of integers", path=str(path), line=line)
            # A row without hash_ids shares no prefix (one such row dropped every row's blocks).
            named = named or hashes is not None
            builder.blocks.append(np.asarray(hashes or [], dtype=np.int64))
    if not named:
        builder.blocks.clear()
    return builder.build()
