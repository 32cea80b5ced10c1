"""``python -m applier ...`` and the file spark-submit runs: ``spark-submit [options] <this file> run -c FILE``.

Run as a file, Python puts this package's own folder first on ``sys.path``, where its modules (``config``,
``events``, ``session``, ...) would shadow top-level modules of the same names; that entry is dropped before the
applier is imported as a package.
"""

import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.getcwd()) == here:
        sys.path.pop(0)
    from applier.cli import main

    sys.exit(main())
