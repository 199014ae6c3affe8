import sys

from zhnlp.cli import main

sys.exit(main())
