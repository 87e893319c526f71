"""A LoRA learner rank for tests/trainer/test_lora_learner.py, run as its own process (DeepSpeed owns the
process group). Usage: python lora_worker.py MODE ARGS_JSON; prints one RESULT line of JSON.

`train`: build a LoRA learner, step on the given batch, compare with transformers/peft computed here,
checkpoint, build a second learner and resume from it, then try resuming with each of args["changes"] to the
config (another base, another adapter) and report why each was refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from rlscale.trainer.learner import Learner, LearnerConfig


def _logprobs(model, batch: dict) -> list[torch.Tensor]:
    out = []
    with torch.no_grad():
        for p, r in zip(batch["prompt_ids"], batch["response_ids"], strict=True):
            logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1: len(p) + len(r) - 1]
            out.append(torch.log_softmax(logits.double(), -1).gather(-1, torch.tensor(r).unsqueeze(-1)).squeeze(-1))
    return out


def greedy(model, prompts: list[list[int]], new_tokens: int = 6) -> list[list[int]]:
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = model.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
            out.append(ids[0, len(p):].tolist())
    return out


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def train(args: dict) -> dict:
    from transformers import AutoModelForCausalLM

    from rlscale.trainer.lora.policy import Reference, adapter_state, merged_items

    cfg = LearnerConfig(**args["config"])
    learner = Learner(cfg)
    base = AutoModelForCausalLM.from_pretrained(cfg.model_path, dtype=torch.float32)
    opt_params = sum(p.numel() for g in learner.engine.optimizer.param_groups for p in g["params"])
    trainable = sum(p.numel() for p in learner.engine.module.parameters() if p.requires_grad)
    res: dict = {"optimizer_params": opt_params, "trainable_params": trainable,
                 "base_params": sum(p.numel() for p in base.parameters()),
                 "reference_is_adapter_off": isinstance(learner.reference, Reference)}
    stats = [learner.step(b, lr=args["lr"]) for b in args["batches"]]
    res["kl"] = [s.get("kl") for s in stats]
    batch = args["batches"][0]
    # The base's weights are untouched; the reference's log-probs are the base model's.
    merged = dict(merged_items(learner.lora))
    base_sd = base.state_dict()
    frozen = {n: t for n, t in learner.lora.get_base_model().named_parameters() if ".base_layer." in n}
    res["base_unchanged"] = all(torch.equal(t, base_sd[n.replace(".base_layer.", ".")]) for n, t in frozen.items())
    res["ref_vs_base"] = _max_diff(_logprobs(learner.reference, batch), _logprobs(base, batch))
    # The merged weights give the policy's log-probs: load them into a plain model.
    plain = AutoModelForCausalLM.from_pretrained(cfg.model_path, dtype=torch.float32)
    missing = plain.load_state_dict(merged, strict=False)
    res["merged_missing"] = [k for k in missing.missing_keys if "lm_head" not in k]
    res["merged_vs_policy"] = _max_diff(_logprobs(plain, batch), _logprobs(learner.lora, batch))
    res["policy_vs_base"] = _max_diff(_logprobs(learner.lora, batch), _logprobs(base, batch))
    res["merged_names_match"] = sorted(merged) == sorted(k for k in base_sd if k in dict(base.named_parameters()))
    adapter = adapter_state(learner.lora)
    res["adapter_bytes"] = sum(t.numel() * t.element_size() for t in adapter.values())
    res["sync_bytes"] = sum(t.numel() * t.element_size() for _, t in learner.sync_weights())
    ckpt = Path(args["ckpt"])
    learner.save_checkpoint(ckpt, {"step": 1})
    # The run's last weights, for the export test: what publish sends merged, and greedy tokens of the policy.
    torch.save(dict(learner.iter_weights()), ckpt.parent / "last-merged.pt")
    res["greedy"] = greedy(learner.lora, args["prompts"])
    res["ckpt_bytes"] = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
    res["model_bytes"] = sum(t.numel() * t.element_size() for t in base_sd.values())
    saved = {k: v.clone() for k, v in adapter.items()}
    del learner
    again = Learner(cfg)
    again.load_checkpoint(ckpt)
    res["resumed_equal"] = all(torch.equal(saved[k], v) for k, v in adapter_state(again.lora).items())
    res["resumed_steps"] = again.steps
    del again
    # Resuming on another base, or with another adapter shape, is refused.
    res["refusals"] = [resume(dict(args["config"], **change), ckpt) for change in args["changes"]]
    return res


def resume(config: dict, ckpt: Path) -> str | None:
    learner = Learner(LearnerConfig(**config))
    try:
        learner.load_checkpoint(ckpt)
    except RuntimeError as exc:
        return str(exc)
    return None


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode, path = sys.argv[1], sys.argv[2]
    out = {"train": train}[mode](json.loads(Path(path).read_text()))
    print("RESULT", json.dumps(out), flush=True)
