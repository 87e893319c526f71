"""The `rlscale` command line: validate, plan, crd, run, and the role entrypoints (hidden from --help)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from rlscale.metrics_names import DEFAULT_METRICS_PORT, OPERATOR_METRICS_PORT
from rlscale.progress import fmt_duration, fmt_lr
from rlscale.spec import SpecError, load_rlrun
from rlscale.spec.tools import TOOL_SERVER_PORT

app = typer.Typer(
    name="rlscale",
    help="GRPO and PPO for LLMs, with the batch size, learning rate and rollout/learner split planned "
    "from the batch-size theory.\n\nThe pods' entrypoints (ray-head, rollout, learner, prepare-model, "
    "tool-server, operator) are commands too, left out of this list.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

# The default sweep: 14 runs of 24,576 samples, 38 min on 2 quiet cores (docs/measurements.md, "The default sweep").
DEFAULT_SWEEP_SAMPLES = 24576
DEFAULT_SWEEP_EVAL_SAMPLES = 2048
FileArg = typer.Argument(..., help="An RLRun YAML file.", show_default=False)
ConfigOpt = typer.Option(None, "--config", "-c", help="The resolved run config (default: $RLSCALE_CONFIG).")


def _fail(lines: list[str] | str, code: int = 1) -> None:
    for line in [lines] if isinstance(lines, str) else lines:
        err.print(f"[bold red]error:[/] {line}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _load(path: Path):
    try:
        rlrun = load_rlrun(path)
    except SpecError as exc:
        _fail([str(e) for e in exc.errors])
    _local_paths(rlrun, path)
    return rlrun


def _local_paths(rlrun, path: Path) -> None:
    if rlrun.spec.task.dataset:
        from rlscale.trainer.data import resolve_dataset_path

        resolve_dataset_path(rlrun.spec, path)


def _workload_errors(rlrun) -> list:
    """The dataset's rows and the reward (import, a finite float on a few rows): what the spec alone cannot tell."""
    from rlscale.trainer.data import check_workload

    return check_workload(rlrun.spec)


def _plan(rlrun, calibration=None, host_cores: int = 0):
    from rlscale.plan import PlanError, make_plan

    try:
        return make_plan(rlrun.spec, calibration, host_cores=host_cores)
    except PlanError as exc:
        _fail(str(exc))


@app.command()
def validate(files: list[Path] = typer.Argument(..., help="RLRun YAML files.", show_default=False)) -> None:
    """Check RLRun files, their dataset rows and their reward; exit 1 naming each bad field, its value and the fix."""
    bad = 0
    for f in files:
        try:
            r = load_rlrun(f)
            _local_paths(r, f)
            errors = _workload_errors(r)
        except SpecError as exc:
            errors = exc.errors
        if errors:
            bad += 1
            for e in errors:
                # An error about the file itself (not YAML, not there) already starts with its name.
                where = "" if getattr(e, "path", None) == str(f) else f"{f}: "
                err.print(f"[bold red]error:[/] {where}{e}", highlight=False, soft_wrap=True)
            continue
        s = r.spec
        from rlscale.trainer.data import dataset_on_cluster, plugins_on_cluster

        note = (f"; {s.task.dataset} is on the pods' volume: its rows are checked when the run starts"
                if dataset_on_cluster(s) else "")
        if plugins_on_cluster(s):
            note += f"; the plug-in in {s.task.reward!r} comes from task.pluginVolume: it is tried when the run starts"
        out.print(f"[green]ok[/] {f}: RLRun {r.name} ({s.algorithm.name}, {s.model.path}, "
                  f"{s.hardware.accelerator}){note}",
                  highlight=False, soft_wrap=True)
        if s.scheduling.placement_profile:  # the cluster's profiles are the admin's chart values, not in the file
            out.print(f"   spec.scheduling.placementProfile {s.scheduling.placement_profile!r}: syntax checked only; "
                      "the operator checks it against the cluster's profiles (the chart value "
                      "policy.placementProfiles) and ends the run Invalid if the cluster does not define it",
                      highlight=False, soft_wrap=True, markup=False)
        lr_line = effective_lr_note(s)
        if lr_line:
            out.print(f"   {lr_line}", highlight=False, soft_wrap=True, markup=False)
        if s.optimizer.lr_schedule != "constant":  # a TRL user's lr_scheduler_type, said back
            o = s.optimizer
            out.print(f"   lr schedule {o.lr_schedule}: the planned lr after {o.warmup_steps} warm-up steps, down to 0 "
                      f"at learner step {o.decay_steps or s.budget.max_steps}"
                      f"{'' if o.decay_steps else ' (budget.maxSteps)'}", highlight=False, soft_wrap=True, markup=False)
    raise typer.Exit(1 if bad else 0)


