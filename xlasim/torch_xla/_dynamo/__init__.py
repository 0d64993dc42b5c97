"""``torch_xla._dynamo`` on the simulator: the bridge torch's ``openxla`` backend compiles with."""
