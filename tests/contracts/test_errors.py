"""The one mapping from errors to HTTP status: the OpenAI dialect (engine, router) and the controller's REST."""

from __future__ import annotations

from contracts.errors import (
    OPENAI_STATUS,
    ConflictError,
    DataError,
    MoesloError,
    NotFoundError,
    OverloadedError,
    PlacementError,
    UnavailableError,
    ValidationError,
    http_status,
)
from controller.api.errors import PreconditionRequiredError, UnauthorizedError, status_for
from controller.errors import ActuationError
from engine.openai_errors import status_for as engine_status
from router.errors import UpstreamError, UpstreamTimeoutError
from router.errors import status_for as router_status


def test_the_openai_dialect_answers_as_openai_does() -> None:
    cases = {
        PlacementError("layer 0: bad"): 422,  # a subclass of ValidationError, named before it
        ValidationError("max_tokens: must be > 0"): 400,
        NotFoundError("model", "m"): 404,
        ConflictError("taken"): 409,
        OverloadedError("full", retry_after_s=1): 429,
        UnavailableError("down"): 503,
        DataError("bad", path="f"): 500,
        MoesloError("?"): 500,
    }
    for exc, status in cases.items():
        assert http_status(exc) == status == engine_status(exc), exc


def test_the_router_puts_its_upstream_errors_first() -> None:
    assert router_status(UpstreamTimeoutError("slow", replica="a")) == 504
    assert router_status(UpstreamError("broken", replica="a")) == 502
    assert router_status(UnavailableError("no replica")) == 503
    assert router_status(ValidationError("x")) == 400
    assert router_status(OverloadedError("full", retry_after_s=1)) == 429


def test_the_controller_speaks_rest() -> None:
    assert status_for(ValidationError("x")) == 422
    assert status_for(UnauthorizedError("token")) == 401
    assert status_for(PreconditionRequiredError("If-Match")) == 428
    assert status_for(ActuationError("failed")) == 502
    assert status_for(DataError("bad")) == 422


def test_a_table_without_the_root_falls_back_to_500() -> None:
    table = tuple(row for row in OPENAI_STATUS if row[0] is not MoesloError)
    assert http_status(MoesloError("?"), table) == 500
    assert http_status(NotFoundError("k", "n"), table) == 404
