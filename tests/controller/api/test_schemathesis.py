"""Property-based contract test: schemathesis against the served OpenAPI schema.

Every operation gets generated (valid and invalid) requests; no answer may be a
5xx, and every answer must match the schema (status code, content type,
headers, body), and schema-violating requests must be rejected.  The one
check left out is ``positive_data_acceptance``: rules the schema cannot
express (max_replicas >= min_replicas, If-Match naming the current version,
the policy existing) rightly reject some schema-valid requests with 4xx.
Examples are bounded so the run stays well under a minute.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, settings
from schemathesis.core.media_types import YAML_MEDIA_TYPES

from controller.api import create_app
from controller.config import ControllerSettings
from controller.policy import Policy
from controller.store import Store
from tests.controller.api.conftest import AUTH, TOKEN

_TMP = Path(tempfile.mkdtemp(prefix="moeslo-st-"))
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)
_DB = _TMP / "c.db"
_SETTINGS = ControllerSettings(db=str(_DB), api_token=TOKEN)
_STORE = Store(_SETTINGS.db_url)
_STORE.create_policy(Policy.model_validate({"name": "seeded", "target": {"kind": "model", "model": "m"}}))
APP = create_app(_SETTINGS, _STORE)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@schemathesis.deserializer(*YAML_MEDIA_TYPES)
def _yaml_stream(_ctx: schemathesis.DeserializationContext, response: schemathesis.Response) -> object:
    # The OpenSLO export is a multi-document stream; the schema describes it as a list of documents.
    return list(yaml.safe_load_all(response.content))


@schema.parametrize()
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_honours_its_schema(case: schemathesis.Case) -> None:
    case.call_and_validate(headers=AUTH, excluded_checks=[schemathesis.checks.positive_data_acceptance])


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=75, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_honours_its_schema_over_a_thousand_cases(case: schemathesis.Case) -> None:
    """The campaign size the hardening work asks for: 14 operations x 75 examples, 1,050 cases."""
    case.call_and_validate(headers=AUTH, excluded_checks=[schemathesis.checks.positive_data_acceptance])
