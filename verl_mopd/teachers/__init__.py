"""Platform-routed teachers: split a step batch by platform, score each part with that platform's
teacher, merge back in order. ``router`` is pure; ``group`` (``PlatformTeacherGroup``, which imports
Ray and verl's single controller) owns the teacher worker groups: import it from
``verl_mopd.teachers.group``. The ``mopd.teachers`` block is part of
``verl_mopd.config.MOPDConfig``."""

from verl_mopd.teachers.config import TeacherConfig
from verl_mopd.teachers.router import UnknownRouteError, merge, split

__all__ = ["TeacherConfig", "UnknownRouteError", "split", "merge"]
