"""The tool pods of a run whose tools run apart from the driver (spec.task.toolSandbox.isolation: pod): a
Deployment of `rlscale tool-server` pods under the RuntimeClass the spec names (which the admin's policy must
allow, operator/policy.py), the Service the driver calls them at (TOOL_SERVER_ENV on the learner pods), and a
NetworkPolicy that lets only the run's learner pods in, on the tool port, and nothing out. Pure, like the
builders.

A tool pod runs what the model wrote, so it gets less than any other pod of the run: no Ray token, no API
token, no model or checkpoint volume, no GPU, none of the learner pod's env or volumes; the run's ConfigMap
(its tools) and, for plug-in tools, task.pluginVolume, read-only. It lands where the learners may (their node
selector, tolerations, affinity and pull secrets), under its own RuntimeClass."""

from __future__ import annotations

import copy
from typing import Any

from rlscale.spec import RLRunSpec
from rlscale.spec.tools import POD_TOOL_WORKERS, TOOL_SERVER_ENV, TOOL_SERVER_PORT, pods

from . import constants as C
from .naming import RunRef, labels, names, object_meta
from .pods import NO_GPUS, POD_SECURITY, _container, _overrides, container_ports

PORT_NAME = "tools"


def tool_server_url(run: RunRef) -> str:
    """The tool pods' Service, as the driver calls it."""
    return f"http://{names(run.name)[C.ROLE_TOOLS]}.{run.namespace}.svc:{TOOL_SERVER_PORT}"


def tool_env(run: RunRef, spec: RLRunSpec) -> list[dict[str, Any]]:
    """The learner pods' env entry naming the tool Service (none when the tools run beside the driver)."""
    return [{"name": TOOL_SERVER_ENV, "value": tool_server_url(run)}] if pods(spec.task) else []


def tool_resources(spec: RLRunSpec) -> dict[str, Any]:
    """A tenth of a core per worker requested; memory limited to the workers' address-space caps plus the server."""
    t = spec.task
    workers = t.tool_workers or POD_TOOL_WORKERS
    return {"requests": {"cpu": f"{100 * workers}m", "memory": "256Mi"},
            "limits": {"memory": f"{workers * t.tool_memory_mb + 256}Mi"}}


def _pod(run: RunRef, spec: RLRunSpec, image: str) -> dict[str, Any]:
    env = [{"name": "RLSCALE_CONFIG", "value": C.CONFIG_PATH}, {"name": "HOME", "value": C.HOME_MOUNT},
           {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}, NO_GPUS]
    mounts = [{"name": "run-config", "mountPath": C.CONFIG_MOUNT_DIR, "readOnly": True},
              {"name": "home", "mountPath": C.HOME_MOUNT}, {"name": "tmp", "mountPath": "/tmp"}]
    volumes = [{"name": "run-config", "configMap": {"name": names(run.name)[C.ROLE_CONFIG]}},
               {"name": "home", "emptyDir": {"sizeLimit": "64Mi"}}, {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    if spec.task.plugin_volume:  # plug-in tools' modules, as the learner pods mount them
        volumes.append({"name": "plugins", **copy.deepcopy(spec.task.plugin_volume)})
        mounts.append({"name": "plugins", "mountPath": C.PLUGINS_MOUNT, "readOnly": True})
        env.append({"name": C.PLUGINS_ENV, "value": C.PLUGINS_MOUNT})
    probe = {"httpGet": {"path": C.READY_PATH, "port": PORT_NAME}, "periodSeconds": 5, "timeoutSeconds": 3}
    container = _container(C.ROLE_TOOLS, image, ["rlscale", "tool-server", "--config", C.CONFIG_PATH, "--port",
                                                 str(TOOL_SERVER_PORT)], env, mounts,
                           ports=container_ports((PORT_NAME, TOOL_SERVER_PORT)), resources=tool_resources(spec),
                           readinessProbe=probe)
    pod: dict[str, Any] = {
        "serviceAccountName": names(run.name)[C.ROLE_RUNNER], "automountServiceAccountToken": False,
        "enableServiceLinks": False, "securityContext": copy.deepcopy(POD_SECURITY),
        "terminationGracePeriodSeconds": 5, "containers": [container], "volumes": volumes,
    }
    # Where the learners may land (the Ray head's rule: their placement and pull secrets, the run's scheduler
    # and priority), and the tool sandbox's own RuntimeClass, not the learner's.
    pod.update(_overrides(spec, C.ROLE_RAY_HEAD))
    box = spec.task.tool_sandbox
    if box is not None and box.runtime_class_name:
        pod["runtimeClassName"] = box.runtime_class_name
    return pod


def build_tool_pods(run: RunRef, spec: RLRunSpec, image: str, learners: int) -> list[dict[str, Any]]:
    """The tool pods' Service, NetworkPolicy and Deployment; none unless task.toolSandbox.isolation is pod.
    `learners`: the learner pods desired now; the tool pods run while they do (zero while suspended, queued
    or ended)."""
    if not pods(spec.task):
        return []
    name, own = names(run.name)[C.ROLE_TOOLS], labels(run.name, C.ROLE_TOOLS)
    selector = {C.LABEL_RUN: run.name, C.LABEL_ROLE: C.ROLE_TOOLS}
    learner_pods = {"podSelector": {"matchLabels": {C.LABEL_RUN: run.name, C.LABEL_ROLE: C.ROLE_LEARNER}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": object_meta(run, name, C.ROLE_TOOLS),
               "spec": {"selector": own, "ports": [{"name": PORT_NAME, "port": TOOL_SERVER_PORT,
                                                    "targetPort": PORT_NAME, "protocol": "TCP"}]}}
    # Egress in policyTypes with no egress rule: nothing out, not even DNS, whatever the chart's
    # networkPolicy.egress says for the run's other pods (where the network plugin enforces NetworkPolicy).
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": object_meta(run, name, C.ROLE_TOOLS),
              "spec": {"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress", "Egress"],
                       "ingress": [{"from": [learner_pods], "ports": [{"port": TOOL_SERVER_PORT,
                                                                       "protocol": "TCP"}]}],
                       "egress": []}}
    replicas = (spec.task.tool_sandbox.replicas or 1) if learners > 0 else 0
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": object_meta(run, name, C.ROLE_TOOLS),
        "spec": {"replicas": replicas, "selector": {"matchLabels": selector},
                 "template": {"metadata": {"labels": own}, "spec": _pod(run, spec, image)}},
    }
    return [service, policy, deployment]


def exclude_tool_pods(selector: dict[str, Any]) -> dict[str, Any]:
    """A run-wide pod selector that leaves the tool pods out (the run's own NetworkPolicy must not open their
    egress nor let the run's other pods in on every port)."""
    out = copy.deepcopy(selector)
    out.setdefault("matchExpressions", []).append({"key": C.LABEL_ROLE, "operator": "NotIn",
                                                   "values": [C.ROLE_TOOLS]})
    return out
