"""`rlscale sweep`: one run per (batch, lr rule, seed), and per (batch, seed) at each staleness above 0 (under
one rule), through the embedded runner, resumable; then the report.

State lives in runs/<name>-sweep/sweep.json; each run in runs/<name>-sweep/runs/<run>/ (its own
metrics.jsonl and checkpoints), so a sweep stopped with Ctrl-C resumes: finished runs are kept,
the interrupted one resumes from its checkpoint (or restarts when it has none).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rlscale.progress import fmt_lr
from rlscale.records import StepRecord, read_records
from rlscale.roles import RunEnd
from rlscale.spec import RLRUN_NAME_MAX, RLRUN_NAME_RE, SpecError, parse_rlrun
from rlscale.spec.algorithm import MAX_STALENESS
from rlscale.sweep.analysis import RunData
from rlscale.sweep.predict import predict, run_spec

console = Console()
RULES = ("sqrt", "linear", "none")
DONE_CODES = (RunEnd.TARGET, RunEnd.BUDGET)
STOP_AFTER_FAILURES = 2  # consecutive failed runs that stop the sweep (an environment problem, not a run's)


class SweepError(ValueError):
    """A flag or a stored sweep that cannot be used; the message names it, the value and the fix."""


@dataclass(frozen=True)
class Combo:
    prompts: int
    rule: str
    seed: int
    staleness: int = 0  # the run's plan is pinned to it, with algorithm.maxStaleness set to it

    def run_name(self, base: str) -> str:
        lag = f"-k{self.staleness}" if self.staleness else ""
        return f"{base}-p{self.prompts}-{self.rule}-s{self.seed}{lag}"


def parse_batches(text: str) -> list[int]:
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SweepError(f"--batches: {text!r} is not a comma-separated list of integers; e.g. 8,16,32,64") from None
    if not out or out[0] <= 0:
        raise SweepError(f"--batches: {text!r} needs positive prompts per step; e.g. 8,16,32,64")
    return out


def parse_rules(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in out if x not in RULES]
    if not out or bad:
        raise SweepError(f"--lr-rules: {text!r} has {bad or 'no rules'}; use a comma-separated subset of "
                         f"{','.join(RULES)}")
    return list(dict.fromkeys(out))


def parse_staleness(text: str) -> list[int]:
    """--staleness: steps of staleness to sweep; 0 (the synchronous runs every comparison is against)
    is always in."""
    try:
        out = sorted({0} | {int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SweepError(f"--staleness: {text!r} is not a comma-separated list of integers; e.g. 0,1,2") from None
    if out[0] < 0 or out[-1] > MAX_STALENESS:
        raise SweepError(f"--staleness: {text!r} needs values from 0 to {MAX_STALENESS} "
                         "(algorithm.maxStaleness's range); e.g. 0,1,2")
    return out


def staleness_rule(spec: Any, rules: list[str]) -> str:
    """The rule the staleness runs use: the spec's when swept, else sqrt, else the first (the rule the
    report checks the planner's choice under)."""
    for r in (spec.optimizer.scaling, "sqrt"):
        if r in rules:
            return r
    return rules[0]


def eval_every_samples(batches: list[int], spp: int, wanted: int) -> int:
    """Eval spacing in samples: `wanted` rounded up to a multiple of every swept batch (so all evaluate alike)."""
    lcm = math.lcm(*(b * spp for b in batches))
    return max(1, math.ceil(wanted / lcm)) * lcm


def settings(rlrun: Any, batches: list[int], rules: list[str], seeds: int, samples: int, eval_samples: int,
             staleness: list[int] | None = None) -> dict:
    return {"spec": rlrun.to_dict(), "batches": batches, "rules": rules, "seeds": seeds, "samples": samples,
            "evalSamples": eval_samples, "staleness": staleness or [0]}


def combos(batches: list[int], rules: list[str], seeds: int, staleness: list[int] | None = None,
           stale_rule: str | None = None) -> list[Combo]:
    """Seed 0 of every (rule, batch) first, so a sweep cut short still covers every batch; each staleness
    above 0 runs every batch and seed under `stale_rule` (default the first rule), after its seed's others."""
    lags = [k for k in (staleness or []) if k > 0]
    rule = stale_rule or rules[0]
    return [c for s in range(seeds) for c in [Combo(p, r, s) for r in rules for p in batches]
            + [Combo(p, rule, s, k) for k in lags for p in batches]]


