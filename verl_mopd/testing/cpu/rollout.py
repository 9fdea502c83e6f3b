"""The ``hf`` rollout engine of the CPU harness: transformers' ``generate`` behind verl's rollout API.

verl 0.9.1's v1 agent loop talks to a rollout *server* (a Ray actor with ``generate``) that a
``RolloutReplica`` launches, and ships trained weights to it through a ``BaseRollout`` adapter living
in the hybrid actor worker. verl's own ``hf_rollout.HFRollout`` is the legacy synchronous
``DataProto`` generator no v1 path reaches, so this module implements the three v1 pieces:

- :class:`HFRolloutServer`: token-in/token-out ``generate`` (one request at a time, under a lock),
  with Qwen3-VL images: the model's own image processor turns ``image_data`` into ``pixel_values`` /
  ``image_grid_thw``, and transformers computes the mrope positions (``mm_token_type_ids``) itself.
  ``max_tokens`` is capped as verl's SGLang server caps it; per-token log-probs of the sampled tokens
  (temperature-scaled, untruncated, as SGLang/vLLM report them) when ``logprobs`` is asked for.
  It computes in the rollout's ``dtype`` (verl's ``rollout.dtype``, bfloat16 by default) under CPU
  autocast, over fp32 weights: like SGLang beside an fp32 actor, its log-probs differ from the actor's
  by ~1e-2, so rollout-correction IS weights differ from 1 and the loss's use of them is checkable.
- :class:`HFReplica`: launches one server actor per replica (``num_cpus=0``: it runs beside the actor
  worker, as a hybrid rollout shares its GPU).
- :class:`HFServerAdapter` (``_ROLLOUT_REGISTRY[("hf", "async")]``): drains verl's per-tensor weight
  generator (DTensors gathered with ``full_tensor()``) and loads the full fp32 state dict into its
  server, which refuses unknown names.

Each weight sync is checkable: with ``VERL_MOPD_ROLLOUT_SYNC_LOG`` set, the adapter appends one JSON
line per sync with the sha256 of every tensor it sent and of every tensor the server holds after
loading (the transport), and the layout-free ``weight_stats`` of every parameter the server holds,
which ``verl-mopd smoke`` compares with the actor engine's own parameters at the same step
(``verl_mopd.trainer.hooks.dump_actor_state``): stale weights sent intact still differ there.
"""

import verl  # noqa: F401  (first: loads the cpu platform before the verl.plugins entry points run)

import asyncio
import hashlib
import json
import os
import threading
import time
from typing import Any

import torch

from verl_mopd.trainer.hooks import ROLLOUT_SYNC_LOG_ENV as SYNC_LOG_ENV, weight_stats

#: sampling parameters verl's agent loop sends; anything else is refused rather than ignored
SAMPLING_KEYS = {"temperature", "top_p", "top_k", "repetition_penalty", "logprobs", "max_tokens", "max_new_tokens"}


def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's fp32 bytes (what a bit-exact weight copy preserves)."""
    return hashlib.sha256(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()).hexdigest()


#: verl's ``rollout.dtype`` values -> the CPU autocast dtype (``None``: plain fp32)
AUTOCAST = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
            "half": torch.float16, "float32": None, "fp32": None}


def _server_name(replica_rank: int) -> str:
    return f"verl_mopd_hf_rollout_{replica_rank}"


