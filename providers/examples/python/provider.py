#!/usr/bin/env python3
"""A minimal Corbel provider in Python, written from provider.proto and
docs/provider-protocol.md alone.

Resource type `example.v1.file`: a file with the given `content`, written under
the provider's state directory. Outputs: {"path": ..., "bytes": ...}.

Exactly once: the intent (the file's path) is recorded durably under the
resource id *before* the file is written, so a deploy whose outcome Corbel lost
is found again by Inspect and removed by DestroyResource.

Health (protocol version 3, feature "watch"): a file is HEALTHY while it is
there and DOWN "file removed" once something else deletes it. WatchResources
looks at the files every 200 ms inside the stream and sends what changed.
"""

import hashlib
import json
import os
import signal
import sys
import threading
import time
from concurrent import futures

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "gen"))

import grpc  # noqa: E402
from corbel.provider.v1 import provider_pb2 as pb  # noqa: E402
from corbel.provider.v1 import provider_pb2_grpc as pb_grpc  # noqa: E402
from health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

NAME = "example-python"
VERSION = "0.1.0"
PROTOCOL_VERSIONS = [1, 2, 3]
RESOURCE_TYPE = "example.v1.file"
FEATURES = ["deploy", "destroy", "inspect", "nodes", "watch"]
REGISTRY_SERVICE = "corbel.provider.v1.Registry"
# Deadlines on the calls this provider makes to the registry (seconds).
# Register waits while Corbel dials back, checks health and configures.
HANDSHAKE_DEADLINE = 10
REGISTER_DEADLINE = 60
UNREGISTER_DEADLINE = 5
CONFIG_KEYS = {"file_mode"}
# How often WatchResources looks at the files (seconds).
WATCH_POLL = 0.2
REMOVED = "file removed"


def log(message):
    # stdout and stderr go to the provider's log in Corbel. Once Corbel is
    # gone they are broken pipes: a line that cannot be written is dropped,
    # never an exception (it would kill the thread that is shutting down).
    try:
        print(f"[{NAME}] {message}", file=sys.stderr, flush=True)
    except OSError:
        pass


def take_environment():
    """Reads the CORBEL_* variables and removes them from the environment, so
    nothing this process starts inherits the token."""
    names = ["CORBEL_REGISTRY", "CORBEL_PROVIDER_ID", "CORBEL_PROVIDER_TOKEN",
             "CORBEL_SOCKET_DIR", "CORBEL_STATE_DIR"]
    env = {name: os.environ.pop(name, None) for name in names}
    missing = [name for name in names[:4] if not env[name]]
    if missing:
        sys.exit(f"{NAME}: missing {', '.join(missing)}: this program is started by Corbel")
    for name in list(os.environ):
        if name.startswith("CORBEL_"):
            del os.environ[name]
    if not env["CORBEL_STATE_DIR"]:
        env["CORBEL_STATE_DIR"] = os.path.join(HERE, "state")
    return env


def write_durably(path, data):
    """Writes `data` to `path` atomically, surviving a crash: temp file, fsync,
    rename, fsync of the directory."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class Files:
    """Records and files, one pair per resource id."""

    def __init__(self, state_dir):
        self.records = os.path.join(state_dir, "records")
        self.files = os.path.join(state_dir, "files")
        os.makedirs(self.records, exist_ok=True)
        os.makedirs(self.files, exist_ok=True)
        self.lock = threading.Lock()

    def _name(self, resource_id):
        # Resource ids are opaque text: hashed into a safe file name.
        return hashlib.sha256(resource_id.encode()).hexdigest()

    def record_path(self, resource_id):
        return os.path.join(self.records, self._name(resource_id) + ".json")

    def file_path(self, resource_id):
        return os.path.join(self.files, self._name(resource_id))

    def record(self, resource_id):
        try:
            with open(self.record_path(resource_id)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def deployed(self):
        """The resource ids with a record: every resource this provider holds."""
        ids = []
        for name in os.listdir(self.records):
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(self.records, name)) as f:
                    ids.append(json.load(f)["resource_id"])
            except (OSError, ValueError, KeyError):
                pass  # being written or removed: seen on the next look
        return ids

    def health(self, resource_id):
        """(health, reason) of a resource this provider holds, None for one it
        does not (never deployed, or destroyed through DestroyResource). Call
        it holding `lock`, so a deploy or destroy is never seen half-way."""
        if self.record(resource_id) is None:
            return None
        if os.path.exists(self.file_path(resource_id)):
            return (pb.HEALTH_HEALTHY, "")
        return (pb.HEALTH_DOWN, REMOVED)

    def outputs(self, resource_id):
        """The resource's outputs if its file exists."""
        path = self.file_path(resource_id)
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            return None
        return {"path": path, "bytes": size}


