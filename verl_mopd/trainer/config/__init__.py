"""verl-mopd's hydra configs (``mopd.yaml``, ``mopd_base.yaml``), found as ``pkg://verl_mopd.trainer.config``.

A package, not a plain folder: hydra's ``pkg://`` search path counts a folder as available only when
it has an ``__init__.py`` (and warns on every compose otherwise).
"""
