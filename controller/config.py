"""The controller service's configuration, read once at the edge.

Sources, in rising precedence: defaults (the embedded single-process mode),
a YAML file, ``MOESLO_CONTROLLER_*`` environment variables (nested fields
with ``__``, e.g. ``MOESLO_CONTROLLER_KUBERNETES__NAMESPACE``), and explicit
overrides from the command line.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import string
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from contracts.errors import DataError, ValidationError
from contracts.text_files import read_text, yaml_error
from contracts.urls import http_url_problem
from controller.endpoints import AddressClass, check_endpoint_url
from controller.sources.base import RATE_WINDOW_S


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


GROUP_TERM_GRACE_S = 2.0
"""The least a local replica's process group has between its SIGTERM and SIGKILL, even when the main process used
the whole first ``stop_timeout_s`` draining (an EP rank then ended by SIGKILL where it would have stopped itself)."""


class LocalActuatorConfig(_Section):
    """How the local actuator starts embedded-engine replicas as processes."""

    command: tuple[str, ...] = (
        "{moeslo}", "serve", "--checkpoint", "{checkpoint}", "--host", "{host}", "--port", "{port}",
        "--model-name", "{model}", "--engine-id", "{port}",
    )  # fmt: skip
    """argv template; ``{moeslo}`` (this venv's ``moeslo``), ``{checkpoint}``, ``{port}``, ``{model}``,
    ``{host}`` and ``{threads}`` (``cpus_per_replica``, else 1) are filled in."""
    checkpoint: str | None = None
    """Default checkpoint directory when a policy's local target names none."""
    host: str = "127.0.0.1"
    first_port: Annotated[int, Field(ge=1024, le=65535)] = 18100
    stop_timeout_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    """How long a stopped replica's main process has to drain and exit before the rest of its group gets SIGTERM
    (then SIGKILL at that deadline, ``GROUP_TERM_GRACE_S`` after the SIGTERM at the least, and a last wait this
    long): keep it a few seconds above ``moeslo serve``'s ``--shutdown-timeout``
    (5 s unless the command sets it; the requests still running then get their error answers in the 2 s after), or
    the replica is stopped before its clients are told."""
    ready_timeout_s: Annotated[float, Field(gt=0, le=86_400)] = 900.0
    """A replica that has not once answered this long after its start (a hung start, a model that never loads) is
    stopped as a broken one is, and a new one replaces it."""
    log_dir: str | None = None
    """Where replica stdout/stderr go (None: discarded)."""
    cpus_per_replica: Annotated[int | None, Field(ge=1, le=1024)] = None
    """CPUs pinned to each replica (all its processes: API, engine core, EP ranks).  Set, the
    actuator gives each replica its own CPUs and refuses a replica for which none are left (the
    host budget); None: replicas are not pinned and share the machine without a budget."""
    cpus: tuple[int, ...] | None = None
    """CPUs the replicas may use (None: every CPU the controller itself may run on)."""

    @model_validator(mode="after")
    def _fits_this_host(self) -> Self:
        # Each would fail every scale, with a message naming no setting: refused once, here.
        mine = os.sched_getaffinity(0)
        absent = sorted(set(self.cpus or ()) - mine)
        if absent:
            raise ValueError(f"local.cpus: CPU(s) {', '.join(map(str, absent))} not among those this process may run "
                             f"on ({', '.join(map(str, sorted(mine)))})")  # fmt: skip
        listed = len(self.cpus) if self.cpus is not None else len(mine)
        if self.cpus_per_replica is not None and self.cpus_per_replica > listed:
            which = "local.cpus lists" if self.cpus is not None else "this process may run on"
            raise ValueError(f"local.cpus_per_replica: {self.cpus_per_replica} CPUs per replica, but {which} only "
                             f"{listed} CPU(s): no replica would fit")  # fmt: skip
        problem = ipv4_host_problem(self.host)
        if problem is not None:
            raise ValueError(f"local.host: {problem}")
        return self

    @model_validator(mode="after")
    def _fields_filled_in(self) -> Self:
        # str.format would raise at every scale (a KeyError naming a JSON key): refused once, here.
        for i, part in enumerate(self.command):
            problem = command_part_problem(part)
            if problem is not None:
                raise ValueError(f"local.command[{i}] {part!r}: {problem}")
        return self


def ipv4_host_problem(host: str) -> str | None:
    """Why the local replicas cannot listen on ``host`` (None: they can): their ports are probed on IPv4."""
    try:
        ipaddress.IPv4Address(host)
        return None
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, None, socket.AF_INET)
    except (OSError, UnicodeError):
        return f"{host!r} is not an IPv4 address and does not resolve to one (replicas listen on IPv4)"
    return None


