"""verl's Megatron engine on one checkpoint, against transformers: log-probs, one train step, gradients.

Run under torchrun on the CPU harness (:func:`verl_mopd.testing.cpu.environment` with ``megatron=True``)::

    python -m torch.distributed.run --nproc_per_node 2 -m verl_mopd.testing.megatron_check \\
        --model DIR --tp 2 --out result.json [--format thd --format bshd] [--teacher] \\
        [--no-sequence-parallel] [--train] [--dtype float32]

Rank 0 writes ``result.json``: ``{"engine": {FORMAT: RESULT, ...}, "teacher": RESULT}``. Each
``--format`` builds its own ``TrainingWorker`` in the same process group, and ``--teacher`` then builds the
project's ``MegatronTeacherWorker`` beside them, as colocated engines share Megatron's parallel state in a
real run (one process start per rank for all of them: each start imports megatron-core, Megatron-Bridge
and verl). An engine RESULT:

- ``logprob_max_err``: max |Megatron - transformers fp32| over every predicted token of a fixed batch
  (4 samples, 3 with an image when the checkpoint is a Qwen3-VL), through verl's
  ``TrainingWorker.infer_batch``; ``control_err``: the same against transformers with the pixels
  shifted by 1 (it must be large: the images reach the logits);
- ``weights_vs_checkpoint``: ``hooks.compare_weight_stats`` of the engine's own parameters (every rank's
  shards, ``hooks.combine_weight_stats``) against the checkpoint's in transformers, as ``[ok, detail]``;
  with ``--train`` also after the step against verl's export for the rollout (``trained_weights_vs_export``),
  and the weights before the step against that export (``initial_weights_vs_export``, which must differ)
- with ``--train``: ``loss`` and ``grad_norm`` of one ``train_batch`` step with verl's ``sft_loss``
  (Megatron's distributed optimizer, clip 1.0), ``reference_loss`` / ``reference_grad_norm``: the same
  loss and total gradient norm from transformers in float64, and ``replicated_grad_spread``: for each
  parameter replicated across the tensor-parallel ranks (not split by TP), the largest difference of
  its gradient between the ranks after Megatron's gradient reduction (0 when TP ranks agree).
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _batch(hf_config, seed: int = 5):
    """Jagged samples as TransferQueue stores them (prompt + response ids, loss mask on the response)."""
    import torch
    from tensordict.tensorclass import NonTensorData, NonTensorStack
    from verl.utils import tensordict_utils as tu

    vision = getattr(hf_config, "vision_config", None)
    vocab = (hf_config.text_config if vision is not None else hf_config).vocab_size
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for prompt, response, grid in ((9, 5, (4, 4)), (6, 3, None), (7, 4, (2, 4)), (11, 6, (4, 2))):
        ids = torch.randint(10, vocab - 10, (prompt,), generator=generator).tolist()
        inputs = None
        if vision is not None and grid is not None:
            h, w = grid
            width = 3 * vision.temporal_patch_size * vision.patch_size ** 2
            inputs = {"pixel_values": torch.randn(h * w, width, generator=generator),
                      "image_grid_thw": torch.tensor([[1, h, w]])}
            image = [hf_config.image_token_id] * (h * w // vision.spatial_merge_size ** 2)
            ids = ids[:2] + [hf_config.vision_start_token_id, *image, hf_config.vision_end_token_id] + ids[2:]
        ids += torch.randint(10, vocab - 10, (response,), generator=generator).tolist()
        samples.append({"input_ids": torch.tensor(ids), "response": response, "inputs": inputs})

    def make(**call):
        rows = {"input_ids": torch.nested.as_nested_tensor([s["input_ids"] for s in samples], layout=torch.jagged),
                "loss_mask": torch.nested.as_nested_tensor(
                    [torch.cat([torch.zeros(len(s["input_ids"]) - s["response"], dtype=torch.long),
                                torch.ones(s["response"], dtype=torch.long)]) for s in samples], layout=torch.jagged)}
        if vision is not None:
            rows["multi_modal_inputs"] = NonTensorStack.from_list([NonTensorData(s["inputs"]) for s in samples])
        return tu.get_tensordict(rows, non_tensor_dict={"temperature": 1.0, "calculate_entropy": False,
                                                        "global_token_num": [len(s["input_ids"]) for s in samples],
                                                        **call})

    return samples, make


def reference(model_path: str, samples: list[dict], pixel_shift: float = 0.0, train: bool = False):
    """transformers' log-probs of every predicted token per sample (float64 log-softmax of fp32 logits);
    with ``train``, also verl's ``sft_loss`` value (token mean over the batch's response tokens) and the
    total gradient norm of that loss, in float64."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(model_path)
    vision = hasattr(config, "vision_config")
    model = (AutoModelForImageTextToText if vision else AutoModelForCausalLM).from_pretrained(
        model_path, dtype=torch.float64 if train else torch.float32).eval()
    rows, total, tokens = [], 0.0, sum(s["response"] for s in samples)
    with torch.set_grad_enabled(train):
        for s in samples:
            ids = s["input_ids"][None]
            kwargs = {}
            if s["inputs"] is not None:
                kwargs = {k: v.to(model.dtype) if v.is_floating_point() else v for k, v in s["inputs"].items()}
                kwargs["pixel_values"] = kwargs["pixel_values"] + pixel_shift
                kwargs["mm_token_type_ids"] = (ids == config.image_token_id).int()
            logits = model(input_ids=ids, **kwargs).logits[0]
            log_probs = torch.log_softmax(logits.double(), -1)[:-1].gather(-1, ids[0, 1:, None])[:, 0]
            rows.append(log_probs.detach())
            if train:
                total = total - log_probs[-s["response"]:].sum() / tokens
    if not train:
        return rows, None, None
    total.backward()
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    return rows, float(total), float(norm)


