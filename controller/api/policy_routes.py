"""``/v1/policies``: SLO policies as REST resources, with ETags and OpenSLO import/export.

Concurrency: every policy response carries ``ETag: "<version>"``.  PUT,
PATCH and DELETE honour ``If-Match`` (a stale tag is 412; ``*`` is any
version of a policy that exists); with ``require_if_match`` in the config,
changing an existing policy without ``If-Match`` is 428.  PUT creates the policy when absent (201) and replaces
it otherwise (200); with ``If-None-Match: *`` it only creates (412 where the policy exists), and a write takes no
other ``If-None-Match`` (422).  PATCH takes a JSON merge patch (RFC 7386).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from pydantic import ValidationError as PydanticValidationError
from starlette.concurrency import run_in_threadpool

from contracts.errors import NotFoundError, ValidationError
from controller.api.auth import WriteAccess
from controller.api.errors import (
    PreconditionFailedError,
    PreconditionRequiredError,
    UnsupportedMediaTypeError,
    json_body_error,
    validation_error,
)
from controller.api.schemas import (
    OpenSloImport,
    PolicyHistory,
    PolicyList,
    PolicyResource,
    PolicyVersionOut,
    problem_responses,
)
from controller.config import ControllerSettings
from controller.endpoints import endpoint_problems
from controller.openslo import apply_imported, export_policy, parse_openslo
from controller.policy import LocalTarget, Policy, shared_model_problems
from controller.store import PolicyExistsError, StaleVersionError, Store, StoredPolicy

router = APIRouter(prefix="/v1", tags=["policies"])

PolicyName = Annotated[str, Path(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", max_length=63)]
IfMatch = Annotated[
    str | None,
    Header(max_length=256, description='ETag of the version the change is based on, e.g. "3" (checked by '
                                       "parse_if_match, which says what is wrong)"),
]
IfNoneMatch = Annotated[
    str | None,
    Header(max_length=256, description="On PUT, * creates only (412 where the policy exists); a write takes no other "
                                       "value (checked by create_only)"),
]
_ETAG = re.compile(r'"([0-9]{1,18})"')
"""A strong ETag: If-Match compares strongly (RFC 9110 13.1.1), and this API issues no weak ones."""
_ANY_ETAG = re.compile(r'(W/)?"[\x21\x23-\x7e\x80-\xff]*"')
"""Any entity tag (RFC 9110 8.8.3): one this API did not issue matches no version (412), not a malformed one."""
_READ = problem_responses(404, 422)
_WRITE = problem_responses(400, 401, 404, 409, 412, 413, 415, 422, 428, 503)
MERGE_PATCH = "application/merge-patch+json"
HISTORY_PAGE = 100
"""Versions in a page of a policy's history unless ``limit`` says otherwise (500 at most)."""


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def _settings(request: Request) -> ControllerSettings:
    settings: ControllerSettings = request.app.state.settings
    return settings


def _check_target(request: Request, policy: Policy) -> None:
    """Targets the configured actuator cannot carry out, and endpoints at addresses the config does not
    allow (loopback, link-local, metadata), are refused, naming the field."""
    problems: list[str] = []
    allowed = _settings(request).allowed_endpoint_addresses
    if isinstance(policy.target, LocalTarget):
        problems += endpoint_problems(policy.target.endpoints, allowed, field="target.endpoints")
    if policy.router is not None:
        problems += endpoint_problems(policy.router.endpoints, allowed, field="router.endpoints")
    check = getattr(request.app.state, "check_target", None)
    if check is not None:
        problems += check(policy)
    if problems:
        raise ValidationError(problems)


def parse_if_match(value: str | None) -> int | str | None:
    """The version an If-Match names, ``"*"`` for any, None when absent."""
    if value is None:
        return None
    text = value.strip()
    if text == "*":
        return "*"
    tags = [tag.strip() for tag in text.split(",") if tag.strip()]
    if len(tags) != 1:
        raise ValidationError('If-Match: exactly one ETag is supported, e.g. "3"')
    match = _ETAG.fullmatch(tags[0])
    if match is not None:
        return int(match.group(1))
    if (other := _ANY_ETAG.fullmatch(tags[0])) is not None:
        why = ("a weak ETag never matches under If-Match's strong comparison" if other.group(1)
               else "names no version (this API's are a version number)")  # fmt: skip
        raise PreconditionFailedError(f'If-Match: {tags[0]} {why}; send the policy\'s ETag, e.g. "3"')
    raise ValidationError(f'If-Match: {value!r} is not an ETag of this API (expected e.g. "3")')


