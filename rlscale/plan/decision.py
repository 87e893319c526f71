"""The decision: candidates within bounds and budget, T = E / X for each, the fastest wins and says why."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from rlscale.plan.calibration import PHASES, Calibration
from rlscale.plan.choices import idle_note, using_the_budget, zero_reason
from rlscale.plan.errors import PlanError
from rlscale.plan.lora import lora_fix, lora_note, lora_params_for
from rlscale.plan.placement import (
    colocated_unavailable,
    gpus_for,
    layout_model,
    placement_reason,
    placements_for,
    ranks_per_pod,
    splits_for,
    weight_sync_for,
)
from rlscale.plan.profiles import accelerator_profile
from rlscale.plan.reason import explain, staleness_reason
from rlscale.plan.samples import (
    DEFAULT_NOISE_MULTIPLE,
    lr_mismatch,
    mismatch_penalty,
    noise_curve,
    reference_samples,
    run_key,
    samples_note,
    scaled_lr,
)
from rlscale.plan.shapes import DTYPE_BYTES, model_shape_for
from rlscale.plan.staleness import penalty_for, staleness_options, staleness_penalty
from rlscale.plan.throughput import PLUGIN_REWARD_SECONDS, Phases, SystemModel
from rlscale.progress import fmt_lr

# Candidates whose time-to-target lies within this fraction of the best are ties: the
# one with fewer GPUs (then the smaller batch) wins, as the model is not that precise.
TIE = 0.005


@dataclass(frozen=True)
class Prediction:
    """Predicted throughput and time-to-target of one configuration."""

    samples_per_second: float
    step_seconds: float
    time_to_target_seconds: float
    samples_to_target: float
    phases: Phases
    # Held-out evals, every target.evalEvery steps, spread over the steps: the run's clock
    # (time-to-target) counts them, and they cost the same whatever the batch.
    eval_seconds_per_step: float = 0.0
    # Steps the rollout runs ahead of the learner: from 1 on, the step overlaps generation and training.
    staleness: int = 0
    # Generating ahead on a shared cpu host: the cores the rollout and the learner each get (`rlscale run`
    # pins them so, and `phases` are on them); None: every core, or cores and GPUs of their own.
    cores: tuple[int, int] | None = None

    @property
    def generate(self) -> float:
        return self.phases.generate

    @property
    def reward(self) -> float:
        return self.phases.reward

    @property
    def train(self) -> float:
        return self.phases.train

    @property
    def sync(self) -> float:
        return self.phases.sync

    def to_dict(self) -> dict[str, Any]:
        return {"samplesPerSecond": self.samples_per_second, "stepSeconds": self.step_seconds,
                "timeToTargetSeconds": self.time_to_target_seconds, "samplesToTarget": self.samples_to_target,
                "phases": self.phases.to_dict(), "evalSecondsPerStep": self.eval_seconds_per_step,
                "staleness": self.staleness, **({"cores": {"rollout": self.cores[0], "learner": self.cores[1]}}
                                                if self.cores else {})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Prediction:
        return cls(samples_per_second=float(d["samplesPerSecond"]), step_seconds=float(d["stepSeconds"]),
                   time_to_target_seconds=float(d["timeToTargetSeconds"]),
                   samples_to_target=float(d["samplesToTarget"]), phases=Phases.from_dict(d["phases"]),
                   eval_seconds_per_step=float(d.get("evalSecondsPerStep") or 0.0),
                   staleness=int(d.get("staleness") or 0),
                   cores=(int(d["cores"]["rollout"]), int(d["cores"]["learner"])) if d.get("cores") else None)


@dataclass(frozen=True)
class Candidate:
    """One configuration the planner compared."""

    prompts: int
    samples_per_prompt: int
    rollout_replicas: int
    learner_replicas: int
    learning_rate: float
    gpus: int
    predicted: Prediction
    noise_penalty: float  # E(N)/E(N_ref) from the noise curve, lr retuned
    lr_penalty: float  # extra samples factor from an lr off the sqrt rule
    concurrency: int  # decode sequences in flight per rollout replica
    bound: str  # generation "memory"- or "compute"-bound
    placement: str = "disaggregated"  # or "colocated": one engine per learner pod, on its GPUs
    tensor_parallel: int = 1  # GPUs per engine
    memory_utilization: float = 0.0  # the engine's share of device memory (0: not recorded)
    staleness: int = 0  # steps the rollout runs ahead of the learner (0: the synchronous loop)

    @property
    def batch(self) -> int:
        return self.prompts * self.samples_per_prompt

    @property
    def key(self) -> tuple[int, int]:
        """(prompts, rollout replicas): what a re-plan may change while the learner ranks stay."""
        return self.prompts, self.rollout_replicas

    @property
    def replan_key(self) -> tuple[int, ...]:
        """What a re-plan compares: the key, and the staleness when it is not 0."""
        return replan_key(self)

    def to_dict(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "samplesPerPrompt": self.samples_per_prompt,
                "batch": batch_label(self.prompts, self.samples_per_prompt), "batchSamples": self.batch,
                "rolloutReplicas": self.rollout_replicas, "learnerReplicas": self.learner_replicas,
                "learningRate": self.learning_rate, "gpus": self.gpus, "predicted": self.predicted.to_dict(),
                "samplesPenalty": self.noise_penalty * self.lr_penalty, "noisePenalty": self.noise_penalty,
                "lrPenalty": self.lr_penalty, "decodeConcurrency": self.concurrency, "generationBound": self.bound,
                "placement": self.placement, "tensorParallel": self.tensor_parallel,
                "rolloutMemoryUtilization": self.memory_utilization, "staleness": self.staleness}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Candidate:
        lr_pen = float(d.get("lrPenalty", 1.0))
        noise = d.get("noisePenalty")
        return cls(prompts=int(d["prompts"]), samples_per_prompt=int(d["samplesPerPrompt"]),
                   rollout_replicas=int(d["rolloutReplicas"]), learner_replicas=int(d["learnerReplicas"]),
                   learning_rate=float(d["learningRate"]), gpus=int(d.get("gpus") or 0),
                   predicted=Prediction.from_dict(d["predicted"]),
                   noise_penalty=float(noise) if noise is not None else float(d.get("samplesPenalty", 1.0)) / lr_pen,
                   lr_penalty=lr_pen, concurrency=int(d.get("decodeConcurrency") or 0),
                   bound=str(d.get("generationBound") or ""), placement=str(d.get("placement") or "disaggregated"),
                   tensor_parallel=int(d.get("tensorParallel") or 1),
                   memory_utilization=float(d.get("rolloutMemoryUtilization") or 0.0),
                   staleness=int(d.get("staleness") or 0))


@dataclass(frozen=True)
class Plan:
    """The planner's choice: batch, learning rate, replica split, predictions and the reason."""

    prompts: int
    samples_per_prompt: int
    learning_rate: float
    rollout_replicas: int
    learner_replicas: int
    predicted: Prediction
    reason: str
    candidates: list[Candidate]
    noise_scale: float
    calibrated: bool = False
    gpus: int = 0
    samples_to_target_ref: float = 0.0  # E_ref at the reference batch
    # E_ref measured (samples.py, target.expectedSamples), not the placeholder: else no time shown (headline.py)
    samples_to_target_known: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Where the engines run and how weights reach them (placement.py); plans written before these
    # existed load as the disaggregated broadcast they described.
    placement: str = "disaggregated"  # or "colocated"
    weight_sync: str = "broadcast"  # or "object-store"
    rollout_memory_utilization: float = 0.9  # the engine's share of each device's memory
    tensor_parallel: int = 1  # GPUs per rollout engine
    ranks_per_pod: int = 1  # learner ranks per learner pod
    # Steps the rollout may generate ahead of the learner (0: the synchronous loop); at most
    # spec.algorithm.maxStaleness. A sample generated with weights v trains at version <= v + staleness.
    staleness: int = 0
    # The learner's layout and ZeRO stage in words, and why (choices.zero_reason); the stage DeepSpeed runs.
    learner_topology: str = ""
    zero_stage: int = 1
    # vLLM's weight transfer backend (placement.transfer_backend) and the engine's max_num_seqs: the
    # sequences a replica decodes at once in the plan (0: plans written before it, vLLM's default).
    transfer_backend: str = ""
    max_num_seqs: int = 0

    @property
    def batch(self) -> int:
        return self.prompts * self.samples_per_prompt

    @property
    def key(self) -> tuple[int, int]:
        """(prompts, rollout replicas): what a re-plan may change while the learner ranks stay."""
        return self.prompts, self.rollout_replicas

    @property
    def replan_key(self) -> tuple[int, ...]:
        """What a re-plan compares: the key, and the staleness when it is not 0 (a change of staleness
        alone is a change of plan)."""
        return replan_key(self)

    def summary(self) -> str:
        return (f"{self.prompts}x{self.samples_per_prompt} lr={fmt_lr(self.learning_rate)} "
                f"rollout={self.rollout_replicas} learner={self.learner_replicas}")

    def with_choice(self, c: Candidate, reason: str) -> Plan:
        """This plan's candidates and figures, with `c` chosen instead of the winner, for `reason`."""
        return replace(self, prompts=c.prompts, samples_per_prompt=c.samples_per_prompt,
                       learning_rate=c.learning_rate, rollout_replicas=c.rollout_replicas,
                       learner_replicas=c.learner_replicas, predicted=c.predicted, gpus=c.gpus, reason=reason,
                       placement=c.placement, tensor_parallel=c.tensor_parallel,
                       rollout_memory_utilization=c.memory_utilization or self.rollout_memory_utilization,
                       staleness=c.staleness)

    def with_prediction(self, predicted: Prediction) -> Plan:
        """The same choice, predicted anew by a calibrated model (so predicted-vs-measured stays honest)."""
        return replace(self, predicted=predicted, calibrated=True)

    def to_dict(self, candidates: bool = True) -> dict[str, Any]:
        """camelCase, JSON-able: what `rlscale plan --json` prints, the run config carries and (without
        the candidates) the operator keeps in status.plan."""
        out = {"prompts": self.prompts, "samplesPerPrompt": self.samples_per_prompt,
               "batch": batch_label(self.prompts, self.samples_per_prompt), "batchSamples": self.batch,
               "learningRate": self.learning_rate, "rolloutReplicas": self.rollout_replicas,
               "learnerReplicas": self.learner_replicas, "gpus": self.gpus,
               "predicted": self.predicted.to_dict(), "reason": self.reason, "noiseScale": self.noise_scale,
               "samplesToTargetAtReference": self.samples_to_target_ref,
               "samplesToTargetKnown": self.samples_to_target_known,
               "calibrated": self.calibrated, "notes": list(self.notes), "placement": self.placement,
               "weightSync": self.weight_sync, "rolloutMemoryUtilization": self.rollout_memory_utilization,
               "tensorParallel": self.tensor_parallel, "ranksPerPod": self.ranks_per_pod,
               "staleness": self.staleness, "learnerTopology": self.learner_topology, "zeroStage": self.zero_stage,
               "transferBackend": self.transfer_backend, "maxNumSeqs": self.max_num_seqs}
        if candidates:
            out["candidates"] = [c.to_dict() for c in self.candidates]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        """From to_dict's form (status.plan has no candidates: they come back empty)."""
        return cls(prompts=int(d["prompts"]), samples_per_prompt=int(d["samplesPerPrompt"]),
                   learning_rate=float(d["learningRate"]), rollout_replicas=int(d["rolloutReplicas"]),
                   learner_replicas=int(d["learnerReplicas"]), predicted=Prediction.from_dict(d["predicted"]),
                   reason=str(d.get("reason") or ""),
                   candidates=[Candidate.from_dict(c) for c in d.get("candidates") or []],
                   noise_scale=float(d.get("noiseScale") or 0.0), calibrated=bool(d.get("calibrated")),
                   gpus=int(d.get("gpus") or 0), samples_to_target_ref=float(d.get("samplesToTargetAtReference") or 0),
                   samples_to_target_known=bool(d.get("samplesToTargetKnown")),
                   notes=tuple(d.get("notes") or ()), placement=str(d.get("placement") or "disaggregated"),
                   weight_sync=str(d.get("weightSync") or "broadcast"),
                   rollout_memory_utilization=float(d.get("rolloutMemoryUtilization") or 0.9),
                   tensor_parallel=int(d.get("tensorParallel") or 1), ranks_per_pod=int(d.get("ranksPerPod") or 1),
                   staleness=int(d.get("staleness") or 0), learner_topology=str(d.get("learnerTopology") or ""),
                   zero_stage=int(d["zeroStage"]) if d.get("zeroStage") is not None else 1,
                   transfer_backend=str(d.get("transferBackend") or ""),
                   max_num_seqs=int(d.get("maxNumSeqs") or 0))


