"""The driver (learner rank 0): the loop that draws prompts, rolls out, rewards, learns, publishes weights,
measures, evaluates, checkpoints and takes plan changes between steps.

The loop talks to its parts through small ports (rlscale.trainer.ports: the rollout, the learner),
hands every step record to its sinks (rlscale.trainer.sinks), and asks a plan source
(rlscale.trainer.plan_source) for plan changes; only `Driver.from_config` does I/O, so tests build
the loop from fakes. Where it runs (one machine or a pod) is rlscale.trainer.run_env's business.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlscale.plan import Plan
from rlscale.plan.calibration import noise_from_steps
from rlscale.plan.replan import NOISE_WINDOW
from rlscale.progress import TargetTracker
from rlscale.records import ShownSample, StepRecord
from rlscale.roles import RunEnd
from rlscale.run_metrics import RunMetrics
from rlscale.runconfig import RunConfig
from rlscale.trainer import checkpoint
from rlscale.trainer.batching import RolloutBatch
from rlscale.trainer.data import build_task, try_reward
from rlscale.trainer.dynamic_sampling import Round, dynamic_sampling_for
from rlscale.trainer.export_sink import export_sinks
from rlscale.trainer.pipeline import Pipeline, Producing, Rollouts
from rlscale.trainer.plan_source import PlanChange, PlanSource
from rlscale.trainer.ports import Learner, Rollout
from rlscale.trainer.rewards import Reward, RewardError, resolve_reward, score, score_terms
from rlscale.trainer.sinks import ClosesRewardPool, PrometheusSink, RunLog, Sink
from rlscale.trainer.tasks import Problem, PromptIterator
from rlscale.trainer.tools.loop import add_env_rewards, decode_samples, response_masks, tool_metrics, turn_credit_fields
from rlscale.trainer.trackers import tracker_sinks

log = logging.getLogger("rlscale.driver")


@dataclass
class RunState:
    """Everything besides the model and optimiser that a resumed run needs to continue identically."""

    step: int = 0
    samples: int = 0
    version: int = 0
    elapsed_s: float = 0.0  # training-loop seconds summed over every segment of the run
    generated_tokens_total: int = 0
    trained_tokens_total: int = 0
    prompts: int = 0
    learning_rate: float = 0.0
    rollout_replicas: int = 1
    data: dict = field(default_factory=dict)
    tracker: dict = field(default_factory=dict)
    rng: dict = field(default_factory=dict)
    run_id: str = ""  # namespace/name: a run resumes only from its own checkpoints
    # Bounded staleness: batches generated ahead and not yet trained (pipeline.Rollouts.to_state), the
    # prompt iterator's state in `data` being after them; samples dropped as older than the staleness.
    pending: list = field(default_factory=list)
    stale_samples: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _rng_state() -> dict:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(), "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
            "torch": torch.get_rng_state().tolist()}


def _set_rng_state(s: dict) -> None:
    if not s:
        return
    py = s["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npy = s["numpy"]
    np.random.set_state((npy[0], np.asarray(npy[1], dtype=np.uint32), npy[2], npy[3], npy[4]))
    torch.set_rng_state(torch.tensor(s["torch"], dtype=torch.uint8))


@dataclass
class Task:
    """What the loop trains and evaluates on: prompts, the reward, and the eval's response length."""

    train: Sequence[Problem]
    eval: Sequence[Problem]
    reward: Reward
    max_new_tokens: int


