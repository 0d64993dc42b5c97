"""The simulated runtime's state: device, tensors, lazy graphs, metrics, memory, hosts, and the
environment variables that configure them (``settings``); ``compiler/`` holds what turns a
pending graph into text or into a real TPU executable."""
