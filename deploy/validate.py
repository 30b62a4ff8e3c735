#!/usr/bin/env python3
"""Validates the deployment manifests, offline, with real tools.

Usage: validate.py AGENT_BINARY KUSTOMIZATION_DIR...

For each kustomization: renders it with `kubectl kustomize`, validates every object
against the Kubernetes schemas bundled with kubernetes-validate (strict: unknown fields
fail), checks custom resources (ServiceMonitor, PrometheusRule, SecurityContextConstraints)
for the fields their controllers need, runs every argument list of the agent's
container through the agent's own CLI parser (`datapath-monitor run ... --dry-run`), and
checks the access design: the agent listens on loopback only, kube-rbac-proxy in the same
pod fronts it (TLS, only /metrics, its service account allowed TokenReviews and
SubjectAccessReviews), and the Service and ServiceMonitor reach the agent only through it.
Run by `cargo xtask test`; exits non-zero on the first kind of failure, after reporting all.
"""

import subprocess
import sys

import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.31.0"
AGENT_CONTAINER = "agent"
PROXY_CONTAINER = "kube-rbac-proxy"
LOOPBACK_HOSTS = {"127.0.0.1", "::1", "localhost"}
TLS_VERSIONS = {"VersionTLS12", "VersionTLS13"}
# Custom resources: no bundled schema; the fields each one cannot do without.
CUSTOM = {
    "ServiceMonitor": ["spec.selector", "spec.endpoints"],
    "PrometheusRule": ["spec.groups"],
    "SecurityContextConstraints": ["allowedCapabilities", "volumes"],
}


def lookup(obj, dotted):
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def flag(args, name):
    """The value of the last `--name=value` or `--name value` in args, or None."""
    value = None
    for i, arg in enumerate(args):
        if arg.startswith(f"{name}="):
            value = arg.split("=", 1)[1]
        elif arg == name and i + 1 < len(args):
            value = args[i + 1]
    return value


def host_port(address):
    """("127.0.0.1", 9781) from "127.0.0.1:9781", "[::1]:9781" or "http://127.0.0.1:9781/"."""
    address = address.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port) if port.isdigit() else None


def container_port(container, target):
    """The containerPort a Service's targetPort (number or name) means in this container."""
    for port in container.get("ports") or []:
        if target in (port.get("name"), port.get("containerPort")):
            return port.get("containerPort")
    return None