def effective_lr_note(spec) -> str:
    """What lr the run trains with, when optimizer.scaling moves it off the lr written (else ""): a TRL user's
    lr at another batch is rescaled, and should be told so before the run starts."""
    from rlscale.plan.samples import scaled_lr

    opt = spec.optimizer
    if opt.scaling == "none":
        return ""
    n = spec.batch.fixed_samples()
    if n is None:
        return (f"lr {fmt_lr(opt.lr)} is for optimizer.referenceBatch {opt.reference_batch} samples; the planned "
                f"batch trains at it scaled by the {opt.scaling} rule (`rlscale plan` shows the lr)")
    if n == opt.reference_batch:
        return ""
    return (f"lr {fmt_lr(opt.lr)} at optimizer.referenceBatch {opt.reference_batch} trains at "
            f"{fmt_lr(scaled_lr(opt.lr, n, opt.reference_batch, opt.scaling))} on this spec's {n} samples per "
            f"step ({opt.scaling} rule; set referenceBatch: {n} or scaling: none to keep lr as written)")


@app.command()
def plan(file: Path = FileArg, as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
         calibration: Path | None = typer.Option(
             None, "--calibration",
             help="A calibration patch from `rlscale sweep --write-calibration`: its spec: fragment (the fitted "
             "optimizer.noiseScale) is merged over FILE's spec, and its calibration: phases scale the throughput "
             "model, as measured steps would.", show_default=False),
         cores: int | None = typer.Option(
             None, "--cores", min=0,
             help="A cpu spec: the cores `rlscale run` splits between the rollout and the learner when it "
             "generates ahead, each phase predicted on its share (default: this machine's); 0: each role has "
             "cores of its own, as the operator's pods do.", show_default=False)) -> None:
    """Plan the batch, learning rate and replicas, and show the candidates compared."""
    rlrun = _load(file)
    if cores is None:
        from rlscale.cpu_split import available_cpus

        cores = len(available_cpus())
    cal = None
    if calibration is not None:
        from rlscale.sweep.patch import apply_patch, load_patch

        try:
            rlrun, cal = apply_patch(rlrun, load_patch(calibration), calibration)
        except SpecError as exc:
            _fail([str(e) for e in exc.errors])
    p = _plan(rlrun, cal, cores)
    d = p.to_dict()
    if as_json:
        sys.stdout.write(json.dumps(d, indent=2) + "\n")
        return
    out.print(_plan_table(rlrun, d))
    cands = d.get("candidates") or []
    if cands:
        out.print(_candidates_table(cands[:12], d))


