import sys

from verl_mopd.eval.cli import main

sys.exit(main())
