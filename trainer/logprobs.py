"""Per-token log-probs and entropy of the response tokens without a [tokens, vocab] float32 tensor.

The model's body gives the final hidden states; only the positions that predict response tokens are
kept, and the output head (lm_head) turns them into logits chunk by chunk (`chunk` token positions at a
time), each chunk cast to float32, reduced to (log-prob of the target, entropy) and dropped. Each chunk
runs under torch.utils.checkpoint (non-reentrant), so backward recomputes the chunk's logits instead of
keeping them, and the float32 reduction (_TargetAndEntropy) keeps only the chunk's logits for its own
backward: the peak is about three [chunk, vocab] float32 blocks, whatever the micro-batch size.

Models whose logits are not simply lm_head(hidden) (a final soft-cap or logit scale), or whose forward
takes no `logits_to_keep`, use the full logits, still reduced in float32 chunk by chunk.
"""

from __future__ import annotations

from functools import partial

import torch
from torch.utils.checkpoint import checkpoint

# Config fields that make the logits more than lm_head(hidden): those models take the full-logits path.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


class _TargetAndEntropy(torch.autograd.Function):
    """(log softmax(z)[target], entropy of softmax(z)) per row, in float32, keeping only the logits for
    backward (and the small per-row results): the [rows, vocab] temporaries are recomputed in backward,
    in place, so a chunk costs about three [rows, vocab] float32 blocks at its peak."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor):
        logp = logits.float()
        lse = torch.logsumexp(logp, dim=-1, keepdim=True)
        logp = logp - lse
        picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp().mul_(logp)).sum(-1)
        ctx.save_for_backward(logits, targets, lse, entropy)
        return picked, entropy

    @staticmethod
    def backward(ctx, g_picked: torch.Tensor, g_entropy: torch.Tensor):
        logits, targets, lse, entropy = ctx.saved_tensors
        logp = logits.float() - lse
        p = logp.exp()
        # d picked / dz = onehot(target) - p;  d entropy / dz = -p (log p + entropy)
        factor = logp.add_(entropy.unsqueeze(-1)).mul_(g_entropy.unsqueeze(-1)).add_(g_picked.unsqueeze(-1))
        grad = p.mul_(factor).neg_()
        grad.scatter_add_(-1, targets.unsqueeze(-1), g_picked.unsqueeze(-1).to(grad.dtype))
        return grad.to(logits.dtype), None


def _reduce(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log softmax at the targets, entropy) per row of one chunk, in float32."""
    return _TargetAndEntropy.apply(logits, targets)


def chunked_reduce(rows: torch.Tensor, targets: torch.Tensor, chunk: int,
                   head=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs, entropy) for every row of `rows` [N, H] (hidden states, with `head` the output layer)
    or [N, V] (logits, head None), `chunk` rows at a time; differentiable through rows (and head).

    The head is called once, as a module, with every chunk inside that call: under ZeRO-3 its forward
    and backward hooks gather its weight once per micro-batch (every rank makes the same calls, whatever
    its number of chunks), and the chunks' recomputation in backward finds the weight gathered."""
    if head is None:
        return _chunks(rows, targets, chunk, None)
    head.forward = partial(_head_forward, head, chunk)  # an instance attribute: the module's hooks still run
    try:
        return head(rows, targets)
    finally:
        del head.forward


def _head_forward(head, chunk: int, rows: torch.Tensor, targets: torch.Tensor):
    return _chunks(rows, targets, chunk, lambda x: torch.nn.functional.linear(x, head.weight, head.bias))


def _chunks(rows, targets, chunk, linear) -> tuple[torch.Tensor, torch.Tensor]:
    def part(x: torch.Tensor, t: torch.Tensor):
        return _reduce(linear(x) if linear is not None else x, t)

    outs = []
    for start in range(0, rows.shape[0], chunk):
        x, t = rows[start:start + chunk], targets[start:start + chunk]
        if torch.is_grad_enabled():
            outs.append(checkpoint(part, x, t, use_reentrant=False))
        else:
            outs.append(part(x, t))
    if not outs:
        empty = rows.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])


def _unwrap(model):
    return getattr(model, "module", model)


def supports_hidden_path(model) -> bool:
    """True when logits are lm_head(final hidden state) and the forward takes logits_to_keep."""
    import inspect

    module = _unwrap(model)
    head = module.get_output_embeddings() if hasattr(module, "get_output_embeddings") else None
    if head is None:
        return False
    cfg = getattr(module, "config", None)
    if any(getattr(cfg, k, None) not in (None, 1.0) for k in _LOGIT_TRANSFORMS):
        return False
    return "logits_to_keep" in inspect.signature(module.forward).parameters


def response_logprobs(model, mb, chunk: int, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs [B, T], entropy [B, T]) of the micro-batch's response tokens (MicroBatch fields
    input_ids, attention_mask, logit_index, response). `model` is a DeepSpeed engine or a module.
    chunk <= 0: the plain computation (full [B, T, vocab] float32 logits), kept as the reference; there the
    entropy is differentiable only with entropy_grad (else no graph through the [B, T, vocab] softmax)."""
    b, t = mb.logit_index.shape
    if chunk <= 0:
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
        resp = logits.gather(1, mb.logit_index.unsqueeze(-1).expand(-1, -1, logits.shape[-1])).float()
        logp = torch.log_softmax(resp, dim=-1)
        with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
            entropy = -(logp.exp() * logp).sum(-1)
        return logp.gather(-1, mb.response.unsqueeze(-1)).squeeze(-1), entropy
    if supports_hidden_path(model):
        # logits_to_keep=1: the model's own head runs on one position only; the hidden states are the
        # final (normed) ones, which the head turns into logits.
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, output_hidden_states=True,
                    logits_to_keep=1)
        rows, head = out.hidden_states[-1], _unwrap(model).get_output_embeddings()
    else:
        rows, head = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits, None
    picked = rows.gather(1, mb.logit_index.unsqueeze(-1).expand(-1, -1, rows.shape[-1]))
    logp, entropy = chunked_reduce(picked.reshape(b * t, -1), mb.response.reshape(-1), chunk, head)
    return logp.view(b, t), entropy.view(b, t)
