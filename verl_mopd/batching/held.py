"""The quota sampler's trainer half: prompts held back for paused domains, and their checkpoint.

The quota sampler (``verl_mopd.batching.sampler``) pauses a domain that is ahead of its share. Its
producer side is here: when verl's trainer draws prompts for the rollout (``_next_train_batch``),
:meth:`HeldPrompts.next_batch` holds back the drawn prompts of paused domains and releases them once
their domain resumes, so no drawn prompt is lost. The held prompts were already drawn from verl's
dataloader (they are not in its ``data.pt``), so they are saved beside the sampler's state in every
checkpoint (:meth:`HeldPrompts.save` / :meth:`HeldPrompts.load`).

Our ``mopd_*`` trainers use it; a custom verl v1 trainer with the quota sampler gets the same by
calling these three methods from its ``_next_train_batch``, ``_save_checkpoint`` and
``_load_checkpoint``. Reuses verl's ``tensordict_utils`` for the rows.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

__all__ = ["HELD_PROMPTS_FILE", "HeldPrompts", "row_domain"]

#: the file in ``global_step_N/`` (written before verl marks the step latest)
HELD_PROMPTS_FILE = "mopd_held_prompts.pt"


def row_domain(row, key: str) -> str:
    """The domain (routing value) of a one-row prompt TensorDict."""
    value = row[key]
    value = value.tolist() if hasattr(value, "tolist") else list(value)
    return str(value[0] if isinstance(value, list) else value)


class HeldPrompts:
    """Drawn prompts of paused domains (one-row TensorDicts), in the order they were drawn."""

    def __init__(self, rows: Iterable | None = None):
        self.rows: list = list(rows or [])

    def __len__(self) -> int:
        return len(self.rows)

    def next_batch(self, draw: Callable[[int], object], num_prompts: int, gen_batch_size: int,
                   paused: frozenset[str], domain_key: str, global_steps: int):
        """``num_prompts`` prompts for the rollout, holding back those of ``paused`` domains.

        ``draw(n)`` is verl's own draw of ``n`` prompts (the trainer's ``_next_train_batch``). Held
        prompts go first once their domain resumes; at most ``4 * num_prompts`` extra prompts are
        drawn; if every drawn prompt belongs to a paused domain, held ones are released anyway (the
        sampler's bounded-wait fallback then decides). The batch carries ``global_steps``, as verl's
        own draw does. Returns None when nothing is paused or held: take verl's draw unchanged.
        """
        if not paused and not self.rows:
            return None
        from verl.utils import tensordict_utils as tu

        chosen, still_held = [], []
        for row in self.rows:
            (chosen if row_domain(row, domain_key) not in paused and len(chosen) < num_prompts else still_held).append(row)
        budget = 4 * num_prompts
        while len(chosen) < num_prompts and budget > 0:
            batch = draw(gen_batch_size)
            budget -= len(batch)
            for i in range(len(batch)):
                row = tu.index_select_tensor_dict(batch, [i])
                (still_held if row_domain(row, domain_key) in paused else chosen).append(row)
        while len(chosen) < num_prompts and still_held:  # nothing else to draw: release held prompts
            chosen.append(still_held.pop(0))
        self.rows = still_held + chosen[num_prompts:]
        batch = tu.concat_tensordict(chosen[:num_prompts])
        tu.assign_non_tensor_data(batch, "global_steps", global_steps)  # concat keeps the first row's
        return batch

    def save(self, folder: str) -> None:
        """Write the held prompts into the checkpoint ``folder`` (atomically, like the sampler's state)."""
        import torch

        from verl_mopd.files import atomic_write

        with atomic_write(os.path.join(folder, HELD_PROMPTS_FILE), "wb") as f:
            torch.save(self.rows, f)

    def load(self, folder: str) -> None:
        """Read them back from a checkpoint ``folder`` (none saved there: keep the current ones)."""
        import torch

        path = os.path.join(folder, HELD_PROMPTS_FILE)
        if os.path.exists(path):
            self.rows = torch.load(path, weights_only=False)
