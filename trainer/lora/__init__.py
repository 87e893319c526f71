"""LoRA RL (spec.lora): the policy wrapped by peft, its adapter's names and the merged weights (policy.py),
the base model's identity a checkpoint is tied to (identity.py), and the adapter a weight update sends to
vLLM's LoRA support (rlscale.rollout.lora on the engines' side). docs/lora.md describes the whole path."""
