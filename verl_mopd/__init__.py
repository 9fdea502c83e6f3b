"""verl-mopd: platform-routed multi-teacher on-policy distillation (UI-MOPD) for verl 0.9.1.

Public names only. Importing this package does not import verl's trainer; ``verl_mopd.plugin``
does the registration (automatically, through verl's ``verl.plugins`` entry point).
"""

__version__ = "0.1.0"
