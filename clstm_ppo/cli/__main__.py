"""`python -m clstm_ppo.cli ...` is `clstm-ppo ...`."""

import sys

from clstm_ppo.cli.main import main

sys.exit(main())
