"""Teacher backends: ``hf`` (transformers worker), ``megatron`` (verl Megatron engine worker),
``server`` (verl's built-in inference-server teacher loop). Imported lazily by backend name."""

BACKEND_MODULES = {
    "hf": "verl_mopd.teachers.backends.hf",
    "megatron": "verl_mopd.teachers.backends.megatron",
    "server": "verl_mopd.teachers.backends.server",
}