class HFRolloutServer:
    """One rollout replica on CPU: a transformers model and its processor."""

    def __init__(self, config, model_config, replica_rank: int):
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor

        from verl.utils.config import omega_conf_to_dataclass

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        self.config = omega_conf_to_dataclass(config)
        self.model_config = omega_conf_to_dataclass(model_config)
        path = self.model_config.local_path
        trust = self.model_config.trust_remote_code
        hf_config = AutoConfig.from_pretrained(path, trust_remote_code=trust)
        self.is_vl = hasattr(hf_config, "vision_config")
        auto = AutoModelForImageTextToText if self.is_vl else AutoModelForCausalLM
        self.model = auto.from_pretrained(path, dtype=torch.float32, trust_remote_code=trust).eval()
        dtype = str(getattr(self.config, "dtype", "float32"))
        if dtype not in AUTOCAST:
            raise ValueError(f"hf rollout: rollout.dtype={dtype!r}; supported: {sorted(AUTOCAST)}")
        self.autocast = AUTOCAST[dtype]
        self.image_processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust).image_processor \
            if self.is_vl else None
        self.image_token_id = getattr(hf_config, "image_token_id", None)
        generation = self.model.generation_config
        eos = generation.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
        self.pad_token_id = generation.pad_token_id if generation.pad_token_id is not None else 0
        self.replica_rank = replica_rank
        self.global_steps = None
        self._lock = threading.Lock()

    # -- weights ---------------------------------------------------------------------------------
    def update_weights(self, state: dict[str, torch.Tensor]) -> dict[str, str]:
        """Load a full state dict; returns the sha256 of every tensor the model now holds."""
        with self._lock:
            own = self.model.state_dict()
            unexpected = sorted(set(state) - set(own))
            if unexpected:
                raise RuntimeError(f"hf rollout: the actor sent weights this model does not have: {unexpected[:5]}")
            self.model.load_state_dict(state, strict=False)
            return {name: tensor_digest(t) for name, t in self.model.state_dict().items()}

    def weight_stats(self) -> dict[str, list[float]]:
        """``verl_mopd.trainer.hooks.weight_stats`` of every parameter the model holds (shared ones once)."""
        with self._lock:
            return {name: weight_stats(p) for name, p in self.model.named_parameters()}

    # -- generation ------------------------------------------------------------------------------
    def _max_new_tokens(self, sampling: dict, prompt_len: int) -> int:
        cap = self.config.prompt_length + self.config.response_length - prompt_len
        wanted = sampling.pop("max_new_tokens", sampling.pop("max_tokens", None))
        if wanted is None:
            wanted = min(self.config.response_length, cap)
        return max(0, min(int(wanted), cap))

    def _generate(self, prompt_ids: list[int], sampling_params: dict, image_data) -> tuple[list[int], list | None, str]:
        sampling = dict(sampling_params)
        unknown = sorted(set(sampling) - SAMPLING_KEYS)
        if unknown:
            raise ValueError(f"hf rollout: sampling parameters {unknown} are not supported (known: {sorted(SAMPLING_KEYS)})")
        max_new = self._max_new_tokens(sampling, len(prompt_ids))
        if max_new == 0:
            return [], [] if sampling.get("logprobs") else None, "length"
        temperature = float(sampling.get("temperature", 1.0))
        ids = torch.tensor([list(prompt_ids)])
        inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if image_data:
            if not self.is_vl:
                raise ValueError("hf rollout: image_data for a model without a vision tower")
            pixels = self.image_processor(images=list(image_data), return_tensors="pt")
            inputs.update(pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"],
                          mm_token_type_ids=(ids == self.image_token_id).int())
        kwargs = dict(max_new_tokens=max_new, return_dict_in_generate=True, output_logits=True,
                      pad_token_id=self.pad_token_id, repetition_penalty=float(sampling.get("repetition_penalty", 1.0)))
        if temperature > 0:
            top_k = int(sampling.get("top_k", -1))
            kwargs.update(do_sample=True, temperature=temperature, top_p=float(sampling.get("top_p", 1.0)),
                          top_k=top_k if top_k > 0 else 0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with self._lock, torch.no_grad(), torch.autocast("cpu", dtype=self.autocast or torch.bfloat16,
                                                         enabled=self.autocast is not None):
            out = self.model.generate(**inputs, **kwargs)
        new = out.sequences[0, ids.shape[1]:].tolist()
        finish = "length"
        for i, token in enumerate(new):
            if token in self.eos:
                new, finish = new[: i + 1], "stop"
                break
        log_probs = None
        if sampling.get("logprobs"):
            scale = temperature if temperature > 0 else 1.0
            log_probs = [torch.log_softmax(out.logits[i][0].float() / scale, -1)[t].item() for i, t in enumerate(new)]
        return new, log_probs, finish

    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None, video_data=None, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        if video_data:
            raise ValueError("hf rollout: videos are not supported on CPU (images are)")
        tokens, log_probs, _ = await asyncio.to_thread(self._generate, prompt_ids, sampling_params, image_data)
        return TokenOutput(token_ids=tokens, log_probs=log_probs, stop_reason="completed",
                           extra_fields={"global_steps": self.global_steps})

    async def set_global_steps(self, global_steps):
        self.global_steps = global_steps

    # -- the lifecycle calls verl makes on every server (nothing to free on CPU) -----------------
    async def wake_up(self):
        pass

    async def sleep(self):
        pass

    async def abort_all_requests(self, reject_request: bool = False):
        pass

    async def resume_generation(self):
        pass

    async def clear_kv_cache(self):
        pass

    async def release_kv_cache(self):
        pass

    async def resume_kv_cache(self):
        pass

    async def start_profile(self, **kwargs):
        pass

    async def stop_profile(self):
        pass


def _replica_class():
    import ray
    from verl.workers.rollout.replica import RolloutReplica

    class HFReplica(RolloutReplica):
        """One :class:`HFRolloutServer` actor per replica, beside the hybrid actor worker."""

        def rollout_worker_use_gpu(self) -> bool:
            return False

        async def launch_servers(self):
            server = (
                ray.remote(HFRolloutServer)
                .options(name=_server_name(self.replica_rank), num_cpus=0, max_concurrency=self.max_concurrency)
                .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
            )
            self.servers = [server]
            self._server_handle = server
            self._server_address = f"hf-rollout-{self.replica_rank}"

    return HFReplica


def _adapter_class():
    from verl.workers.rollout.base import BaseRollout

    class HFServerAdapter(BaseRollout):
        """Lives in each hybrid actor worker; ships the trained weights to its replica's server."""

        def __init__(self, config, model_config, device_mesh, *args, **kwargs):
            super().__init__(config, model_config, device_mesh)
            world = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                     * self.config.pipeline_model_parallel_size)
            rank = int(os.environ.get("RANK", "0"))
            self.replica_rank, self.is_leader = rank // world, rank % world == 0
            self._server = None

        async def resume(self, tags):
            pass

        async def release(self):
            pass

        async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs):
            import ray

            if wire_format != "named_tensors":
                raise ValueError(f"hf rollout: wire_format={wire_format!r}; only full named tensors are supported")
            state = {}
            for name, tensor in weights:  # every rank drains the generator: full_tensor() is collective
                if hasattr(tensor, "full_tensor"):
                    tensor = tensor.full_tensor()
                if self.is_leader:
                    state[name] = tensor.detach().to("cpu", torch.float32).clone()
            if not self.is_leader:
                return
            if self._server is None:
                self._server = ray.get_actor(_server_name(self.replica_rank))
            held = await self._server.update_weights.remote(state)
            steps = kwargs.get("global_steps")
            if steps is not None:
                await self._server.set_global_steps.remote(steps)
            log = os.environ.get(SYNC_LOG_ENV)
            if log:
                record = {"time": time.time(), "global_steps": steps, "replica": self.replica_rank,
                          "sent": {name: tensor_digest(t) for name, t in state.items()}, "held": held,
                          "held_stats": await self._server.weight_stats.remote()}
                with open(log, "a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")

    return HFServerAdapter


HFReplica = _replica_class()
HFServerAdapter = _adapter_class()
