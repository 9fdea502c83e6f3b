import sys

from verl_mopd.data.cli import main

sys.exit(main())
