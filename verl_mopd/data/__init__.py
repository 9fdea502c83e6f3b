"""Uni-GUI data pipeline: trajectory schema, cleaning with a per-reason report, readers, verl parquet.

See :mod:`verl_mopd.data.schema` (records), :mod:`.clean` (rules), :mod:`.images` (path confinement and the image
check), :mod:`.readers` (AgentNet, AndroidControl), :mod:`.judges` (subtask judge), :mod:`.convert`
(parquet layout, streamed) and :mod:`.cli` (``verl-mopd prepare``).
"""

from verl_mopd.data.clean import RULES, CleanConfig, clean, clean_report, format_report
from verl_mopd.data.convert import ConvertConfig, convert, split_by_trajectory, trajectory_rows
from verl_mopd.data.images import DataRoots, ImageIndex, inspect_image
from verl_mopd.data.judges import JudgeConfig, OfflineJudge, OpenAIJudge, UnreadableVerdict, Verdict
from verl_mopd.data.readers import read_agentnet, read_android_control
from verl_mopd.data.schema import (
    PARSE,
    Drop,
    SchemaError,
    Step,
    Trajectory,
    drop_duplicate_ids,
    read_jsonl,
    write_jsonl,
)

__all__ = [
    "PARSE",
    "RULES",
    "CleanConfig",
    "ConvertConfig",
    "DataRoots",
    "Drop",
    "ImageIndex",
    "JudgeConfig",
    "OfflineJudge",
    "OpenAIJudge",
    "SchemaError",
    "Step",
    "Trajectory",
    "UnreadableVerdict",
    "Verdict",
    "clean",
    "clean_report",
    "convert",
    "drop_duplicate_ids",
    "format_report",
    "inspect_image",
    "read_agentnet",
    "read_android_control",
    "read_jsonl",
    "split_by_trajectory",
    "trajectory_rows",
    "write_jsonl",
]
