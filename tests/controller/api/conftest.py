from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from controller.api import create_app
from controller.config import ControllerSettings
from controller.store import Store

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def make_client(tmp_path: Path, **settings: object) -> TestClient:
    config = ControllerSettings(db=str(tmp_path / "c.db"), api_token=TOKEN, **settings)  # type: ignore[arg-type]
    return TestClient(create_app(config, Store(config.db_url)))


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[TestClient]:
    with make_client(tmp_path) as c:
        yield c
