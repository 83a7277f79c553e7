"""Trace readers: every format, speed-up and rate scaling, and errors that name the line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from contracts.errors import DataError
from contracts.traces import CountTrace, LengthDistribution, RequestTrace, load_request_trace, load_trace
from controller.replay.lengths import resolve_lengths
from tests.conftest import shared_data


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_azure_csv(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.5000000,374,44\n"
        "2023-11-16 18:15:48.0000000,396,109\n",
    )
    trace = load_trace(path)
    assert isinstance(trace, RequestTrace)
    np.testing.assert_allclose(trace.arrival_s, [0.0, 1.5])
    assert trace.prompt_tokens.tolist() == [374, 396]
    assert trace.output_tokens.tolist() == [44, 109]
    assert trace.start_epoch_s == pytest.approx(1700158546.5)


def test_a_utc_offset_is_honoured_whichever_its_sign(tmp_path: Path) -> None:
    """``+05:30`` was dropped (read as UTC) and ``-07:00`` converted with a warning: the start epoch moved."""
    starts = []
    for stamp in ("2023-11-16 18:15:46Z", "2023-11-16 23:45:46+05:30", "2023-11-16 11:15:46-07:00"):
        path = write(tmp_path, "a.csv", f"TIMESTAMP,ContextTokens,GeneratedTokens\n{stamp},1,1\n")
        starts.append(load_request_trace(path).start_epoch_s)
    assert starts == [pytest.approx(1700158546.0)] * 3


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path) -> None:
    """Spreadsheets save UTF-8 CSV with a byte-order mark: the Azure trace was refused as unrecognised."""
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5000000,374,44\n",
                     encoding="utf-8-sig")
    assert load_trace(azure).prompt_tokens.tolist() == [374]  # type: ignore[union-attr]
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2}\n', encoding="utf-8-sig")
    assert load_trace(mooncake).output_tokens.tolist() == [2]  # type: ignore[union-attr]


def test_mooncake_jsonl(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 1000, "input_length": 10, "output_length": 2, "hash_ids": [1]},
        {"timestamp": 3500, "input_length": 20, "output_length": 4},
    ]
    path = write(tmp_path, "m.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")
    trace = load_trace(path)
    assert isinstance(trace, RequestTrace)
    np.testing.assert_allclose(trace.arrival_s, [0.0, 2.5])
    assert trace.output_tokens.tolist() == [2, 4]
    # A row without hash_ids (or with null) shares no prefix; the others' blocks are kept.
    assert trace.prefix_blocks is not None and [b.tolist() for b in trace.prefix_blocks] == [[1], []]
    nameless = write(tmp_path, "n.jsonl", json.dumps({**lines[1], "hash_ids": None}) + "\n")
    assert load_request_trace(nameless).prefix_blocks is None


def test_burstgpt_reads_columns_by_name_and_drops_failures(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "b.csv",
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,s1,3,ChatGPT,472,18,490,Conversation log\n"
        "45,s1,3,ChatGPT,1087,0,1087,Conversation log\n"
        "118,,3,GPT-4,10,20,30,API log\n",
    )
    trace = load_trace(path)
    assert isinstance(trace, RequestTrace)
    np.testing.assert_allclose(trace.arrival_s, [0.0, 113.0])
    assert trace.prompt_tokens.tolist() == [472, 10]


def test_counts_expand_with_lengths(tmp_path: Path) -> None:
    path = write(tmp_path, "c.csv", "Time,TIMESTAMP\n2024-05-12 00:00:00,3\n2024-05-12 00:00:10,5\n")
    trace = load_trace(path)
    assert isinstance(trace, CountTrace)
    assert trace.bin_s == 10.0
    assert trace.counts.tolist() == [3.0, 5.0]
    requests = trace.expand(LengthDistribution.fixed(100, 7), seed=1)
    assert len(requests) == 8
    assert (requests.arrival_s[:3] < 10).all() and (requests.arrival_s[3:] >= 10).all()
    assert set(requests.output_tokens.tolist()) == {7}


def test_stratified_draws_put_one_of_each_prompt_stratum_in_every_block() -> None:
    prompts = np.arange(1, 101, dtype=np.int64)  # 100 rows: strata of 10 are the 1-10s, 11-20s, ...
    lengths = LengthDistribution("ramp", prompts, prompts * 2)
    prompt, output = lengths.sample_stratified(25, np.random.default_rng(3), block=10)
    assert len(prompt) == 25 and np.array_equal(output, prompt * 2)  # pairs kept
    for start in (0, 10):
        assert sorted((prompt[start:start + 10] - 1) // 10) == list(range(10))
    assert len(set((prompt[20:] - 1) // 10)) == 5  # the last, partial block: 5 different strata
    with pytest.raises(ValueError, match="block"):
        lengths.sample_stratified(5, np.random.default_rng(0), block=0)


def test_stratified_block_means_hold_the_mix_where_independent_draws_swing() -> None:
    rng = np.random.default_rng(0)
    heavy = np.maximum(1, rng.lognormal(4.5, 0.9, 5000)).astype(np.int64)  # a heavy-tailed prompt length
    lengths = LengthDistribution("lognormal", heavy, heavy)
    stratified, _ = lengths.sample_stratified(2000, np.random.default_rng(1), block=20)
    independent, _ = lengths.sample(2000, np.random.default_rng(1))
    spread = {name: np.ptp(draws.reshape(-1, 40).mean(axis=1) / heavy.mean())
              for name, draws in (("stratified", stratified), ("independent", independent))}
    assert spread["stratified"] < 0.5 * spread["independent"]


def test_speedup_and_rate_scale() -> None:
    arrival = np.arange(1000, dtype=np.float64)
    ones = np.ones(1000, dtype=np.int64)
    trace = RequestTrace("t", arrival, ones, ones)
    assert trace.speedup(10).duration_s == pytest.approx(99.9)
    doubled = trace.rate_scale(2.0, seed=3)
    assert len(doubled) == 2000 and np.all(np.diff(doubled.arrival_s) >= 0)
    assert doubled.duration_s <= trace.duration_s
    thinned = trace.rate_scale(0.5, seed=3)
    assert 400 < len(thinned) < 600
    assert len(trace.rate_scale(1.5, seed=3)) == len(trace.rate_scale(1.5, seed=3))
    with pytest.raises(ValueError, match="positive"):
        trace.speedup(0)


@pytest.mark.parametrize(
    ("name", "text", "line", "message"),
    [
        ("empty.csv", "", 1, "empty"),
        ("header.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", 2, "no requests"),
        ("cols.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,1\n", 1, "unrecognised trace header"),
        (
            "twice.csv",
            "Time,TIMESTAMP\n2024-05-12 00:00:10,3\n2024-05-12 00:00:00,5\n2024-05-12 00:00:10,1\n",
            4,
            "bin 2024-05-12 00:00:10 appears twice \\(line 2 too\\)",
        ),
        (
            "neg.csv",
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,x,1,1,2,a\n-3,x,1,1,2,a\n",
            3,
            "non-negative",
        ),
        (
            "tokens.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:48,1,1\n2023-11-16 18:15:49,abc,1\n",
            3,
            "not a number",
        ),
        ("nat.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:48,1,1\nNaT,1,1\n", 3,
         "timestamp 'NaT' is not a date-time"),
        ("blank.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:48,1,1\n,1,1\n", 3,
         "timestamp '' is not a date-time"),
        ("nat-bin.csv", "Time,TIMESTAMP\n2024-05-12 00:00:00,3\n2024-05-12 00:00:10,5\n nat ,1\n", 4,
         "timestamp 'nat' is not a date-time"),
        ("huge.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:48,1,1\n2023-11-16 18:15:49,1e300,1\n",
         3, "ContextTokens '1e300' must be an integer from 0 to 1,000,000,000"),
        ("zero.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:48,0,0\n2023-11-16 18:15:49,0,0\n",
         2, "every one of its 2 requests has 0 prompt and 0 output tokens"),
        ("zero.jsonl", '{"timestamp": 1, "input_length": 0, "output_length": 0}\n', 2, "0 prompt and 0 output"),
        (
            "short.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:48,1\n",
            2,
            "missing column",
        ),
        (
            "bad.jsonl",
            '{"timestamp": 1, "input_length": 1, "output_length": 1}\n{"timestamp": 2}\n',
            2,
            "missing key",
        ),
        (
            "counts.csv",
            "Time,TIMESTAMP\n2024-05-12 00:00:00,3\n2024-05-12 00:00:10,5\n2024-05-12 00:00:25,1\n",
            4,
            "a step of 15 s is not a whole number of 10 s bins",
        ),
    ],
)
def test_bad_files_name_the_line(tmp_path: Path, name: str, text: str, line: int, message: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(DataError, match=message) as info:
        load_trace(path)
    assert info.value.path == str(path)
    assert info.value.line == line
    assert f"{path}:{line}:" in str(info.value)


def test_rows_out_of_arrival_order_are_read_in_arrival_order(tmp_path: Path) -> None:
    """A log written as requests finish is not in arrival order: the replay needs arrival order."""
    azure = load_request_trace(write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                     "2023-11-16 18:15:48,1,10\n2023-11-16 18:15:46,2,20\n2023-11-16 18:15:47,3,30\n"))
    assert azure.arrival_s.tolist() == [0.0, 1.0, 2.0] and azure.prompt_tokens.tolist() == [2, 3, 1]
    assert azure.output_tokens.tolist() == [20, 30, 10]
    assert azure.start_epoch_s == load_request_trace(write(tmp_path, "b.csv", "TIMESTAMP,ContextTokens,Generated"
                                                           "Tokens\n2023-11-16 18:15:46,2,20\n")).start_epoch_s
    moon = load_request_trace(write(tmp_path, "m.jsonl", "\n".join(json.dumps(r) for r in (
        {"timestamp": 3000, "input_length": 900, "output_length": 1, "hash_ids": [7, 8]},
        {"timestamp": 1000, "input_length": 500, "output_length": 2, "hash_ids": [7]},
        {"timestamp": 1000, "input_length": 600, "output_length": 3, "hash_ids": [9]},
    ))))  # fmt: skip
    assert moon.arrival_s.tolist() == [0.0, 0.0, 2.0] and moon.prompt_tokens.tolist() == [500, 600, 900]
    assert moon.prefix_blocks is not None and [b.tolist() for b in moon.prefix_blocks] == [[7], [9], [7, 8]]
    counts = load_trace(write(tmp_path, "c.csv", "Time,TIMESTAMP\n2024-05-12 00:00:20,1\n"
                              "2024-05-12 00:00:00,3\n2024-05-12 00:00:10,5\n"))  # fmt: skip
    assert isinstance(counts, CountTrace) and counts.counts.tolist() == [3.0, 5.0, 1.0]


def test_a_burstgpt_file_of_failures_only_says_so(tmp_path: Path) -> None:
    path = write(tmp_path, "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,472,0,472,Conversation log\n9,ChatGPT,12,0,12,Conversation log\n")  # fmt: skip
    with pytest.raises(DataError, match="every one of its 2 rows is a failed request"):
        load_trace(path)


def test_missing_azure_column_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", "TIMESTAMP,ContextTokens,Other\n2023-11-16 18:15:48,1,1\n")
    with pytest.raises(DataError, match="GeneratedTokens"):
        load_trace(path, "azure")


def test_bins_without_requests_may_be_left_out_of_a_count_trace(tmp_path: Path) -> None:
    """A groupby-count (the 2024 trace's own script) writes no row for an empty bin: bursty services have gaps."""
    path = write(tmp_path, "c.csv", "Time,TIMESTAMP\n2024-05-12 00:00:00,3\n2024-05-12 00:00:30,5\n"
                 "2024-05-12 00:00:40,1\n")  # fmt: skip
    trace = load_trace(path)
    assert isinstance(trace, CountTrace) and trace.bin_s == 10.0
    assert trace.counts.tolist() == [3.0, 0.0, 0.0, 5.0, 1.0]


def test_count_trace_needs_lengths(tmp_path: Path) -> None:
    path = write(tmp_path, "c.csv", "Time,TIMESTAMP\n2024-05-12 00:00:00,3\n2024-05-12 00:00:10,5\n")
    with pytest.raises(DataError, match="length distribution"):
        load_request_trace(path)
    assert len(load_request_trace(path, lengths=resolve_lengths("fixed:5,6"))) == 8


def test_fixed_lengths_beyond_any_context_are_refused() -> None:
    """``fixed:1e20-ish`` overflowed numpy's 64-bit integers with a traceback."""
    with pytest.raises(DataError, match="from 1 to 1,000,000,000 prompt tokens"):
        resolve_lengths("fixed:100000000000000000000,1")
    assert resolve_lengths("fixed:1000000000,1").mean_prompt_tokens == 1e9


def test_real_traces_match_their_readme() -> None:
    conv = load_trace(shared_data("azure-llm-2023", "AzureLLMInferenceTrace_conv.csv"))
    assert isinstance(conv, RequestTrace)
    assert len(conv) == 19366
    assert conv.duration_s == pytest.approx(3501.7, abs=0.1)
    week = load_trace(shared_data("azure-llm-2024", "invocations_ten_second_Conversation.csv"))
    assert isinstance(week, CountTrace)
    assert week.total_requests == 27_303_999 and week.bin_s == 10.0