def run_sources(spec: Any, cs: list[Combo]) -> dict[Combo, Combo]:
    """Each combination's run: the first combination with the same batch, seed and learning rate.
    At the reference batch every rule gives the spec's own lr, so the runs would be the same run
    (the rule changes nothing else); one run serves them all (4 batches x 2 rules x 2 seeds: 14 runs)."""
    first: dict[tuple, Combo] = {}
    lrs = {(c.prompts, c.rule): f"{predict(spec, c.prompts, c.rule).lr:.12e}" for c in cs}
    return {c: first.setdefault((c.prompts, c.seed, lrs[(c.prompts, c.rule)], c.staleness), c) for c in cs}


def run_rlrun(rlrun: Any, combo: Combo, samples: int, eval_samples: int) -> Any:
    """The RLRun of one sweep run: fixed prompts, the rule, the sample budget, evals every eval_samples."""
    d = rlrun.to_dict()
    s = run_spec(rlrun.spec, combo.prompts, combo.rule, samples, combo.staleness)
    spec = s.model_dump(by_alias=True, exclude_none=True, mode="json")
    spec["target"]["evalEvery"] = max(1, eval_samples // (combo.prompts * s.batch.samples_per_prompt))
    d["spec"] = spec
    d["metadata"] = {**d["metadata"], "name": combo.run_name(rlrun.name)}
    try:
        return parse_rlrun(d)
    except SpecError as exc:
        raise SweepError(f"the run {combo.run_name(rlrun.name)} is not a valid RLRun: "
                         + "; ".join(map(str, exc.errors))) from None


def check_names(name: str, batches: list[int], rules: list[str], seeds: int, staleness: int = 0) -> None:
    longest = Combo(max(batches), max(rules, key=len), seeds - 1, staleness).run_name(name)
    if len(longest) > RLRUN_NAME_MAX or not re.match(RLRUN_NAME_RE, longest):
        raise SweepError(f"metadata.name: {name!r} makes run names like {longest!r}, longer than {RLRUN_NAME_MAX} "
                         "characters; shorten the RLRun's name")


class SweepState:
    """sweep.json: the settings and each run's status, rewritten atomically after every change."""

    def __init__(self, path: Path, data: dict):
        self.path, self.data = path, data

    @classmethod
    def open(cls, sweep_dir: Path, wanted: dict, fresh: bool) -> SweepState:
        path = sweep_dir / "sweep.json"
        if fresh and sweep_dir.exists():
            import shutil

            shutil.rmtree(sweep_dir)
        if path.exists():
            data = json.loads(path.read_text())
            for key, flag in (("batches", "--batches"), ("rules", "--lr-rules"), ("seeds", "--seeds"),
                              ("samples", "--samples"), ("evalSamples", "--eval-samples"), ("staleness", "--staleness"),
                              ("spec", "FILE")):
                # a sweep stored before --staleness existed ran the synchronous loop only
                stored = data["settings"].get(key, [0] if key == "staleness" else None)
                if stored != wanted[key]:
                    shown = "the spec" if key == "spec" else repr(wanted[key])
                    raise SweepError(f"{flag}: {shown} differs from the sweep stored in {sweep_dir} "
                                     f"({'another spec' if key == 'spec' else repr(stored)}); "
                                     "pass the same flags to resume, or --fresh to start over")
            return cls(path, data)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        st = cls(path, {"settings": wanted, "runs": {}})
        st.save()
        return st

    def save(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2))
        os.replace(tmp, self.path)

    def run(self, name: str) -> dict:
        return self.data["runs"].setdefault(name, {"status": "pending"})

    def done(self, name: str) -> bool:
        return self.data["runs"].get(name, {}).get("status") == "done"


def load_runs(sweep_dir: Path, rlrun: Any, state: dict) -> list[RunData]:
    """Every run of the sweep that recorded steps, as RunData (with the planner's prediction for its spec)."""
    st = state["settings"]
    out = []
    cs = combos(st["batches"], st["rules"], st["seeds"], st.get("staleness"), staleness_rule(rlrun.spec, st["rules"]))
    for c, src in run_sources(rlrun.spec, cs).items():
        name = src.run_name(rlrun.name)
        recs = read_records(sweep_dir / "runs" / name / "metrics.jsonl")
        if not recs:
            continue
        info = state["runs"].get(name, {})
        pred = predict(rlrun.spec, c.prompts, c.rule, staleness=c.staleness)
        out.append(RunData(c.prompts, rlrun.spec.batch.samples_per_prompt, c.rule, c.seed, pred.lr, recs,
                           metric=rlrun.spec.target.metric, window=rlrun.spec.target.window,
                           startup_seconds=info.get("startupSeconds"),
                           predicted={"samplesPerSecond": pred.samples_per_second}, source=name,
                           staleness=c.staleness))
    return out


