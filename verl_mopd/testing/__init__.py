"""Test harnesses shipped with verl-mopd, for users as much as for our CI.

``verl_mopd.testing.cpu`` runs verl 0.9.1's real trainers (its v1 PPO trainer and its SFT trainer)
on a machine without a GPU: ``verl-mopd smoke`` uses it. Nothing here is imported by the plugin's
``verl.plugins`` entry point; the CPU platform is loaded only where a process asks for it with
``VERL_USE_EXTERNAL_MODULES`` (see ``verl_mopd.testing.cpu``), so GPU runs never see it.
"""
