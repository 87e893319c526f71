"""The driver (learner rank 0): draw prompts, roll out, reward, learn, publish weights, measure, re-plan."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlscale.kube_report import (
    OUTCOME_BUDGET_EXHAUSTED,
    OUTCOME_SUCCEEDED,
    KubeTarget,
    ProgressReporter,
    progress_body,
)
from rlscale.metrics_names import DIAGNOSTIC_KEYS
from rlscale.plan import Calibration, make_plan
from rlscale.plan.calibration import noise_from_steps
from rlscale.progress import TargetTracker
from rlscale.report import read_jsonl, write_report
from rlscale.roles import EXIT_BUDGET, EXIT_INTERRUPTED, EXIT_TARGET, ray_auth_env
from rlscale.run_metrics import RunMetrics
from rlscale.runconfig import ENV_CONFIG, RunConfig, load_run_config
from rlscale.trainer import checkpoint
from rlscale.trainer.batching import RolloutBatch
from rlscale.trainer.data import build_task, try_reward
from rlscale.trainer.replan import (
    NOISE_WINDOW,
    REPLAN_CONFIRM,
    REPLAN_EVERY,
    REPLAN_MIN_GAIN,
    REPLAN_WARMUP_STEPS,
    ReplanGate,
    choose_config,
    find_config,
    measured_throughput,
)
from rlscale.trainer.rewards import Reward, RewardError, resolve_reward, score
from rlscale.trainer.tasks import Problem, PromptIterator

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


class Driver:
    """One run's loop on rank 0, around a learner (DeepSpeed ranks) and a rollout client (Serve replicas)."""

    seed = 0  # extra.seed; a class default so a Driver built without __init__ (tests) samples as before

    def __init__(self, cfg: RunConfig, learner, rollout, tokenizer):
        self.cfg = cfg
        self.spec = cfg.parsed_spec()
        self.learner = learner
        self.rollout = rollout
        self.tok = tokenizer
        self.run_dir = Path(cfg.report_dir or ".")
        self.run_dir.mkdir(parents=True, exist_ok=True)  # in pods: report/ on the checkpoint volume
        self.ckpt_dir = Path(cfg.checkpoint_dir or self.run_dir / "checkpoints")
        self.metrics = RunMetrics()
        self.stop_requested = False
        self.checkpoint_seconds: float | None = None
        t = self.spec.task
        # The task the spec names (builtin, or a dataset rendered with the model's chat template);
        # a bad row or a reward that fails on the first rows stops the run here, before any step.
        self.reward_fn = resolve_reward(t.reward, format_pattern=t.format_pattern, timeout_s=t.reward_timeout)
        self.task = build_task(self.spec, tokenizer, model=self.spec.model.path)
        try_reward(self.reward_fn, self.task.train)
        # extra.seed (rlscale sweep --seeds) moves the prompt order and the sampling seeds; 0 keeps the defaults.
        self.seed = int((cfg.extra or {}).get("seed", 0))
        self.data = PromptIterator(self.task.train, seed=1 + self.seed)
        self.tracker = TargetTracker(self.spec.target.value, self.spec.target.window)
        self.plan = dict(cfg.plan)
        self.state = RunState(prompts=self.plan["prompts"], learning_rate=self.plan["learningRate"],
                              rollout_replicas=self.plan["rolloutReplicas"])
        self.records: list[dict[str, Any]] = []
        self._gate = ReplanGate(REPLAN_CONFIRM)
        # Locally the driver re-plans itself; on Kubernetes the operator re-plans and the
        # driver follows the mounted run config, so there is one planner per run.
        self.local = bool((cfg.extra or {}).get("local"))
        target = None if self.local else KubeTarget.in_cluster(cfg.run, cfg.namespace)
        self.reporter = ProgressReporter(target) if target else None
        self._config_path = os.environ.get(ENV_CONFIG)
        self._config_stamp = self._stamp()

    # ------------------------------------------------------------------ lifecycle

    def request_stop(self, *_: Any) -> None:
        self.stop_requested = True

    @property
    def run_id(self) -> str:
        return f"{self.cfg.namespace}/{self.cfg.run}" if self.cfg.namespace else str(self.cfg.run or "")

    def resume_or_start(self) -> bool:
        """Load the newest checkpoint if there is one; returns True when resumed."""
        newest = checkpoint.latest_checkpoint(self.ckpt_dir)
        if newest is not None:
            checkpoint.check_identity(newest, self.run_id)
        state = self.learner.load_checkpoint(self.ckpt_dir)
        if state is None:
            self.state.run_id = self.run_id
            self._write_plans([{**self.plan, "atStep": 0}], append=False)
            metrics = self.run_dir / "metrics.jsonl"
            if metrics.exists():
                # A run without a checkpoint starts its log afresh; the old one is kept beside it.
                os.replace(metrics, self.run_dir / f"metrics.{time.strftime('%Y%m%dT%H%M%S')}.jsonl")
            return False
        self.state = RunState(**state)
        self.state.run_id = self.state.run_id or self.run_id
        self.data.load_state_dict(self.state.data)
        self.tracker.load_state_dict(self.state.tracker)
        _set_rng_state(self.state.rng)
        # Steps after the checkpoint are redone: move them out of the log so it stays one
        # history (into metrics.redone.jsonl: nothing measured is thrown away).
        logged = read_jsonl(self.run_dir / "metrics.jsonl")
        kept = [r for r in logged if r["step"] <= self.state.step]
        redone = [r for r in logged if r["step"] > self.state.step]
        if redone:
            with open(self.run_dir / "metrics.redone.jsonl", "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in redone)
        self._rewrite_metrics(kept)
        self.records = kept
        self.metrics.restore_totals({"step": self.state.step, "samples": self.state.samples,
                                     "generated_tokens_total": self.state.generated_tokens_total,
                                     "trained_tokens_total": self.state.trained_tokens_total})
        if self.tracker.reached_at:
            self.metrics.ttt.set(self.tracker.reached_at["seconds"])
            self.metrics.stt.set(self.tracker.reached_at["samples"])
        plans = self._read_plans()
        if plans:
            self.plan = {k: v for k, v in plans[-1].items() if k not in ("atStep", "why")}
        log.info("resumed from step %d (%d samples, weights v%d)",
                 self.state.step, self.state.samples, self.state.version)
        return True

    def checkpoint(self) -> None:
        self.state.data = self.data.state_dict()
        self.state.tracker = self.tracker.state_dict()
        self.state.rng = _rng_state()
        t0 = time.perf_counter()
        self.learner.save_checkpoint(self.ckpt_dir, self.state.to_dict(), keep=self.spec.checkpoint.keep)
        # Reported to the operator (status.progress.checkpointSeconds): a pod's grace period
        # must cover one step plus this.
        self.checkpoint_seconds = time.perf_counter() - t0

    # ------------------------------------------------------------------ the loop

    def run(self) -> int:
        spec = self.spec
        self.metrics.target_value.set(spec.target.value)
        self.metrics.set_plan(self.plan)
        # Replicas start from the model directory; the learner's weights are the truth (a resumed
        # run's differ), so publish them before the first request.
        self.rollout.publish_weights(self.state.version, self.learner.export_weights())
        self.metrics.version.set(self.state.version)
        start_eval = None
        if self.state.step == 0 and spec.target.eval_every:
            # The starting score, on the same held-out split with the same reward: what the run
            # improves on (start-up time, not on the run's clock).
            start_eval = evaluate_task(self.rollout, self.tok, self.task.eval, self.reward_fn, spec.task.max_new_tokens,
                                       self.state.version)
            log.info("held-out before training: eval/accuracy %.3f, eval/reward %.3f (%d prompts)",
                     start_eval["eval/accuracy"], start_eval["eval/reward"], len(self.task.eval))
        code = EXIT_BUDGET
        last_ckpt = self.state.step
        while True:
            if self.tracker.reached:
                code = EXIT_TARGET
                break
            if self.state.step >= spec.budget.max_steps or self.state.samples >= spec.budget.max_samples:
                code = EXIT_BUDGET
                break
            if self.stop_requested:
                code = EXIT_INTERRUPTED
                break
            rec = self.step()
            if start_eval is not None:
                rec["eval_at_start"], start_eval = start_eval, None
            if spec.target.eval_every and self.state.step % spec.target.eval_every == 0:
                self.evaluate(rec)
            self._finish_record(rec)
            if self.state.step - last_ckpt >= spec.checkpoint.every:
                self.checkpoint()
                last_ckpt = self.state.step
            if self.local and (self.cfg.extra or {}).get("replan", True):
                self.maybe_replan()
            else:
                self.follow_config()
        if self.state.step != last_ckpt or code == EXIT_INTERRUPTED:
            self.checkpoint()
        try:
            write_report(self.run_dir, spec.target.value, spec.target.metric, self.cfg.run)
        except Exception:  # the run and its metrics.jsonl stand; its ending must still be reported
            log.exception("writing the report in %s failed", self.run_dir)
        if self.reporter and self.records:
            outcome = {EXIT_TARGET: OUTCOME_SUCCEEDED, EXIT_BUDGET: OUTCOME_BUDGET_EXHAUSTED}.get(code)
            self.reporter.report(progress_body(self.records[-1], target_reached=self.tracker.reached, outcome=outcome,
                                               report=self._report_location()), force=True)
        return code

    def _report_location(self) -> str:
        """Where the report lives, as a person finds it: this pod's volume and the path in it."""
        pod = os.environ.get("POD_NAME")
        return f"{self.run_dir.resolve()} on {pod}" if pod else str(self.run_dir.resolve())

    def step(self) -> dict[str, Any]:
        spec, st = self.spec, self.state
        p, n = int(st.prompts), spec.batch.samples_per_prompt
        engine_before = self._engine_seconds()
        t0 = time.perf_counter()
        problems = self.data.next_batch(p)
        prompt_ids = [prompt_tokens(self.tok, pr) for pr in problems]
        groups = self.rollout.generate(prompt_ids, n, temperature=spec.rollout.temperature, top_p=spec.rollout.top_p,
                                       max_new_tokens=spec.task.max_new_tokens,
                                       seed=st.step * 7919 + 17 + self.seed * 1_000_003, version=st.version)
        t1 = time.perf_counter()
        engine_after = self._engine_seconds()
        engine_s = None if None in (engine_before, engine_after) else max(0.0, engine_after - engine_before)
        t1r = time.perf_counter()  # the metrics reads stay out of every phase
        samples = [s for g in groups for s in g]
        texts = self.tok.batch_decode([s.token_ids for s in samples], skip_special_tokens=True)
        finished = [s.finish_reason == "stop" for s in samples]
        try:
            rewards = score(self.reward_fn, [pr.prompt for pr in problems for _ in range(n)], texts,
                            [pr.answer for pr in problems for _ in range(n)], finished,
                            [pr.extra for pr in problems for _ in range(n)])
        except RewardError as exc:  # before any update with it; a restart would meet the same reward
            raise PermanentRunError(str(exc)) from exc
        t2 = time.perf_counter()
        batch = RolloutBatch(
            prompt_ids=[ids for ids in prompt_ids for _ in range(n)],
            response_ids=[s.token_ids for s in samples],
            rewards=rewards,
            samples_per_prompt=n,
            rollout_logprobs=rollout_logprobs(samples),
        )
        stats = self.learner.step(batch, lr=st.learning_rate)
        t3 = time.perf_counter()
        skipped = bool(stats.get("skipped"))
        if not skipped:
            # The driver owns the weights version: a skipped step left the weights as they
            # were, and republishing them would make every replica reload the same bytes.
            st.version += 1
            self.rollout.publish_weights(st.version, self.learner.export_weights())
        t4 = time.perf_counter()
        gen_tokens = sum(len(s.token_ids) for s in samples)
        trained_tokens = batch.num_tokens
        st.step += 1
        st.samples += len(samples)
        st.generated_tokens_total += gen_tokens
        st.trained_tokens_total += trained_tokens
        phases = {"generate": t1 - t0, "reward": t2 - t1r, "train": t3 - t2, "sync": t4 - t3}
        step_s = t4 - t0 - (t1r - t1)
        st.elapsed_s += step_s
        compute = stats.get("compute_seconds")
        return {
            "step": st.step, "samples": st.samples, "batch_samples": len(samples), "prompts": p,
            "samples_per_prompt": n, "lr": st.learning_rate, "phases": phases, "step_seconds": step_s,
            "samples_per_second": len(samples) / step_s if step_s > 0 else 0.0,
            "reward_mean": float(np.mean(rewards)) if rewards else 0.0,
            "generated_tokens": gen_tokens, "trained_tokens": trained_tokens,
            "generated_tokens_total": st.generated_tokens_total, "trained_tokens_total": st.trained_tokens_total,
            "weights_version": st.version, "skipped": skipped, "noise_scale": stats.get("noise_scale"),
            "checkpoint_seconds": self.checkpoint_seconds,
            "noise_grad_sq": stats.get("noise_grad_sq"), "noise_trace": stats.get("noise_trace"),
            "loss": stats.get("loss"),
            # What a run that does not learn is read by first (rlscale.metrics_names.DIAGNOSTICS).
            **{k: stats.get(k) for k in DIAGNOSTIC_KEYS},
            "rollout_replicas": st.rollout_replicas, "learner_replicas": self.plan["learnerReplicas"],
            "predicted_step_seconds": self.plan["predicted"]["stepSeconds"],
            # What the loop adds on top of the model's own work: serving calls, publishing, DeepSpeed.
            "engine_generate_seconds": engine_s, "train_compute_seconds": compute,
            "overhead_seconds": None if compute is None or engine_s is None else max(0.0, step_s - compute - engine_s),
            "eval": None, "target_metric": self.tracker.current,
            # One generation and its reward per step, as a person checks what the model says.
            "sample": {"prompt": problems[0].prompt[-300:], "completion": texts[0], "answer": problems[0].answer,
                       "reward": rewards[0], "finished": finished[0]},
        }

    def _engine_seconds(self) -> float | None:
        """Engine seconds spent generating so far (read around a step's generation, outside its timing)."""
        if self.state.rollout_replicas != 1:
            return None  # the metrics come from one replica; with more the sum is not exact
        try:
            return self.rollout.generation_seconds_total()
        except Exception:  # metrics are for reporting; never fail a step over them
            return None

    def evaluate(self, rec: dict[str, Any]) -> float:
        """The target metric on the held-out split, greedy, through the rollout replicas (the policy as it is now)."""
        t0 = time.perf_counter()
        scores = evaluate_task(self.rollout, self.tok, self.task.eval, self.reward_fn, self.spec.task.max_new_tokens,
                               self.state.version)
        rec["eval_seconds"] = time.perf_counter() - t0
        self.state.elapsed_s += rec["eval_seconds"]
        value = scores[self.spec.target.metric]
        rec["eval"] = value
        rec["eval_accuracy"], rec["eval_reward"] = scores["eval/accuracy"], scores["eval/reward"]
        rec["target_metric"] = self.tracker.add(self.state.step, self.state.samples, self.state.elapsed_s, value)
        return value

    def _finish_record(self, rec: dict[str, Any]) -> None:
        rec["wall_seconds"] = self.state.elapsed_s
        rec["time"] = time.time()  # when the step (and its eval) ended, for wall-clock rates across records
        # The noise scale a planner should use: averaged over a window, None while the
        # gradient is lost in its noise (the per-step EMA in noise_scale swings by 100x).
        rec["noise_scale_window"] = noise_from_steps([*self.records[-(NOISE_WINDOW - 1):], rec])
        if self.tracker.reached_at:
            rec["time_to_target_seconds"] = self.tracker.reached_at["seconds"]
            rec["samples_to_target"] = self.tracker.reached_at["samples"]
        recent = [r["samples_per_second"] for r in self.records[-20:]] + [rec["samples_per_second"]]
        # One step's rate swings by +-50% on a busy machine; the operator's drift check reads this.
        rec["samples_per_second_recent"] = float(np.median(recent))
        rec["eta_seconds"] = self.tracker.eta_seconds(rec["samples_per_second_recent"])
        self.records.append(rec)
        self.metrics.observe_step(rec)
        with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        if self.reporter:
            self.reporter.report(progress_body(rec, target_reached=self.tracker.reached))

    # ------------------------------------------------------------------ re-planning

    def maybe_replan(self) -> None:
        """Recalibrate from measured steps; apply a new choice between steps when it is clearly better."""
        st = self.state
        if st.step < REPLAN_WARMUP_STEPS or st.step % REPLAN_EVERY:
            return
        recent = self.records[-max(REPLAN_EVERY, NOISE_WINDOW):]
        cal = Calibration.from_steps(recent, noise_last=NOISE_WINDOW)
        new = make_plan(self.spec, cal).to_dict()
        # Learner ranks are fixed for the life of the processes: choose among candidates that keep them.
        learners = int(self.cfg.plan["learnerReplicas"])
        cands = [c for c in new.get("candidates", []) if c["learnerReplicas"] == learners]
        if not cands:
            return
        measured = measured_throughput(self.records)
        best, best_t, cur_t = choose_config(cands, measured, (st.prompts, st.rollout_replicas))
        cur = find_config(cands, (st.prompts, st.rollout_replicas))
        key = (best["prompts"], best["rolloutReplicas"])
        better = key != (st.prompts, st.rollout_replicas) and best_t < (1 - REPLAN_MIN_GAIN) * cur_t
        confirmed = self._gate.propose(key if better else None)
        if better and not confirmed:
            log.info("re-plan: %dx%d looks %.0f%% faster at step %d; applied if the next re-plan agrees",
                     best["prompts"], best["samplesPerPrompt"], 100 * (1 - best_t / cur_t), st.step)
        if confirmed:
            chosen = ("prompts", "samplesPerPrompt", "batch", "rolloutReplicas", "learnerReplicas", "learningRate",
                      "predicted")
            new = {**new, **{k: best[k] for k in chosen}}
            basis = "measured" if (best["prompts"], best["rolloutReplicas"]) in measured else "predicted"
            why = (f"calibrated at step {st.step}: {new['prompts']}x{new['samplesPerPrompt']} with "
                   f"{new['rolloutReplicas']} rollout {basis} at {best_t:.0f}s "
                   f"to target vs {cur_t:.0f}s for {st.prompts}x{new['samplesPerPrompt']}, "
                   f"in {REPLAN_CONFIRM} re-plans in a row; noise scale {cal.noise_scale or 0:.0f} samples over the "
                   f"last {min(NOISE_WINDOW, len(recent))} steps")
            log.info("re-plan: %s", why)
            self._apply_plan(new, why)
        elif cur is not None:
            # Same choice: keep the recalibrated prediction so predicted-vs-measured is honest.
            self.plan = {**self.plan, "predicted": cur["predicted"], "calibrated": True}
            self.metrics.predicted_step.set(cur["predicted"]["stepSeconds"])

    def _stamp(self) -> tuple | None:
        try:
            st = os.stat(self._config_path) if self._config_path else None
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_ino, st.st_size) if st else None

    def follow_config(self) -> None:
        """Apply a plan the operator wrote into the mounted run config (it re-plans on drift or spec change)."""
        stamp = self._stamp()
        if stamp is None or stamp == self._config_stamp:
            return
        self._config_stamp = stamp
        try:
            new = load_run_config(self._config_path).plan
        except Exception as exc:  # a half-updated mount: try again next step
            log.warning("run config re-read failed: %s", exc)
            return
        st = self.state
        if (new["prompts"], new["rolloutReplicas"], new["learningRate"]) == \
                (st.prompts, st.rollout_replicas, st.learning_rate):
            return
        self._apply_plan(new, "the operator re-planned")
        log.info("following the operator's plan from step %d: %s", st.step, new.get("reason", ""))

    def _apply_plan(self, new: dict[str, Any], why: str) -> None:
        """Switch to a new plan between steps: replicas, batch and learning rate, logged in plan.json."""
        st = self.state
        if new["rolloutReplicas"] != st.rollout_replicas:
            self.rollout.scale(new["rolloutReplicas"])
        st.prompts, st.rollout_replicas, st.learning_rate = new["prompts"], new["rolloutReplicas"], new["learningRate"]
        self.plan = new
        self.metrics.set_plan(new)
        self._write_plans([{**new, "atStep": st.step, "why": why}], append=True)

    def _read_plans(self) -> list[dict]:
        p = self.run_dir / "plan.json"
        return json.loads(p.read_text())["plans"] if p.exists() else []

    def _write_plans(self, plans: list[dict], append: bool) -> None:
        allp = (self._read_plans() if append else []) + plans
        tmp = self.run_dir / "plan.json.tmp"
        tmp.write_text(json.dumps({"plans": allp}, indent=2))
        os.replace(tmp, self.run_dir / "plan.json")

    def _rewrite_metrics(self, recs: list[dict]) -> None:
        tmp = self.run_dir / "metrics.jsonl.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in recs))
        os.replace(tmp, self.run_dir / "metrics.jsonl")