def replan_key(c: Candidate | Plan) -> tuple[int, ...]:
    """(prompts, rollout replicas), with the staleness appended when it is not 0: the form a re-plan's
    proposal takes (status.replan keeps it), unchanged for plans without staleness."""
    return (c.prompts, c.rollout_replicas, c.staleness) if c.staleness else (c.prompts, c.rollout_replicas)


def batch_label(prompts: int, samples_per_prompt: int) -> str:
    """"16x8": prompts x samples per prompt, as the printer column and `rlscale plan` show a batch."""
    return f"{prompts}x{samples_per_prompt}"


# Held-out prompts of one eval when the run has not timed one: the builtin task's split.
EVAL_PROMPTS = 500

# --------------------------------------------------------------------------- building blocks


def system_model(spec: Any, calibration: Calibration | None = None, host_cores: int = 0) -> SystemModel:
    """The uncalibrated throughput model of a spec (measured token lengths applied when known); `host_cores`:
    the cores of the one cpu host `rlscale run` shares between the roles (0: pods, accelerators)."""
    dtype = spec.model.dtype
    prompt = float(spec.task.expected_prompt_tokens)
    response = float(spec.task.expected_response_tokens)
    if calibration is not None:
        if calibration.prompt_tokens:
            prompt = float(calibration.prompt_tokens)
        response = calibration.response_length() or response
    profile = accelerator_profile(spec.hardware, dtype)
    builtin_reward = ":" not in spec.task.reward
    shape = model_shape_for(spec.model)
    lora = getattr(spec, "lora", None)
    return SystemModel(
        shape=shape, profile=profile, dtype=dtype,
        lora_params=lora_params_for(spec, shape), lora_merged_sync=bool(lora is not None and lora.modules_to_save),
        prompt_tokens=prompt, response_tokens=response, max_new_tokens=spec.task.max_new_tokens,
        algorithm=spec.algorithm.name, reference_model=spec.algorithm.kl_coef > 0,
        mini_batches=spec.algorithm.mini_batches,
        # The learner fills a micro-batch with whole prompt groups (trainer/batching.py).
        zero_stage=spec.learner.zero_stage,
        micro_batch=spec.batch.micro_batch // spec.batch.samples_per_prompt * spec.batch.samples_per_prompt
        or spec.batch.micro_batch,
        rollout_gpus=spec.rollout.gpus_per_replica, learner_gpus=spec.learner.gpus_per_replica,
        gpus_per_node=spec.hardware.node_gpus,
        reward_seconds_per_sample=profile.reward_seconds_per_sample if builtin_reward else PLUGIN_REWARD_SECONDS,
        weight_sync=weight_sync_for(spec), ranks_per_pod=ranks_per_pod(spec),
        gradient_checkpointing=bool(getattr(spec.learner, "gradient_checkpointing", False)),
        group_size=spec.batch.samples_per_prompt,
        micro_batch_tokens=getattr(spec.batch, "micro_batch_tokens", None),
        host_cores=host_cores if profile.shared_host else 0,
        # A trajectory's turns: measured, else task.maxTurns (an upper bound: a trajectory may answer sooner).
        turns=float(cal_turns if calibration is not None and (cal_turns := calibration.turns) else
                    getattr(spec.task, "max_turns", None) or 1),
        tool_seconds=float(calibration.tool_seconds or 0.0) if calibration is not None else 0.0,
    )


