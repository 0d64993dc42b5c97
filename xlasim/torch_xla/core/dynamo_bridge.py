"""``torch_xla.core.dynamo_bridge``: where torch's ``openxla`` backend looks for the bridge."""

from torch_xla._dynamo.dynamo_bridge import *  # noqa: F403
from torch_xla._dynamo.dynamo_bridge import extract_compiled_graph  # noqa: F401