def _replicated_grad_spread(engine) -> dict[str, float]:
    """Per parameter not split by TP: max over elements of (max - min over TP ranks) of its main_grad."""
    import torch
    from megatron.core import parallel_state as mpu

    group = mpu.get_tensor_model_parallel_group()
    spread = {}
    for name, parameter in engine.module[0].named_parameters():
        grad = getattr(parameter, "main_grad", None)
        if grad is None or getattr(parameter, "tensor_model_parallel", False):
            continue
        high, low = grad.detach().float().clone(), grad.detach().float().clone()
        torch.distributed.all_reduce(high, op=torch.distributed.ReduceOp.MAX, group=group)
        torch.distributed.all_reduce(low, op=torch.distributed.ReduceOp.MIN, group=group)
        spread[name] = float((high - low).abs().max())
    return spread


def _engine_weight_stats(engine) -> dict[str, list[float]]:
    """The engine's own parameters as ``verl-mopd smoke`` reads them after each step (``hooks.dump_actor_state``):
    every rank's :func:`~verl_mopd.trainer.hooks.engine_weight_stats`, combined."""
    import torch.distributed as dist

    from verl_mopd.trainer.hooks import combine_weight_stats, engine_weight_stats

    records = [None] * dist.get_world_size()
    dist.all_gather_object(records, engine_weight_stats(engine))
    return combine_weight_stats(records)


def _hf_weight_stats(model_path: str) -> dict[str, list[float]]:
    import torch
    from transformers import AutoModelForImageTextToText

    from verl_mopd.trainer.hooks import weight_stats

    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32)
    return {name: weight_stats(p) for name, p in model.named_parameters()}


