"""A small in-memory stand-in for the TransferQueue client, with the calls verl's v1 trainer makes.

Samples are stored per key; ``kv_batch_get`` returns a TensorDict as TransferQueue does: per-sample
tensors of varying length as jagged nested tensors, equal-shaped ones stacked, anything else
(strings, dicts) as a non-tensor stack; requested fields that a sample lacks are skipped.
"""

import torch
from tensordict import NonTensorStack, TensorDict
from transfer_queue import KVBatchMeta


def _rows(values):
    return values.tolist() if hasattr(values, "tolist") else list(values)


class InMemoryTQ:
    def __init__(self):
        self.store: dict[tuple[str, str], dict] = {}
        self.calls: list[str] = []

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        self.calls.append("kv_batch_put")
        if fields is not None and fields.batch_size[0] != len(keys):
            raise ValueError(f"fields batch size {fields.batch_size} != {len(keys)} keys")
        for i, key in enumerate(keys):
            row = self.store.setdefault((partition_id, key), {"__tags__": {}})
            if fields is not None:
                for name in fields.keys():
                    value = fields[name]
                    row[name] = value[i] if isinstance(value, torch.Tensor) else _rows(value)[i]
            if tags is not None:
                row["__tags__"].update(tags[i])
        stored = sorted({f for k in keys for f in self.store[(partition_id, k)] if f != "__tags__"})
        return KVBatchMeta(
            keys=list(keys),
            tags=[dict(self.store[(partition_id, k)]["__tags__"]) for k in keys],
            partition_id=partition_id,
            fields=stored,
        )

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        self.calls.append("kv_batch_get")
        rows = [self.store[(partition_id, k)] for k in keys]
        names = select_fields if select_fields is not None else [f for f in rows[0] if f != "__tags__"]
        out = {}
        for name in names:
            if any(name not in r for r in rows):
                continue  # as TransferQueue does: a field a sample lacks is not returned
            values = [r[name] for r in rows]
            if all(isinstance(v, torch.Tensor) for v in values):
                if len({tuple(v.shape) for v in values}) == 1:
                    out[name] = torch.stack(values)
                else:
                    out[name] = torch.nested.as_nested_tensor(values, layout=torch.jagged)
            else:
                out[name] = NonTensorStack(*values)
        return TensorDict(out, batch_size=len(keys))
