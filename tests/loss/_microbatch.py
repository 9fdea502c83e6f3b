"""Hand-built loss micro-batches with the keys verl 0.9.1's v1 path passes to the loss.

The engines run verl's NO_PADDING mode: ``prompts``/``responses``/``response_mask`` are jagged
nested tensors, and ``model_output["log_probs"]`` / ``teacher_logprobs`` cover the whole sequence
(position p holds the log-prob of token p+1; verl's ``no_padding_2_padding`` slices the response).
The padded variant keeps ``prompts``/``responses`` padded with an ``attention_mask`` and the model
output as a flat (total_nnz,) tensor, the other layout ``no_padding_2_padding`` accepts.
"""

import torch
from tensordict import TensorDict

from verl.utils import tensordict_utils as tu


def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def build_microbatch(prompt_lens, resp_lens, *, layout="nested", seed=0, kl_mask=None, dtype=torch.float64):
    """Returns ``(data, model_output, student_leaf, teacher_flat, resp_positions)``.

    ``student_leaf`` is the flat (total_nnz,) differentiable student log-prob tensor;
    ``resp_positions[i]`` indexes the flat positions holding sample i's response log-probs.
    """
    g = torch.Generator().manual_seed(seed)
    bs = len(prompt_lens)
    seq_lens = [p + r for p, r in zip(prompt_lens, resp_lens)]
    nnz = sum(seq_lens)
    student_leaf = (-torch.rand(nnz, generator=g, dtype=dtype) * 4).requires_grad_(True)
    teacher_flat = student_leaf.detach() + torch.randn(nnz, generator=g, dtype=dtype) * 2
    offsets = torch.tensor([0] + seq_lens).cumsum(0)
    resp_positions = [
        torch.arange(offsets[i + 1] - resp_lens[i] - 1, offsets[i + 1] - 1) for i in range(bs)
    ]
    prompts = [torch.randint(3, 50, (p,), generator=g) for p in prompt_lens]
    responses = [torch.randint(3, 50, (r,), generator=g) for r in resp_lens]
    old = [student_leaf.detach()[pos] for pos in resp_positions]
    fields = {
        "response_mask": _nested([torch.ones(r, dtype=torch.int64) for r in resp_lens]),
        "old_log_probs": _nested(old),
        "advantages": _nested([torch.zeros(r, dtype=dtype) for r in resp_lens]),
    }
    if layout == "nested":
        fields["prompts"] = _nested(prompts)
        fields["responses"] = _nested(responses)
        fields["teacher_logprobs"] = _nested(
            [teacher_flat[offsets[i] : offsets[i + 1]].unsqueeze(-1) for i in range(bs)]
        )
        log_probs = torch.nested.nested_tensor_from_jagged(student_leaf, offsets)
    elif layout == "padded":
        max_p, max_r = max(prompt_lens), max(resp_lens)
        pad_prompts = torch.zeros(bs, max_p, dtype=torch.int64)
        pad_resp = torch.zeros(bs, max_r, dtype=torch.int64)
        attn = torch.zeros(bs, max_p + max_r, dtype=torch.int64)
        for i in range(bs):
            pad_prompts[i, max_p - prompt_lens[i] :] = prompts[i]  # left-padded prompts, as verl's RL data
            attn[i, max_p - prompt_lens[i] : max_p] = 1
            pad_resp[i, : resp_lens[i]] = responses[i]
            attn[i, max_p : max_p + resp_lens[i]] = 1
        fields["prompts"] = pad_prompts
        fields["responses"] = pad_resp
        fields["attention_mask"] = attn
        for key in ("response_mask", "old_log_probs", "advantages"):
            fields[key] = fields[key].to_padded_tensor(0)
        # the teacher stays per-sample (a TensorDict field must have the batch dimension); its
        # values are the flat (total_nnz, 1) layout that no_padding_2_padding reads
        fields["teacher_logprobs"] = _nested(
            [teacher_flat[offsets[i] : offsets[i + 1]].unsqueeze(-1) for i in range(bs)]
        )
        log_probs = student_leaf
    else:
        raise ValueError(layout)
    if kl_mask is not None:
        fields["mopd_kl_mask"] = torch.as_tensor(kl_mask, dtype=torch.float32)
    data = TensorDict(fields, batch_size=bs)
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=sum(resp_lens), global_batch_size=bs)
    return data, {"log_probs": log_probs}, student_leaf, teacher_flat, resp_positions
