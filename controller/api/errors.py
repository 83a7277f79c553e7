"""The one place that maps moeslo's errors to HTTP status codes.

Every error leaves the API as an RFC 9457 problem document
(``application/problem+json``)::

    {"type": "about:blank", "title": "Unprocessable Content", "status": 422,
     "detail": "scaling: max_replicas (1) must be >= min_replicas (2)",
     "errors": [{"field": "scaling", "message": "..."}]}

``errors`` lists every failure with the dotted path of the field it names,
so a client can point at the field.  Nothing a client sends yields a 500.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from contracts.asgi import UnexpectedErrors
from contracts.errors import (
    ConflictError,
    DataError,
    MoesloError,
    NotFoundError,
    OverloadedError,
    StatusTable,
    UnavailableError,
    ValidationError,
    http_status,
)
from controller.errors import ActuationError
from controller.policy import TARGET_KINDS
from controller.store import StaleVersionError, UnreadablePolicyError

PROBLEM_MEDIA_TYPE = "application/problem+json"


class UnauthorizedError(MoesloError):
    """A write without the configured bearer token."""


class PreconditionRequiredError(MoesloError):
    """A conditional write (If-Match) is required by the configuration but was not sent."""


class PreconditionFailedError(MoesloError):
    """An If-Match that no version matches, and no version of this API's could: a weak or a foreign ETag."""


class PayloadTooLargeError(MoesloError):
    """A write's body longer than the API reads (``controller.api.auth.MAX_BODY_BYTES``)."""


class UnsupportedMediaTypeError(MoesloError):
    """A body sent as a media type the route does not read (a form, plain text where JSON belongs)."""


# The REST dialect: bad input 422 (as FastAPI answers it), and the controller's own classes first.
STATUS_BY_ERROR: StatusTable = (
    (UnauthorizedError, 401),
    (PreconditionRequiredError, 428),
    (UnsupportedMediaTypeError, 415),
    (PayloadTooLargeError, 413),
    (StaleVersionError, 412),
    (PreconditionFailedError, 412),
    (ConflictError, 409),
    (NotFoundError, 404),
    (ValidationError, 422),
    (UnreadablePolicyError, 500),  # the controller's own stored data, not the request: the detail names the fix
    (DataError, 422),
    (OverloadedError, 429),
    (UnavailableError, 503),
    (ActuationError, 502),
    (MoesloError, 500),
)


def status_for(exc: MoesloError) -> int:
    return http_status(exc, STATUS_BY_ERROR)


class FieldProblem(BaseModel):
    field: str
    message: str


