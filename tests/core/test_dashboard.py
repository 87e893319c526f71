"""The Grafana dashboard asks only for series something exports: the run's driver, a rollout replica, the
operator. (tests/node/test_quickstart_k8s.py checks on the real node that every panel has data.)"""

from __future__ import annotations

import json
import re

from prometheus_client import generate_latest

from tests.conftest import ROOT

DASHBOARD = ROOT / "charts/rlscale/dashboards/rlscale.json"


def exported_names() -> set[str]:
    """Every sample name the three registries expose (histograms' _bucket/_sum/_count, counters' _total)."""
    from prometheus_client import REGISTRY

    from rlscale.operator import metrics as operator_metrics  # noqa: F401  (registers the operator's series)
    from rlscale.rollout.metrics import RolloutMetrics
    from rlscale.run_metrics import RunMetrics

    names: set[str] = set()
    for registry in (RunMetrics().registry, RolloutMetrics().registry, REGISTRY):
        for family in registry.collect():
            names.add(family.name)
            if family.type == "counter":  # a labelled counter has no sample before its first labels
                names.add(family.name + "_total")
            names.update(s.name for s in family.samples)
    run = RunMetrics()
    run.reward_term.labels(term="exact-match").set(1.0)  # a labelled gauge exposes a sample once set
    names.update(re.findall(r"^(rlscale_\w+)", generate_latest(run.registry).decode(), re.M))
    operator_metrics.record_status("ns", "r", {"phase": "Running", "progress": {"step": 1}})
    names.update(s.name for f in REGISTRY.collect() for s in f.samples)
    return names


def test_every_panel_asks_for_exported_series():
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    asked = {n for e in exprs for n in re.findall(r"\b(rlscale_\w+)", e)}
    assert asked - exported_names() == set()
    titles = " ".join(p["title"] for p in dash["panels"])
    for panel in ("planned", "Time to target", "Tokens per second", "Reward terms", "Rollout replicas"):
        assert panel in titles
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
