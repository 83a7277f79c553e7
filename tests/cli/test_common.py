"""Bad input on the command line ends in one ``error:`` line and exit status 2, never a traceback."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from contracts.errors import MoesloError

TRACE = Path(__file__).resolve().parents[2] / "harness" / "data" / "AzureLLMInferenceTrace_conv_15min.csv"
COUNTS = TRACE.with_name("AzureLLMInferenceTrace2024_conv_counts_2024-05-13.csv")


@pytest.fixture(autouse=True)
def _without_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOESLO_DEBUG", raising=False)


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    return result.exit_code, " ".join(result.output.split())  # rich wraps long lines


def test_brackets_in_a_message_are_printed_as_written(tmp_path: Path) -> None:
    code, out = run("policy", "apply", "-f", str(tmp_path / "[/x]y.yaml"))
    assert code == 2 and "[/x]y.yaml" in out and "error:" in out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("serve", "--checkpoint", ".", "--ep", "0"), "--ep"),
        (("serve", "--checkpoint", ".", "--threads", "-3"), "--threads"),
        (("serve", "--checkpoint", ".", "--port", "70000"), "--port"),
        (("serve", "--checkpoint", ".", "--log-level", "bogus"), "must be one of"),
        (("serve", "--checkpoint", ".", "--ttft-allowances", "2000"), "TTFT allowance '2000' must read"),
        (("route", "--replicas", "http://127.0.0.1:9", "--port", "-1"), "--port"),
        (("replay", "--trace", str(TRACE), "--duration", "0"), "must be above 0"),
        (("replay", "--trace", str(TRACE), "--tick", "-1"), "must be above 0"),
        (("forecast", "backtest", "--trace", str(TRACE), "--bin", "0"), "must be above 0"),
        (("forecast", "backtest", "--trace", str(TRACE), "--horizon", "0"),
         "--horizon: 0.0 s is not a finite number above 0"),
        (("forecast", "backtest", "--trace", str(TRACE), "--models", ","), "name at least one model"),
        (("forecast", "backtest", "--trace", str(TRACE), "--models", "arima,prophet"), "--models: unknown prophet"),
        (("replay", "--trace", str(TRACE), "--policies", ","), "name at least one policy"),
        (("replay", "--trace", str(TRACE), "--window", "w=10:5"), "apply to --sweep only"),
        (("replay", "--trace", str(TRACE), "--sweep", "--window", "w=10:5"), "0 <= START < END"),
        (("replay", "--trace", str(TRACE), "--router", "cost", "--replicas", "0"), "fleet sizes of 1 or more"),
        (("profile", "--url", "notaurl"), "is not an http(s) URL"),
        (("profile", "--url", "http://127.0.0.1:9", "--rates", "0"), "request rates above 0"),
        (("profile", "--url", "http://127.0.0.1:9", "--rates", "2"), "two load levels or more, got 1"),
        (("profile", "--url", "http://127.0.0.1:9", "--prompt-tokens", "0"), "--prompt-tokens: must be 1 or more"),
        (("profile", "--url", "http://127.0.0.1:9", "--probe-pairs", "-3"), "--probe-pairs: must be 1 or more"),
        (("profile", "--url", "http://127.0.0.1:9", "--rates", "4,2,1"), "lightest first, each above the last"),
        (("profile", "--url", "http://127.0.0.1:9", "--max-num-seqs", "0"), "--max-num-seqs"),
        (("profile", "--url", "http://127.0.0.1:9", "--kv-capacity-tokens", "-1"), "--kv-capacity-tokens"),
        (("profile", "--url", "http://127.0.0.1:9", "--ttft-limit", "-1"), "must be above 0"),
        (("profile", "--url", "http://127.0.0.1:9", "--out", "/"), "Is a directory"),
        (("up", "--no-live", "--cpus-per-replica", "0"), "--cpus-per-replica"),
        (("up", "--no-live", "--cpus-per-replica", "4096"), "so no replica fits"),
        (("up", "--no-live", "--max-replicas", "0"), "--max-replicas"),
        (("up", "--no-live", "--trace", "/nonexistent/t.csv"), "does not exist"),
        (("up", "--no-live", "--base-load", "0"), "must be above 0"),
        (("replay", "--trace", str(COUNTS), "--lengths", "fixed:-1000,5"), "from 1 to 1,000,000,000 prompt tokens"),
        (("replay", "--trace", str(TRACE), "--sweep", "--tuned-from", "/nonexistent/t.json"),
         "--tuned-from: no such file"),
    ],
)
def test_numbers_out_of_range_are_refused_before_anything_runs(args: tuple[str, ...], says: str) -> None:
    code, out = run(*args)
    assert code == 2 and says in out


def test_a_long_error_is_one_line_however_narrow_the_console(tmp_path: Path) -> None:
    missing = tmp_path / ("a-long-folder-name-" * 8) / "policies.yaml"
    result = CliRunner().invoke(app, ["policy", "apply", "-f", str(missing)])
    assert result.exit_code == 2 and len(str(missing)) > 160
    assert result.output.count("\n") == 1 and result.output.startswith("error: ") and str(missing) in result.output


def test_a_path_of_the_wrong_kind_is_one_line(tmp_path: Path) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("x")
    code, out = run("model", "init", "--out", str(taken))
    assert code == 2 and out.startswith("error: File exists") and str(taken) in out
    code, out = run("replay", "--trace", str(tmp_path), "--out", str(tmp_path / "r"))
    assert code == 2 and "error: Is a directory" in out


def test_a_policy_file_without_policies_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "p.yaml"
    empty.write_text("[]\n")
    code, out = run("alerts", "generate", "--out", str(tmp_path / "a"), "--policies", str(empty))
    assert code == 2 and "no policies in the file" in out and not (tmp_path / "a").exists()


def test_what_the_file_system_refuses_is_one_line(tmp_path: Path) -> None:
    too_long = tmp_path / ("n" * 300)
    code, out = run("alerts", "generate", "--out", str(too_long))
    assert code == 2 and out.startswith("error: File name too long")


def test_colons_in_a_path_are_printed_as_written(tmp_path: Path) -> None:
    """rich reads ``:fire:`` as an emoji code; a path or a message is printed as it is."""
    code, out = run("alerts", "generate", "--out", str(tmp_path / "x:fire:y"))
    assert code == 0 and "x:fire:y/" in out and "\N{FIRE}" not in out
    code, out = run("rebalance", "--load", str(tmp_path / "run:smile:1.npy"), "--ranks", "4",
                    "--slots-per-rank", "2", "--out", str(tmp_path / "p.json"))
    assert code == 2 and "run:smile:1.npy" in out


def test_a_port_in_use_is_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out = run("route", "--replicas", "http://127.0.0.1:9", "--port", str(port))
        # Refused before the model loads: nothing says it serves, no engine core is started.
        served, said = run("serve", "--checkpoint", "/nonexistent", "--port", str(port))
    assert code == 2 and "address already in use" in out.lower()
    assert served == 2 and "address already in use" in said.lower() and "serving" not in said


def test_a_database_that_cannot_open_is_one_line(tmp_path: Path) -> None:
    code, out = run("controller", "serve", "--db", str(tmp_path / "missing" / "x.db"), "--port", "0")
    assert code == 2 and "error: database" in out and "unable to open database file" in out
    code, out = run("controller", "serve", "--db", "postgresql://u:secret@127.0.0.1:9/x", "--port", "0")
    assert code == 2 and "secret" not in out and "***" in out


def test_model_init_refuses_what_would_not_serve(tmp_path: Path) -> None:
    code, out = run("model", "init", "--out", str(tmp_path / "a"), "--head-dim", "3")
    assert code == 2 and "head_dim must be even" in out
    for skew in ("inf", "nan", "-1"):
        code, out = run("model", "init", "--out", str(tmp_path / "b"), "--router-skew", skew)
        assert code == 2 and "router_skew must be a finite number" in out
    code, out = run("model", "init", "--out", " ")  # typer reads "" as the current directory: refused first
    assert code == 2 and "must not be empty" in out


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [("--ttft-objective-s", "-1", "cost.ttft_objective_s: must be > 0"), ("--max-queue-s", "-1", "max_queue_s"),
     ("--scrape-interval-s", "0", "scrape_interval_s: must be > 0"), ("--itl-base-s", "0", "cost.decode_step_s")],
)
def test_the_router_refuses_settings_it_cannot_route_by(flag: str, value: str, says: str) -> None:
    code, out = run("route", "--replicas", "http://127.0.0.1:9", flag, value)
    assert code == 2 and says in out


def test_a_url_that_is_not_a_controller_says_so() -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class NotAController(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"status": "ok"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotAController)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code, out = run("policy", "list", "--url", f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    assert code == 2 and "is not a moeslo controller's (no 'items')" in out


def test_urls_that_are_not_http_are_refused(tmp_path: Path) -> None:
    code, out = run("alerts", "generate", "--out", str(tmp_path / "a"), "--page-webhook", "not a url")
    assert code == 2 and "page_webhook_url: 'not a url' is not an http(s) URL" in out
    code, out = run("controller", "serve", "--prometheus", "not a url", "--db", str(tmp_path / "c.db"), "--port", "0")
    assert code == 2 and "prometheus_url: 'not a url' is not an http(s) URL" in out


def test_moeslo_debug_shows_the_traceback_instead(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MOESLO_DEBUG", "1")
    result = CliRunner().invoke(app, ["model", "init", "--out", str(tmp_path / "x"), "--layers", "1",
                                      "--router-skew", "0", "--vocab", "600"])  # fmt: skip
    assert result.exit_code == 0, result.output  # good input is unaffected
    taken = tmp_path / "a-file"
    taken.write_text("x")
    result = CliRunner().invoke(app, ["model", "init", "--out", str(taken)])
    assert isinstance(result.exception, FileExistsError)
    result = CliRunner().invoke(app, ["replay", "--trace", str(tmp_path / "missing.csv")])  # our own error
    assert isinstance(result.exception, MoesloError) and "missing.csv" in str(result.exception)


def test_the_listening_check_follows_the_servers_rules() -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out = run("route", "--replicas", "http://127.0.0.1:9", "--host", "", "--port", str(port))
    assert code == 2 and f"cannot listen on 0.0.0.0:{port}" in out  # an empty host is every interface
    code, out = run("route", "--replicas", "http://127.0.0.1:9", "--host", "no-such-host.invalid", "--port", "8080")
    assert code == 2 and "cannot listen on no-such-host.invalid:8080" in out


def test_a_trace_too_short_to_backtest_says_so(tmp_path: Path) -> None:
    """It said "start must leave at least one bin of history", of a start the user never gave."""
    short = tmp_path / "m.jsonl"
    short.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
                     '{"timestamp": 5000, "input_length": 10, "output_length": 2}\n')  # fmt: skip
    code, out = run("forecast", "backtest", "--trace", str(short), "--bin", "60", "--horizon", "300")
    assert code == 2 and "spans 1 bins of 60 s: too short to test a 300 s horizon" in out


def test_a_model_named_twice_is_backtested_once(tmp_path: Path) -> None:
    """It crashed comparing two results' numpy arrays ("truth value of an array ... is ambiguous")."""
    trace = tmp_path / "m.jsonl"
    trace.write_text("".join(f'{{"timestamp": {k * 20_000}, "input_length": 10, "output_length": 2}}\n'
                             for k in range(400)))  # fmt: skip
    code, out = run("forecast", "backtest", "--trace", str(trace), "--bin", "60", "--horizon", "120",
                    "--models", "last_value,arima,arima", "--json")  # fmt: skip
    assert code == 0, out
    assert sorted(json.loads(out)["horizons"]["120s"]["wape"]) == ["arima_211", "last_value"]


def test_a_replay_out_that_is_a_file_fails_before_any_run(tmp_path: Path) -> None:
    taken = tmp_path / "ok.csv"
    taken.write_text("x")
    code, out = run("replay", "--trace", str(TRACE), "--out", str(taken), "--policies", "static")
    assert code == 2 and "error: File exists" in out


def test_a_replay_starting_past_the_trace_is_an_error(tmp_path: Path) -> None:
    code, out = run("replay", "--trace", str(TRACE), "--out", str(tmp_path / "r"), "--policies", "static",
                    "--start", "999999", "--duration", "300")  # fmt: skip
    assert code == 2 and "no request in the scored window" in out


def test_sizes_no_memory_holds_are_one_line(tmp_path: Path) -> None:
    load = tmp_path / "load.csv"
    load.write_text("1,2,3,4\n4,3,2,1\n")
    code, out = run("rebalance", "--load", str(load), "--ranks", "1", "--slots-per-rank", "100000",
                    "--out", str(tmp_path / "p.json"))  # fmt: skip
    assert code == 2 and "error: not enough memory for the sizes asked for" in out
    assert not (tmp_path / "p.json").exists()