def create_only(value: str | None) -> bool:
    """Whether a write's If-None-Match is ``*`` (only where no policy exists).  A list of entity tags ("not this
    version") is refused: the store conditions a write on one version only, and judged before the write it would
    miss another writer's change in between; ignored, the write would land where the client said not to."""
    if value is None:
        return False
    if value.strip() == "*":
        return True
    raise ValidationError(f"If-None-Match: {value!r} is not taken on a write; send * (create only, on PUT) or "
                          'If-Match with the ETag of the version to change, e.g. "3"')  # fmt: skip


def _expected_version(request: Request, name: str, if_match: str | None, if_none_match: str | None) -> int | None:
    """The version a change of an existing policy must find, None for any.  ``If-Match: *`` is any version of a
    policy that exists (RFC 9110 13.1.1), which the write itself checks (a policy gone is a 404): a version read
    before it would make another writer's change in between a 412.  ``If-None-Match: *`` fails on a policy that
    exists, as the change needs one (a policy that does not exist is a 404, as without it)."""
    if create_only(if_none_match):
        _store(request).policy_version(name)
        raise PreconditionFailedError(f"If-None-Match: * holds only where no policy {name!r} exists; it does")
    try:
        parsed = parse_if_match(if_match)
    except PreconditionFailedError:
        # A tag that names no version fails only on a policy that exists: a missing one is a 404 whatever If-Match
        # says (RFC 9110 13.2.1: no precondition where the answer without it would be an error), as with "5".
        _store(request).policy_version(name)
        raise
    if parsed is None and _settings(request).require_if_match:
        _store(request).policy_version(name)  # a policy that does not exist is a 404, not a missing precondition
        raise PreconditionRequiredError(
            f"changing policy {name!r} requires If-Match with its current ETag (GET it first)"
        )
    return parsed if isinstance(parsed, int) else None


def _forget_page_series(request: Request) -> None:
    """Drop the decision series the status page keeps between reloads (``app.state.page_series``): a policy
    deleted, or created under a name that had one, has another log, which its page must read afresh."""
    cache = getattr(request.app.state, "page_series", None)
    if cache is not None:
        cache.clear()


def _respond(response: Response, stored: StoredPolicy) -> PolicyResource:
    response.headers["ETag"] = stored.etag
    response.headers["Location"] = f"/v1/policies/{stored.policy.name}"
    return PolicyResource.of(stored)


@router.get("/policies", response_model=PolicyList, responses=problem_responses(422))
def list_policies(request: Request) -> PolicyList:
    return PolicyList.of(_store(request).read_policies())