def rollout_logprobs(samples) -> list[list[float]] | None:
    """The sampler's per-token logprobs, or None when any sample came back without them."""
    logprobs = [s.logprobs for s in samples]
    return None if any(lp is None for lp in logprobs) else [list(map(float, lp)) for lp in logprobs]


def prompt_tokens(tok, problem: Problem) -> list[int]:
    """The prompt's tokens: as the task rendered them (chat template), else the tokenizer's encoding."""
    return list(problem.prompt_ids) if problem.prompt_ids is not None else tok(problem.prompt).input_ids


def evaluate_task(rollout, tok, problems: list[Problem], reward: Reward, max_new_tokens: int,
                  version: int) -> dict[str, float]:
    """Greedy decoding of the held-out problems, scored by the run's reward: eval/accuracy (the share
    whose reward is 1 or more) and eval/reward (the mean reward)."""
    ids = [prompt_tokens(tok, p) for p in problems]
    groups = rollout.generate(ids, 1, temperature=0.0, top_p=1.0, max_new_tokens=max_new_tokens, version=version)
    outs = [g[0] for g in groups]
    texts = tok.batch_decode([o.token_ids for o in outs], skip_special_tokens=True)
    rewards = score(reward, [p.prompt for p in problems], texts, [p.answer for p in problems],
                    [o.finish_reason == "stop" for o in outs], [p.extra for p in problems])
    n = max(1, len(problems))
    return {"eval/accuracy": sum(r >= 1.0 for r in rewards) / n, "eval/reward": float(sum(rewards)) / n}


