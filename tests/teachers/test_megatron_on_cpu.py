"""The ``megatron`` teacher on CPU, as far as verl allows.

Real here: the teacher's ``TrainingWorkerConfig`` built from the composed run config the way verl
builds its reference model; verl's ``MegatronEngine`` constructed and initialized on a one-process
gloo group up to the module build (needs ``megatron-core`` + ``mbridge``, skipped without them); the
teacher worker's call through verl's real ``TrainingWorker.infer_batch`` (default engine keys,
``_postprocess_output``), verl's ``prepare_micro_batches`` and ``postprocess_batch_func``.

Replaced, because they need CUDA: ``make_megatron_module`` (Transformer Engine layer specs and the
GPU module) and the Megatron model forward (TE / flash-attention THD kernels), by
``CPUForwardEngine`` below, which reads the batch exactly where ``MegatronEngine.forward_backward_batch``
and ``forward_step`` read it and runs the same tiny model with transformers.
"""

import contextlib
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from _teacher_tiny import direct_logprobs, padded_batch, save_tiny_lm
from hydra import compose, initialize_config_dir
from transformers import AutoModelForCausalLM

import verl_mopd
from verl_mopd.errors import ConfigError
from verl_mopd.teachers.config import TeacherConfig

CONFIG_DIR = os.path.join(os.path.dirname(verl_mopd.__file__), "trainer", "config")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("megatron_teacher") / "m", seed=5)


def run_config(tiny, *overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="mopd", overrides=[f"actor_rollout_ref.model.path={tiny}", *overrides])


def teacher(tiny, **kw):
    base = dict(model_path=tiny, backend="megatron", n_gpus_per_node=8, tensor_model_parallel_size=4,
                pipeline_model_parallel_size=2, placement="colocated", platform="desktop", micro_batch_tokens=3000)
    return TeacherConfig(**{**base, **kw})


def test_worker_config_is_verls_ref_config_with_the_teacher_on_top(tiny):
    from verl.workers.config import McoreEngineConfig
    from verl.workers.config.optimizer import OptimizerConfig

    from verl_mopd.teachers.backends.megatron import training_worker_config

    cfg = run_config(tiny, "actor_rollout_ref.actor.megatron.vanilla_mbridge=true",
                     "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full",
                     "actor_rollout_ref.actor.megatron.seed=7")
    twc = training_worker_config(teacher(tiny), cfg)
    eng = twc.engine_config
    assert isinstance(eng, McoreEngineConfig) and eng.strategy == "megatron"
    assert eng.forward_only and eng.param_offload and not eng.optimizer_offload
    assert (eng.tensor_model_parallel_size, eng.pipeline_model_parallel_size, eng.dtype) == (4, 2, "bfloat16")
    assert eng.use_dynamic_bsz and eng.infer_max_token_len_per_gpu == 3000 and eng.infer_micro_batch_size_per_gpu is None
    # inherited from the actor, as verl's ref inherits it (ref/megatron_ref.yaml)
    assert eng.vanilla_mbridge and eng.seed == 7 and eng.override_transformer_config["recompute_granularity"] == "full"
    assert eng.use_remove_padding == twc.model_config.use_remove_padding
    # a real optimizer config (verl's ref gets the same): F1, `optimizer_config=None` crashed the module build
    assert isinstance(twc.optimizer_config, OptimizerConfig)
    assert twc.model_config.path == tiny and not twc.model_config.mtp.enable
    assert not training_worker_config(teacher(tiny, placement="dedicated"), cfg).engine_config.param_offload
    # the Ray actor gets plain blocks and converts them itself, as verl's worker converts its ref block
    from verl_mopd.teachers.backends.megatron import megatron_teacher_class, worker_config_from_blocks

    init = megatron_teacher_class(teacher(tiny), cfg)
    assert all(isinstance(init.kwargs[k], dict) for k in ("teacher", "ref", "model"))
    again = worker_config_from_blocks(TeacherConfig(**init.kwargs["teacher"]), init.kwargs["ref"], init.kwargs["model"])
    assert again.engine_config == eng and again.model_config.path == tiny
    with pytest.raises(ConfigError, match="dtype='float32'"):
        training_worker_config(teacher(tiny, dtype="float32"), cfg)
    with pytest.raises(ValueError, match="model_engine=megatron"):
        training_worker_config(teacher(tiny), run_config(tiny, "model_engine=dp"))


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None or importlib.util.find_spec("mbridge") is None,
                    reason="needs megatron-core and mbridge (the test extra: pip install -e '.[test]')")
