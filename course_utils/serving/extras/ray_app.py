"""The course's server as Ray Serve replicas behind Ray's HTTP proxy (its router), on one machine.

Each replica is one Ray actor (its own process) that runs the course's own FastAPI app
(``app.create_app``): the same TinyGPT checkpoint, the same ``GenerationEngine`` with iteration
batching, the same guards, ``POST /generate`` server-sent events and ``GET /health``. So
``loadgen.run_load`` drives Ray's proxy exactly as it drives ``python -m course_utils serve``.
Every answer carries ``X-Served-By: <replica id>`` (``SERVED_BY``), so a client can count the
replicas that served it (``run_load(..., count_header=SERVED_BY)``).

``ray_serving(num_replicas=2)`` is a context manager that starts a local Ray (``start_ray``:
``num_cpus``, no dashboard, usage statistics off, the namespace ``NAMESPACE``), deploys the
replicas behind a proxy on a free loopback port, and on exit shuts Serve and Ray down, also when
the body raised. Nothing leaves the machine: the proxy binds 127.0.0.1 and ``RAY_USAGE_STATS_ENABLED=0``.

On a shared host (a classroom server, a JupyterHub) two learners never meet inside Ray:

- ``start_ray`` always starts a Ray of its own (``address="local"``): a plain ``ray.init()`` joins a
  cluster the host already runs (``RAY_ADDRESS``, or the last one started on the machine);
- its session files go to a folder of this user (``ray_temp_dir()``: ``/tmp/ray-<uid>``, mode 700),
  not Ray's default ``/tmp/ray``, which every user of the machine shares;
- the proxy binds port 0 itself (so no other process can take the port between the choice and
  the bind), and ``ray_serving`` finds the port it got (``proxy_port``) by asking the proxy's own
  listening sockets for ``/health`` with a token that only this run's replicas send back
  (``instance``). A port given explicitly is checked the same way: another server on it is an error.

While it runs, ``RayServing.kill_replica()`` kills one replica actor (as a crash would, via
``ray.kill``); the Serve controller notices and starts a replacement, which
``wait_for_replicas`` waits for.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..server.instance import INSTANCE_HEADER, new_token
from ..server.settings import ServeSettings

#: Response header naming the replica that answered.
SERVED_BY = "x-served-by"
#: Ray namespace of the driver (Serve's own actors live in the namespace "serve").
NAMESPACE = "course"
APP_NAME = "tiny_gpt"
DEPLOYMENT_NAME = "TinyGPTReplica"
#: Environment that keeps Ray quiet and offline; set before ``ray.init``.
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage statistics are collected or sent
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # one machine, loopback only (see start_ray)
    "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
    "RAY_SERVE_LOG_TO_STDERR": "0",  # replica logs go to Ray's log files, not the notebook
}


class ServedBy:
    """ASGI middleware: adds ``X-Served-By: <name>`` to every HTTP response of ``app``."""

    def __init__(self, app: Any, name: str) -> None:
        self.app = app
        self.header = (SERVED_BY.encode(), name.encode())

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_header)


class TinyGPTReplica:
    """One replica: the course's server app (``create_app(settings)``), tagged with its replica id;
    its ``/health`` sends back ``instance`` (one token for all replicas of a deployment)."""

    def __init__(self, settings: ServeSettings, instance: str | None = None) -> None:
        self.settings = settings
        self.instance = instance

    def __serve_build_asgi_app__(self) -> Any:
        """Return the ASGI app this replica serves (Serve calls it once, at replica start)."""
        from ray import serve

        from ..server.app import create_app

        replica = serve.get_replica_context().replica_id.unique_id
        app = create_app(self.settings, instance=self.instance)
        app.add_middleware(ServedBy, name=replica)
        return app


def replica_settings(**changes: Any) -> ServeSettings:
    """Return the ``ServeSettings`` of each replica: the course's defaults without the embedding
    model (the lesson serves TinyGPT only), with ``changes`` applied."""
    return ServeSettings(**{"embed": False, **changes})


def build_app(num_replicas: int = 2, settings: ServeSettings | None = None,
              cpus_per_replica: float = 1.0, instance: str | None = None) -> Any:
    """Return the Serve application (a bound deployment) of ``num_replicas`` TinyGPT replicas.

    Each replica reserves ``cpus_per_replica`` of Ray's CPUs (so Ray places them where cores are
    free) and accepts up to its batch capacity of concurrent requests (Serve's default,
    ``max_ongoing_requests=5``, would starve the engine's iteration batching). ``instance`` is the
    token their ``/health`` sends back (a random one per replica when None).
    """
    from ray import serve

    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    settings = settings or replica_settings()
    deployment = serve.deployment(
        serve.ingress()(TinyGPTReplica), name=DEPLOYMENT_NAME, num_replicas=num_replicas,
        ray_actor_options={"num_cpus": cpus_per_replica},
        max_ongoing_requests=max(1, settings.batch_capacity),
        health_check_period_s=2.0, health_check_timeout_s=30.0)
    return deployment.bind(settings, instance)


def import_ray() -> Any:
    """Import Ray with the course's environment (``RAY_ENV``) set first; return the module.

    In Jupyter without ipywidgets, importing Ray warns through ``tqdm.auto`` and logs a hint to
    install widgets; neither matters here (no progress bars or rich reprs are shown), so both are
    muted for this import.
    """
    os.environ.update(RAY_ENV)
    logging.getLogger("ray.widgets").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import ray
        from ray import serve  # noqa: F401  (Serve's import is the one that reaches tqdm)
    return ray


#: The longest temporary folder Ray is given: its socket paths add about 62 characters
#: (``/session_<date>_<time>_<pid>/sockets/plasma_store``), and a Unix socket path has at most
#: 107 (103 on macOS).
MAX_RAY_TEMP_CHARS = 40


def ray_temp_dir(base: str | os.PathLike[str] | None = None) -> str:
    """Return this user's folder for Ray's session files, ``<temp>/ray-<uid>`` (created, mode 700).

    ``base`` defaults to the temporary folder (``tempfile.gettempdir()``); where that path is too
    long for Ray's socket paths (macOS's per-user ``/var/folders/...``), ``/tmp``. A folder of that
    name that is not a plain folder owned by this user (left by someone else on a shared host) is
    refused with a ``RuntimeError`` that says what to do, never written into.
    """
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    root = str(base) if base is not None else tempfile.gettempdir()
    path = os.path.join(root, f"ray-{user}")
    if len(path) > MAX_RAY_TEMP_CHARS and base is None and os.path.isdir("/tmp"):
        path = f"/tmp/ray-{user}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
        raise RuntimeError(f"{path} is not a folder of this user (another user may have made it): remove it, "
                           f"or point TMPDIR at a folder of your own, then start Ray again")
    if hasattr(os, "getuid") and stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)  # other users can neither read the session files nor add to them
    return path


def start_ray(num_cpus: int | None = None, namespace: str = NAMESPACE) -> Any:
    """Start a local Ray instance of this process's own with the course's settings; return ``ray.init``'s context.

    ``address="local"``: a new instance even where the machine already runs a Ray cluster (a plain
    ``ray.init()`` would join it). ``num_cpus`` defaults to the machine's cores. No dashboard, usage
    statistics off, session files in this user's ``ray_temp_dir()``, Ray's own logs kept out of the
    notebook (``log_to_driver=False``; they stay in that folder).
    """
    ray = import_ray()
    from ray._private import ray_constants

    # A one-machine Ray: with clusters off, Ray takes 127.0.0.1 as this node's address (as it does
    # on laptops running macOS or Windows), so its processes talk over loopback only and none of
    # them probes the network for a routable address. The flag is read when ray is imported, so
    # it is set for the processes Ray starts (environment) and for this one (module constant).
    ray_constants.ENABLE_RAY_CLUSTER = False
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # Serve's start-up lines on the driver
    return ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 2, include_dashboard=False,
                    namespace=namespace, log_to_driver=False, logging_level="WARNING",
                    _temp_dir=ray_temp_dir())


def replica_actor_names(app_name: str = APP_NAME, deployment: str = DEPLOYMENT_NAME) -> list[str]:
    """Return the names of the live replica actors of ``deployment`` (Serve's namespace), sorted."""
    import ray

    prefix = f"SERVE_REPLICA::{app_name}#{deployment}#"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a.get("namespace") == "serve" and a["name"].startswith(prefix))


