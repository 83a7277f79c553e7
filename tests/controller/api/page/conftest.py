from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controller.api import create_app
from controller.config import ControllerSettings
from controller.store import Store
from tests.controller.api.page.fakes import Upstream, View


@dataclass
class Page:
    client: TestClient
    store: Store
    view: View
    upstream: Upstream


@pytest.fixture()
def make_page(tmp_path: Path) -> Iterator[Any]:
    made: list[Store] = []

    def make(*, prometheus: bool | str = False, alertmanager: bool | str = False, **settings: Any) -> Page:
        """``prometheus``, ``alertmanager``: True for the fakes' URLs, or a URL of one's own."""
        config = ControllerSettings(
            db=str(tmp_path / f"c{len(made)}.db"),
            prometheus_url=_url(prometheus, "http://prometheus.test:9090"),
            alertmanager_url=_url(alertmanager, "http://alertmanager.test:9093"),
            **settings,
        )
        store = Store(config.db_url)
        made.append(store)
        view, upstream = View(), Upstream()
        app = create_app(config, store, service=view, page_transport=upstream.transport())
        return Page(TestClient(app), store, view, upstream)

    yield make
    for store in made:
        store.close()


def _url(asked: bool | str, fake: str) -> str | None:
    return asked if isinstance(asked, str) else fake if asked else None
