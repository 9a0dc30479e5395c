"""Distributed training on real processes: the launcher for the job scripts notebook 12 writes.

The jobs themselves (collectives, DDP, FSDP2, DTensor, distributed checkpoints, restarts) are
written by notebook 12's cells (``%%writefile`` into ``build/nb12/``), so the learner reads and
edits the program that runs. This package holds only what every job needs around it:

- ``launch``: ``run_job(script, args)`` starts a script under torchrun on this machine (a free
  port, a rendezvous of its own, a timeout), streams its output, stops every worker at the end and
  reads the result line; ``torchrun_command`` and ``multinode_command`` build the command lines;
- ``loopback``: torchrun with its key-value stores and gloo bound to the loopback interface
  (``python -m course_utils.distributed.loopback`` takes torchrun's arguments);
- ``runtime``: what a job script imports: ``init()`` joins the group, ``log`` and ``emit`` write
  one line each in a single write (rank 0's result line is what ``launch.parse_result`` reads).

Nothing is imported here, so that a worker loads only what it uses.
"""
