"""deploy/: each overlay, alone and with the backend components, rendered by
`kubectl kustomize`, every object validated offline against the Kubernetes schemas
(kubernetes-validate, strict: an unknown field fails), and the deployment's rules
checked on the rendered objects: the agent's host PID, node name and socket; probes
and scrape annotations on the metrics ports; TLS and auth from Secrets; no privileged
container and no capability beyond what the chosen backends need; the journal (a
PersistentVolumeClaim for SQLite only, a Secret's URL for PostgreSQL); RBAC that only
reads nodes and pods. Each rule is also shown to catch manifests that break it."""

from __future__ import annotations

import copy
import shlex
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.optional import need, need_command

kubernetes_validate = need("kubernetes_validate")
yaml = need("yaml")  # PyYAML: a dependency of kubernetes-validate

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

# The oldest and the newest Kubernetes the manifests are validated against.
KUBERNETES_VERSIONS = ("1.32.0", "1.37.0")
NAMESPACE = "timeslice"
IMAGE = "timeslice:0.1.0"
ORCHESTRATOR_METRICS_PORT = 9090
AGENT_METRICS_PORT = 9091

Obj = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Variant:
    """An overlay with components: what to render, and what it must then show."""

    overlay: str
    components: tuple[str, ...] = ()

    @property
    def backends(self) -> set[str]:
        extra = {"cuda": "cuda", "app-endpoint": "app_endpoint"}
        return {"app_channel"} | {extra[c] for c in self.components}

    @property
    def agent_capabilities(self) -> set[str]:
        return {"SYS_PTRACE"} if "cuda" in self.components else set()


VARIANTS = {
    "sqlite": Variant(overlay="sqlite"),
    "postgres": Variant(overlay="postgres"),
    "sqlite+cuda+app-endpoint": Variant(overlay="sqlite", components=("cuda", "app-endpoint")),
    "postgres+cuda": Variant(overlay="postgres", components=("cuda",)),
}

SECRETS = {
    "timeslice-orchestrator-tls",
    "timeslice-orchestrator-auth",
    "timeslice-agent-tls",
    "timeslice-agent-auth",
    "timeslice-tokens",
}


def render(variant: Variant, workdir: Path) -> list[Obj]:
    """The objects `kubectl kustomize` makes of `variant`."""
    kubectl = need_command("kubectl")
    target = DEPLOY / "overlays" / variant.overlay
    if variant.components:
        # an overlay of the overlay; kustomize takes relative paths only
        workdir.mkdir(parents=True)
        relative = lambda path: os.path.relpath(path, workdir)  # noqa: E731
        components = [relative(DEPLOY / "components" / c) for c in variant.components]
        (workdir / "kustomization.yaml").write_text(
            yaml.safe_dump({"resources": [relative(target)], "components": components})
        )
        target = workdir
    result = subprocess.run(
        [kubectl, "kustomize", str(target)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [obj for obj in yaml.safe_load_all(result.stdout) if obj]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Obj]]:
    workdir = tmp_path_factory.mktemp("kustomize")
    return {name: render(variant, workdir / name) for name, variant in VARIANTS.items()}


# --- finding things in the rendered objects -----------------------------------------------
def named(objects: list[Obj], kind: str, name: str) -> Obj:
    [obj] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def containers(pod: Obj) -> Iterator[Obj]:
    yield from pod.get("initContainers") or ()
    yield from pod["containers"]


def container(pod: Obj, name: str) -> Obj:
    [found] = [c for c in pod["containers"] if c["name"] == name]
    return found


def env_of(box: Obj, name: str) -> Obj | None:
    return next((e for e in box.get("env") or () if e["name"] == name), None)


def secret_key(box: Obj, name: str) -> tuple[str, str] | None:
    """The (Secret, key) the environment variable `name` comes from, if one."""
    ref = ((env_of(box, name) or {}).get("valueFrom") or {}).get("secretKeyRef")
    return (ref["name"], ref["key"]) if ref else None


def option(box: Obj, name: str) -> list[str]:
    """The values given to `--name=...` in the container's arguments."""
    return [a.split("=", 1)[1] for a in box.get("args") or () if a.startswith(f"{name}=")]


