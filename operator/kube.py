"""The operator's few API calls, behind one small class (KubeAPI): server-side apply of the children,
reads, guarded status writes and events. `Kube` makes them against an API server; the tests use an
in-memory fake with the same answers (tests/operator/fakekube.py)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Protocol

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from . import constants as C

_PLURALS = {("v1", "ConfigMap"): "configmaps", ("v1", "Service"): "services", ("v1", "Pod"): "pods",
            ("v1", "ServiceAccount"): "serviceaccounts", ("v1", "Secret"): "secrets",
            ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
            ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
            ("rbac.authorization.k8s.io/v1", "Role"): "roles",
            ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
            ("apps/v1", "Deployment"): "deployments", ("apps/v1", "StatefulSet"): "statefulsets",
            ("coordination.k8s.io/v1", "Lease"): "leases",
            ("discovery.k8s.io/v1", "EndpointSlice"): "endpointslices",
            ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
            (C.KUEUE_API, "Workload"): "workloads", (C.POD_GROUP_API, "PodGroup"): "podgroups"}

class NamespaceTerminating(ApiException):
    """The namespace is being deleted: nothing can be created there, and nothing needs to be."""


RLRUN_API = f"{C.GROUP}/{C.VERSION}"


class KubeAPI(Protocol):
    """What the operator asks of the API server. Errors are ApiException with the server's status
    (404 a missing object, 409 a stale resourceVersion or an existing name, 4xx a refusal)."""

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply: creates or patches, and writes nothing when nothing changed."""

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when there is none."""

    def list_pods(self, namespace: str, run: str) -> list[dict[str, Any]]:
        """The run's pods (every role), as the API server has them now."""

    def create_if_absent(self, manifest: dict[str, Any]) -> bool:
        """POST the object unless one of that name exists; True when this call created it."""

    def update_status(self, obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Replace obj's status with `status`, conditional on obj's resourceVersion (409 when stale)."""

    def merge_patch(self, obj: dict[str, Any], patch: dict[str, Any], status: bool = False) -> dict[str, Any]:
        """A JSON merge patch of obj (or its status subresource), conditional on its resourceVersion."""

    def remove_annotation(self, namespace: str, name: str, key: str) -> None:
        """Remove an annotation of the RLRun."""

    def post_event(self, rlrun: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """A Kubernetes Event on the RLRun (`kubectl describe rlrun` shows it)."""


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    if (api_version, kind) == ("v1", "Namespace"):  # cluster-scoped: `namespace` is not used
        return f"/api/v1/namespaces/{name}"
    plural = _PLURALS.get((api_version, kind))
    if plural is None and api_version == RLRUN_API and kind == C.RLRUN_KIND:
        plural = C.PLURAL
    if plural is None:
        raise ValueError(f"no API path known for {api_version} {kind}")
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{plural}/{name}"


def status_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch that turns `old` into `new`: keys gone from `new` (at any depth) set to
    None, so a field dropped from status does not linger (lists are replaced whole anyway)."""
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        out[k] = status_patch(old[k], v) if isinstance(v, dict) and isinstance(old.get(k), dict) else v
    return out


def get_rlrun(api: KubeAPI, namespace: str, name: str) -> dict[str, Any] | None:
    return api.get(RLRUN_API, C.RLRUN_KIND, namespace, name)


def event_body(rlrun: dict[str, Any], type_: str, reason: str, message: str) -> dict[str, Any]:
    meta = rlrun["metadata"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": RLRUN_API, "kind": C.RLRUN_KIND, "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "type": type_, "reason": reason, "message": message[:1024], "firstTimestamp": now, "lastTimestamp": now,
            "count": 1, "source": {"component": C.FIELD_MANAGER}}


class Kube:
    """KubeAPI over the API server: the in-cluster service account, or else a kubeconfig file."""

    def __init__(self, kubeconfig: str | None = None):
        self.kubeconfig = kubeconfig
        self._lock = threading.Lock()
        self._client: client.ApiClient | None = None

    def api(self) -> client.ApiClient:
        """One client per operator, made on first use (not at import: tests import without a cluster)."""
        with self._lock:
            if self._client is None:
                cfg = client.Configuration()
                try:
                    config.load_incluster_config(client_configuration=cfg)
                except config.ConfigException:
                    config.load_kube_config(config_file=self.kubeconfig, client_configuration=cfg)
                # kopf runs sync handlers in a thread pool; give each thread a connection.
                cfg.connection_pool_maxsize = 32
                self._client = client.ApiClient(cfg)
            return self._client

    def _call(self, path: str, method: str, body: Any = None, content_type: str | None = None,
              query: list[tuple[str, str]] | None = None) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        a = self.api()
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

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        m = manifest["metadata"]
        path = object_path(manifest["apiVersion"], manifest["kind"], m["namespace"], m["name"])
        # JSON is valid YAML: the client serialises the dict as JSON for this content type.
        return self._call(path, "PATCH", manifest, "application/apply-patch+yaml",
                          [("fieldManager", C.FIELD_MANAGER), ("force", "true")])

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call(object_path(api_version, kind, namespace, name), "GET")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list_pods(self, namespace: str, run: str) -> list[dict[str, Any]]:
        out = self._call(f"/api/v1/namespaces/{namespace}/pods", "GET",
                         query=[("labelSelector", f"{C.LABEL_RUN}={run}")])
        return out.get("items") or []

    def create_if_absent(self, manifest: dict[str, Any]) -> bool:
        m = manifest["metadata"]
        path = object_path(manifest["apiVersion"], manifest["kind"], m["namespace"], m["name"]).rsplit("/", 1)[0]
        try:
            self._call(path, "POST", manifest, "application/json", [("fieldManager", C.FIELD_MANAGER)])
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    def update_status(self, obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        return self.merge_patch(obj, {"status": status_patch(obj.get("status") or {}, status)}, status=True)

    def merge_patch(self, obj: dict[str, Any], patch: dict[str, Any], status: bool = False) -> dict[str, Any]:
        m = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], m["namespace"], m["name"]) + ("/status" if status else "")
        body = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": m["resourceVersion"]}}
        return self._call(path, "PATCH", body, "application/merge-patch+json")

    def remove_annotation(self, namespace: str, name: str, key: str) -> None:
        path = object_path(RLRUN_API, C.RLRUN_KIND, namespace, name)
        self._call(path, "PATCH", {"metadata": {"annotations": {key: None}}}, "application/merge-patch+json")

    def post_event(self, rlrun: dict[str, Any], type_: str, reason: str, message: str) -> None:
        ns = rlrun["metadata"]["namespace"]
        self._call(f"/api/v1/namespaces/{ns}/events", "POST", event_body(rlrun, type_, reason, message),
                   "application/json")
