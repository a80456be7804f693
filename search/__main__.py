import sys

from search.driver import main

sys.exit(main())