def _plan_table(rlrun, d: dict) -> Table:
    """The chosen plan, with the notes that say which of its numbers are assumed, not measured."""
    from rlscale.plan.headline import time_to_target_text

    pred, opt = d["predicted"], rlrun.spec.optimizer
    t = Table(title=f"Plan for RLRun {rlrun.name}", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("batch", f"{d['prompts']} prompts x {d['samplesPerPrompt']} samples = "
              f"{d['prompts'] * d['samplesPerPrompt']}")
    t.add_row("learning rate", f"{fmt_lr(d['learningRate'])} ({opt.scaling} rule from {fmt_lr(opt.lr)} "
                               f"at {opt.reference_batch} samples)")
    t.add_row("replicas", f"rollout {d['rolloutReplicas']}, learner {d['learnerReplicas']}")
    t.add_row("placement", _placement_text(d))
    if d.get("learnerTopology"):
        t.add_row("learner", str(d["learnerTopology"]))
    t.add_row("staleness", _staleness_text(d, rlrun.spec))
    t.add_row("throughput", f"{pred['samplesPerSecond']:.1f} samples/s")
    t.add_row("step time", fmt_duration(pred["stepSeconds"]))
    t.add_row("time to target", time_to_target_text(d))
    t.add_row("why", str(d["reason"]))
    for i, note in enumerate(d.get("notes") or []):
        t.add_row("notes" if i == 0 else "", note)
    return t


def _placement_text(d: dict) -> str:
    """Where the engines run, their tensor-parallel degree and memory share, the learner ranks per pod and
    how weights reach the engines (plans written before these keys read as disaggregated broadcast)."""
    where = d.get("placement") or "disaggregated"
    tp, util = d.get("tensorParallel") or 1, d.get("rolloutMemoryUtilization") or 0.9
    ranks = d.get("ranksPerPod") or 1
    backend = d.get("transferBackend")
    if backend:
        how = {"nccl": "broadcast from learner rank 0 over the network", "gloo": "broadcast from learner rank 0",
               "ipc": "CUDA IPC on each pod's GPUs, the engine asleep while the learner trains",
               "shm": "shared memory on the host"}.get(backend, "")
        sync = f"transfer backend {backend} ({how})"
    elif where == "colocated":
        sync = "weight sync on-GPU handover (the engine sleeps while the learner trains)"
    else:
        sync = f"weight sync {d.get('weightSync') or 'broadcast'} over the network"
    seqs = f", max_num_seqs {d['maxNumSeqs']}" if d.get("maxNumSeqs") else ""
    return (f"{where}: rollout TP {tp} (GPUs per engine), engine memory {util:.2g}{seqs}; "
            f"learner {ranks} rank(s) per pod; {sync}")


def _staleness_text(d: dict, spec) -> str:
    """The staleness the plan chose, within spec.algorithm.maxStaleness (plans written before it read 0)."""
    k, top = int(d.get("staleness") or 0), int(getattr(spec.algorithm, "max_staleness", 0) or 0)
    what = ("synchronous: generate, train, publish in turn" if k == 0 else
            f"the rollout generates up to {k} step(s) ahead of the learner, overlapping training")
    return f"{k} ({what}; maxStaleness {top})"


def _candidates_table(cands: list[dict], plan: dict) -> Table:
    """The candidates compared; E and T as ratios to the chosen plan's where E is the placeholder."""
    from rlscale.plan.headline import relative, samples_known

    coloc = any(row.get("placement") == "colocated" for row in cands)
    lag = any(row.get("staleness") for row in cands)
    known, chosen = samples_known(plan), plan["predicted"]
    c = Table(title="Candidates, best first (P prompts, N samples per step, E samples to target, T time to target"
              + ("; K staleness" if lag else "")
              + ("; roll*: colocated, the engines on the learner GPUs" if coloc else "")
              + ("" if known else "; E and T relative to the chosen plan's: samples to target not measured") + ")",
              title_justify="left")
    for col in ("P", "N", *(("K",) if lag else ()), "lr", "roll", "learn", "smp/s", "step", "E (samples)", "T"):
        c.add_column(col, justify="right", no_wrap=True)
    for row in cands:
        pr = row.get("predicted", row)
        roll = f"{row['rolloutReplicas']}{'*' if row.get('placement') == 'colocated' else ''}"
        k = (str(row.get("staleness") or 0),) if lag else ()
        c.add_row(str(row["prompts"]), str(row["prompts"] * row["samplesPerPrompt"]), *k, fmt_lr(row["learningRate"]),
                  roll, str(row["learnerReplicas"]), f"{pr['samplesPerSecond']:.1f}",
                  fmt_duration(pr["stepSeconds"]),
                  *((f"{pr.get('samplesToTarget', 0) / 1000:,.0f}k", fmt_duration(pr["timeToTargetSeconds"]))
                    if known else (relative(pr.get("samplesToTarget", 0), chosen.get("samplesToTarget", 0)),
                                   relative(pr["timeToTargetSeconds"], chosen["timeToTargetSeconds"]))))
    return c


@app.command()
def crd() -> None:
    """Print the RLRun CustomResourceDefinition generated from the spec."""
    from rlscale.crd import crd_yaml

    sys.stdout.write(crd_yaml())


@app.command()
def run(
    file: Path = FileArg,
    metrics_port: int = typer.Option(DEFAULT_METRICS_PORT, "--metrics-port",
                                     help="Prometheus /metrics port, claimed before anything starts; taken (another "
                                     "run, another server): the next free one, printed. 0: any free one."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where run reports and checkpoints go."),
    fresh: bool = typer.Option(False, "--fresh", help="Start over (deleting runs/NAME) instead of resuming from the "
                               "last checkpoint; a finished run starts nothing without it."),
    linger: float = typer.Option(0.0, "--linger",
                                 help="Keep /metrics up this many seconds after the run ends (for a last scrape)."),
    staleness: int | None = typer.Option(None, "--staleness", min=0, help="Generate this many steps ahead of the "
                                         "learner whatever the plan chooses (at most spec.algorithm.maxStaleness)."),
    seed: int | None = typer.Option(None, "--seed", min=0, help="Seed of the prompt order and the sampling (the "
                                    "held-out split keeps task.seed), over spec.seed: repeat a run with other seeds "
                                    "to see its spread.", show_default="spec.seed"),
) -> None:
    """Run an RLRun on this machine (CPU or one GPU): plan, roll out, learn, report."""
    rlrun = _load(file)
    try:
        from rlscale.embedded import run_embedded
    except ImportError as exc:  # the train extra is missing
        _fail(f"the embedded runner needs the train extra ({exc}); run `make run` or pip install 'rlscale[train]'")
    from rlscale.local_ports import NoFreePort
    from rlscale.plan import PlanError

    try:
        code = run_embedded(rlrun, metrics_port=metrics_port, runs_dir=runs_dir, fresh=fresh, linger=linger,
                            staleness=staleness, seed=seed, source=file)
    except ValueError as exc:  # --staleness above spec.algorithm.maxStaleness
        _fail(str(exc))
    except SpecError as exc:  # the dataset, the reward or the model's template, found before any process started
        _fail([str(e) for e in exc.errors])
    except PlanError as exc:  # a spec only the planner can judge (no candidate fits the budget)
        _fail(str(exc))
    except NoFreePort as exc:  # every port from --metrics-port up is taken
        _fail(str(exc))
    raise typer.Exit(code)


@app.command()
def sweep(
    file: Path = FileArg,
    batches: str = typer.Option("8,16,32,64", "--batches", help="Prompts per step to sweep, comma-separated "
                                "(samples per prompt from the spec)."),
    lr_rules: str = typer.Option("sqrt,none", "--lr-rules", help="Learning-rate rules applied to the spec's "
                                 "optimizer.lr at optimizer.referenceBatch: sqrt, linear, none (the lr unchanged)."),
    seeds: int = typer.Option(2, "--seeds", min=1, help="Seeds per (batch, rule)."),
    staleness: str = typer.Option("0", "--staleness", help="Staleness values to sweep, comma-separated (0 is always "
                                  "in): each value above 0 runs every batch and seed under one rule with "
                                  "algorithm.maxStaleness and the plan pinned there; the report fits the samples "
                                  "penalty (1 + p)^K and the patch carries p."),
    samples: int = typer.Option(DEFAULT_SWEEP_SAMPLES, "--samples", min=1,
                                help="Sample budget of every run (the default sweep of the quickstart took 38 min "
                                "on a 2-core AVX2 machine; its 0.8 target needs 30k-46k samples at 32x8)."),
    eval_samples: int = typer.Option(DEFAULT_SWEEP_EVAL_SAMPLES, "--eval-samples", min=1,
                                     help="Held-out eval every this many samples, rounded up to a multiple of "
                                     "every batch so all batches evaluate alike."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="The sweep goes to RUNS_DIR/<name>-sweep/."),
    fresh: bool = typer.Option(False, "--fresh", help="Start the sweep over (deletes its runs)."),
    report_only: bool = typer.Option(False, "--report-only", help="Write the report from the runs done so far."),
    write_calibration: Path | None = typer.Option(
        None, "--write-calibration", show_default=False,
        help="Also write the fitted noise scale and throughput model as a patch for "
        "`rlscale plan FILE --calibration PATCH`."),
) -> None:
    """The batch-size study: one run per (batch, lr rule, seed) (and staleness), then sweep.md and plots checking
    the planner.

    Runs go through the same runner as `rlscale run`, with re-planning off (fixed prompts, lr by the
    rule). Ctrl-C stops the sweep; the same command resumes it (finished runs are kept)."""
    rlrun = _load(file)
    from rlscale.sweep.runner import (
        SweepError,
        eval_every_samples,
        parse_batches,
        parse_rules,
        parse_staleness,
        run_sweep,
    )
    from rlscale.sweep.runner import write_sweep_report as write_report

    try:
        ps, rules, lags = parse_batches(batches), parse_rules(lr_rules), parse_staleness(staleness)
        spp = rlrun.spec.batch.samples_per_prompt
        if samples < max(ps) * spp:
            raise SweepError(f"--samples: {samples} is less than one step of the largest batch "
                             f"({max(ps)} x {spp}); raise it")
        every = eval_every_samples(ps, spp, eval_samples)
        sweep_dir = (runs_dir / f"{rlrun.name}-sweep").resolve()
        code = 0
        if not report_only:
            try:
                from rlscale.embedded import run_embedded  # noqa: F401  (the train extra is there)
            except ImportError as exc:
                _fail(f"the sweep runs need the train extra ({exc}); run `make venv` or pip install 'rlscale[train]'")
            _, code = run_sweep(rlrun, sweep_dir, ps, rules, seeds, samples, every, fresh, lags)
        try:
            out, res = write_report(rlrun, sweep_dir, write_calibration)
        except SweepError as exc:
            if code == 0:
                raise
            err.print(f"no report yet: {exc}", highlight=False)  # stopped before any run recorded a step
            raise typer.Exit(code) from None
    except SweepError as exc:
        _fail(str(exc))
    out_note = f" and {write_calibration}" if write_calibration else ""
    if res.power is not None and res.power.warning:
        err.print(f"[bold yellow]warning:[/] {res.power.warning}", highlight=False, soft_wrap=True)
    err.print(f"report: {out}{out_note}", highlight=False)
    raise typer.Exit(code)


@app.command()
def export(
    run: Path = typer.Argument(..., help="The run directory of `rlscale run` (runs/NAME), a checkpoint directory "
                               "(checkpoint.path), or one step-* directory.", show_default=False),
    hf: Path | None = typer.Option(None, "--hf", help="Write a Hugging Face model directory here (a spec.lora "
                                   "run: the base with its adapter merged).", show_default=False),
    adapter: Path | None = typer.Option(None, "--adapter", help="A spec.lora run: write peft's adapter directory "
                                        "here (PeftModel.from_pretrained on the base).", show_default=False),
    model: Path | None = typer.Option(None, "--model", help="The model directory the run trained (config and "
                                      "tokenizer); default: the one the run's run.json names."),
    rank_dir: list[Path] = typer.Option([], "--rank-dir", help="Another rank's checkpoint directory, when each "
                                        "rank had a volume of its own (repeat for every rank but 0)."),
    step: int | None = typer.Option(None, "--step", help="Export this step (default: the newest complete)."),
    dtype: str | None = typer.Option(None, "--dtype", help="float32, bfloat16 or float16 (default: the run's)."),
) -> None:
    """Export a run's newest complete checkpoint as a Hugging Face model (transformers, vLLM)."""
    try:
        from rlscale.trainer.export_hf import ExportError, export_hf
    except ImportError as exc:
        _fail(f"export needs the train extra ({exc}); run `make venv` or pip install 'rlscale[train]'")
    if dtype is not None and dtype not in ("float32", "bfloat16", "float16"):
        _fail(f"--dtype: {dtype!r} is not float32, bfloat16 or float16")
    try:
        done = export_hf(run, hf, model_dir=model, rank_dirs=rank_dir, step=step, dtype=dtype, adapter=adapter)
    except ExportError as exc:
        _fail(str(exc))
    where = " and ".join(str(p) for p in (done.out, done.adapter) if p is not None)
    what = "adapter parameters" if done.lora else "parameters"
    err.print(f"exported step {done.step} (ZeRO {done.zero_stage}, {done.parameters:,} {what}, {done.dtype}) "
              f"to {where}", highlight=False)


@app.command("ray-head", hidden=True)
def ray_head(config: Path | None = ConfigOpt) -> None:
    """Role entrypoint: the run's Ray head (CPU only)."""
    from rlscale.roles import ray_head_main

    raise typer.Exit(ray_head_main(config))


@app.command(hidden=True)
def rollout(config: Path | None = ConfigOpt) -> None:
    """Role entrypoint: join the run's Ray cluster and host one vLLM rollout replica."""
    from rlscale.rollout.entrypoint import main as rollout_main

    raise typer.Exit(rollout_main(str(config) if config else None))


@app.command(hidden=True)
def learner(config: Path | None = ConfigOpt) -> None:
    """Role entrypoint: one DeepSpeed rank (RANK, WORLD_SIZE, MASTER_ADDR from the environment); rank 0 drives."""
    from rlscale.trainer.entrypoint import main as learner_main

    raise typer.Exit(learner_main(str(config) if config else None))


@app.command("prepare-model", hidden=True)
def prepare_model(config: Path | None = ConfigOpt) -> None:
    """Pod init step: build a builtin model into the model volume, or check the model is there."""
    from rlscale.trainer.entrypoint import prepare_model_main

    raise typer.Exit(prepare_model_main(str(config) if config else None))


@app.command("tool-server", hidden=True)
def tool_server(config: Path | None = ConfigOpt,
                port: int = typer.Option(TOOL_SERVER_PORT, "--port", help="The HTTP port the driver calls.")) -> None:
    """Role entrypoint: a tool pod (task.toolSandbox.isolation pod): the run's tools behind HTTP, each call in a
    sandboxed worker process."""
    import logging

    from rlscale.runconfig import load_run_config
    from rlscale.trainer.tools.remote import serve_spec

    logging.basicConfig(level=logging.INFO, format="%(asctime)s tool-server %(message)s", stream=sys.stderr)
    raise typer.Exit(serve_spec(load_run_config(config).spec, port))


@app.command(hidden=True)
def operator(
    namespace: list[str] | None = typer.Option(None, "--namespace", "-n",
                                               help="Watch these namespaces (default: all)."),
    metrics_port: int = typer.Option(OPERATOR_METRICS_PORT, "--metrics-port", help="Operator /metrics port."),
) -> None:
    """Run the Kubernetes operator (kopf) that reconciles RLRuns."""
    from rlscale.operator.main import run as operator_run

    raise typer.Exit(operator_run(namespaces=namespace or [], metrics_port=metrics_port) or 0)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
