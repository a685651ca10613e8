"""The executions of a compiled model: one plan in, one executable interface out.

``compile.py`` (the front door) makes the plan (``plan.py``) and picks a strategy: the SPMD program
(``spmd.py``), pipeline stages (``pipeline.py``, ordered by ``schedule.py``) or segments (``segmented.py``),
each an ``Executable`` (``executable.py``). What they share: placements on the mesh, parameters, the fast
call path, the report, scanned layers under sharding, the XLA options and the persistent compilation cache.
See ``docs/architecture.md``.
"""
