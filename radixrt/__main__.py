"""`python -m radixrt serve ...`"""

import sys

from radixrt.cli import main

if __name__ == "__main__":
    sys.exit(main())
