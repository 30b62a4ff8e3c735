#!/usr/bin/env python3
"""Validates the deployment manifests, offline, with real tools.

Usage: validate.py AGENT_BINARY KUSTOMIZATION_DIR...

For each kustomization: renders it with `kubectl kustomize`, validates every object
against the Kubernetes schemas bundled with kubernetes-validate (strict: unknown fields
fail), checks custom resources (ServiceMonitor, PrometheusRule, SecurityContextConstraints)
for the fields their controllers need, and runs every argument list of the agent's
container through the agent's own CLI parser (`datapath-monitor run ... --dry-run`).
Run by `cargo xtask test`; exits non-zero on the first kind of failure, after reporting all.
"""

import subprocess
import sys

import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.31.0"
AGENT_CONTAINER = "agent"
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
        summary = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
        print(f"ok: {kustomization}: rendered {len(objects)} objects ({summary}), checked against Kubernetes {KUBERNETES_VERSION}")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
