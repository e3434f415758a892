"""The serving cell's two clients, one interface (`prepare`, `command` per concurrency, `read`): vLLM's own
`vllm bench serve` (`bench_client.py`) and aiperf (`aiperf_client.py`, in its own pinned venv)."""
