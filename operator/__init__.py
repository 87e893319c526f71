"""Kubernetes operator (kopf) for RLRun, imported as `rlscale.operator`."""