def secret_files(pod: Obj, box: Obj) -> dict[str, str]:
    """Each file path the container sees from a Secret, and that Secret's name."""
    volumes = {v["name"]: v for v in pod.get("volumes") or ()}
    files: dict[str, str] = {}
    for mount in box.get("volumeMounts") or ():
        if not mount.get("readOnly"):
            continue
        volume = volumes[mount["name"]]
        sources = (volume.get("projected") or {}).get("sources") or []
        if "secret" in volume:
            sources = [{"secret": {"name": volume["secret"]["secretName"], **volume["secret"]}}]
        for source in sources:
            secret = source.get("secret")
            for item in (secret or {}).get("items") or ():
                files[f"{mount['mountPath']}/{item['path']}"] = secret["name"]
    return files


def secrets_referenced(objects: list[Obj]) -> set[str]:
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("secretKeyRef"), dict):
                found.add(node["secretKeyRef"]["name"])
            if isinstance(node.get("secret"), dict):
                found.add(node["secret"].get("name") or node["secret"].get("secretName"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(objects)
    return found


# --- the rules -----------------------------------------------------------------------------
def problems(objects: list[Obj], variant: Variant) -> list[str]:
    """Every rule of the deployment that the rendered `objects` break, one line each."""
    found = general_problems(objects, variant)
    found += orchestrator_problems(objects, variant)
    found += agent_problems(objects, variant)
    found += rbac_problems(objects)
    return found


def general_problems(objects: list[Obj], variant: Variant) -> list[str]:
    found = []
    for obj in objects:
        where = f"{obj['kind']} {obj['metadata']['name']}"
        if obj["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding"}:
            if obj["metadata"].get("namespace") != NAMESPACE:
                found.append(f"{where}: not in namespace {NAMESPACE}")
        if obj["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") != "timeslice":
            found.append(f"{where}: no app.kubernetes.io/part-of label")
        if obj["kind"] == "Secret":
            found.append(f"{where}: a Secret in the manifests (the operator creates them)")
    if not any(o["kind"] == "Namespace" and o["metadata"]["name"] == NAMESPACE for o in objects):
        found.append(f"no Namespace {NAMESPACE}")
    expected = SECRETS | ({"timeslice-postgres"} if variant.overlay == "postgres" else set())
    if secrets_referenced(objects) != expected:
        found.append(f"Secrets referenced: {sorted(secrets_referenced(objects))}")
    claims = [o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"]
    if claims != (["timeslice-journal"] if variant.overlay == "sqlite" else []):
        found.append(f"PersistentVolumeClaims: {claims}")
    return found


def pod_problems(
    what: str, pod: Obj, capabilities: dict[str, set[str]], host_network: bool
) -> list[str]:
    """No privilege beyond `capabilities` (per container) and the host network if
    allowed; read-only root filesystems; bounded resources; the image of this release."""
    found = []
    if bool(pod.get("hostNetwork")) != host_network:
        found.append(f"{what}: hostNetwork is {pod.get('hostNetwork')}")
    if pod.get("hostIPC"):
        found.append(f"{what}: hostIPC")
    for box in containers(pod):
        here = f"{what} container {box['name']}"
        context = box.get("securityContext") or {}
        if context.get("privileged"):
            found.append(f"{here}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{here}: allowPrivilegeEscalation is not false")
        if context.get("readOnlyRootFilesystem") is not True:
            found.append(f"{here}: the root filesystem is writable")
        caps = context.get("capabilities") or {}
        if caps.get("drop") != ["ALL"]:
            found.append(f"{here}: capabilities not all dropped")
        if set(caps.get("add") or ()) != capabilities.get(box["name"], set()):
            found.append(f"{here}: capabilities added {caps.get('add')}")
        resources = box.get("resources") or {}
        for kind in ("requests", "limits"):
            if set((resources.get(kind) or {})) != {"cpu", "memory"}:
                found.append(f"{here}: no cpu and memory {kind}")
        if box["image"] != IMAGE:
            found.append(f"{here}: image {box['image']}")
    return found


def probe_problems(what: str, template: Obj, box: Obj, port: int) -> list[str]:
    """HTTP probes on the metrics port (a gRPC probe cannot speak TLS), which the
    process serves and Prometheus is told to scrape."""
    found = []
    expected = {
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
        "startupProbe": "/healthz",
    }
    for probe, path in expected.items():
        http = (box.get(probe) or {}).get("httpGet") or {}
        if (http.get("path"), http.get("port")) != (path, port):
            found.append(f"{what}: {probe} is not GET {path} on port {port}")
    if option(box, "--metrics-port") != [str(port)]:
        found.append(f"{what}: --metrics-port is not {port}")
    annotations = template["metadata"].get("annotations") or {}
    scrape = {k: annotations.get(f"prometheus.io/{k}") for k in ("scrape", "port", "path")}
    if scrape != {"scrape": "true", "port": str(port), "path": "/metrics"}:
        found.append(f"{what}: scrape annotations {scrape}")
    if port not in {p["containerPort"] for p in box.get("ports") or ()}:
        found.append(f"{what}: port {port} not declared")
    return found


def security_problems(what: str, pod: Obj, box: Obj, client_ca_option: str) -> list[str]:
    """Listening on 0.0.0.0 with TLS and an auth file, each from a Secret, never
    --insecure; the CA that checks the other side from a Secret too."""
    found = []
    files = secret_files(pod, box)
    if option(box, "--host") != ["0.0.0.0"]:
        found.append(f"{what}: --host is {option(box, '--host')}")
    if "--insecure" in (box.get("args") or ()) or option(box, "--insecure"):
        found.append(f"{what}: --insecure")
    for name in ("--tls-cert", "--tls-key", "--auth", client_ca_option):
        values = option(box, name)
        if len(values) != 1 or values[0] not in files:
            found.append(f"{what}: {name} {values} is not a file from a Secret")
    return found


def orchestrator_problems(objects: list[Obj], variant: Variant) -> list[str]:
    deployment = named(objects, "Deployment", "timeslice-orchestrator")
    template = deployment["spec"]["template"]
    pod = template["spec"]
    box = container(pod, "orchestrator")
    what = "orchestrator"
    found = pod_problems(what, pod, {}, host_network=False)
    found += probe_problems(what, template, box, ORCHESTRATOR_METRICS_PORT)
    found += security_problems(what, pod, box, "--agent-tls-ca")
    spec = deployment["spec"]
    if variant.overlay == "sqlite":
        # One writer per journal file: never two pods at once, not even in a rollout.
        if (spec.get("replicas"), spec.get("strategy", {}).get("type")) != (1, "Recreate"):
            found.append(f"{what}: not one replica replaced by Recreate")
    else:
        # Candidates on one PostgreSQL journal: a standby for each loss, a lease set,
        # and each says where it is reached (its pod's address).
        if (spec.get("replicas") or 1) < 2:
            found.append(f"{what}: no standby (one replica on PostgreSQL)")
        if not (env_of(box, "TIMESLICE_LEADER_LEASE") or {}).get("value"):
            found.append(f"{what}: no TIMESLICE_LEADER_LEASE")
        advertise = (env_of(box, "TIMESLICE_ADVERTISE") or {}).get("value", "")
        pod_ip = ((env_of(box, "POD_IP") or {}).get("valueFrom") or {}).get("fieldRef", {})
        if advertise != "$(POD_IP):50051" or pod_ip.get("fieldPath") != "status.podIP":
            found.append(f"{what}: TIMESLICE_ADVERTISE is not the pod's address")
    if pod.get("hostPID"):
        found.append(f"{what}: hostPID")
    if pod.get("serviceAccountName") != "timeslice-orchestrator":
        found.append(f"{what}: service account {pod.get('serviceAccountName')}")
    if (pod.get("securityContext") or {}).get("runAsNonRoot") is not True:
        found.append(f"{what}: may run as root")
    if "--kubernetes" not in (box.get("args") or ()):
        found.append(f"{what}: no --kubernetes discovery")
    if secret_key(box, "TIMESLICE_AGENT_TOKEN") != ("timeslice-tokens", "agent-token"):
        found.append(f"{what}: TIMESLICE_AGENT_TOKEN is not from a Secret")
    if option(box, "--db"):
        found.append(f"{what}: --db on the command line (the overlay sets TIMESLICE_DB)")
    db = env_of(box, "TIMESLICE_DB") or {}
    claims = [v for v in pod.get("volumes") or () if "persistentVolumeClaim" in v]
    if variant.overlay == "sqlite":
        mounts = {m["name"]: m["mountPath"] for m in box.get("volumeMounts") or ()}
        if db.get("value") != "sqlite:////var/lib/timeslice/journal.db":
            found.append(f"{what}: TIMESLICE_DB {db}")
        if [(c["name"], c["persistentVolumeClaim"]["claimName"]) for c in claims] != [
            ("journal", "timeslice-journal")
        ] or mounts.get("journal") != "/var/lib/timeslice":
            found.append(f"{what}: the journal's volume is not mounted at /var/lib/timeslice")
    else:
        if secret_key(box, "TIMESLICE_DB") != ("timeslice-postgres", "url"):
            found.append(f"{what}: TIMESLICE_DB is not the Secret's URL")
        if claims:
            found.append(f"{what}: a volume claim without SQLite")
    service = named(objects, "Service", "timeslice-orchestrator")
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    if ports != {"grpc": 50051, "metrics": ORCHESTRATOR_METRICS_PORT}:
        found.append(f"service: ports {ports}")
    selector = service["spec"]["selector"].items()
    if not selector <= template["metadata"]["labels"].items():
        found.append("service: its selector misses the orchestrator's pods")
    agent = named(objects, "DaemonSet", "timeslice-agent")["spec"]["template"]
    if selector <= agent["metadata"]["labels"].items():
        found.append("service: its selector takes the agents too")
    return found


def agent_problems(objects: list[Obj], variant: Variant) -> list[str]:
    template = named(objects, "DaemonSet", "timeslice-agent")["spec"]["template"]
    pod = template["spec"]
    box = container(pod, "agent")
    what = "agent"
    capabilities = {"agent": variant.agent_capabilities, "host-directories": {"CHOWN"}}
    found = pod_problems(what, pod, capabilities, host_network="app-endpoint" in variant.components)
    found += probe_problems(what, template, box, AGENT_METRICS_PORT)
    found += security_problems(what, pod, box, "--orchestrator-tls-ca")
    if pod.get("hostPID") is not True:
        found.append(f"{what}: no hostPID")
    node = ((env_of(box, "NODE_NAME") or {}).get("valueFrom") or {}).get("fieldRef") or {}
    if node.get("fieldPath") != "spec.nodeName" or option(box, "--node-name") != ["$(NODE_NAME)"]:
        found.append(f"{what}: the node name is not the downward API's spec.nodeName")
    if set(option(box, "--backend")) != variant.backends:
        found.append(f"{what}: backends {option(box, '--backend')}")
    if option(box, "--socket") != ["/run/timeslice/agent.sock"]:
        found.append(f"{what}: --socket {option(box, '--socket')}")
    volumes = {v["name"]: v for v in pod.get("volumes") or ()}
    sockets = [
        m
        for m in box.get("volumeMounts") or ()
        if (volumes[m["name"]].get("hostPath") or {}).get("path") == "/run/timeslice"
    ]
    if [m["mountPath"] for m in sockets] != ["/run/timeslice"]:
        found.append(f"{what}: the socket's directory is not the node's /run/timeslice")
    if option(box, "--orchestrator") != ["timeslice-orchestrator:50051"]:
        found.append(f"{what}: --orchestrator {option(box, '--orchestrator')}")
    if secret_key(box, "TIMESLICE_ORCHESTRATOR_TOKEN") != (
        "timeslice-tokens",
        "orchestrator-token",
    ):
        found.append(f"{what}: TIMESLICE_ORCHESTRATOR_TOKEN is not from a Secret")
    if pod.get("automountServiceAccountToken") is not False:
        found.append(f"{what}: a Kubernetes API token mounted")
    if not any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations") or ()):
        found.append(f"{what}: no toleration of GPU nodes' taint")
    runs_as = (box.get("securityContext") or {}).get(
        "runAsUser", pod["securityContext"].get("runAsUser")
    )
    if "cuda" in variant.components:
        visible = (env_of(box, "NVIDIA_VISIBLE_DEVICES") or {}).get("value")
        if pod.get("runtimeClassName") != "nvidia" or visible != "all":
            found.append(f"{what}: cuda without the NVIDIA runtime and devices")
        if "nvidia.com/gpu" in str(box.get("resources")):
            found.append(f"{what}: takes a GPU from the jobs")
    elif runs_as in (None, 0) or pod.get("runtimeClassName"):
        found.append(f"{what}: root or the NVIDIA runtime without the cuda backend")
    return found


def rbac_problems(objects: list[Obj]) -> list[str]:
    found = []
    if any(o["kind"] in {"Role", "RoleBinding"} for o in objects):
        found.append("rbac: namespaced roles")
    [role] = [o for o in objects if o["kind"] == "ClusterRole"]
    for rule in role["rules"]:
        if rule.get("apiGroups") != [""] or set(rule.get("resources", ())) - {"nodes", "pods"}:
            found.append(f"rbac: a rule beyond core nodes and pods: {rule}")
        if not set(rule.get("verbs", ())) <= {"get", "list", "watch"}:
            found.append(f"rbac: verbs beyond get, list and watch: {rule['verbs']}")
        if rule.get("resourceNames") or rule.get("nonResourceURLs"):
            found.append(f"rbac: an odd rule {rule}")
    [binding] = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    if binding["roleRef"]["name"] != role["metadata"]["name"] or binding["subjects"] != [
        {"kind": "ServiceAccount", "name": "timeslice-orchestrator", "namespace": NAMESPACE}
    ]:
        found.append(f"rbac: bound to {binding['subjects']}")
    return found


def schema_problems(objects: list[Obj], version: str) -> list[str]:
    found = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            found.append(f"{obj['kind']} {obj['metadata']['name']}: {exc.message}")
    return found


# --- the tests -----------------------------------------------------------------------------
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_object_is_valid_kubernetes(
    rendered: dict[str, list[Obj]], name: str, version: str
) -> None:
    objects = rendered[name]
    kinds = sorted(o["kind"] for o in objects)
    assert {"Deployment", "DaemonSet", "Service", "ClusterRole"} <= set(kinds)
    assert schema_problems(objects, version) == []


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_deployment_keeps_its_rules(rendered: dict[str, list[Obj]], name: str) -> None:
    assert problems(rendered[name], VARIANTS[name]) == []


def agent_box(objects: list[Obj]) -> Obj:
    pod = named(objects, "DaemonSet", "timeslice-agent")["spec"]["template"]["spec"]
    return container(pod, "agent")


def orchestrator_box(objects: list[Obj]) -> Obj:
    pod = named(objects, "Deployment", "timeslice-orchestrator")["spec"]["template"]["spec"]
    return container(pod, "orchestrator")


def set_privileged(objects: list[Obj]) -> None:
    agent_box(objects)["securityContext"]["privileged"] = True


def drop_host_pid(objects: list[Obj]) -> None:
    named(objects, "DaemonSet", "timeslice-agent")["spec"]["template"]["spec"]["hostPID"] = False


def add_capability(objects: list[Obj]) -> None:
    agent_box(objects)["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]


def probe_wrong_port(objects: list[Obj]) -> None:
    orchestrator_box(objects)["livenessProbe"]["httpGet"]["port"] = AGENT_METRICS_PORT


def writable_rbac(objects: list[Obj]) -> None:
    [role] = [o for o in objects if o["kind"] == "ClusterRole"]
    role["rules"][0]["verbs"].append("patch")


def insecure(objects: list[Obj]) -> None:
    orchestrator_box(objects)["args"].append("--insecure")


def token_in_plain_text(objects: list[Obj]) -> None:
    env_of(orchestrator_box(objects), "TIMESLICE_AGENT_TOKEN")["valueFrom"] = None  # type: ignore[index]


def claim_without_sqlite(objects: list[Obj]) -> None:
    objects.append(
        {"kind": "PersistentVolumeClaim", "metadata": {"name": "x", "namespace": NAMESPACE}}
    )


def two_orchestrators(objects: list[Obj]) -> None:
    named(objects, "Deployment", "timeslice-orchestrator")["spec"]["replicas"] = 2


def one_candidate(objects: list[Obj]) -> None:
    named(objects, "Deployment", "timeslice-orchestrator")["spec"]["replicas"] = 1


def no_advertise(objects: list[Obj]) -> None:
    box = orchestrator_box(objects)
    box["env"] = [e for e in box["env"] if e["name"] != "TIMESLICE_ADVERTISE"]


def unknown_field(objects: list[Obj]) -> None:
    named(objects, "DaemonSet", "timeslice-agent")["spec"]["template"]["spec"]["hostPid"] = True


# name: (variant, what breaks the rendered objects, the problem expected)
BROKEN: dict[str, tuple[str, Callable[[list[Obj]], None], str]] = {
    "privileged": ("sqlite", set_privileged, "privileged"),
    "no host pid": ("sqlite", drop_host_pid, "no hostPID"),
    "capability": ("sqlite+cuda+app-endpoint", add_capability, "capabilities added"),
    "probe port": ("postgres", probe_wrong_port, "livenessProbe"),
    "rbac verbs": ("sqlite", writable_rbac, "verbs beyond"),
    "insecure": ("postgres", insecure, "--insecure"),
    "token": ("sqlite", token_in_plain_text, "TIMESLICE_AGENT_TOKEN"),
    "claim": ("postgres", claim_without_sqlite, "PersistentVolumeClaims"),
    "replicas": ("sqlite", two_orchestrators, "one replica"),
    "standby": ("postgres", one_candidate, "no standby"),
    "advertise": ("postgres", no_advertise, "TIMESLICE_ADVERTISE"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_rule_catches_manifests_that_break_it(
    rendered: dict[str, list[Obj]], case: str
) -> None:
    name, breaks, expected = BROKEN[case]
    objects = copy.deepcopy(rendered[name])
    breaks(objects)
    found = problems(objects, VARIANTS[name])
    assert any(expected in problem for problem in found), found


def test_the_schemas_catch_an_unknown_field(rendered: dict[str, list[Obj]]) -> None:
    objects = copy.deepcopy(rendered["sqlite"])
    unknown_field(objects)
    found = schema_problems(objects, KUBERNETES_VERSIONS[0])
    assert any("'hostPid' was unexpected" in problem for problem in found), found


# --- the manifests against the program they run ---------------------------------------------
def serve_words(box: Obj) -> list[str]:
    """The `timeslice` arguments a container runs: its args, after the words of a
    `/bin/sh -c 'exec timeslice ... "$@"'` wrapper when it has one."""
    command, args = list(box.get("command") or ()), list(box.get("args") or ())
    if command[:2] == ["/bin/sh", "-c"]:
        words = shlex.split(command[2])
        start = words.index("timeslice") + 1
        return [w for w in words[start:] if w != "$@"] + args
    assert not command, f"{box['name']}: runs {command}, not timeslice"
    return args


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_option_and_variable_is_one_the_program_reads(
    rendered: dict[str, list[Obj]], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each server container's command line parses as its `serve` command's (no
    unknown option, no value of the wrong type), and each TIMESLICE_ variable it
    sets is one an option or a credential is read from."""
    import typer.main

    from timeslice.cli import app
    from timeslice.cli_credentials import ENV_AGENT_TOKEN, ENV_ORCHESTRATOR_TOKEN
    from timeslice.cli_env import env_names

    for variable in [v for v in os.environ if v.startswith("TIMESLICE_") or v == "NODE_NAME"]:
        monkeypatch.delenv(variable)
    group: Any = typer.main.get_command(app)
    serve = group.get_command(None, "serve")
    checked = set()
    for obj in rendered[name]:
        if obj["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for box in obj["spec"]["template"]["spec"]["containers"]:
            words = serve_words(box)
            assert words[:1] == ["serve"], f"{box['name']}: {words}"
            command = serve.get_command(None, words[1])
            assert command is not None, f"{box['name']}: no command serve {words[1]}"
            command.make_context(f"serve {words[1]}", words[2:])  # raises on a bad option
            readable = {ENV_AGENT_TOKEN, ENV_ORCHESTRATOR_TOKEN}
            for param in command.params:
                if param.opts and param.opts[0].startswith("--"):
                    readable |= set(env_names(param))
            for env in box.get("env") or ():
                if env["name"].startswith("TIMESLICE_"):
                    assert env["name"] in readable, (
                        f"{box['name']}: {env['name']} is read by nothing"
                    )
            checked.add(words[1])
    assert checked == {"orchestrator", "agent"}
