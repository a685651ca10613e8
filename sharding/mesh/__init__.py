"""Specs onto one device mesh, jax-free: a spec's layout and mesh plans (:mod:`layout`), the mapping of a
configuration's specs onto one mesh (:mod:`mapping`), and the complete search it falls back on (:mod:`search`)."""