COMMAND_FIELDS = ("moeslo", "checkpoint", "port", "model", "host", "threads")
"""What a local command's parts may name in braces (filled in when a replica starts)."""


def command_part_problem(part: str) -> str | None:
    """Why ``part`` cannot be filled in with :data:`COMMAND_FIELDS` (None: it can)."""
    fields = ", ".join(f"{{{name}}}" for name in COMMAND_FIELDS)
    literal = "write a literal brace twice ({{ and }}, as in '{{\"level\": 3}}')"
    try:
        names = [name for _text, name, _spec, _conversion in string.Formatter().parse(part) if name is not None]
        unknown = [name for name in names if name not in COMMAND_FIELDS]
        if unknown:
            return f"{{{unknown[0]}}} is not one of {fields}; {literal}"
        part.format(**dict.fromkeys(COMMAND_FIELDS, ""))  # a format spec of the wrong kind
    except (ValueError, KeyError, IndexError, AttributeError) as exc:
        return f"{type(exc).__name__}: {exc}; {literal}"
    return None


FINAL_READ_TIMEOUT_S = 2.0
"""The Kubernetes actuator's last read, after a write answered with an error: whether it landed."""
MARK_BUDGET_S = 4.0
"""The most a Deployment's scale-down spends on its pods' deletion costs (the pod list, their loads, the writes)
before its own write (:mod:`controller.actuators.kube_pods`)."""


class KubernetesConfig(_Section):
    """Access to the Kubernetes API server (actuator and leader election)."""

    in_cluster: bool = False
    kubeconfig: str | None = None
    context: str | None = None
    host: str | None = None
    """Explicit API server URL (tests use a stand-in server on loopback)."""
    max_attempts: Annotated[int, Field(ge=1, le=20)] = 5
    backoff_initial_s: Annotated[float, Field(ge=0, le=60)] = 0.2
    backoff_max_s: Annotated[float, Field(ge=0, le=300)] = 5.0
    request_timeout_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    retry_deadline_s: Annotated[float, Field(gt=0, le=600)] = 12.0
    """All attempts of one read or scale end within this (shorter than a tick, so a stalled API server
    cannot hold the tick loop); each request's timeout, every request of an attempt, is cut to what is left (a
    scale-down's pod costs come on top, within ``MARK_BUDGET_S``)."""
    pod_deletion_cost: bool = True
    """Before a Deployment's scale-down, write each ready pod's requests in flight as its
    ``controller.kubernetes.io/pod-deletion-cost``, so the least busy pods go (needs ``patch`` on pods;
    :mod:`controller.actuators.kube_pods`)."""


class LeaderElectionConfig(_Section):
    """A coordination.k8s.io Lease elects the one replica that acts."""

    enabled: bool = False
    namespace: str = "moeslo"
    lease_name: str = "moeslo-controller"
    identity: str | None = None
    """This replica's holder identity (default: hostname and pid)."""
    lease_duration_s: Annotated[float, Field(gt=0, le=3600)] = 15.0
    renew_period_s: Annotated[float, Field(gt=0, le=3600)] = 5.0

    @model_validator(mode="after")
    def _renew_before_expiry(self) -> Self:
        if self.renew_period_s >= self.lease_duration_s:
            raise ValueError(
                f"leader_election.renew_period_s ({self.renew_period_s}) must be shorter than "
                f"lease_duration_s ({self.lease_duration_s})"
            )
        return self


