import sys

from colibri_lab.cli import main

sys.exit(main())