def test_verls_megatron_engine_initializes_up_to_the_cuda_module_build(tiny, tmp_path):
    """verl's real MegatronEngine, one-process gloo group: ``initialize()`` runs ``_build_tf_config``
    (mbridge), the optimizer-config check at transformer_impl.py l.475 and the DDP config, and
    reaches ``make_megatron_module``; with ``optimizer_config=None`` it crashes before (F1)."""
    import cloudpickle

    from verl_mopd.teachers.backends.megatron import training_worker_config

    twc = training_worker_config(teacher(tiny, n_gpus_per_node=1, tensor_model_parallel_size=1,
                                         pipeline_model_parallel_size=1),
                                 run_config(tiny, "actor_rollout_ref.actor.megatron.vanilla_mbridge=true"))
    path = tmp_path / "twc.pkl"
    path.write_bytes(cloudpickle.dumps(twc))
    script = textwrap.dedent(f"""
        import os, pickle, socket
        import torch.distributed as dist
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                          VERL_ENGINE_DEVICE="cuda")
        dist.init_process_group("gloo", rank=0, world_size=1)
        import verl.utils.megatron_utils as megatron_utils
        from verl.workers.engine import EngineRegistry

        class ModuleBuildReached(Exception):
            pass

        def cuda_module_build(**kwargs):  # TE layer specs + GPU module: CUDA only
            assert kwargs["wrap_config"].wrap_with_ddp is False  # forward only
            raise ModuleBuildReached

        megatron_utils.make_megatron_module = cuda_module_build
        twc = pickle.load(open({str(path)!r}, "rb"))
        for name, optim in (("ours", twc.optimizer_config), ("none", None)):
            engine = EngineRegistry.new(model_type="language_model", backend="megatron", model_config=twc.model_config,
                                        engine_config=twc.engine_config, optimizer_config=optim,
                                        checkpoint_config=twc.checkpoint_config)
            try:
                engine.initialize()
            except ModuleBuildReached:
                print(name, "REACHED_MODULE_BUILD")
            except AttributeError as exc:
                print(name, "ATTRIBUTE_ERROR", exc)
    """)
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, timeout=600)
    assert "ours REACHED_MODULE_BUILD" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    assert "none ATTRIBUTE_ERROR" in out.stdout and "'NoneType' object has no attribute 'get'" in out.stdout


class CPUForwardEngine:
    """Stands in for ``MegatronEngineWithLMHead`` where CUDA is needed: ``eval_mode`` (parameter
    load/offload) and the model forward. Everything it reads from the batch, it reads where the real
    engine does; micro-batching and output reordering are verl's own functions."""

    def __init__(self, model):
        self.model = model
        self.calls = []

    def eval_mode(self, **kwargs):
        return contextlib.nullcontext()

    def is_mp_src_rank_with_outputs(self):
        return True

    def get_data_parallel_group(self):
        return None

    def get_data_parallel_rank(self):
        return 0

    @torch.no_grad()
    def infer_batch(self, data, loss_function=None):
        from verl.utils import tensordict_utils as tu
        from verl.workers.engine.utils import postprocess_batch_func, prepare_micro_batches

        assert loss_function is None
        data["loss_mask"]  # forward_backward_batch: batch_num_tokens (KeyError without it)  # noqa: B018
        micro_batches, indices = prepare_micro_batches(data=data, dp_group=None)  # asserts max_token_len_per_gpu
        outputs = []
        for mb in micro_batches:
            temperature = mb["temperature"]  # forward_step (KeyError without it)
            self.calls.append({"size": len(mb), "use_fused_kernels": tu.get_non_tensor_data(mb, "use_fused_kernels",
                                                                                            None)})
            rows = []
            for seq in mb["input_ids"].unbind(0):  # labels rolled by one, as preprocess_thd_engine(need_roll=True)
                logits = self.model(input_ids=seq[None]).logits[0].float() / float(temperature)
                lp = torch.log_softmax(logits, -1)[:-1].gather(-1, seq[1:, None])[:, 0]
                rows.append(torch.cat([lp, lp.new_zeros(1)]))
            outputs.append({"model_output": {"log_probs": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}})
        return postprocess_batch_func(output_lst=outputs, indices=indices, data=data)


def _worker(tiny, micro_batch_tokens):
    from verl_mopd.teachers.backends.megatron import MegatronTeacherWorker, training_worker_config

    twc = training_worker_config(teacher(tiny, n_gpus_per_node=1, tensor_model_parallel_size=1,
                                         pipeline_model_parallel_size=1, micro_batch_tokens=micro_batch_tokens),
                                 run_config(tiny))
    worker = MegatronTeacherWorker.__new__(MegatronTeacherWorker)  # TrainingWorker.__init__ builds the CUDA engine
    worker.config, worker.engine_config, worker.model_config = twc, twc.engine_config, twc.model_config
    worker.device_name, worker.flops_counter, worker.loss_fn = "cpu", None, None
    worker.engine = CPUForwardEngine(AutoModelForCausalLM.from_pretrained(tiny).eval())
    return worker


