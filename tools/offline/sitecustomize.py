"""With COURSE_OFFLINE=1 and this folder on PYTHONPATH, Python blocks the network at start-up.

``course_utils.kit.offline.child_env()`` sets both: the root conftest.py does it for everything
``make test`` starts (nbval's notebook kernels included), ``make workshop-check`` for its kernels.
"""

import os

if os.environ.get("COURSE_OFFLINE") == "1":
    from course_utils.kit import offline

    offline.install()
