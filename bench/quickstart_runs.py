"""What the quickstart benches share (placement.py, staleness.py): run the quickstart with changes to its
spec through `rlscale run`, and summarise its step records."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def quickstart_spec(name: str, change: Callable[[dict], None]) -> dict:
    """The quickstart RLRun named `name`, its spec changed by `change`."""
    spec = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    spec["metadata"] = {"name": name}
    change(spec["spec"])
    return spec


def planned(work: Path, name: str, change: Callable[[dict], None]) -> dict:
    """`rlscale plan --json` of the quickstart changed by `change`: what the planner would choose."""
    f = work / f"{name}.plan.yaml"
    f.write_text(yaml.safe_dump(quickstart_spec(name, change)))
    got = subprocess.run([sys.executable, "-m", "rlscale.cli", "plan", str(f), "--json"], cwd=REPO,
                         capture_output=True, text=True)
    if got.returncode != 0:
        sys.exit(f"rlscale plan {f} exited {got.returncode}:\n{got.stderr[-3000:]}")
    return json.loads(got.stdout)


def run_quickstart(work: Path, name: str, change: Callable[[dict], None], steps: int, to_target: bool,
                   args: tuple[str, ...] = ()) -> list[dict]:
    """The quickstart named `name`, its spec changed by `change`, `steps` steps with the target out of
    reach (or to the target); its step records. A failed run ends the bench with its log."""
    spec = quickstart_spec(name, change)
    if not to_target:
        spec["spec"]["target"]["value"] = 0.999
        spec["spec"]["budget"]["maxSteps"] = steps
    f = work / f"{name}.yaml"
    f.write_text(yaml.safe_dump(spec))
    log = work / f"{name}.log"
    cmd = [sys.executable, "-m", "rlscale.cli", "run", str(f), "--runs-dir", str(work / "runs"), "--metrics-port",
           "0", *args]
    with open(log, "wb") as out:
        rc = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT).returncode
    records = work / "runs" / name / "metrics.jsonl"
    if rc not in (0, 3) or not records.is_file():  # 3: the step budget's end
        sys.exit(f"{name}: rlscale run exited {rc}; see {log}:\n{log.read_text()[-3000:]}")
    return [json.loads(line) for line in records.read_text().splitlines() if line.strip()]


def summary(recs: list[dict]) -> dict:
    """Medians over the second half of the steps, and samples- and time-to-target when reached."""
    late = recs[len(recs) // 2:]
    med = lambda key: statistics.median(r[key] for r in late)  # noqa: E731
    phase = lambda name: statistics.median(r["phases"].get(name, 0.0) for r in late)  # noqa: E731
    reached = [r for r in recs if r.get("samples_to_target") is not None]
    pred = [r["predicted_step_seconds"] for r in late if r.get("predicted_step_seconds")]  # the plan's step
    return {"samples_per_second": med("samples_per_second"), "step_seconds": med("step_seconds"),
            "predicted_step_seconds": statistics.median(pred) if pred else None,
            "generate_seconds": phase("generate"), "train_seconds": phase("train"), "sync_seconds": phase("sync"),
            "wait_seconds": phase("wait"), "steps": len(recs),
            "samples_to_target": reached[0]["samples_to_target"] if reached else None,
            "time_to_target_seconds": reached[0]["time_to_target_seconds"] if reached else None}