def calibrate(model: SystemModel, calibration: Calibration) -> SystemModel:
    """Per phase, scale the model so its prediction at the measured configuration equals the measurement.

    Scaling a phase's time by f is dividing its usable bandwidth and FLOP/s (its efficiency factors) by f.
    Phases measured on a share of a cpu host's cores (a run generating ahead) are first put back on
    every core, which is what the model predicts before SystemModel.phases_at.
    """
    if not calibration.has_phases:
        return model
    raw = model.phases(calibration.prompts, calibration.samples_per_prompt,
                       calibration.rollout_replicas, calibration.learner_replicas)
    on = {"generate": 1.0, "reward": 1.0, "train": 1.0, "sync": 1.0}
    if calibration.cores and model.profile.shared_host:
        g, t = (model.on_share(n / sum(calibration.cores)) for n in calibration.cores)
        on.update(generate=g, reward=g, train=t)
    factors = {}
    for p in PHASES:
        measured, predicted = calibration.measured(p), getattr(raw, p)
        measured = measured / on[p] if measured is not None else None
        factors[p] = measured / predicted if measured is not None and predicted > 0 else 1.0
    return replace(model, scale=Phases(**factors))


def eval_seconds_per_step(spec: Any, model: SystemModel, cal: Calibration,
                          splits: list[tuple[int, int]]) -> dict[int, float]:
    """Per rollout replica count, one held-out eval's seconds / evalEvery.

    An eval is greedy generation of EVAL_PROMPTS prompts, one sample each, on the rollout
    replicas: measured when the run has timed one (moved to other replica counts by the
    model's ratio), else from the calibrated generation model.
    """
    every = max(1, int(spec.target.eval_every))

    def modelled(r: int) -> float:
        return model.generation(EVAL_PROMPTS, 1, r).seconds * model.scale.generate

    out = {}
    for r in {r for r, _ in splits}:
        seconds = modelled(r)
        if cal.eval_s:
            seconds = cal.eval_s * seconds / modelled(cal.rollout_replicas)
        out[r] = seconds / every
    return out


