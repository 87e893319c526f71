"""A reward model served by Ray Serve: a Hugging Face sequence-classification model that scores (prompt, completion)
pairs in batches (task.rewardModel; the driver's reward calls it through trainer/reward_model.py).

A pair is encoded as the tokenizer encodes a text pair (BERT-style tokenizers put a separator between the two,
decoder tokenizers join them), padded on the right, cut to `max_length` tokens by dropping tokens from the start of
the longer of the two. The score is the head's logit with one label, and logit[1] - logit[0] (the log-odds of label
1) with two; a model with more labels is refused. The replicas ask Ray for no CPU and no `rollout` slot: they are
pinned to one node by its `ray.io/node-id` label (the driver's), so they load the model from the paths the driver
sees and share that node's cores while the rollout and the learner wait for the rewards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEPLOYMENT_NAME = "RewardModelReplica"
NODE_LABEL = "ray.io/node-id"  # every Ray node carries its id as this label
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "spiece.model",
                   "tokenizer.model")
DEFAULT_MAX_LENGTH = 512  # a config that names no position limit


def config_problem(model_dir: str | Path) -> str | None:
    """Why `model_dir` cannot serve as a reward model, read from its files alone (no torch), or None."""
    d = Path(model_dir)
    try:
        config = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        return f"has no readable config.json ({exc.__class__.__name__})"
    archs = config.get("architectures") or []
    if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
        return (f"holds a {', '.join(archs)}, not a sequence-classification model (its score head would be "
                "random weights)")
    labels = num_labels(config)
    if labels not in (1, 2):
        return f"has a head of {labels} labels; a reward model has 1 (its logit is the score) or 2"
    if not any((d / f).is_file() for f in TOKENIZER_FILES):
        return "has no tokenizer files (tokenizer.json, tokenizer_config.json, vocab files)"
    return None


def num_labels(config: dict[str, Any]) -> int:
    """The head's labels as transformers counts them: id2label's size, else num_labels, else its default 2."""
    return len(config.get("id2label") or {}) or int(config.get("num_labels") or 2)


@dataclass
class LoadedRewardModel:
    """A reward model and its tokenizer in this process, and the longest pair it scores."""

    model: Any
    tokenizer: Any
    max_length: int

    @classmethod
    def load(cls, model_dir: str, max_length: int | None = None) -> LoadedRewardModel:
        """Load from a local directory (never from a hub), in float32, for inference."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        problem = config_problem(model_dir)
        if problem is not None:
            raise ValueError(f"spec.task.rewardModel.path: {model_dir!r} {problem}")
        tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, local_files_only=True,
                                                                   dtype="float32")
        model.eval().requires_grad_(False)
        if tok.pad_token is None:  # decoder tokenizers (GPT-2, Llama) have none: pad with EOS
            tok.pad_token = tok.eos_token
        if model.config.pad_token_id is None:  # the head reads the last token that is not padding
            model.config.pad_token_id = tok.pad_token_id
        tok.padding_side, tok.truncation_side = "right", "left"
        limit = max_length or _position_limit(model.config)
        return cls(model, tok, int(limit))

    def score(self, prompts: Sequence[str], completions: Sequence[str], batch_size: int = 32) -> list[float]:
        """One score per pair, `batch_size` pairs per forward pass."""
        import torch

        out: list[float] = []
        for i in range(0, len(prompts), max(1, batch_size)):
            enc = self.tokenizer(list(prompts[i:i + batch_size]), list(completions[i:i + batch_size]),
                                 padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
            with torch.inference_mode():
                logits = self.model(**enc).logits.float()
            head = logits[:, 0] if logits.shape[-1] == 1 else logits[:, 1] - logits[:, 0]
            out.extend(float(v) for v in head)
        return out


def _position_limit(config: Any) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_MAX_LENGTH


class RewardModelReplica:
    """A Serve replica: the model in memory; one forward at a time (requests queue in the replica)."""

    def __init__(self, model_dir: str, max_length: int | None, batch_size: int, threads: int):
        import torch

        torch.set_num_threads(max(1, int(threads)))
        self.loaded = LoadedRewardModel.load(model_dir, max_length)
        self.batch_size = int(batch_size)
        self.lock = threading.Lock()

    def _score(self, prompts: list[str], completions: list[str]) -> list[float]:
        with self.lock:
            return self.loaded.score(prompts, completions, self.batch_size)

    async def score(self, prompts: list[str], completions: list[str]) -> list[float]:
        return await asyncio.to_thread(self._score, prompts, completions)

    async def info(self) -> dict[str, Any]:
        import ray

        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "max_length": self.loaded.max_length, "labels": int(self.loaded.model.config.num_labels)}


