"""Test setup: 8 fake CPU devices, so that every sharded run has a mesh."""

import jax

jax.config.update("jax_num_cpu_devices", 8)
