"""An in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) runs the K3 wrapper and gives the multiprocess tokens.

Stock vLLM fails here (`triton_utils/dispatcher.py:139` trips over llvmlite objects); run in a child process
so the pytest process keeps no engine state.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import procs
import pytest
from vllm_pool import random_prompts

from ablations.backends.vllm.launch.runtime import vllm_process_env

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(4, seed=7)
TESTS_DIR = Path(__file__).parent

SCRIPT = """
import json, sys
from dataclasses import replace
from vllm_pool import ENGINES
from ablations.backends.vllm.launch.engine import open_llm
prompts = json.loads(sys.argv[1])
with open_llm(replace(ENGINES["base"], multiprocess=False)) as llm:
    from vllm import SamplingParams
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
print("TOKENS=" + json.dumps([list(o.outputs[0].token_ids) for o in outs]))
"""


def test_in_process_engine_matches_multiprocess(pool):
    expected = pool.generate("base", PROMPTS).tokens     # the pool's engines stay up, idle, beside the child's
    env = vllm_process_env()
    env["PYTHONPATH"] = ":".join([str(TESTS_DIR), env.get("PYTHONPATH", "")])
    done = procs.run([sys.executable, "-c", SCRIPT, json.dumps(PROMPTS)], timeout_s=300, env=env)
    line = next((x for x in done.stdout.splitlines() if x.startswith("TOKENS=")), None)
    assert line is not None, f"in-process run failed (rc {done.returncode}):\n{done.stderr[-3000:]}"
    assert json.loads(line.removeprefix("TOKENS=")) == expected
