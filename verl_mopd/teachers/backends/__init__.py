"""Teacher backends that run as verl worker groups: ``hf`` (transformers worker) and ``megatron``
(verl Megatron engine worker). Imported lazily by backend name. Inference-server teachers are verl's
own teacher loop (``verl_mopd.teachers.verl_loop``)."""

BACKEND_MODULES = {
    "hf": "verl_mopd.teachers.backends.hf",
    "megatron": "verl_mopd.teachers.backends.megatron",
}
