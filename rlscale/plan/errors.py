"""The planner's one error type."""


class PlanError(ValueError):
    """A plan that cannot be made; the message names the field, the value and the fix."""