def json_body(request: Request, _auth: WriteAccess) -> None:
    """Refuse, before the body is read, a body not sent as JSON (FastAPI would say the body is not an object);
    after the token is checked, so a client without one learns nothing of what the route reads."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json" and not content_type.endswith("+json"):
        raise UnsupportedMediaTypeError(f"Content-Type: expected application/json, got {content_type!r}")


@router.post(
    "/policies",
    response_model=PolicyResource,
    status_code=201,
    responses=problem_responses(400, 401, 409, 413, 415, 422, 503),
    dependencies=[Depends(json_body)],
)
def create_policy(request: Request, response: Response, policy: Policy, _auth: WriteAccess) -> PolicyResource:
    _check_target(request, policy)
    stored = _store(request).create_policy(policy)
    _forget_page_series(request)
    return _respond(response, stored)


@router.get("/policies/{name}", response_model=PolicyResource, responses=_READ)
def get_policy(request: Request, response: Response, name: PolicyName) -> PolicyResource:
    return _respond(response, _store(request).get_policy(name))


@router.put("/policies/{name}", response_model=PolicyResource, responses={**_WRITE, 201: {"model": PolicyResource}},
            dependencies=[Depends(json_body)])
def put_policy(
    request: Request,
    response: Response,
    name: PolicyName,
    policy: Policy,
    _auth: WriteAccess,
    if_match: IfMatch = None,
    if_none_match: IfNoneMatch = None,
) -> PolicyResource:
    if policy.name != name:
        raise ValidationError(f"name: {policy.name!r} differs from the path's {name!r} (rename by POST + DELETE)")
    _check_target(request, policy)
    parsed = parse_if_match(if_match)
    if create_only(if_none_match):  # decided by the create's own transaction, as below
        if parsed is not None:
            raise PreconditionFailedError("If-Match and If-None-Match: * cannot both hold (a version of a policy "
                                          "that does not exist)")  # fmt: skip
        try:
            stored, created = _store(request).create_policy(policy), True
        except PolicyExistsError as exc:
            raise PreconditionFailedError(f"If-None-Match: * creates only, and policy {name!r} exists") from exc
    elif parsed is None and _settings(request).require_if_match:
        # Without If-Match a PUT may only create, which the write's own transaction decides: a name looked up
        # before it could be taken by another writer's create in between, and this write would replace it.
        try:
            stored, created = _store(request).create_policy(policy), True
        except PolicyExistsError as exc:
            raise PreconditionRequiredError(
                f"replacing policy {name!r} requires If-Match with its current ETag (GET it first)"
            ) from exc
    elif parsed == "*":  # any version of a policy that exists, checked by the write itself (see _expected_version)
        try:
            stored, created = _store(request).replace_policy(policy)
        except NotFoundError as exc:  # PUT would create it: the precondition is what fails (412)
            raise StaleVersionError(name, current=None, expected=None) from exc
    else:
        expected = parsed if isinstance(parsed, int) else None
        stored, created = _store(request).replace_policy(policy, expected_version=expected, create=True)
    if created:
        _forget_page_series(request)
    response.status_code = 201 if created else 200
    return _respond(response, stored)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def validate_policy(spec: Any) -> Policy:
    """A policy from plain data; every failure named by its field as a request body's would be."""
    try:
        return Policy.model_validate(spec)
    except PydanticValidationError as exc:
        raise validation_error(exc) from exc


@router.patch(
    "/policies/{name}",
    response_model=PolicyResource,
    responses=_WRITE,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                MERGE_PATCH: {"schema": {"type": "object"}},
                "application/json": {"schema": {"type": "object"}},
            },
        }
    },
)
async def patch_policy(
    request: Request,
    response: Response,
    name: PolicyName,
    _auth: WriteAccess,
    if_match: IfMatch = None,
    if_none_match: IfNoneMatch = None,
) -> PolicyResource:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in (MERGE_PATCH, "application/json"):
        raise UnsupportedMediaTypeError(
            f"Content-Type: expected {MERGE_PATCH} or application/json, got {content_type!r}"
        )
    raw = await request.body()
    try:
        patch = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise (json_body_error(exc) or ValidationError(f"body: malformed JSON: {exc}")) from exc
    if not isinstance(patch, dict):
        raise ValidationError(f"body: a merge patch must be a JSON object, got {type(patch).__name__}")
    if "name" in patch and patch["name"] != name:
        raise ValidationError(f"name: cannot be changed by PATCH (policy {name!r})")
    # The store is synchronous: keep it off the event loop the tick loop shares.
    return await run_in_threadpool(_apply_patch, request, response, name, patch, (if_match, if_none_match))


PATCH_ATTEMPTS = 10
"""Re-reads of a PATCH without If-Match that lost its write to another writer (each a few milliseconds)."""


def _apply_patch(
    request: Request, response: Response, name: str, patch: dict[str, Any], conditions: tuple[str | None, str | None]
) -> PolicyResource:
    """``conditions``: the request's If-Match and If-None-Match."""
    store = _store(request)
    expected = _expected_version(request, name, *conditions)
    for attempt in range(1, PATCH_ATTEMPTS + 1):
        current = store.get_policy(name)
        policy = validate_policy(merge_patch(current.policy.model_dump(mode="json"), patch))
        _check_target(request, policy)
        try:
            stored, _created = store.replace_policy(
                policy, expected_version=current.version if expected is None else expected
            )
        except StaleVersionError:
            # Without If-Match the client asked for "patch whatever is current": re-read and re-apply.
            if expected is not None or attempt == PATCH_ATTEMPTS:
                raise
            continue
        return _respond(response, stored)
    raise AssertionError("unreachable: the last attempt returns or raises")


