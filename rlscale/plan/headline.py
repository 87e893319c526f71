"""What a plan may show as its time to target: a time only where the samples-to-target under it was measured.

T = E / X: the throughput X comes from the profile (or the run's measured steps), but E, the samples to the
target, is only known for what was measured before (samples.KNOWN_SAMPLES_TO_TARGET, a spec's
target.expectedSamples). Elsewhere E is a placeholder that only ranks the candidates, so `rlscale plan`, the run's
report and the operator's ETA show the step time and throughput, and "unknown until calibrated" for the time.
Pure functions of the plan's dict form (Plan.to_dict, status.plan).
"""

from __future__ import annotations

from typing import Any

from rlscale.progress import fmt_duration

UNKNOWN = "unknown until calibrated"
# What turns a placeholder into a measurement, in the words a reader can act on.
HOW_TO_KNOW = ("samples to target not measured for this model, task and target: set spec.target.expectedSamples "
               "to an earlier run's (its summary.md) at optimizer.referenceBatch")


def samples_known(plan: dict[str, Any] | None) -> bool:
    """Whether the plan's samples-to-target rests on a measurement, not the placeholder."""
    return bool((plan or {}).get("samplesToTargetKnown"))


def known_samples_to_target(plan: dict[str, Any] | None) -> float | None:
    """The plan's predicted samples to target, None where it is the placeholder's."""
    value = ((plan or {}).get("predicted") or {}).get("samplesToTarget")
    return float(value) if samples_known(plan) and value is not None else None


def known_time_to_target(plan: dict[str, Any] | None) -> float | None:
    """The plan's predicted seconds to target, None where they rest on the placeholder."""
    value = ((plan or {}).get("predicted") or {}).get("timeToTargetSeconds")
    return float(value) if samples_known(plan) and value is not None else None


def time_to_target_text(plan: dict[str, Any]) -> str:
    """The plan's "time to target" line: the predicted time, or why there is none and how to get one."""
    seconds = known_time_to_target(plan)
    if seconds is not None:
        return fmt_duration(seconds)
    return f"{UNKNOWN} ({HOW_TO_KNOW})"


def relative(value: float, best: float) -> str:
    """A placeholder-based figure as a ratio to the chosen plan's ("x1.06"): what it is good for."""
    return f"x{value / best:.2f}" if best > 0 else "-"
