"""The simulated runtime's state: device, tensors, lazy graphs, metrics, memory, hosts."""
