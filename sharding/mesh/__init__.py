"""Specs onto one device mesh, jax-free: layouts and mesh plans (:mod:`layout`), the complete search (:mod:`search`)."""
