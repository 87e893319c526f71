"""A colocated run through the controller (fake API server): the engines live on the learner pods, so
there is no rollout Deployment to scale or wait for; RolloutReady follows what the driver reports
serving; a run moved from disaggregated to colocated takes its rollout Deployment to zero."""

from __future__ import annotations

from rlscale.operator import builders as B
from rlscale.operator import constants as C
from rlscale.operator import guard as G
from rlscale.plan import Plan
from tests.operator.test_reconcile import (  # noqa: F401  (fixtures)
    NS,
    RLRUN_API,
    RUN,
    become_ready,
    cond,
    create,
    ctl,
    fake,
    report,
    rlrun,
    workload,
)

IMAGE = "registry.example/rlscale/colocated:1"  # an image with DeepSpeed and vLLM

def test_a_colocated_run_without_an_image_for_both_is_refused_until_the_spec_names_one(fake, ctl):  # noqa: F811
    create(fake, placement="colocated", budget={"gpus": 8})
    ctl.reconcile(NS, RUN, "create")
    failed = cond(fake, C.COND_FAILED)
    assert failed["status"] == "True" and failed["reason"] == G.COLOCATED_IMAGE
    assert "spec.learner.image" in failed["message"]
    assert workload(fake, C.ROLE_LEARNER) is None
    fake.patch(RLRUN_API, C.RLRUN_KIND, NS, RUN, {"spec": {"learner": {"image": IMAGE}}})
    ctl.reconcile(NS, RUN, "update")
    assert cond(fake, C.COND_FAILED)["status"] == "False"
    assert workload(fake, C.ROLE_LEARNER)["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE


def test_a_colocated_run_has_no_rollout_deployment_and_is_ready_once_its_engines_serve(fake, ctl):  # noqa: F811
    create(fake, placement="colocated", budget={"gpus": 8}, learner={"image": IMAGE})
    ctl.reconcile(NS, RUN, "create")
    plan = Plan.from_dict(rlrun(fake)["status"]["plan"])
    assert plan.placement == "colocated" and plan.rollout_replicas == plan.learner_replicas
    assert workload(fake, C.ROLE_ROLLOUT) is None
    sts = workload(fake, C.ROLE_LEARNER)
    env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert '"rollout"' in env["RLSCALE_RAY_RESOURCES"]
    become_ready(fake)
    ctl.reconcile(NS, RUN, "learner")
    st = rlrun(fake)["status"]
    assert st["replicas"][C.ROLE_ROLLOUT] == {"desired": plan.rollout_replicas, "ready": 0}
    assert cond(fake, "RolloutReady")["status"] == "False"
    report(fake, step=1, samples=plan.batch, rollout_target=plan.rollout_replicas,
           rollout_serving=plan.rollout_replicas, rollout_pods=[])
    ctl.reconcile(NS, RUN, "progress")
    st = rlrun(fake)["status"]
    assert st["replicas"][C.ROLE_ROLLOUT]["ready"] == plan.rollout_replicas
    assert cond(fake, "RolloutReady")["status"] == "True" and st["phase"] == C.PHASE_RUNNING
    # Nothing is out of step: a progress pass applies nothing.
    generation = workload(fake, C.ROLE_LEARNER)["metadata"]["generation"]
    ctl.reconcile(NS, RUN, "progress")
    assert workload(fake, C.ROLE_LEARNER)["metadata"]["generation"] == generation


def test_a_run_moved_to_colocated_takes_its_rollout_deployment_to_zero(fake, ctl):  # noqa: F811
    create(fake, placement="disaggregated", budget={"gpus": 8})
    ctl.reconcile(NS, RUN, "create")
    assert workload(fake, C.ROLE_ROLLOUT)["spec"]["replicas"] > 0
    fake.patch(RLRUN_API, C.RLRUN_KIND, NS, RUN, {"spec": {"placement": "colocated", "learner": {"image": IMAGE}}})
    ctl.reconcile(NS, RUN, "update")
    assert Plan.from_dict(rlrun(fake)["status"]["plan"]).placement == "colocated"
    assert workload(fake, C.ROLE_ROLLOUT)["spec"]["replicas"] == 0
    assert B.colocated(Plan.from_dict(rlrun(fake)["status"]["plan"]))
