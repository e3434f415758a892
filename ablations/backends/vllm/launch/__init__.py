"""What the app starts: the tiny K3 written from its config (`tiny_model.py`), the engine built for a toggle vector
(`engine.py`), vLLM's OpenAI server (`server.py`) and the process environment they need (`runtime.py`, `_startup/`)."""