def running_replicas(app_name: str = APP_NAME, deployment: str = DEPLOYMENT_NAME) -> int:
    """Return how many replicas of ``deployment`` Serve reports RUNNING (0 when it has none)."""
    from ray import serve

    app = serve.status().applications.get(app_name)
    if app is None or deployment not in app.deployments:
        return 0
    return int(app.deployments[deployment].replica_states.get("RUNNING", 0))


def wait_for_replicas(n: int, timeout_s: float = 120.0, app_name: str = APP_NAME,
                      deployment: str = DEPLOYMENT_NAME) -> float:
    """Wait until ``n`` replicas run and as many replica actors are alive; return the seconds waited.

    Raises ``TimeoutError`` (with what Serve reported) when that does not happen in ``timeout_s``.
    """
    start = time.monotonic()
    while True:
        running = running_replicas(app_name, deployment)
        actors = len(replica_actor_names(app_name, deployment))
        if running == n and actors == n:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"{running} replicas running and {actors} replica actors alive after "
                               f"{timeout_s} s, expected {n}")
        time.sleep(0.2)


def kill_replica(name: str | None = None) -> str:
    """Kill one replica actor (the first by name unless ``name`` is given); return its name.

    ``ray.kill`` ends the actor's process at once, as a crash would; ``no_restart=True`` leaves the
    replacement to the Serve controller, which notices the death and starts a new replica.
    """
    import ray

    names = replica_actor_names()
    if not names:
        raise RuntimeError("no replica actor is alive to kill")
    if name is None:
        name = names[0]
    elif name not in names:
        raise ValueError(f"no live replica actor named {name!r}; live: {names}")
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    return name


