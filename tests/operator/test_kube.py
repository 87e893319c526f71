"""The operator's API paths and error mapping (no cluster)."""

from __future__ import annotations

import pytest

from rlscale.operator import kube


@pytest.mark.parametrize("api_version,kind,path", [
    ("v1", "ConfigMap", "/api/v1/namespaces/ns/configmaps/x"),
    ("v1", "ServiceAccount", "/api/v1/namespaces/ns/serviceaccounts/x"),
    ("apps/v1", "StatefulSet", "/apis/apps/v1/namespaces/ns/statefulsets/x"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "/apis/rbac.authorization.k8s.io/v1/namespaces/ns/rolebindings/x"),
    ("rlscale.dev/v1alpha1", "RLRun", "/apis/rlscale.dev/v1alpha1/namespaces/ns/rlruns/x"),
])
def test_object_paths(api_version, kind, path):
    assert kube.object_path(api_version, kind, "ns", "x") == path


def test_unknown_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="batch/v1 Job"):
        kube.object_path("batch/v1", "Job", "ns", "x")


def test_every_built_child_has_a_path():
    from rlscale.operator import builders as B
    from rlscale.plan import make_plan
    from rlscale.spec import parse_spec

    spec = parse_spec({"hardware": {"accelerator": "cpu"}})
    for m in B.build_children(B.RunRef("r", "ns", "u"), spec, make_plan(spec)):
        assert kube.object_path(m["apiVersion"], m["kind"], "ns", m["metadata"]["name"])


def test_a_status_write_removes_what_the_new_status_leaves_out_at_any_depth():
    old = {"phase": "Running", "progress": {"step": 3, "message": "replica died"}, "drift": 0.3}
    new = {"phase": "Running", "progress": {"step": 4}}
    assert kube.status_patch(old, new) == {"phase": "Running", "progress": {"step": 4, "message": None},
                                           "drift": None}
