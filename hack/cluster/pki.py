"""The cluster's certificates (a local CA made with openssl) and kubeconfig files. Stdlib only."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .config import API_SERVICE_IP, NODE_IP, NODE_NAME, ClusterError


def _openssl(*args: str, cwd: Path) -> None:
    out = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args[:2])} failed: {out.stderr.strip()}")


def make_pki(pki: Path, real_node: bool = False) -> None:
    """CA, apiserver serving cert (SANs 127.0.0.1, the node IP, the `kubernetes` Service IP
    and names), admin client cert, SA signing keys; with real_node also the kubelet's
    client and serving certs, kube-proxy's client cert and the apiserver's kubelet client."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "3650", "-subj", "/CN=rlscale-local-ca", cwd=pki)
    sans = (f"subjectAltName=IP:127.0.0.1,IP:{NODE_IP},IP:{API_SERVICE_IP},DNS:localhost,"
            "DNS:kubernetes,DNS:kubernetes.default,"
            "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local")
    # system:masters makes the admin cert cluster-admin without any RBAC binding.
    certs = [
        ("apiserver", "/CN=kube-apiserver", sans + "\nextendedKeyUsage=serverAuth"),
        ("admin", "/O=system:masters/CN=rlscale-admin", "extendedKeyUsage=clientAuth"),
    ]
    if real_node:
        certs += [
            # The Node authorizer and NodeRestriction know the kubelet by this name and group.
            ("kubelet", f"/O=system:nodes/CN=system:node:{NODE_NAME}", "extendedKeyUsage=clientAuth"),
            ("kubelet-serving", f"/CN={NODE_NAME}",
             f"subjectAltName=IP:{NODE_IP},DNS:{NODE_NAME}\nextendedKeyUsage=serverAuth"),
            # The default ClusterRoleBinding system:node-proxier names this user.
            ("kube-proxy", "/CN=system:kube-proxy", "extendedKeyUsage=clientAuth"),
            ("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client",
             "extendedKeyUsage=clientAuth"),
        ]
    for name, subj, ext in certs:
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                 f"{name}.csr", "-subj", subj, cwd=pki)
        (pki / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "3650", "-extfile",
                 f"{name}.ext", cwd=pki)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def write_kubeconfig(path: Path, server: str, ca: Path, *, cert: Path | None = None,
                     key: Path | None = None, token: str | None = None, namespace: str = "default") -> Path:
    """A kubeconfig for one user (client cert or bearer token). JSON is valid YAML."""
    user: dict = {"token": token} if token else {"client-certificate": str(cert), "client-key": str(key)}
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "rlscale",
        "clusters": [{"name": "rlscale", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "rlscale", "user": user}],
        "contexts": [{"name": "rlscale", "context": {"cluster": "rlscale", "user": "rlscale",
                                                     "namespace": namespace}}],
    }
    path.write_text(json.dumps(cfg, indent=2))
    path.chmod(0o600)
    return path
