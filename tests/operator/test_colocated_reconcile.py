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

IMAGE = "registry.example/rlscale/colocated:1"  # an image of the run's own with DeepSpeed and vLLM


def test_a_colocated_run_with_the_default_images_runs_the_chart_trainer_image(fake, ctl):  # noqa: F811
    """The default trainer image carries vLLM as well as DeepSpeed (images/torch, images/trainer), so a
    colocated run that names no image is not refused: its learner pods run the chart's trainer image."""
    create(fake, placement="colocated", budget={"gpus": 8})
    ctl.reconcile(NS, RUN, "create")
    assert Plan.from_dict(rlrun(fake)["status"]["plan"]).placement == "colocated"
    assert cond(fake, C.COND_FAILED).get("status") != "True", cond(fake, C.COND_FAILED)
    sts = workload(fake, C.ROLE_LEARNER)
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == C.DEFAULT_TRAINER_IMAGE
    assert workload(fake, C.ROLE_ROLLOUT) is None


def test_a_run_an_earlier_operator_refused_for_its_colocated_image_is_taken_up_again(fake, ctl):  # noqa: F811
    """Operators before the trainer image had vLLM failed such a run with ColocatedNeedsImage; that
    reason is still a cluster refusal, so after the upgrade the run clears and starts."""
    create(fake, placement="colocated", budget={"gpus": 8})
    fake.patch(RLRUN_API, C.RLRUN_KIND, NS, RUN, {"status": {"conditions": [
        {"type": C.COND_FAILED, "status": "True", "reason": G.COLOCATED_IMAGE,
         "message": "the default learner image has no vLLM", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    ctl.reconcile(NS, RUN, "update")
    assert cond(fake, C.COND_FAILED)["status"] == "False"
    assert workload(fake, C.ROLE_LEARNER)["spec"]["template"]["spec"]["containers"][0]["image"] \
        == C.DEFAULT_TRAINER_IMAGE


def test_a_colocated_run_keeps_the_learner_image_its_spec_names(fake, ctl):  # noqa: F811
    create(fake, placement="colocated", budget={"gpus": 8}, learner={"image": IMAGE})
    ctl.reconcile(NS, RUN, "create")
    assert cond(fake, C.COND_FAILED).get("status") != "True"
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
