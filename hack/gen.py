"""Regenerate what is generated from the spec: the CRD and the README's spec table."""

import sys
from pathlib import Path

root = Path(__file__).resolve().parents[1]
# This checkout's rlscale, not the one the venv has installed (a worktree shares another's venv).
sys.path.insert(0, str(root))

from rlscale.crd import crd_yaml, spec_reference_markdown  # noqa: E402

(root / "charts/rlscale/crds/rlruns.rlscale.dev.yaml").write_text(crd_yaml())
readme = root / "README.md"
text = readme.read_text()
start, end = "<!-- spec-reference:start -->\n", "<!-- spec-reference:end -->"
head, rest = text.split(start, 1)
readme.write_text(head + start + spec_reference_markdown() + end + rest.split(end, 1)[1])
print("regenerated the CRD and README's spec table")
