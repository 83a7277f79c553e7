"""schemathesis against the running engine's own OpenAPI schema: whatever it sends, no answer is a 5xx.

Only ``not_a_server_error`` is checked, plus our own rule that every error is the JSON error document: the
schema FastAPI derives does not list the engine's 400/404/429/503 answers, so schema conformance is not the
point here (the hypothesis campaign in ``test_fuzz.py`` covers victims and disconnects).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.engine.test_server import serve

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _openapi() -> dict[str, Any]:
    """The served app's schema (building it touches neither the engine nor the tokenizer)."""
    from engine.server import create_app
    from engine.tokenizer import ByteTokenizer

    return create_app(cast(Any, None), ByteTokenizer(512), model_name="tiny-moe").openapi()


schema = schemathesis.openapi.from_dict(_openapi())


@pytest.fixture(scope="module")
def engine_url(tiny_checkpoint: Path) -> Iterator[str]:
    server, _ = serve(tiny_checkpoint, max_waiting=64)
    yield server.url
    server.stop()


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_engine_answers_no_5xx_and_only_json_errors(case: schemathesis.Case, engine_url: str) -> None:
    response = case.call_and_validate(base_url=engine_url, checks=[schemathesis.checks.not_a_server_error])
    if response.status_code >= 400:
        assert response.headers["content-type"][0].startswith("application/json"), response.text
        assert response.json()["error"]["code"] == response.status_code, response.text
