"""The executions of a compiled model: the SPMD program, pipeline stages, segments, and what they share.

Placements on the mesh, parameters, the fast call path, the report, scanned layers under sharding,
the XLA options and the persistent compilation cache. See ``docs/architecture.md``.
"""
