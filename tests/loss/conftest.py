import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # the shared helpers _microbatch, _tq_memory