def _stored_batch(seed=0):
    """Samples as TransferQueue returns them: jagged, no loss_mask fetched, batch-level call keys."""
    from verl.utils import tensordict_utils as tu

    from verl_mopd.teachers.layout import CALL_INFO

    t, _ = padded_batch(["desktop"] * 7, prompt_len=9, response_len=6, seed=seed)
    am, R = t["attention_mask"], t["responses"].shape[1]
    n_resp = am[:, -R:].sum(-1).tolist()
    seqs = [t["input_ids"][i][am[i].bool()] for i in range(7)]

    def jag(rows):
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    data = tu.get_tensordict({
        "input_ids": jag(seqs), "prompts": jag([s[: len(s) - r] for s, r in zip(seqs, n_resp, strict=True)]),
        "responses": jag([s[len(s) - r:] for s, r in zip(seqs, n_resp, strict=True)]),
        "response_mask": jag([torch.ones(r, dtype=torch.long) for r in n_resp]),
        "old_log_probs": jag([-torch.rand(r) for r in n_resp])}, non_tensor_dict=dict(CALL_INFO))
    return data, t, n_resp


@pytest.mark.parametrize("micro_batch_tokens", [16, 40, 4096])
def test_teacher_call_goes_through_verls_training_worker_infer_batch(tiny, micro_batch_tokens):
    from verl.workers.utils.padding import no_padding_2_padding

    worker = _worker(tiny, micro_batch_tokens)
    data, t, n_resp = _stored_batch()
    out = worker.compute_teacher_log_prob(data)
    # infer_batch injected the engine keys from the engine config (F4) ...
    assert {c["use_fused_kernels"] for c in worker.engine.calls} == {False}
    sizes = [c["size"] for c in worker.engine.calls]
    assert sum(sizes) == 7 and (micro_batch_tokens == 4096) == (len(sizes) == 1)
    # ... and the whole-sequence log-probs are stored as they are, read back as the loss reads them (F5)
    full = out["teacher_logprobs"]
    assert full.is_nested and full.shape[-1] == 1
    got = no_padding_2_padding(full, data).squeeze(-1)
    want = direct_logprobs(AutoModelForCausalLM.from_pretrained(tiny).eval(), t["input_ids"], t["attention_mask"], 6)
    for i, r in enumerate(n_resp):
        torch.testing.assert_close(got[i, :r].double(), want[i, :r], atol=1e-5, rtol=0)
    from verl.utils import tensordict_utils as tu

    assert tu.get_non_tensor_data(out, "teacher_tokens", None) == sum(n_resp)
    assert tu.get_non_tensor_data(out, "teacher_k3_sum", None) > 0


def test_calling_the_engine_directly_misses_verls_engine_keys(tiny):
    """What the previous backend did (``engine.infer_batch`` on the fetched fields): no
    ``loss_mask``, no ``max_token_len_per_gpu`` — the real engine's first reads fail (F4)."""
    worker = _worker(tiny, 4096)
    data, _, _ = _stored_batch(seed=1)
    with pytest.raises(KeyError, match="loss_mask"):
        worker.engine.infer_batch(data.copy(), loss_function=None)
    data["loss_mask"] = data["response_mask"]
    with pytest.raises(AssertionError, match="max_token_len_per_gpu"):
        worker.engine.infer_batch(data, loss_function=None)


def test_stack_report_names_what_verls_engine_imports():
    from verl_mopd.teachers.backends.megatron import megatron_stack_report

    rows = {name.split(" ")[0]: ok for name, ok, _ in megatron_stack_report(vanilla_mbridge=False)}
    assert rows["megatron-core"] == (importlib.util.find_spec("megatron") is not None
                                     and importlib.util.find_spec("megatron.core") is not None)
    assert rows["Megatron-Bridge"] == (importlib.util.find_spec("megatron") is not None
                                       and importlib.util.find_spec("megatron.bridge") is not None)
    assert rows["CUDA"] == torch.cuda.is_available()
    vanilla = {name.split(",")[0]: ok for name, ok, _ in megatron_stack_report(vanilla_mbridge=True)}
    assert vanilla["mbridge"] == (importlib.util.find_spec("mbridge") is not None)
