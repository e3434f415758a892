"""kda_overlap's code inside vLLM's processes: KDA in vLLM's kernel conventions over off and on (`kernels.py`),
and on's `KimiK3DeltaAttention._forward` (`forward.py`)."""
