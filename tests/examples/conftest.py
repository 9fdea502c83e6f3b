import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
# the shared in-memory TransferQueue stand-in, and the custom trainer as its README runs it
# (PYTHONPATH=examples/custom_trainer)
sys.path.insert(0, str(ROOT / "tests" / "loss"))
sys.path.insert(0, str(ROOT / "examples" / "custom_trainer"))
