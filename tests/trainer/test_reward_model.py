"""task.rewardModel: a sequence-classification model served by Ray Serve scores (prompt, completion) pairs, alone or
in a weighted sum with verifiers; validate refuses a term without a model and a model without its term."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlscale.spec import RewardModelSpec, SpecError, parse_spec
from tests.conftest import EXAMPLES, ROOT

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PROMPTS = ["12+34=", "5+5=", "99+1=", "7+8=", "10+20=", "3+4=", "61+27=", "8+9="]
COMPLETIONS = ["46", "10", "100", "1", "30", "77777", "88", ""]
ANSWERS = ["46", "10", "100", "15", "30", "7", "88", "17"]


def save_tiny_reward_model(path: Path, labels: int = 1) -> Path:
    """A random 2-layer GPT-2 with a score head of `labels` (made large, so scores differ by O(1)), and the
    builtin model's character tokenizer."""
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification

    from rlscale.trainer.modeling import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2, num_labels=labels,
                     pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = GPT2ForSequenceClassification(cfg)
    with torch.no_grad():
        model.score.weight.normal_(0.0, 1.0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def reference_scores(model_dir: Path, prompts: list[str], completions: list[str]) -> list[float]:
    """transformers' forward in this process, one unpadded pair at a time."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, local_files_only=True).eval()
    out = []
    with torch.inference_mode():
        for p, c in zip(prompts, completions, strict=True):
            out.append(float(model(**tok(p, c, return_tensors="pt")).logits[0, 0]))
    return out


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> Path:
    return save_tiny_reward_model(tmp_path_factory.mktemp("reward-model") / "rm")


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray for the module's Serve tests (no `rollout` slot: the reward model takes none)."""
    import ray

    assert not ray.is_initialized(), "another test left Ray running; it must shut it down"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def cpu_spec(**task) -> dict:
    return {"hardware": {"accelerator": "cpu"}, "task": task}


def errors_of(spec: dict) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    return [str(e) for e in info.value.errors]


def test_validate_refuses_a_term_without_a_model_and_a_model_without_its_term():
    assert any(e.startswith("spec.task.reward: ") and "task.rewardModel is unset" in e
               for e in errors_of(cpu_spec(reward="0.5*reward-model + 0.5*exact-match")))
    assert any(e.startswith("spec.task.rewardModel: ") and "no reward-model term" in e
               for e in errors_of(cpu_spec(rewardModel={"path": "/m"})))
    assert any(e.startswith("spec.task.rewardModel.gpusPerReplica: ")
               for e in errors_of(cpu_spec(reward="reward-model", rewardModel={"path": "/m", "gpusPerReplica": 1})))
    assert any(e.startswith("spec.task.rewardModel: ") and "accelerator H100" in e
               for e in errors_of({"model": {"path": "Qwen/Qwen2.5-7B-Instruct"}, "task": {
                   "reward": "reward-model", "rewardModel": {"path": "/m", "gpusPerReplica": 1}}}))
    ok = parse_spec(cpu_spec(reward="reward-model", rewardModel={"path": "/m", "replicas": 2, "batchSize": 8}))
    assert ok.task.reward_model == RewardModelSpec(path="/m", replicas=2, batch_size=8)
    assert "reward model /m: 2 Ray Serve replica(s)" in ok.task.reward_model.plan_note()


def test_validate_checks_the_model_files(rm_dir, tmp_path):
    from rlscale.trainer.data import check_workload
    from rlscale.trainer.modeling import save_random_model

    lm = save_random_model(tmp_path / "lm", hidden_size=32, num_layers=1, num_heads=2, head_dim=16,
                           intermediate_size=64, seed=0)
    good = parse_spec(cpu_spec(reward="0.5*reward-model + 0.5*exact-match", rewardModel={"path": str(rm_dir)}))
    assert check_workload(good) == []  # exact-match tried on the rows; the model's files checked
    for path, why in ((str(lm), "not a sequence-classification model"), (str(tmp_path / "none"), "config.json"),
                      ("nobody/no-such-reward-model", "not in the Hugging Face cache")):
        (err,) = check_workload(parse_spec(cpu_spec(reward="reward-model", rewardModel={"path": path})))
        assert err.path == "spec.task.rewardModel.path" and why in str(err), str(err)
    two = save_tiny_reward_model(tmp_path / "three", labels=3)
    (err,) = check_workload(parse_spec(cpu_spec(reward="reward-model", rewardModel={"path": str(two)})))
    assert "3 labels" in str(err)


def test_the_term_needs_the_runs_ray(rm_dir):
    from rlscale.trainer.rewards import RewardError, resolve_reward, score

    reward = resolve_reward("reward-model", reward_model=RewardModelSpec(path=str(rm_dir)))
    assert reward.start_pool() is False  # the term is no pool worker's
    with pytest.raises(RewardError, match="has not joined"):
        score(reward, PROMPTS[:1], COMPLETIONS[:1], ANSWERS[:1], [True])


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_served_weighted_sum_equals_transformers_and_logs_each_term(rm_dir, ray_cluster, tmp_path, monkeypatch):
    """Two replicas, chunks of 3 pairs: the served scores are transformers' forward of each pair alone; the sum
    weighs them with exact-match; each term's mean goes to the step record; the run's end deletes the replicas."""
    from ray import serve

    from rlscale.plan import make_plan
    from rlscale.runconfig import ENV_CONFIG, RunConfig
    from rlscale.spec import parse_rlrun
    from rlscale.trainer.rewards import RewardTally, exact_match, resolve_reward, score_terms
    from tests.conftest import wait_for

    expr = "0.5*reward-model + 0.5*exact-match"
    spec = cpu_spec(reward=expr, rewardModel={"path": str(rm_dir), "replicas": 2, "batchSize": 3})
    rlrun = parse_rlrun({"apiVersion": "rlscale.dev/v1alpha1", "kind": "RLRun", "metadata": {"name": "rm"},
                         "spec": spec})
    # As the driver builds it: no reward_model given, so the term reads task.rewardModel from the run config.
    RunConfig.from_rlrun(rlrun, make_plan(rlrun.spec)).save(tmp_path / "run.json")
    monkeypatch.setenv(ENV_CONFIG, str(tmp_path / "run.json"))
    reward = resolve_reward(expr)
    try:
        scored = score_terms(reward, PROMPTS, COMPLETIONS, ANSWERS, [True] * len(PROMPTS))
        rm = reference_scores(rm_dir, PROMPTS, COMPLETIONS)
        assert len(set(round(s, 3) for s in rm)) > 4  # the pairs are told apart
        em = [exact_match(p, c, a) for p, c, a in zip(PROMPTS, COMPLETIONS, ANSWERS, strict=True)]
        assert scored.terms["reward-model"] == pytest.approx(rm, abs=1e-4)  # padded batches, as each pair alone
        assert scored.terms["exact-match"] == em
        assert scored.rewards == pytest.approx([0.5 * r + 0.5 * e for r, e in zip(rm, em, strict=True)], abs=1e-4)
        tally = RewardTally()
        tally.add(scored)
        means, timeouts = tally.take(reward)  # what the step record's reward_terms hold
        assert set(means) == {"reward-model", "exact-match"} and timeouts == 0
        assert means["reward-model"] == pytest.approx(sum(rm) / len(rm), abs=1e-4)
        client = reward.terms[0].batch.client
        info = client.info()
        assert info["node_id"] == ray_cluster.get_runtime_context().get_node_id() and info["labels"] == 1
        assert client.options.num_replicas == 2 and ray_cluster.available_resources().get("CPU") == 2  # none taken
        app = client.options.app_name
    finally:
        reward.close()
    wait_for("the reward model's app to go", lambda: app not in serve.status().applications, timeout=60)


def test_plan_names_the_reward_model(rm_dir, tmp_path):
    """`rlscale plan` of the quickstart with 0.5*reward-model + 0.5*exact-match says where the model runs
    (the run itself: tests/e2e/test_async_run.py, whose run scores with this sum)."""
    doc = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    doc["metadata"]["name"] = "rm-run"
    doc["spec"]["task"].update(reward="0.5*reward-model + 0.5*exact-match", rewardModel={"path": str(rm_dir)})
    f = tmp_path / "rm.yaml"
    f.write_text(yaml.safe_dump(doc))
    plan = subprocess.run([sys.executable, "-m", "rlscale.cli", "plan", str(f)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "200"}, timeout=120)
    assert plan.returncode == 0 and "reward model" in plan.stdout, plan.stdout + plan.stderr
