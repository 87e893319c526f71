"""Rollout: vLLM engine, Ray Serve deployment, in-place weight loading."""