@dataclass
class RewardModelOptions:
    """Where and how the reward model's Serve application runs."""

    app_name: str = "reward-model"
    num_replicas: int = 1
    batch_size: int = 32
    max_length: int | None = None
    threads: int = 1  # torch threads per replica
    node_id: str | None = None  # pin the replicas to this node (None: the caller's)
    request_timeout_s: float = 600.0
    max_retries: int = 3
    deploy_timeout_s: float = 600.0


class RewardModelClient:
    """The caller's side: deploy the replicas, score pairs spread over them, delete the application."""

    def __init__(self, handle: Any, options: RewardModelOptions):
        self.handle, self.options = handle, options
        self.retries = 0

    @classmethod
    def deploy(cls, model_dir: str, options: RewardModelOptions | None = None) -> RewardModelClient:
        """Start (or replace) the application and wait until every replica has loaded the model; Ray must be
        initialised. Raises RuntimeError with the replica's own message when they cannot start."""
        import ray
        from ray import serve

        o = options or RewardModelOptions()
        node = o.node_id or ray.get_runtime_context().get_node_id()
        serve.start(proxy_location="Disabled")  # no HTTP proxy: the caller holds a handle
        app = serve.deployment(RewardModelReplica).options(
            name=DEPLOYMENT_NAME, num_replicas=o.num_replicas, max_ongoing_requests=8,
            ray_actor_options={"num_cpus": 0, "label_selector": {NODE_LABEL: node}},
        ).bind(str(model_dir), o.max_length, o.batch_size, o.threads)
        t0 = time.monotonic()
        target = serve.RunTarget(app, name=o.app_name, route_prefix=None)
        (handle,) = serve.run_many([target], wait_for_applications_running=False)
        _wait_running(o.app_name, o.deploy_timeout_s)
        log.info("reward model %s: %d replica(s) up in %.1f s", model_dir, o.num_replicas, time.monotonic() - t0)
        return cls(handle, o)

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        """One score per pair, in order: chunks of batch_size pairs sent together, spread over the replicas."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        if not prompts:
            return []
        b = max(1, self.options.batch_size)
        chunks = [(list(prompts[i:i + b]), list(completions[i:i + b])) for i in range(0, len(prompts), b)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(chunks), 16)) as pool:
            parts = list(pool.map(self._call_with_retries, chunks))
        return [s for part in parts for s in part]

    def _call_with_retries(self, chunk: tuple[list[str], list[str]]) -> list[float]:
        import ray

        lost = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError)
        for attempt in range(self.options.max_retries + 1):
            try:
                return self.handle.score.remote(*chunk).result(timeout_s=self.options.request_timeout_s)
            except lost:
                if attempt == self.options.max_retries:
                    raise
                self.retries += 1
                log.warning("reward model request failed on a lost replica; retrying")
                time.sleep(min(0.5 * 2**attempt, 5.0))
        raise AssertionError("unreachable")

    def info(self) -> dict[str, Any]:
        """One replica's pid, node, token limit and labels (whichever the router picks)."""
        return self.handle.info.remote().result(timeout_s=60)

    def shutdown(self, wait: bool = False) -> None:
        """Delete the application (its replicas end)."""
        from ray import serve

        serve.delete(self.options.app_name, _blocking=wait)


def _wait_running(app_name: str, timeout_s: float) -> None:
    from ray import serve

    deadline = time.monotonic() + timeout_s
    while True:
        app = serve.status().applications.get(app_name)
        status = getattr(app, "status", None)
        if status == "RUNNING":
            return
        if status == "DEPLOY_FAILED":
            dep = app.deployments.get(DEPLOYMENT_NAME)
            raise RuntimeError(f"the reward model's replicas did not start: {app.message} "
                               f"{dep.message if dep is not None else ''}".strip())
        if time.monotonic() > deadline:
            raise RuntimeError(f"the reward model's replicas did not start within {timeout_s:.0f} s "
                               f"(application {app_name}: {status})")
        time.sleep(0.2)
