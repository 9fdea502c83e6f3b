"""``verl-mopd inspect``: where teacher and student disagree, from a run's dumps, as one HTML page.

``dumps`` reads the step dumps of the ``mopd_*`` trainers and verl's rollout dumps into samples;
``report`` computes per platform the per-token K3, the steps, the top tokens and the scatter;
``page`` renders them; ``cli`` is the command.
"""

from verl_mopd.inspect.dumps import Sample, read_dumps
from verl_mopd.inspect.page import render
from verl_mopd.inspect.report import build_report

__all__ = ["Sample", "build_report", "read_dumps", "render"]