def prompt_candidates(spec: Any) -> list[int]:
    """Fixed prompts, else powers of two within [minPrompts, maxPrompts], the bounds, and the reference batch."""
    b = spec.batch
    if b.prompts != "auto":
        return [b.prompts]
    out = {b.min_prompts, b.max_prompts}
    p = 1
    while p <= b.max_prompts:
        if p >= b.min_prompts:
            out.add(p)
        p *= 2
    ref, rem = divmod(spec.optimizer.reference_batch, b.samples_per_prompt)
    if rem == 0 and b.min_prompts <= ref <= b.max_prompts:
        out.add(ref)
    return sorted(out)


def replica_splits(spec: Any, placement: str = "disaggregated") -> list[tuple[int, int]]:
    """(rollout, learner) pairs: fixed counts where given, else 1..maxReplicas, within budget.gpus on GPUs
    (colocated: rollout = learner, on the learner GPUs only)."""
    return splits_for(spec, placement)


# --------------------------------------------------------------------------- the plan


def make_plan(spec: Any, calibration: Calibration | None = None, placement: str | None = None,
              staleness: int | None = None, host_cores: int = 0) -> Plan:
    """Choose placement, batch, lr, replica split and staleness minimising predicted time-to-target
    T = E(N, K) / X(N, K).

    `placement`: predict only this one (a re-plan keeps the running placement); else spec.placement,
    whose auto predicts both on GPUs and keeps the faster. `staleness`: plan only this one (capped at
    spec.algorithm.maxStaleness; else every one up to it). `host_cores`: on a cpu accelerator, the cores of
    the one machine `rlscale run` splits between the roles when it generates ahead (SystemModel.phases_at);
    0 (the operator's pods): each role's cores are its own whatever the staleness."""
    cal = calibration or Calibration()
    pin = staleness
    base = system_model(spec, cal, host_cores)
    n_noise, noise_from = noise_scale_for(spec, cal)
    if getattr(spec.target, "expected_samples", None):
        e_ref, e_known = float(spec.target.expected_samples), True
    else:
        e_ref, e_known = reference_samples(run_key(spec), float(spec.optimizer.reference_batch), n_noise)
    cands: list[Candidate] = []
    models: dict[str, SystemModel] = {}
    refused: dict[str, str] = {}
    if placement is None and spec.rollout.replicas == "auto" and (why := colocated_unavailable(spec)):
        refused["colocated"] = why
    for where in placements_for(spec, placement):
        model = calibrate(layout_model(base, spec, where), cal)
        try:
            feasible = feasible_splits(spec, model, where)
        except PlanError as exc:
            refused[where] = str(exc)
            continue
        models[where] = model
        cands += candidates(spec, model, cal, feasible, n_noise, e_ref, where, pin)
    if not cands:
        raise PlanError(_refusal(refused) + lora_fix(spec, lambda trial: make_plan(trial, calibration, placement,
                                                                                    staleness, host_cores)))
    # A fresh plan leaves no budgeted GPU idle; a re-plan (the running placement and learners kept) may hand
    # rollout GPUs back to the cluster when measurements show they do not pay (the tie rule in `pick`).
    every, kept = cands, (using_the_budget(cands, spec.budget.gpus) if placement is None else cands)
    for w in [w for w in models if not any(c.placement == w for c in kept)]:
        most = max(c.gpus for c in cands if c.placement == w)
        refused[w] = f"not chosen: it uses at most {most} of budget.gpus ({spec.budget.gpus}), leaving GPUs idle"
        del models[w]
    cands = kept
    win = pick(cands)
    model = models[win.placement]
    best = {w: min((c for c in cands if c.placement == w), key=lambda c: c.predicted.time_to_target_seconds)
            for w in models}
    shown = _shown_candidates(cands, win, cal, every)
    # the batch rule against the winner's own placement and staleness; the placement's sentence against
    # the other placement
    own = [c for c in cands if (c.placement, c.staleness) == (win.placement, win.staleness)]
    reason = explain(spec, win, _best_per_batch(own, win), cal, e_known and noise_from != "default")
    same = [c for c in cands if c.placement != win.placement and c.prompts == win.prompts]
    same_batch = min(same, key=lambda c: c.predicted.time_to_target_seconds) if same else None
    why = placement_reason(spec, win, best, {w: _bare(m) for w, m in refused.items()}, same_batch)
    reason += f" Placement {why}."
    lag = staleness_reason(spec, win, cands, *penalty_for(cal), model.profile.shared_host, pin)
    reason += f" {lag}" if lag else ""
    return Plan(
        prompts=win.prompts, samples_per_prompt=win.samples_per_prompt, learning_rate=win.learning_rate,
        rollout_replicas=win.rollout_replicas, learner_replicas=win.learner_replicas, predicted=win.predicted,
        reason=reason, candidates=shown, noise_scale=n_noise, calibrated=cal.calibrated, gpus=win.gpus,
        samples_to_target_ref=e_ref, samples_to_target_known=e_known,
        notes=_notes(spec, model, cal, win, n_noise, noise_from, e_ref, e_known),
        placement=win.placement, weight_sync=model.weight_sync,
        rollout_memory_utilization=model.rollout_utilization, tensor_parallel=model.rollout_gpus,
        ranks_per_pod=ranks_per_pod(spec), staleness=win.staleness, learner_topology=zero_reason(model, win),
        zero_stage=model.zero_stage, transfer_backend=model.transfer_backend,
        # the step's sequences in flight, and the evals' (EVAL_PROMPTS greedy) when more: what the model timed;
        # on cpu vLLM's default (the stand-in engine's token budget is small)
        max_num_seqs=0 if model.profile.shared_host else
        max(win.concurrency, model.generation(EVAL_PROMPTS, 1, win.rollout_replicas).concurrency),
    )