class Driver:
    """One run's loop on rank 0, around a learner (DeepSpeed ranks) and a rollout client (Serve replicas)."""

    def __init__(self, *, spec: Any, plan: Plan, task: Task, tokenizer: Any, learner: Learner, rollout: Rollout,
                 run_log: RunLog, sinks: Sequence[Sink], plan_source: PlanSource, ckpt_dir: Path, run_id: str = "",
                 seed: int = 0, metrics: RunMetrics | None = None, cores: dict[str, int] | None = None):
        self.spec, self.plan, self.task, self.tok = spec, plan, task, tokenizer
        self.cores = cores  # StepRecord.cores: the cpu host's cores `rlscale run` split between the roles
        self.learner, self.rollout = learner, rollout
        self.run_log, self.sinks, self.plan_source = run_log, list(sinks), plan_source
        self.ckpt_dir, self.run_id, self.seed, self.metrics = ckpt_dir, run_id, seed, metrics
        self.data = PromptIterator(list(task.train), seed=1 + seed)
        self.tracker = TargetTracker(spec.target.value, spec.target.window)
        self.state = RunState(prompts=plan.prompts, learning_rate=plan.learning_rate,
                              rollout_replicas=plan.rollout_replicas)
        self.records: list[StepRecord] = []
        self.serving: Any = None  # the rollout as last seen (trainer.ports.Serving)
        self.resumed = False
        self.stop_requested = False
        self.checkpoint_seconds: float | None = None
        self.refill = dynamic_sampling_for(spec)  # DAPO's dynamic sampling (trainer/dynamic_sampling.py), or None
        # Generation ahead of training (trainer/pipeline.py): the lock is held for a batch's generation and
        # for publishing, evaluating, scaling and checkpointing, so none of them meets half a batch.
        self.rollout_lock = threading.RLock()
        self.pipeline: Pipeline | None = None
        self.ahead: list[Rollouts] = []  # batches generated ahead with no pipeline running (a resume, K now 0)
        self.drawn = 0  # batches drawn so far: the trained steps and those generated ahead
        self.producing = Producing(0, 0)  # the batch being produced (its seeds and weights version)
        self._last_ckpt = 0  # the step of the newest checkpoint this process wrote or resumed from
        self._source: Any = None  # the learner's weights as a WeightSource (publish)
        self._trainer: Any = None  # the trainer engine on every learner rank, where every rank sends

    @classmethod
    def from_config(cls, cfg: RunConfig, learner: Learner, rollout: Rollout, tokenizer: Any,
                    extra_sinks: Sequence[Sink], plan_source: PlanSource) -> Driver:
        """The loop for a run config: the task the spec names (builtin, or a dataset rendered with the
        model's chat template); a bad row or a reward that fails on the first rows stops the run here."""
        spec = cfg.spec
        t = spec.task
        reward = resolve_reward(t.reward, format_pattern=t.format_pattern, timeout_s=t.reward_timeout,
                                reward_model=t.reward_model)
        built = build_task(spec, tokenizer, model=spec.model.path)
        try_reward(reward, built.train)
        if t.tools or t.environment:  # multi-turn: the rollout runs trajectories (rlscale.trainer.tools)
            from rlscale.trainer.tools.setup import multi_turn

            rollout = multi_turn(spec, rollout, tokenizer, [*built.train, *built.eval], prompt_tokens)
        run_dir = Path(cfg.report_dir or ".")  # in pods: report/ on the checkpoint volume
        trackers = tracker_sinks(spec, run_dir, cfg.run)  # a tracker that cannot run stops the run here
        # Before the start eval: a reward stuck in C is killed by its timeout only in a worker process.
        reward.start_pool(t.reward_workers, t.reward_timeout_score)
        run_log = RunLog(run_dir, spec.target.value, spec.target.metric, cfg.run)
        metrics = RunMetrics()
        run_id = f"{cfg.namespace}/{cfg.run}" if cfg.namespace else str(cfg.run or "")
        return cls(spec=spec, plan=cfg.the_plan(), task=Task(built.train, built.eval, reward, t.max_new_tokens),
                   tokenizer=tokenizer, learner=learner, rollout=rollout, run_log=run_log,
                   # spec.export.hf first: its directory is written before the summary and the last report name it
                   sinks=[*export_sinks(cfg, learner, run_dir, notify=extra_sinks), run_log,
                          PrometheusSink(metrics, spec.target.value), *trackers, ClosesRewardPool(reward),
                          *extra_sinks], plan_source=plan_source,
                   ckpt_dir=Path(cfg.checkpoint_dir or run_dir / "checkpoints"), run_id=run_id, seed=cfg.seed,
                   metrics=metrics, cores=cfg.local.cores() if cfg.local else None)

    # ------------------------------------------------------------------ lifecycle

    def request_stop(self, *_: Any) -> None:
        self.stop_requested = True

    def resume_or_start(self) -> bool:
        """Load the newest checkpoint if there is one; returns True when resumed."""
        newest = checkpoint.latest_checkpoint(self.ckpt_dir)
        if newest is not None:
            checkpoint.check_identity(newest, self.run_id)
        state = self.learner.load_checkpoint(self.ckpt_dir)
        if state is None:
            self.state.run_id = self.run_id
            self.run_log.start_fresh(self.plan)
            return False
        self.state = RunState(**state)
        self.state.run_id = self.state.run_id or self.run_id
        self.data.load_state_dict(self.state.data)
        self.tracker.load_state_dict(self.state.tracker)
        _set_rng_state(self.state.rng)
        self.records, plan = self.run_log.resume(self.state.step)
        self.plan = plan or self.plan
        self.ahead = [Rollouts.from_state(r) for r in self.state.pending]
        self.drawn = self.state.step + len(self.ahead)
        self.resumed = True
        log.info("resumed from step %d (%d samples, weights v%d%s)", self.state.step, self.state.samples,
                 self.state.version, f", {len(self.ahead)} batches generated ahead" if self.ahead else "")
        return True

    def checkpoint(self) -> None:
        with self.rollout_lock:  # no batch half generated: the prompt iterator's state is after the pending ones
            self.state.data = self.data.state_dict()
            self.state.pending = [r.to_state() for r in self._pending()]
        self.state.tracker = self.tracker.state_dict()
        self.state.rng = _rng_state()
        t0 = time.perf_counter()
        self.learner.save_checkpoint(self.ckpt_dir, self.state.to_dict(), keep=self.spec.checkpoint.keep)
        # Reported to the operator (status.progress.checkpointSeconds): a pod's grace period
        # must cover one step plus this.
        self.checkpoint_seconds = time.perf_counter() - t0

    # ------------------------------------------------------------------ the loop

    def run(self) -> RunEnd:
        spec = self.spec
        for s in self.sinks:
            s.start(self.plan, self.state, self.resumed)
        # Replicas start from the model directory; the learner's weights are the truth (a resumed
        # run's differ), so publish them before the first request.
        self.publish()
        if not int(getattr(self.plan, "staleness", 0) or 0) and hasattr(self.rollout, "on_behind"):
            # Generating in step with training, the learner is idle whenever a request goes out: a replica that
            # joined or restarted since the last publish is caught up then instead of waiting for the next one.
            self.rollout.on_behind = self.publish
        start_eval = self._start_eval() if self.state.step == 0 and spec.target.eval_every else None
        try:
            end = self._loop(start_eval)
        finally:
            self._run_ahead(0)  # the batches generated ahead go into the last checkpoint; no thread outlives the loop
        if self.state.step != self._last_ckpt or end == RunEnd.INTERRUPTED:
            self.checkpoint()
        for s in self.sinks:
            s.end(end, self.records, self.tracker.reached)
        return end

    def _loop(self, start_eval: dict[str, float] | None) -> RunEnd:
        """Steps until the run ends: each trains, maybe evaluates, checkpoints every checkpoint.every
        steps and takes the plan source's change."""
        spec = self.spec
        self._last_ckpt = self.state.step
        self.drawn = max(self.drawn, self.state.step)
        while (end := self._end()) is None:
            self._run_ahead(int(getattr(self.plan, "staleness", 0) or 0))
            rec = self.step()
            if start_eval is not None:
                rec.eval_at_start, start_eval = start_eval, None
            if spec.target.eval_every and self.state.step % spec.target.eval_every == 0:
                self.evaluate(rec)
            self.finish_record(rec)
            if self.state.step - self._last_ckpt >= spec.checkpoint.every:
                self.checkpoint()
                self._last_ckpt = self.state.step
            self.apply(self.plan_source.after_step(self.plan, self.records))
        return end

    def _end(self) -> RunEnd | None:
        if self.tracker.reached:
            return RunEnd.TARGET
        if self.state.step >= self.spec.budget.max_steps or self.state.samples >= self.spec.budget.max_samples:
            return RunEnd.BUDGET
        return RunEnd.INTERRUPTED if self.stop_requested else None

    def _start_eval(self) -> dict[str, float]:
        """The starting score, on the same held-out split with the same reward: what the run improves
        on (start-up time, not on the run's clock)."""
        scores = self._eval_scores()
        log.info("held-out before training: eval/accuracy %.3f, eval/reward %.3f (%d prompts)",
                 scores["eval/accuracy"], scores["eval/reward"], len(self.task.eval))
        return scores

    def step(self) -> StepRecord:
        """Train on the next batch (generated now, or ahead by the pipeline) and publish the weights."""
        spec, st = self.spec, self.state
        self._observe()
        t0 = time.perf_counter()
        r, inline = self._next_batch()
        t2 = time.perf_counter()
        n = spec.batch.samples_per_prompt
        self._hand_to_learner()  # colocated: the engines give the accelerators to the learner (train phase)
        batch = RolloutBatch(prompt_ids=[ids for ids in r.prompt_ids for _ in range(n)],
                             response_ids=[s.token_ids for s in r.samples], rewards=r.rewards, samples_per_prompt=n,
                             rollout_logprobs=rollout_logprobs(r.samples),
                             truncated=[s.finish_reason == "length" for s in r.samples],
                             response_mask=response_masks(r.samples),
                             **(turn_credit_fields(r.samples) if spec.task.turn_credit == "rewardToGo" else {}))
        stats = self.learner.step(batch, lr=st.learning_rate)
        t3 = time.perf_counter()
        skipped = bool(stats.get("skipped"))
        staleness = st.version - r.version
        self.sync_bytes = 0
        self._hand_to_rollout()  # colocated: the weights awake for the update (sync phase)
        if not skipped:
            # The driver owns the weights version: a skipped step left the weights as they
            # were, and republishing them would make every replica reload the same bytes.
            with self.rollout_lock:
                st.version += 1
                self.publish()
        elif self._colocated():
            with self.rollout_lock:  # level 2 discarded the engines' weights: the same version goes in again
                self.publish()
        self._ready_to_generate()
        t4 = time.perf_counter()
        self._done(r)
        phases = {"generate": r.generate_s, "reward": r.reward_s, "train": t3 - t2, "sync": t4 - t3}
        if not inline:  # generated ahead: the step waited for it only as long as training did not cover it
            phases["wait"] = t2 - t0
        step_s = (r.seconds if inline else t2 - t0) + t4 - t2
        return self._record(r, batch, stats, phases, step_s, skipped, staleness)

    def produce(self) -> Rollouts:
        """The next batch: draw its prompts, generate and score them (the caller holds the rollout lock)."""
        spec, st = self.spec, self.state
        p, n = int(st.prompts), spec.batch.samples_per_prompt
        at = self.producing = Producing(self.drawn, st.version)
        engine_before = self._engine_seconds()
        t0 = time.perf_counter()
        problems = self.data.next_batch(p)
        prompt_ids = [prompt_tokens(self.tok, pr) for pr in problems]
        groups = self.rollout.generate(prompt_ids, n, **spec.rollout.sampling(),
                                       max_new_tokens=spec.task.max_new_tokens,
                                       seed=at.step * 7919 + 17 + self.seed * 1_000_003, version=at.version)
        t1 = time.perf_counter()
        engine_after = self._engine_seconds()
        engine_s = None if None in (engine_before, engine_after) else max(0.0, engine_after - engine_before)
        t1r = time.perf_counter()  # the metrics reads stay out of every phase
        samples = [s for g in groups for s in g]
        texts = decode_samples(self.tok, samples)
        finished = [s.finish_reason == "stop" for s in samples]
        rewards = self._score(problems, n, texts, finished, samples)
        generated, extra_s = samples, 0.0  # every sample of the batch, and further rounds' generate seconds
        if self.refill is not None:
            first = Round(problems, prompt_ids, samples, texts, finished, rewards)
            kept, generated, extra_s = self.refill(self, first, prompt_tokens)
            problems, prompt_ids, samples, texts, finished, rewards = kept.astuple()
        t2 = time.perf_counter()
        self.drawn += 1
        terms, timeouts = self.task.reward.tally.take(self.task.reward)
        return Rollouts(self.drawn, at.version, problems, prompt_ids, samples, texts, finished, rewards, generated,
                        generate_s=t1 - t0 + extra_s, reward_s=t2 - t1r - extra_s, engine_s=engine_s,
                        reward_terms=terms, reward_timeouts=timeouts)

    def _next_batch(self) -> tuple[Rollouts, bool]:
        """(the batch this step trains, whether it was generated now): the oldest generated ahead that is
        at most the plan's staleness old, else one generated now. An older one is dropped, never trained."""
        k = int(getattr(self.plan, "staleness", 0) or 0)
        while True:
            if self.ahead:
                r = self.ahead.pop(0)
            elif self.pipeline is not None:
                r = self.pipeline.take()
            else:
                with self.rollout_lock:
                    return self.produce(), True
            if self.state.version - r.version <= k:
                return r, False
            log.warning("batch %d was generated by weights v%d, %d versions ago (staleness %d at most): its %d "
                        "samples are dropped, not trained", r.index, r.version, self.state.version - r.version, k,
                        len(r.generated))
            self.state.samples += len(r.generated)
            self.state.stale_samples += len(r.generated)
            self._done(r)

    def _done(self, r: Rollouts) -> None:
        """Batch `r` is trained (its weights published) or dropped: the pipeline may generate further."""
        if self.pipeline is not None:
            self.pipeline.done(r.index)

    def _pending(self) -> list[Rollouts]:
        """The batches generated ahead and not yet trained, oldest first."""
        return list(self.ahead) + (self.pipeline.snapshot() if self.pipeline is not None else [])

    def _run_ahead(self, k: int) -> None:
        """Generate ahead as the plan's staleness `k` asks: start the pipeline, retune it, or stop it (the
        batches it generated stay, to be trained first)."""
        if k > 0 and self.pipeline is None:
            self.pipeline = Pipeline(self.produce, k, done=self.drawn - len(self.ahead), lock=self.rollout_lock,
                                     pending=self.ahead).start()
            self.ahead = []
            log.info("generating up to %d steps ahead of the learner (staleness %d)", k, k)
        elif self.pipeline is not None and k > 0:
            self.pipeline.set_staleness(k)
        elif self.pipeline is not None:
            self.ahead = self.pipeline.stop() + self.ahead
            self.pipeline = None

    def publish(self) -> None:
        """The learner's weights to every ready replica as the current version, through vLLM's weight transfer
        engines (rlscale.rollout.transfer); the log says how ("weights v3 by gloo to 2 replicas in 0.41 s")."""
        weights, trainer = self._weight_source()
        res = self.rollout.publish_weights(self.state.version, weights, **({"trainer": trainer} if trainer else {}))
        self.sync_bytes = int(getattr(res, "tensor_bytes", 0) or 0)
        if hasattr(res, "describe"):
            log.info(res.describe())

    def _weight_source(self) -> tuple[Any, Any]:
        """(what publish sends, the trainer engine's ranks or None): the learner's weights as a WeightSource,
        gathered at every publish on the device the backend sends from; every rank sends for ipc/shm on a
        learner of several ranks. A learner without a DeepSpeed engine (tests) gives its export."""
        if self._source is None:
            if getattr(self.learner, "engine", None) is None or not hasattr(self.learner, "iter_weights"):
                return self.learner.export_weights(), None
            from rlscale.rollout.transfer import ALL_RANK_BACKENDS
            from rlscale.trainer.transfer.sources import LearnerRanks, learner_source

            device = str(self.learner.device) if getattr(self.rollout, "weights_on_device", False) else "cpu"
            if getattr(self.rollout, "backend", "") in ALL_RANK_BACKENDS and self.learner.world_size > 1:
                self._trainer = LearnerRanks(self.learner, device)
                self._source = self._trainer.source
            else:
                self._source = learner_source(self.learner, device)
        return self._source, self._trainer

    def _colocated(self) -> bool:
        return getattr(self.plan, "placement", "disaggregated") == "colocated"

    def _hand_to_learner(self) -> None:
        """Colocated, before training: the engines sleep (level 2: their weights are replaced after the step
        anyway, so none is kept in host memory; level 1 under spec.lora, whose updates are adapters: the base
        goes to host memory and comes back), then the learner reloads the states it offloaded."""
        if not self._colocated():
            return
        lora = getattr(getattr(self, "spec", None), "lora", None)
        self.rollout.sleep(level=1 if lora is not None and not lora.modules_to_save else 2)
        reload = getattr(self.learner, "reload_states", None)
        if reload is not None:
            reload()

    def _hand_to_rollout(self) -> None:
        """Colocated, after training: the learner offloads its states and empties the allocator's cache, the
        engines wake their weights for the update (the KV cache waits until it has landed)."""
        if not self._colocated():
            return
        offload = getattr(self.learner, "offload_states", None)
        if offload is not None:
            offload()
        self.rollout.wake_up(["weights"])

    def _ready_to_generate(self) -> None:
        """Colocated: the KV cache back once the weights are in (after the publish, or a skipped step's none)."""
        if self._colocated():
            self.rollout.wake_up(["kv_cache"])

    def _score(self, problems: list[Problem], n: int, texts: list[str], finished: list[bool], samples=()) -> list:
        reward, t = self.task.reward, self.spec.task
        if reward.pool is None and reward.start_pool(t.reward_workers, t.reward_timeout_score):
            self.sinks.append(ClosesRewardPool(reward))  # worker processes, started once, end with the run
        try:
            scored = score_terms(reward, [pr.prompt for pr in problems for _ in range(n)], texts,
                                 [pr.answer for pr in problems for _ in range(n)], finished,
                                 [pr.extra for pr in problems for _ in range(n)])
        except RewardError as exc:  # before any update with it; a restart would meet the same reward
            raise PermanentRunError(str(exc)) from exc
        reward.tally.add(scored)  # each term's mean in the step record
        return add_env_rewards(scored.rewards, samples)

    def _record(self, r: Rollouts, batch: RolloutBatch, stats: dict, phases: dict[str, float], step_s: float,
                skipped: bool, staleness: int) -> StepRecord:
        """Count the step into the run state, and describe it."""
        st, samples = self.state, r.generated
        gen_tokens = sum(len(s.token_ids) for s in samples)
        st.step += 1
        st.samples += len(samples)
        st.generated_tokens_total += gen_tokens
        st.trained_tokens_total += batch.num_tokens
        st.elapsed_s += step_s
        compute, engine_s = stats.get("compute_seconds"), r.engine_s
        shown = ShownSample(r.problems[0].prompt[-300:], r.texts[0], r.problems[0].answer, r.rewards[0], r.finished[0])
        reward_terms, reward_timeouts = r.reward_terms, r.reward_timeouts
        return StepRecord(
            step=st.step, samples=st.samples, batch_samples=len(samples), prompts=int(st.prompts),
            samples_per_prompt=batch.samples_per_prompt, lr=st.learning_rate, phases=phases, step_seconds=step_s,
            samples_per_second=len(samples) / step_s if step_s > 0 else 0.0,
            reward_mean=float(np.mean(batch.rewards)) if batch.rewards else 0.0, generated_tokens=gen_tokens,
            trained_tokens=batch.num_tokens, generated_tokens_total=st.generated_tokens_total,
            trained_tokens_total=st.trained_tokens_total, weights_version=st.version, skipped=skipped,
            rollout_replicas=self._generating(), learner_replicas=self.plan.learner_replicas, cores=self.cores,
            predicted_step_seconds=self.plan.predicted.step_seconds, loss=stats.get("loss"),
            noise_scale=stats.get("noise_scale"), noise_grad_sq=stats.get("noise_grad_sq"),
            noise_trace=stats.get("noise_trace"), checkpoint_seconds=self.checkpoint_seconds,
            mixed_group_fraction=stats.get("mixed_group_fraction"), entropy=stats.get("entropy"),
            clip_fraction=stats.get("clip_fraction"), grad_norm=stats.get("grad_norm"),
            logprob_diff=stats.get("logprob_diff"), logprob_abs_diff=stats.get("logprob_abs_diff"),
            optimizer_steps=stats.get("optimizer_steps"), is_weight_mean=stats.get("is_weight_mean"),
            is_truncated_fraction=stats.get("is_truncated_fraction"),
            engine_generate_seconds=engine_s, train_compute_seconds=compute,
            overhead_seconds=None if compute is None or engine_s is None else max(0.0, step_s - compute - engine_s),
            target_metric=self.tracker.current, sample=shown, reward_terms=reward_terms,
            reward_timeouts=reward_timeouts, staleness=staleness, stale_samples=st.stale_samples,
            tools=tool_metrics(samples),
            sync_bytes=getattr(self, "sync_bytes", 0))

    def _generating(self) -> int:
        """The replicas this step generates with: those running when it started (fewer than asked for
        while Serve waits for `rollout` resources), so what it measures is keyed by what it ran."""
        return max(1, int(self.serving.running)) if self.serving is not None else int(self.state.rollout_replicas)

    def _observe(self, scaled: bool = False) -> None:
        """Read the rollout's replicas; the sinks hear of a change (the pod's report goes at once when
        the driver has just `scaled`)."""
        try:
            now = self.rollout.serving()
        except Exception as exc:  # what serves is reported; reading it never fails a step
            log.warning("reading the rollout's replicas failed: %s", exc)
            return
        if scaled or now != self.serving:
            self.serving = now
            for s in self.sinks:
                s.rollout_changed(now, scaled)

    def _engine_seconds(self) -> float | None:
        """Engine seconds spent generating so far (read around a step's generation, outside its timing)."""
        if self._generating() != 1:
            return None  # the metrics come from one replica; with more the sum is not exact
        try:
            return self.rollout.generation_seconds_total()
        except Exception:  # metrics are for reporting; never fail a step over them
            return None

    def _eval_scores(self) -> dict[str, float]:
        with self.rollout_lock:  # the weights as trained so far, not while a batch ahead is generated
            return evaluate_task(self.rollout, self.tok, list(self.task.eval), self.task.reward,
                                 self.task.max_new_tokens, self.state.version)

    def evaluate(self, rec: StepRecord) -> float:
        """The target metric on the held-out split, greedy, through the rollout replicas (the policy as it is now)."""
        t0 = time.perf_counter()
        scores = self._eval_scores()
        rec.eval_seconds = time.perf_counter() - t0
        self.state.elapsed_s += rec.eval_seconds
        value = scores[self.spec.target.metric]
        rec.eval, rec.eval_accuracy, rec.eval_reward = value, scores["eval/accuracy"], scores["eval/reward"]
        rec.target_metric = self.tracker.add(self.state.step, self.state.samples, self.state.elapsed_s, value)
        return value

    def finish_record(self, rec: StepRecord) -> None:
        """The run-level figures as of this step, then the record to every sink."""
        rec.wall_seconds = self.state.elapsed_s
        rec.time = time.time()  # when the step (and its eval) ended, for wall-clock rates across records
        # The noise scale a planner should use: averaged over a window, None while the
        # gradient is lost in its noise (the per-step EMA in noise_scale swings by 100x).
        rec.noise_scale_window = noise_from_steps([*self.records[-(NOISE_WINDOW - 1):], rec])
        if self.tracker.reached_at:
            rec.time_to_target_seconds = self.tracker.reached_at["seconds"]
            rec.samples_to_target = self.tracker.reached_at["samples"]
        recent = [r.samples_per_second for r in self.records[-20:]] + [rec.samples_per_second]
        # One step's rate swings by +-50% on a busy machine; the re-planner reads medians.
        rec.samples_per_second_recent = float(np.median(recent))
        rec.eta_seconds = self.tracker.eta_seconds(rec.samples_per_second_recent)
        self.records.append(rec)
        for s in self.sinks:
            s.record(rec, self.records)

    def apply(self, change: PlanChange | None) -> None:
        """Take a plan change between steps: replicas, batch and learning rate (a new prediction alone
        only updates what predicted-vs-measured compares with). Fewer replicas: Serve's removed replicas
        drain before this returns, and the sinks hear of it at once (in a pod the operator then removes
        exactly their pods). More: training goes on with the replicas that run, and grows as Serve
        places the others; pods that never come stop nothing."""
        if change is None:
            return
        new, st = change.plan, self.state
        scaled = change.why is not None and new.rollout_replicas != st.rollout_replicas
        if scaled:
            with self.rollout_lock:
                self.rollout.scale(new.rollout_replicas)
        if change.why is not None:
            st.prompts, st.rollout_replicas, st.learning_rate = new.prompts, new.rollout_replicas, new.learning_rate
        self.plan = new
        for s in self.sinks:
            s.plan_changed(new, st.step, change.why)
        if scaled:
            self._observe(scaled=True)
            if self.serving is not None and self.serving.running < new.rollout_replicas:
                log.info("rollout: %d of %d replicas run; training goes on with them while Serve places the rest",
                         self.serving.running, new.rollout_replicas)


