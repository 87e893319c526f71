"""The admin policy the operator tests run under: what the examples and the tests' runs use, allowed by name,
as a cluster admin would set the chart's `policy` values (the defaults allow none of it)."""

from __future__ import annotations

from rlscale.operator import settings as OS
from rlscale.operator.policy import Policy
from rlscale.operator.profiles import PlacementProfile, to_json

# A placement profile that pins a run to one of the test cluster's kwok nodes (hack/cluster/controlplane.py
# names them gpu-node-<i>) and tolerates the taint those nodes carry beside a real node: a node label key and
# a toleration key no allowlist below names (a profile is the admin's).
PINNED = PlacementProfile("pinned", node_selector={"kubernetes.io/hostname": "gpu-node-2"},
                          tolerations=({"key": "rlscale.dev/fake-node", "operator": "Exists",
                                        "effect": "PreferNoSchedule"},))
# The default run images' registry and the tests' own (reg.example/..., registry.example/...), the
# examples' model claim, the Coscheduling test's scheduler, the tool pods test's RuntimeClass.
ALLOWING = Policy(image_prefixes=("ghcr.io/rlscale", "reg.example", "registry.example"), claim_names=("models",),
                  scheduler_names=("coscheduler",), runtime_class_names=("gvisor",),
                  placement_profiles=(PINNED,))
SETTINGS = OS.OperatorSettings(policy=ALLOWING)


def policy_env(policy: Policy = ALLOWING) -> dict[str, str]:
    """The operator's environment for `policy`, as the chart's Deployment sets it from the values."""
    return {**{env: ",".join(getattr(policy, field)) for field, env in OS.POLICY_ENV.items()},
            OS.ENV_PLACEMENT_PROFILES: to_json(policy.placement_profiles),
            OS.ENV_REQUIRE_PLACEMENT_PROFILE: str(policy.require_placement_profile).lower()}
