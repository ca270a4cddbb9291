"""Job plumbing: what runs the ``drift`` command's jobs on ranks, not what they compute.

- ``commands``: each job of the ``drift`` command (``train``, ``evaluate``, ``predict``, ...), given its
  options as values, returning the exit code;
- ``launch``: drift's rank pool for ``--nproc`` (spawned ranks, one failure ends all, its report);
- ``cluster``: torchrun and SLURM (hosts, rendezvous, requeues) and the run folder's lock;
- ``timeouts``: the collectives' deadlines, per phase; ``stopping``: signals, stopped at a step boundary;
- ``reports``: one line per failure and ``failure.log``; ``console``: progress bars only on a terminal.
"""
