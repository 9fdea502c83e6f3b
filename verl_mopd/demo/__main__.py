import sys

from verl_mopd.demo.cli import main

sys.exit(main())
