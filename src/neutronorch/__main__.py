import sys

from neutronorch.cli import main

sys.exit(main())