def _bare(message: str) -> str:
    return message.removeprefix("spec.")


def _refusal(refused: dict[str, str]) -> str:
    """The PlanError when no placement fits: the memory reason first (a budget shortfall says less), and
    the other placement's reason after it when auto tried both."""
    ordered = sorted(refused.items(), key=lambda kv: (kv[1].startswith("not "), kv[1].startswith("spec.budget.")))
    first_where, first = ordered[0]
    if len(ordered) == 1:
        return first
    rest = "; ".join(f"{w}: {_bare(m)}" for w, m in ordered[1:])
    return f"{first} (placement {first_where}; {rest})"


def noise_scale_for(spec: Any, cal: Calibration) -> tuple[float, str]:
    """N_noise in samples and where it came from: measured > the spec's > the default multiple."""
    if cal.has_noise_scale:
        return float(cal.noise_scale), "measured"
    if spec.optimizer.noise_scale:
        return float(spec.optimizer.noise_scale), "spec"
    return DEFAULT_NOISE_MULTIPLE * float(spec.optimizer.reference_batch), "default"


def feasible_splits(spec: Any, model: SystemModel, placement: str = "disaggregated") -> list[tuple[int, int]]:
    """(rollout, learner) replica counts within the budget that fit in memory; PlanError if none."""
    splits = replica_splits(spec, placement)
    if not splits:
        le, ro = spec.learner, spec.rollout
        if placement == "colocated" and le.replicas != "auto" and le.replicas > ro.max_replicas:
            raise PlanError(f"spec.rollout.maxReplicas: {ro.max_replicas} is below learner.replicas ({le.replicas}), "
                            "and colocated runs one engine per learner pod; raise rollout.maxReplicas")
        if placement == "colocated":
            raise PlanError(f"spec.budget.gpus: {spec.budget.gpus} does not fit one learner replica "
                            f"({spec.learner.gpus_per_replica} GPUs) to colocate the engines on; raise budget.gpus")
        need = spec.rollout.gpus_per_replica + spec.learner.gpus_per_replica
        raise PlanError(f"spec.budget.gpus: {spec.budget.gpus} does not fit one rollout and one learner replica "
                        f"({need} GPUs); raise budget.gpus, or lower learner.gpusPerReplica "
                        f"({spec.learner.gpus_per_replica}) to leave GPUs for rollout replicas")
    verdicts = [(r, k, model.infeasible(r, k)) for r, k in splits]
    feasible = [(r, k) for r, k, bad in verdicts if not bad]
    if not feasible:  # the reason at the most learners (the least state per GPU): what is left to change
        raise PlanError(f"spec.{max(verdicts, key=lambda v: (v[1], v[0]))[2]}")
    return feasible