class ControllerSettings(BaseSettings):
    """Everything the controller service needs to start."""

    model_config = SettingsConfigDict(
        env_prefix="MOESLO_CONTROLLER_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8090
    db: str = "moeslo-controller.db"
    """A SQLite file path (the embedded default) or any SQLAlchemy URL (``postgresql+psycopg://...``)."""
    api_token: SecretStr | None = None
    """Bearer token required for writes; None leaves writes open (local development only)."""
    require_if_match: bool = False
    """When true, PUT/PATCH/DELETE of an existing policy without If-Match get 428."""
    prometheus_url: str | None = None
    """Prometheus HTTP API base URL; None scrapes the engines' /metrics directly."""
    alertmanager_url: str | None = None
    """Alertmanager base URL: the status page lists the alerts firing for each policy (None: not shown)."""
    prometheus_selector: str = ""
    """Extra PromQL label matchers added to every selector, e.g. ``namespace="prod"``."""
    scrape_endpoints: dict[str, tuple[str, ...]] = {}
    """Static engine base URLs per model name for the direct-scrape source."""
    allowed_endpoint_addresses: tuple[AddressClass, ...] = ()
    """Special addresses a policy's ``target.endpoints`` may name (``loopback``, ``link-local``,
    ``metadata``); none by default, so a policy written over REST cannot point the controller at
    this host's services or a cloud metadata service. ``moeslo up`` allows ``loopback``."""
    source_timeout_s: Annotated[float, Field(gt=0, le=120)] = 5.0
    stale_after_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    """Observations older than this are stale: the core holds."""
    tick_interval_s: Annotated[float, Field(gt=0, le=3600)] = 15.0
    shutdown_grace_s: Annotated[float, Field(ge=0, le=3600)] = 15.0
    """On shutdown (SIGTERM), how long the actions a tick is carrying out (a scale; an expert rebalance, whose
    apply may take minutes) still get to finish and reach the decision log; those still running then are cut
    short and logged ``interrupted`` (outcome unknown).  Keep it well inside the pod's termination grace period
    (30 s in deploy/), which must also cover the lease's release (up to twice ``leader_election.renew_period_s``)."""
    rate_window_s: Annotated[int, Field(ge=2, le=3600)] = round(RATE_WINDOW_S)
    """Whole seconds the request and token rates are averaged over (``rate(...[1m])`` in PromQL).
    Longer is smoother; shorter follows a ramp sooner. Keep it at least four scrape intervals."""
    sli_window_s: Annotated[int, Field(ge=10, le=86400)] = 300
    """Whole seconds of the SLIs the reactive advisor reads (good ratios, p99s): 5 minutes, the short
    window of the SRE workbook's multiwindow burn rates.  Shorter reacts to a burn sooner and forgets
    it sooner (``moeslo up`` compresses its day, and its windows with it)."""
    actuator: Literal["dryrun", "local", "kubernetes"] = "dryrun"
    local: LocalActuatorConfig = LocalActuatorConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()
    leader_election: LeaderElectionConfig = LeaderElectionConfig()
    decisions_page_max: Annotated[int, Field(ge=1, le=10000)] = 500
    decisions_keep: Annotated[int, Field(ge=1000)] = 500_000
    """The decision log keeps this many newest decisions (older ones are pruned every 100 ticks)."""
    profile: str | None = None
    """A replica profile (JSON, as ``moeslo profile`` writes it) for policies that name none;
    None: the documented default profile."""
    forecast_history_s: Annotated[float, Field(ge=0, le=30 * 86400)] = 3 * 86400.0
    """Load history kept for the forecasters (in the store) and read back at start-up
    (from Prometheus when configured, else from the store).  Running, they keep this or two weeks, the longer."""
    rebalance: bool = True
    """Rebalance experts of engines that expose ``/v1/expert-load`` and ``/v1/placement`` (the embedded engine)
    or ``/moeslo/eplb`` (vLLM with the moeslo plugin)."""
    rebalance_window_s: Annotated[float, Field(gt=0, le=86400)] = 30.0
    """Each engine's expert load is kept as a history of windows this long; plans balance them all."""
    rebalance_min_windows: Annotated[int, Field(ge=1, le=64)] = 2
    """Windows seen before the first plan: with two or more, the trigger judges the gain a plan makes
    on a window it did not see (held out), which is what verification then expects."""

    @model_validator(mode="after")
    def _http_urls(self) -> Self:
        for name in ("prometheus_url", "alertmanager_url"):
            url = getattr(self, name)
            problem = None if url is None else http_url_problem(name, url)
            if problem is not None:
                raise ValueError(problem)
        for model, urls in self.scrape_endpoints.items():
            for url in urls:
                try:
                    check_endpoint_url(url)
                except ValueError as exc:  # one bad URL would fail every tick's scrape
                    raise ValueError(f"scrape_endpoints.{model}: {exc}") from exc
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Explicit arguments (CLI flags, the YAML file merged underneath them) win over env.
        return (init_settings, _EnvWithoutServiceLinks(settings_cls))

    @property
    def db_url(self) -> str:
        """The SQLAlchemy URL: a bare path means a SQLite file."""
        if "://" in self.db:
            return self.db
        return f"sqlite+pysqlite:///{Path(self.db).expanduser()}"

    @property
    def read_backstop_s(self) -> float:
        """The service's bound on each read: what its reads bound themselves to, together (a warm start's three
        rounds of Prometheus queries and the source's own; the Kubernetes reads' retries and pod listing; a local
        replica on old settings stopped before its successor starts, SIGTERM then SIGKILL), so it cuts only a read
        that nothing below bounded."""
        kubernetes = self.kubernetes
        return (4 * self.source_timeout_s + kubernetes.retry_deadline_s + kubernetes.request_timeout_s
                + 2 * self.local.stop_timeout_s + GROUP_TERM_GRACE_S)  # fmt: skip

    @property
    def scale_backstop_s(self) -> float | None:
        """The service's bound on each scale: the Kubernetes actuator's pod costs before a scale-down and its retries
        (every request of the call, a read, the HPA list and the write in a row, takes its timeout from the one
        deadline they share: the call ends within them), the read after a failed write, and one request timeout
        to spare (None: the local actuator's scale starts processes and leaves its stops to run apart, each within
        its own waits).  Past it the service logs the scale failed and gives its cooldown back: a write of the
        actuator's landing after that would be a scale-down applied without one."""
        if self.actuator != "kubernetes":
            return None
        marking_s = MARK_BUDGET_S if self.kubernetes.pod_deletion_cost else 0.0  # a scale-down's pod costs first
        return self.kubernetes.retry_deadline_s + self.kubernetes.request_timeout_s + FINAL_READ_TIMEOUT_S + marking_s

    @property
    def embedded(self) -> bool:
        """One process on SQLite: no leader election needed."""
        return self.db_url.startswith("sqlite")


class _EnvWithoutServiceLinks(EnvSettingsSource):
    """The environment, less Kubernetes' service links: a Service named ``moeslo-controller`` gives every pod
    of its namespace ``MOESLO_CONTROLLER_PORT=tcp://<cluster IP>:8090``, which is not a port setting."""

    def __call__(self) -> dict[str, Any]:
        values = super().__call__()
        if isinstance(port := values.get("port"), str) and "://" in port:
            del values["port"]
        return values


def load_settings(path: str | Path | None = None, **overrides: Any) -> ControllerSettings:
    """Settings from an optional YAML file, the environment, and explicit overrides.

    Environment variables override the file; ``overrides`` whose value is not
    None override both.  Every problem is reported at once.
    """
    file_values: dict[str, Any] = {}
    if path is not None:
        text = read_text(path, what="controller config")
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise yaml_error(exc, path, text) from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise DataError("the controller config must be a mapping", path=str(path))
        file_values = loaded or {}
    explicit = {key: value for key, value in overrides.items() if value is not None}
    try:
        # The environment's raw values, validated once with the file's: a section's field set alone (a lease
        # duration shorter than the default renew period) is judged with the file's other fields of it.
        merged = _overlay(file_values, _EnvWithoutServiceLinks(ControllerSettings)())
        merged.update(explicit)
        return ControllerSettings(**merged)
    except PydanticValidationError as exc:
        raise ValidationError(
            [f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}" for err in exc.errors()]
        ) from exc


def _overlay(base: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """``base`` (the file) with the environment's values laid over it, a settings section field by field: a
    variable for one field of a section (``MOESLO_CONTROLLER_LEADER_ELECTION__IDENTITY``) must not reset the
    file's other fields of it to their defaults.  Mapping-valued settings (``scrape_endpoints``) are replaced."""
    merged = dict(base)
    for name, value in env.items():
        field = ControllerSettings.model_fields.get(name)
        section = field is not None and isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        below = merged.get(name)
        merged[name] = {**below, **value} if section and isinstance(below, dict) and isinstance(value, dict) else value
    return merged
