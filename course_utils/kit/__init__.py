"""The course kit: what runs the course, not what it teaches. Learners' code never imports it
(notebook 00 alone shows ``doctor`` and ``env`` as its machine check).

- ``cli``: the command line behind ``python -m course_utils <command>``.
- ``doctor``: can this machine run the course, and if not, what do I fix?
- ``host_checks``: the doctor's checks of the machine around Python (CMake, the C++ standard, the
  course kernel, loopback, free disk space); ``check``: one check's outcome (ok, WARN or FAIL, and its fix).
- ``env``: what machine, versions and C++ compiler am I on?
- ``offline``: block the network from Python (loopback excepted) in tests and notebook kernels.
- ``netns``: run a command in an empty Linux network namespace (the network really removed).
- ``runner``: execute the course's notebooks one by one, timed, in fresh kernels.
- ``workshop``: is this machine ready for the class (doctor + every notebook, offline)? READY or NOT READY.
- ``report``: the headline results beside the reference machine's (Markdown + HTML).
- ``stamp``: write measured times and "last passed" into README's table and each notebook.
- ``lab``: install the course's Jupyter kernel and JupyterLab settings.
- ``wheelhouse``: can a classroom install the course with no internet (build, check, install offline)?
- ``gpu_check``: every GPU cell of every notebook run on this machine's GPU, with a summary per cell;
  ``gpu_bundle``: the wheels a lent GPU machine lacks, within one call's carry; ``gpu_cells``: the
  notebooks' GPU cells found in their paired sources and run on their own; ``gpu_stamp``: README's
  "last passed on a GPU" column from a check's summary.

Import the modules themselves (``from course_utils.kit import doctor``); nothing is imported here.
"""