class Provider(pb_grpc.ProviderServicer):
    def __init__(self, files, stopping):
        self.files = files
        self.stopping = stopping
        self.mode = 0o644
        self.config_lock = threading.Lock()

    def Configure(self, request, context):
        try:
            config = json.loads(request.config_json or "{}")
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"config is not JSON: {e}")
        if not isinstance(config, dict):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "config must be a JSON object")
        unknown = sorted(set(config) - CONFIG_KEYS)
        if unknown:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"unknown config key `{unknown[0]}` (known: {', '.join(sorted(CONFIG_KEYS))})")
        mode = config.get("file_mode", "0644")
        try:
            parsed = int(mode, 8) if isinstance(mode, str) else None
        except ValueError:
            parsed = None
        if parsed is None or not 0 <= parsed <= 0o777:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"file_mode: `{mode}` is not an octal mode such as \"0644\"")
        with self.config_lock:
            self.mode = parsed
        log(f"configured: file_mode {oct(parsed)}")
        return pb.ConfigureResponse()

    def DescribeResources(self, request, context):
        # Nothing to add: no extra dependencies, no features beyond "deploy".
        return pb.DescribeResourcesResponse(descriptions=[
            pb.ResourceDescription(key=r.key, features=["deploy"]) for r in request.resources
        ])

    def ListNodes(self, request, context):
        return pb.ListNodesResponse(nodes=[
            pb.Node(name="local", capacity={RESOURCE_TYPE: 1000}, labels={"language": "python"})
        ])

    def DeployResource(self, request, context):
        r = request.resource
        if r.type != RESOURCE_TYPE:
            yield failure(f"resource type `{r.type}` is not served (only {RESOURCE_TYPE})")
            return
        try:
            config = json.loads(r.config_json or "{}")
        except ValueError as e:
            yield failure(f"resources.{r.key}.config is not JSON: {e}")
            return
        content = config.get("content") if isinstance(config, dict) else None
        if not isinstance(content, str):
            yield failure(f"resources.{r.key}.config.content: a string is required")
            return
        with self.files.lock:
            existing = self.files.outputs(r.resource_id)
            if existing is not None and self.files.record(r.resource_id) is not None:
                # Idempotent: it exists (maybe from a call whose outcome was lost).
                yield progress(100, "already deployed")
                yield done(existing)
                return
            # The intent first, durably: a crash after this is found by Inspect.
            path = self.files.file_path(r.resource_id)
            write_durably(self.files.record_path(r.resource_id),
                          json.dumps({"resource_id": r.resource_id, "path": path}).encode())
            yield progress(30, "intent recorded")
            write_durably(path, content.encode())
            os.chmod(path, self.mode)
            yield progress(90, f"wrote {len(content.encode())} bytes")
            outputs = self.files.outputs(r.resource_id)
        log(f"deployed {r.resource_id} at {path}")
        yield done(outputs)

    def DestroyResource(self, request, context):
        r = request.resource
        with self.files.lock:
            # Found by resource id, not by the outputs Corbel sends.
            for path in (self.files.file_path(r.resource_id), self.files.record_path(r.resource_id)):
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass  # gone is success
            yield progress(50, "file removed")
        log(f"destroyed {r.resource_id}")
        yield done({})

    def Inspect(self, request, context):
        r = request.resource
        with self.files.lock:
            outputs = self.files.outputs(r.resource_id)
            held = self.files.health(r.resource_id)
        if outputs is None:
            reason = REMOVED if held else "no such resource"
            return pb.InspectResponse(present=False, health=pb.HEALTH_DOWN, reason=reason)
        return pb.InspectResponse(present=True, outputs_json=json.dumps(outputs),
                                  health=pb.HEALTH_HEALTHY)

    def WatchResources(self, request, context):
        """The first report (each resource asked about), `synced`, then every
        change of any file this provider holds, looked at every WATCH_POLL
        seconds, until Corbel hangs up or the provider stops. No deadline."""
        seen = {}
        with self.files.lock:
            first = [(r.resource_id, self.files.health(r.resource_id)) for r in request.resources]
        for resource_id, health in first:
            if health is None:
                yield resource_status(resource_id, pb.HEALTH_DOWN, "no such resource")
                continue
            seen[resource_id] = health
            yield resource_status(resource_id, *health)
        yield pb.ResourceStatus(synced=True)
        while context.is_active() and not self.stopping.wait(WATCH_POLL):
            with self.files.lock:
                now = {rid: self.files.health(rid) for rid in set(seen) | set(self.files.deployed())}
            for resource_id, health in now.items():
                if health is None:
                    # Destroyed through DestroyResource: forgotten, no DOWN.
                    seen.pop(resource_id, None)
                elif seen.get(resource_id) != health:
                    seen[resource_id] = health
                    yield resource_status(resource_id, *health)