class Problem(BaseModel):
    """An RFC 9457 problem document."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    errors: list[FieldProblem] = []


def problem_response(
    status: int, detail: str, errors: Sequence[FieldProblem] = (), headers: dict[str, str] | None = None
) -> JSONResponse:
    body = Problem(title=HTTPStatus(status).phrase, status=status, detail=detail, errors=list(errors))
    return JSONResponse(
        body.model_dump(mode="json"), status_code=status, headers=headers, media_type=PROBLEM_MEDIA_TYPE
    )


def _field_of(loc: Sequence[Any]) -> str:
    # FastAPI prefixes "body"; pydantic puts the target kind it validated against after "target"
    # (target.deployment.namespace): the field the client wrote is target.namespace.
    parts = [str(part) for part in loc]
    if parts and parts[0] == "body":
        parts = parts[1:]
    parts = [p for i, p in enumerate(parts) if not (i and parts[i - 1] == "target" and p in TARGET_KINDS)]
    return ".".join(parts) or "body"


def _message(error: dict[str, Any]) -> str:
    message = str(error.get("msg", "invalid"))
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if error.get("type") == "json_invalid":
        ctx = error.get("ctx") or {}
        loc = error.get("loc", ())
        position = f" at character {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
        return f"malformed JSON{position}: {ctx.get('error', message)}"
    return message


def validation_problems(errors: Sequence[Any]) -> list[FieldProblem]:
    """Pydantic/FastAPI error dicts as field problems (every one of them)."""
    return [
        FieldProblem(
            field="body" if err.get("type") == "json_invalid" else _field_of(err.get("loc", ())),
            message=_message(err),
        )
        for err in errors
    ]


def validation_error(exc: PydanticValidationError) -> ValidationError:
    """A model validated outside FastAPI (a merge-patched policy) as the one 422 a request body gets: the same
    field paths and messages (:func:`validation_problems`)."""
    return ValidationError([f"{p.field}: {p.message}" for p in validation_problems(exc.errors())])


def problems_detail(problems: Sequence[FieldProblem]) -> str:
    return "; ".join(f"{p.field}: {p.message}" for p in problems)


INTERNAL_ERROR = "internal error (details are in the server log)"


def _internal_error() -> ASGIApp:
    """The 500 of an unexpected error: a page under ``/ui/`` (a person in a browser), else a problem document."""

    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        if str(scope.get("path", "")).startswith("/ui/"):
            response: Response = _html_problem(500, [FieldProblem(field="", message=INTERNAL_ERROR)])
        else:
            response = problem_response(500, INTERNAL_ERROR)
        await response(scope, receive, send)

    return answer


def error_problem(exc: MoesloError) -> JSONResponse:
    """The problem document of ``exc``, with the headers its status calls for."""
    headers: dict[str, str] = {}
    if isinstance(exc, UnauthorizedError):
        headers["WWW-Authenticate"] = 'Bearer realm="moeslo"'
    if isinstance(exc, OverloadedError):
        headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
    errors: list[FieldProblem] = []
    if isinstance(exc, ValidationError):
        errors = [_problem_from_text(text) for text in exc.problems]
    return problem_response(status_for(exc), str(exc), errors, headers or None)


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every error into a problem document.

    A write's token and size are judged before its body is read (``controller.api.auth.WriteGate``). Any
    other exception is a 500 problem document (a page under ``/ui/``) that leaves the client's connection open.
    """
    app.add_middleware(UnexpectedErrors, answer=_internal_error)

    @app.exception_handler(MoesloError)
    async def _moeslo(request: Request, exc: MoesloError) -> Response:
        if request.url.path.startswith("/ui/"):  # a person in a browser: a page, as for a bad query value
            problems = ([_problem_from_text(text) for text in exc.problems] if isinstance(exc, ValidationError)
                        else [FieldProblem(field="", message=str(exc))])  # fmt: skip
            return _html_problem(status_for(exc), problems)
        return error_problem(exc)

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, exc: RequestValidationError) -> Response:
        problems = validation_problems(exc.errors())
        if request.url.path.startswith("/ui/"):  # a person in a browser: a page, not a problem document
            return _html_problem(422, problems)
        return problem_response(422, problems_detail(problems), problems)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI answers a JSON body that decodes to no value but raises no JSONDecodeError (nested past Python's
        # recursion limit, not UTF-8) with a bare 400 "There was an error parsing the body": say what and where.
        body_error = json_body_error(exc.__cause__) if exc.status_code == 400 else None
        if body_error is not None:
            return error_problem(body_error)
        headers = dict(exc.headers) if exc.headers else {}
        if exc.status_code == 405:
            # Starlette names only the first matching route's methods; list every route of the path.
            headers["Allow"] = ", ".join(_allowed_methods(request))
        if request.url.path.startswith("/ui/"):  # routing's 404 and 405 too: a person in a browser gets a page
            return _html_problem(exc.status_code, [FieldProblem(field="", message=str(exc.detail))], headers or None)
        return problem_response(exc.status_code, str(exc.detail), (), headers or None)


def _html_problem(
    status: int, problems: Sequence[FieldProblem], headers: dict[str, str] | None = None
) -> HTMLResponse:
    from controller.api.page.layout import problem_page  # the status page's own layout (it imports nothing here)

    body = problem_page(status, [(p.field, p.message) for p in problems], datetime.now(UTC))
    return HTMLResponse(body, status_code=status, headers=headers)


HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def _allowed_methods(request: Request) -> list[str]:
    """The methods some route of the request's path answers, asked of the router itself (FastAPI nests included
    routers, so the routes' own paths are not all at the top); HEAD wherever GET (the app answers it as GET)."""
    allowed = []
    for method in HTTP_METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return ["GET", "HEAD", *allowed[1:]] if allowed[:1] == ["GET"] else allowed


def _problem_from_text(text: str) -> FieldProblem:
    # ValidationError problems read "field: message" by convention.
    field, sep, message = text.partition(": ")
    if sep and " " not in field:
        return FieldProblem(field=field, message=message)
    return FieldProblem(field="body", message=text)


def json_body_error(exc: BaseException | None) -> ValidationError | None:
    """Why a JSON body would not parse, naming the body (None: ``exc`` is no fault of the body's)."""
    if isinstance(exc, json.JSONDecodeError):
        return ValidationError(f"body: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")
    if isinstance(exc, UnicodeDecodeError):
        return ValidationError(f"body: not UTF-8 text at byte {exc.start}")
    if isinstance(exc, RecursionError):
        return ValidationError("body: JSON nested too deeply")
    return None
