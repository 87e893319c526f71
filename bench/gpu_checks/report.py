"""The report: a markdown table per check (measured, predicted, ratio, verdict), the same rows as JSON."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from gpu_checks.common import CHECKS, MISS_FACTOR, ROOT, failures


def num(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def markdown(s, env: dict, rows: list[dict], notes: list[str]) -> str:
    gate = (f"gated rows fail the run beyond {MISS_FACTOR:g}x either way" if s.gated
            else "CPU smoke: ratios shown, nothing gated")
    lines = [f"# gpu-check: {env['device_name']}", "",
             f"torch {env['torch']}, transformers {env['transformers']}, DeepSpeed {env['deepspeed']}, "
             f"CUDA {env['cuda']}, Python {env['python']}; planner profile {s.profile}, {s.dtype}; {gate}", ""]
    lines += [f"- {n}" for n in notes]
    for check in CHECKS:
        mine = [r for r in rows if r["check"] == check]
        if not mine:
            continue
        lines += ["", f"## {check}", "", "| item | metric | measured | predicted | ratio | verdict | note |",
                  "|---|---|---:|---:|---:|---|---|"]
        for r in mine:
            gated = "" if not r["gated"] or r["verdict"] not in ("ok", "MISS") else " (gated)"
            note = str(r["note"]).replace("|", "/").replace("\n", " ")
            lines.append(f"| {r['item']} | {r['metric']} | {num(r['measured'])} | {num(r['predicted'])} "
                         f"| {num(r['ratio'])} | {r['verdict']}{gated} | {note} |")
    bad = failures(rows)
    lines += ["", f"**{'FAILED' if bad else 'passed'}**: {len(bad)} failing row(s) of {len(rows)}"]
    return "\n".join(lines) + "\n"


def write(text: str, data: dict, out_dir: str | None) -> Path:
    """gpu-check.json and gpu-check.md in $OUT (or --out), else bench/out/."""
    folder = Path(out_dir) if out_dir else ROOT / "bench" / "out"
    folder.mkdir(parents=True, exist_ok=True)
    data = {**data, "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (folder / "gpu-check.json").write_text(json.dumps(data, indent=1, default=str))
    (folder / "gpu-check.md").write_text(text)
    return folder / "gpu-check.json"
