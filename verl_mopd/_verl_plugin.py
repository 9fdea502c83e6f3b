"""Target of the ``verl.plugins`` entry point: importing it registers verl-mopd.

It stays light: :func:`verl_mopd.plugin.register` imports nothing of verl's and fills each registry
when verl's module holding it is imported, so ``import verl`` costs what verl alone costs.

verl 0.9.1 imports every entry point of that group while ``import verl`` runs and logs a failure
only at debug level; we warn loudly instead, then re-raise for verl's own handler.
"""

import logging
import warnings

try:
    from verl_mopd.plugin import register

    register()
except Exception as exc:  # noqa: BLE001 - reported, then re-raised
    message = f"verl-mopd plugin failed to register (loss_mode=mopd_k3 unavailable): {type(exc).__name__}: {exc}"
    logging.getLogger("verl_mopd").warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=1)
    raise