def resource_status(resource_id, health, reason):
    return pb.ResourceStatus(resource_id=resource_id, health=health, reason=reason,
                             changed_at_unix_ms=int(time.time() * 1000))


def progress(percent, message):
    return pb.ResourceEvent(progress=pb.Progress(percent=percent, message=message))


def done(outputs):
    return pb.ResourceEvent(done=pb.Done(outputs_json=json.dumps(outputs)))


def failure(message, retryable=False):
    return pb.ResourceEvent(error=pb.Failure(message=message, retryable=retryable))


class Health(health_pb2_grpc.HealthServicer):
    """The provider's health: SERVING until it stops."""

    def __init__(self, stopping):
        self.stopping = stopping

    def Check(self, request, context):
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    def Watch(self, request, context):
        yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
        self.stopping.wait()
        yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING)


def watch_registry(channel, stopping):
    """A duty of every provider: exit when Corbel goes away. The registry's
    health stream ends (or says NOT_SERVING) when the server stops or dies."""
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        for answer in stub.Watch(health_pb2.HealthCheckRequest(service=REGISTRY_SERVICE)):
            if answer.status != health_pb2.HealthCheckResponse.SERVING:
                log("the registry is not serving: exiting")
                break
        else:
            log("the registry's health stream ended: exiting")
    except grpc.RpcError as e:
        if not stopping.is_set():
            log(f"the registry's health stream failed ({e.code().name}): exiting")
    finally:
        # Whatever happened above, the provider stops.
        stopping.set()


def main():
    env = take_environment()
    stopping = threading.Event()
    files = Files(env["CORBEL_STATE_DIR"])

    socket = os.path.join(env["CORBEL_SOCKET_DIR"], f"{env['CORBEL_PROVIDER_ID']}.sock")
    if os.path.exists(socket):
        os.remove(socket)
    # A watch holds a worker for as long as it is open: room for more.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    pb_grpc.add_ProviderServicer_to_server(Provider(files, stopping), server)
    health_pb2_grpc.add_HealthServicer_to_server(Health(stopping), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()

    # Signals before registering: a SIGTERM during Register still unregisters.
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())

    # No authority option is needed: Corbel accepts grpc-core's default.
    channel = grpc.insecure_channel(env["CORBEL_REGISTRY"])
    registry = pb_grpc.RegistryStub(channel)
    try:
        agreed = registry.Handshake(
            pb.HandshakeRequest(supported_versions=PROTOCOL_VERSIONS), timeout=HANDSHAKE_DEADLINE)
        session = registry.Register(pb.RegisterRequest(
            id=env["CORBEL_PROVIDER_ID"],
            token=env["CORBEL_PROVIDER_TOKEN"],
            name=NAME,
            version=VERSION,
            protocol_version=agreed.chosen_version,
            features=FEATURES,
            resource_types=[RESOURCE_TYPE],
            endpoint=f"unix://{socket}",
        ), timeout=REGISTER_DEADLINE).session
    except grpc.RpcError as e:
        log(f"registration failed: {e.code().name}: {e.details()}")
        server.stop(0)
        sys.exit(1)
    log(f"registered (protocol {agreed.chosen_version}), serving at {socket}")

    threading.Thread(target=watch_registry, args=(channel, stopping), daemon=True).start()
    # Event.wait without a timeout is not interrupted by signals in the main thread.
    while not stopping.wait(1):
        pass

    try:
        registry.Unregister(pb.UnregisterRequest(id=env["CORBEL_PROVIDER_ID"], session=session),
                            timeout=UNREGISTER_DEADLINE)
        log("unregistered")
    except grpc.RpcError as e:
        log(f"unregister failed ({e.code().name}): exiting anyway")
    server.stop(grace=2).wait()
    channel.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
