"""What TorchTPU reads from the machine, here from the simulated slice."""