def check_placement(spec: Any) -> None:
    """The sweep's runs share one rollout app on Ray nodes of their own; colocated engines live on each
    run's learners, which end with the run."""
    from rlscale.plan import make_plan

    if spec.placement == "colocated" or make_plan(spec).placement == "colocated":
        raise SweepError(f"spec.placement: {spec.placement} plans colocated engines, but the sweep keeps one rollout "
                         "app on nodes of its own across its runs; set placement: disaggregated for the sweep")


def run_sweep(rlrun: Any, sweep_dir: Path, batches: list[int], rules: list[str], seeds: int, samples: int,
              eval_samples: int, fresh: bool = False, staleness: list[int] | None = None) -> tuple[int, int]:
    """Run every combination not yet done; returns (finished runs, exit code: 0 done, 130 interrupted, 1 failed).

    The runs share one set of Ray nodes and one rollout app (rlscale.embedded.SharedNodes): each
    run starts its own learners, which replace the replicas' weights with the run's starting ones.
    `staleness`: the values swept (0 always in), each run's plan pinned to its own."""
    from rlscale.embedded import SharedNodes

    lags = staleness or [0]
    check_names(rlrun.name, batches, rules, seeds, max(lags))
    check_placement(rlrun.spec)
    state = SweepState.open(sweep_dir, settings(rlrun, batches, rules, seeds, samples, eval_samples, lags), fresh)
    cs = combos(batches, rules, seeds, lags, staleness_rule(rlrun.spec, rules))
    todo = list(dict.fromkeys(run_sources(rlrun.spec, cs).values()))
    overall = Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("runs"),
                       TextColumn("{task.fields[samples]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                       console=console)
    finished = sum(state.done(c.run_name(rlrun.name)) for c in todo)
    bar = overall.add_task("sweep", total=len(todo), completed=finished, samples="")
    console.print(f"sweep of {len(todo)} runs into {sweep_dir} ({finished} already done); up to {samples:,} samples "
                  f"each, evals every {eval_samples:,} samples", highlight=False)
    shared = SharedNodes(sweep_dir / "nodes", app=f"rollout-{rlrun.name}-sweep")
    try:
        return _run_all(rlrun, sweep_dir, todo, state, overall, bar, finished, samples, eval_samples, shared)
    finally:
        shared.stop()


def _run_all(rlrun: Any, sweep_dir: Path, todo: list[Combo], state: SweepState, overall: Progress, bar: Any,
             finished: int, samples: int, eval_samples: int, shared: Any) -> tuple[int, int]:
    from rlscale.embedded import run_embedded

    total_samples = len(todo) * samples
    failures = 0
    for i, c in enumerate(todo, 1):
        name = c.run_name(rlrun.name)
        if state.done(name):
            continue
        run = run_rlrun(rlrun, c, samples, eval_samples)
        info = state.run(name)
        info.update(status="running", prompts=c.prompts, rule=c.rule, seed=c.seed, staleness=c.staleness,
                    starts=info.get("starts", 0) + 1)
        state.save()
        t0 = time.monotonic()
        seen: dict[str, float] = {}
        done_before = sum(int(state.data["runs"].get(x.run_name(rlrun.name), {}).get("samples", 0)) for x in todo)

        def render(rec: StepRecord | None, i=i, name=name, run=run, t0=t0, seen=seen,
                   done_before=done_before) -> Group:
            if rec is not None and "first" not in seen:
                seen["first"] = time.monotonic() - t0 - rec.step_seconds
            now = rec.samples if rec else 0
            overall.update(bar, samples=f"{(done_before + now) / 1000:,.0f}k of {total_samples / 1000:,.0f}k samples")
            return Group(overall, current_line(i, len(todo), name, run, rec, samples))

        try:
            # the run's plan is made at the combination's staleness (its prediction and reason too)
            code = run_embedded(run, metrics_port=0, runs_dir=sweep_dir / "runs", fresh=False,
                                seed=c.seed, replan=False, render=render, shared=shared, staleness=c.staleness)
        except KeyboardInterrupt:  # Ctrl-C before the run's processes started
            code = RunEnd.INTERRUPTED
        except Exception as exc:  # a role that never came up: this run failed, the sweep goes on
            console.print(f"[red]{name}: {exc}[/]", highlight=False)
            code = 1
        if code not in DONE_CODES:
            shared.stop()  # the next run (or the resumed sweep) starts from fresh nodes
        recs = read_records(sweep_dir / "runs" / name / "metrics.jsonl")
        info.update(exitCode=code, wallSeconds=round(time.monotonic() - t0, 1), samples=recs[-1].samples if recs else 0)
        if "first" in seen:
            info["startupSeconds"] = round(seen["first"], 1)
        if code in DONE_CODES:
            info["status"] = "done"
            finished += 1
            failures = 0
            overall.update(bar, completed=finished)
        elif code == RunEnd.INTERRUPTED or code < 0:  # Ctrl-C (twice: the driver was killed); its checkpoint is kept
            info["status"] = "interrupted"
            state.save()
            console.print(f"[yellow]sweep stopped at {name}[/]; run the same command again to resume "
                          f"({finished} of {len(todo)} runs done)", highlight=False)
            return finished, RunEnd.INTERRUPTED
        else:
            info["status"] = "failed"
            failures += 1
            console.print(f"[red]{name} failed (exit {code})[/]; see {sweep_dir / 'runs' / name / 'logs'}",
                          highlight=False)
        state.save()
        if failures >= STOP_AFTER_FAILURES:
            console.print(f"[red]{failures} runs in a row failed: stopping the sweep[/]")
            return finished, 1
    return finished, 0 if finished == len(todo) else 1


def current_line(i: int, n: int, name: str, run: Any, rec: StepRecord | None, samples: int) -> str:
    s = run.spec
    lag = getattr(s.algorithm, "max_staleness", 0)
    head = f"run {i}/{n} [bold]{name}[/]: {s.batch.prompts}x{s.batch.samples_per_prompt}" + (
        f" at staleness {lag}" if lag else "")
    if rec is None:
        return head + " — starting (Ray head, rollout, learner, first eval)..."
    tm = rec.target_metric
    return (f"{head}, lr {fmt_lr(rec.lr)} — step {rec.step}, {rec.samples:,}/{samples:,} samples, "
            f"{s.target.metric} {'-' if tm is None else format(tm, '.3f')}, {rec.samples_per_second:.0f} samples/s")


def write_sweep_report(rlrun: Any, sweep_dir: Path, calibration_out: Path | None = None) -> tuple[Path, Any]:
    """sweep.md, curves.png, throughput.png and decision.png in sweep_dir (and the patch, when asked)."""
    from rlscale.sweep.report import analyse, markdown, run_rows

    path = sweep_dir / "sweep.json"
    if not path.exists():
        raise SweepError(f"{sweep_dir}: has no sweep.json; run `rlscale sweep FILE` first")
    state = json.loads(path.read_text())
    runs = load_runs(sweep_dir, rlrun, state)
    if not runs:
        raise SweepError(f"{sweep_dir}: no run recorded a step yet; run `rlscale sweep FILE` to run them")
    res = analyse(rlrun.name, rlrun.spec, runs)
    out = sweep_dir / "sweep.md"
    text = markdown(res)
    failed = sorted(n for n, i in state["runs"].items() if i.get("status") != "done")
    if failed:
        text += "\n## Runs not finished\n\n" + "\n".join(f"- {n}: {state['runs'][n].get('status')}" for n in failed)
    out.write_text(text + "\n", encoding="utf-8")
    (sweep_dir / "runs.json").write_text(json.dumps({"level": res.level, "runs": run_rows(res)}, indent=2))
    try:
        from rlscale.sweep.plots import write_plots

        write_plots(res, sweep_dir)
    except ImportError as exc:  # matplotlib comes with the train extra
        console.print(f"[yellow]no plots[/] ({exc}); pip install matplotlib")
    if calibration_out is not None:
        from rlscale.sweep.patch import write_patch

        write_patch(res, calibration_out, str(sweep_dir))
    return out, res
