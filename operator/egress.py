"""Where a run's pods may connect to (the egress half of its NetworkPolicy, operator/builders.py).

Denied by default but for the run's own needs: the run's other pods (Ray, the ranks' collectives, the
weight transfer), DNS (port 53, wherever the cluster's resolver is: a node-local cache answers at a
link-local address), the Kubernetes API server (rank 0 reports progress on its RLRun), HTTPS anywhere for
a run that downloads its model (spec.model.download), and what the admin adds (the chart's
networkPolicy.egressCIDRs: an object store, a hub mirror). The API server is found at its endpoints (the
EndpointSlice `kubernetes` in namespace default, which the operator may read): a NetworkPolicy sees the
connection after the Service's address is translated to them. Where they cannot be read, its usual
ports (443, 6443) are allowed to any address."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

log = logging.getLogger("rlscale.operator")

API_SERVER_PORTS = (443, 6443)
HTTPS = 443
API_SERVER_TTL_S = 300.0  # how long the API server's endpoints are taken as read


def _cidr(ip: str) -> str:
    return f"{ip}/128" if ":" in ip else f"{ip}/32"


def endpoints(slice_: dict[str, Any] | None) -> tuple[tuple[str, int], ...]:
    """(address, port) of the API server from its EndpointSlice; () when there is none."""
    if not slice_:
        return ()
    ports = [int(p["port"]) for p in slice_.get("ports") or [] if p.get("port")]
    return tuple(sorted({(a, p) for ep in slice_.get("endpoints") or [] for a in ep.get("addresses") or []
                         for p in ports}))


def egress_rules(own: dict[str, Any], api_server: tuple[tuple[str, int], ...], cidrs: tuple[str, ...],
                 download: bool) -> list[dict[str, Any]]:
    """The NetworkPolicy's egress rules for a run whose own pods `own` selects."""
    rules: list[dict[str, Any]] = [
        {"to": [own]},
        {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
    ]
    if api_server:
        rules += [{"to": [{"ipBlock": {"cidr": _cidr(a)}}], "ports": [{"port": p, "protocol": "TCP"}]}
                  for a, p in api_server]
    else:
        rules.append({"ports": [{"port": p, "protocol": "TCP"} for p in API_SERVER_PORTS]})
    if download:
        rules.append({"ports": [{"port": HTTPS, "protocol": "TCP"}]})
    if cidrs:
        rules.append({"to": [{"ipBlock": {"cidr": c}} for c in cidrs]})
    return rules


class ApiServerEndpoints:
    """The API server's endpoints, read through `api` at most every API_SERVER_TTL_S of `clock`; () where
    they cannot be read."""

    def __init__(self, api: Any, clock: Callable[[], float]):
        self.api, self.clock = api, clock
        self._at: float | None = None
        self._found: tuple[tuple[str, int], ...] = ()

    def __call__(self) -> tuple[tuple[str, int], ...]:
        if self._at is None or self.clock() - self._at > API_SERVER_TTL_S:
            try:
                self._found = endpoints(self.api.get("discovery.k8s.io/v1", "EndpointSlice", "default", "kubernetes"))
            except ApiException as exc:
                log.warning("the API server's endpoints are unreadable (%s %s): runs may reach ports %s anywhere",
                            exc.status, exc.reason, API_SERVER_PORTS)
                self._found = ()
            self._at = self.clock()
        return self._found