def candidates(spec: Any, model: SystemModel, cal: Calibration, feasible: list[tuple[int, int]],
               n_noise: float, e_ref: float, placement: str = "disaggregated",
               staleness: int | None = None) -> list[Candidate]:
    """Every (prompts, rollout, learner, staleness) choice with its predicted phases, E, X and T.

    Staleness K multiplies E by (1 + p)^K and overlaps the step (SystemModel.step_seconds), on a shared cpu
    host with each side on its share of the cores (SystemModel.phases_at)."""
    opt, spp = spec.optimizer, spec.batch.samples_per_prompt
    ks, (p, _) = staleness_options(spec, placement, staleness), penalty_for(cal)
    n_ref = float(opt.reference_batch)
    cands: list[Candidate] = []
    gens: dict[tuple[int, int], Any] = {}  # generation depends on (prompts, rollout) only
    trains: dict[tuple[int, int], float] = {}  # training on (batch, learner) only
    reward = model.reward_seconds_per_sample * model.scale.reward
    syncs = {(r, k): model.sync_seconds(r, k) * model.scale.sync for r, k in feasible}
    evals = eval_seconds_per_step(spec, model, cal, feasible)
    for prompts in prompt_candidates(spec):
        n = prompts * spp
        noise = noise_curve(n, n_ref, n_noise)
        lr_pen = mismatch_penalty(lr_mismatch(n, n_ref, opt.scaling))
        e = e_ref * noise * lr_pen
        lr = scaled_lr(opt.lr, n, n_ref, opt.scaling)
        for r, k in feasible:
            gen = gens.get((prompts, r)) or gens.setdefault((prompts, r), model.generation(prompts, spp, r))
            train = trains.get((n, k)) or trains.setdefault((n, k), model.train_seconds(n, k) * model.scale.train)
            ph = Phases(gen.seconds * model.scale.generate, n * reward, train, syncs[(r, k)])
            for lag in ks:
                ph_k, cores = model.phases_at(ph, lag)
                step, e_k = model.step_seconds(ph_k, lag), e * staleness_penalty(lag, p)
                pred = Prediction(n / step, step, e_k / n * (step + evals[r]), e_k, ph_k, evals[r], lag, cores)
                cands.append(Candidate(prompts, spp, r, k, lr, gpus_for(spec, placement, r, k), pred, noise,
                                       lr_pen, gen.concurrency, gen.bound, placement, model.rollout_gpus,
                                       model.rollout_utilization, lag))
    return cands


