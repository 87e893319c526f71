"""What vLLM's workers import from rlscale (`worker_extension_cls`): the extension's methods, and rlscale's
weight transfer backends registered with vLLM's factory before the worker builds its transfer engine.

A module of its own so that only an engine's worker imports vLLM here: the driver imports rlscale.rollout.engine
in a thread beside its learner's start-up, and importing vLLM there raced the main thread's transformers import
("cannot import name 'PreTrainedConfig' from 'transformers'", the real-node faults run's driver at step 0).
"""

from __future__ import annotations

from typing import Any

from rlscale.rollout.transfer import register

register()


class RolloutWorkerExtension:
    """Methods vLLM mixes into its worker (`worker_extension_cls`), callable by name
    through collective_rpc from this process or across the engine-process boundary."""

    def rlscale_transfer_stats(self) -> dict[str, Any]:
        stats = getattr(getattr(self, "weight_transfer_engine", None), "stats", None)
        return stats.as_dict() if stats is not None else {}


    def rlscale_adapter_begin(self) -> None:
        """spec.lora: the coming update is an adapter; the transfer engine hands it to a sink, not the model."""
        from rlscale.rollout.lora import AdapterSink

        engine = self.weight_transfer_engine
        self._rlscale_sink = AdapterSink()
        engine.set_weight_update_target(self._rlscale_sink, engine.model_config)

    def rlscale_adapter_save(self, directory: str, alpha: float | None) -> int:
        """Write the adapter the update brought as a peft directory (the engine's first worker; every worker
        of the engine shares its host) for vLLM's add_lora; returns its bytes."""
        from rlscale.rollout.lora import write_adapter

        sink, self._rlscale_sink = getattr(self, "_rlscale_sink", None), None
        if sink is None or not sink.tensors:
            raise RuntimeError("LoRA update: no adapter tensors arrived (the update carried none)")
        if int(getattr(self, "rank", 0)) == 0:
            write_adapter(sink.tensors, directory, alpha)
        return sink.nbytes

    def rlscale_refresh_lm_heads(self) -> int:
        """Re-derive the LM heads' kernel form from their (possibly tied) weight.

        With tied embeddings the checkpoint has no lm_head tensor, so the in-place reload
        skips the head ("ParallelLMHead: Failed to load weights"). Its shared weight is
        updated through the embedding, but on CPU the head computes logits from a packed
        copy (oneDNN / sgl kernel) made at load time: without this the logits keep coming
        from the old embedding. On GPU the method uses the weight directly: a no-op.
        """
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            ParallelLMHead,
            UnquantizedEmbeddingMethod,
        )

        n = 0
        for module in self.get_model().modules():
            if isinstance(module, ParallelLMHead) and isinstance(
                module.quant_method, UnquantizedEmbeddingMethod
            ):
                module.quant_method.process_weights_after_loading(module)
                n += 1
        return n
