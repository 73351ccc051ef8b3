import sys

from gpuinfra.cli import main

sys.exit(main())