def permanent(exc: BaseException) -> bool:
    """An error a restart would meet again: the run fails at once (see report_failure)."""
    from rlscale.spec import SpecError

    return isinstance(exc, (ImportError, SpecError, PermanentRunError, checkpoint.CheckpointError))


class PermanentRunError(RuntimeError):
    """Raised where the run cannot go on whatever is restarted (bad data, a broken reward)."""


def report_failure(exc: BaseException, last_record: dict[str, Any] | None = None) -> bool:
    """Tell the operator why rank 0 stops (in a pod; elsewhere a no-op). Returns True if sent."""
    from rlscale.kube_report import failure_body

    target = KubeTarget.in_cluster()
    if target is None:
        return False
    message = f"{type(exc).__name__}: {exc}"
    body = failure_body(last_record, message, permanent=permanent(exc))
    return ProgressReporter(target).report(body, force=True)


def wait_for_termination() -> None:
    """Block until SIGTERM or SIGINT (the kubelet's stop)."""
    import threading

    from rlscale.trainer.gang import stop_head_watches

    log.info("run finished; waiting to be scaled to zero")
    stop_head_watches()
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()


def install_stop_handlers(driver: Driver) -> None:
    """SIGTERM/SIGINT: finish the current step, checkpoint, exit 130."""
    signal.signal(signal.SIGTERM, driver.request_stop)
    signal.signal(signal.SIGINT, driver.request_stop)


