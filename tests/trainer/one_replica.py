"""What a test's rollout port needs beside generate when it stands for one replica that never scales:
weights are taken as published, the replica count is always one, and there are no engine metrics."""

from __future__ import annotations

from types import SimpleNamespace


class OneReplica:
    def publish_weights(self, version, weights):
        pass

    def scale(self, n):
        return None

    def serving(self):
        return SimpleNamespace(target=1, running=1, pods=())

    def generation_seconds_total(self):
        return None
