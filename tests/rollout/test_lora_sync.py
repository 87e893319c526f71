"""spec.lora on a real vLLM engine: adapters through the gloo transfer protocol, served by vLLM's LoRA.

One in-process engine built with EngineConfig.lora takes two adapter versions as a run's replica does (its
ReplicaCommands driven by the gloo trainer engine, without Ray): each version's log-probs are what
transformers + peft compute with that adapter, the old adapter is gone, and the wire carried the adapter's
bytes, not the model's."""

from __future__ import annotations

import threading

import pytest
import torch

from .conftest import KV_CACHE_BYTES, max_logprob_error

pytestmark = pytest.mark.slow

PROMPT = [1] + [4 + (i * 5) % 13 for i in range(12)]
LORA = {"r": 8, "lora_alpha": 16, "target_modules": "all-linear"}


def peft_policy(model_dir: str, seed: int):
    """The base with an adapter whose B is random (peft starts it at 0: the base itself)."""
    from peft import LoraConfig, get_peft_model

    from rlscale.trainer.modeling import load_model

    model = get_peft_model(load_model(model_dir, dtype="float32"), LoraConfig(**LORA))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


class CommandsClient:
    """vLLM's client protocol straight to one replica's ReplicaCommands.run, the replica's side in a thread
    (update must run while the trainer sends), as ReplicaClient does over Ray."""

    def __init__(self, cmds):
        self.cmds, self.version, self.results = cmds, None, {}

    def _run(self, op, payload=None):
        errors, out = [], {}

        def go():
            try:
                out["r"] = self.cmds.run(op, payload)
            except Exception as exc:  # noqa: BLE001 - raised below
                errors.append(exc)

        t = threading.Thread(target=go)
        t.start()
        t.join(120)
        if errors:
            raise errors[0]
        self.results = {"r0": out.get("r")}

    def init_weight_transfer_engine(self, info):
        self._run("init", info)

    def start_weight_update(self):
        self._run("start")

    def update_weights(self, info):
        self._run("update", info)

    def finish_weight_update(self, weight_version=None):
        self._run("finish", {"version": self.version})


def test_adapters_reach_vllm_through_the_transfer_protocol_and_replace_each_other(model_dirs):
    from rlscale.rollout.engine import EngineConfig, RolloutEngine
    from rlscale.rollout.transfer.control import ReplicaCommands
    from rlscale.trainer.lora.policy import adapter_state
    from rlscale.trainer.transfer.gloo_trainer import GlooTrainerInitInfo, GlooTrainerWeightTransferEngine
    from rlscale.trainer.transfer.sources import TensorsSource

    set_num_threads = torch.set_num_threads
    engine = RolloutEngine(EngineConfig(model=model_dirs[0], kv_cache_bytes=KV_CACHE_BYTES, max_num_seqs=8,
                                        transfer_backend="gloo", lora={"rank": 8, "alpha": 16}), warmup=False)
    torch.set_num_threads = set_num_threads
    try:
        versions: list[tuple[int, dict]] = []
        client = CommandsClient(ReplicaCommands(None, "r0", engine, on_version=lambda v, s: versions.append((v, s))))
        source = TensorsSource({})
        trainer = GlooTrainerWeightTransferEngine.trainer_init(GlooTrainerInitInfo(rank=0, world_size=2,
                                                                                   timeout_s=60),
                                                               client=client, source=source)
        from rlscale.trainer.modeling import load_model

        model_bytes = sum(t.numel() * t.element_size() for t in load_model(model_dirs[0]).state_dict().values())
        for version, seed in ((1, 1), (2, 2)):
            policy = peft_policy(model_dirs[0], seed)
            adapter = adapter_state(policy)
            source.items = list(adapter.items())
            client.version = version
            trainer.send_weights()
            assert engine.version == version and engine.adapter.request.lora_int_id == version + 1
            assert engine.llm.llm_engine.list_loras() == {version + 1}  # the previous version's is gone
            out = engine.generate([PROMPT], samples_per_prompt=4, temperature=1.0, max_new_tokens=8, seed=version)
            err = max(max_logprob_error(policy, PROMPT, s) for s in out[0])
            assert err < 2e-3, err  # vLLM's LoRA kernels vs transformers + peft, float32
            with policy.disable_adapter():  # the base: the same model with its adapter off
                base_err = max(max_logprob_error(policy, PROMPT, s) for s in out[0])
            assert base_err > 20 * err  # the adapter changed the policy: the check above can fail
            adapter_bytes = sum(t.numel() * t.element_size() for t in adapter.values())
            stats = versions[-1][1]
            assert adapter_bytes <= stats["received"] < adapter_bytes + 16 * len(adapter)  # aligned starts
            assert stats["received"] < 0.2 * model_bytes
        trainer.shutdown()
        adapters = engine.adapter.root
        assert adapters.is_dir()
    finally:
        engine.close()
    assert not adapters.exists()  # the engine's adapters go with it