def connect_rollout(cfg: RunConfig):
    """Join the run's Ray cluster and deploy its rollout replicas; returns once they serve."""
    os.environ.update(ray_auth_env())  # read by Ray at import
    import ray

    from rlscale.rollout.engine import EngineConfig
    from rlscale.rollout.serve import RolloutClient, RolloutOptions

    spec = cfg.parsed_spec()
    extra = cfg.extra or {}
    ray.init(address=cfg.ray_address, namespace=f"rlscale-{cfg.run}", log_to_driver=False,
             logging_level=logging.WARNING)
    engine = EngineConfig(model=str(cfg.model_dir), dtype=spec.model.dtype, max_model_len=spec.model.max_length,
                          seed=int(extra.get("seed", 0)))
    if extra.get("rolloutCpuThreads"):
        # The local runner knows how many cores each replica may use; a pod keeps the default.
        engine.cpu_threads = int(extra["rolloutCpuThreads"])
    on_gpu = spec.hardware.accelerator != "cpu"
    # extra.rolloutApp: a rollout app kept across runs (rlscale sweep's shared nodes); a run
    # attaches to its replicas when the engine settings match, and replaces their weights.
    kept = extra.get("rolloutApp")
    return RolloutClient.deploy(engine, RolloutOptions(
        app_name=kept or f"rollout-{cfg.run}", num_replicas=int(cfg.plan["rolloutReplicas"]), keep=bool(kept),
        # In pods each replica serves /metrics on the port its pod declares; locally none.
        metrics_port=None if extra.get("local") else cfg.metrics_port,
        num_gpus=float(spec.rollout.gpus_per_replica) if on_gpu else 0.0))


