"""Parse `vllm serve` argument lists with vLLM's own parser (run by the vLLM venv's Python, not pytest's).

stdin: a JSON list of ``{"where": str, "argv": [...]}`` (``argv`` after ``vllm serve``);
stdout: a JSON list of ``{"where", "error"}`` or ``{"where", "parsed": {...}}`` in the same order.

Each list goes through what ``vllm serve`` does before it loads a model:
``make_arg_parser`` (an unknown flag or a bad value is an error),
``validate_parsed_serve_args``, ``AsyncEngineArgs.from_cli_args`` (typed
configs such as ``--eplb-config``) and ``ObservabilityConfig`` (which checks
``--custom-histogram-buckets``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from vllm.config import ObservabilityConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser

try:  # vLLM 0.32 moved the serve parser here from vllm.entrypoints.openai.cli_args
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
except ImportError:  # older layouts
    from vllm.entrypoints.openai.cli_args import (  # type: ignore[no-redef]
        make_arg_parser,
        validate_parsed_serve_args,
    )


class RaisingParser(FlexibleArgumentParser):
    """argparse exits on a bad argument; here it raises, so every list gets its own verdict."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValueError(message)


def parse(argv: list[str]) -> dict[str, Any]:
    parser = make_arg_parser(RaisingParser(prog="vllm serve"))
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    ObservabilityConfig(custom_histogram_buckets=engine_args.custom_histogram_buckets)
    eplb = engine_args.eplb_config
    return {
        "model": engine_args.model,
        "headless": args.headless,
        "api_server_count": args.api_server_count,
        "tensor_parallel_size": engine_args.tensor_parallel_size,
        "data_parallel_size": engine_args.data_parallel_size,
        "data_parallel_size_local": engine_args.data_parallel_size_local,
        "data_parallel_start_rank": engine_args.data_parallel_start_rank,
        "data_parallel_address": engine_args.data_parallel_address,
        "data_parallel_rpc_port": engine_args.data_parallel_rpc_port,
        "enable_expert_parallel": engine_args.enable_expert_parallel,
        "enable_eplb": engine_args.enable_eplb,
        "eplb_num_redundant_experts": getattr(eplb, "num_redundant_experts", None),
        "custom_histogram_buckets": engine_args.custom_histogram_buckets,
    }


def main() -> None:
    results = []
    for item in json.load(sys.stdin):
        try:
            results.append({"where": item["where"], "parsed": parse(item["argv"])})
        except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
            results.append({"where": item["where"], "error": str(exc)})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
