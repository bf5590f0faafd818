"""The vaecf-spark image's Spark application: ``vaecf <stage> ...`` under spark-submit.

A SparkApplication runs it as its main application file (``local:///opt/vaecf/main.py``) with
the stage's command line as its arguments, e.g. ``preprocess --engine spark --input ...
--output ...``; the stage then runs in the session spark-submit started (its master and
settings).
"""

import sys

from vaecf.cli import main

if __name__ == "__main__":
    sys.exit(main())
