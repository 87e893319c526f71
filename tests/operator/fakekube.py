"""An in-memory API server for the operator's reconcile logic (rlscale.operator.kube.KubeAPI): objects
kept as JSON would keep them, resourceVersion bumped on every change and generation on a spec change,
409 on a write against a stale resourceVersion or a create of an existing name, 404 for a missing
object or an API the cluster does not serve (a read of either is None, as Kube.get has it), and
whatever refusal a test sets for a kind."""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from rlscale.operator import constants as C
from rlscale.operator.kube import RLRUN_API, status_patch

Key = tuple[str, str, str, str]  # (apiVersion, kind, namespace, name)
# Top-level fields that are not the object's desired state: a change there bumps no generation.
_NOT_SPEC = ("apiVersion", "kind", "metadata", "status")


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: None removes a key, objects merge, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


def _error(status: int, reason: str, message: str | None = None) -> ApiException:
    """The API server's error: its Status body carries the message `kubectl` prints."""
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"kind": "Status", "code": status, "reason": reason, "message": message or reason})
    return exc


class FakeKube:
    """KubeAPI in memory; `calls` counts the calls by method, `events` keeps the posted Events."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.calls: dict[str, int] = {}
        self.unserved: set[str] = set()  # apiVersions this cluster does not serve (404)
        # kind -> the status (and the API server's message) an apply of it gets: a refusal
        self.refuse: dict[str, int | tuple[int, str]] = {}
        # What other writers do just before the next status writes (one each): a concurrent pass, say.
        self.before_status_write: list[Callable[[], object]] = []
        self._rv = itertools.count(1)
        self._uid = itertools.count(1)

    # ------------------------------------------------------------ KubeAPI

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self._count("apply")
        self._served(manifest["apiVersion"])
        if manifest["kind"] in self.refuse:
            refusal = self.refuse[manifest["kind"]]
            raise _error(*refusal) if isinstance(refusal, tuple) else _error(refusal, "Invalid")
        key = self._key(manifest)
        have = self.objects.get(key)
        if have is None:
            return self._store(key, self._new(manifest))
        # Server-side apply with force, every field sent owned by the operator: those become what was
        # sent; status and other writers' labels and annotations stay.
        new = copy.deepcopy(have)
        meta = manifest["metadata"]
        for field in ("labels", "annotations"):
            new["metadata"][field] = {**have["metadata"].get(field, {}), **meta.get(field, {})}
        new["metadata"]["ownerReferences"] = copy.deepcopy(meta.get("ownerReferences", []))
        new.update({k: copy.deepcopy(v) for k, v in manifest.items() if k not in _NOT_SPEC})
        return self._store(key, new, have)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self._count("get")
        if api_version in self.unserved:  # the API server's 404, which Kube.get answers as None too
            return None
        obj = self.objects.get((api_version, kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list_pods(self, namespace: str, run: str) -> list[dict[str, Any]]:
        self._count("list_pods")
        return [copy.deepcopy(o) for (_, kind, ns, _), o in sorted(self.objects.items())
                if kind == "Pod" and ns == namespace and o["metadata"].get("labels", {}).get(C.LABEL_RUN) == run]

    def create_if_absent(self, manifest: dict[str, Any]) -> bool:
        self._count("create_if_absent")
        key = self._key(manifest)
        if key in self.objects:
            return False
        self._store(key, self._new(manifest))
        return True

    def update_status(self, obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        self._count("update_status")
        if self.before_status_write:
            self.before_status_write.pop(0)()
        return self.merge_patch(obj, {"status": status_patch(obj.get("status") or {}, status)}, status=True)

    def merge_patch(self, obj: dict[str, Any], patch: dict[str, Any], status: bool = False) -> dict[str, Any]:
        self._count("merge_patch")
        key = self._key(obj)
        have = self._existing(key)
        if have["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise _error(409, "Conflict")
        part = {"status": patch.get("status")} if status else {k: v for k, v in patch.items() if k != "status"}
        return self._store(key, merge(have, part), have)

    def remove_annotation(self, namespace: str, name: str, key: str) -> None:
        self._count("remove_annotation")
        k = (RLRUN_API, C.RLRUN_KIND, namespace, name)
        self._store(k, merge(self._existing(k), {"metadata": {"annotations": {key: None}}}), self.objects[k])

    def post_event(self, rlrun: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self._count("post_event")
        self.events.append({"type": type_, "reason": reason, "message": message,
                            "object": rlrun["metadata"]["name"]})

    # ------------------------------------------------------------ what the tests do as users and controllers

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """kubectl create: a 409 when the name is taken."""
        key = self._key(obj)
        if key in self.objects:
            raise _error(409, "AlreadyExists")
        return self._store(key, self._new(obj))

    def patch(self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """kubectl patch --type=merge (unconditional)."""
        key = (api_version, kind, namespace, name)
        return self._store(key, merge(self._existing(key), patch), self.objects[key])

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        key = (api_version, kind, namespace, name)
        self._existing(key)
        del self.objects[key]

    def namespace(self, name: str, **labels: str) -> dict[str, Any]:
        """kubectl create namespace NAME, then kubectl label it."""
        return self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})

    def of_kind(self, kind: str, namespace: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for (_, k, ns, _), o in sorted(self.objects.items()) if k == kind and ns == namespace]

    # ------------------------------------------------------------ storage

    def _count(self, method: str) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1

    def _served(self, api_version: str) -> None:
        if api_version in self.unserved:
            raise _error(404, "NotFound")

    @staticmethod
    def _key(obj: dict[str, Any]) -> Key:
        m = obj["metadata"]
        return obj["apiVersion"], obj["kind"], m.get("namespace", ""), m["name"]  # "": cluster-scoped

    def _existing(self, key: Key) -> dict[str, Any]:
        if key not in self.objects:
            raise _error(404, "NotFound")
        return self.objects[key]

    def _new(self, manifest: dict[str, Any]) -> dict[str, Any]:
        obj = json.loads(json.dumps(manifest))
        obj["metadata"].update(uid=f"uid-{next(self._uid)}", generation=1,
                               creationTimestamp="2026-12-01T00:00:00Z")
        return obj

    def _store(self, key: Key, new: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
        """Keep `new` as JSON keeps it; a change bumps resourceVersion, a change of desired state generation."""
        new = json.loads(json.dumps(new))
        if old is not None:
            if new == old:
                return copy.deepcopy(old)
            spec_of = ({k: v for k, v in o.items() if k not in _NOT_SPEC} for o in (new, old))
            if next(spec_of) != next(spec_of):
                new["metadata"]["generation"] = int(old["metadata"].get("generation") or 1) + 1
        new["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[key] = new
        return copy.deepcopy(new)
