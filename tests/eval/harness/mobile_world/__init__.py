# Pinned excerpts of MobileWorld (Tongyi-MAI/MobileWorld, Apache-2.0), the agent-facing interface
# of its harness. MobileWorld does not install from PyPI (only a placeholder name exists there);
# each file names its source path and commit; tests/eval/harness/README.md lists them.
