"""Put this folder on PYTHONPATH with COURSE_OFFLINE=1 and Python blocks the network at start-up.

Used by `make workshop-check` (course_utils.runner) so notebook kernels cannot download.
"""

import os

if os.environ.get("COURSE_OFFLINE") == "1":
    from course_utils import offline

    offline.install()
