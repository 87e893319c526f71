"""The operator's few API calls: server-side apply of children and guarded status writes."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from . import constants as C

_PLURALS = {("v1", "ConfigMap"): "configmaps", ("v1", "Service"): "services", ("v1", "Pod"): "pods",
            ("v1", "ServiceAccount"): "serviceaccounts", ("v1", "Secret"): "secrets",
            ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
            ("rbac.authorization.k8s.io/v1", "Role"): "roles",
            ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
            ("apps/v1", "Deployment"): "deployments", ("apps/v1", "StatefulSet"): "statefulsets",
            (C.KUEUE_API, "Workload"): "workloads", (C.POD_GROUP_API, "PodGroup"): "podgroups"}

class NamespaceTerminating(ApiException):
    """The namespace is being deleted: nothing can be created there, and nothing needs to be."""


_lock = threading.Lock()
_api: client.ApiClient | None = None


def api() -> client.ApiClient:
    """One shared client, from the in-cluster service account or else $KUBECONFIG."""
    global _api
    with _lock:
        if _api is None:
            cfg = client.Configuration()
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                # Read $KUBECONFIG now: the client captured it at import time.
                config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None,
                                        client_configuration=cfg)
            # kopf runs sync handlers in a thread pool; give each thread a connection.
            cfg.connection_pool_maxsize = 32
            _api = client.ApiClient(cfg)
        return _api


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    plural = _PLURALS.get((api_version, kind))
    if plural is None and api_version == f"{C.GROUP}/{C.VERSION}" and kind == C.RLRUN_KIND:
        plural = C.PLURAL
    if plural is None:
        raise ValueError(f"no API path known for {api_version} {kind}")
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{plural}/{name}"


def _call(path: str, method: str, body: Any = None, content_type: str | None = None,
          query: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    headers = {"Accept": "application/json"}
    if content_type:
        headers["Content-Type"] = content_type
    a = api()
    method, url, headers, body, _ = a.param_serialize(method, path, query_params=query or [],
                                                      header_params=headers, body=body,
                                                      auth_settings=["BearerToken"])
    resp = a.call_api(method, url, header_params=headers, body=body, _request_timeout=30)
    data = resp.read()
    if resp.status >= 400:
        text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
        cls = NamespaceTerminating if "NamespaceTerminating" in text else ApiException
        exc = cls(status=resp.status, reason=resp.reason)
        exc.body = text
        raise exc
    return json.loads(data) if data else {}


def apply(manifest: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply: creates or patches, and writes nothing when nothing changed."""
    m = manifest["metadata"]
    path = object_path(manifest["apiVersion"], manifest["kind"], m["namespace"], m["name"])
    # JSON is valid YAML: the client serialises the dict as JSON for this content type.
    return _call(path, "PATCH", manifest, "application/apply-patch+yaml",
                 [("fieldManager", C.FIELD_MANAGER), ("force", "true")])


def create_if_absent(manifest: dict[str, Any]) -> bool:
    """POST the object unless one of that name exists; True when this call created it."""
    m = manifest["metadata"]
    path = object_path(manifest["apiVersion"], manifest["kind"], m["namespace"], m["name"]).rsplit("/", 1)[0]
    try:
        _call(path, "POST", manifest, "application/json", [("fieldManager", C.FIELD_MANAGER)])
        return True
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise


def remove_annotation(namespace: str, name: str, key: str) -> None:
    path = object_path(f"{C.GROUP}/{C.VERSION}", C.RLRUN_KIND, namespace, name)
    _call(path, "PATCH", {"metadata": {"annotations": {key: None}}}, "application/merge-patch+json")


def list_pods(namespace: str, run: str) -> list[dict[str, Any]]:
    """The run's pods (every role), as the API server has them now."""
    out = _call(f"/api/v1/namespaces/{namespace}/pods", "GET", query=[("labelSelector", f"{C.LABEL_RUN}={run}")])
    return out.get("items") or []


def post_event(rlrun: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """A Kubernetes Event on the RLRun (`kubectl describe rlrun` and `kubectl get events` show it)."""
    meta = rlrun["metadata"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": f"{C.GROUP}/{C.VERSION}", "kind": C.RLRUN_KIND, "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "type": type_, "reason": reason, "message": message[:1024], "firstTimestamp": now, "lastTimestamp": now,
            "count": 1, "source": {"component": C.FIELD_MANAGER}}
    _call(f"/api/v1/namespaces/{meta['namespace']}/events", "POST", body, "application/json")


def get(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return _call(object_path(api_version, kind, namespace, name), "GET")
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def merge_patch(obj: dict[str, Any], patch: dict[str, Any], status: bool = False) -> dict[str, Any]:
    """A JSON merge patch of obj (or of its status subresource), conditional on obj's
    resourceVersion: a 409 means someone wrote it since obj was read."""
    m = obj["metadata"]
    path = object_path(obj["apiVersion"], obj["kind"], m["namespace"], m["name"]) + ("/status" if status else "")
    body = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": m["resourceVersion"]}}
    return _call(path, "PATCH", body, "application/merge-patch+json")


def get_rlrun(namespace: str, name: str) -> dict[str, Any] | None:
    return get(f"{C.GROUP}/{C.VERSION}", C.RLRUN_KIND, namespace, name)


def update_status(namespace: str, name: str, mutate: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any] | None],
                  attempts: int = 8) -> dict[str, Any] | None:
    """Read the RLRun, let mutate(body, status) return a new status, and write it guarded by
    resourceVersion (retry on conflict), so concurrent handlers never lose each other's fields.
    mutate returns None to skip the write. Returns the written status, or None."""
    path = object_path(f"{C.GROUP}/{C.VERSION}", C.RLRUN_KIND, namespace, name) + "/status"
    for i in range(attempts):
        body = get_rlrun(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        old = body.get("status") or {}
        new = mutate(body, json.loads(json.dumps(old)))
        if new is None or new == old:
            return None
        # Merge patch: keys set to None are removed; the resourceVersion makes it conditional.
        patch = {"metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                 "status": {**{k: None for k in old if k not in new}, **new}}
        try:
            _call(path, "PATCH", patch, "application/merge-patch+json")
            return new
        except ApiException as exc:
            if exc.status == 409 and i + 1 < attempts:
                time.sleep(0.05 * (i + 1))
                continue
            if exc.status == 404:
                return None
            raise
    return None
