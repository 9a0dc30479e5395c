"""Distributed training on real processes: the jobs notebook 12 launches with ``torchrun``, and the launcher.

Each job kind is a module that runs under ``torchrun`` (from a notebook through
``launch.run_job``, or from a terminal, e.g.
``torchrun --nproc-per-node 2 -m course_utils.distributed.ddp``) and prints its result as one
JSON line from rank 0:

- ``collectives``: all-reduce, all-gather and reduce-scatter on gloo;
- ``ddp``: DDP with ``torch.compile``, gradients against one process, graphs against buckets;
- ``fsdp``: FSDP2 (``fully_shard``) with compile, bytes per rank and DTensor parameters;
- ``dtensor``: a device mesh, placements, ``redistribute`` and a sharded matmul's traffic;
- ``dcp``: a sharded checkpoint saved by two ranks and loaded back (also into one process);
- ``elastic``: training that resumes from its checkpoint when torchrun restarts a killed rank.

``runtime`` holds what the jobs share (joining the group, the model, the data, the result line);
``launch`` starts them. Nothing is imported here, so that a worker loads only its own job.
"""
