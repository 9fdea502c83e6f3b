import sys

from verl_mopd.rewards.cli import main

sys.exit(main())