def _shown_candidates(cands: list[Candidate], win: Candidate, cal: Calibration,
                      every: list[Candidate]) -> list[Candidate]:
    """The best split per batch and staleness, plus the configuration running now (at every staleness, even
    one the budget rule leaves out: `every`) when calibrated (callers compare)."""
    shown = _best_per_batch(cands, win)
    if cal.has_phases:
        now = [c for c in every if (c.prompts, c.samples_per_prompt, c.rollout_replicas, c.learner_replicas)
               == (cal.prompts, cal.samples_per_prompt, cal.rollout_replicas, cal.learner_replicas)]
        new = [c for c in dict.fromkeys(now) if c not in shown]
        if new:
            shown = sorted([*shown, *new], key=lambda c: (c.predicted.time_to_target_seconds, c is not win))
    return shown


def _notes(spec: Any, model: SystemModel, cal: Calibration, win: Candidate, n_noise: float, noise_from: str,
           e_ref: float, e_known: bool) -> tuple[str, ...]:
    """What a reader should know about the plan's numbers: which are assumed rather than measured."""
    notes = []
    if not cal.has_phases:
        notes.append(f"throughput from the {model.profile.name} profile and the model shape ({model.shape.source}); "
                     "uncalibrated until steps are measured")
    if noise_from == "default":
        notes.append(f"noise scale N_noise = {DEFAULT_NOISE_MULTIPLE:g} x referenceBatch = {n_noise:g} "
                     "(default, not measured)")
    if said := samples_note(run_key(spec), e_ref, e_known, bool(getattr(spec.target, "expected_samples", None))):
        notes.append(said)
    if win.predicted.samples_to_target > spec.budget.max_samples:
        notes.append(f"predicted samples to target {win.predicted.samples_to_target:,.0f} exceed budget.maxSamples "
                     f"({spec.budget.max_samples:,}): the run may stop first")
    idle = idle_note(win, spec.budget.gpus, spec)
    if idle:
        notes.append(idle)
    activations = model.activation_note(win.learner_replicas)
    if activations:
        notes.append(activations)
    if model.profile.shared_host:
        notes.append("cpu: rollout and learner replicas share one machine's cores, so more replicas add no throughput")
    if model.turns > 1:
        notes.append(model.turns_note(bool(cal.turns), bool(cal.tool_seconds)))
    if getattr(spec.task, "reward_model", None) is not None:
        notes.append(spec.task.reward_model.plan_note())
    notes += [n for n in (lora_note(spec, model.shape, DTYPE_BYTES[model.dtype]),) if n]  # spec.lora's
    return tuple(notes)


def pick(cands: list[Candidate]) -> Candidate:
    """Least predicted time-to-target; near-ties (within TIE) go to fewer GPUs, then the lesser staleness,
    then the smaller batch."""
    best_t = min(c.predicted.time_to_target_seconds for c in cands)
    tied = [c for c in cands if c.predicted.time_to_target_seconds <= best_t * (1 + TIE)]
    return min(tied, key=lambda c: (c.gpus or c.rollout_replicas + c.learner_replicas, c.staleness, c.batch,
                                    c.predicted.time_to_target_seconds))


def _best_per_batch(cands: list[Candidate], win: Candidate) -> list[Candidate]:
    """The fastest split for each batch size and staleness (the winner's own row for its own), sorted by
    time-to-target."""
    best: dict[tuple[int, int], Candidate] = {}
    for c in cands:
        cur = best.get((c.prompts, c.staleness))
        if cur is None or c.predicted.time_to_target_seconds < cur.predicted.time_to_target_seconds:
            best[(c.prompts, c.staleness)] = c
    best[(win.prompts, win.staleness)] = win
    return sorted(best.values(), key=lambda c: (c.predicted.time_to_target_seconds, c is not win))