def drive(cfg: RunConfig, learner, client=None) -> int:
    """Rank 0's whole job: connect to the run's Ray cluster, deploy rollout, run the loop, clean up.

    `client`: a RolloutClient from connect_rollout, when rank 0 deployed it beside the learner's start-up.
    """
    os.environ.update(ray_auth_env())  # read by Ray at import
    import ray
    from transformers import AutoTokenizer

    extra = cfg.extra or {}
    tok = AutoTokenizer.from_pretrained(cfg.model_dir, local_files_only=True)
    if client is None:
        client = connect_rollout(cfg)
    driver = Driver(cfg, learner, client, tok)
    pids = sorted(i.get("pid") for i in client.replicas().values())
    log.info("rollout app %s: %s, replica pids %s", client.options.app_name,
             "attached to its running replicas (kept from an earlier run)" if client.attached else "deployed", pids)
    driver.resume_or_start()
    if client.published_version is not None and client.published_version >= driver.state.version:
        # The Ray cluster outlived an earlier driver: versions only move forward.
        driver.state.version = client.published_version + 1
    install_stop_handlers(driver)
    server = driver.metrics.serve(cfg.metrics_port, addr="127.0.0.1" if extra.get("local") else "0.0.0.0")
    try:
        code = driver.run()
        linger = float(extra.get("lingerSeconds") or 0)
        if linger > 0:
            time.sleep(linger)  # a scraper's last look at the final values
        if not extra.get("local") and code in (EXIT_TARGET, EXIT_BUDGET):
            # The run has ended. Exiting would make the StatefulSet start it again; the operator
            # scales the run to zero instead. Free the replicas and the other ranks now, and keep
            # /metrics up (the final values) until the kubelet's SIGTERM.
            client.shutdown()
            learner.shutdown()
            wait_for_termination()
    finally:
        try:
            if not extra.get("local"):
                client.shutdown()
            # Locally the runner kills the run's whole Ray cluster next: deleting the Serve app
            # first (the replica's graceful stop, the engine's teardown) only delayed that.
        finally:
            ray.shutdown()
            if server is not None and isinstance(server, tuple):
                server[0].shutdown()
    return code
