"""The admin policy the operator tests run under: what the examples and the tests' runs use, allowed by name,
as a cluster admin would set the chart's `policy` values (the defaults allow none of it)."""

from __future__ import annotations

from rlscale.operator import settings as OS
from rlscale.operator.policy import Policy

# The default run images' registry and the tests' own (reg.example/..., registry.example/...), the
# examples' model claim, the Coscheduling test's scheduler, the tool pods test's RuntimeClass.
ALLOWING = Policy(image_prefixes=("ghcr.io/rlscale", "reg.example", "registry.example"), claim_names=("models",),
                  scheduler_names=("coscheduler",), runtime_class_names=("gvisor",))
SETTINGS = OS.OperatorSettings(policy=ALLOWING)


def policy_env(policy: Policy = ALLOWING) -> dict[str, str]:
    """The operator's environment for `policy`, as the chart's Deployment sets it from the values."""
    return {env: ",".join(getattr(policy, field)) for field, env in OS.POLICY_ENV.items()}