@dataclass
class RayServing:
    """A running local Ray Serve deployment: its proxy URL and the replicas it started with."""

    url: str
    num_replicas: int
    startup_s: float

    def kill_replica(self, name: str | None = None) -> str:
        """Kill one replica actor; return its name (see ``kill_replica``)."""
        return kill_replica(name)

    def running_replicas(self) -> int:
        """Return how many replicas Serve reports RUNNING."""
        return running_replicas()

    def wait_for_replicas(self, n: int | None = None, timeout_s: float = 120.0) -> float:
        """Wait until ``n`` (default: the deployed number) replicas run; return the seconds waited."""
        return wait_for_replicas(self.num_replicas if n is None else n, timeout_s)


def shutdown() -> None:
    """Shut Serve and Ray down if they run (safe to call twice, or when nothing runs)."""
    import ray

    if not ray.is_initialized():
        return
    try:
        from ray import serve

        serve.shutdown()
    finally:
        ray.shutdown()


def _proxy_pid() -> int:
    """Return the process id of Serve's HTTP proxy actor (one machine: one proxy)."""
    import ray

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a.get("namespace") == "serve" and a["name"].startswith("SERVE_PROXY_ACTOR")]
    if not names:
        raise RuntimeError("Serve started no HTTP proxy")
    proxy = ray.get_actor(names[0], namespace="serve")
    return int(ray.get(proxy.__ray_call__.remote(lambda _proxy: os.getpid()), timeout=30))


def answers_as_ours(url: str, instance: str, timeout_s: float = 2.0) -> bool:
    """Return True when ``url``/health answers 200 with ``instance`` in its ``X-Course-Instance`` header."""
    import httpx

    try:
        response = httpx.get(f"{url}/health", timeout=timeout_s, trust_env=False)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and response.headers.get(INSTANCE_HEADER) == instance