def check_access(objects):
    """The agent on loopback behind kube-rbac-proxy; returns (failures, oks)."""
    failures, oks = [], []
    by_kind = {}
    for obj in objects:
        by_kind.setdefault(obj.get("kind"), []).append(obj)
    daemonsets = by_kind.get("DaemonSet", [])
    if not daemonsets:
        failures.append("no DaemonSet")
    for ds in daemonsets:
        name = f"DaemonSet/{lookup(ds, 'metadata.name')}"
        namespace = lookup(ds, "metadata.namespace")
        pod = lookup(ds, "spec.template.spec") or {}
        containers = {c.get("name"): c for c in pod.get("containers") or []}
        agent, proxy = containers.get(AGENT_CONTAINER), containers.get(PROXY_CONTAINER)
        if agent is None or proxy is None:
            failures.append(f"{name}: needs containers {AGENT_CONTAINER} and {PROXY_CONTAINER}")
            continue
        listen = flag(agent.get("args") or [], "--listen")
        if listen is None:
            failures.append(f"{name}: the agent's --listen is not spelled out")
            continue
        host, port = host_port(listen)
        if host not in LOOPBACK_HOSTS or port is None:
            failures.append(f"{name}: the agent listens on {listen}, not on loopback only")
            continue
        args = proxy.get("args") or []
        upstream = flag(args, "--upstream") or ""
        up_host, up_port = host_port(upstream) if upstream else (None, None)
        secure = flag(args, "--secure-listen-address")
        secure_port = host_port(secure)[1] if secure else None
        problems = []
        if up_host not in LOOPBACK_HOSTS or up_port != port:
            problems.append(f"--upstream={upstream} is not the agent's loopback port {port}")
        if secure_port is None:
            problems.append("no --secure-listen-address")
        elif container_port(proxy, "https") != secure_port:
            problems.append(f"no port named https = its --secure-listen-address port {secure_port}")
        if flag(args, "--insecure-listen-address"):
            problems.append("--insecure-listen-address serves without TLS")
        if flag(args, "--allow-paths") != "/metrics":
            problems.append("--allow-paths is not exactly /metrics")
        if flag(args, "--ignore-paths"):
            problems.append("--ignore-paths skips authorization")
        if flag(args, "--tls-min-version") not in TLS_VERSIONS:
            problems.append(f"--tls-min-version is not one of {sorted(TLS_VERSIONS)}")
        cert, key = flag(args, "--tls-cert-file"), flag(args, "--tls-private-key-file")
        if (cert is None) != (key is None):
            problems.append("--tls-cert-file and --tls-private-key-file go together")
        mounts = [m.get("mountPath", "").rstrip("/") for m in proxy.get("volumeMounts") or []]
        for file in filter(None, [cert, key]):
            if not any(file.startswith(mount + "/") for mount in mounts):
                problems.append(f"{file} is on no volume mounted into {PROXY_CONTAINER}")
        if pod.get("automountServiceAccountToken") is not True:
            problems.append(f"automountServiceAccountToken is not true: {PROXY_CONTAINER} needs its token")
        for problem in problems:
            failures.append(f"{name}: {PROXY_CONTAINER}: {problem}")
        # kube-rbac-proxy's own permissions, bound to the pod's service account.
        account = pod.get("serviceAccountName", "default")
        roles = {lookup(r, "metadata.name"): r.get("rules") or [] for r in by_kind.get("ClusterRole", [])}
        granted = set()
        for binding in by_kind.get("ClusterRoleBinding", []):
            subjects = binding.get("subjects") or []
            if not any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                       and s.get("namespace") == namespace for s in subjects):
                continue
            for rule in roles.get(lookup(binding, "roleRef.name"), []):
                if "create" in (rule.get("verbs") or []):
                    granted.update(rule.get("resources") or [])
        missing = {"tokenreviews", "subjectaccessreviews"} - granted
        if missing:
            failures.append(f"{name}: service account {account} may not create {', '.join(sorted(missing))}")
        # Every Service port that selects these pods goes to kube-rbac-proxy.
        labels = lookup(ds, "spec.template.metadata.labels") or {}
        for service in by_kind.get("Service", []):
            selector = lookup(service, "spec.selector") or {}
            if not selector or any(labels.get(k) != v for k, v in selector.items()):
                continue
            for service_port in lookup(service, "spec.ports") or []:
                target = service_port.get("targetPort", service_port.get("port"))
                if container_port(proxy, target) != secure_port:
                    failures.append(f"Service/{lookup(service, 'metadata.name')}: port {service_port.get('name')} "
                                    f"targets {target}, not {PROXY_CONTAINER}'s {secure_port}")
        if not problems:
            oks.append(f"{name}: the agent listens on {listen} only; {PROXY_CONTAINER} fronts it on {secure} "
                       f"(TLS, /metrics only, {'certificate ' + cert if cert else 'self-signed certificate'})")
    for monitor in by_kind.get("ServiceMonitor", []):
        for endpoint in lookup(monitor, "spec.endpoints") or []:
            if endpoint.get("scheme") != "https" or endpoint.get("port") != "https":
                failures.append(f"ServiceMonitor/{lookup(monitor, 'metadata.name')}: endpoint {endpoint.get('port')} "
                                f"is not scheme https on port https")
            if not any(key in endpoint for key in ("bearerTokenFile", "bearerTokenSecret", "authorization")):
                failures.append(f"ServiceMonitor/{lookup(monitor, 'metadata.name')}: endpoint {endpoint.get('port')} "
                                f"sends no token; kube-rbac-proxy would answer 401")
    return failures, oks


def main():
    agent, kustomizations = sys.argv[1], sys.argv[2:]
    failures = []
    for kustomization in kustomizations:
        rendered = subprocess.run(
            ["kubectl", "kustomize", kustomization], check=True, capture_output=True, text=True
        ).stdout
        objects = [doc for doc in yaml.safe_load_all(rendered) if doc]
        kinds = {}
        for obj in objects:
            kind = obj.get("kind", "?")
            name = f"{kind}/{lookup(obj, 'metadata.name')}"
            kinds[kind] = kinds.get(kind, 0) + 1
            if kind in CUSTOM:
                missing = [field for field in CUSTOM[kind] if lookup(obj, field) is None]
                if missing:
                    failures.append(f"{kustomization}: {name}: missing {', '.join(missing)}")
                continue
            try:
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as error:
                failures.append(f"{kustomization}: {name}: {error.message} at {'.'.join(map(str, error.path))}")
            except kubernetes_validate.SchemaNotFoundError as error:
                failures.append(f"{kustomization}: {name}: no schema ({error})")
            if kind == "DaemonSet":
                containers = lookup(obj, "spec.template.spec.containers") or []
                agents = [c for c in containers if c.get("name") == AGENT_CONTAINER]
                if not agents:
                    failures.append(f"{kustomization}: {name}: no container named {AGENT_CONTAINER}")
                for container in agents:
                    args = container.get("args", [])
                    check = subprocess.run([agent, *args, "--dry-run"], capture_output=True, text=True)
                    if check.returncode != 0:
                        failures.append(f"{kustomization}: {name}: the agent rejects its args {args}: {check.stderr.strip()}")
                    else:
                        print(f"ok: {kustomization}: {name}: the agent accepts its args: {' '.join(args)}")
        access_failures, oks = check_access(objects)
        failures.extend(f"{kustomization}: {failure}" for failure in access_failures)
        for ok in oks:
            print(f"ok: {kustomization}: {ok}")
        summary = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
        print(f"ok: {kustomization}: rendered {len(objects)} objects ({summary}), checked against Kubernetes {KUBERNETES_VERSION}")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