@router.delete("/policies/{name}", status_code=204, responses=_WRITE)
def delete_policy(
    request: Request, name: PolicyName, _auth: WriteAccess, if_match: IfMatch = None, if_none_match: IfNoneMatch = None
) -> Response:
    expected = _expected_version(request, name, if_match, if_none_match)
    _store(request).delete_policy(name, expected_version=expected)
    _forget_page_series(request)
    return Response(status_code=204)


@router.get("/policies/{name}/history", response_model=PolicyHistory, responses=_READ)
def policy_history(
    request: Request,
    name: PolicyName,
    limit: Annotated[int, Query(ge=1, le=500, description="Page size")] = HISTORY_PAGE,
    cursor: Annotated[int | None, Query(ge=0, le=2**63 - 1, description="next_cursor of the previous page")] = None,
) -> PolicyHistory:
    """The policy's versions, newest first (each with its whole spec, so a page at a time): the first page holds
    the current version, which a rollback starts from; ``cursor`` asks for the versions older than it."""
    # One more than the page: a cursor only when an older version is left (an exactly full last page has none).
    versions = _store(request).policy_history(name, before_version=cursor, limit=limit + 1, newest_first=True)
    next_cursor = versions[limit - 1].version if len(versions) > limit else None
    page = [PolicyVersionOut.of(v) for v in versions[:limit]]
    return PolicyHistory(name=name, versions=page, next_cursor=next_cursor)


@router.get(
    "/policies/{name}/openslo",
    response_class=Response,
    responses={
        200: {
            "description": "A multi-document YAML stream: one OpenSLO v1 SLO document per objective",
            "content": {"application/yaml": {"schema": {"type": "array", "items": {"type": "object"}}}},
        },
        **_READ,
    },
)
def export_openslo(request: Request, name: PolicyName) -> Response:
    stored = _store(request).get_policy(name)
    return Response(export_policy(stored.policy), media_type="application/yaml", headers={"ETag": stored.etag})


@router.post(
    "/openslo",
    response_model=OpenSloImport,
    responses=problem_responses(400, 401, 409, 412, 413, 422, 503),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/yaml": {"schema": {"type": "string"}}},
        }
    },
)
async def import_openslo(request: Request, _auth: WriteAccess) -> OpenSloImport:
    """Create or update policies from OpenSLO v1 SLO documents (their SLO part only)."""
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(f"body: not UTF-8 text at byte {exc.start}") from exc
    return await run_in_threadpool(_import_openslo, request, text)


def _import_openslo(request: Request, text: str) -> OpenSloImport:
    imported = parse_openslo(text)
    store = _store(request)
    # Validate all first, so a bad document changes nothing; then write all in one transaction.
    planned: list[tuple[Policy, int | None]] = []
    problems: list[str] = []
    for name, slos in imported.items():
        try:
            base = store.get_policy(name)
        except NotFoundError:
            base = None
        try:
            policy = apply_imported(slos, None if base is None else base.policy)
            _check_target(request, policy)
        except ValidationError as exc:
            problems.extend(exc.problems)
            continue
        planned.append((policy, None if base is None else base.version))
    problems += shared_model_problems(dict(enumerate(policy for policy, _version in planned)))
    if problems:
        raise ValidationError(problems)
    existing = sorted(policy.name for policy, version in planned if version is not None)
    if existing and _settings(request).require_if_match:
        raise PreconditionRequiredError(
            f"changing policies {', '.join(map(repr, existing))} requires If-Match: an import creates new policies "
            "only; change existing ones with PUT or PATCH and their ETag"
        )
    results = [PolicyResource.of(stored) for stored in store.write_policies(planned)]
    if any(version is None for _policy, version in planned):
        _forget_page_series(request)
    return OpenSloImport(items=results)
