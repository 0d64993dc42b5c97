"""``torch_xla.experimental`` on the simulator: the simulated submodules live below it."""