def rollout_logprobs(samples) -> list[list[float]] | None:
    """The sampler's per-token logprobs, or None when any sample came back without them."""
    logprobs = [s.logprobs for s in samples]
    return None if any(lp is None for lp in logprobs) else [list(map(float, lp)) for lp in logprobs]


def prompt_tokens(tok, problem: Problem) -> list[int]:
    """The prompt's tokens: as the task rendered them (chat template), else the tokenizer's encoding."""
    return list(problem.prompt_ids) if problem.prompt_ids is not None else tok(problem.prompt).input_ids


def evaluate_task(rollout: Rollout, tok, problems: list[Problem], reward: Reward, max_new_tokens: int,
                  version: int) -> dict[str, float]:
    """Greedy decoding of the held-out problems, scored by the run's reward: eval/accuracy (the share
    whose reward is 1 or more) and eval/reward (the mean reward)."""
    ids = [prompt_tokens(tok, p) for p in problems]
    groups = rollout.generate(ids, 1, temperature=0.0, top_p=1.0, max_new_tokens=max_new_tokens, version=version)
    outs = [g[0] for g in groups]
    texts = decode_samples(tok, outs)
    rewards = add_env_rewards(score(reward, [p.prompt for p in problems], texts, [p.answer for p in problems],
                                    [o.finish_reason == "stop" for o in outs], [p.extra for p in problems]), outs)
    n = max(1, len(problems))
    return {"eval/accuracy": sum(r >= 1.0 for r in rewards) / n, "eval/reward": float(sum(rewards)) / n}


class PermanentRunError(RuntimeError):
    """Raised where the run cannot go on whatever is restarted (bad data, a broken reward)."""


def permanent(exc: BaseException) -> bool:
    """An error a restart would meet again: the run fails at once (see run_env.report_failure)."""
    from rlscale.spec import SpecError

    return isinstance(exc, (ImportError, SpecError, PermanentRunError, checkpoint.CheckpointError))