def proxy_port(instance: str, route_prefix: str = "/", timeout_s: float = 30.0) -> int:
    """Return the port of Serve's HTTP proxy: the one among the proxy process's loopback listening
    sockets whose ``<route_prefix>/health`` answers with ``instance`` (the replicas' token).

    Serve's proxy binds the port it is given; given 0, it gets a free one from the system but
    reports it nowhere, so it is found here (psutil) and checked to be this run's own app.
    """
    import psutil

    pid = _proxy_pid()
    prefix = route_prefix.rstrip("/")
    deadline = time.monotonic() + timeout_s
    while True:
        ports = sorted({conn.laddr.port for conn in psutil.Process(pid).net_connections(kind="tcp")
                        if conn.status == psutil.CONN_LISTEN and conn.laddr.ip == "127.0.0.1"})
        for port in ports:
            if answers_as_ours(f"http://127.0.0.1:{port}{prefix}", instance):
                return port
        if time.monotonic() > deadline:
            raise RuntimeError(f"none of the proxy's listening ports ({ports}) answers {prefix}/health "
                               f"with this run's token")
        time.sleep(0.5)


def _port_taken(port: int) -> str:
    return (f"port {port} on 127.0.0.1 does not reach this run's Ray proxy (another program, perhaps another "
            f"user's server, holds it): leave port unset (or 0) for any free port, or choose another")


@contextmanager
def ray_serving(num_replicas: int = 2, settings: ServeSettings | None = None, *,
                num_cpus: int | None = None, cpus_per_replica: float = 1.0, port: int | None = None,
                route_prefix: str = "/", timeout_s: float = 180.0) -> Iterator[RayServing]:
    """Start local Ray, deploy ``num_replicas`` TinyGPT replicas behind Ray's HTTP proxy on
    127.0.0.1 (``port``: any free one by default); yield a ``RayServing``; shut everything down on exit.

    ``num_cpus`` (default: the machine's cores) must be at least ``num_replicas * cpus_per_replica``,
    or Ray cannot place the replicas; that is checked before anything starts. The replicas' ``/health``
    sends back a token of this call's; the URL yielded is one where it does (``proxy_port``), and a
    ``port`` given that another server holds raises a ``RuntimeError`` saying so.
    """
    import_ray()
    from ray import serve

    num_cpus = num_cpus or os.cpu_count() or 2
    if num_replicas * cpus_per_replica > num_cpus:
        raise ValueError(f"{num_replicas} replicas x {cpus_per_replica} CPUs do not fit in "
                         f"num_cpus={num_cpus}; lower cpus_per_replica")
    if not route_prefix.startswith("/"):
        raise ValueError(f"route_prefix must start with '/', got {route_prefix!r}")
    if port is not None and not 0 <= port <= 65535:
        raise ValueError(f"port must be 0 (any free port) or from 1 to 65535, got {port}")
    start = time.perf_counter()
    instance = new_token()
    start_ray(num_cpus)
    try:
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port or 0},
                        logging_config={"enable_access_log": False, "log_level": "WARNING"})
        except Exception as err:  # the proxy's "Failed to bind", wrapped in Ray's task error
            if "Failed to bind" not in str(err):
                raise
            raise RuntimeError(_port_taken(port or 0)) from None
        serve.run(build_app(num_replicas, settings, cpus_per_replica, instance), name=APP_NAME,
                  route_prefix=route_prefix)
        wait_for_replicas(num_replicas, timeout_s)
        if port:
            if not answers_as_ours(f"http://127.0.0.1:{port}" + route_prefix.rstrip("/"), instance, 10.0):
                raise RuntimeError(_port_taken(port))
        else:
            port = proxy_port(instance, route_prefix)
        url = f"http://127.0.0.1:{port}" + route_prefix.rstrip("/")
        yield RayServing(url=url, num_replicas=num_replicas, startup_s=time.perf_counter() - start)
    finally:
        shutdown()


def app_builder(args: dict[str, Any]) -> Any:
    """Return the Serve application described by ``args`` (an application builder for a Serve
    config file's ``import_path: course_utils.serving.extras.ray_app:app_builder``).

    ``args`` may hold ``num_replicas`` (2) and ``cpus_per_replica`` (1.0); every other key is a
    ``ServeSettings`` field of the replicas (``max_batch_size``, ``threads`` ...).
    """
    rest = {key: tuple(value) if isinstance(value, list) else value for key, value in args.items()}
    num_replicas = int(rest.pop("num_replicas", 2))
    cpus = float(rest.pop("cpus_per_replica", 1.0))
    return build_app(num_replicas, replica_settings(**rest), cpus)
