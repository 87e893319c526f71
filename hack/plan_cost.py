"""How long one plan takes at a given maxReplicas: `python hack/plan_cost.py 64 [MAX_PROMPTS]`.

Takes examples/grpo-h100.yaml, sets both roles' maxReplicas to N and budget.gpus to 2N (so every
pair is feasible; set after validation, so counts above the spec's bounds work too), optionally
widens [minPrompts, maxPrompts] to [1, MAX_PROMPTS], and prints the time of make_plan and the
process's peak RSS (docs/measurements.md, "The planner's bounds")."""

import resource
import sys
import time
from pathlib import Path

import yaml

from rlscale.plan import make_plan
from rlscale.spec import parse_rlrun

doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples/grpo-h100.yaml").read_text())
n = int(sys.argv[1])
if len(sys.argv) > 2:
    doc["spec"]["batch"].update(minPrompts=1, maxPrompts=int(sys.argv[2]))
spec = parse_rlrun(doc).spec
# Set after validation, so that counts above the spec's bounds can be measured too.
spec.rollout.max_replicas = spec.learner.max_replicas = n
spec.budget.gpus = 2 * n
t = time.perf_counter()
make_plan(spec)
dt = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"maxReplicas={n} maxPrompts={spec.batch.max_prompts} minPrompts={spec.batch.min_prompts}: "
      f"plan {dt:.3f} s, peak RSS {rss:.0f} MiB")