def run_teacher(args) -> dict:
    """The project's ``MegatronTeacherWorker`` (verl's ``TrainingWorker``, forward only, parameter offload as
    ``placement: colocated``, fused log-prob kernels as the stage-2 layout) built from the ``mopd`` run config
    the way the trainer builds it, called on the fixed batch; its stored log-probs against transformers."""
    import torch
    from hydra import compose, initialize_config_dir
    from verl.utils import tensordict_utils as tu

    import verl_mopd
    from verl_mopd.teachers.backends.megatron import MegatronTeacherWorker, teacher_blocks
    from verl_mopd.teachers.config import TeacherConfig

    started = time.perf_counter()
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else int(os.environ["WORLD_SIZE"])
    config_dir = os.path.join(os.path.dirname(verl_mopd.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        run_config = compose(config_name="mopd", overrides=[f"actor_rollout_ref.model.path={args.model}",
                                                            "actor_rollout_ref.model.use_fused_kernels=true"])
    teacher = TeacherConfig(model_path=args.model, backend="megatron", n_gpus_per_node=world, platform="desktop",
                            tensor_model_parallel_size=args.tp, placement="colocated", micro_batch_tokens=48,
                            dtype=args.dtype, weights="pageable")  # verl's own param_offload path
    ref, model = teacher_blocks(teacher, run_config)
    worker = MegatronTeacherWorker(teacher=dict(teacher), ref=ref, model=model)
    worker.init_model()
    samples, make = _batch(worker.model_config.hf_config)
    data = make()
    data["response_mask"] = torch.nested.as_nested_tensor([torch.ones(s["response"], dtype=torch.long)
                                                           for s in samples], layout=torch.jagged)
    output = worker.compute_teacher_log_prob(data)
    result = {"tp": args.tp, "dtype": args.dtype, "engine": type(worker.engine).__name__,
              "param_offload": bool(worker.engine.engine_config.param_offload),
              "use_fused_kernels": bool(worker.engine.engine_config.use_fused_kernels)}
    if output is not None:
        want, _, _ = reference(args.model, samples)
        stored = output["teacher_logprobs"]
        errors = [float((stored[i].reshape(-1)[:-1].double() - want[i])[-s["response"]:].abs().max())
                  for i, s in enumerate(samples)]
        result.update(response_logprob_max_err=max(errors), teacher_tokens=tu.get_non_tensor_data(output, "teacher_tokens", None),
                      response_tokens=sum(s["response"] for s in samples))
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def run(args, layout: str = "thd") -> dict:
    from functools import partial

    from verl.trainer.config import CheckpointConfig
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import (
        HFModelConfig,
        McoreEngineConfig,
        McoreOptimizerConfig,
        TrainingWorkerConfig,
    )
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import sft_loss

    started = time.perf_counter()
    model_config = HFModelConfig(path=args.model, use_remove_padding=layout == "thd")
    engine_config = McoreEngineConfig(
        strategy="megatron", tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
        dtype=args.dtype, use_dynamic_bsz=True, max_token_len_per_gpu=256, infer_max_token_len_per_gpu=256,
        seed=1, use_distributed_optimizer=True, sequence_parallel=args.sequence_parallel, forward_only=not args.train)
    optimizer = McoreOptimizerConfig(lr=1e-2, clip_grad=1.0, weight_decay=0.0, lr_warmup_steps=0,
                                     total_training_steps=10)
    worker = TrainingWorker(TrainingWorkerConfig(model_type="language_model", model_config=model_config,
                                                 engine_config=engine_config, optimizer_config=optimizer,
                                                 checkpoint_config=CheckpointConfig()))
    worker.reset()
    from verl_mopd.trainer.hooks import compare_weight_stats, weight_stats

    initial = _engine_weight_stats(worker.engine)
    samples, make = _batch(model_config.hf_config)
    output = worker.infer_batch(make(compute_loss=False))
    result = {"tp": args.tp, "pp": args.pp, "sequence_parallel": bool(worker.engine.engine_config.sequence_parallel),
              "dtype": args.dtype, "format": layout, "engine": type(worker.engine).__name__,
              # the smoke's weight check, on Megatron's own layout: the loaded engine = the checkpoint it loaded
              "weights_vs_checkpoint": compare_weight_stats(initial, _hf_weight_stats(args.model)),
              }
    if output is not None:
        want, _, _ = reference(args.model, samples)
        got = [output["log_probs"][i][:-1].double() for i in range(len(samples))]
        result["logprob_err_per_sample"] = [float((g - w).abs().max()) for g, w in zip(got, want, strict=True)]
        result["logprob_max_err"] = max(result["logprob_err_per_sample"])
        result["response_logprob_max_err"] = max(float((g - w)[-s["response"]:].abs().max())
                                                 for g, w, s in zip(got, want, samples, strict=True))
        if any(s["inputs"] is not None for s in samples):
            shifted, _, _ = reference(args.model, samples, pixel_shift=1.0)
            result["control_err"] = max(float((g - w).abs().max()) for g, w in zip(got, shifted, strict=True))
    if args.train:
        spread = {}
        step = worker.engine.optimizer.step

        def step_and_measure():
            spread.update(_replicated_grad_spread(worker.engine))
            return step()

        worker.engine.optimizer.step = step_and_measure
        worker.set_loss_fn(partial(sft_loss, None))
        trained = worker.train_batch(make(update_lr_scheduler=True))
        if trained is not None:
            metrics = tu.get(trained, "metrics")
            _, loss, norm = reference(args.model, samples, train=True)
            result.update(loss=float(metrics["loss"]), grad_norm=float(metrics["grad_norm"]), reference_loss=loss,
                          reference_grad_norm=norm)
        trained_stats = _engine_weight_stats(worker.engine)
        per_tensor, _ = worker.engine.get_per_tensor_param()  # what verl sends the rollout (every rank drains it)
        exported = {name: weight_stats(tensor) for name, tensor in per_tensor}
        result["trained_weights_vs_export"] = compare_weight_stats(trained_stats, exported)
        result["initial_weights_vs_export"] = compare_weight_stats(initial, exported)  # stale: must differ
        worst = max(spread, key=spread.get) if spread else None
        result["replicated_grad_spread"] = {"max": spread.get(worst, 0.0), "parameter": worst,
                                            "over_1e-6": sorted(k for k, v in spread.items() if v > 1e-6)}
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m verl_mopd.testing.megatron_check", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--format", action="append", choices=["thd", "bshd"],
                        help="packed (thd, the default) or padded (bshd) batches; repeat for both, one engine each")
    parser.add_argument("--no-sequence-parallel", dest="sequence_parallel", action="store_false")
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--teacher", action="store_true", help="then the project's MegatronTeacherWorker too")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import torch.distributed as dist

    result = {"engine": {layout: run(args, layout) for layout in args.format or ["thd"]}}
    if args.teacher:
        result["teacher"] = run_teacher(args)
    if dist.get_rank() == 0:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    main()
