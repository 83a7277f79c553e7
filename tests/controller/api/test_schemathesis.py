"""Property-based contract test: schemathesis against the served OpenAPI schema.

Every operation gets generated (valid and invalid) requests; no answer may be a
5xx, and every answer must match the schema (status code, content type,
headers, body).  Examples are bounded so the run stays well under a minute.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings

from controller.api import create_app
from controller.config import ControllerSettings
from controller.store import Store
from tests.controller.api.conftest import AUTH, TOKEN

_DB = Path(tempfile.mkdtemp(prefix="moeslo-st-")) / "c.db"
_SETTINGS = ControllerSettings(db=str(_DB), api_token=TOKEN)
_STORE = Store(_SETTINGS.db_url)
_STORE.create_policy(
    __import__("controller.policy", fromlist=["Policy"]).Policy.model_validate(
        {"name": "seeded", "target": {"kind": "model", "model": "m"}}
    )
)
APP = create_app(_SETTINGS, _STORE)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@schema.parametrize()
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_honours_its_schema(case: schemathesis.Case) -> None:
    case.call_and_validate(headers=AUTH)
